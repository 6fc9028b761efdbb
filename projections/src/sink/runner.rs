//! The sink's loop: sessions, leadership, standing by, the base nodes, and
//! resuming from the checkpoint (see the parent module's docs).

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use ingest_events::codec::GENESIS_HASH;
use ingest_events::log::{Log, LogError};
use ingest_events::Hash;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use zookeeper_client as zk;

use super::model::Model;
use super::{read_checkpoint, RunMode, SinkConfig, SinkError, SinkReport, SinkState, SinkStatus};
use crate::checkpoint::{Checkpoint, Partial, RebuildMarker, CHECKPOINT_NODE, REBUILDING_NODE};
use crate::layout;
use crate::leader::{self, Leadership};
use crate::projector::{ProjectError, Projector};
use crate::zk::{call, ZkError, ZkErrorKind};

// ---------------------------------------------------------------------------

/// Capped exponential backoff with a little jitter.
#[derive(Debug, Default)]
pub(super) struct Backoff {
    pub(super) initial: Duration,
    pub(super) max: Duration,
    pub(super) next: Duration,
}

impl Backoff {
    pub(super) fn new(initial: Duration, max: Duration) -> Backoff {
        Backoff {
            initial,
            max,
            next: initial,
        }
    }

    pub(super) fn delay(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(self.max);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|t| t.subsec_nanos())
            .unwrap_or(0);
        // Up to a quarter more, so several projectors do not retry in step.
        d + d.mul_f64(f64::from(nanos % 1000) / 4000.0)
    }

    pub(super) fn reset(&mut self) {
        self.next = self.initial;
    }
}

#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Counters {
    pub(super) transactions: u64,
    pub(super) events: u64,
    pub(super) ops: u64,
    pub(super) conflicts: u64,
}

/// Why one round of serving a session ended.
pub(super) enum Exit {
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
pub(super) const READ_CHUNK: u64 = 512;
/// Events projected ahead of the tree at most (events without operations
/// add no bytes, so the byte cap alone would not bound the queue).
pub(super) const MAX_PENDING_EVENTS: usize = 8192;

pub(super) struct Runner {
    pub(super) log: Arc<Log>,
    pub(super) cfg: SinkConfig,
    pub(super) identity: String,
    pub(super) status: watch::Sender<SinkStatus>,
    pub(super) durable: watch::Receiver<u64>,
    pub(super) shutdown: CancellationToken,
    pub(super) mode: RunMode,
    /// For [`RunMode::CatchUp`]: the durable position at the start.
    pub(super) target: u64,
    pub(super) model: Model,
    /// The last checkpoint read while standing by.
    pub(super) seen_checkpoint: Option<Checkpoint>,
    pub(super) backoff: Backoff,
    pub(super) counters: Counters,
    /// Conflicts since the last committed transaction.
    pub(super) conflict_streak: u32,
    /// Foreign-change repairs of each item (by name) since the last
    /// committed transaction: one transaction may hold many items another
    /// client changed (a stream of adopted acquisitions), each repaired
    /// once; only an item repaired [`super::foreign::MAX_REPAIRS`] times
    /// stops the projector.
    pub(super) repair_streak: std::collections::HashMap<String, u32>,
    /// Jobs whose foreign status change the engine adopted, with the
    /// position of the adopted event: until that event is in the tree, a
    /// repair of the job is silent (the adopted event is the record).
    pub(super) adopted: std::collections::BTreeMap<ingest_events::Jid, u64>,
    /// The same for batches another client created (mrt-zk's
    /// `createBatch`): until the adopted submission is in the tree, the
    /// batch's nodes are not another client's to report.
    pub(super) adopted_batches: std::collections::BTreeMap<ingest_events::Bid, u64>,
    /// Jobs removed by another client while their finished batch stays:
    /// judged with the batch's removal, or alone once no job of that batch
    /// was removed for [`super::adopt_delete::DEFER_DELETE`].
    pub(super) deferred_jobs: std::collections::HashSet<ingest_events::Jid>,
    /// When a job of each such batch was last seen removed.
    pub(super) deleting_batches:
        std::collections::HashMap<ingest_events::Bid, tokio::time::Instant>,
    /// Tree events to handle again with the next round (those deferred).
    pub(super) redo: Vec<(zookeeper_client::EventType, String)>,
    /// The same for access requests whose foreign status change the
    /// engine adopted.
    pub(super) adopted_access: std::collections::BTreeMap<ingest_events::Qid, u64>,
    /// The same for pause and hold locks another client made or removed,
    /// and the nodes of a batch another client created, by path, with
    /// whether the node existed when it was adopted: until
    /// the adopted event is in the tree, the projector's create of such a
    /// node that exists is a set and its delete of one that is gone is
    /// left out (so the node never flips back and forth).
    pub(super) adopted_locks: std::collections::BTreeMap<String, (u64, bool)>,
    pub(super) ever_connected: bool,
    /// The convergence request being worked through (see `converge`).
    pub(super) converging: Option<super::work::Work>,
}

impl Runner {
    pub(super) fn root(&self) -> String {
        self.cfg.zk.root.clone()
    }

    pub(super) fn deadline(&self) -> Duration {
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

    pub(super) fn set_state(&mut self, state: SinkState) {
        self.status.send_modify(|s| s.state = state);
        self.publish();
    }

    /// While idle: shows a session that lost its server as `Disconnected`
    /// (and `Connected` again once it is back); a session that ended is an
    /// I/O exit, so a new one is made.
    pub(super) fn reflect_session(&mut self, session: zk::SessionState) -> Result<(), Exit> {
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
    pub(super) fn publish(&mut self) {
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

    pub(super) async fn main(&mut self) -> Result<SinkReport, SinkError> {
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
}
/// An operation added to a `multi`, or the client's refusal of it (an
/// invalid path: nothing was sent).
pub(super) fn multi_add(r: Result<(), zk::Error>, what: &str) -> Result<(), Exit> {
    r.map_err(|e| {
        Exit::Fatal(SinkError::Zk(ZkError::new(
            "multi",
            what.to_string(),
            ZkErrorKind::Server(e),
        )))
    })
}

impl Runner {
    /// A `multi` whose first operation sets the checkpoint to the applied
    /// one (same data) if its version is still `version`: every write of
    /// the sink outside its own transactions (a repair, the layout) is
    /// fenced this way.
    pub(super) fn fenced_multi<'a>(
        &self,
        client: &'a zk::Client,
        version: i32,
    ) -> Result<zk::MultiWriter<'a>, Exit> {
        let mut w = client.new_multi_writer();
        multi_add(
            w.add_set_data(
                CHECKPOINT_NODE,
                &self.model.applied.to_json(),
                Some(version),
            ),
            CHECKPOINT_NODE,
        )?;
        Ok(w)
    }
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
