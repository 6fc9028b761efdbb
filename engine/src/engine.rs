//! The engine: the single writer of the log.
//!
//! It folds the log into a [`State`] when it opens, decides each command
//! against that state, appends the decided events (durably, with group
//! commit), and applies them to the state before answering.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use chrono::{DateTime, Utc};
use ingest_events::command::{decide, Command, Rejection};
use ingest_events::log::{AppendRequest, Conflict, Log, LogConfig, LogError};
use ingest_events::state::FoldError;
use ingest_events::{Actor, Lifecycle, Recorded, State};
use uuid::Uuid;

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
}

impl EngineConfig {
    /// The built-in lifecycle and the system clock.
    pub fn new(data_dir: impl Into<PathBuf>) -> EngineConfig {
        EngineConfig {
            data_dir: data_dir.into(),
            lifecycle: Lifecycle::builtin(),
            clock: Arc::new(Utc::now),
            log: LogConfig::default(),
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
    /// How long the start-up fold took, and over how many events.
    pub startup: Startup,
}

/// Figures of the start-up fold.
#[derive(Debug, Clone, Copy)]
pub struct Startup {
    /// Events folded.
    pub events: u64,
    /// Time taken.
    pub elapsed: std::time::Duration,
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
        let log = Arc::new(Log::open(&log_dir(&config.data_dir), &config.log)?);
        let started = Instant::now();
        let mut state = State::new();
        let (head, _) = log.head();
        // A tail that fails the chain is left out of the fold; the log refuses
        // appends until it is repaired, but everything before it can be read.
        let readable = log.needs_repair().map_or(head, |(p, _)| p - 1);
        for record in log.read_range(1, readable) {
            state.apply(&record?)?;
        }
        let startup = Startup {
            events: state.position,
            elapsed: started.elapsed(),
        };
        tracing::debug!(
            events = startup.events,
            elapsed_ms = startup.elapsed.as_millis() as u64,
            "state folded from the log"
        );
        Ok(Engine {
            log,
            state,
            lifecycle: config.lifecycle,
            clock: config.clock,
            data_dir: config.data_dir,
            startup,
        })
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
        let appended = self.log.append_unflushed(&request)??;
        for r in &appended.records {
            self.state.apply(r)?;
        }
        Ok(Outcome {
            records: appended.records,
        })
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
        let last = group.commit()?;
        Ok((outcomes, last))
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
    ingest_protocol::view::StatusView {
        data_dir: data_dir.display().to_string(),
        head_position,
        head_hash: hex::encode(head_hash),
        durable_position: log.durable_position(),
        needs_repair: log
            .needs_repair()
            .map(|(p, r)| format!("position {p}: {r}")),
        paused: state.paused,
        held_collections: state.held_collections.iter().cloned().collect(),
        live_batches: batches_by_state.values().sum(),
        live_jobs: jobs_by_state.values().sum(),
        batches_by_state,
        jobs_by_state,
        startup_fold_ms: u64::try_from(startup.as_millis()).unwrap_or(u64::MAX),
    }
}
