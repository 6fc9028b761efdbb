//! Projecting the log's records and applying them in `multi` transactions:
//! planning, the checkpoint compare-and-set, unknown outcomes, and the
//! worker locks of finished jobs.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use ingest_events::log::LogError;
use zookeeper_client as zk;

use super::adopt::TreeWatch;
use super::foreign::{Item, MAX_REPAIRS};
use super::model::Meta;
use super::runner::{Exit, Runner, MAX_PENDING_EVENTS, READ_CHUNK};
use super::{RunMode, SinkError};
use crate::checkpoint::{Checkpoint, Partial, CHECKPOINT_NODE};
use crate::layout;
use crate::ops::Op;
use crate::txn::{self, TxnPlan};
use crate::zk::{call, ZkError, ZkErrorKind};

/// An operation of a transaction, by reference, to name it on failure.
enum Sent {
    /// The checkpoint write.
    Checkpoint,
    /// A worker's lock deleted with its parent.
    Lock(String),
    /// `pending[event].ops[index]`.
    Op(usize, usize),
}

impl Runner {
    /// Projects the record at `position` into the pending queue.
    pub(super) fn project_next(&mut self, position: u64) -> Result<(), Exit> {
        let r = self.log.read_one(position)?;
        let (ops, before) = self.model.projector.project_traced(&r)?;
        self.model.push(
            ops,
            before,
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
                let (ops, before) = self.model.projector.project_traced(&r)?;
                self.model.push(
                    ops,
                    before,
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
    pub(super) async fn project(
        &mut self,
        client: &zk::Client,
        mut version: i32,
    ) -> Result<Exit, Exit> {
        // Parents whose `lock` child must go with them (see the module docs).
        let mut lock_parents: BTreeSet<String> = BTreeSet::new();
        // Followed while idle: with nothing to project no request fails, so
        // a session that lost its server would otherwise go unnoticed (and
        // `/readyz` said ready through a whole outage).
        let mut session = client.state_watcher();
        // The pause and hold locks: watched, then checked once (a change
        // between the check and the watch would be missed the other way
        // round).
        // Only a sink that can record its repairs makes them (`ingest
        // project` has no engine to record through: it stops on drift).
        let repairs = self.cfg.foreign.is_some();
        let mut locks: super::foreign::LockWatch = if repairs {
            let watch = self.watch_locks(client).await?;
            version = self.check_locks(client, version).await?;
            watch
        } else {
            Box::pin(std::future::pending())
        };
        // Adoption mode: `/jobs` and `/batches` are watched; what another
        // client writes is handled between transactions once the tree is
        // quiet.
        let converger = self.cfg.converge.clone().filter(|_| repairs);
        // A tree projected by an older release converges while this one
        // serves (only a sink that records its repairs rewrites items).
        if repairs {
            self.upgrade_if_needed(client).await?;
        }
        let mut tree = match (repairs, self.cfg.adopt.is_some()) {
            (true, true) => self.watch_tree(client).await?,
            _ => TreeWatch::none(),
        };
        loop {
            if self.shutdown.is_cancelled() {
                return Ok(Exit::Done);
            }
            if futures_ready(&mut locks).await {
                locks = self.watch_locks(client).await?;
                version = self.check_locks(client, version).await?;
            }
            tree.drain().await;
            self.read_new_locks(client, &mut tree).await;
            if let Some(events) = tree.take_due() {
                version = self
                    .handle_tree_events(client, version, events, &mut tree.holders)
                    .await?;
                for (kind, path) in std::mem::take(&mut self.redo) {
                    tree.again(kind, path);
                }
            }
            if repairs {
                version = self.converge_some(client, version).await?;
            }
            let limit = self.limit();
            if self.model.pending.is_empty() && self.model.projector.position() >= limit {
                self.publish();
                if self.mode == RunMode::CatchUp {
                    return Ok(Exit::Done);
                }
                if self.converging.is_some() {
                    continue;
                }
                self.reflect_session(session.peek_state())?;
                tracing::debug!(root = %self.cfg.zk.root, position = limit, "caught up; following the log");
                let due = tree.due();
                let mut fired = None;
                tokio::select! {
                    r = self.durable.changed() => {
                        if r.is_err() {
                            return Ok(Exit::Done);
                        }
                    }
                    // Re-read at the top of the loop.
                    _ = session.changed() => {}
                    // Checked at the top of the loop.
                    _ = &mut locks => {
                        locks = Box::pin(std::future::ready(()));
                    }
                    event = tree.next() => fired = Some(event),
                    // Handled at the top of the loop.
                    _ = sleep_until(due) => {}
                    // Taken at the top of the loop.
                    _ = converge_asked(&converger) => {}
                    _ = self.shutdown.cancelled() => return Ok(Exit::Done),
                }
                if let Some(event) = fired {
                    tree.push(event);
                }
                continue;
            }
            // One transaction at a time under the gate's shared side: a
            // reader holding the gate sees no checkpoint move.
            let gate = Arc::clone(&self.cfg.gate.lock);
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
            let add = super::runner::multi_add;
            add(
                w.add_set_data(CHECKPOINT_NODE, &end.to_json(), Some(version)),
                CHECKPOINT_NODE,
            )?;
            sent.push(Sent::Checkpoint);
            let access = &self.cfg.zk.access;
            // The adopted pause and hold locks, as the tree has them.
            let mut adopted: BTreeMap<&str, bool> = self
                .adopted_locks
                .iter()
                .map(|(p, (_, exists))| (p.as_str(), *exists))
                .collect();
            for seg in &plan.segments {
                for i in seg.ops.clone() {
                    let op = &self.model.pending[seg.event].ops[i];
                    if let Some(exists) = adopted.get_mut(op.path()) {
                        match op {
                            Op::Create { path, data } if *exists => {
                                add(w.add_set_data(path, data, None), path)?;
                                sent.push(Sent::Op(seg.event, i));
                                continue;
                            }
                            Op::Delete { .. } if !*exists => continue,
                            _ => {}
                        }
                        *exists = !matches!(op, Op::Delete { .. });
                    }
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
                    self.repair_streak.clear();
                    // Adopted events now in the tree need no silent repair.
                    let applied = end.position;
                    self.adopted.retain(|_, p| *p > applied);
                    self.adopted_batches.retain(|_, p| *p > applied);
                    self.adopted_access.retain(|_, p| *p > applied);
                    self.adopted_locks.retain(|_, (p, _)| *p > applied);
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
                    let drift = matches!(
                        source,
                        zk::Error::NodeExists
                            | zk::Error::NoNode
                            | zk::Error::NotEmpty
                            | zk::Error::BadVersion
                    );
                    let failed_path = match sent.get(index) {
                        Some(Sent::Op(e, i)) => {
                            Some(self.model.pending[*e].ops[*i].path().to_string())
                        }
                        Some(Sent::Lock(p)) => Some(p.clone()),
                        _ => None,
                    };
                    let state = self.model.projector.state();
                    let item = failed_path.as_deref().and_then(|p| {
                        Item::of(p, |uuid| {
                            uuid.parse().ok().and_then(|u| state.uuids.get(&u).copied())
                        })
                    });
                    if let (true, true, Some(item)) = (repairs, drift, item) {
                        let repaired = self.repair_streak.entry(item.name()).or_default();
                        if *repaired < MAX_REPAIRS {
                            *repaired += 1;
                            projected_ahead?;
                            let reason = format!(
                                "`{op}` failed ({source}) in the projector's transaction for positions {first}..={last}"
                            );
                            if self
                                .repair_item(
                                    client,
                                    version,
                                    &item,
                                    failed_path.as_deref(),
                                    &reason,
                                )
                                .await?
                            {
                                version += 1;
                            }
                            continue;
                        }
                    }
                    if drift || matches!(source, zk::Error::BadArguments(_)) {
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

/// Sleeps until `at` (never, for `None`).
async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Whether a watch future has completed, without waiting for it (a
/// completed one is replaced by a ready future, to be set again).
async fn futures_ready(watch: &mut super::foreign::LockWatch) -> bool {
    tokio::select! {
        biased;
        _ = &mut *watch => true,
        _ = std::future::ready(()) => false,
    }
}

/// Completes when a convergence request may have come; never without a
/// converger.
async fn converge_asked(converger: &Option<super::work::Converger>) {
    match converger {
        Some(c) => c.wait().await,
        None => std::future::pending().await,
    }
}
