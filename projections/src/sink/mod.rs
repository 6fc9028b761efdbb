//! The live ZooKeeper sink: applies the projector's operations to ZooKeeper,
//! many events per `multi` transaction, exactly once.
//!
//! ## The loop
//! 1. **Session.** Connect (with a deadline) under the configured root,
//!    creating the root when missing. Each call afterwards has a deadline too.
//! 2. **Leadership.** Create the ephemeral `/ingest-engine/leader` with this
//!    projector's identity. If another session holds it, **stand by**: never
//!    write, watch the node, re-check every `standby_recheck`, and keep the
//!    lag figures current from the leader's checkpoint.
//! 3. **Init.** As leader, create the base nodes (`Projector::init`) that are
//!    missing, skipping those that exist (a tree made by Merritt's
//!    `initNodes` is accepted), and `/ingest-engine/checkpoint` at position 0
//!    when missing.
//! 4. **Resume.** Read the checkpoint (after a `sync`) and bring the
//!    in-memory projector to it by projecting the log up to its position,
//!    writing nothing. The checkpoint's hash must be the hash of the log's
//!    record at that position, else the tree belongs to another log and the
//!    sink stops ([`SinkError::ForeignTree`]). A checkpoint past the log's
//!    durable head stops it too ([`SinkError::CheckpointAhead`]).
//! 5. **Project.** Read records up to the log's *durable* position only,
//!    project them, and cut the queue of operations into transactions
//!    ([`crate::txn::plan_transaction`]: whole events grouped by
//!    [`crate::batches_by_size`] under a byte cap and an operation cap; an
//!    event too large for one transaction is cut at its split points, with
//!    the checkpoint recording how many parts are applied; a part that still
//!    does not fit stops the sink with [`SinkError::Oversized`], naming the
//!    event). Each transaction's **first** operation sets the checkpoint to
//!    the position it reaches, with the version read at resume (or computed
//!    after our last write) as the expected version. Then follow the live
//!    tail through [`Log::subscribe`].
//!
//! ## Why the effect is exactly once
//! The checkpoint write and the event's operations commit together or not at
//! all (one `multi`), so the tree always holds exactly the prefix of the log
//! its checkpoint names. The expected version makes the checkpoint a
//! compare-and-set: a transaction planned from a stale checkpoint fails with
//! `BadVersion` before any of its operations is applied (the checkpoint
//! operation is first, so it is the one that fails, not a `NodeExists`
//! further down).
//!
//! ## Fencing
//! Leadership keeps a second projector from even trying to write. It is not
//! enough on its own: a leader whose session expires loses the node while a
//! transaction of its may still be queued in the client, and a successor may
//! take over at once. The version check closes that gap: whoever writes the
//! checkpoint first wins, the other's transaction fails whole with
//! `BadVersion`. On `BadVersion` the sink re-reads leadership and the
//! checkpoint; if someone else leads it stands by, else it brings its model
//! to the checkpoint it read (both projectors run the same deterministic
//! projector over the same log, so a checkpoint written by either means the
//! same tree) and goes on. Rebuild and repair take the same leadership and
//! bump the same version, so a projector can never interleave with them.
//!
//! ## Unknown outcomes
//! A `multi` that times out, or whose connection is lost before the answer,
//! may or may not have been applied (the client may even send a queued
//! request after the deadline). The sink never sends it again blindly: it
//! re-reads the checkpoint (after a `sync`) and compares it with the one
//! the transaction would have written. Landed: drop the applied events and
//! go on. Not landed: plan again from the checkpoint read. Should the old
//! request still land afterwards, the version check makes the new one fail
//! with `BadVersion`, which re-reads again: never a double apply.
//!
//! ## ZooKeeper away
//! The sink only reads the log, so the engine keeps accepting commands while
//! ZooKeeper is unreachable. Connection loss and timeouts are retried with a
//! capped exponential backoff on the same session (the client reconnects on
//! its own); an expired or closed session is replaced by a new one, which
//! takes leadership again and re-reads the checkpoint. A leader node left by
//! an earlier session of the same sink instance is taken over at once.
//!
//! ## Worker locks
//! `/jobs/JID/lock` and `/batches/BID/lock` are ephemeral nodes of worker
//! sessions and are never projected. Cleanup deletes the nodes of finished
//! (Completed or Deleted) batches and their jobs; if one of them still has a
//! lock (a worker that died and whose session has not expired yet), the
//! `multi` fails with `NotEmpty` and applies nothing. The sink then checks
//! that the only remaining child is `lock` and sends the transaction again
//! with the lock deleted just before its parent. That is deliberate: the job
//! is finished, so no step outcome can be accepted for it any more, and
//! waiting for the dead session to expire would stall every projection
//! behind it. Any other child is drift ([`SinkError::Drift`]).
//!
//! ## Nodes another client changed
//! A transaction that fails on a node of one item (a job, a batch, an
//! access request, a pause or hold lock) because another ZooKeeper client
//! deleted, changed or added it does not stop the sink: the item's nodes
//! are converged back to the applied checkpoint's view in a fenced
//! transaction of their own, the repair is recorded through
//! [`SinkConfig::foreign`], and the transaction is planned again. The pause
//! and hold locks are watched and reverted as soon as they change. A failure
//! on a node of no item (a base node) is still [`SinkError::Drift`], and so
//! is every such failure of a sink without a recorder (`ingest project`).
//! See `foreign.rs`.
//!
//! ## Lag
//! [`Sink::status`] returns a [`tokio::sync::watch`] of [`SinkStatus`]:
//! the checkpoint, the durable head, events behind, seconds behind (the age
//! of the oldest unprojected event, from the events' own timestamps) and the
//! state (connected, disconnected, standing by, stopped).
//!
//! ## Shutdown
//! [`Sink::run`] takes a `CancellationToken`; once it is cancelled the sink stops between
//! transactions: a transaction in flight is finished (its answer awaited)
//! first.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use ingest_events::log::{Log, LogError};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use zookeeper_client as zk;

use crate::checkpoint::{Checkpoint, CHECKPOINT_NODE};
use crate::projector::ProjectError;
use crate::txn::{self, Oversized, TxnLimits};
use crate::zk::{call, ZkConfig, ZkError};

mod adopt;
mod adopt_access;
mod adopt_delete;
mod adoption;
mod converge;
mod foreign;
mod item;
mod model;
mod project;
mod runner;
mod work;

pub use adoption::{
    AdoptForeign, Adoption, AdoptionFuture, Deleted, ForeignAccessStatus, ForeignAdopter,
    ForeignBatch, ForeignBatchStatus, ForeignDelete, ForeignJob, ForeignLock, ForeignStatus,
    LockChange, WrittenStatus,
};
pub use foreign::{ForeignRecorder, RecordForeign};
pub use work::{ConvergeError, ConvergeScope, Converged, Converger};

use model::Model;
use runner::{Backoff, Counters, Runner};

/// How the sink runs.
#[derive(Debug, Clone)]
pub struct SinkConfig {
    /// The server and the root.
    pub zk: ZkConfig,
    /// Who this projector is (host, data directory, …): written to the
    /// leader node, with a per-instance suffix added by the sink.
    pub identity: String,
    /// Caps of each transaction.
    pub limits: TxnLimits,
    /// The first retry delay after a failure.
    pub backoff_initial: Duration,
    /// The longest retry delay.
    pub backoff_max: Duration,
    /// How often a projector standing by re-checks the leader node (it also
    /// watches it).
    pub standby_recheck: Duration,
    /// Lets a reader of the live tree hold the sink between transactions.
    pub gate: ProjectorGate,
    /// Finishes a rebuild that died half-way when this sink leads (`None`:
    /// the sink stops with [`SinkError::RebuildInterrupted`] instead).
    pub resume: Option<Resumer>,
    /// Records the items whose nodes another client changed and the sink
    /// converged back. `None`: no repair is made (nothing could record it);
    /// such a change stops the sink with [`SinkError::Drift`], as it did
    /// before repairs existed (`ingest project`).
    pub foreign: Option<ForeignRecorder>,
    /// Adoption mode: a job status another client writes is offered to the
    /// engine through it (needs [`SinkConfig::foreign`] too); `None`: it is
    /// reverted when found.
    pub adopt: Option<ForeignAdopter>,
    /// Requests to converge items of the live tree to the log while the
    /// sink runs (drift repair, upgrades); needs [`SinkConfig::foreign`]
    /// to record them. `None`: none are taken.
    pub converge: Option<Converger>,
}

/// Finishes an interrupted rebuild with a session that holds leadership;
/// implemented by `rebuild::Resume` (the sink does not depend on rebuild).
pub trait ResumeRebuild: Send + Sync {
    /// Converges the tree to the log and clears the rebuild marker.
    fn resume<'a>(
        &'a self,
        client: &'a zk::Client,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), SinkError>> + Send + 'a>>;
}

/// A shared [`ResumeRebuild`].
#[derive(Clone)]
pub struct Resumer(pub Arc<dyn ResumeRebuild>);

impl std::fmt::Debug for Resumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Resumer")
    }
}

/// Holds a projector between two transactions, so that a reader (`GET
/// /diff`) sees the tree and its checkpoint at one position while the
/// projector runs. The sink takes the gate's shared side around each
/// transaction; [`ProjectorGate::hold`] waits for the transaction in flight
/// and keeps the next one from starting until the guard is dropped.
#[derive(Debug, Clone, Default)]
pub struct ProjectorGate {
    lock: Arc<tokio::sync::RwLock<()>>,
    /// Since when a holder has had the gate (`/readyz` reports a long hold).
    held_since: Arc<std::sync::Mutex<Option<std::time::Instant>>>,
}

/// The projector held by [`ProjectorGate::hold`]: it goes on when this is
/// dropped.
#[derive(Debug)]
pub struct GateGuard {
    _write: tokio::sync::OwnedRwLockWriteGuard<()>,
    held_since: Arc<std::sync::Mutex<Option<std::time::Instant>>>,
}

impl Drop for GateGuard {
    fn drop(&mut self) {
        *self
            .held_since
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
    }
}

impl ProjectorGate {
    /// A gate nobody holds.
    pub fn new() -> ProjectorGate {
        ProjectorGate::default()
    }

    /// Holds the projector until the guard is dropped.
    pub async fn hold(&self) -> GateGuard {
        let write = Arc::clone(&self.lock).write_owned().await;
        *self
            .held_since
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(std::time::Instant::now());
        GateGuard {
            _write: write,
            held_since: Arc::clone(&self.held_since),
        }
    }

    /// How long the projector has been held, when it is.
    pub fn held_for(&self) -> Option<Duration> {
        self.held_since
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .map(|t| t.elapsed())
    }
}

impl SinkConfig {
    /// Default caps and delays for `zk` and `identity`.
    pub fn new(zk: ZkConfig, identity: impl Into<String>) -> SinkConfig {
        SinkConfig {
            zk,
            identity: identity.into(),
            limits: TxnLimits::default(),
            backoff_initial: Duration::from_millis(100),
            backoff_max: Duration::from_secs(5),
            standby_recheck: Duration::from_secs(1),
            gate: ProjectorGate::new(),
            resume: None,
            foreign: None,
            adopt: None,
            converge: None,
        }
    }
}

/// How long [`Sink::run`] goes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunMode {
    /// Until the checkpoint reaches the durable position the log had when
    /// the run started (applied by this sink or, if it stands by, by the
    /// leader).
    CatchUp,
    /// Until the shutdown future completes.
    Follow,
}

/// What the sink is doing.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SinkState {
    /// Not connected yet.
    Starting,
    /// Holds leadership and projects (or waits for new events).
    Connected,
    /// ZooKeeper is unreachable or the session was lost; retrying.
    Disconnected,
    /// Another projector holds leadership; this one does not write.
    Standby {
        /// The leader's identity.
        leader: String,
    },
    /// The run ended: cleanly (`None`) or on an error that needs an operator.
    Stopped(Option<String>),
    /// Leads and is finishing a rebuild that died half-way (the tree is
    /// incomplete and the queue paused until it is done).
    Rebuilding {
        /// What the rebuild marker says.
        marker: String,
    },
}

/// The sink's figures, published on every change.
#[derive(Debug, Clone, PartialEq)]
pub struct SinkStatus {
    /// What the sink is doing.
    pub state: SinkState,
    /// The position the live tree holds (as far as this sink knows).
    pub checkpoint: u64,
    /// The log's durable position.
    pub durable: u64,
    /// Durable events not in the tree yet.
    pub events_behind: u64,
    /// The age of the oldest durable event not in the tree yet, in seconds,
    /// when the status was published (0 when caught up).
    pub seconds_behind: f64,
    /// The timestamp of that event, to compute the age at any later time.
    pub oldest_unprojected: Option<DateTime<Utc>>,
    /// Transactions this sink committed.
    pub transactions: u64,
    /// Events this sink applied.
    pub events_applied: u64,
    /// Node operations this sink applied.
    pub ops_applied: u64,
    /// Transactions refused because the checkpoint had moved (`BadVersion`).
    pub conflicts: u64,
    /// Items converged so far and in all, while a convergence request is
    /// worked through (see [`Converger`]).
    pub converging: Option<(usize, usize)>,
}

impl SinkStatus {
    fn new() -> SinkStatus {
        SinkStatus {
            state: SinkState::Starting,
            checkpoint: 0,
            durable: 0,
            events_behind: 0,
            seconds_behind: 0.0,
            oldest_unprojected: None,
            transactions: 0,
            events_applied: 0,
            ops_applied: 0,
            conflicts: 0,
            converging: None,
        }
    }

    /// Seconds behind at `now`.
    pub fn seconds_behind_at(&self, now: DateTime<Utc>) -> f64 {
        self.oldest_unprojected
            .map(|t| ((now - t).num_milliseconds() as f64 / 1000.0).max(0.0))
            .unwrap_or(0.0)
    }
}

/// What a run did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SinkReport {
    /// The checkpoint the tree holds at the end.
    pub checkpoint: Checkpoint,
    /// Events this sink applied.
    pub events_applied: u64,
    /// Node operations this sink applied.
    pub ops_applied: u64,
    /// Transactions this sink committed.
    pub transactions: u64,
    /// Transactions refused because the checkpoint had moved.
    pub conflicts: u64,
}

/// What the refusals of a tree that is not this log's say to do.
pub const FORCE_ADVICE: &str = "if this data directory's log is the one the tree should show (a tampered or foreign checkpoint), `ingest rebuild --force` shows what it would change and, once confirmed, re-takes the tree and records it";

/// Why the sink, a rebuild or a diff stopped.
///
/// The sink itself retries every ZooKeeper I/O problem (backoff, new
/// session); it returns only the errors that need an operator. Rebuild, diff
/// and repair, which run once, also return [`SinkError::Zk`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SinkError {
    /// The settings are invalid.
    ///
    /// ### Handling
    /// Fix the configuration; nothing was done.
    #[error("invalid ZooKeeper settings: {0}")]
    Config(String),
    /// An event is too large for a transaction even when cut between jobs.
    ///
    /// ### Handling
    /// Logical, not retryable: the tree holds everything before the event.
    /// Raise the caps (under the server's `jute.maxbuffer`) or find out why
    /// the event is so large.
    #[error("the event at position {position} ({kind}) is too large for one ZooKeeper transaction, even cut between jobs")]
    Oversized {
        /// The event's position.
        position: u64,
        /// Its kind.
        kind: &'static str,
        /// The sizes.
        #[source]
        source: Oversized,
    },
    /// The checkpoint's hash is not the log's hash at that position.
    ///
    /// ### Handling
    /// Logical: the tree was projected from another log. Point the sink at
    /// the right root, or rebuild the root from this log (`--force`).
    #[error("the tree under {root} was projected from another log: its checkpoint says record {position} hashes to {tree_hash}, this log's record {position} hashes to {log_hash}; {FORCE_ADVICE}")]
    ForeignTree {
        /// The root.
        root: String,
        /// The checkpoint position.
        position: u64,
        /// The checkpoint's hash (hex).
        tree_hash: String,
        /// The log's hash at that position (hex).
        log_hash: String,
    },
    /// The checkpoint is past the log's durable head.
    ///
    /// ### Handling
    /// Logical: the tree was projected from a longer log (another engine's,
    /// or this log lost its tail). Check the data directory; rebuild with
    /// `--force` to make the tree match this log.
    #[error("the tree under {root} holds the log up to position {position}, but this log is durable only up to {durable}: it was projected from a longer log; {FORCE_ADVICE}")]
    CheckpointAhead {
        /// The root.
        root: String,
        /// The checkpoint position.
        position: u64,
        /// The log's durable position.
        durable: u64,
    },
    /// The checkpoint node does not hold a checkpoint.
    ///
    /// ### Handling
    /// Logical: something else wrote it. Rebuild (`--force`).
    #[error("{root}{CHECKPOINT_NODE} holds {data:?}, which is not a checkpoint: {reason}; {FORCE_ADVICE}")]
    BadCheckpoint {
        /// The root.
        root: String,
        /// The data, as text.
        data: String,
        /// What is wrong.
        reason: String,
    },
    /// A rebuild started with `--force` did not finish, and this one (a
    /// plain `rebuild`, or a projector finishing it) is not forced.
    ///
    /// ### Handling
    /// An admin runs `ingest rebuild --force`, which shows what it changes,
    /// asks and records the take-over; nothing was changed.
    #[error("the tree under {root} is incomplete: {marker} did not finish; only `ingest rebuild --force` finishes it (it shows what it changes, asks, and records it)")]
    ForcedRebuildUnfinished {
        /// The root.
        root: String,
        /// What the marker says.
        marker: String,
    },
    /// A rebuild or repair marked the checkpoint and did not finish.
    ///
    /// ### Handling
    /// Run `ingest rebuild` again; the projector refuses to write on a
    /// half-repaired tree.
    #[error("the tree under {root} is incomplete: {by} did not finish; run `ingest rebuild` (or start `ingest serve`) to finish it")]
    RebuildInterrupted {
        /// The root.
        root: String,
        /// Who marked it.
        by: String,
    },
    /// A transaction failed on a node the log says exists (or does not),
    /// and the sink could not converge it: the node belongs to no item (a
    /// base node), the item kept changing through eight
    /// repairs, or the sink has no recorder ([`SinkConfig::foreign`]).
    ///
    /// ### Handling
    /// Logical, not retryable: the live tree drifted from the log (someone
    /// else wrote it). Nothing of the transaction was applied. Run
    /// `ingest diff`, then `ingest diff --repair` or `ingest rebuild`.
    #[error("the live tree under {root} does not match the log: `{op}` failed ({error}) in the transaction for positions {first}..={last}; run `ingest diff`, then `ingest diff --repair` or `ingest rebuild`")]
    Drift {
        /// The root.
        root: String,
        /// The first position of the transaction.
        first: u64,
        /// The last position of the transaction.
        last: u64,
        /// The refused operation.
        op: String,
        /// ZooKeeper's answer.
        error: String,
    },
    /// Another projector holds leadership (rebuild and repair only).
    ///
    /// ### Handling
    /// Stop the other projector (or wait for its session to expire) and try
    /// again.
    #[error("another projector holds leadership of {root} ({holder}); stop it, or wait for its session to expire, and try again")]
    NotLeader {
        /// The root.
        root: String,
        /// The holder's identity.
        holder: String,
    },
    /// The checkpoint changed while a rebuild or repair held leadership.
    ///
    /// ### Handling
    /// Someone wrote despite the leader node; find the other writer. The
    /// checkpoint still says a rebuild is under way, so projectors refuse to
    /// write until `ingest rebuild` finishes.
    #[error("the checkpoint of {root} changed during the {what}: another writer ignored the leader node; nothing further was written")]
    Fenced {
        /// The root.
        root: String,
        /// `rebuild` or `repair`.
        what: &'static str,
    },
    /// The tree kept differing after several rounds of repair.
    ///
    /// ### Handling
    /// Something keeps writing the tree; find it, then run the command again.
    #[error("the tree under {root} still differs from the log after {rounds} rounds ({remaining} node(s)); something else keeps writing it")]
    NotConverged {
        /// The root.
        root: String,
        /// Rounds done.
        rounds: usize,
        /// Differences left.
        remaining: usize,
    },
    /// The checkpoint kept moving while the tree was read for a diff.
    ///
    /// ### Handling
    /// A projector is applying events; retry when it is idle.
    #[error("the checkpoint of {root} kept moving while the tree was read; retry when the projector is idle")]
    Busy {
        /// The root.
        root: String,
    },
    /// ZooKeeper could not be used (rebuild, diff and repair only).
    ///
    /// ### Handling
    /// I/O or unknown outcome: retry the command; its writes are
    /// version-checked and converge, so retrying is safe.
    #[error(transparent)]
    Zk(#[from] ZkError),
    /// The log could not be read.
    ///
    /// ### Handling
    /// I/O or corruption: run `ingest verify`.
    #[error("reading the event log: {0}")]
    Log(#[from] LogError),
    /// The projector refused a record.
    ///
    /// ### Handling
    /// A log that breaks its own rules or a projector defect: run
    /// `ingest verify`; never skip the record.
    #[error(transparent)]
    Project(#[from] ProjectError),
}

/// The live sink over one log and one root. See the module docs.
pub struct Sink {
    log: Arc<Log>,
    config: SinkConfig,
    identity: String,
    status: watch::Sender<SinkStatus>,
}

static INSTANCES: AtomicU64 = AtomicU64::new(0);

/// A unique suffix for this projector instance: process, time, counter.
pub(crate) fn instance_tag() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!(
        "pid {} #{}-{:x}",
        std::process::id(),
        INSTANCES.fetch_add(1, Ordering::Relaxed),
        nanos & 0xffff_ffff
    )
}

impl Sink {
    /// A sink reading `log` and writing under `config.zk.root`.
    ///
    /// # Errors
    /// [`SinkError::Config`] for an invalid connect string, root or caps.
    pub fn new(log: Arc<Log>, config: SinkConfig) -> Result<Sink, SinkError> {
        config
            .zk
            .validate()
            .map_err(|e| SinkError::Config(e.to_string()))?;
        if config.limits.max_bytes <= txn::RESERVED_BYTES + crate::ops::TRANSACTION_OVERHEAD
            || config.limits.max_ops <= txn::RESERVED_OPS
        {
            return Err(SinkError::Config(format!(
                "the transaction caps ({} bytes, {} operations) leave no room for events (the sink keeps {} bytes and {} operations for itself)",
                config.limits.max_bytes,
                config.limits.max_ops,
                txn::RESERVED_BYTES + crate::ops::TRANSACTION_OVERHEAD,
                txn::RESERVED_OPS
            )));
        }
        let identity = format!("{} ({})", config.identity, instance_tag());
        let mut status = SinkStatus::new();
        status.durable = log.durable_position();
        Ok(Sink {
            log,
            config,
            identity,
            status: watch::channel(status).0,
        })
    }

    /// The live figures; cheap to clone and poll.
    pub fn status(&self) -> watch::Receiver<SinkStatus> {
        self.status.subscribe()
    }

    /// The identity written to the leader node.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// Runs until `mode` is satisfied or `shutdown` is cancelled (then
    /// between transactions), retrying every ZooKeeper problem.
    ///
    /// # Errors
    /// Only errors that need an operator (see [`SinkError`]); the status then
    /// says [`SinkState::Stopped`] with the message.
    pub async fn run(
        self,
        mode: RunMode,
        shutdown: CancellationToken,
    ) -> Result<SinkReport, SinkError> {
        let target = self.log.durable_position();
        let mut runner = Runner {
            durable: self.log.subscribe(),
            log: self.log,
            cfg: self.config,
            identity: self.identity,
            status: self.status,
            shutdown,
            mode,
            target,
            model: Model::new(),
            seen_checkpoint: None,
            backoff: Backoff::default(),
            counters: Counters::default(),
            conflict_streak: 0,
            repair_streak: Default::default(),
            adopted: Default::default(),
            adopted_batches: Default::default(),
            adopted_access: Default::default(),
            deferred_jobs: Default::default(),
            deleting_batches: Default::default(),
            redo: Vec::new(),
            adopted_locks: Default::default(),
            ever_connected: false,
            converging: None,
        };
        runner.backoff = Backoff::new(runner.cfg.backoff_initial, runner.cfg.backoff_max);
        let result = runner.main().await;
        let stopped = match &result {
            Ok(_) => SinkState::Stopped(None),
            Err(e) => SinkState::Stopped(Some(error_chain(e))),
        };
        runner.set_state(stopped);
        match &result {
            Ok(r) => tracing::info!(
                root = %runner.cfg.zk.root,
                position = r.checkpoint.position,
                events = r.events_applied,
                ops = r.ops_applied,
                transactions = r.transactions,
                "projection run finished"
            ),
            Err(e) => {
                tracing::error!(root = %runner.cfg.zk.root, error = %error_chain(e), "projection stopped")
            }
        }
        result
    }
}

/// An error and its sources, `: `-separated.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// Reads the checkpoint and its version after a `sync`; `None` when the node
/// is missing.
///
/// # Errors
/// [`SinkError::Zk`] on I/O, [`SinkError::BadCheckpoint`] for data that is
/// not a checkpoint.
pub async fn read_checkpoint(
    client: &zk::Client,
    config: &ZkConfig,
) -> Result<Option<(Checkpoint, i32)>, SinkError> {
    let deadline = config.request_timeout;
    call(
        deadline,
        "sync",
        CHECKPOINT_NODE,
        client.sync(CHECKPOINT_NODE),
    )
    .await
    .or_else(|e| {
        if e.code() == Some(&zk::Error::NoNode) {
            Ok(())
        } else {
            Err(e)
        }
    })?;
    let (data, stat) = match call(
        deadline,
        "get_data",
        CHECKPOINT_NODE,
        client.get_data(CHECKPOINT_NODE),
    )
    .await
    {
        Ok(v) => v,
        Err(e) if e.code() == Some(&zk::Error::NoNode) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let cp = Checkpoint::from_json(&data).map_err(|reason| SinkError::BadCheckpoint {
        root: config.root.clone(),
        data: ingest_protocol::cut(&String::from_utf8_lossy(&data), 200).into_owned(),
        reason: ingest_protocol::cut(&reason.to_string(), 200).into_owned(),
    })?;
    Ok(Some((cp, stat.version)))
}

#[cfg(test)]
mod tests;
