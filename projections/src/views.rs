//! Reporting views: per batch, per queue and per collection summaries folded
//! from the same events as the tree.
//!
//! [`Views`] is a pure fold like the projector: the same records give the same
//! views, and every time in them comes from the events' timestamps. A view is
//! computed on demand from the fold and is plain serde data, so the CLI and
//! the HTTP API print it as JSON or YAML. Ids are shown as text
//! (`bid0000000001`), states by their lifecycle names, durations in
//! milliseconds.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};
use ingest_events::event::{Event, StreamId};
use ingest_events::lifecycle::{BatchState, JobState, StateKind};
use ingest_events::state::{Batch, FoldError, Job, State};
use ingest_events::{Bid, Jid, Recorded};

pub use ingest_protocol::report::{
    BatchTimings, BatchView, CollectionView, JobView, QueueDepth, QueueView, ReportView, Retries,
};

#[derive(Debug, Clone, Default)]
struct BatchTimes {
    acquired: Option<DateTime<Utc>>,
    reporting: Option<DateTime<Utc>>,
    completed: Option<DateTime<Utc>>,
    failed: Option<DateTime<Utc>>,
    deleted: Option<DateTime<Utc>>,
    cleaned_up: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone)]
struct JobTimes {
    since: DateTime<Utc>,
    spent: BTreeMap<JobState, i64>,
}

/// The fold behind the views.
#[derive(Debug, Clone, Default)]
pub struct Views {
    state: State,
    batches: BTreeMap<Bid, BatchTimes>,
    jobs: BTreeMap<Jid, JobTimes>,
}

impl Views {
    /// Views before any record.
    pub fn new() -> Views {
        Views {
            state: State::new(),
            ..Views::default()
        }
    }

    /// Folds records in order from position 1.
    ///
    /// # Errors
    /// The first [`FoldError`].
    pub fn from_records<'a>(
        records: impl IntoIterator<Item = &'a Recorded>,
    ) -> Result<Views, FoldError> {
        let mut v = Views::new();
        for r in records {
            v.apply(r)?;
        }
        Ok(v)
    }

    /// Folds one record (records in position order).
    ///
    /// # Errors
    /// [`FoldError`] when the record does not fit; nothing changes then.
    pub fn apply(&mut self, r: &Recorded) -> Result<(), FoldError> {
        let before = match r.envelope.stream {
            StreamId::Job(jid) => self.state.jobs.get(&jid).map(|j| j.status),
            _ => None,
        };
        self.state.apply(r)?;
        let at = r.envelope.timestamp;
        match (&r.event, r.envelope.stream) {
            (Event::BatchSubmitted(_), StreamId::Batch(bid)) => {
                self.batches.insert(bid, BatchTimes::default());
            }
            (event, StreamId::Batch(bid)) => {
                let t = self.batches.entry(bid).or_default();
                match event {
                    Event::BatchAcquired(_) => {
                        t.acquired.get_or_insert(at);
                    }
                    Event::BatchReportingStarted(_) => {
                        t.reporting.get_or_insert(at);
                    }
                    Event::BatchCompleted(_) => t.completed = Some(at),
                    Event::BatchFailed(_) => t.failed = Some(at),
                    Event::BatchDeleted(_) => t.deleted = Some(at),
                    Event::BatchCleanedUp(_) => t.cleaned_up = Some(at),
                    _ => {}
                }
            }
            (Event::JobCreated(_), StreamId::Job(jid)) => {
                self.jobs.insert(
                    jid,
                    JobTimes {
                        since: at,
                        spent: BTreeMap::new(),
                    },
                );
            }
            (Event::JobStatusChanged(_) | Event::JobDeleted(_), StreamId::Job(jid)) => {
                if let (Some(t), Some(from)) = (self.jobs.get_mut(&jid), before) {
                    *t.spent.entry(from).or_default() += (at - t.since).num_milliseconds();
                    t.since = at;
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// The state folded so far.
    pub fn state(&self) -> &State {
        &self.state
    }

    /// One batch's view.
    pub fn batch(&self, bid: Bid) -> Option<BatchView> {
        self.state.batches.get(&bid).map(|b| self.batch_view(b))
    }

    /// Every batch's view, in id order.
    pub fn batches(&self) -> Vec<BatchView> {
        self.state
            .batches
            .values()
            .map(|b| self.batch_view(b))
            .collect()
    }

    /// The queue view: live jobs by state and priority.
    pub fn queue(&self) -> QueueView {
        let mut jobs: BTreeMap<String, QueueDepth> = JobState::ALL
            .iter()
            .map(|s| (s.name().to_string(), QueueDepth::default()))
            .collect();
        let mut live_jobs = 0;
        for j in self.state.jobs.values().filter(|j| !j.cleaned_up) {
            live_jobs += 1;
            let d = jobs.entry(j.status.name().to_string()).or_default();
            d.total += 1;
            *d.by_priority
                .entry(format!("{:02}", j.priority))
                .or_default() += 1;
        }
        let mut batches_by_state = BTreeMap::new();
        for b in self.state.batches.values().filter(|b| !b.cleaned_up) {
            *batches_by_state
                .entry(b.status.name().to_string())
                .or_default() += 1;
        }
        QueueView {
            paused: self.state.paused,
            held_collections: self.state.held_collections.iter().cloned().collect(),
            live_jobs,
            jobs,
            batches_by_state,
        }
    }

    /// One collection's view, if the profile was ever submitted to or held.
    pub fn collection(&self, profile: &str) -> Option<CollectionView> {
        self.profiles()
            .contains(profile)
            .then(|| self.collection_view(profile))
    }

    /// Every collection's view, in profile order.
    pub fn collections(&self) -> Vec<CollectionView> {
        self.profiles()
            .iter()
            .map(|p| self.collection_view(p))
            .collect()
    }

    fn profiles(&self) -> BTreeSet<&str> {
        self.state
            .batches
            .values()
            .map(|b| b.submission.profile_name.as_str())
            .chain(self.state.held_collections.iter().map(String::as_str))
            .collect()
    }

    fn collection_view(&self, profile: &str) -> CollectionView {
        let mut v = CollectionView {
            profile: profile.to_string(),
            held: self.state.held_collections.contains(profile),
            batches_by_state: BTreeMap::new(),
            jobs_by_state: BTreeMap::new(),
            batches: Vec::new(),
            batches_total: 0,
            jobs_total: 0,
        };
        for b in self
            .state
            .batches
            .values()
            .filter(|b| b.submission.profile_name == profile)
        {
            v.batches_total += 1;
            if !b.cleaned_up {
                v.batches.push(b.bid.to_string());
                *v.batches_by_state
                    .entry(b.status.name().to_string())
                    .or_default() += 1;
            }
        }
        for j in self
            .state
            .jobs
            .values()
            .filter(|j| j.configuration.profile_name == profile)
        {
            v.jobs_total += 1;
            if !j.cleaned_up {
                *v.jobs_by_state
                    .entry(j.status.name().to_string())
                    .or_default() += 1;
            }
        }
        v
    }

    fn batch_view(&self, b: &Batch) -> BatchView {
        let jobs: Vec<&Job> = self.state.batch_jobs(b).collect();
        let mut jobs_by_state = BTreeMap::new();
        let mut retries = Retries::default();
        for j in &jobs {
            *jobs_by_state
                .entry(j.status.name().to_string())
                .or_default() += 1;
            retries.requeues += j.retry_count;
            retries.step_retries += j.step_retries;
        }
        let ids_in = |s: JobState| {
            jobs.iter()
                .filter(|j| j.status == s)
                .map(|j| j.jid.to_string())
                .collect::<Vec<_>>()
        };
        let t = self.batches.get(&b.bid).cloned().unwrap_or_default();
        let ms = |a: Option<DateTime<Utc>>, z: Option<DateTime<Utc>>| match (a, z) {
            (Some(a), Some(z)) => Some((z - a).num_milliseconds()),
            _ => None,
        };
        let timings = BatchTimings {
            submitted: b.created,
            acquired: t.acquired,
            reporting: t.reporting,
            completed: t.completed,
            failed: t.failed,
            deleted: t.deleted,
            cleaned_up: t.cleaned_up,
            submitted_to_acquired_ms: ms(Some(b.created), t.acquired),
            acquired_to_reporting_ms: ms(t.acquired, t.reporting),
            reporting_to_completed_ms: ms(t.reporting, t.completed),
            submitted_to_completed_ms: ms(Some(b.created), t.completed),
        };
        let ids = |v: &[Jid]| v.iter().map(|j| j.to_string()).collect::<Vec<_>>();
        BatchView {
            bid: b.bid.to_string(),
            uuid: b.uuid.to_string(),
            profile: b.submission.profile_name.clone(),
            submitter: b.submission.submitter.clone(),
            payload_url: b.submission.payload_url.clone(),
            payload_type: b.submission.payload_type.name().to_string(),
            status: status_name(b.status),
            message: b.message.clone(),
            cleaned_up: b.cleaned_up,
            job_count: jobs.len(),
            jobs_by_state,
            successful_jobs: ids_in(JobState::Completed),
            failed_jobs: ids_in(JobState::Failed),
            update_report_due: b.status == BatchState::Failed
                && jobs.iter().any(|j| j.status == JobState::Completed)
                && jobs
                    .iter()
                    .all(|j| matches!(j.status, JobState::Completed | JobState::Deleted)),
            retries,
            timings,
            report: b.report.as_ref().map(|r| ReportView {
                at: r.at,
                update: r.update,
                successful_jobs: ids(&r.successful_jobs),
                failed_jobs: ids(&r.failed_jobs),
            }),
            jobs: jobs.iter().map(|j| self.job_view(j)).collect(),
        }
    }

    fn job_view(&self, j: &Job) -> JobView {
        let times = self.jobs.get(&j.jid);
        JobView {
            jid: j.jid.to_string(),
            status: j.status.name().to_string(),
            last_successful_status: j.last_successful_status.map(|s| s.name().to_string()),
            priority: j.priority,
            retry_count: j.retry_count,
            step_retries: j.step_retries,
            payload_url: j.configuration.payload_url.clone(),
            created: j.created,
            in_state_since: times.map_or(j.last_modified, |t| t.since),
            time_in_state_ms: times
                .map(|t| {
                    t.spent
                        .iter()
                        .map(|(s, ms)| (s.name().to_string(), *ms))
                        .collect()
                })
                .unwrap_or_default(),
            failure: j.failure.map(|k| k.name().to_string()),
        }
    }
}

fn status_name(s: BatchState) -> String {
    s.name().to_string()
}
