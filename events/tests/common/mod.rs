//! Shared helpers for the integration tests of `ingest-events` (`decisions.rs`,
//! `model.rs`, `golden.rs`).
//!
//! The [`Harness`] runs commands the way the engine does: [`decide`] against
//! the folded [`State`], append the decision to a real sled [`Log`] in a
//! temporary directory, and apply the records read back to the state. It
//! checks on every command what must hold whatever the command was (see
//! [`Harness::execute`]), so every test that drives it checks those rules too.
//!
//! Renderings ([`render_record`], [`render_rejection`]) are compact one-line
//! texts that tests compare with expected text.

// Each test target uses a different subset of these helpers.
#![allow(dead_code)]

use chrono::{DateTime, Duration, TimeZone, Utc};
use ingest_events::command::{decide, Command, Item, Rejection};
use ingest_events::event::{Actor, Erc, Event, PayloadType, StreamId, Submission, SubmissionMode};
use ingest_events::lifecycle::{JobState, Lifecycle};
use ingest_events::log::{AppendRequest, Log, LogConfig};
use ingest_events::state::State;
use ingest_events::Recorded;
use uuid::Uuid;

/// The engine time of the first command a harness runs; each command is one
/// second later, so runs are deterministic.
pub fn base_time() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2024, 5, 16, 10, 11, 12)
        .single()
        .expect("a valid fixed time")
}

/// A small sled cache: tests open many logs.
pub fn test_log_config() -> LogConfig {
    LogConfig {
        cache_capacity: 4 * 1024 * 1024,
        ..LogConfig::default()
    }
}

/// A valid submission of one file to collection `profile`.
pub fn submission(profile: &str) -> Submission {
    Submission {
        profile_name: profile.to_string(),
        submitter: "alice".into(),
        payload_url: "https://example.org/object.zip".into(),
        payload_type: PayloadType::Container,
        response_type: "json".into(),
        submission_mode: SubmissionMode::Add,
        manifest: vec![],
        erc: Erc::default(),
        digest: None,
        extra: Default::default(),
    }
}

/// A command, the engine, a log in a temporary directory and the state folded from it.
pub struct Harness {
    /// Keeps the log's directory alive.
    pub dir: tempfile::TempDir,
    /// The real log.
    pub log: Log,
    /// The state, applied record by record as the engine keeps it.
    pub state: State,
    /// The built-in lifecycle.
    pub lc: Lifecycle,
    clock: DateTime<Utc>,
    uuids: u128,
}

impl Harness {
    /// A fresh, empty log.
    pub fn new() -> Harness {
        let dir = tempfile::tempdir().expect("create a temporary directory");
        let log = Log::open(dir.path(), &test_log_config()).expect("open a fresh log");
        Harness {
            dir,
            log,
            state: State::new(),
            lc: Lifecycle::builtin(),
            clock: base_time(),
            uuids: 0,
        }
    }

    /// A new deterministic submission uuid (1, 2, 3, … as u128).
    pub fn next_uuid(&mut self) -> Uuid {
        self.uuids += 1;
        Uuid::from_u128(self.uuids)
    }

    /// Decides `cmd`; appends and applies its events when accepted.
    ///
    /// Checks, whatever the command:
    /// - a rejected command appends nothing (log head and state unchanged);
    /// - an accepted command is appended without a version conflict, at the
    ///   positions right after the previous head, and the records read back
    ///   from the log equal the ones the append returned;
    /// - every job move is one the lifecycle allows, from the state the job is in;
    /// - `last_successful_status` and `retry_count` follow the mrt-zk rule
    ///   after every job move (see [`check_job_move`]).
    pub fn execute(&mut self, cmd: &Command) -> Result<Vec<Recorded>, Rejection> {
        let head_before = self.log.head();
        let state_before = self.state.clone();
        let decision = match decide(&self.state, &self.lc, cmd) {
            Ok(d) => d,
            Err(rejection) => {
                assert_eq!(
                    self.log.head(),
                    head_before,
                    "rejected {cmd:?} moved the log head"
                );
                assert_eq!(
                    self.state, state_before,
                    "rejected {cmd:?} changed the state"
                );
                return Err(rejection);
            }
        };
        self.clock += Duration::seconds(1);
        let appended = self
            .log
            .append(&AppendRequest {
                actor: Actor::admin("tester"),
                correlation_id: Uuid::from_u128(0xC0FFEE),
                timestamp: self.clock,
                expectations: decision.expectations.clone(),
                events: decision.events.clone(),
            })
            .expect("append: log I/O")
            .unwrap_or_else(|c| panic!("{cmd:?}: a single writer got a version conflict: {c}"));
        assert_eq!(appended.records.len(), decision.events.len());
        for (i, r) in appended.records.iter().enumerate() {
            assert_eq!(
                r.envelope.position,
                head_before.0 + 1 + i as u64,
                "{cmd:?}: positions must follow the head without gaps"
            );
            let read = self
                .log
                .read_one(r.envelope.position)
                .expect("read back an appended record");
            assert_eq!(&read, r, "record read back differs from the one appended");
            check_lifecycle_move(&self.lc, &self.state, r);
            let before = self.state.clone();
            self.state
                .apply(r)
                .unwrap_or_else(|e| panic!("{cmd:?}: fold failed: {e}"));
            check_job_move(&before, &self.state, r);
        }
        Ok(appended.records)
    }

    /// Runs a command that must be accepted.
    pub fn ok(&mut self, cmd: &Command) -> Vec<Recorded> {
        self.execute(cmd)
            .unwrap_or_else(|r| panic!("{cmd:?} was rejected: {r}"))
    }

    /// The state folded from scratch by reading the whole log.
    pub fn fold_from_scratch(&self) -> State {
        fold_log(&self.log)
    }
}

impl Default for Harness {
    fn default() -> Self {
        Harness::new()
    }
}

/// Folds every record of `log` into a fresh state.
pub fn fold_log(log: &Log) -> State {
    let mut state = State::new();
    let (head, _) = log.head();
    for r in log.read_range(1, head) {
        let r = r.expect("read a record");
        state
            .apply(&r)
            .unwrap_or_else(|e| panic!("fold from scratch failed: {e}"));
    }
    state
}

/// Asserts that a record's move is allowed by the lifecycle from the state
/// its item is in before the record is applied.
pub fn check_lifecycle_move(lc: &Lifecycle, before: &State, r: &Recorded) {
    use ingest_events::lifecycle::BatchState as B;
    let at = r.envelope.position;
    match (&r.event, r.envelope.stream) {
        (Event::JobStatusChanged(e), StreamId::Job(jid)) => {
            let job = before
                .jobs
                .get(&jid)
                .unwrap_or_else(|| panic!("#{at}: move of unknown job {jid}"));
            assert_eq!(
                job.status, e.from,
                "#{at}: {jid} moved from the wrong state"
            );
            assert!(
                lc.jobs.can(e.from, e.to),
                "#{at}: {jid} {} -> {} is not in the lifecycle",
                e.from,
                e.to
            );
        }
        (Event::JobDeleted(e), StreamId::Job(jid)) => {
            let job = before
                .jobs
                .get(&jid)
                .unwrap_or_else(|| panic!("#{at}: deletion of unknown job {jid}"));
            assert_eq!(
                job.status, e.from,
                "#{at}: {jid} deleted from the wrong state"
            );
            // Completed is deletable beside the lifecycle, as mrt-zk's
            // `Job.delete` allows.
            assert!(
                lc.jobs.can(e.from, JobState::Deleted) || e.from == JobState::Completed,
                "#{at}: {jid} {} -> Deleted is not in the lifecycle",
                e.from
            );
        }
        (event, StreamId::Batch(bid)) => {
            let to = match event {
                Event::BatchHeld(_) => B::Held,
                Event::BatchReleased(_) => B::Pending,
                Event::BatchAcquired(_) => B::Processing,
                Event::BatchReportingStarted(_) => B::Reporting,
                Event::BatchUpdateReporting(_) => B::UpdateReporting,
                Event::BatchCompleted(_) => B::Completed,
                Event::BatchFailed(_) => B::Failed,
                Event::BatchDeleted(_) => B::Deleted,
                _ => return,
            };
            let batch = before
                .batches
                .get(&bid)
                .unwrap_or_else(|| panic!("#{at}: move of unknown batch {bid}"));
            // A Completed batch is deletable beside the lifecycle (the
            // admin tool's "Queue Del").
            assert!(
                lc.batches.can(batch.status, to)
                    || (batch.status == B::Completed && to == B::Deleted),
                "#{at}: {bid} {} -> {to} is not in the lifecycle",
                batch.status
            );
        }
        _ => {}
    }
}

/// Asserts the mrt-zk bookkeeping of a job move: `last_successful_status`
/// becomes the state left on every move except into Failed or Deleted and
/// except out of Failed (a requeue keeps it); `retry_count` grows by one on a
/// requeue and only then.
pub fn check_job_move(before: &State, after: &State, r: &Recorded) {
    let StreamId::Job(jid) = r.envelope.stream else {
        return;
    };
    let (Some(old), Some(new)) = (before.jobs.get(&jid), after.jobs.get(&jid)) else {
        return;
    };
    let at = r.envelope.position;
    match &r.event {
        Event::JobStatusChanged(e) => {
            let expected_lss = if matches!(e.to, JobState::Failed | JobState::Deleted)
                || e.from == JobState::Failed
            {
                old.last_successful_status
            } else {
                Some(e.from)
            };
            assert_eq!(
                new.last_successful_status, expected_lss,
                "#{at}: {jid} {} -> {}: last_successful_status",
                e.from, e.to
            );
            assert_eq!(
                new.retry_count,
                old.retry_count + u32::from(e.retry),
                "#{at}: {jid} {} -> {}: retry_count",
                e.from,
                e.to
            );
            assert_eq!(new.status, e.to);
        }
        Event::JobDeleted(_) => {
            assert_eq!(new.status, JobState::Deleted);
            assert_eq!(
                new.last_successful_status, old.last_successful_status,
                "#{at}: deleting {jid} changed last_successful_status"
            );
            assert_eq!(new.retry_count, old.retry_count);
        }
        _ => {
            assert_eq!(
                new.status, old.status,
                "#{at}: {jid} moved without a move event"
            );
            assert_eq!(new.last_successful_status, old.last_successful_status);
            assert_eq!(new.retry_count, old.retry_count);
        }
    }
}

fn jids(v: &[ingest_events::Jid]) -> String {
    v.iter()
        .map(|j| j.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// One line per event: `<stream>: <Kind> <what>`, e.g.
/// `jid0000000001: JobStatusChanged Pending -> Estimating`.
///
/// Mostly [`Event::describe`]; kinds whose description leaves out the jobs
/// involved list them.
pub fn render_event(stream: StreamId, event: &Event) -> String {
    let what = match event {
        Event::BatchAcquired(e) => format!("[{}]", jids(&e.jobs)),
        Event::BatchReported(e) => format!(
            "{}successful [{}] failed [{}]",
            if e.update { "update " } else { "" },
            jids(&e.successful_jobs),
            jids(&e.failed_jobs)
        ),
        Event::BatchCleanedUp(e) => format!("[{}]", jids(&e.jobs)),
        other => other.describe(),
    };
    format!("{stream}: {} {what}", event.kind())
}

/// [`render_event`] of a record.
pub fn render_record(r: &Recorded) -> String {
    render_event(r.envelope.stream, &r.event)
}

/// A rejection's variant and key fields on one line, e.g.
/// `IllegalTransition job jid0000000001 is Downloading, requested Deleted, allowed [Processing, Failed]`.
pub fn render_rejection(r: &Rejection) -> String {
    match r {
        Rejection::NotFound { item } => format!("NotFound {item}"),
        Rejection::IllegalTransition {
            item,
            current,
            requested,
            allowed,
        } => format!(
            "IllegalTransition {item} is {current}, requested {requested}, allowed [{}]",
            allowed.join(", ")
        ),
        Rejection::QueuePaused { item } => format!("QueuePaused {item}"),
        Rejection::NoChange(m) => format!("NoChange {m}"),
        Rejection::ActiveJobs { item, jobs } => format!(
            "ActiveJobs {item} [{}]",
            jobs.iter()
                .map(|(j, s)| format!("{j} {s}"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Rejection::CollectionStillHeld { profile } => format!("CollectionStillHeld {profile}"),
        Rejection::CleanedUp { item } => format!("CleanedUp {item}"),
        Rejection::Invalid { field, reason } => format!("Invalid {field}: {reason}"),
        other => format!("{other:?}"),
    }
}

/// Asserts that a rejection's message names what a caller needs: the item,
/// its current state and every allowed target, or the invalid field.
pub fn check_rejection_message(r: &Rejection) {
    let msg = r.to_string();
    let item_named = |item: &Item| {
        assert!(
            msg.contains(&item.to_string()),
            "{msg:?} does not name {item}"
        );
    };
    match r {
        Rejection::NotFound { item }
        | Rejection::QueuePaused { item }
        | Rejection::CleanedUp { item } => item_named(item),
        Rejection::IllegalTransition {
            item,
            current,
            requested,
            allowed,
        } => {
            item_named(item);
            assert!(
                msg.contains(&format!("is {current}")),
                "{msg:?} does not name the current state {current}"
            );
            assert!(
                msg.contains(requested.as_str()),
                "{msg:?} does not name {requested}"
            );
            for a in allowed {
                assert!(
                    msg.contains(a.as_str()),
                    "{msg:?} does not name allowed {a}"
                );
            }
            if allowed.is_empty() {
                assert!(
                    msg.contains("terminal"),
                    "{msg:?} does not say it is terminal"
                );
            }
        }
        Rejection::ActiveJobs { item, jobs } => {
            item_named(item);
            for (j, s) in jobs {
                assert!(
                    msg.contains(&format!("{j} ({s})")),
                    "{msg:?} does not name {j} ({s})"
                );
            }
        }
        Rejection::CollectionStillHeld { profile } => {
            assert!(
                msg.contains(profile.as_str()),
                "{msg:?} does not name {profile}"
            )
        }
        Rejection::Invalid { field, .. } => {
            assert!(
                msg.contains(field.as_str()),
                "{msg:?} does not name {field}"
            )
        }
        Rejection::NoChange(m) => assert!(!m.is_empty(), "NoChange without a message"),
        Rejection::UnrecoverableFailure { item, kind } => {
            item_named(item);
            assert!(
                msg.contains(kind.name()) && msg.contains("a new submission is required"),
                "{msg:?} does not name {kind} and the remedy"
            );
        }
        other => panic!("a new rejection variant needs a message check: {other:?}"),
    }
}
