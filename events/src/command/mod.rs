//! Commands and the decisions that turn them into events.
//!
//! [`decide`] is pure: given the folded [`State`], the [`Lifecycle`] and a
//! [`Command`], it returns the events to append (with the stream versions they
//! were decided against) or a [`Rejection`] naming what is wrong. Nothing is
//! appended for a rejected command.

use std::fmt;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::append::{ExpectedVersion, Proposed};
use crate::event::{
    AccessDelivery, AccessPackaging, AccessQueue, AccessToken, Digest, Erc, Event, FailureKind,
    Identifiers, InventoryParams, PayloadType, StoreParams, StreamId, Submission,
};
use crate::ids::{Bid, Jid, Qid};
use crate::lifecycle::{JobState, Lifecycle};
use crate::state::State;

mod access;
mod admin;
pub use admin::{MAX_FAULTS, MAX_FOREIGN_NODES};
mod batch;
mod job;
mod rules;
mod validate;

pub use access::MAX_ACCESS_FIELD_BYTES;
pub use rules::requeue_target;
pub use validate::{
    is_reserved_submission_key, validate_spec, DIGEST_ALGORITHMS, MAX_JOB_FIELD_BYTES,
    MAX_SUBMISSION_BYTES, MERRITT_READER_KEYS, RESERVED_SUBMISSION_KEYS,
};

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
    /// A Merritt batch consumer acquired the batch (mrt-zk's
    /// `acquirePendingBatch`, adopted): Processing with no jobs yet, its
    /// jobs to come one by one ([`Command::CreateJob`], mrt-zk's
    /// `createJob`); Held if its collection is held.
    OpenBatch {
        /// The batch.
        bid: Bid,
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
        /// The kind of a failure (only with `success: false`); recorded as
        /// `JobFailureClassified` after the move to Failed. An
        /// unrecoverable kind refuses every later requeue.
        failure: Option<FailureKind>,
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
    /// An admin arms faults: the next `count` (1–1000) successful reports
    /// of the step of `state` are recorded as failures.
    ArmFaults {
        /// The step's state.
        state: JobState,
        /// How many reports.
        count: u32,
        /// Why.
        reason: String,
    },
    /// An admin disarms every armed fault.
    ClearFaults,
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
    /// An admin applied the repair of a consistency finding; records what
    /// it changed and why (`ConsistencyRepaired`).
    RecordConsistencyRepair {
        /// The finding's id.
        finding: String,
        /// The finding's rule.
        rule: String,
        /// The repair's action (`delete-node`, `record-version`, …).
        action: String,
        /// What it changed.
        paths: Vec<String>,
        /// Why.
        reason: String,
    },
    /// The projector converged one item's nodes that another ZooKeeper
    /// client had changed; records what it found (`ForeignChangeRepaired`)
    /// on `stream` (the system stream when the state does not hold that
    /// item).
    RecordForeignChange {
        /// The item's stream.
        stream: StreamId,
        /// What was found and done.
        repaired: crate::event::ForeignChangeRepaired,
    },
    /// Removes finished (Completed or Deleted) batches from the live tree.
    Cleanup {
        /// Only batches last changed before this time.
        before: Option<DateTime<Utc>>,
    },
    /// Removes one finished (Completed or Deleted) batch and its jobs from
    /// the live tree, as [`Command::Cleanup`] does: what mrt-zk's
    /// `Batch.delete` and `deleteCompletedBatches` do to the tree, adopted
    /// (`ingest serve --foreign-writes adopt`).
    CleanupBatch {
        /// The batch.
        bid: Bid,
    },
    /// A requester asks for an object to be assembled: queued Pending on the
    /// small or the large access queue, chosen by `token.size` against
    /// `size_limit` as mrt-store chooses (large when the size exceeds it).
    RequestAccess {
        /// What to assemble.
        token: AccessToken,
        /// Which files, and whether in a bag.
        packaging: AccessPackaging,
        /// Bytes above which a request goes to the large queue.
        size_limit: u64,
    },
    /// A worker takes a pending access request (Pending → Processing).
    /// Refused while its queue is paused.
    StartAccess {
        /// The request.
        qid: Qid,
    },
    /// A worker reports an assembly's outcome (Processing → Completed or
    /// Failed, by the lifecycle's success and fail marks).
    AccessOutcome {
        /// The request.
        qid: Qid,
        /// Whether the assembly succeeded.
        success: bool,
        /// The error of a failure.
        message: String,
        /// Where a successful assembly's container waits.
        delivery: Option<AccessDelivery>,
    },
    /// An admin requeues a failed access request (Failed → Pending).
    RequeueAccess {
        /// The request.
        qid: Qid,
        /// Why.
        reason: String,
    },
    /// An admin deletes a Completed or Failed access request (soft).
    DeleteAccess {
        /// The request.
        qid: Qid,
        /// Why.
        reason: String,
    },
    /// An admin pauses one access queue.
    PauseAccessQueue {
        /// Which.
        queue: AccessQueue,
        /// Why.
        reason: String,
    },
    /// An admin resumes one access queue.
    ResumeAccessQueue {
        /// Which.
        queue: AccessQueue,
        /// Why.
        reason: String,
    },
    /// `command` (a [`Command::SubmitBatch`], [`Command::AcquireBatch`] or
    /// [`Command::CreateJob`]) with the ids its new batch or jobs take,
    /// instead of the next ones after the log's highest: in adoption mode
    /// ids come from ZooKeeper's sequential counters, shared with mrt-zk
    /// (a batch mrt-zk created keeps the id ZooKeeper gave it; the engine's
    /// own are ids ZooKeeper's counter has passed). Each id must be unused
    /// and the ids ascending; the first ones are taken.
    WithIds {
        /// The ids, ascending (at most [`MAX_GIVEN_IDS`]).
        ids: Vec<u64>,
        /// The command that creates the items.
        command: Box<Command>,
    },
}

/// The most ids a [`Command::WithIds`] may carry (a batch's jobs at most).
pub const MAX_GIVEN_IDS: usize = 1_000_000;

/// Where the ids of new batches and jobs come from.
#[derive(Debug, Clone, Copy)]
pub(super) enum Ids<'a> {
    /// The next ones after the log's highest.
    Next,
    /// These, ascending and unused ([`Command::WithIds`]).
    Given(&'a [u64]),
}

impl Ids<'_> {
    /// The id of a new batch.
    pub(super) fn bid(self, state: &State) -> Result<Bid, Rejection> {
        match self {
            Ids::Next => Ok(state.next_bid()),
            Ids::Given(ids) => {
                let bid = Bid(*ids.first().ok_or_else(|| too_few(0, 1))?);
                if bid.0 == 0 || state.batches.contains_key(&bid) {
                    return Err(id_taken(bid));
                }
                Ok(bid)
            }
        }
    }

    /// The ids of `n` new jobs.
    pub(super) fn jids(self, state: &State, n: usize) -> Result<Vec<Jid>, Rejection> {
        match self {
            Ids::Next => {
                let first = state.next_jid();
                Ok((0..n as u64).map(|i| Jid(first.0 + i)).collect())
            }
            Ids::Given(ids) => {
                if ids.len() < n {
                    return Err(too_few(ids.len(), n));
                }
                let jids: Vec<Jid> = ids[..n].iter().map(|i| Jid(*i)).collect();
                for (i, jid) in jids.iter().enumerate() {
                    let ascending = i == 0 || jids[i - 1] < *jid;
                    if jid.0 == 0 || !ascending || state.jobs.contains_key(jid) {
                        return Err(id_taken(*jid));
                    }
                }
                Ok(jids)
            }
        }
    }
}

fn too_few(given: usize, needed: usize) -> Rejection {
    Rejection::Invalid {
        field: "ids".into(),
        reason: format!("{given} id(s) given, {needed} needed"),
    }
}

fn id_taken(id: impl fmt::Display) -> Rejection {
    Rejection::Invalid {
        field: "ids".into(),
        reason: format!("{id} is taken, zero or out of order"),
    }
}

impl Command {
    /// A worker's report of the step of `state` with no hand-offs: a
    /// [`Command::StepOutcome`] whose data fields are `None`, with `failure`
    /// the kind of a failure (only with `success: false`).
    pub fn outcome(
        jid: Jid,
        state: JobState,
        success: bool,
        message: impl Into<String>,
        failure: Option<FailureKind>,
    ) -> Command {
        Command::StepOutcome {
            jid,
            state,
            success,
            message: message.into(),
            priority: None,
            space_needed: None,
            identifiers: None,
            store: None,
            inventory: None,
            failure,
        }
    }
}

/// A queue item named in a rejection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Item {
    /// A batch.
    Batch(Bid),
    /// A job.
    Job(Jid),
    /// An access (assembly) request.
    Access(Qid),
}

impl fmt::Display for Item {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Item::Batch(b) => write!(f, "batch {b}"),
            Item::Job(j) => write!(f, "job {j}"),
            Item::Access(q) => write!(f, "access request {q}"),
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
    /// The access queue of the request is paused. (HTTP 409)
    #[error("the {queue} access queue is paused; {item} stays Pending until an admin resumes it")]
    AccessQueuePaused {
        /// The request that was to start.
        item: Item,
        /// Its queue.
        queue: AccessQueue,
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
    /// The job failed in a way no requeue can recover (a payload whose
    /// digest does not match the depositor's): only a new submission can
    /// ingest the object. (HTTP 409 `unrecoverable_failure`)
    #[error(
        "{item} failed with {kind} ({}); it cannot be requeued: a new submission is required (the job may be deleted)",
        kind.explanation()
    )]
    UnrecoverableFailure {
        /// The job.
        item: Item,
        /// The kind of its failure.
        kind: FailureKind,
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
        Command::WithIds { ids, command } => {
            if ids.len() > MAX_GIVEN_IDS {
                return Err(Rejection::Invalid {
                    field: "ids".into(),
                    reason: format!("more than {MAX_GIVEN_IDS} ids"),
                });
            }
            let ids = Ids::Given(ids);
            match command.as_ref() {
                Command::SubmitBatch { uuid, submission } => {
                    batch::submit_batch(state, lc, &mut d, ids, uuid, submission)?
                }
                Command::AcquireBatch { bid, jobs } => {
                    batch::acquire_batch(state, lc, &mut d, ids, bid, jobs)?
                }
                Command::CreateJob { bid, spec } => {
                    batch::create_job(state, lc, &mut d, ids, bid, spec)?
                }
                _ => {
                    return Err(Rejection::Invalid {
                        field: "ids".into(),
                        reason: "only a submission, an acquisition or a new job takes ids".into(),
                    })
                }
            }
        }
        Command::SubmitBatch { uuid, submission } => {
            batch::submit_batch(state, lc, &mut d, Ids::Next, uuid, submission)?
        }
        Command::AcquireBatch { bid, jobs } => {
            batch::acquire_batch(state, lc, &mut d, Ids::Next, bid, jobs)?
        }
        Command::RejectBatch { bid, message } => {
            batch::reject_batch(state, lc, &mut d, bid, message)?
        }
        Command::OpenBatch { bid } => batch::open_batch(state, lc, &mut d, bid)?,
        Command::CreateJob { bid, spec } => {
            batch::create_job(state, lc, &mut d, Ids::Next, bid, spec)?
        }
        Command::StartJob { jid } => job::start_job(state, lc, &mut d, jid)?,
        Command::SetJobStatus {
            jid,
            target,
            message,
            priority,
        } => job::set_job_status(state, lc, &mut d, jid, target, message, priority)?,
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
            failure,
        } => {
            if *success && failure.is_some() {
                return Err(Rejection::Invalid {
                    field: "failure".into(),
                    reason: "a kind of failure is given only with a failed outcome".into(),
                });
            }
            // An armed fault turns the step's success into a failure that
            // names the admin and the reason, in the same append.
            let fault = state
                .faults
                .get(reported)
                .and_then(|armed| armed.first())
                .filter(|_| *success && state.jobs.contains_key(jid));
            let fault_message = fault.map(|f| f.message(*reported));
            if fault.is_some() {
                d.push(
                    state,
                    StreamId::System,
                    crate::event::FaultFired {
                        state: *reported,
                        jid: *jid,
                    },
                );
            }
            let (success, message) = match &fault_message {
                Some(m) => (&false, m.as_str()),
                None => (success, message.as_str()),
            };
            job::step_outcome(
                state,
                lc,
                &mut d,
                (jid, reported, success, message),
                job::Handoffs {
                    priority,
                    space_needed,
                    identifiers,
                    store,
                    inventory,
                    failure,
                },
            )?
        }
        Command::RecordSpace {
            jid,
            space_needed,
            priority,
        } => job::record_space(state, lc, &mut d, jid, space_needed, priority)?,
        Command::RecordIdentifiers { jid, identifiers } => {
            job::record_identifiers(state, lc, &mut d, jid, identifiers)?
        }
        Command::RecordStore { jid, store } => job::record_store(state, lc, &mut d, jid, store)?,
        Command::RecordInventory { jid, inventory } => {
            job::record_inventory(state, lc, &mut d, jid, inventory)?
        }
        Command::RecordStepRetry {
            jid,
            attempt,
            message,
        } => job::record_step_retry(state, lc, &mut d, jid, attempt, message)?,
        Command::RequeueJob { jid, reason } => job::requeue_job(state, lc, &mut d, jid, reason)?,
        Command::HoldJob { jid, reason } => job::hold_job(state, lc, &mut d, jid, reason)?,
        Command::ReleaseJob { jid, reason } => job::release_job(state, lc, &mut d, jid, reason)?,
        Command::ReleaseBatch { bid, reason } => {
            batch::release_batch(state, lc, &mut d, bid, reason)?
        }
        Command::HoldCollection { profile, reason } => {
            admin::hold_collection(state, lc, &mut d, profile, reason)?
        }
        Command::ReleaseCollection { profile, reason } => {
            admin::release_collection(state, lc, &mut d, profile, reason)?
        }
        Command::ReleaseHeldJobs { profile, reason } => {
            admin::release_held_jobs(state, lc, &mut d, profile, reason)?
        }
        Command::ArmFaults {
            state: step,
            count,
            reason,
        } => admin::arm_faults(state, &mut d, *step, *count, reason)?,
        Command::ClearFaults => admin::clear_faults(state, &mut d)?,
        Command::PauseQueue { reason } => admin::pause_queue(state, lc, &mut d, reason)?,
        Command::ResumeQueue { reason } => admin::resume_queue(state, lc, &mut d, reason)?,
        Command::UpdateReporting { bid, reason } => {
            batch::update_reporting(state, lc, &mut d, bid, reason)?
        }
        Command::DeleteJob { jid, reason } => job::delete_job(state, lc, &mut d, jid, reason)?,
        Command::DeleteBatch { bid, reason } => {
            batch::delete_batch(state, lc, &mut d, bid, reason)?
        }
        Command::ReportBatch {
            bid,
            notification_error,
        } => batch::report_batch(state, lc, &mut d, bid, notification_error)?,
        Command::RecordRepair { paths } => admin::record_repair(state, lc, &mut d, paths)?,
        Command::RecordConsistencyRepair {
            finding,
            rule,
            action,
            paths,
            reason,
        } => admin::record_consistency_repair(
            state,
            &mut d,
            crate::event::ConsistencyRepaired {
                finding: finding.clone(),
                rule: rule.clone(),
                action: action.clone(),
                paths: paths.clone(),
                reason: reason.clone(),
            },
        )?,
        Command::RecordForeignChange { stream, repaired } => {
            admin::record_foreign_change(state, &mut d, *stream, repaired.clone())?
        }
        Command::Cleanup { before } => admin::cleanup(state, lc, &mut d, before)?,
        Command::CleanupBatch { bid } => admin::cleanup_batch(state, lc, &mut d, bid)?,
        Command::RequestAccess {
            token,
            packaging,
            size_limit,
        } => access::request_access(state, lc, &mut d, token, *packaging, *size_limit)?,
        Command::StartAccess { qid } => access::start_access(state, lc, &mut d, qid)?,
        Command::AccessOutcome {
            qid,
            success,
            message,
            delivery,
        } => access::access_outcome(state, lc, &mut d, qid, *success, message, delivery.as_ref())?,
        Command::RequeueAccess { qid, reason } => {
            access::requeue_access(state, lc, &mut d, qid, reason)?
        }
        Command::DeleteAccess { qid, reason } => {
            access::delete_access(state, lc, &mut d, qid, reason)?
        }
        Command::PauseAccessQueue { queue, reason } => {
            access::pause_access_queue(state, lc, &mut d, *queue, reason)?
        }
        Command::ResumeAccessQueue { queue, reason } => {
            access::resume_access_queue(state, lc, &mut d, *queue, reason)?
        }
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{PayloadType, SubmissionMode};
    use crate::ids::{Bid, Jid};
    use std::collections::BTreeMap;

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

    fn field_of<T: fmt::Debug>(r: Result<T, Rejection>) -> String {
        match r {
            Err(Rejection::Invalid { field, .. }) => field,
            other => panic!("expected Invalid, got {other:?}"),
        }
    }

    // Issue 23: the projector's record of a foreign change goes on the
    // item's stream, or the system stream for an item the state does not
    // hold; it is bounded, and an empty one records nothing.
    #[test]
    fn foreign_changes_are_recorded_on_the_items_stream_and_bounded() {
        use crate::event::{ForeignChangeKind, ForeignChangeRepaired, ForeignNode};
        let (state, lc) = (State::new(), Lifecycle::builtin());
        let node = |found: &str| ForeignNode {
            kind: ForeignChangeKind::Changed,
            path: "/jobs/jid0000000001/status".into(),
            found: found.into(),
            zxid: 5,
            mtime: 6,
            session: 0,
        };
        let cmd = |nodes: Vec<ForeignNode>| Command::RecordForeignChange {
            stream: StreamId::Job(Jid(1)),
            repaired: ForeignChangeRepaired {
                item: "job jid0000000001".into(),
                nodes,
                reason: "a watch".into(),
            },
        };
        let d = decide(&state, &lc, &cmd(vec![node("{}")])).expect("recorded");
        assert_eq!(d.events.len(), 1);
        assert_eq!(
            d.events[0].stream,
            StreamId::System,
            "unknown job: system stream"
        );
        assert!(matches!(
            decide(&state, &lc, &cmd(vec![])),
            Err(Rejection::NoChange(_))
        ));
        let long = "x".repeat(crate::event::ForeignNode::MAX_FOUND_BYTES + 1);
        assert_eq!(
            field_of(decide(&state, &lc, &cmd(vec![node(&long)]))),
            "found"
        );
        let many = vec![node("{}"); MAX_FOREIGN_NODES + 1];
        assert_eq!(field_of(decide(&state, &lc, &cmd(many))), "nodes");
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

    /// A job of one file, with nothing else given.
    fn file_job() -> JobSpec {
        JobSpec {
            payload_url: "u".into(),
            payload_type: PayloadType::File,
            identifiers: Identifiers::default(),
            metadata: Erc::default(),
            digest: None,
            priority: None,
        }
    }

    /// Decides `cmd` on `state` and applies its events as records of
    /// `actor` from `position` on; the events.
    /// A state, its lifecycle and log position, with batch 1 of the demo
    /// profile submitted and acquired with `jobs` file jobs (jid 1 …).
    struct Fixture {
        lc: Lifecycle,
        state: State,
        position: u64,
    }

    impl Fixture {
        fn acquired(jobs: usize) -> Fixture {
            let mut f = Fixture {
                lc: Lifecycle::builtin(),
                state: State::new(),
                position: 0,
            };
            f.run(Command::SubmitBatch {
                uuid: Uuid::nil(),
                submission: submission("demo"),
            })
            .expect("submit");
            f.run(Command::AcquireBatch {
                bid: Bid(1),
                jobs: vec![file_job(); jobs],
            })
            .expect("acquire");
            f
        }

        /// Decides `cmd` and applies its events, as the engine does.
        fn run(&mut self, cmd: Command) -> Result<Vec<Event>, Rejection> {
            run_command(
                &mut self.state,
                &self.lc,
                cmd,
                &mut self.position,
                crate::event::Actor::engine(),
            )
        }
    }

    fn run_command(
        state: &mut State,
        lc: &Lifecycle,
        cmd: Command,
        position: &mut u64,
        actor: crate::event::Actor,
    ) -> Result<Vec<Event>, Rejection> {
        let d = decide(state, lc, &cmd)?;
        let mut prev = state.head_hash;
        for p in &d.events {
            *position += 1;
            let version = state.stream_version(p.stream) + 1;
            let r = crate::codec::Recorded {
                envelope: crate::codec::Envelope {
                    position: *position,
                    stream: p.stream,
                    version,
                    timestamp: chrono::Utc::now(),
                    actor: actor.clone(),
                    correlation_id: Uuid::nil(),
                    schema_version: crate::codec::SCHEMA_VERSION,
                    prev_hash: prev,
                    hash: [*position as u8; 32],
                },
                event: p.event.clone(),
            };
            prev = r.envelope.hash;
            state.apply(&r).expect("a decided event applies");
        }
        Ok(d.events.into_iter().map(|p| p.event).collect())
    }

    // Issue 23: with ids given (adoption mode: ZooKeeper's sequential
    // counters), a submission, an acquisition and a new job take them, in
    // order; a taken, zero or unordered id, or too few, is refused; and
    // the log's own allocation goes on after the highest.
    #[test]
    fn given_ids_are_taken_when_unused_and_refused_otherwise() {
        let mut f = Fixture::acquired(1);
        let given = |ids: Vec<u64>, command: Command| Command::WithIds {
            ids,
            command: Box::new(command),
        };
        let submit = |n: u128| Command::SubmitBatch {
            uuid: Uuid::from_u128(n),
            submission: submission("demo"),
        };
        let stream_of = |f: &Fixture| f.state.batches.keys().next_back().copied();
        f.run(given(vec![40], submit(1))).expect("bid 40");
        assert_eq!(stream_of(&f), Some(Bid(40)));
        assert_eq!(field_of(f.run(given(vec![40], submit(2)))), "ids");
        assert_eq!(field_of(f.run(given(vec![0], submit(2)))), "ids");
        assert_eq!(field_of(f.run(given(vec![], submit(2)))), "ids");
        // Below the highest, when unused (mrt-zk's batch of an earlier id).
        f.run(given(vec![7, 8], submit(3))).expect("bid 7");
        assert!(f.state.batches.contains_key(&Bid(7)));
        f.run(submit(4)).expect("the log's own");
        assert_eq!(stream_of(&f), Some(Bid(41)));

        let acquire = |bid: u64, n: usize| Command::AcquireBatch {
            bid: Bid(bid),
            jobs: vec![file_job(); n],
        };
        assert_eq!(field_of(f.run(given(vec![10], acquire(40, 2)))), "ids");
        assert_eq!(field_of(f.run(given(vec![11, 10], acquire(40, 2)))), "ids");
        // Job 1 exists (the fixture's).
        assert_eq!(field_of(f.run(given(vec![1, 10], acquire(40, 2)))), "ids");
        f.run(given(vec![10, 12, 13], acquire(40, 2)))
            .expect("acquired");
        assert_eq!(f.state.batches[&Bid(40)].jobs, vec![Jid(10), Jid(12)]);
        f.run(given(
            vec![20],
            Command::CreateJob {
                bid: Bid(40),
                spec: file_job(),
            },
        ))
        .expect("job 20");
        assert!(f.state.jobs.contains_key(&Jid(20)));
        assert_eq!(
            field_of(f.run(given(vec![21], Command::ClearFaults))),
            "ids"
        );
    }

    // Issue 23: a batch acquired by a Merritt batch consumer is Processing
    // with no jobs (they come one by one), not Failed as an empty
    // expansion is; Held when its collection is held; only from Pending.
    #[test]
    fn an_opened_batch_waits_for_its_jobs() {
        let mut f = Fixture::acquired(1);
        let submit = |n: u128| Command::SubmitBatch {
            uuid: Uuid::from_u128(n),
            submission: submission("demo"),
        };
        f.run(submit(1)).expect("batch 2");
        f.run(Command::OpenBatch { bid: Bid(2) }).expect("opened");
        let b = &f.state.batches[&Bid(2)];
        assert_eq!(
            (b.status, b.jobs.len()),
            (crate::lifecycle::BatchState::Processing, 0)
        );
        f.run(Command::CreateJob {
            bid: Bid(2),
            spec: file_job(),
        })
        .expect("a job");
        assert_eq!(f.state.batches[&Bid(2)].jobs.len(), 1);
        assert!(f.run(Command::OpenBatch { bid: Bid(2) }).is_err());
        f.run(Command::HoldCollection {
            profile: "demo".into(),
            reason: String::new(),
        })
        .expect("held");
        f.run(submit(2)).expect("batch 3");
        f.run(Command::OpenBatch { bid: Bid(3) }).expect("parked");
        assert_eq!(
            f.state.batches[&Bid(3)].status,
            crate::lifecycle::BatchState::Held
        );
    }

    // Armed faults are state: a success of their step is recorded as a
    // failure naming the admin, once per armed fault, then steps succeed
    // again; clearing disarms the rest.
    #[test]
    fn armed_faults_turn_successes_into_failures_from_the_state() {
        let lc = Lifecycle::builtin();
        let mut state = State::new();
        let mut position = 0;
        let engine = crate::event::Actor::engine;
        let submit = Command::SubmitBatch {
            uuid: Uuid::nil(),
            submission: submission("demo"),
        };
        run_command(&mut state, &lc, submit, &mut position, engine()).expect("submit");
        let spec = file_job();
        let acquire = Command::AcquireBatch {
            bid: Bid(1),
            jobs: vec![spec.clone(), spec],
        };
        run_command(&mut state, &lc, acquire, &mut position, engine()).expect("acquire");
        for jid in [Jid(1), Jid(2)] {
            run_command(
                &mut state,
                &lc,
                Command::StartJob { jid },
                &mut position,
                engine(),
            )
            .expect("start");
        }
        let arm = Command::ArmFaults {
            state: JobState::Estimating,
            count: 1,
            reason: "disk test".into(),
        };
        let carol = crate::event::Actor::admin("carol");
        run_command(&mut state, &lc, arm, &mut position, carol).expect("arm");
        assert_eq!(
            state.armed_faults(),
            BTreeMap::from([(JobState::Estimating, 1)])
        );
        let success = |jid| Command::StepOutcome {
            jid,
            state: JobState::Estimating,
            success: true,
            message: "fine".into(),
            priority: None,
            space_needed: None,
            identifiers: None,
            store: None,
            inventory: None,
            failure: None,
        };
        let events =
            run_command(&mut state, &lc, success(Jid(1)), &mut position, engine()).expect("report");
        assert_eq!(
            events.iter().map(Event::kind).collect::<Vec<_>>(),
            ["FaultFired", "JobStatusChanged"]
        );
        let j1 = &state.jobs[&Jid(1)];
        assert_eq!(j1.status, JobState::Failed);
        assert_eq!(
            j1.message,
            "fault injected into Estimating by admin:carol: disk test"
        );
        assert!(state.armed_faults().is_empty());
        run_command(&mut state, &lc, success(Jid(2)), &mut position, engine()).expect("report");
        assert_eq!(state.jobs[&Jid(2)].status, JobState::Provisioning);
        let err = run_command(
            &mut state,
            &lc,
            Command::ClearFaults,
            &mut position,
            engine(),
        )
        .expect_err("nothing to clear");
        assert!(matches!(err, Rejection::NoChange(_)), "{err:?}");
        let arm = Command::ArmFaults {
            state: JobState::Storing,
            count: 3,
            reason: "x".into(),
        };
        run_command(&mut state, &lc, arm, &mut position, engine()).expect("arm");
        let events = run_command(
            &mut state,
            &lc,
            Command::ClearFaults,
            &mut position,
            engine(),
        )
        .expect("clear");
        assert_eq!(
            events.iter().map(Event::kind).collect::<Vec<_>>(),
            ["FaultsCleared"]
        );
        assert!(state.armed_faults().is_empty());
        let too_many = Command::ArmFaults {
            state: JobState::Storing,
            count: MAX_FAULTS + 1,
            reason: "x".into(),
        };
        assert_eq!(field_of(decide(&state, &lc, &too_many)), "count");
    }

    // The rule "faults only on step states" is the domain's: a fault armed
    // on a state without a step would never fire (no report comes from it)
    // and stay armed until cleared, whoever sends the command.
    #[test]
    fn faults_are_armed_only_on_states_with_a_step() {
        let (state, lc) = (State::new(), Lifecycle::builtin());
        for step in <JobState as crate::lifecycle::StateKind>::ALL
            .iter()
            .copied()
        {
            let arm = Command::ArmFaults {
                state: step,
                count: 1,
                reason: "test".into(),
            };
            let decided = decide(&state, &lc, &arm);
            if step.has_step() {
                assert!(decided.is_ok(), "{step}: {decided:?}");
            } else {
                let Err(Rejection::Invalid { field, reason }) = decided else {
                    panic!("{step}: expected Invalid, got {decided:?}");
                };
                assert_eq!(field, "state");
                assert!(reason.contains("Recording or Notify"), "{reason}");
            }
        }
        assert_eq!(
            <JobState as crate::lifecycle::StateKind>::ALL
                .iter()
                .filter(|s| s.has_step())
                .count(),
            7,
            "Pending only starts jobs; the six others are not steps"
        );
    }

    // A worker's outcome is one atomic decision; a report on a state the job
    // left is stale.
    #[test]
    fn a_step_outcome_records_its_data_and_the_move_together() {
        let mut f = Fixture::acquired(1);
        f.run(Command::StartJob { jid: Jid(1) }).unwrap();
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
            failure: None,
        };
        let events = f.run(outcome(JobState::Estimating)).unwrap();
        assert_eq!(
            events.iter().map(Event::kind).collect::<Vec<_>>(),
            ["JobSpaceEstimated", "JobStatusChanged"]
        );
        let j = &f.state.jobs[&Jid(1)];
        assert_eq!(
            (j.status, j.space_needed, j.priority),
            (JobState::Provisioning, 4096, 12)
        );
        // The same report again is stale: the job has moved on.
        let err = f.run(outcome(JobState::Estimating)).unwrap_err();
        assert!(matches!(err, Rejection::StaleReport { .. }), "{err:?}");
        assert_eq!(err.to_string(), "job jid0000000001 is Provisioning, not Estimating: the report is stale and was discarded");

        // A report restating what the job has appends only the move (the
        // ark was recorded when it was minted; the size did not change).
        let ark = Identifiers {
            primary_id: Some("ark:/99999/fk4x".into()),
            local_ids: vec!["l".into()],
        };
        f.run(Command::RecordIdentifiers {
            jid: Jid(1),
            identifiers: ark.clone(),
        })
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
            failure: None,
        };
        let events = f.run(restate).unwrap();
        assert_eq!(
            events.iter().map(Event::kind).collect::<Vec<_>>(),
            ["JobStatusChanged"]
        );
    }

    // The transitions document: a payload whose digest does not match the
    // depositor's fails the job with no recovery. The kind is its own record
    // after the move; every requeue of the job is refused and appends
    // nothing; delete stays open; an ordinary failure still requeues.
    #[test]
    fn a_digest_mismatch_fails_the_job_for_good() {
        let mut f = Fixture::acquired(2);
        let report = |jid, reported, success, failure| {
            Command::outcome(jid, reported, success, "sha256 mismatch", failure)
        };
        for jid in [Jid(1), Jid(2)] {
            f.run(Command::StartJob { jid }).unwrap();
            f.run(report(jid, JobState::Estimating, true, None))
                .unwrap();
            f.run(report(jid, JobState::Provisioning, true, None))
                .unwrap();
        }
        // A kind with a success is refused.
        let err = f
            .run(report(
                Jid(1),
                JobState::Downloading,
                true,
                Some(FailureKind::DigestMismatch),
            ))
            .unwrap_err();
        assert!(
            matches!(&err, Rejection::Invalid { field, .. } if field == "failure"),
            "{err:?}"
        );
        assert_eq!(f.state.jobs[&Jid(1)].status, JobState::Downloading);

        let events = f
            .run(report(
                Jid(1),
                JobState::Downloading,
                false,
                Some(FailureKind::DigestMismatch),
            ))
            .unwrap();
        assert_eq!(
            events.iter().map(Event::kind).collect::<Vec<_>>(),
            ["JobStatusChanged", "JobFailureClassified"]
        );
        let j = &f.state.jobs[&Jid(1)];
        assert_eq!(
            (j.status, j.failure, j.failed_in),
            (
                JobState::Failed,
                Some(FailureKind::DigestMismatch),
                Some(JobState::Downloading)
            )
        );

        // Refused: the requeue, and a forced move out of Failed.
        let before = f.state.clone();
        let requeue = Command::RequeueJob {
            jid: Jid(1),
            reason: "try again".into(),
        };
        let err = decide(&f.state, &f.lc, &requeue).unwrap_err();
        assert_eq!(
            err,
            Rejection::UnrecoverableFailure {
                item: Item::Job(Jid(1)),
                kind: FailureKind::DigestMismatch
            }
        );
        assert_eq!(
            err.to_string(),
            "job jid0000000001 failed with digest_mismatch (the payload's digest does not \
             match the digest the depositor supplied); it cannot be requeued: a new \
             submission is required (the job may be deleted)"
        );
        let forced = Command::SetJobStatus {
            jid: Jid(1),
            target: Target::To(JobState::Downloading),
            message: String::new(),
            priority: None,
        };
        let start = Command::StartJob { jid: Jid(1) };
        assert!(matches!(
            decide(&f.state, &f.lc, &start),
            Err(Rejection::IllegalTransition { .. })
        ));
        let err = decide(&f.state, &f.lc, &forced).unwrap_err();
        let Rejection::IllegalTransition { allowed, .. } = &err else {
            panic!("{err:?}");
        };
        assert_eq!(
            allowed,
            &["Deleted (it failed with digest_mismatch: it cannot be requeued: a new submission is required)"]
        );
        assert_eq!(f.state, before, "a refusal changes nothing");

        // An ordinary failure of the other job still requeues.
        let events = f
            .run(report(Jid(2), JobState::Downloading, false, None))
            .unwrap();
        assert_eq!(
            events.iter().map(Event::kind).collect::<Vec<_>>(),
            ["JobStatusChanged", "BatchReportingStarted"]
        );
        assert_eq!(f.state.jobs[&Jid(2)].failure, None);

        // The batch is reported with the job failed, and the requeue stays
        // refused after the report.
        let events = f
            .run(Command::ReportBatch {
                bid: Bid(1),
                notification_error: None,
            })
            .unwrap();
        let Event::BatchReported(reported) = &events[0] else {
            panic!("{events:?}");
        };
        assert_eq!(reported.failed_jobs, [Jid(1), Jid(2)]);
        let Event::BatchFailed(failed) = &events[1] else {
            panic!("{events:?}");
        };
        assert_eq!(
            failed.message,
            "2 of 2 job(s) failed; 1 of them (jid0000000001) cannot be requeued: a new submission is required"
        );
        assert!(matches!(
            decide(&f.state, &f.lc, &requeue),
            Err(Rejection::UnrecoverableFailure { .. })
        ));
        let requeue_other = Command::RequeueJob {
            jid: Jid(2),
            reason: "server fixed".into(),
        };
        f.run(requeue_other).unwrap();
        assert_eq!(f.state.jobs[&Jid(2)].status, JobState::Downloading);
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

    fn access_token() -> AccessToken {
        AccessToken {
            token: "t".into(),
            ark: "ark:/1/2".into(),
            version: 0,
            format: "zip".into(),
            size: 1,
            delivery_node: 9501,
        }
    }

    /// A request left in Processing by a worker that died (its ephemeral
    /// lock gone with its session) is not stuck: the next lock holder starts
    /// it again, and an admin may requeue or delete it. Before, all three
    /// were refused and the request stayed in Processing for good.
    #[test]
    fn an_access_request_left_in_processing_is_taken_again_requeued_or_deleted() {
        use crate::ids::Qid;
        use crate::lifecycle::AccessState;
        let lc = Lifecycle::builtin();
        let mut processing = (State::new(), 0);
        // Each branch below continues from the same state, so each keeps
        // its own log position.
        let run = |(state, position): &mut (State, u64), cmd: Command| {
            run_command(state, &lc, cmd, position, crate::event::Actor::engine())
        };
        run(
            &mut processing,
            Command::RequestAccess {
                token: access_token(),
                packaging: Default::default(),
                size_limit: AccessQueue::DEFAULT_SIZE_LIMIT,
            },
        )
        .expect("request");
        let qid = Qid(1);
        run(&mut processing, Command::StartAccess { qid }).expect("start");

        let mut retaken = processing.clone();
        run(&mut retaken, Command::StartAccess { qid }).expect("taken again");
        let a = &retaken.0.access[&qid];
        assert_eq!(a.status, AccessState::Processing);
        assert!(a.message.contains("taken again"), "{}", a.message);
        run(
            &mut retaken,
            Command::AccessOutcome {
                qid,
                success: true,
                message: String::new(),
                delivery: None,
            },
        )
        .expect("outcome");
        assert_eq!(retaken.0.access[&qid].status, AccessState::Completed);

        let mut requeued = processing.clone();
        let reason = "its worker died".to_string();
        run(
            &mut requeued,
            Command::RequeueAccess {
                qid,
                reason: reason.clone(),
            },
        )
        .expect("requeue");
        assert_eq!(requeued.0.access[&qid].status, AccessState::Pending);
        assert_eq!(requeued.0.access[&qid].retry_count, 1);

        let mut deleted = processing;
        run(&mut deleted, Command::DeleteAccess { qid, reason }).expect("delete");
        assert_eq!(deleted.0.access[&qid].status, AccessState::Deleted);
    }

    /// A request carries its packaging from the request to the state, and a
    /// successful outcome its delivery (refused on a failure).
    #[test]
    fn an_access_request_keeps_its_packaging_and_its_delivery() {
        use crate::event::{AccessContent, AccessDelivery, AccessPackaging};
        use crate::ids::Qid;
        use crate::lifecycle::AccessState;
        let lc = Lifecycle::builtin();
        let mut s = (State::new(), 0);
        let run = |(state, position): &mut (State, u64), cmd: Command| {
            run_command(state, &lc, cmd, position, crate::event::Actor::engine())
        };
        let packaging = AccessPackaging {
            content: AccessContent::Full,
            bag: true,
        };
        run(
            &mut s,
            Command::RequestAccess {
                token: access_token(),
                packaging,
                size_limit: AccessQueue::DEFAULT_SIZE_LIMIT,
            },
        )
        .expect("request");
        let qid = Qid(1);
        assert_eq!(s.0.access[&qid].packaging, packaging);
        run(&mut s, Command::StartAccess { qid }).expect("start");
        let at = chrono::DateTime::from_timestamp(1_800_000_000, 0).expect("a time");
        let delivery = AccessDelivery {
            url: "http://x/deliveries/n".into(),
            size: 3,
            sha256: "ab".into(),
            target: "primary".into(),
            version: 1,
            ready: at,
            expires: at,
        };
        let outcome = |success: bool| Command::AccessOutcome {
            qid,
            success,
            message: String::new(),
            delivery: Some(delivery.clone()),
        };
        let refused = run(&mut s.clone(), outcome(false)).expect_err("no delivery of a failure");
        assert!(matches!(refused, Rejection::Invalid { .. }), "{refused:?}");
        run(&mut s, outcome(true)).expect("delivered");
        assert_eq!(s.0.access[&qid].status, AccessState::Completed);
        assert_eq!(s.0.access[&qid].delivery.as_ref(), Some(&delivery));
    }
}
