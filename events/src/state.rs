//! The current state of every batch and job: a fold of the log.
//!
//! [`State::apply`] takes records in position order. The engine rebuilds the
//! state at start-up by folding the whole log (or a snapshot and the records
//! after it) and keeps it current by applying each record it appends.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::codec::{Hash, Recorded, GENESIS_HASH};
use crate::event::{
    AccessDelivery, AccessPackaging, AccessQueue, AccessToken, Erc, Event, FailureKind,
    Identifiers, InventoryParams, JobConfiguration, StoreParams, StreamId, Submission,
};
use crate::ids::{Bid, Jid, Qid};
use crate::lifecycle::{AccessState, BatchState, JobState};

/// A batch as the log says it is now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Batch {
    /// Its id.
    pub bid: Bid,
    /// The uuid given at submission (`/batch-uuids/UUID`).
    pub uuid: Uuid,
    /// What the depositor submitted.
    pub submission: Submission,
    /// Current state.
    pub status: BatchState,
    /// The message of the last move.
    pub message: String,
    /// Its jobs, in creation order.
    pub jobs: Vec<Jid>,
    /// The latest report, if reported.
    pub report: Option<Report>,
    /// When it was submitted.
    pub created: DateTime<Utc>,
    /// When its status last changed.
    pub last_modified: DateTime<Utc>,
    /// Whether cleanup removed it from the live tree.
    pub cleaned_up: bool,
    /// Its stream version.
    pub version: u64,
}

/// A batch report (`/batches/BID/status-report`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    /// Jobs completed.
    pub successful_jobs: Vec<Jid>,
    /// Jobs failed.
    pub failed_jobs: Vec<Jid>,
    /// Whether this was an update report.
    pub update: bool,
    /// When it was made.
    pub at: DateTime<Utc>,
}

/// A job as the log says it is now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Job {
    /// Its id.
    pub jid: Jid,
    /// Its batch.
    pub bid: Bid,
    /// Current state.
    pub status: JobState,
    /// The state before the last move, except moves into Failed or Deleted
    /// and requeues out of Failed (see [`State::apply`]).
    pub last_successful_status: Option<JobState>,
    /// The state a failed job failed in.
    pub failed_in: Option<JobState>,
    /// The kind of its failure, when the step that failed it named one
    /// (`JobFailureClassified`); `None` for an ordinary failure and for a
    /// job that is not Failed.
    pub failure: Option<FailureKind>,
    /// Admin requeues so far.
    pub retry_count: u32,
    /// 0–99, lower runs first.
    pub priority: u8,
    /// Bytes, 0 until estimated.
    pub space_needed: u64,
    /// Configuration.
    pub configuration: JobConfiguration,
    /// Identifiers.
    pub identifiers: Identifiers,
    /// ERC metadata.
    pub metadata: Erc,
    /// Storage parameters, once recorded.
    pub store: Option<StoreParams>,
    /// Inventory parameters, once recorded.
    pub inventory: Option<InventoryParams>,
    /// The message of the last move.
    pub message: String,
    /// Recoverable-error retries recorded within steps.
    pub step_retries: u32,
    /// When it was created.
    pub created: DateTime<Utc>,
    /// When its status last changed.
    pub last_modified: DateTime<Utc>,
    /// Whether cleanup removed it from the live tree.
    pub cleaned_up: bool,
    /// Its stream version.
    pub version: u64,
}

/// An access (assembly) request as the log says it is now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccessRequest {
    /// Its id.
    pub qid: Qid,
    /// The queue its size chose.
    pub queue: AccessQueue,
    /// What it asks for (`/access/<queue>/QID/token`).
    pub token: AccessToken,
    /// Which files, and whether in a bag.
    pub packaging: AccessPackaging,
    /// Where its finished container waits, once assembled.
    pub delivery: Option<AccessDelivery>,
    /// Current state.
    pub status: AccessState,
    /// The message of the last move.
    pub message: String,
    /// Admin requeues so far.
    pub retry_count: u32,
    /// When it was requested.
    pub created: DateTime<Utc>,
    /// When its status last changed.
    pub last_modified: DateTime<Utc>,
    /// Its stream version.
    pub version: u64,
}

/// Everything the log says, folded.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct State {
    /// Every batch ever submitted.
    pub batches: BTreeMap<Bid, Batch>,
    /// Every job ever created.
    pub jobs: BTreeMap<Jid, Job>,
    /// Profiles whose collection is held.
    pub held_collections: BTreeSet<String>,
    /// Whether the ingest queue is paused.
    pub paused: bool,
    /// The system stream's version.
    pub system_version: u64,
    /// The last position applied.
    pub position: u64,
    /// The hash of the last record applied.
    pub head_hash: Hash,
    /// Batch ids by submission uuid.
    pub uuids: BTreeMap<Uuid, Bid>,
    /// Faults armed by admins, oldest first per step state.
    #[serde(default)]
    pub faults: BTreeMap<JobState, Vec<ArmedFault>>,
    /// Every access (assembly) request ever made.
    #[serde(default)]
    pub access: BTreeMap<Qid, AccessRequest>,
    /// The access queues that are paused.
    #[serde(default)]
    pub paused_access: BTreeSet<AccessQueue>,
    /// Every job by (priority, id), the order the queues and listings use:
    /// derived from `jobs`, kept by [`State::apply`], never stored (a
    /// state decoded from elsewhere gets it from [`State::reindex`]).
    #[serde(skip)]
    pub job_order: BTreeSet<(u8, Jid)>,
}

/// Faults armed by one admin action, of which `remaining` are still to fire.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArmedFault {
    /// Who armed them (the record's actor, `admin:NAME`).
    pub actor: String,
    /// Why.
    pub reason: String,
    /// How many are still armed.
    pub remaining: u32,
}

impl ArmedFault {
    /// The failure message recorded in place of a step's success.
    pub fn message(&self, state: JobState) -> String {
        format!(
            "fault injected into {state} by {}: {}",
            self.actor, self.reason
        )
    }
}

impl State {
    /// The number of faults still armed, by state.
    pub fn armed_faults(&self) -> BTreeMap<JobState, u32> {
        self.faults
            .iter()
            .map(|(s, f)| (*s, f.iter().map(|a| a.remaining).sum()))
            .filter(|(_, n)| *n > 0)
            .collect()
    }
}

/// A record that does not fit the state it is applied to: the log is
/// inconsistent with the rules that wrote it.
///
/// ### Handling
/// Corruption or a bug: stop and run `ingest verify`; never skip the record.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("record at position {position} ({kind} on {stream}) does not fit the state: {reason}")]
pub struct FoldError {
    /// Where.
    pub position: u64,
    /// The event kind.
    pub kind: &'static str,
    /// The stream.
    pub stream: String,
    /// What does not fit.
    pub reason: String,
}

impl State {
    /// An empty state (before position 1).
    pub fn new() -> State {
        State {
            head_hash: GENESIS_HASH,
            ..State::default()
        }
    }

    /// Rebuilds what is derived from the jobs (the [`State::job_order`]
    /// index), after the state was decoded rather than folded.
    pub fn reindex(&mut self) {
        self.job_order = self.jobs.values().map(|j| (j.priority, j.jid)).collect();
    }

    /// The id the next batch gets.
    pub fn next_bid(&self) -> Bid {
        self.batches.keys().next_back().map_or(Bid(1), |b| b.next())
    }

    /// The id the next job gets.
    pub fn next_jid(&self) -> Jid {
        self.jobs.keys().next_back().map_or(Jid(1), |j| j.next())
    }

    /// The id the next access request gets.
    pub fn next_qid(&self) -> Qid {
        self.access.keys().next_back().map_or(Qid(1), |q| q.next())
    }

    /// The version of a stream.
    pub fn stream_version(&self, stream: StreamId) -> u64 {
        match stream {
            StreamId::System => self.system_version,
            StreamId::Batch(b) => self.batches.get(&b).map_or(0, |b| b.version),
            StreamId::Job(j) => self.jobs.get(&j).map_or(0, |j| j.version),
            StreamId::Access(q) => self.access.get(&q).map_or(0, |a| a.version),
        }
    }

    /// Applies one record. Records must come in position order.
    ///
    /// # Errors
    /// [`FoldError`] when the record does not follow the previous one or
    /// names an item the state does not have.
    pub fn apply(&mut self, r: &Recorded) -> Result<(), FoldError> {
        let env = &r.envelope;
        let err = |reason: String| FoldError {
            position: env.position,
            kind: r.event.kind(),
            stream: env.stream.to_string(),
            reason,
        };
        if env.position != self.position + 1 {
            return Err(err(format!("expected position {}", self.position + 1)));
        }
        let at = env.timestamp;
        match (&r.event, env.stream) {
            (Event::BatchSubmitted(e), StreamId::Batch(bid)) => {
                if self.batches.contains_key(&bid) {
                    return Err(err("batch already exists".into()));
                }
                self.uuids.insert(e.uuid, bid);
                self.batches.insert(
                    bid,
                    Batch {
                        bid,
                        uuid: e.uuid,
                        submission: e.submission.clone(),
                        status: BatchState::Pending,
                        message: String::new(),
                        jobs: Vec::new(),
                        report: None,
                        created: at,
                        last_modified: at,
                        cleaned_up: false,
                        version: 0,
                    },
                );
            }
            (Event::JobCreated(e), StreamId::Job(jid)) => {
                if self.jobs.contains_key(&jid) {
                    return Err(err("job already exists".into()));
                }
                let batch = self
                    .batches
                    .get_mut(&e.bid)
                    .ok_or_else(|| err(format!("unknown batch {}", e.bid)))?;
                batch.jobs.push(jid);
                self.job_order.insert((e.priority, jid));
                self.jobs.insert(
                    jid,
                    Job {
                        jid,
                        bid: e.bid,
                        status: JobState::Pending,
                        last_successful_status: None,
                        failed_in: None,
                        failure: None,
                        retry_count: 0,
                        priority: e.priority,
                        space_needed: 0,
                        configuration: e.configuration.clone(),
                        identifiers: e.identifiers.clone(),
                        metadata: e.metadata.clone(),
                        store: None,
                        inventory: None,
                        message: String::new(),
                        step_retries: 0,
                        created: at,
                        last_modified: at,
                        cleaned_up: false,
                        version: 0,
                    },
                );
            }
            (event, StreamId::Batch(bid)) => {
                let b = self
                    .batches
                    .get_mut(&bid)
                    .ok_or_else(|| err("unknown batch".into()))?;
                let set = |b: &mut Batch, s: BatchState, m: &str| {
                    b.status = s;
                    b.message = m.to_string();
                    b.last_modified = at;
                };
                match event {
                    Event::BatchHeld(e) => set(b, BatchState::Held, &e.reason),
                    Event::BatchReleased(e) => set(b, BatchState::Pending, &e.reason),
                    Event::BatchAcquired(_) => set(b, BatchState::Processing, ""),
                    Event::BatchReportingStarted(e) => set(b, BatchState::Reporting, &e.reason),
                    Event::BatchReported(e) => {
                        b.report = Some(Report {
                            successful_jobs: e.successful_jobs.clone(),
                            failed_jobs: e.failed_jobs.clone(),
                            update: e.update,
                            at,
                        });
                    }
                    Event::BatchUpdateReporting(e) => {
                        set(b, BatchState::UpdateReporting, &e.reason)
                    }
                    Event::BatchCompleted(e) => set(b, BatchState::Completed, &e.message),
                    Event::BatchFailed(e) => set(b, BatchState::Failed, &e.message),
                    Event::BatchDeleted(e) => set(b, BatchState::Deleted, &e.reason),
                    // A record of the live tree's repair: nothing of the batch changes.
                    Event::ForeignChangeRepaired(_) => {}
                    Event::BatchCleanedUp(e) => {
                        b.cleaned_up = true;
                        for jid in &e.jobs {
                            if let Some(j) = self.jobs.get_mut(jid) {
                                j.cleaned_up = true;
                            }
                        }
                    }
                    other => {
                        return Err(err(format!(
                            "{} does not belong on a batch stream",
                            other.kind()
                        )))
                    }
                }
            }
            (event, StreamId::Job(jid)) => {
                let j = self
                    .jobs
                    .get_mut(&jid)
                    .ok_or_else(|| err("unknown job".into()))?;
                let priority = j.priority;
                match event {
                    Event::JobStatusChanged(e) => {
                        if j.status != e.from {
                            return Err(err(format!(
                                "job is {}, event moves it from {}",
                                j.status, e.from
                            )));
                        }
                        // mrt-zk: the previous state becomes last_successful_status on
                        // every move except into Failed or Deleted. A requeue out of
                        // Failed keeps it (as the transitions document shows), so a job
                        // that fails again can be requeued again at the same step.
                        if !matches!(e.to, JobState::Failed | JobState::Deleted)
                            && e.from != e.to
                            && e.from != JobState::Failed
                        {
                            j.last_successful_status = Some(e.from);
                        }
                        j.failed_in = (e.to == JobState::Failed).then_some(e.from);
                        // A kind belongs to one failure: the next move ends it.
                        j.failure = None;
                        if e.retry {
                            j.retry_count += 1;
                        }
                        if let Some(p) = e.priority {
                            j.priority = p;
                        }
                        j.status = e.to;
                        j.message = e.message.clone();
                        j.last_modified = at;
                    }
                    Event::JobSpaceEstimated(e) => {
                        j.space_needed = e.space_needed;
                        if let Some(p) = e.priority {
                            j.priority = p;
                        }
                    }
                    Event::JobIdentifiersAssigned(e) => j.identifiers = e.identifiers.clone(),
                    Event::JobStoreRecorded(e) => j.store = Some(e.store.clone()),
                    Event::JobInventoryRecorded(e) => j.inventory = Some(e.inventory.clone()),
                    Event::JobDeleted(e) => {
                        j.status = JobState::Deleted;
                        j.message = e.reason.clone();
                        j.last_modified = at;
                    }
                    Event::JobStepRetried(_) => j.step_retries += 1,
                    // A record of the live tree's repair: nothing of the job changes.
                    Event::ForeignChangeRepaired(_) => {}
                    Event::JobFailureClassified(e) => {
                        if j.status != JobState::Failed {
                            return Err(err(format!(
                                "job is {}, a failure kind is recorded only on a Failed job",
                                j.status
                            )));
                        }
                        j.failure = Some(e.kind);
                    }
                    other => {
                        return Err(err(format!(
                            "{} does not belong on a job stream",
                            other.kind()
                        )))
                    }
                }
                if j.priority != priority {
                    self.job_order.remove(&(priority, jid));
                    self.job_order.insert((j.priority, jid));
                }
            }
            (Event::AccessRequested(e), StreamId::Access(qid)) => {
                if self.access.contains_key(&qid) {
                    return Err(err("access request already exists".into()));
                }
                self.access.insert(
                    qid,
                    AccessRequest {
                        qid,
                        queue: e.queue,
                        token: e.token.clone(),
                        packaging: AccessPackaging::default(),
                        delivery: None,
                        status: AccessState::Pending,
                        message: String::new(),
                        retry_count: 0,
                        created: at,
                        last_modified: at,
                        version: 0,
                    },
                );
            }
            (event, StreamId::Access(qid)) => {
                let a = self
                    .access
                    .get_mut(&qid)
                    .ok_or_else(|| err("unknown access request".into()))?;
                match event {
                    Event::AccessStatusChanged(e) => {
                        if a.status != e.from {
                            return Err(err(format!(
                                "access request is {}, event moves it from {}",
                                a.status, e.from
                            )));
                        }
                        if e.requeue {
                            a.retry_count += 1;
                        }
                        a.status = e.to;
                        a.message = e.message.clone();
                        a.last_modified = at;
                    }
                    Event::AccessPackagingChosen(e) => a.packaging = e.packaging,
                    Event::AccessDelivered(e) => a.delivery = Some(e.delivery.clone()),
                    Event::ForeignChangeRepaired(_) => {}
                    other => {
                        return Err(err(format!(
                            "{} does not belong on an access stream",
                            other.kind()
                        )))
                    }
                }
            }
            (event, StreamId::System) => match event {
                Event::CollectionHeld(e) => {
                    self.held_collections.insert(e.profile.clone());
                }
                Event::CollectionReleased(e) => {
                    self.held_collections.remove(&e.profile);
                }
                Event::QueuePaused(_) => self.paused = true,
                Event::QueueResumed(_) => self.paused = false,
                Event::TreeRepaired(_)
                | Event::ConsistencyRepaired(_)
                | Event::ForeignChangeRepaired(_)
                | Event::LogCheckpointed(_) => {}
                Event::FaultsArmed(e) => self.faults.entry(e.state).or_default().push(ArmedFault {
                    actor: env.actor.to_string(),
                    reason: e.reason.clone(),
                    remaining: e.count,
                }),
                Event::FaultFired(e) => {
                    let armed = self.faults.get_mut(&e.state);
                    let Some(first) = armed.as_ref().and_then(|a| a.first()) else {
                        return Err(err(format!("no fault is armed for {}", e.state)));
                    };
                    let spent = first.remaining <= 1;
                    if let Some(armed) = armed {
                        match spent {
                            true => {
                                armed.remove(0);
                            }
                            false => armed[0].remaining -= 1,
                        }
                        if armed.is_empty() {
                            self.faults.remove(&e.state);
                        }
                    }
                }
                Event::FaultsCleared(_) => self.faults.clear(),
                Event::AccessQueuePaused(e) => {
                    self.paused_access.insert(e.queue);
                }
                Event::AccessQueueResumed(e) => {
                    self.paused_access.remove(&e.queue);
                }
                other => {
                    return Err(err(format!(
                        "{} does not belong on the system stream",
                        other.kind()
                    )))
                }
            },
        }
        match env.stream {
            StreamId::Access(q) => {
                if let Some(a) = self.access.get_mut(&q) {
                    a.version = env.version;
                }
            }
            StreamId::System => self.system_version = env.version,
            StreamId::Batch(b) => {
                if let Some(b) = self.batches.get_mut(&b) {
                    b.version = env.version;
                }
            }
            StreamId::Job(j) => {
                if let Some(j) = self.jobs.get_mut(&j) {
                    j.version = env.version;
                }
            }
        }
        self.position = env.position;
        self.head_hash = env.hash;
        Ok(())
    }

    /// The jobs of a batch with their current records.
    pub fn batch_jobs<'a>(&'a self, batch: &'a Batch) -> impl Iterator<Item = &'a Job> + 'a {
        batch.jobs.iter().filter_map(|j| self.jobs.get(j))
    }
}
