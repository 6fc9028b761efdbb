//! The engine: the single writer of the log.
//!
//! It folds the log into a [`State`] when it opens (from the newest snapshot
//! that matches the log, see [`crate::snapshot`]), decides each command
//! against that state, appends the decided events (durably, with group
//! commit), and applies them to the state before answering. It also keeps
//! the Merkle tree of the log ([`Frontier`]), writes snapshots and signed
//! checkpoints when they are due ([`Engine::maybe_snapshot`],
//! [`Engine::maybe_checkpoint`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use ingest_events::command::{decide, Command, Rejection};
use ingest_events::event::{LogCheckpointed, StreamId};
use ingest_events::log::{AppendRequest, Conflict, Log, LogConfig, LogError};
use ingest_events::log::{ExpectedVersion, Proposed};
use ingest_events::merkle::Frontier;
use ingest_events::state::FoldError;
use ingest_events::{Actor, Event, Lifecycle, Recorded, State};
use ingest_steps::signing::{KeyFileError, SigningKeyFile};
use uuid::Uuid;

use crate::snapshot::{self, SnapshotError, SnapshotPolicy};

/// Where the engine gets its time from (a fixed clock in tests).
pub type Clock = Arc<dyn Fn() -> DateTime<Utc> + Send + Sync>;

/// How to open an engine.
#[derive(Clone)]
pub struct EngineConfig {
    /// The data directory; the log lives in `<data_dir>/log`.
    pub data_dir: PathBuf,
    /// The lifecycle to enforce.
    pub lifecycle: Lifecycle,
    /// The clock events are stamped with.
    pub clock: Clock,
    /// sled options.
    pub log: LogConfig,
    /// When snapshots of the folded state are written.
    pub snapshots: SnapshotPolicy,
    /// When signed checkpoints are appended (never without a key).
    pub checkpoints: CheckpointPolicy,
}

/// When the engine appends a signed checkpoint ([`LogCheckpointed`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointPolicy {
    /// The Ed25519 key (PKCS#8 PEM, mode 0600) that signs tree heads;
    /// `None`: no checkpoints.
    pub key: Option<PathBuf>,
    /// Append one when this many events were appended since the last one
    /// (0: never by count).
    pub every_events: u64,
    /// Append one when this much time passed since the last one and at
    /// least one event was appended (`None`: never by time).
    pub every: Option<Duration>,
}

impl Default for CheckpointPolicy {
    fn default() -> Self {
        CheckpointPolicy {
            key: None,
            every_events: 10_000,
            every: Some(Duration::from_secs(600)),
        }
    }
}

impl EngineConfig {
    /// The built-in lifecycle and the system clock.
    pub fn new(data_dir: impl Into<PathBuf>) -> EngineConfig {
        EngineConfig {
            data_dir: data_dir.into(),
            lifecycle: Lifecycle::builtin(),
            clock: Arc::new(Utc::now),
            log: LogConfig::default(),
            snapshots: SnapshotPolicy::default(),
            checkpoints: CheckpointPolicy::default(),
        }
    }
}

/// Why a command did not go through.
///
/// ### Handling
/// `Rejected` and `Conflict` are logical: nothing was appended; report them
/// (HTTP 404/409/422). `Log` is I/O or a log that needs repair: for
/// `LogError::Storage` the command's outcome is unknown until the log is read
/// again. `Fold` means the log disagrees with the rules that wrote it: stop.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    /// The command is not allowed in the current state.
    #[error(transparent)]
    Rejected(#[from] Rejection),
    /// A stream changed under the command (another writer?).
    #[error(transparent)]
    Conflict(#[from] Conflict),
    /// The log failed.
    #[error(transparent)]
    Log(#[from] LogError),
    /// A record does not fit the state.
    #[error(transparent)]
    Fold(#[from] FoldError),
    /// The checkpoint signing key cannot be used.
    #[error("the checkpoint key: {0}")]
    Key(#[from] KeyFileError),
    /// A replicated leader could not make the command's records durable in
    /// the replicated medium: nothing was acknowledged, the engine's state
    /// was folded again from its log, and the engine no longer leads.
    #[error(transparent)]
    Replication(#[from] ReplicationError),
    /// Records copied from the leader or a peer do not continue this log.
    #[error(transparent)]
    Import(#[from] ingest_events::log::ImportError),
    /// This engine is a follower of a replicated group: it takes no
    /// commands (its clients are sent to the leader).
    #[error("this engine follows; commands go to the leader")]
    NotLeader,
}

/// Where a replicated leader sends each group's records before its own log
/// takes them (implemented over ZooKeeper by `ingest-replication`).
///
/// The engine calls it from its writer with the frames of the commands it
/// staged ([`ingest_events::frame`]), one per command; the records are
/// committed to the local log only when it returns `Ok`, so nothing the
/// medium does not hold is ever in a leader's log.
pub trait Replicator: Send {
    /// Makes `frames` durable in the replicated medium, in order.
    ///
    /// # Errors
    /// [`ReplicationError`]: the group is not acknowledged and the engine
    /// stops leading.
    fn replicate(&mut self, frames: &[Vec<u8>]) -> Result<(), ReplicationError>;
}

/// A replicated write did not go through.
///
/// ### Handling
/// Every variant means this engine must stop leading (its clients are sent
/// to the new leader or told to retry): `Deposed` and `NoQuorum` say nothing
/// was written; for `Unknown` the records may still reach the replicas
/// through the medium, never through this engine.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ReplicationError {
    /// Another engine took leadership (the fencing epoch moved).
    #[error("this engine no longer leads: {0}")]
    Deposed(String),
    /// The medium has no quorum (or cannot be reached) and said so.
    #[error("no ZooKeeper quorum: {0}")]
    NoQuorum(String),
    /// The write's outcome is unknown.
    #[error("the outcome of the replicated write is unknown: {0}")]
    Unknown(String),
    /// One command's records exceed what the medium can carry atomically.
    #[error(
        "the command's records are {bytes} bytes; a replicated command carries at most {limit}"
    )]
    TooLarge {
        /// The command's size.
        bytes: usize,
        /// The limit.
        limit: usize,
    },
}

/// Each command's outcome in a group, and the last position written.
pub type GroupOutcome = (Vec<Result<Outcome, EngineError>>, Option<u64>);

/// What a command appended.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The records appended, in order (empty when the command changed nothing).
    pub records: Vec<Recorded>,
}

/// The engine over one data directory.
pub struct Engine {
    log: Arc<Log>,
    state: State,
    lifecycle: Lifecycle,
    clock: Clock,
    data_dir: PathBuf,
    frontier: Frontier,
    snapshots: SnapshotPolicy,
    last_snapshot: (u64, Instant),
    checkpoints: CheckpointPolicy,
    key: Option<SigningKeyFile>,
    last_checkpoint: (u64, Instant),
    /// Set while this engine leads a replicated group.
    replicator: Option<Box<dyn Replicator>>,
    /// How long the start-up fold took, and over how many events.
    pub startup: Startup,
}

/// Figures of the start-up fold.
#[derive(Debug, Clone, Copy)]
pub struct Startup {
    /// Events folded (after the snapshot, when one was used).
    pub events: u64,
    /// The position of the snapshot the fold started from, if any.
    pub snapshot: Option<u64>,
    /// Time taken after the log opened: checking the snapshot against it,
    /// reading older snapshots when the newest does not match, and the fold.
    pub elapsed: std::time::Duration,
    /// Opening the log (sled's recovery, the tail's chain check, the audit
    /// indexes' check).
    pub log_open: std::time::Duration,
    /// Loading the snapshot, by part. The newest snapshot is read and
    /// decoded while the log opens, so these overlap `log_open`.
    pub snapshot_load: snapshot::LoadTimes,
    /// The whole start-up: opening the log, the snapshot, the fold.
    pub total: std::time::Duration,
    /// Folding the records after the snapshot.
    pub fold: std::time::Duration,
}

/// The log's directory inside a data directory.
pub fn log_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("log")
}

impl Engine {
    /// Opens the log in the data directory and folds it.
    ///
    /// # Errors
    /// [`EngineError::Log`] when the log cannot be opened or read,
    /// [`EngineError::Fold`] when a record does not fit.
    pub fn open(config: EngineConfig) -> Result<Engine, EngineError> {
        std::fs::create_dir_all(&config.data_dir).map_err(|e| LogError::Storage(e.into()))?;
        let key = match &config.checkpoints.key {
            Some(path) => Some(SigningKeyFile::load(path)?),
            None => None,
        };
        let opening = Instant::now();
        let dir = snapshot::snapshot_dir(&config.data_dir);
        // The newest snapshot is read and decoded while sled opens the log
        // (neither needs the other); it is checked against the log after.
        let (log, prefetched) = std::thread::scope(|scope| {
            let reader = scope.spawn(|| {
                let mut times = snapshot::LoadTimes::default();
                (snapshot::prefetch(&dir, &mut times), times)
            });
            let log = Log::open(&log_dir(&config.data_dir), &config.log);
            let log_open = opening.elapsed();
            let prefetched = reader.join().unwrap_or_else(|_| {
                tracing::warn!("reading the newest snapshot failed; folding from the older ones or the whole log");
                (snapshot::Prefetched::default(), snapshot::LoadTimes::default())
            });
            (log.map(|log| (log, log_open)), prefetched)
        });
        let (log, log_open) = log?;
        // The log is open, so no other engine writes snapshots here now:
        // whatever temporary file is left was a killed or failed write.
        let removed = snapshot::remove_temporaries(&dir);
        if removed > 0 {
            tracing::info!(
                removed,
                "removed the temporary files of unfinished snapshot writes"
            );
        }
        let log = Arc::new(log);
        let (prefetched, mut snapshot_load) = prefetched;
        let started = Instant::now();
        let (head, _) = log.head();
        // A tail that fails the chain is left out of the fold; the log refuses
        // appends until it is repaired, but everything before it can be read.
        let readable = log.needs_repair().map_or(head, |(p, _)| p - 1);
        let loaded = snapshot::load_prefetched(prefetched, &log, readable, &mut snapshot_load);
        let folding = Instant::now();
        let (state, frontier, from) = fold(&log, loaded, readable)?;
        let startup = Startup {
            events: state.position - from.unwrap_or(0),
            snapshot: from,
            elapsed: started.elapsed(),
            log_open,
            snapshot_load,
            fold: folding.elapsed(),
            total: opening.elapsed(),
        };
        tracing::debug!(
            events = startup.events,
            snapshot = from,
            elapsed_ms = startup.elapsed.as_millis() as u64,
            "state folded from the log"
        );
        let now = Instant::now();
        Ok(Engine {
            log,
            last_snapshot: (from.unwrap_or(0), now),
            last_checkpoint: (state.position, now),
            state,
            frontier,
            lifecycle: config.lifecycle,
            clock: config.clock,
            data_dir: config.data_dir,
            snapshots: config.snapshots,
            checkpoints: config.checkpoints,
            key,
            replicator: None,
            startup,
        })
    }

    /// Folds the state and the Merkle tree again from the newest snapshot
    /// and the log: after a replicated write failed, the state staged for
    /// it is thrown away.
    ///
    /// # Errors
    /// As [`Engine::open`].
    pub fn refold(&mut self) -> Result<(), EngineError> {
        let dir = snapshot::snapshot_dir(&self.data_dir);
        let mut times = snapshot::LoadTimes::default();
        let prefetched = snapshot::prefetch(&dir, &mut times);
        let head = self.log.head().0;
        let loaded = snapshot::load_prefetched(prefetched, &self.log, head, &mut times);
        let (state, frontier, _) = fold(&self.log, loaded, head)?;
        self.state = state;
        self.frontier = frontier;
        Ok(())
    }

    /// Leads a replicated group from now on (`Some`), or stops leading
    /// (`None`).
    pub fn set_replicator(&mut self, replicator: Option<Box<dyn Replicator>>) {
        self.replicator = replicator;
    }

    /// Whether this engine holds a replicator (leads a replicated group).
    pub fn is_replicating(&self) -> bool {
        self.replicator.is_some()
    }

    /// Writes records copied from the leader or a peer (a frame, see
    /// [`ingest_events::frame`]) after checking them against the log, and
    /// folds them. Unflushed: wait with [`Engine::wait_durable`] before
    /// counting them as applied.
    ///
    /// # Errors
    /// [`EngineError::Import`] when they do not continue this log (nothing
    /// is written), [`EngineError::Fold`] when a record does not fit the
    /// state (the log is then ahead of the state: reopen).
    pub fn import(&mut self, frame: &[u8]) -> Result<Vec<Recorded>, EngineError> {
        // Every signed checkpoint among the records must sign the root of
        // the records before it (as this engine has them), with a valid
        // signature, and, when this engine has a checkpoint key, by that
        // key: a peer cannot hand over a history its signed heads do not
        // vouch for.
        let mut tree = self.frontier.clone();
        let pinned = self.key.as_ref().map(SigningKeyFile::public_key_bytes);
        let records = self.log.import_checked(frame, &mut |r| {
            if let ingest_events::event::Event::LogCheckpointed(c) = &r.event {
                if let Some(problem) = crate::audit::check_checkpoint(c, &tree, pinned) {
                    return Err(crate::audit::Unheld(problem));
                }
            }
            tree.push(&r.envelope.hash);
            Ok(())
        })?;
        self.absorb(&records)?;
        Ok(records)
    }

    /// Commits a staged group: through the replicator first when this
    /// engine leads a replicated group. When the replicator fails, nothing
    /// is written, the state is folded again and the error is returned.
    fn commit_staged(
        &mut self,
        group: ingest_events::log::Group<'_>,
    ) -> Result<Option<u64>, EngineError> {
        if let Some(replicator) = self.replicator.as_mut() {
            if !group.frames().is_empty() {
                if let Err(e) = replicator.replicate(group.frames()) {
                    drop(group);
                    self.replicator = None;
                    self.refold()?;
                    return Err(EngineError::Replication(e));
                }
            }
        }
        Ok(group.commit()?)
    }

    /// Applies appended records to the state and the Merkle tree.
    fn absorb(&mut self, records: &[Recorded]) -> Result<(), FoldError> {
        for r in records {
            self.state.apply(r)?;
            self.frontier.push(&r.envelope.hash);
        }
        Ok(())
    }

    /// The Merkle tree over every record folded.
    pub fn frontier(&self) -> &Frontier {
        &self.frontier
    }

    /// Writes a snapshot of the state now. Call it only when every record
    /// folded is durable (after [`Engine::wait_durable`]): a snapshot ahead
    /// of the log after a crash would be ignored, not used.
    ///
    /// # Errors
    /// [`SnapshotError`]; the engine goes on without the snapshot.
    pub fn snapshot_now(&mut self) -> Result<PathBuf, SnapshotError> {
        let dir = snapshot::snapshot_dir(&self.data_dir);
        let path = snapshot::write_parts(&dir, &self.state, &self.frontier)?;
        self.last_snapshot = (self.state.position, Instant::now());
        snapshot::prune(&dir, self.snapshots.keep)?;
        Ok(path)
    }

    fn due(policy: (u64, Option<Duration>), last: (u64, Instant), position: u64) -> bool {
        let since = position.saturating_sub(last.0);
        since > 0
            && ((policy.0 > 0 && since >= policy.0)
                || policy.1.is_some_and(|every| last.1.elapsed() >= every))
    }

    /// Writes a snapshot when the policy says one is due (same durability
    /// rule as [`Engine::snapshot_now`]); a failure is logged, not returned.
    pub fn maybe_snapshot(&mut self) -> Option<PathBuf> {
        let policy = (self.snapshots.every_events, self.snapshots.every);
        if !Self::due(policy, self.last_snapshot, self.state.position) {
            return None;
        }
        self.snapshot_if_advanced()
    }

    /// Writes a snapshot when the state moved past the last one (at a clean
    /// shutdown, so the next start-up folds nothing); a failure is logged.
    pub fn snapshot_if_advanced(&mut self) -> Option<PathBuf> {
        if self.state.position <= self.last_snapshot.0 {
            return None;
        }
        let started = Instant::now();
        match self.snapshot_now() {
            Ok(path) => {
                tracing::info!(
                    position = self.state.position,
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    path = %path.display(),
                    "snapshot written"
                );
                Some(path)
            }
            Err(e) => {
                // Do not try again at every group: wait for the next interval.
                self.last_snapshot = (self.state.position, Instant::now());
                tracing::warn!(error = %e, "cannot write a snapshot; start-up folds more of the log until the next one");
                None
            }
        }
    }

    /// Signs checkpoints with the key at `path` from now on (an offline
    /// command that was given `--checkpoint-key`).
    ///
    /// # Errors
    /// [`EngineError::Key`] when the key cannot be read or is readable by
    /// others.
    pub fn use_checkpoint_key(&mut self, path: &Path) -> Result<(), EngineError> {
        self.key = Some(SigningKeyFile::load(path)?);
        Ok(())
    }

    /// Appends a signed checkpoint over every record so far, unflushed
    /// (wait with [`Engine::wait_durable`] before relying on it). `None`
    /// without a key or when the last record is already covered.
    ///
    /// # Errors
    /// As [`Engine::execute`].
    pub fn checkpoint_now(&mut self) -> Result<Option<Outcome>, EngineError> {
        let Some(key) = &self.key else {
            return Ok(None);
        };
        if self.state.position == 0 {
            return Ok(None);
        }
        let tree_size = self.frontier.size();
        let root = self.frontier.root();
        let signature = key.sign(&LogCheckpointed::signed_bytes(tree_size, &root));
        let event = LogCheckpointed {
            tree_size,
            root,
            public_key: key.public_key_bytes(),
            signature: signature.bytes.to_vec(),
        };
        let request = AppendRequest {
            actor: Actor::engine(),
            correlation_id: Uuid::new_v4(),
            timestamp: (self.clock)(),
            expectations: vec![(
                StreamId::System,
                ExpectedVersion::Exact(self.state.system_version),
            )],
            events: vec![Proposed {
                stream: StreamId::System,
                event: Event::LogCheckpointed(event),
            }],
        };
        let appended = self.append_one(&request)?;
        self.last_checkpoint = (self.state.position, Instant::now());
        Ok(Some(Outcome {
            records: appended.records,
        }))
    }

    /// Appends a signed checkpoint when the policy says one is due (see
    /// [`Engine::checkpoint_now`]).
    ///
    /// # Errors
    /// As [`Engine::execute`].
    pub fn maybe_checkpoint(&mut self) -> Result<Option<Outcome>, EngineError> {
        let policy = (self.checkpoints.every_events, self.checkpoints.every);
        if self.key.is_none() || !Self::due(policy, self.last_checkpoint, self.state.position) {
            return Ok(None);
        }
        self.checkpoint_now()
    }

    /// Decides a command, appends its events durably and applies them.
    ///
    /// # Errors
    /// See [`EngineError`]; nothing is appended unless `Ok` is returned (or
    /// a `LogError::Storage` leaves the outcome unknown).
    pub fn execute(&mut self, actor: &Actor, command: &Command) -> Result<Outcome, EngineError> {
        self.execute_correlated(actor, Uuid::new_v4(), command)
    }

    /// As [`Engine::execute`], with the caller's correlation id.
    ///
    /// # Errors
    /// See [`Engine::execute`].
    pub fn execute_correlated(
        &mut self,
        actor: &Actor,
        correlation_id: Uuid,
        command: &Command,
    ) -> Result<Outcome, EngineError> {
        let outcome = self.execute_unflushed(actor, correlation_id, command)?;
        if let Some(last) = outcome.records.last() {
            self.log.wait_durable(last.envelope.position)?;
        }
        Ok(outcome)
    }

    /// Decides, appends and applies a command without waiting for its flush.
    /// The caller must not acknowledge it before [`Engine::wait_durable`]
    /// returns for its last position. This lets the single writer decide the
    /// next command while earlier ones share one flush (group commit).
    ///
    /// # Errors
    /// See [`Engine::execute`].
    pub fn execute_unflushed(
        &mut self,
        actor: &Actor,
        correlation_id: Uuid,
        command: &Command,
    ) -> Result<Outcome, EngineError> {
        let decision = decide(&self.state, &self.lifecycle, command)?;
        if decision.events.is_empty() {
            return Ok(Outcome {
                records: Vec::new(),
            });
        }
        let request = AppendRequest {
            actor: actor.clone(),
            correlation_id,
            timestamp: (self.clock)(),
            expectations: decision.expectations,
            events: decision.events,
        };
        let appended = self.append_one(&request)?;
        Ok(Outcome {
            records: appended.records,
        })
    }

    /// Stages one request, commits it (through the replicator when leading)
    /// and folds it.
    fn append_one(
        &mut self,
        request: &AppendRequest,
    ) -> Result<ingest_events::log::Appended, EngineError> {
        let log = Arc::clone(&self.log);
        let mut group = log.begin_group();
        let appended = group.stage(request)??;
        self.commit_staged(group)?;
        self.absorb(&appended.records)?;
        Ok(appended)
    }

    /// Decides and stages a group of commands, each against the state left
    /// by the ones before it, and writes them in one sled batch (not yet
    /// flushed). Returns each command's outcome and the last position written.
    ///
    /// # Errors
    /// The outer error means the group could not be written: the state has
    /// moved ahead of the log and the engine must be reopened (fatal).
    pub fn execute_group(
        &mut self,
        commands: &[(Actor, Uuid, Command)],
    ) -> Result<GroupOutcome, EngineError> {
        let log = Arc::clone(&self.log);
        let mut group = log.begin_group();
        let mut outcomes = Vec::with_capacity(commands.len());
        for (actor, correlation_id, command) in commands {
            let outcome = match decide(&self.state, &self.lifecycle, command) {
                Err(r) => Err(EngineError::Rejected(r)),
                Ok(decision) if decision.events.is_empty() => Ok(Outcome {
                    records: Vec::new(),
                }),
                Ok(decision) => {
                    let request = AppendRequest {
                        actor: actor.clone(),
                        correlation_id: *correlation_id,
                        timestamp: (self.clock)(),
                        expectations: decision.expectations,
                        events: decision.events,
                    };
                    match group.stage(&request) {
                        Ok(Ok(appended)) => {
                            for r in &appended.records {
                                self.state.apply(r)?;
                                self.frontier.push(&r.envelope.hash);
                            }
                            Ok(Outcome {
                                records: appended.records,
                            })
                        }
                        Ok(Err(conflict)) => Err(EngineError::Conflict(conflict)),
                        Err(e) => Err(EngineError::Log(e)),
                    }
                }
            };
            outcomes.push(outcome);
        }
        match self.commit_staged(group) {
            Ok(last) => Ok((outcomes, last)),
            Err(EngineError::Replication(e)) => {
                // Nothing of the group was written: each command that had
                // records is refused with the replication error; rejections
                // stay as they were.
                let outcomes = outcomes
                    .into_iter()
                    .map(|o| match o {
                        Ok(o) if !o.records.is_empty() => Err(EngineError::Replication(e.clone())),
                        other => other,
                    })
                    .collect();
                Ok((outcomes, None))
            }
            Err(e) => Err(e),
        }
    }

    /// Blocks until `position` is durable.
    ///
    /// # Errors
    /// [`EngineError::Log`] when the flush fails: the outcome of every
    /// unacknowledged command is then unknown.
    pub fn wait_durable(&self, position: u64) -> Result<(), EngineError> {
        Ok(self.log.wait_durable(position)?)
    }

    /// The folded state.
    pub fn state(&self) -> &State {
        &self.state
    }

    /// The log.
    pub fn log(&self) -> &Log {
        &self.log
    }

    /// A shared handle on the log, for readers that outlive a borrow (the projector).
    pub fn shared_log(&self) -> Arc<Log> {
        Arc::clone(&self.log)
    }

    /// The lifecycle enforced.
    pub fn lifecycle(&self) -> &Lifecycle {
        &self.lifecycle
    }

    /// The data directory.
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }
}

impl Engine {
    /// Queue-wide figures, as `ingest status` and `GET /status` show them.
    pub fn status_view(&self) -> ingest_protocol::view::StatusView {
        status_view(
            self.log(),
            self.state(),
            self.data_dir(),
            self.startup.elapsed,
        )
    }
}

/// Queue-wide figures of `state` and `log` (see [`Engine::status_view`]);
/// the server calls it with its published state.
pub fn status_view(
    log: &Log,
    state: &State,
    data_dir: &Path,
    startup: std::time::Duration,
) -> ingest_protocol::view::StatusView {
    use std::collections::BTreeMap;
    let (head_position, head_hash) = log.head();
    let mut batches_by_state = BTreeMap::new();
    for b in state.batches.values().filter(|b| !b.cleaned_up) {
        *batches_by_state.entry(b.status.to_string()).or_insert(0) += 1;
    }
    let mut jobs_by_state = BTreeMap::new();
    for j in state.jobs.values().filter(|j| !j.cleaned_up) {
        *jobs_by_state.entry(j.status.to_string()).or_insert(0) += 1;
    }
    let last_verify = crate::verified::last(data_dir);
    ingest_protocol::view::StatusView {
        data_dir: data_dir.display().to_string(),
        head_position,
        head_hash: hex::encode(head_hash),
        durable_position: log.durable_position(),
        needs_repair: log
            .needs_repair()
            .map(|(p, r)| format!("position {p}: {r}"))
            .or_else(|| last_verify.as_ref().and_then(crate::verified::damage)),
        last_verify,
        paused: state.paused,
        held_collections: state.held_collections.iter().cloned().collect(),
        live_batches: batches_by_state.values().sum(),
        live_jobs: jobs_by_state.values().sum(),
        batches_by_state,
        jobs_by_state,
        startup_fold_ms: u64::try_from(startup.as_millis()).unwrap_or(u64::MAX),
        replication: None,
    }
}

/// Folds the log from a loaded snapshot (or from the start) up to `to`.
fn fold(
    log: &Log,
    loaded: Option<snapshot::Snapshot>,
    to: u64,
) -> Result<(State, Frontier, Option<u64>), EngineError> {
    let (mut state, mut frontier, from) = match loaded {
        Some(s) => {
            let p = s.state.position;
            (s.state, s.frontier, Some(p))
        }
        None => (State::new(), Frontier::new(), None),
    };
    for record in log.read_range(state.position + 1, to) {
        let record = record?;
        state.apply(&record)?;
        frontier.push(&record.envelope.hash);
    }
    Ok((state, frontier, from))
}
