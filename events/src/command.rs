//! Commands and the decisions that turn them into events.
//!
//! [`decide`] is pure: given the folded [`State`], the [`Lifecycle`] and a
//! [`Command`], it returns the events to append (with the stream versions they
//! were decided against) or a [`Rejection`] naming what is wrong. Nothing is
//! appended for a rejected command.

use std::collections::BTreeMap;
use std::fmt;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::append::{ExpectedVersion, Proposed};
use crate::event::{
    self, Digest, Erc, Event, Identifiers, InventoryParams, JobConfiguration, PayloadType,
    StoreParams, StreamId, Submission,
};
use crate::ids::{Bid, Jid};
use crate::lifecycle::{BatchState, JobState, Lifecycle, StateKind};
use crate::state::{Batch, Job, State};

/// The highest priority number (lowest urgency).
pub const MAX_PRIORITY: u8 = 99;
/// The priority a job gets when nothing else sets it.
pub const DEFAULT_PRIORITY: u8 = 5;

/// One object to create a job for, from the expansion of a batch's payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobSpec {
    /// The object's payload.
    pub payload_url: String,
    /// Its type.
    pub payload_type: PayloadType,
    /// Ark (if supplied) and local ids.
    pub identifiers: Identifiers,
    /// ERC fields for this object.
    pub metadata: Erc,
    /// The depositor's digest of the payload.
    pub digest: Option<Digest>,
    /// Priority; `None` for [`DEFAULT_PRIORITY`].
    pub priority: Option<u8>,
}

/// Where a status change goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// The current state's success successor.
    Success,
    /// The current state's fail successor.
    Fail,
    /// An explicit state.
    To(JobState),
}

/// Every change a depositor, worker, admin or the engine can ask for.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Command {
    /// A depositor submits a batch.
    SubmitBatch {
        /// The uuid the batch is known by (`/batch-uuids/UUID`); chosen by the caller.
        uuid: Uuid,
        /// What was submitted.
        submission: Submission,
    },
    /// The batch-pending daemon acquires a batch: Held if its collection is
    /// held, else its jobs are created and it goes to Processing (Failed at
    /// once when the payload expanded into no jobs).
    AcquireBatch {
        /// The batch.
        bid: Bid,
        /// One spec per object.
        jobs: Vec<JobSpec>,
    },
    /// The batch-pending daemon could not expand the payload (a corrupt
    /// manifest, a manifest that cannot be fetched): the batch fails at once
    /// with `message` (Held instead if its collection is held).
    RejectBatch {
        /// The batch.
        bid: Bid,
        /// Why the payload does not expand, naming the line or the URL.
        message: String,
    },
    /// Adds a job to a batch that is Processing.
    CreateJob {
        /// The batch.
        bid: Bid,
        /// The object.
        spec: JobSpec,
    },
    /// The job-pending daemon acquires a job: Held if its collection is held,
    /// else Estimating. Refused while the queue is paused.
    StartJob {
        /// The job.
        jid: Jid,
    },
    /// A step reports its outcome, or an admin forces a move.
    SetJobStatus {
        /// The job.
        jid: Jid,
        /// Where to.
        target: Target,
        /// Why (the error of a failed step).
        message: String,
        /// A new priority set together with the move.
        priority: Option<u8>,
    },
    /// A worker reports the outcome of the step it did, with the data the
    /// step recorded, as ONE command: the data events and the move are
    /// appended atomically, and a report for a state the job has left is
    /// refused as stale (so a duplicated report cannot move a job twice).
    StepOutcome {
        /// The job.
        jid: Jid,
        /// The state the worker worked on.
        state: JobState,
        /// Whether the step succeeded (its success or fail successor).
        success: bool,
        /// The step's message (the error of a failure).
        message: String,
        /// A new priority, set with the move.
        priority: Option<u8>,
        /// Bytes the job needs (estimating, downloading).
        space_needed: Option<u64>,
        /// Ark and local ids (processing).
        identifiers: Option<Identifiers>,
        /// Storage parameters.
        store: Option<StoreParams>,
        /// Inventory parameters.
        inventory: Option<InventoryParams>,
    },
    /// The estimating step records the space a job needs.
    RecordSpace {
        /// The job.
        jid: Jid,
        /// Bytes.
        space_needed: u64,
        /// A new priority, if the size changes it.
        priority: Option<u8>,
    },
    /// The processing step records the job's ark and local ids.
    RecordIdentifiers {
        /// The job.
        jid: Jid,
        /// Ark and local ids.
        identifiers: Identifiers,
    },
    /// The storage step's parameters.
    RecordStore {
        /// The job.
        jid: Jid,
        /// Parameters.
        store: StoreParams,
    },
    /// The inventory step's parameters.
    RecordInventory {
        /// The job.
        jid: Jid,
        /// Parameters.
        inventory: InventoryParams,
    },
    /// A step hit a recoverable error and tries again.
    RecordStepRetry {
        /// The job.
        jid: Jid,
        /// Which attempt follows (2 for the first retry).
        attempt: u32,
        /// The error.
        message: String,
    },
    /// An admin requeues a failed job at the step after its `last_successful_status`.
    RequeueJob {
        /// The job.
        jid: Jid,
        /// Why.
        reason: String,
    },
    /// An admin holds a pending job.
    HoldJob {
        /// The job.
        jid: Jid,
        /// Why.
        reason: String,
    },
    /// An admin releases a held job.
    ReleaseJob {
        /// The job.
        jid: Jid,
        /// Why.
        reason: String,
    },
    /// An admin releases a held batch (once its collection is no longer held).
    ReleaseBatch {
        /// The batch.
        bid: Bid,
        /// Why.
        reason: String,
    },
    /// An admin holds a collection.
    HoldCollection {
        /// The profile.
        profile: String,
        /// Why.
        reason: String,
    },
    /// An admin releases a collection, and with it every held job and batch of it.
    ReleaseCollection {
        /// The profile.
        profile: String,
        /// Why.
        reason: String,
    },
    /// An admin releases every held job of a collection (the hold itself stays).
    ReleaseHeldJobs {
        /// The profile.
        profile: String,
        /// Why.
        reason: String,
    },
    /// An admin pauses the ingest queue.
    PauseQueue {
        /// Why.
        reason: String,
    },
    /// An admin resumes the ingest queue.
    ResumeQueue {
        /// Why.
        reason: String,
    },
    /// An admin asks for a new report of a failed batch.
    UpdateReporting {
        /// The batch.
        bid: Bid,
        /// Why.
        reason: String,
    },
    /// An admin deletes a job (soft: status Deleted).
    DeleteJob {
        /// The job.
        jid: Jid,
        /// Why.
        reason: String,
    },
    /// An admin deletes a batch and its deletable jobs (soft).
    DeleteBatch {
        /// The batch.
        bid: Bid,
        /// Why.
        reason: String,
    },
    /// The reporting daemon reports a batch: the report is recorded and the
    /// batch ends Completed (every job completed) or Failed.
    ReportBatch {
        /// The batch.
        bid: Bid,
        /// The notification's error, if sending the report failed.
        notification_error: Option<String>,
    },
    /// An admin repaired drift between the live ZooKeeper tree and the log;
    /// records which paths were repaired.
    RecordRepair {
        /// The paths created, set or deleted.
        paths: Vec<String>,
    },
    /// Removes finished (Completed or Deleted) batches from the live tree.
    Cleanup {
        /// Only batches last changed before this time.
        before: Option<DateTime<Utc>>,
    },
}

/// A queue item named in a rejection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Item {
    /// A batch.
    Batch(Bid),
    /// A job.
    Job(Jid),
}

impl fmt::Display for Item {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Item::Batch(b) => write!(f, "batch {b}"),
            Item::Job(j) => write!(f, "job {j}"),
        }
    }
}

/// Why a command was refused. Nothing was appended.
///
/// ### Handling
/// All variants are the caller's to fix (HTTP 404/409/422); retrying the same
/// command gives the same answer until the state changes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Rejection {
    /// No such batch or job. (HTTP 404)
    #[error("{item} does not exist")]
    NotFound {
        /// What was asked for.
        item: Item,
    },
    /// The lifecycle does not allow the move. (HTTP 409)
    #[error(
        "{item} is {current}; it cannot go to {requested} (allowed: {})",
        list(allowed)
    )]
    IllegalTransition {
        /// The item.
        item: Item,
        /// Its state.
        current: String,
        /// What was asked for.
        requested: String,
        /// Where it may go.
        allowed: Vec<String>,
    },
    /// The ingest queue is paused. (HTTP 409)
    #[error("the ingest queue is paused; {item} stays Pending until an admin resumes it")]
    QueuePaused {
        /// The job that was to start.
        item: Item,
    },
    /// The command would change nothing. (HTTP 409)
    #[error("{0}")]
    NoChange(String),
    /// A batch still has jobs at work. (HTTP 409)
    #[error("{item} has {} job(s) still at work: {}", jobs.len(), jobs.iter().map(|(j, s)| format!("{j} ({s})")).collect::<Vec<_>>().join(", "))]
    ActiveJobs {
        /// The batch.
        item: Item,
        /// The jobs at work and their states.
        jobs: Vec<(Jid, JobState)>,
    },
    /// A worker reported on a state the job has left. (HTTP 409)
    #[error("{item} is {current}, not {reported}: the report is stale and was discarded")]
    StaleReport {
        /// The job.
        item: Item,
        /// Its state now.
        current: String,
        /// The state the report was for.
        reported: String,
    },
    /// The collection is still held. (HTTP 409)
    #[error("collection {profile} is still held; release the collection first (ingest collection {profile} release)")]
    CollectionStillHeld {
        /// The profile.
        profile: String,
    },
    /// The item was removed from the live tree by cleanup. (HTTP 409)
    #[error("{item} was cleaned up; its history is kept but it can no longer change")]
    CleanedUp {
        /// The item.
        item: Item,
    },
    /// A field is invalid. (HTTP 422)
    #[error("invalid {field}: {reason}")]
    Invalid {
        /// Which field.
        field: String,
        /// What is wrong.
        reason: String,
    },
}

fn list(v: &[String]) -> String {
    if v.is_empty() {
        "none: it is terminal".into()
    } else {
        v.join(", ")
    }
}

/// The events a command decided, with the stream versions it saw.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Decision {
    /// The events to append, in order.
    pub events: Vec<Proposed>,
    /// Each touched stream's version when the command was decided.
    pub expectations: Vec<(StreamId, ExpectedVersion)>,
}

impl Decision {
    fn push(&mut self, state: &State, stream: StreamId, event: impl Into<Event>) {
        if !self.expectations.iter().any(|(s, _)| *s == stream) {
            let v = state.stream_version(stream);
            let exp = if v == 0 {
                ExpectedVersion::NoStream
            } else {
                ExpectedVersion::Exact(v)
            };
            self.expectations.push((stream, exp));
        }
        self.events.push(Proposed {
            stream,
            event: event.into(),
        });
    }
}

/// Decides a command against the current state.
///
/// # Errors
/// A [`Rejection`] naming the item, its state and what is allowed.
pub fn decide(state: &State, lc: &Lifecycle, cmd: &Command) -> Result<Decision, Rejection> {
    let mut d = Decision::default();
    match cmd {
        Command::SubmitBatch { uuid, submission } => {
            validate_submission(submission)?;
            if let Some(bid) = state.uuids.get(uuid) {
                return Err(Rejection::NoChange(format!(
                    "a batch with uuid {uuid} already exists ({bid})"
                )));
            }
            let bid = state.next_bid();
            d.push(
                state,
                StreamId::Batch(bid),
                event::BatchSubmitted {
                    uuid: *uuid,
                    submission: submission.clone(),
                },
            );
        }
        Command::AcquireBatch { bid, jobs } => {
            let b = live_batch(state, *bid)?;
            if park_if_held(state, lc, b, &mut d)? {
                return Ok(d);
            }
            for (i, spec) in jobs.iter().enumerate() {
                validate_spec(spec).map_err(|r| match r {
                    Rejection::Invalid { field, reason } => Rejection::Invalid {
                        field: format!("jobs[{i}].{field}"),
                        reason,
                    },
                    other => other,
                })?;
            }
            let first = state.next_jid();
            let jids: Vec<Jid> = (0..jobs.len() as u64).map(|i| Jid(first.0 + i)).collect();
            d.push(
                state,
                StreamId::Batch(*bid),
                event::BatchAcquired { jobs: jids.clone() },
            );
            for (jid, spec) in jids.iter().zip(jobs) {
                d.push(state, StreamId::Job(*jid), job_created(b, spec));
            }
            if jobs.is_empty() {
                d.push(
                    state,
                    StreamId::Batch(*bid),
                    event::BatchFailed {
                        message: "the payload expanded into no jobs (empty manifest?)".into(),
                    },
                );
            }
        }
        Command::RejectBatch { bid, message } => {
            let b = live_batch(state, *bid)?;
            if park_if_held(state, lc, b, &mut d)? {
                return Ok(d);
            }
            check_size("message", message.len(), MAX_JOB_FIELD_BYTES)?;
            d.push(
                state,
                StreamId::Batch(*bid),
                event::BatchAcquired { jobs: Vec::new() },
            );
            d.push(
                state,
                StreamId::Batch(*bid),
                event::BatchFailed {
                    message: format!("the payload does not expand: {message}"),
                },
            );
        }
        Command::CreateJob { bid, spec } => {
            let b = live_batch(state, *bid)?;
            if b.status != BatchState::Processing {
                return Err(Rejection::IllegalTransition {
                    item: Item::Batch(*bid),
                    current: b.status.to_string(),
                    requested: "a new job".into(),
                    allowed: vec!["jobs are added only while the batch is Processing".into()],
                });
            }
            validate_spec(spec)?;
            d.push(state, StreamId::Job(state.next_jid()), job_created(b, spec));
        }
        Command::StartJob { jid } => {
            let j = live_job(state, *jid)?;
            job_move(lc, j, JobState::Estimating)?;
            let profile = &j.configuration.profile_name;
            if state.held_collections.contains(profile) {
                job_move(lc, j, JobState::Held)?;
                d.push(
                    state,
                    StreamId::Job(*jid),
                    status_changed(
                        j,
                        JobState::Held,
                        format!("collection {profile} is held"),
                        false,
                        None,
                    ),
                );
            } else if state.paused {
                return Err(Rejection::QueuePaused {
                    item: Item::Job(*jid),
                });
            } else {
                d.push(
                    state,
                    StreamId::Job(*jid),
                    status_changed(j, JobState::Estimating, String::new(), false, None),
                );
            }
        }
        Command::SetJobStatus {
            jid,
            target,
            message,
            priority,
        } => {
            let j = live_job(state, *jid)?;
            let to = match target {
                Target::To(s) => *s,
                Target::Success => lc
                    .jobs
                    .success(j.status)
                    .ok_or_else(|| no_successor(lc, j, "success"))?,
                Target::Fail => lc
                    .jobs
                    .fail(j.status)
                    .ok_or_else(|| no_successor(lc, j, "fail"))?,
            };
            job_move(lc, j, to)?;
            // Moves with rules of their own go through their own command, so
            // an explicit target cannot skip them.
            if j.status == JobState::Failed && to != JobState::Deleted {
                return Err(Rejection::IllegalTransition {
                    item: Item::Job(*jid),
                    current: j.status.to_string(),
                    requested: format!("{to} by a status change"),
                    allowed: vec![
                        format!(
                            "a requeue (resumes at {}, retry_count + 1)",
                            requeue_target(lc, j)
                        ),
                        "Deleted".into(),
                    ],
                });
            }
            if j.status == JobState::Pending && to == JobState::Estimating {
                let profile = &j.configuration.profile_name;
                if state.held_collections.contains(profile) {
                    return Err(Rejection::CollectionStillHeld {
                        profile: profile.clone(),
                    });
                }
                if state.paused {
                    return Err(Rejection::QueuePaused {
                        item: Item::Job(*jid),
                    });
                }
            }
            if let Some(p) = priority {
                check_priority(*p)?;
                if to == JobState::Deleted {
                    return Err(Rejection::Invalid {
                        field: "priority".into(),
                        reason: "a deleted job keeps its priority; do not set one with a delete"
                            .into(),
                    });
                }
            }
            if to == JobState::Deleted {
                d.push(
                    state,
                    StreamId::Job(*jid),
                    event::JobDeleted {
                        from: j.status,
                        reason: message.clone(),
                    },
                );
            } else {
                d.push(
                    state,
                    StreamId::Job(*jid),
                    status_changed(j, to, message.clone(), false, *priority),
                );
            }
            finish_batch_if_done(state, &mut d, j.bid, &[(*jid, to)]);
        }
        Command::StepOutcome {
            jid,
            state: reported,
            success,
            message,
            priority,
            space_needed,
            identifiers,
            store,
            inventory,
        } => {
            let j = live_job(state, *jid)?;
            if j.status != *reported {
                return Err(Rejection::StaleReport {
                    item: Item::Job(*jid),
                    current: j.status.to_string(),
                    reported: reported.to_string(),
                });
            }
            let to = if *success {
                lc.jobs
                    .success(j.status)
                    .ok_or_else(|| no_successor(lc, j, "success"))?
            } else {
                lc.jobs
                    .fail(j.status)
                    .ok_or_else(|| no_successor(lc, j, "fail"))?
            };
            job_move(lc, j, to)?;
            if let Some(p) = priority {
                check_priority(*p)?;
            }
            let stream = StreamId::Job(*jid);
            // A report that restates what the job already has (the ark the
            // minting route recorded, a re-measured size that did not change)
            // appends nothing for it.
            if let Some(space_needed) = space_needed.filter(|s| *s != j.space_needed) {
                d.push(
                    state,
                    stream,
                    event::JobSpaceEstimated {
                        space_needed,
                        priority: None,
                    },
                );
            }
            if let Some(ids) = identifiers.as_ref().filter(|ids| **ids != j.identifiers) {
                validate_identifiers(ids)?;
                d.push(
                    state,
                    stream,
                    event::JobIdentifiersAssigned {
                        identifiers: ids.clone(),
                    },
                );
            }
            if let Some(store) = store {
                d.push(
                    state,
                    stream,
                    event::JobStoreRecorded {
                        store: store.clone(),
                    },
                );
            }
            if let Some(inventory) = inventory {
                d.push(
                    state,
                    stream,
                    event::JobInventoryRecorded {
                        inventory: inventory.clone(),
                    },
                );
            }
            d.push(
                state,
                stream,
                status_changed(j, to, message.clone(), false, *priority),
            );
            finish_batch_if_done(state, &mut d, j.bid, &[(*jid, to)]);
        }
        Command::RecordSpace {
            jid,
            space_needed,
            priority,
        } => {
            let j = changeable_job(state, lc, *jid)?;
            if let Some(p) = priority {
                check_priority(*p)?;
            }
            d.push(
                state,
                StreamId::Job(j.jid),
                event::JobSpaceEstimated {
                    space_needed: *space_needed,
                    priority: *priority,
                },
            );
        }
        Command::RecordIdentifiers { jid, identifiers } => {
            let j = changeable_job(state, lc, *jid)?;
            validate_identifiers(identifiers)?;
            d.push(
                state,
                StreamId::Job(j.jid),
                event::JobIdentifiersAssigned {
                    identifiers: identifiers.clone(),
                },
            );
        }
        Command::RecordStore { jid, store } => {
            let j = changeable_job(state, lc, *jid)?;
            d.push(
                state,
                StreamId::Job(j.jid),
                event::JobStoreRecorded {
                    store: store.clone(),
                },
            );
        }
        Command::RecordInventory { jid, inventory } => {
            let j = changeable_job(state, lc, *jid)?;
            d.push(
                state,
                StreamId::Job(j.jid),
                event::JobInventoryRecorded {
                    inventory: inventory.clone(),
                },
            );
        }
        Command::RecordStepRetry {
            jid,
            attempt,
            message,
        } => {
            let j = changeable_job(state, lc, *jid)?;
            if !j.status.is_active() {
                return Err(Rejection::IllegalTransition {
                    item: Item::Job(*jid),
                    current: j.status.to_string(),
                    requested: "a step retry".into(),
                    allowed: vec!["retries are recorded only while a step is at work".into()],
                });
            }
            d.push(
                state,
                StreamId::Job(j.jid),
                event::JobStepRetried {
                    state: j.status,
                    attempt: *attempt,
                    message: message.clone(),
                },
            );
        }
        Command::RequeueJob { jid, reason } => {
            let j = live_job(state, *jid)?;
            if j.status != JobState::Failed {
                return Err(Rejection::IllegalTransition {
                    item: Item::Job(*jid),
                    current: j.status.to_string(),
                    requested: "a requeue".into(),
                    allowed: vec!["only Failed jobs are requeued".into()],
                });
            }
            let to = requeue_target(lc, j);
            job_move(lc, j, to)?;
            d.push(
                state,
                StreamId::Job(*jid),
                status_changed(j, to, reason.clone(), true, None),
            );
        }
        Command::HoldJob { jid, reason } => {
            let j = live_job(state, *jid)?;
            job_move(lc, j, JobState::Held)?;
            d.push(
                state,
                StreamId::Job(*jid),
                status_changed(j, JobState::Held, reason.clone(), false, None),
            );
        }
        Command::ReleaseJob { jid, reason } => {
            let j = live_job(state, *jid)?;
            if j.status != JobState::Held {
                return Err(illegal(lc, j, "Pending (a release)"));
            }
            job_move(lc, j, JobState::Pending)?;
            d.push(
                state,
                StreamId::Job(*jid),
                status_changed(j, JobState::Pending, reason.clone(), false, None),
            );
        }
        Command::ReleaseBatch { bid, reason } => {
            let b = live_batch(state, *bid)?;
            if b.status != BatchState::Held {
                return Err(batch_illegal(lc, b, "Pending (a release)"));
            }
            batch_move(lc, b, BatchState::Pending)?;
            if state.held_collections.contains(&b.submission.profile_name) {
                return Err(Rejection::CollectionStillHeld {
                    profile: b.submission.profile_name.clone(),
                });
            }
            d.push(
                state,
                StreamId::Batch(*bid),
                event::BatchReleased {
                    reason: reason.clone(),
                },
            );
        }
        Command::HoldCollection { profile, reason } => {
            check_profile(profile)?;
            if state.held_collections.contains(profile) {
                return Err(Rejection::NoChange(format!(
                    "collection {profile} is already held"
                )));
            }
            d.push(
                state,
                StreamId::System,
                event::CollectionHeld {
                    profile: profile.clone(),
                    reason: reason.clone(),
                },
            );
        }
        Command::ReleaseCollection { profile, reason } => {
            check_profile(profile)?;
            if !state.held_collections.contains(profile) {
                return Err(Rejection::NoChange(format!(
                    "collection {profile} is not held"
                )));
            }
            d.push(
                state,
                StreamId::System,
                event::CollectionReleased {
                    profile: profile.clone(),
                    reason: reason.clone(),
                },
            );
            release_held(state, lc, &mut d, profile, reason, true);
        }
        Command::ReleaseHeldJobs { profile, reason } => {
            check_profile(profile)?;
            release_held(state, lc, &mut d, profile, reason, false);
            if d.events.is_empty() {
                return Err(Rejection::NoChange(format!(
                    "collection {profile} has no held jobs"
                )));
            }
        }
        Command::PauseQueue { reason } => {
            if state.paused {
                return Err(Rejection::NoChange(
                    "the ingest queue is already paused".into(),
                ));
            }
            d.push(
                state,
                StreamId::System,
                event::QueuePaused {
                    reason: reason.clone(),
                },
            );
        }
        Command::ResumeQueue { reason } => {
            if !state.paused {
                return Err(Rejection::NoChange("the ingest queue is not paused".into()));
            }
            d.push(
                state,
                StreamId::System,
                event::QueueResumed {
                    reason: reason.clone(),
                },
            );
        }
        Command::UpdateReporting { bid, reason } => {
            let b = live_batch(state, *bid)?;
            batch_move(lc, b, BatchState::UpdateReporting)?;
            d.push(
                state,
                StreamId::Batch(*bid),
                event::BatchUpdateReporting {
                    reason: reason.clone(),
                },
            );
        }
        Command::DeleteJob { jid, reason } => {
            let j = live_job(state, *jid)?;
            job_move(lc, j, JobState::Deleted)?;
            d.push(
                state,
                StreamId::Job(*jid),
                event::JobDeleted {
                    from: j.status,
                    reason: reason.clone(),
                },
            );
            finish_batch_if_done(state, &mut d, j.bid, &[(*jid, JobState::Deleted)]);
        }
        Command::DeleteBatch { bid, reason } => {
            let b = live_batch(state, *bid)?;
            batch_move(lc, b, BatchState::Deleted)?;
            let active: Vec<(Jid, JobState)> = state
                .batch_jobs(b)
                .filter(|j| !j.status.is_finished() && !lc.jobs.can(j.status, JobState::Deleted))
                .map(|j| (j.jid, j.status))
                .collect();
            if !active.is_empty() {
                return Err(Rejection::ActiveJobs {
                    item: Item::Batch(*bid),
                    jobs: active,
                });
            }
            for j in state.batch_jobs(b) {
                if lc.jobs.can(j.status, JobState::Deleted) {
                    d.push(
                        state,
                        StreamId::Job(j.jid),
                        event::JobDeleted {
                            from: j.status,
                            reason: format!("batch {bid} deleted: {reason}"),
                        },
                    );
                }
            }
            d.push(
                state,
                StreamId::Batch(*bid),
                event::BatchDeleted {
                    reason: reason.clone(),
                },
            );
        }
        Command::ReportBatch {
            bid,
            notification_error,
        } => {
            let b = live_batch(state, *bid)?;
            if !matches!(
                b.status,
                BatchState::Reporting | BatchState::UpdateReporting
            ) {
                return Err(batch_illegal(lc, b, "a report"));
            }
            let mut successful = Vec::new();
            let mut failed = Vec::new();
            let mut unfinished = 0usize;
            for j in state.batch_jobs(b) {
                match j.status {
                    JobState::Completed => successful.push(j.jid),
                    JobState::Failed => failed.push(j.jid),
                    JobState::Deleted => {}
                    _ => unfinished += 1,
                }
            }
            let update = b.status == BatchState::UpdateReporting;
            let (ok_to, fail_to) = (lc.batches.success(b.status), lc.batches.fail(b.status));
            d.push(
                state,
                StreamId::Batch(*bid),
                event::BatchReported {
                    successful_jobs: successful.clone(),
                    failed_jobs: failed.clone(),
                    update,
                },
            );
            let problem = match (notification_error, failed.len(), unfinished) {
                (Some(e), _, _) => Some(format!("the report could not be sent: {e}")),
                (None, 0, 0) => None,
                (None, f, 0) => Some(format!("{f} of {} job(s) failed", successful.len() + f)),
                (None, f, u) => Some(format!("{f} job(s) failed, {u} still at work")),
            };
            match (problem, ok_to, fail_to) {
                (None, Some(BatchState::Completed), _) => d.push(
                    state,
                    StreamId::Batch(*bid),
                    event::BatchCompleted {
                        message: format!("{} job(s) completed", successful.len()),
                    },
                ),
                (Some(message), _, Some(BatchState::Failed)) => {
                    d.push(state, StreamId::Batch(*bid), event::BatchFailed { message })
                }
                _ => return Err(batch_illegal(lc, b, "Completed or Failed")),
            }
        }
        Command::RecordRepair { paths } => {
            if paths.is_empty() {
                return Err(Rejection::NoChange("no paths were repaired".into()));
            }
            d.push(
                state,
                StreamId::System,
                event::TreeRepaired {
                    paths: paths.clone(),
                },
            );
        }
        Command::Cleanup { before } => {
            for b in state.batches.values() {
                let old_enough = before.is_none_or(|t| b.last_modified < t);
                if !b.cleaned_up && lc.batches.is_terminal(b.status) && old_enough {
                    d.push(
                        state,
                        StreamId::Batch(b.bid),
                        event::BatchCleanedUp {
                            jobs: b.jobs.clone(),
                        },
                    );
                }
            }
        }
    }
    Ok(d)
}

/// Where a requeue sends a failed job: the step after its
/// `last_successful_status`, or Pending when it has none (a job that failed
/// before any step succeeded starts over).
///
/// The step after a state is its success successor; for a state without one
/// (Pending, Held) it is the first target that moves forward (not Held,
/// Failed or Deleted): Pending → Estimating, Held → Pending.
pub fn requeue_target(lc: &Lifecycle, job: &Job) -> JobState {
    job.last_successful_status
        .and_then(|s| {
            lc.jobs.success(s).or_else(|| {
                lc.jobs
                    .allowed(s)
                    .iter()
                    .copied()
                    .find(|t| !matches!(t, JobState::Held | JobState::Failed | JobState::Deleted))
            })
        })
        .filter(|t| lc.jobs.can(JobState::Failed, *t))
        .unwrap_or(JobState::Pending)
}

fn release_held(
    state: &State,
    lc: &Lifecycle,
    d: &mut Decision,
    profile: &str,
    reason: &str,
    batches: bool,
) {
    for j in state.jobs.values() {
        if j.status == JobState::Held
            && !j.cleaned_up
            && j.configuration.profile_name == profile
            && lc.jobs.can(JobState::Held, JobState::Pending)
        {
            d.push(
                state,
                StreamId::Job(j.jid),
                status_changed(
                    j,
                    JobState::Pending,
                    format!("collection {profile} released: {reason}"),
                    false,
                    None,
                ),
            );
        }
    }
    if batches {
        for b in state.batches.values() {
            if b.status == BatchState::Held && !b.cleaned_up && b.submission.profile_name == profile
            {
                d.push(
                    state,
                    StreamId::Batch(b.bid),
                    event::BatchReleased {
                        reason: format!("collection {profile} released: {reason}"),
                    },
                );
            }
        }
    }
}

/// Moves the batch to Reporting in the same command when the jobs being
/// moved leave none of its jobs at work.
fn finish_batch_if_done(state: &State, d: &mut Decision, bid: Bid, moved: &[(Jid, JobState)]) {
    let Some(b) = state.batches.get(&bid) else {
        return;
    };
    if b.status != BatchState::Processing {
        return;
    }
    let overlay: BTreeMap<Jid, JobState> = moved.iter().copied().collect();
    let done = state.batch_jobs(b).all(|j| {
        overlay
            .get(&j.jid)
            .copied()
            .unwrap_or(j.status)
            .is_finished()
    });
    if done {
        let any_failed = state
            .batch_jobs(b)
            .any(|j| overlay.get(&j.jid).copied().unwrap_or(j.status) == JobState::Failed);
        let reason = if any_failed {
            "every job finished, some failed"
        } else {
            "every job finished"
        };
        d.push(
            state,
            StreamId::Batch(bid),
            event::BatchReportingStarted {
                reason: reason.into(),
            },
        );
    }
}

fn job_created(b: &Batch, spec: &JobSpec) -> event::JobCreated {
    event::JobCreated {
        bid: b.bid,
        priority: spec.priority.unwrap_or(DEFAULT_PRIORITY),
        configuration: JobConfiguration {
            profile_name: b.submission.profile_name.clone(),
            submitter: b.submission.submitter.clone(),
            payload_url: spec.payload_url.clone(),
            payload_type: spec.payload_type,
            response_type: b.submission.response_type.clone(),
            submission_mode: b.submission.submission_mode,
            digest: spec.digest.clone(),
        },
        identifiers: spec.identifiers.clone(),
        metadata: spec.metadata.clone(),
    }
}

fn status_changed(
    j: &Job,
    to: JobState,
    message: String,
    retry: bool,
    priority: Option<u8>,
) -> event::JobStatusChanged {
    event::JobStatusChanged {
        from: j.status,
        to,
        message,
        retry,
        priority,
    }
}

fn live_batch(state: &State, bid: Bid) -> Result<&Batch, Rejection> {
    let b = state.batches.get(&bid).ok_or(Rejection::NotFound {
        item: Item::Batch(bid),
    })?;
    if b.cleaned_up {
        return Err(Rejection::CleanedUp {
            item: Item::Batch(bid),
        });
    }
    Ok(b)
}

fn live_job(state: &State, jid: Jid) -> Result<&Job, Rejection> {
    let j = state.jobs.get(&jid).ok_or(Rejection::NotFound {
        item: Item::Job(jid),
    })?;
    if j.cleaned_up {
        return Err(Rejection::CleanedUp {
            item: Item::Job(jid),
        });
    }
    Ok(j)
}

/// A job whose data may still be recorded: not in a terminal state.
fn changeable_job<'a>(state: &'a State, lc: &Lifecycle, jid: Jid) -> Result<&'a Job, Rejection> {
    let j = live_job(state, jid)?;
    if lc.jobs.is_terminal(j.status) {
        return Err(illegal(lc, j, "a data change"));
    }
    Ok(j)
}

fn job_move(lc: &Lifecycle, j: &Job, to: JobState) -> Result<(), Rejection> {
    if lc.jobs.can(j.status, to) {
        Ok(())
    } else {
        Err(illegal(lc, j, to.name()))
    }
}

/// A pending batch being acquired parks in Held while its collection is
/// held (`true`: the decision is complete); otherwise it may go on to
/// Processing.
fn park_if_held(
    state: &State,
    lc: &Lifecycle,
    b: &Batch,
    d: &mut Decision,
) -> Result<bool, Rejection> {
    batch_move(lc, b, BatchState::Processing)?;
    let profile = &b.submission.profile_name;
    if !state.held_collections.contains(profile) {
        return Ok(false);
    }
    batch_move(lc, b, BatchState::Held)?;
    d.push(
        state,
        StreamId::Batch(b.bid),
        event::BatchHeld {
            reason: format!("collection {profile} is held"),
        },
    );
    Ok(true)
}

fn batch_move(lc: &Lifecycle, b: &Batch, to: BatchState) -> Result<(), Rejection> {
    if lc.batches.can(b.status, to) {
        Ok(())
    } else {
        Err(batch_illegal(lc, b, to.name()))
    }
}

fn illegal(lc: &Lifecycle, j: &Job, requested: &str) -> Rejection {
    Rejection::IllegalTransition {
        item: Item::Job(j.jid),
        current: j.status.to_string(),
        requested: requested.to_string(),
        allowed: lc.jobs.allowed_names(j.status),
    }
}

fn batch_illegal(lc: &Lifecycle, b: &Batch, requested: &str) -> Rejection {
    Rejection::IllegalTransition {
        item: Item::Batch(b.bid),
        current: b.status.to_string(),
        requested: requested.to_string(),
        allowed: lc.batches.allowed_names(b.status),
    }
}

fn no_successor(lc: &Lifecycle, j: &Job, which: &str) -> Rejection {
    illegal(lc, j, &format!("its {which} successor (it has none)"))
}

fn validate_identifiers(ids: &Identifiers) -> Result<(), Rejection> {
    let bytes = ids.primary_id.as_ref().map_or(0, String::len)
        + ids.local_ids.iter().map(String::len).sum::<usize>();
    check_size("identifiers", bytes, MAX_JOB_FIELD_BYTES)?;
    if let Some(p) = &ids.primary_id {
        check_text("primary_id", p)?;
    }
    for l in &ids.local_ids {
        check_text("local_id", l)?;
    }
    Ok(())
}

fn check_priority(p: u8) -> Result<(), Rejection> {
    if p > MAX_PRIORITY {
        return Err(Rejection::Invalid {
            field: "priority".into(),
            reason: format!("{p} is outside 0-{MAX_PRIORITY}"),
        });
    }
    Ok(())
}

/// Whether ZooKeeper accepts the character in a path segment (its
/// `PathUtils.validatePath` refuses surrogates, private use, U+FFF0–U+FFFF,
/// anything above the BMP, and control characters).
fn zookeeper_path_char(c: char) -> bool {
    let u = c as u32;
    !(u == 0
        || (0x1..=0x1f).contains(&u)
        || (0x7f..=0x9f).contains(&u)
        || (0xd800..=0xf8ff).contains(&u)
        || (0xfff0..=0xffff).contains(&u)
        || u > 0xffff)
}

/// A profile name becomes a ZooKeeper path segment (`/locks/collections/<profile>`).
fn check_profile(profile: &str) -> Result<(), Rejection> {
    let bad = |reason: &str| Rejection::Invalid {
        field: "profile".into(),
        reason: format!("{profile:?} {reason}"),
    };
    if profile.is_empty() {
        return Err(bad("is empty"));
    }
    if profile.len() > 200 {
        return Err(bad("is longer than 200 characters"));
    }
    if profile == "."
        || profile == ".."
        || profile.contains('/')
        || profile
            .chars()
            .any(|c| c.is_control() || !zookeeper_path_char(c))
    {
        return Err(bad(
            "must be a single ZooKeeper path segment: no '/', no control, private-use or non-BMP characters, not '.' or '..'",
        ));
    }
    Ok(())
}

fn check_text(field: &str, value: &str) -> Result<(), Rejection> {
    if value.chars().any(|c| c.is_control() && c != '\t') {
        return Err(Rejection::Invalid {
            field: field.into(),
            reason: format!("{value:?} contains control characters"),
        });
    }
    Ok(())
}

/// The most text a submission may carry (its fields, manifest lines and
/// extra fields together). It is projected into one ZooKeeper node, which
/// must stay well under ZooKeeper's 1 MiB `jute.maxbuffer`.
pub const MAX_SUBMISSION_BYTES: usize = 512 * 1024;
/// The most text one job's payload URL, identifiers or metadata may carry.
pub const MAX_JOB_FIELD_BYTES: usize = 64 * 1024;

fn submission_bytes(s: &Submission) -> usize {
    let erc = [&s.erc.who, &s.erc.what, &s.erc.when, &s.erc.r#where];
    s.profile_name.len()
        + s.submitter.len()
        + s.payload_url.len()
        + s.response_type.len()
        + s.manifest.iter().map(|l| l.len() + 3).sum::<usize>()
        + erc
            .iter()
            .map(|e| e.as_ref().map_or(0, String::len))
            .sum::<usize>()
        + s.digest
            .as_ref()
            .map_or(0, |d| d.algorithm.len() + d.value.len())
        + s.extra
            .iter()
            .map(|(k, v)| k.len() + v.len() + 6)
            .sum::<usize>()
}

fn check_size(field: &str, bytes: usize, limit: usize) -> Result<(), Rejection> {
    if bytes > limit {
        return Err(Rejection::Invalid {
            field: field.into(),
            reason: format!("is {bytes} bytes; at most {limit} are accepted"),
        });
    }
    Ok(())
}

fn validate_submission(s: &Submission) -> Result<(), Rejection> {
    check_size("submission", submission_bytes(s), MAX_SUBMISSION_BYTES)?;
    check_profile(&s.profile_name)?;
    let required = |field: &str, v: &str| {
        if v.trim().is_empty() {
            Err(Rejection::Invalid {
                field: field.into(),
                reason: "is required".into(),
            })
        } else {
            check_text(field, v)
        }
    };
    required("submitter", &s.submitter)?;
    if s.manifest.is_empty() {
        required("payload_url", &s.payload_url)?;
    }
    check_text("payload_url", &s.payload_url)?;
    for (i, line) in s.manifest.iter().enumerate() {
        if line.trim().is_empty() {
            return Err(Rejection::Invalid {
                field: format!("manifest line {}", i + 1),
                reason: "is empty".into(),
            });
        }
        check_text(&format!("manifest line {}", i + 1), line)?;
    }
    if let Some(d) = &s.digest {
        validate_digest(d)?;
    }
    for key in s.extra.keys() {
        if RESERVED_SUBMISSION_KEYS.contains(&key.as_str()) {
            return Err(Rejection::Invalid {
                field: format!("extra.{key}"),
                reason: format!("{key:?} is a submission field of its own; give it as that field"),
            });
        }
        check_text(&format!("extra.{key}"), key)?;
    }
    Ok(())
}

/// Keys of the projected submission node that extra fields may not shadow.
pub const RESERVED_SUBMISSION_KEYS: [&str; 14] = [
    "profile_name",
    "submitter",
    "payload_url",
    "type",
    "response_type",
    "submission_mode",
    "erc_who",
    "erc_what",
    "erc_when",
    "erc_where",
    "batchID",
    "manifest",
    "digest_type",
    "digest_value",
];

fn validate_spec(spec: &JobSpec) -> Result<(), Rejection> {
    check_size("payload_url", spec.payload_url.len(), MAX_JOB_FIELD_BYTES)?;
    let ids = spec.identifiers.primary_id.as_ref().map_or(0, String::len)
        + spec
            .identifiers
            .local_ids
            .iter()
            .map(String::len)
            .sum::<usize>();
    check_size("identifiers", ids, MAX_JOB_FIELD_BYTES)?;
    let m = &spec.metadata;
    let meta: usize = [&m.who, &m.what, &m.when, &m.r#where]
        .iter()
        .map(|e| e.as_ref().map_or(0, String::len))
        .sum();
    check_size("metadata", meta, MAX_JOB_FIELD_BYTES)?;
    if spec.payload_url.trim().is_empty() {
        return Err(Rejection::Invalid {
            field: "payload_url".into(),
            reason: "is required".into(),
        });
    }
    check_text("payload_url", &spec.payload_url)?;
    if let Some(p) = spec.priority {
        check_priority(p)?;
    }
    if let Some(d) = &spec.digest {
        validate_digest(d)?;
    }
    Ok(())
}

/// The digest algorithms a depositor may name, with their hex lengths.
pub const DIGEST_ALGORITHMS: [(&str, usize); 4] =
    [("md5", 32), ("sha1", 40), ("sha256", 64), ("sha512", 128)];

fn validate_digest(d: &Digest) -> Result<(), Rejection> {
    let Some((_, len)) = DIGEST_ALGORITHMS
        .iter()
        .find(|(a, _)| a.eq_ignore_ascii_case(&d.algorithm))
    else {
        return Err(Rejection::Invalid {
            field: "digest.algorithm".into(),
            reason: format!("{:?} is not one of md5, sha1, sha256, sha512", d.algorithm),
        });
    };
    if d.value.len() != *len || !d.value.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(Rejection::Invalid {
            field: "digest.value".into(),
            reason: format!(
                "a {} digest is {len} hex digits, got {:?}",
                d.algorithm, d.value
            ),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{PayloadType, SubmissionMode};
    use crate::ids::{Bid, Jid};

    fn submission(profile: &str) -> Submission {
        Submission {
            profile_name: profile.into(),
            submitter: "alice".into(),
            payload_url: "https://example.org/a".into(),
            payload_type: PayloadType::File,
            response_type: "json".into(),
            submission_mode: SubmissionMode::Add,
            manifest: vec![],
            erc: Erc::default(),
            digest: None,
            extra: BTreeMap::new(),
        }
    }

    fn field_of(r: Result<Decision, Rejection>) -> String {
        match r {
            Err(Rejection::Invalid { field, .. }) => field,
            other => panic!("expected Invalid, got {other:?}"),
        }
    }

    // A profile ZooKeeper refuses as a path segment stopped the projector for good.
    #[test]
    fn profiles_zookeeper_cannot_hold_are_refused() {
        let (state, lc) = (State::new(), Lifecycle::builtin());
        for bad in ["coll😀", "a\u{e000}b", "x\u{fff5}", "nul\0"] {
            let cmd = Command::HoldCollection {
                profile: bad.into(),
                reason: String::new(),
            };
            assert_eq!(field_of(decide(&state, &lc, &cmd)), "profile", "{bad:?}");
            let cmd = Command::SubmitBatch {
                uuid: Uuid::nil(),
                submission: submission(bad),
            };
            assert_eq!(field_of(decide(&state, &lc, &cmd)), "profile", "{bad:?}");
        }
        let ok = Command::HoldCollection {
            profile: "ucb_lib_étude".into(),
            reason: String::new(),
        };
        assert!(decide(&state, &lc, &ok).is_ok());
    }

    // A worker's outcome is one atomic decision; a report on a state the job
    // left is stale.
    #[test]
    fn a_step_outcome_records_its_data_and_the_move_together() {
        let lc = Lifecycle::builtin();
        let mut state = State::new();
        let mut position = 0;
        let mut run = |state: &mut State, cmd: Command| -> Result<Vec<Event>, Rejection> {
            let d = decide(state, &lc, &cmd)?;
            let mut prev = state.head_hash;
            for p in &d.events {
                position += 1;
                let version = state.stream_version(p.stream) + 1;
                let r = crate::codec::Recorded {
                    envelope: crate::codec::Envelope {
                        position,
                        stream: p.stream,
                        version,
                        timestamp: chrono::Utc::now(),
                        actor: crate::event::Actor::engine(),
                        correlation_id: Uuid::nil(),
                        schema_version: crate::codec::SCHEMA_VERSION,
                        prev_hash: prev,
                        hash: [position as u8; 32],
                    },
                    event: p.event.clone(),
                };
                prev = r.envelope.hash;
                state.apply(&r).unwrap();
            }
            Ok(d.events.into_iter().map(|p| p.event).collect())
        };
        run(
            &mut state,
            Command::SubmitBatch {
                uuid: Uuid::nil(),
                submission: submission("demo"),
            },
        )
        .unwrap();
        let spec = JobSpec {
            payload_url: "u".into(),
            payload_type: PayloadType::File,
            identifiers: Identifiers::default(),
            metadata: Erc::default(),
            digest: None,
            priority: None,
        };
        run(
            &mut state,
            Command::AcquireBatch {
                bid: Bid(1),
                jobs: vec![spec],
            },
        )
        .unwrap();
        run(&mut state, Command::StartJob { jid: Jid(1) }).unwrap();
        let outcome = |reported: JobState| Command::StepOutcome {
            jid: Jid(1),
            state: reported,
            success: true,
            message: String::new(),
            priority: Some(12),
            space_needed: Some(4096),
            identifiers: None,
            store: None,
            inventory: None,
        };
        let events = run(&mut state, outcome(JobState::Estimating)).unwrap();
        assert_eq!(
            events.iter().map(Event::kind).collect::<Vec<_>>(),
            ["JobSpaceEstimated", "JobStatusChanged"]
        );
        let j = &state.jobs[&Jid(1)];
        assert_eq!(
            (j.status, j.space_needed, j.priority),
            (JobState::Provisioning, 4096, 12)
        );
        // The same report again is stale: the job has moved on.
        let err = run(&mut state, outcome(JobState::Estimating)).unwrap_err();
        assert!(matches!(err, Rejection::StaleReport { .. }), "{err:?}");
        assert_eq!(err.to_string(), "job jid0000000001 is Provisioning, not Estimating: the report is stale and was discarded");

        // A report restating what the job has appends only the move (the
        // ark was recorded when it was minted; the size did not change).
        let ark = Identifiers {
            primary_id: Some("ark:/99999/fk4x".into()),
            local_ids: vec!["l".into()],
        };
        run(
            &mut state,
            Command::RecordIdentifiers {
                jid: Jid(1),
                identifiers: ark.clone(),
            },
        )
        .unwrap();
        let restate = Command::StepOutcome {
            jid: Jid(1),
            state: JobState::Provisioning,
            success: true,
            message: String::new(),
            priority: None,
            space_needed: Some(4096),
            identifiers: Some(ark),
            store: None,
            inventory: None,
        };
        let events = run(&mut state, restate).unwrap();
        assert_eq!(
            events.iter().map(Event::kind).collect::<Vec<_>>(),
            ["JobStatusChanged"]
        );
    }

    // An extra field named like a projected one was accepted and then dropped.
    #[test]
    fn extra_fields_may_not_shadow_submission_fields() {
        let mut s = submission("demo");
        s.extra.insert("batchID".into(), "not-the-uuid".into());
        let cmd = Command::SubmitBatch {
            uuid: Uuid::nil(),
            submission: s,
        };
        assert_eq!(
            field_of(decide(&State::new(), &Lifecycle::builtin(), &cmd)),
            "extra.batchID"
        );
    }
}
