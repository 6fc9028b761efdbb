//! The engine as a service: one writer thread, many callers.
//!
//! HTTP handlers, worker daemons and admin tools send commands through an
//! [`EngineHandle`]. The writer thread takes every command waiting in its
//! queue, decides and appends each one (each command's events atomically),
//! then waits for ONE flush that covers them all before answering any of them:
//! group commit across callers. Rejections are answered at once.
//!
//! Readers see the *published* state, which the writer updates only after the
//! flush, so nothing a reader sees can be lost by a crash. With it the writer
//! keeps an index of the batches in a reporting status (Reporting,
//! UpdateReporting), which the workers' reporting sweep reads: its cost
//! follows those batches, not every batch ever submitted.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, RwLock, RwLockReadGuard};
use std::thread::JoinHandle;

use ingest_events::command::Command;
use ingest_events::event::StreamId;
use ingest_events::lifecycle::BatchState;
use ingest_events::log::{Log, LogError};
use ingest_events::{Actor, Bid, Lifecycle, Recorded, State};
use ingest_projections::ids::{IdError, IdKind};
use tokio::sync::{mpsc, oneshot, watch};
use uuid::Uuid;

use crate::engine::{Engine, EngineError, Outcome, Replicator};

/// How many queued commands one group commit takes at most.
const MAX_GROUP: usize = 512;

enum Msg {
    Command(Box<Request>),
    /// Records copied from the leader: write, flush, fold, publish.
    Import(Vec<u8>, oneshot::Sender<Result<u64, EngineError>>),
    /// Lead a replicated group through this replicator (`None`: follow).
    Role(Option<Box<dyn Replicator>>, oneshot::Sender<()>),
    Shutdown,
}

struct Request {
    actor: Actor,
    correlation_id: Uuid,
    command: Command,
    reply: oneshot::Sender<Result<Outcome, ServiceError>>,
}

/// What the writer publishes after each flush: the state, and the batches
/// in a reporting status by status (kept with it, record by record).
struct Published {
    state: RwLock<State>,
    reporting: RwLock<BTreeMap<BatchState, BTreeSet<Bid>>>,
    /// The position of the published state, each time it moves.
    position: watch::Sender<u64>,
    /// Whether the writer leads (replicated) or takes commands (single).
    leading: watch::Sender<bool>,
}

/// Whether batches in `status` are kept in the reporting index.
fn is_reporting(status: BatchState) -> bool {
    matches!(status, BatchState::Reporting | BatchState::UpdateReporting)
}

impl Published {
    fn new(state: State) -> Published {
        let mut reporting: BTreeMap<BatchState, BTreeSet<Bid>> = BTreeMap::new();
        for b in state.batches.values().filter(|b| is_reporting(b.status)) {
            reporting.entry(b.status).or_default().insert(b.bid);
        }
        let position = watch::Sender::new(state.position);
        Published {
            state: RwLock::new(state),
            reporting: RwLock::new(reporting),
            position,
            leading: watch::Sender::new(false),
        }
    }
}

/// Where the ids of new batches and jobs come from when they are shared
/// with another allocator (adoption mode: ZooKeeper's sequential counters,
/// which mrt-zk names its batches and jobs by; see
/// [`ingest_projections::ids`]).
pub trait IdSource: Send + Sync {
    /// `n` unused ids of `kind`, ascending, each at least `floor` (the
    /// log's next id).
    fn reserve(
        &self,
        kind: IdKind,
        n: usize,
        floor: u64,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<Vec<u64>, IdError>> + Send + '_>>;
}

/// A cheap, cloneable handle on the engine service.
#[derive(Clone)]
pub struct EngineHandle {
    tx: mpsc::Sender<Msg>,
    /// Set once, in adoption mode: new batches and jobs take their ids
    /// from it ([`Command::WithIds`]).
    ids: Arc<std::sync::OnceLock<Arc<dyn IdSource>>>,
    published: Arc<Published>,
    log: Arc<Log>,
    lifecycle: Arc<Lifecycle>,
    data_dir: Arc<std::path::PathBuf>,
    startup: std::time::Duration,
    /// Why the writer thread could not be started, if it could not: then
    /// every call answers [`ServiceError::NoWriter`], not `Stopped`.
    no_writer: Option<Arc<std::io::Error>>,
}

/// The engine service: owns the writer thread.
pub struct EngineService {
    handle: EngineHandle,
    thread: Option<JoinHandle<()>>,
}

/// Why the service could not take a command.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServiceError {
    /// The command was decided and answered (accepted or refused).
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// The writer thread has stopped (shutdown or a fatal log error); the
    /// command's outcome is unknown if it was already sent.
    #[error("the engine has stopped; the command was not taken")]
    Stopped,
    /// The command was decided and written, but the log failed before the
    /// write was durable: it may or may not be in the log until the engine
    /// restarts and re-reads it. The writer has stopped.
    #[error("the outcome is unknown until the engine restarts and re-reads the log: {0}")]
    OutcomeUnknown(#[source] Arc<EngineError>),
    /// The writer thread could not be started: the engine takes no command.
    #[error("the engine's writer thread could not be started: {0}")]
    NoWriter(#[source] Arc<std::io::Error>),
    /// The command creates a batch or jobs, and their ids come from
    /// ZooKeeper (adoption mode), which could not give them: nothing was
    /// decided; retry later (HTTP 503).
    #[error("no ids for the new items: {0} (in adoption mode ids come from ZooKeeper's sequential counters)")]
    Ids(#[source] IdError),
}

impl EngineHandle {
    /// Why a call found the writer gone: it never started, or it stopped.
    fn gone(&self) -> ServiceError {
        self.no_writer
            .clone()
            .map_or(ServiceError::Stopped, ServiceError::NoWriter)
    }
}

impl EngineService {
    /// Starts the writer thread over an opened engine (a single engine: it
    /// takes every command).
    pub fn start(engine: Engine) -> EngineService {
        Self::start_with(engine, false)
    }

    /// Starts the writer thread of one engine of a replicated group: it
    /// takes commands only while it leads ([`EngineHandle::lead`]), and
    /// imports the leader's records otherwise ([`EngineHandle::import`]).
    pub fn start_replicated(engine: Engine) -> EngineService {
        Self::start_with(engine, true)
    }

    fn start_with(engine: Engine, replicated: bool) -> EngineService {
        let (tx, rx) = mpsc::channel(4096);
        let published = Arc::new(Published::new(engine.state().clone()));
        let mut handle = EngineHandle {
            tx,
            ids: Arc::default(),
            published: Arc::clone(&published),
            log: engine.shared_log(),
            lifecycle: Arc::new(engine.lifecycle().clone()),
            data_dir: Arc::new(engine.data_dir().to_path_buf()),
            startup: engine.startup.elapsed,
            no_writer: None,
        };
        let thread = match std::thread::Builder::new()
            .name("ingest-writer".into())
            .spawn(move || writer_loop(engine, rx, published, replicated))
        {
            Ok(thread) => Some(thread),
            Err(e) => {
                tracing::error!(error = %e, "cannot start the engine's writer thread: no command will be taken");
                handle.no_writer = Some(Arc::new(e));
                None
            }
        };
        EngineService { handle, thread }
    }

    /// A handle for callers.
    pub fn handle(&self) -> EngineHandle {
        self.handle.clone()
    }

    /// Stops taking commands, answers every command already queued, and
    /// joins the writer. Later calls on any handle get [`ServiceError::Stopped`].
    pub async fn shutdown(mut self) {
        let _ = self.handle.tx.send(Msg::Shutdown).await;
        if let Some(t) = self.thread.take() {
            let _ = tokio::task::spawn_blocking(move || t.join()).await;
        }
    }
}

fn writer_loop(
    mut engine: Engine,
    mut rx: mpsc::Receiver<Msg>,
    published: Arc<Published>,
    replicated: bool,
) {
    let mut group: Vec<Request> = Vec::with_capacity(MAX_GROUP);
    let mut stopping = false;
    while !stopping {
        let mut controls = Vec::new();
        match rx.blocking_recv() {
            Some(Msg::Command(r)) => group.push(*r),
            Some(Msg::Shutdown) | None => stopping = true,
            Some(other) => controls.push(other),
        }
        // Take what else is queued, so it shares this flush; on shutdown, take
        // everything so no queued caller is left without an answer.
        while stopping || group.len() < MAX_GROUP {
            match rx.try_recv() {
                Ok(Msg::Command(r)) => group.push(*r),
                Ok(Msg::Shutdown) => stopping = true,
                Ok(other) => {
                    controls.push(other);
                    break;
                }
                Err(_) => break,
            }
        }
        if stopping {
            rx.close();
            while let Ok(msg) = rx.try_recv() {
                match msg {
                    Msg::Command(r) => group.push(*r),
                    other => controls.push(other),
                }
            }
        }
        let taking = !replicated || engine.is_replicating();
        if taking {
            if !commit_group(&mut engine, &mut group, &published) {
                return;
            }
        } else {
            for r in group.drain(..) {
                let _ = r.reply.send(Err(EngineError::NotLeader.into()));
            }
        }
        for control in controls {
            if !control_message(&mut engine, control, &published) {
                return;
            }
        }
        published.leading.send_if_modified(|leading| {
            let now = engine.is_replicating();
            std::mem::replace(leading, now) != now
        });
        if (!replicated || engine.is_replicating()) && !housekeeping(&mut engine, &published) {
            return;
        }
        if replicated && !engine.is_replicating() {
            // Followers keep snapshots too (checkpoints are the leader's).
            engine.maybe_snapshot();
        }
    }
    // The next start-up folds nothing when the state at the stop is saved.
    engine.snapshot_if_advanced();
    tracing::info!("the writer stopped");
}

/// Imports records or changes the role. Returns false when the writer
/// must stop (the log or the state cannot go on).
fn control_message(engine: &mut Engine, msg: Msg, published: &Published) -> bool {
    match msg {
        Msg::Import(frame, reply) => {
            let imported = engine.import(&frame).and_then(|records| {
                if let Some(last) = records.last() {
                    engine.wait_durable(last.envelope.position)?;
                }
                Ok(records)
            });
            match imported {
                Ok(records) => {
                    publish(published, records.iter());
                    let _ = reply.send(Ok(engine.state().position));
                    true
                }
                Err(e @ (EngineError::Import(_) | EngineError::NotLeader)) => {
                    // Nothing was written: the state still matches the log.
                    let _ = reply.send(Err(e));
                    true
                }
                Err(e) => {
                    tracing::error!(error = %e, "copied records could not be made durable or folded; the writer stops (restart the engine to re-read the log)");
                    let _ = reply.send(Err(e));
                    false
                }
            }
        }
        Msg::Role(replicator, reply) => {
            let leads = replicator.is_some();
            engine.set_replicator(replicator);
            // Published before the reply: a caller that watches `leading`
            // right after `set_role` returns must not see the old role.
            published.leading.send_if_modified(|leading| {
                let now = engine.is_replicating();
                std::mem::replace(leading, now) != now
            });
            tracing::info!(
                leading = leads,
                position = engine.state().position,
                "the writer's role changed"
            );
            let _ = reply.send(());
            true
        }
        Msg::Command(r) => {
            let _ = r.reply.send(Err(EngineError::NotLeader.into()));
            true
        }
        Msg::Shutdown => true,
    }
}

/// Between groups: a signed checkpoint and a snapshot when they are due.
/// Returns false when the writer must stop (the checkpoint could not be
/// made durable).
fn housekeeping(engine: &mut Engine, published: &Published) -> bool {
    match engine.maybe_checkpoint() {
        Ok(None) => {}
        Ok(Some(outcome)) => {
            let last = outcome.records.last().map_or(0, |r| r.envelope.position);
            if let Err(e) = engine.wait_durable(last) {
                tracing::error!(error = %e, "a signed checkpoint could not be made durable; the writer stops (restart the engine to re-read the log)");
                return false;
            }
            publish(published, outcome.records.iter());
            tracing::debug!(position = last, "signed checkpoint appended");
        }
        Err(EngineError::Log(e @ LogError::Storage(_))) => {
            tracing::error!(error = %e, "a signed checkpoint could not be written; the writer stops (restart the engine to re-read the log)");
            return false;
        }
        Err(e) => tracing::warn!(error = %e, "no signed checkpoint this time"),
    }
    // Everything folded is durable here: the group and the checkpoint were
    // flushed before this point.
    engine.maybe_snapshot();
    true
}

/// Decides and stages every command of the group, writes them in one batch,
/// waits for one flush, publishes and answers. Returns false when the writer
/// must stop.
fn commit_group(engine: &mut Engine, group: &mut Vec<Request>, published: &Published) -> bool {
    let requests: Vec<Request> = std::mem::take(group);
    let commands: Vec<(Actor, Uuid, Command)> = requests
        .iter()
        .map(|r| (r.actor.clone(), r.correlation_id, r.command.clone()))
        .collect();
    let replies: Vec<_> = requests.into_iter().map(|r| r.reply).collect();
    let written = engine
        .execute_group(&commands)
        .and_then(|(outcomes, last)| {
            if let Some(last) = last {
                engine.wait_durable(last)?;
            }
            Ok((outcomes, last))
        });
    let (outcomes, last) = match written {
        Ok(x) => x,
        Err(e) => {
            tracing::error!(error = %e, "the group could not be made durable; the writer stops (restart the engine to re-read the log)");
            let e = Arc::new(e);
            for reply in replies {
                let _ = reply.send(Err(ServiceError::OutcomeUnknown(Arc::clone(&e))));
            }
            return false;
        }
    };
    if let Some(last) = last {
        publish(
            published,
            outcomes
                .iter()
                .filter_map(|o| o.as_ref().ok())
                .flat_map(|o| o.records.iter()),
        );
        tracing::debug!(commands = outcomes.len(), durable = last, "group committed");
    }
    for (reply, outcome) in replies.into_iter().zip(outcomes) {
        let _ = reply.send(outcome.map_err(ServiceError::from));
    }
    true
}

fn publish<'a>(published: &Published, records: impl Iterator<Item = &'a Recorded>) {
    let mut state = published.state.write().unwrap_or_else(|e| e.into_inner());
    publish_into(&mut state, published, records);
    let position = state.position;
    published.position.send_if_modified(|p| {
        let moved = *p != position;
        *p = position;
        moved
    });
}

fn publish_into<'a>(
    state: &mut State,
    published: &Published,
    records: impl Iterator<Item = &'a Recorded>,
) {
    let mut touched: BTreeSet<Bid> = BTreeSet::new();
    for r in records {
        if let Err(e) = state.apply(r) {
            // The writer applied the same records to its own state already.
            tracing::error!(error = %e, "published state diverged from the writer's");
        }
        if let StreamId::Batch(bid) = r.envelope.stream {
            touched.insert(bid);
        }
    }
    if touched.is_empty() {
        return;
    }
    // Under the state's write lock, so the two never disagree for long.
    let mut reporting = published
        .reporting
        .write()
        .unwrap_or_else(|e| e.into_inner());
    for bid in touched {
        for set in reporting.values_mut() {
            set.remove(&bid);
        }
        if let Some(b) = state.batches.get(&bid).filter(|b| is_reporting(b.status)) {
            reporting.entry(b.status).or_default().insert(bid);
        }
    }
}

impl EngineHandle {
    /// Sends a command and waits for its answer (after its events are durable).
    ///
    /// # Errors
    /// [`ServiceError::Engine`] for a refused command or a log failure,
    /// [`ServiceError::Stopped`] when the writer is gone.
    pub async fn execute(&self, actor: Actor, command: Command) -> Result<Outcome, ServiceError> {
        self.execute_correlated(actor, Uuid::new_v4(), command)
            .await
    }

    /// As [`EngineHandle::execute`], with the caller's correlation id.
    ///
    /// # Errors
    /// See [`EngineHandle::execute`].
    pub async fn execute_correlated(
        &self,
        actor: Actor,
        correlation_id: Uuid,
        command: Command,
    ) -> Result<Outcome, ServiceError> {
        let command = self.with_ids(command).await?;
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Msg::Command(Box::new(Request {
                actor,
                correlation_id,
                command,
                reply,
            })))
            .await
            .map_err(|_| self.gone())?;
        rx.await.map_err(|_| self.gone())?
    }

    /// From now on, new batches and jobs take their ids from `source`
    /// (adoption mode); a second call changes nothing.
    pub fn share_ids_with(&self, source: Arc<dyn IdSource>) {
        let _ = self.ids.set(source);
    }

    /// `command` with the ids of the batch or jobs it creates, when ids
    /// are shared ([`EngineHandle::share_ids_with`]); else as it is.
    async fn with_ids(&self, command: Command) -> Result<Command, ServiceError> {
        let Some(source) = self.ids.get() else {
            return Ok(command);
        };
        let (kind, n, floor) = {
            let state = self.state();
            match &command {
                Command::SubmitBatch { .. } => (IdKind::Batch, 1, state.next_bid().0),
                Command::AcquireBatch { jobs, .. } if !jobs.is_empty() => {
                    (IdKind::Job, jobs.len(), state.next_jid().0)
                }
                Command::CreateJob { .. } => (IdKind::Job, 1, state.next_jid().0),
                _ => return Ok(command),
            }
        };
        let ids = source
            .reserve(kind, n, floor)
            .await
            .map_err(ServiceError::Ids)?;
        Ok(Command::WithIds {
            ids,
            command: Box::new(command),
        })
    }

    /// Writes records copied from the leader (a frame) through the writer,
    /// after checking them against the log; returns the position applied.
    ///
    /// # Errors
    /// [`ServiceError::Engine`] with [`EngineError::Import`] when they do not
    /// continue the log (nothing written), [`ServiceError::Stopped`].
    pub async fn import(&self, frame: Vec<u8>) -> Result<u64, ServiceError> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Msg::Import(frame, reply))
            .await
            .map_err(|_| self.gone())?;
        Ok(rx.await.map_err(|_| self.gone())??)
    }

    /// Leads a replicated group through `replicator` (`None`: follow). The
    /// writer takes it between two groups.
    ///
    /// # Errors
    /// [`ServiceError::Stopped`].
    pub async fn set_role(
        &self,
        replicator: Option<Box<dyn Replicator>>,
    ) -> Result<(), ServiceError> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Msg::Role(replicator, reply))
            .await
            .map_err(|_| self.gone())?;
        rx.await.map_err(|_| self.gone())
    }

    /// Whether the writer leads a replicated group, each time it changes
    /// (a failed replicated write makes it stop leading by itself).
    pub fn leading(&self) -> watch::Receiver<bool> {
        self.published.leading.subscribe()
    }

    /// The position of the published state, each time it moves.
    pub fn position(&self) -> watch::Receiver<u64> {
        self.published.position.subscribe()
    }

    /// Waits (at most `timeout`) until the published state reaches
    /// `position`; returns the position reached.
    pub async fn wait_for_position(&self, position: u64, timeout: std::time::Duration) -> u64 {
        let mut rx = self.position();
        let reached = tokio::time::timeout(timeout, rx.wait_for(|p| *p >= position))
            .await
            .ok()
            .and_then(Result::ok)
            .map(|p| *p);
        reached.unwrap_or_else(|| *rx.borrow())
    }

    /// Reads the published (durable) state.
    pub fn state(&self) -> RwLockReadGuard<'_, State> {
        self.published
            .state
            .read()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// The batches of the published state in `status`, oldest first, at
    /// most `limit`, and whether there are more; `None` for a status that
    /// is not a reporting one (Reporting, UpdateReporting). It reads an
    /// index the writer keeps: its cost follows the batches in that status,
    /// not every batch ever submitted.
    pub fn reporting_batches(&self, status: BatchState, limit: usize) -> Option<(Vec<Bid>, bool)> {
        if !is_reporting(status) {
            return None;
        }
        let index = self
            .published
            .reporting
            .read()
            .unwrap_or_else(|e| e.into_inner());
        let Some(set) = index.get(&status) else {
            return Some((Vec::new(), false));
        };
        let bids: Vec<Bid> = set.iter().take(limit).copied().collect();
        Some((bids, set.len() > limit))
    }

    /// The log, for history and the projector.
    pub fn log(&self) -> &Arc<Log> {
        &self.log
    }

    /// The lifecycle enforced.
    pub fn lifecycle(&self) -> &Lifecycle {
        &self.lifecycle
    }

    /// The data directory (the log, the snapshots).
    pub fn data_dir(&self) -> &std::path::Path {
        &self.data_dir
    }

    /// Whether the writer thread still takes commands (it stops on
    /// shutdown and on a log error it cannot go on after, such as a full
    /// disk).
    pub fn is_running(&self) -> bool {
        !self.tx.is_closed()
    }

    /// Queue-wide figures of the published state, as `ingest status` shows
    /// them.
    pub fn status_view(&self) -> ingest_protocol::view::StatusView {
        crate::engine::status_view(&self.log, &self.state(), &self.data_dir, self.startup)
    }
}
