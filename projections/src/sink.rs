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

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use ingest_events::codec::GENESIS_HASH;
use ingest_events::log::{Log, LogError};
use ingest_events::Hash;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use zookeeper_client as zk;

use crate::checkpoint::{Checkpoint, Partial, RebuildMarker, CHECKPOINT_NODE, REBUILDING_NODE};
use crate::layout;
use crate::leader::{self, Leadership};
use crate::ops::{EventOps, Op};
use crate::projector::{ProjectError, Projector};
use crate::txn::{self, Oversized, TxnLimits, TxnPlan};
use crate::zk::{call, ZkConfig, ZkError, ZkErrorKind};

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
pub struct ProjectorGate(Arc<tokio::sync::RwLock<()>>);

impl ProjectorGate {
    /// A gate nobody holds.
    pub fn new() -> ProjectorGate {
        ProjectorGate::default()
    }

    /// Holds the projector until the guard is dropped.
    pub async fn hold(&self) -> tokio::sync::OwnedRwLockWriteGuard<()> {
        Arc::clone(&self.0).write_owned().await
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
    /// A transaction failed on a node the log says exists (or does not).
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
        config.zk.validate().map_err(SinkError::Config)?;
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
            ever_connected: false,
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

// ---------------------------------------------------------------------------

/// Capped exponential backoff with a little jitter.
#[derive(Debug, Default)]
struct Backoff {
    initial: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    fn new(initial: Duration, max: Duration) -> Backoff {
        Backoff {
            initial,
            max,
            next: initial,
        }
    }

    fn delay(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(self.max);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|t| t.subsec_nanos())
            .unwrap_or(0);
        // Up to a quarter more, so several projectors do not retry in step.
        d + d.mul_f64(f64::from(nanos % 1000) / 4000.0)
    }

    fn reset(&mut self) {
        self.next = self.initial;
    }
}

#[derive(Debug, Default, Clone, Copy)]
struct Counters {
    transactions: u64,
    events: u64,
    ops: u64,
    conflicts: u64,
}

/// What the metadata of a projected, not yet applied event is.
#[derive(Debug, Clone, Copy)]
struct Meta {
    kind: &'static str,
    hash: Hash,
    timestamp: DateTime<Utc>,
}

/// The in-memory projector, brought to what the tree holds plus the events
/// projected and not yet applied.
struct Model {
    projector: Projector,
    /// Events after `applied`, in order; `projector` has projected them.
    pending: Vec<EventOps>,
    meta: Vec<Meta>,
    /// Parts of `pending[0]` already in the tree.
    parts_done: usize,
    /// What the tree holds (never with `rebuilding`).
    applied: Checkpoint,
    /// Whether the model was ever brought to a checkpoint.
    loaded: bool,
    pending_bytes: usize,
    pending_ops: usize,
}

impl Model {
    fn new() -> Model {
        Model {
            projector: Projector::new(),
            pending: Vec::new(),
            meta: Vec::new(),
            parts_done: 0,
            applied: Checkpoint::genesis(),
            loaded: false,
            pending_bytes: 0,
            pending_ops: 0,
        }
    }

    fn push(&mut self, ops: EventOps, meta: Meta) {
        self.pending_bytes += ops.serialized_size();
        self.pending_ops += ops.ops.len();
        self.pending.push(ops);
        self.meta.push(meta);
    }

    fn drop_front(&mut self, n: usize) {
        for e in self.pending.drain(..n) {
            self.pending_bytes -= e.serialized_size();
            self.pending_ops -= e.ops.len();
        }
        self.meta.drain(..n);
    }

    fn clear_pending(&mut self) {
        self.pending.clear();
        self.meta.clear();
        self.parts_done = 0;
        self.pending_bytes = 0;
        self.pending_ops = 0;
    }
}

/// An operation of a transaction, by reference, to name it on failure.
enum Sent {
    /// The checkpoint write.
    Checkpoint,
    /// A worker's lock deleted with its parent.
    Lock(String),
    /// `pending[event].ops[index]`.
    Op(usize, usize),
}

/// Why one round of serving a session ended.
enum Exit {
    /// The run is over.
    Done,
    /// Go around again at once (standby over, checkpoint recreated).
    Retry,
    /// The checkpoint moved under us: re-read.
    Conflict,
    /// ZooKeeper I/O: back off, then re-read (new session if it is lost).
    Io(ZkError),
    /// Needs an operator.
    Fatal(SinkError),
}

impl From<ZkError> for Exit {
    fn from(e: ZkError) -> Exit {
        Exit::Io(e)
    }
}

impl From<SinkError> for Exit {
    fn from(e: SinkError) -> Exit {
        Exit::Fatal(e)
    }
}

impl From<LogError> for Exit {
    fn from(e: LogError) -> Exit {
        Exit::Fatal(SinkError::Log(e))
    }
}

impl From<ProjectError> for Exit {
    fn from(e: ProjectError) -> Exit {
        Exit::Fatal(SinkError::Project(e))
    }
}

/// Records read from the log per read.
const READ_CHUNK: u64 = 512;
/// Events projected ahead of the tree at most (events without operations
/// add no bytes, so the byte cap alone would not bound the queue).
const MAX_PENDING_EVENTS: usize = 8192;

struct Runner {
    log: Arc<Log>,
    cfg: SinkConfig,
    identity: String,
    status: watch::Sender<SinkStatus>,
    durable: watch::Receiver<u64>,
    shutdown: CancellationToken,
    mode: RunMode,
    /// For [`RunMode::CatchUp`]: the durable position at the start.
    target: u64,
    model: Model,
    /// The last checkpoint read while standing by.
    seen_checkpoint: Option<Checkpoint>,
    backoff: Backoff,
    counters: Counters,
    /// Conflicts since the last committed transaction.
    conflict_streak: u32,
    ever_connected: bool,
}

impl Runner {
    fn root(&self) -> String {
        self.cfg.zk.root.clone()
    }

    fn deadline(&self) -> Duration {
        self.cfg.zk.request_timeout
    }

    fn report(&self) -> SinkReport {
        let checkpoint = match (&self.seen_checkpoint, self.model.loaded) {
            (Some(cp), false) => cp.clone(),
            (Some(cp), true) if cp.position > self.model.applied.position => cp.clone(),
            _ => self.model.applied.clone(),
        };
        SinkReport {
            checkpoint,
            events_applied: self.counters.events,
            ops_applied: self.counters.ops,
            transactions: self.counters.transactions,
            conflicts: self.counters.conflicts,
        }
    }

    /// The position the tree holds, as far as this sink knows.
    fn checkpoint_position(&self) -> u64 {
        match (&self.seen_checkpoint, &self.status.borrow().state) {
            (Some(cp), SinkState::Standby { .. }) => cp.position,
            (Some(cp), _) if !self.model.loaded => cp.position,
            _ => self.model.applied.position,
        }
    }

    fn set_state(&mut self, state: SinkState) {
        self.status.send_modify(|s| s.state = state);
        self.publish();
    }

    /// While idle: shows a session that lost its server as `Disconnected`
    /// (and `Connected` again once it is back); a session that ended is an
    /// I/O exit, so a new one is made.
    fn reflect_session(&mut self, session: zk::SessionState) -> Result<(), Exit> {
        if session.is_terminated() {
            return Err(Exit::Io(ZkError::new(
                "session",
                self.root(),
                ZkErrorKind::Server(zk::Error::SessionExpired),
            )));
        }
        let connected = matches!(
            session,
            zk::SessionState::SyncConnected | zk::SessionState::ConnectedReadOnly
        );
        let shown = self.status.borrow().state.clone();
        match (connected, shown) {
            (false, SinkState::Connected) => {
                tracing::warn!(root = %self.cfg.zk.root, state = %session, "ZooKeeper session disconnected while idle; waiting for it");
                self.set_state(SinkState::Disconnected);
            }
            (true, SinkState::Disconnected) => {
                tracing::info!(root = %self.cfg.zk.root, "ZooKeeper session connected again");
                self.set_state(SinkState::Connected);
            }
            _ => {}
        }
        Ok(())
    }

    /// Recomputes and publishes the figures.
    fn publish(&mut self) {
        let durable = self.log.durable_position();
        let checkpoint = self.checkpoint_position();
        let behind = durable.saturating_sub(checkpoint);
        let oldest = if behind == 0 {
            None
        } else {
            match self.model.meta.first() {
                Some(m) if self.model.applied.position == checkpoint => Some(m.timestamp),
                _ => self
                    .log
                    .read_one(checkpoint + 1)
                    .ok()
                    .map(|r| r.envelope.timestamp),
            }
        };
        let c = self.counters;
        self.status.send_modify(|s| {
            s.checkpoint = checkpoint;
            s.durable = durable;
            s.events_behind = behind;
            s.oldest_unprojected = oldest;
            s.seconds_behind = s.seconds_behind_at(Utc::now());
            s.transactions = c.transactions;
            s.events_applied = c.events;
            s.ops_applied = c.ops;
            s.conflicts = c.conflicts;
        });
    }

    /// Waits one backoff delay (less if shutdown is asked), publishing the
    /// figures as the log grows.
    async fn pause(&mut self) {
        let sleep = tokio::time::sleep(self.backoff.delay());
        tokio::pin!(sleep);
        loop {
            tokio::select! {
                _ = &mut sleep => return,
                _ = self.shutdown.cancelled() => return,
                changed = self.durable.changed() => {
                    if changed.is_err() {
                        (&mut sleep).await;
                        return;
                    }
                }
            }
            self.publish();
        }
    }

    async fn main(&mut self) -> Result<SinkReport, SinkError> {
        loop {
            if self.shutdown.is_cancelled() {
                return Ok(self.report());
            }
            let state = if self.ever_connected {
                SinkState::Disconnected
            } else {
                SinkState::Starting
            };
            self.set_state(state);
            let connected = tokio::select! {
                r = crate::zk::connect(&self.cfg.zk) => r,
                _ = self.shutdown.cancelled() => return Ok(self.report()),
            };
            let client = match connected {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(root = %self.cfg.zk.root, error = %e, "cannot open a ZooKeeper session; retrying");
                    self.set_state(SinkState::Disconnected);
                    self.pause().await;
                    continue;
                }
            };
            self.ever_connected = true;
            tracing::info!(
                root = %self.cfg.zk.root,
                session = %client.session_id(),
                identity = %self.identity,
                "ZooKeeper session open"
            );
            loop {
                match self.serve_once(&client).await {
                    Exit::Done => {
                        let _ = leader::release(&client, self.deadline()).await;
                        return Ok(self.report());
                    }
                    Exit::Retry => continue,
                    Exit::Conflict => {
                        self.counters.conflicts += 1;
                        self.conflict_streak += 1;
                        // One conflict is re-read at once; a writer that keeps
                        // moving the checkpoint is not raced in a tight loop.
                        if self.conflict_streak > 1 {
                            self.pause().await;
                        }
                        continue;
                    }
                    Exit::Fatal(e) => {
                        let _ = leader::release(&client, self.deadline()).await;
                        return Err(e);
                    }
                    Exit::Io(e) => {
                        let lost = e.is_session_lost() || client.state().is_terminated();
                        tracing::warn!(
                            root = %self.cfg.zk.root,
                            error = %e,
                            session_lost = lost,
                            position = self.model.applied.position,
                            "ZooKeeper unavailable; will re-read the checkpoint and go on"
                        );
                        self.set_state(SinkState::Disconnected);
                        self.pause().await;
                        if lost {
                            break;
                        }
                    }
                }
            }
        }
    }

    /// One pass: leadership (or standby), init, resume, project.
    async fn serve_once(&mut self, client: &zk::Client) -> Exit {
        match self.serve_inner(client).await {
            Ok(exit) | Err(exit) => exit,
        }
    }

    async fn serve_inner(&mut self, client: &zk::Client) -> Result<Exit, Exit> {
        if self.shutdown.is_cancelled() {
            return Ok(Exit::Done);
        }
        leader::ensure_engine_node(client, &self.cfg.zk.access, self.deadline()).await?;
        match leader::try_acquire(client, &self.identity, self.deadline()).await? {
            Leadership::Held => {}
            Leadership::HeldBy(holder) => return self.stand_by(client, holder).await,
        }
        self.init_nodes(client).await?;
        self.warn_if_unsecured(client).await;
        let Some((cp, version)) = self.read_checkpoint(client).await? else {
            return Ok(Exit::Retry);
        };
        let marker = call(
            self.deadline(),
            "get_data",
            REBUILDING_NODE,
            client.get_data(REBUILDING_NODE),
        )
        .await
        .map(|(data, _)| Some(data))
        .or_else(|e| {
            if e.code() == Some(&zk::Error::NoNode) {
                Ok(None)
            } else {
                Err(e)
            }
        })?;
        if marker.is_some() || cp.rebuilding.is_some() {
            let by = match marker.as_deref().map(RebuildMarker::from_json) {
                Some(Some(m)) => m.to_string(),
                Some(None) => "an unreadable rebuild marker".to_string(),
                None => format!(
                    "a rebuild or repair by {}",
                    cp.rebuilding.clone().unwrap_or_default()
                ),
            };
            let Some(resume) = self.cfg.resume.clone() else {
                return Err(SinkError::RebuildInterrupted {
                    root: self.root(),
                    by,
                }
                .into());
            };
            tracing::warn!(root = %self.cfg.zk.root, marker = %by, "the tree was left half-rebuilt; finishing the rebuild before projecting");
            self.set_state(SinkState::Rebuilding { marker: by.clone() });
            match resume.0.resume(client).await {
                Ok(()) => {}
                // ZooKeeper trouble: retried like any other.
                Err(e @ SinkError::Zk(_)) => return Err(e.into()),
                // It cannot be finished here (a tree of another log, say):
                // an operator must decide; the tree stays marked and paused.
                Err(e) => {
                    return Err(SinkError::RebuildInterrupted {
                        root: self.root(),
                        by: format!("{by} (finishing it failed: {e})"),
                    }
                    .into())
                }
            }
            tracing::info!(root = %self.cfg.zk.root, "the interrupted rebuild is finished");
            return Ok(Exit::Retry);
        }
        self.resync(&cp).await?;
        self.seen_checkpoint = None;
        tracing::info!(
            root = %self.cfg.zk.root,
            position = cp.position,
            hash = %cp.hash_hex(),
            partial = cp.partial.map(|p| p.parts).unwrap_or(0),
            version,
            durable = self.log.durable_position(),
            "leader; projecting from the checkpoint"
        );
        self.set_state(SinkState::Connected);
        self.backoff.reset();
        self.project(client, version).await
    }

    /// Stands by while `holder` leads: no writes; the figures follow the
    /// leader's checkpoint.
    async fn stand_by(&mut self, client: &zk::Client, holder: String) -> Result<Exit, Exit> {
        if !matches!(&self.status.borrow().state, SinkState::Standby { leader } if *leader == holder)
        {
            tracing::info!(root = %self.cfg.zk.root, leader = %holder, "another projector leads; standing by");
        }
        if let Some((cp, _)) = self.read_checkpoint(client).await? {
            let reached = cp.position >= self.target;
            self.seen_checkpoint = Some(cp);
            if self.mode == RunMode::CatchUp && reached {
                self.set_state(SinkState::Standby { leader: holder });
                return Ok(Exit::Done);
            }
        }
        self.set_state(SinkState::Standby { leader: holder });
        let (stat, watcher) = call(
            self.deadline(),
            "exists+watch",
            crate::checkpoint::LEADER_NODE,
            client.check_and_watch_stat(crate::checkpoint::LEADER_NODE),
        )
        .await?;
        if stat.is_none() {
            return Ok(Exit::Retry);
        }
        let changed = watcher.changed();
        tokio::pin!(changed);
        let recheck = tokio::time::sleep(self.cfg.standby_recheck);
        tokio::pin!(recheck);
        loop {
            tokio::select! {
                _ = &mut changed => return Ok(Exit::Retry),
                _ = &mut recheck => return Ok(Exit::Retry),
                _ = self.shutdown.cancelled() => return Ok(Exit::Done),
                r = self.durable.changed() => {
                    if r.is_err() {
                        return Ok(Exit::Retry);
                    }
                }
            }
            self.publish();
        }
    }

    /// With credentials, warns when the checkpoint is still writable by
    /// anyone: a tree projected before authentication was configured keeps
    /// its open ACLs until `ingest rebuild` sets them.
    async fn warn_if_unsecured(&self, client: &zk::Client) {
        if self.cfg.zk.access.is_open() {
            return;
        }
        let acl = call(
            self.deadline(),
            "get_acl",
            CHECKPOINT_NODE,
            client.get_acl(CHECKPOINT_NODE),
        )
        .await;
        if let Ok((acl, _)) = acl {
            let open = acl.iter().any(|a| {
                a.auth_id() == &zk::AuthId::anyone() && a.permission().has(zk::Permission::WRITE)
            });
            if open {
                tracing::warn!(root = %self.cfg.zk.root, "ZooKeeper credentials are configured but the tree's nodes are still writable by anyone (it was projected without them); run `ingest rebuild` with the same credentials to set their ACLs");
            }
        }
    }

    /// Creates the missing base nodes and the checkpoint node.
    async fn init_nodes(&mut self, client: &zk::Client) -> Result<(), Exit> {
        let mut paths = layout::base_paths();
        paths.push(CHECKPOINT_NODE.to_string());
        let mut reader = client.new_multi_reader();
        for p in &paths {
            reader
                .add_get_data(p)
                .map_err(|e| ZkError::new("multi-read", p.clone(), ZkErrorKind::Server(e)))?;
        }
        let results = call(
            self.deadline(),
            "multi-read",
            "the base nodes",
            reader.commit(),
        )
        .await?;
        let missing: Vec<&String> = paths
            .iter()
            .zip(results.iter())
            .filter(|(_, r)| !matches!(r, zk::MultiReadResult::Data { .. }))
            .map(|(p, _)| p)
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        let data = |p: &str| {
            if p == CHECKPOINT_NODE {
                Checkpoint::genesis().to_json()
            } else {
                Vec::new()
            }
        };
        // Parents come first in `paths`, so one transaction creates them all;
        // if another session created one meanwhile, fall back to one by one.
        let mut w = client.new_multi_writer();
        for p in &missing {
            w.add_create(p, &data(p), &self.cfg.zk.access.acl(p).persistent())
                .map_err(|e| ZkError::new("multi", p.to_string(), ZkErrorKind::Server(e)))?;
        }
        let all = tokio::time::timeout(self.deadline(), w.commit()).await;
        if !matches!(all, Ok(Ok(_))) {
            for p in &missing {
                match call(
                    self.deadline(),
                    "create",
                    p,
                    client.create(p, &data(p), &self.cfg.zk.access.acl(p).persistent()),
                )
                .await
                {
                    Ok(_) => {}
                    Err(e) if e.code() == Some(&zk::Error::NodeExists) => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
        tracing::info!(
            root = %self.cfg.zk.root,
            created = missing.len(),
            checkpoint = missing.iter().any(|p| *p == CHECKPOINT_NODE),
            "created the missing base nodes"
        );
        Ok(())
    }

    /// Reads the checkpoint and its version after a `sync`; `None` when the
    /// node is missing.
    async fn read_checkpoint(
        &mut self,
        client: &zk::Client,
    ) -> Result<Option<(Checkpoint, i32)>, Exit> {
        read_checkpoint(client, &self.cfg.zk)
            .await
            .map_err(|e| match e {
                SinkError::Zk(z) => Exit::Io(z),
                other => Exit::Fatal(other),
            })
    }

    /// The hash of the record at `position` ([`GENESIS_HASH`] for 0).
    fn hash_at(&self, position: u64) -> Result<Hash, LogError> {
        if position == 0 {
            return Ok(GENESIS_HASH);
        }
        Ok(self.log.read_one(position)?.envelope.hash)
    }

    /// Brings the model to what `cp` says the tree holds.
    async fn resync(&mut self, cp: &Checkpoint) -> Result<(), Exit> {
        let durable = self.log.durable_position();
        let last = cp.partial.map_or(cp.position, |p| p.position);
        if last > durable {
            return Err(SinkError::CheckpointAhead {
                root: self.root(),
                position: last,
                durable,
            }
            .into());
        }
        let hash = self.hash_at(cp.position)?;
        if hash != cp.hash {
            return Err(SinkError::ForeignTree {
                root: self.root(),
                position: cp.position,
                tree_hash: cp.hash_hex(),
                log_hash: hex::encode(hash),
            }
            .into());
        }
        let target = Checkpoint {
            rebuilding: None,
            ..cp.clone()
        };
        let m = &mut self.model;
        if m.loaded && m.applied == target {
            return Ok(());
        }
        let projected = m.projector.position();
        if m.loaded && cp.position >= m.applied.position && cp.position <= projected {
            // Our own transaction landed, or another projector applied
            // events we had projected: drop what the tree already holds.
            let n = (cp.position - m.applied.position) as usize;
            m.drop_front(n);
            m.parts_done = 0;
        } else if m.loaded && cp.position > projected {
            // Another projector went further: project on, writing nothing.
            m.clear_pending();
            self.fast_forward(cp.position).await?;
        } else {
            // First resume, or the tree went back (a rebuild restored an
            // earlier position): project from the start.
            tracing::info!(
                root = %self.cfg.zk.root,
                position = cp.position,
                "rebuilding the projector's model from the log"
            );
            let log = Arc::clone(&self.log);
            let position = cp.position;
            let projector = tokio::task::spawn_blocking(move || replay(&log, position))
                .await
                .map_err(|e| SinkError::Config(format!("the model replay task failed: {e}")))??;
            let m = &mut self.model;
            m.projector = projector;
            m.clear_pending();
        }
        let m = &mut self.model;
        m.applied = Checkpoint {
            partial: None,
            ..target.clone()
        };
        m.loaded = true;
        if let Some(Partial { parts, .. }) = target.partial {
            if m.pending.is_empty() {
                self.project_next(cp.position + 1)?;
            }
            let m = &mut self.model;
            m.parts_done = parts;
            m.applied.partial = target.partial;
        }
        Ok(())
    }

    /// Projects records up to `position`, discarding their operations, on
    /// a blocking thread (a standby taking over may be far behind).
    async fn fast_forward(&mut self, position: u64) -> Result<(), Exit> {
        let mut projector = std::mem::take(&mut self.model.projector);
        // Until it comes back, the model must be rebuilt if anything fails.
        self.model.loaded = false;
        let log = Arc::clone(&self.log);
        let projector = tokio::task::spawn_blocking(move || {
            let from = projector.position() + 1;
            for r in log.read_range(from, position) {
                projector.project(&r?)?;
            }
            Ok::<Projector, Exit>(projector)
        })
        .await
        .map_err(|e| SinkError::Config(format!("the model task failed: {e}")))??;
        self.model.projector = projector;
        self.model.loaded = true;
        Ok(())
    }

    /// Projects the record at `position` into the pending queue.
    fn project_next(&mut self, position: u64) -> Result<(), Exit> {
        let r = self.log.read_one(position)?;
        let ops = self.model.projector.project(&r)?;
        self.model.push(
            ops,
            Meta {
                kind: r.event.kind(),
                hash: r.envelope.hash,
                timestamp: r.envelope.timestamp,
            },
        );
        Ok(())
    }

    /// Projects records up to `limit` until a full transaction is queued.
    fn fill(&mut self, limit: u64) -> Result<(), Exit> {
        self.fill_to(limit, 1)
    }

    /// Projects records up to `limit` until two transactions are queued
    /// (the one in flight and the next).
    fn fill_ahead(&mut self, limit: u64) -> Result<(), Exit> {
        self.fill_to(limit, 2)
    }

    fn fill_to(&mut self, limit: u64, transactions: usize) -> Result<(), Exit> {
        let limits = self.cfg.limits;
        while self.model.projector.position() < limit
            && self.model.pending_bytes < limits.max_bytes * transactions
            && self.model.pending_ops < limits.max_ops * transactions
            && self.model.pending.len() < MAX_PENDING_EVENTS * transactions
        {
            let from = self.model.projector.position() + 1;
            let to = limit.min(from + READ_CHUNK - 1);
            for r in self.log.read_range(from, to) {
                let r = r?;
                let ops = self.model.projector.project(&r)?;
                self.model.push(
                    ops,
                    Meta {
                        kind: r.event.kind(),
                        hash: r.envelope.hash,
                        timestamp: r.envelope.timestamp,
                    },
                );
            }
            if self.model.projector.position() < to {
                return Err(SinkError::Log(LogError::Corrupt {
                    position: self.model.projector.position() + 1,
                    reason: "missing below the durable position".into(),
                })
                .into());
            }
        }
        Ok(())
    }

    /// The checkpoint the tree holds once `plan` commits.
    fn end_checkpoint(&self, plan: &TxnPlan) -> Checkpoint {
        let m = &self.model;
        let completed = plan.events_completed();
        let (position, hash) = match completed {
            0 => (m.applied.position, m.applied.hash),
            n => (m.pending[n - 1].position, m.meta[n - 1].hash),
        };
        let partial = match plan.segments.last() {
            Some(s) if !s.completes => Some(Partial {
                position: position + 1,
                parts: s.parts_done,
            }),
            _ => None,
        };
        Checkpoint {
            position,
            hash,
            partial,
            rebuilding: None,
        }
    }

    /// Where the run stops projecting: the start's durable position
    /// (catch-up) or the current one (follow).
    fn limit(&self) -> u64 {
        match self.mode {
            RunMode::CatchUp => self.target,
            RunMode::Follow => self.log.durable_position(),
        }
    }

    /// Applies the log to the tree, transaction by transaction.
    async fn project(&mut self, client: &zk::Client, mut version: i32) -> Result<Exit, Exit> {
        // Parents whose `lock` child must go with them (see the module docs).
        let mut lock_parents: BTreeSet<String> = BTreeSet::new();
        // Followed while idle: with nothing to project no request fails, so
        // a session that lost its server would otherwise go unnoticed (and
        // `/readyz` said ready through a whole outage).
        let mut session = client.state_watcher();
        loop {
            if self.shutdown.is_cancelled() {
                return Ok(Exit::Done);
            }
            let limit = self.limit();
            if self.model.pending.is_empty() && self.model.projector.position() >= limit {
                self.publish();
                if self.mode == RunMode::CatchUp {
                    return Ok(Exit::Done);
                }
                self.reflect_session(session.peek_state())?;
                tracing::debug!(root = %self.cfg.zk.root, position = limit, "caught up; following the log");
                tokio::select! {
                    r = self.durable.changed() => {
                        if r.is_err() {
                            return Ok(Exit::Done);
                        }
                    }
                    // Re-read at the top of the loop.
                    _ = session.changed() => {}
                    _ = self.shutdown.cancelled() => return Ok(Exit::Done),
                }
                continue;
            }
            // One transaction at a time under the gate's shared side: a
            // reader holding the gate sees no checkpoint move.
            let gate = Arc::clone(&self.cfg.gate.0);
            let _turn = tokio::select! {
                turn = gate.read_owned() => turn,
                _ = self.shutdown.cancelled() => return Ok(Exit::Done),
            };
            self.fill(limit)?;
            let plan = txn::plan_transaction(
                &self.model.pending,
                self.model.parts_done,
                self.cfg.limits.for_events(),
            )
            .map_err(|source| SinkError::Oversized {
                position: source.position,
                kind: self.model.meta.first().map_or("?", |m| m.kind),
                source,
            })?;
            let end = self.end_checkpoint(&plan);
            let first = self.model.pending.first().map_or(0, |e| e.position);
            let last = first + plan.segments.len().saturating_sub(1) as u64;
            let mut sent: Vec<Sent> = Vec::with_capacity(plan.ops + 1);
            let mut w = client.new_multi_writer();
            let add = |r: Result<(), zk::Error>, what: &str| {
                r.map_err(|e| {
                    Exit::Fatal(SinkError::Zk(ZkError::new(
                        "multi",
                        what.to_string(),
                        ZkErrorKind::Server(e),
                    )))
                })
            };
            add(
                w.add_set_data(CHECKPOINT_NODE, &end.to_json(), Some(version)),
                CHECKPOINT_NODE,
            )?;
            sent.push(Sent::Checkpoint);
            let access = &self.cfg.zk.access;
            for seg in &plan.segments {
                for i in seg.ops.clone() {
                    let op = &self.model.pending[seg.event].ops[i];
                    if let Op::Delete { path } = op {
                        if lock_parents.contains(path) {
                            let lock = format!("{path}/lock");
                            add(w.add_delete(&lock, None), &lock)?;
                            sent.push(Sent::Lock(lock));
                        }
                    }
                    let r = match op {
                        Op::Create { path, data } => {
                            w.add_create(path, data, &access.acl(path).persistent())
                        }
                        Op::SetData { path, data } => w.add_set_data(path, data, None),
                        Op::Delete { path } => w.add_delete(path, None),
                    };
                    add(r, op.path())?;
                    sent.push(Sent::Op(seg.event, i));
                }
            }
            let deadline = self.deadline();
            // The request is sent when the future is made; project the next
            // events while the server works on it (only appends to the
            // queue, so the indices in `plan` and `sent` stay valid).
            let in_flight = w.commit();
            // The client's session task writes the request; let it run
            // before the CPU-bound projection below (a task woken by this one
            // waits in this worker's LIFO slot until this one yields).
            tokio::task::yield_now().await;
            let projected_ahead = self.fill_ahead(limit);
            let outcome = tokio::time::timeout(deadline, in_flight).await;
            match outcome {
                Ok(Ok(_)) => {
                    version += 1;
                    lock_parents.clear();
                    self.applied(&plan, end);
                    tracing::debug!(
                        root = %self.cfg.zk.root,
                        first,
                        last,
                        events = plan.events_completed(),
                        ops = plan.ops,
                        bytes = plan.bytes,
                        version,
                        "transaction committed"
                    );
                    self.backoff.reset();
                    self.publish();
                    projected_ahead?;
                }
                Ok(Err(zk::MultiWriteError::OperationFailed { index: 0, source })) => {
                    return match source {
                        zk::Error::BadVersion => {
                            tracing::info!(
                                root = %self.cfg.zk.root,
                                position = self.model.applied.position,
                                version,
                                "the checkpoint moved (another writer); re-reading it"
                            );
                            Ok(Exit::Conflict)
                        }
                        zk::Error::NoNode => Ok(Exit::Retry),
                        other => {
                            Err(
                                ZkError::new("multi", CHECKPOINT_NODE, ZkErrorKind::Server(other))
                                    .into(),
                            )
                        }
                    };
                }
                Ok(Err(zk::MultiWriteError::OperationFailed { index, source })) => {
                    let op = sent
                        .get(index)
                        .map(|s| self.describe(s))
                        .unwrap_or_default();
                    if source == zk::Error::NotEmpty {
                        if let Some(Sent::Op(e, i)) = sent.get(index) {
                            if let Op::Delete { path: parent } = &self.model.pending[*e].ops[*i] {
                                let deleted_before: BTreeSet<String> = sent[..index]
                                    .iter()
                                    .filter_map(|s| self.deleted_path(s))
                                    .collect();
                                let parent = parent.clone();
                                if self
                                    .finished_lock_only(
                                        client,
                                        &parent,
                                        &lock_parents,
                                        &deleted_before,
                                    )
                                    .await?
                                {
                                    lock_parents.insert(parent);
                                    continue;
                                }
                            }
                        }
                    }
                    if matches!(
                        source,
                        zk::Error::NodeExists
                            | zk::Error::NoNode
                            | zk::Error::NotEmpty
                            | zk::Error::BadVersion
                            | zk::Error::BadArguments(_)
                    ) {
                        return Err(SinkError::Drift {
                            root: self.root(),
                            first,
                            last,
                            op,
                            error: source.to_string(),
                        }
                        .into());
                    }
                    return Err(ZkError::new("multi", op, ZkErrorKind::Server(source)).into());
                }
                Ok(Err(zk::MultiWriteError::RequestFailed { source })) => {
                    // Connection loss: the outcome is unknown; the caller
                    // re-reads the checkpoint before anything else.
                    return Err(ZkError::new(
                        "multi",
                        format!("positions {first}..={last}"),
                        ZkErrorKind::Server(source),
                    )
                    .into());
                }
                Err(_) => {
                    return Err(ZkError::new(
                        "multi",
                        format!("positions {first}..={last}"),
                        ZkErrorKind::Timeout(deadline),
                    )
                    .into());
                }
            }
        }
    }

    /// What a sent operation was, for messages.
    fn describe(&self, s: &Sent) -> String {
        match s {
            Sent::Checkpoint => format!("set {CHECKPOINT_NODE}"),
            Sent::Lock(p) => format!("delete {p}"),
            Sent::Op(e, i) => self.model.pending[*e].ops[*i].to_string(),
        }
    }

    /// The path a sent operation deletes, if it deletes one.
    fn deleted_path(&self, s: &Sent) -> Option<String> {
        match s {
            Sent::Checkpoint => None,
            Sent::Lock(p) => Some(p.clone()),
            Sent::Op(e, i) => match &self.model.pending[*e].ops[*i] {
                Op::Delete { path } => Some(path.clone()),
                _ => None,
            },
        }
    }

    /// Whether `parent` (a batch or job node being deleted by cleanup) has
    /// no child left but a worker's `lock` once the transaction's earlier
    /// deletions (`deleted_before`) are done, so the lock may go with it.
    async fn finished_lock_only(
        &mut self,
        client: &zk::Client,
        parent: &str,
        already: &BTreeSet<String>,
        deleted_before: &BTreeSet<String>,
    ) -> Result<bool, Exit> {
        let lock = format!("{parent}/lock");
        if already.contains(parent) || !layout::is_ephemeral_lock(&lock) {
            return Ok(false);
        }
        let children = call(
            self.deadline(),
            "get_children",
            parent,
            client.list_children(parent),
        )
        .await?;
        let left: Vec<&String> = children
            .iter()
            .filter(|c| !deleted_before.contains(&format!("{parent}/{c}")))
            .collect();
        if left != ["lock"] {
            return Ok(false);
        }
        let owner = match call(self.deadline(), "get_data", &lock, client.get_data(&lock)).await {
            Ok((_, stat)) => stat.ephemeral_owner,
            Err(e) if e.code() == Some(&zk::Error::NoNode) => 0,
            Err(e) => return Err(e.into()),
        };
        tracing::warn!(
            root = %self.cfg.zk.root,
            lock = %lock,
            owner = %zk::SessionId(owner),
            "deleting the lock of a finished item together with it (its worker's session has not expired)"
        );
        Ok(true)
    }

    /// Records a committed transaction in the model and the counters.
    fn applied(&mut self, plan: &TxnPlan, end: Checkpoint) {
        let completed = plan.events_completed();
        let m = &mut self.model;
        m.drop_front(completed);
        m.parts_done = match plan.segments.last() {
            Some(s) if !s.completes => s.parts_done,
            _ => 0,
        };
        m.applied = end;
        self.conflict_streak = 0;
        self.counters.transactions += 1;
        self.counters.events += completed as u64;
        self.counters.ops += plan.ops as u64;
    }
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
        reason: ingest_protocol::cut(&reason, 200).into_owned(),
    })?;
    Ok(Some((cp, stat.version)))
}

/// A projector brought to `position` from the start of the log.
fn replay(log: &Log, position: u64) -> Result<Projector, Exit> {
    let mut p = Projector::new();
    p.init()?;
    for r in log.read_range(1, position) {
        p.project(&r?)?;
    }
    if p.position() < position {
        return Err(SinkError::Log(LogError::Corrupt {
            position: p.position() + 1,
            reason: "missing below the checkpoint".into(),
        })
        .into());
    }
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(400));
        let d: Vec<u128> = (0..4).map(|_| b.delay().as_millis()).collect();
        assert!((100..=125).contains(&d[0]), "{d:?}");
        assert!((200..=250).contains(&d[1]), "{d:?}");
        assert!((400..=500).contains(&d[2]), "{d:?}");
        assert!((400..=500).contains(&d[3]), "{d:?}");
        b.reset();
        assert!(b.delay() < Duration::from_millis(130));
    }

    #[test]
    fn status_age_is_computed_from_the_event_time() {
        let mut s = SinkStatus::new();
        let now = Utc::now();
        assert_eq!(s.seconds_behind_at(now), 0.0);
        s.oldest_unprojected = Some(now - chrono::Duration::seconds(3));
        assert!((s.seconds_behind_at(now) - 3.0).abs() < 0.01);
    }
}
