//! Nodes another ZooKeeper client changed: the projector converges the
//! nodes of that one item (a job, a batch, an access request, a pause or
//! hold lock) back to what the applied checkpoint says, in a fenced
//! transaction of its own, records what it found, and goes on.
//!
//! ## When
//! - A transaction of the projector fails on an operation (`NoNode`,
//!   `NodeExists`, `NotEmpty`, `BadVersion`) whose path belongs to an item:
//!   that item is converged, then the transaction is planned again. Other
//!   items wait only for that one repair.
//! - The pause and hold locks (`/locks/queue/ingest`,
//!   `/locks/queue/accessSmall|accessLarge`, `/locks/collections/*`) are
//!   watched: Merritt's readers act on them at once, so a foreign create or
//!   delete is reverted as soon as the watch fires, between transactions.
//!
//! A path that belongs to no item (a base node, the root) still stops the
//! projector with [`SinkError::Drift`], as does an item that does not
//! converge after [`MAX_REPAIRS`] rounds (something keeps writing it).
//!
//! ## What "the log's view" is
//! The tree the applied checkpoint names: the projector's model with the
//! pending (projected, not applied) operations undone through their
//! pre-images ([`super::model::Model::applied_data`]). The repair moves the
//! checkpoint's version (same data), so it is fenced exactly like every
//! other transaction of the sink, and each repaired node is written with a
//! version check against what was read, so a client writing at the same
//! moment makes the repair fail and be read again, never overwrites it.
//!
//! ## What is recorded
//! A [`ForeignChangeRepaired`] per repaired item, through the
//! [`RecordForeign`] hook (the engine appends it; the projection never
//! writes the log): each node's kind (missing, changed, extra), its path,
//! the data found (cut to [`ForeignNode::MAX_FOUND_BYTES`]), its `mzxid` and
//! `mtime`, and for an ephemeral node the owning session. ZooKeeper keeps no
//! writer's session for a persistent node: the zxid is what finds it in the
//! servers' transaction logs.

use std::collections::{BTreeMap, BTreeSet};

use ingest_events::event::{
    AccessQueue, ForeignChangeKind, ForeignChangeRepaired, ForeignNode, StreamId,
};
use ingest_events::lifecycle::StateKind;
use ingest_events::{Bid, JobState};
use zookeeper_client as zk;

pub(super) use super::item::{found_text, Item};
use super::runner::{Exit, Runner};
use super::SinkError;
use crate::checkpoint::CHECKPOINT_NODE;
use crate::layout::{self, BatchSet};
use crate::zk::{call, ZkError, ZkErrorKind};

/// Repairs of one item in a row, without a transaction of events
/// committing, after which the projector stops: something keeps writing
/// that item.
pub(super) const MAX_REPAIRS: u32 = 8;

/// The most nodes one item's repair reads.
const MAX_ITEM_NODES: usize = 4096;

/// Records a repair in the log (implemented by the server over the engine,
/// which appends a `ForeignChangeRepaired` on the item's stream).
pub trait RecordForeign: Send + Sync {
    /// Called once per repaired item, after its transaction committed.
    /// Must not block: the projector waits for nothing.
    fn record(&self, stream: StreamId, repaired: ForeignChangeRepaired);
}

/// A shared [`RecordForeign`].
#[derive(Clone)]
pub struct ForeignRecorder(pub std::sync::Arc<dyn RecordForeign>);

impl std::fmt::Debug for ForeignRecorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ForeignRecorder")
    }
}

/// The paths to compare for one item.
#[derive(Debug, Default)]
struct Scope {
    /// Read with everything below them.
    roots: Vec<String>,
    /// Read alone.
    singles: BTreeSet<String>,
    /// Created when missing, never deleted here (a batch's set nodes,
    /// shared by its jobs).
    create_only: BTreeSet<String>,
}

/// A node read back.
struct Found {
    data: Vec<u8>,
    stat: zk::Stat,
}

/// One write of a repair.
enum Fix {
    Create(String, Vec<u8>),
    Set(String, Vec<u8>, i32),
    Delete(String, i32),
}

/// The queue pause lock paths: the ingest queue's, then each access queue's.
pub(super) fn queue_locks() -> Vec<String> {
    let mut out = vec![layout::QUEUE_LOCK.to_string()];
    out.extend(
        AccessQueue::ALL
            .iter()
            .map(|q| layout::access_queue_lock(*q)),
    );
    out
}

/// A watch on the pause and hold locks: completes when one may have changed.
pub(super) type LockWatch = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

impl Runner {
    /// The paths of `item`'s nodes.
    fn scope(&self, item: &Item, failed: Option<&str>) -> Scope {
        let state = self.model.projector.state();
        let mut s = Scope::default();
        match item {
            Item::Job(jid) => {
                s.roots.push(layout::job(*jid));
                let mut priorities: BTreeSet<u8> = BTreeSet::new();
                let mut bids: BTreeSet<Bid> = BTreeSet::new();
                if let Some(j) = state.jobs.get(jid) {
                    priorities.insert(j.priority);
                    bids.insert(j.bid);
                }
                for p in [layout::job_priority(*jid), layout::job_bid(*jid)] {
                    if let Some(d) = self.model.applied_data(&p) {
                        let text = String::from_utf8_lossy(&d);
                        if let Ok(n) = text.trim().parse::<u8>() {
                            priorities.insert(n);
                        }
                        if let Ok(b) = text.trim().parse::<Bid>() {
                            bids.insert(b);
                        }
                    }
                }
                // The failed path itself (a reference under another priority).
                if let Some(f) = failed {
                    let parts: Vec<&str> = f.trim_start_matches('/').split('/').collect();
                    match parts.as_slice() {
                        ["jobs", "states", _, name] => {
                            if let Some(n) = name.split_once('-').and_then(|(p, _)| p.parse().ok())
                            {
                                priorities.insert(n);
                            }
                        }
                        ["batches", b, "states", _, _] => {
                            if let Ok(b) = b.parse() {
                                bids.insert(b);
                            }
                        }
                        _ => {}
                    }
                }
                for state in JobState::ALL {
                    for p in &priorities {
                        s.singles.insert(layout::queue_ref(*state, *p, *jid));
                    }
                }
                for bid in bids {
                    s.create_only.insert(layout::batch_states(bid));
                    for set in BatchSet::ALL {
                        s.create_only.insert(layout::batch_set(bid, set));
                        s.singles.insert(layout::batch_child(bid, set, *jid));
                    }
                }
            }
            Item::Batch(bid) => {
                s.roots.push(layout::batch(*bid));
                if let Some(b) = state.batches.get(bid) {
                    s.singles.insert(layout::batch_uuid(&b.uuid));
                }
            }
            Item::Access(q, qid) => s.roots.push(layout::access(*q, *qid)),
            Item::Lock(p) | Item::Node(p) => {
                s.singles.insert(p.clone());
            }
        }
        s
    }

    /// Reads the live nodes of `scope` (ephemeral worker locks left out).
    async fn read_scope(
        &self,
        client: &zk::Client,
        scope: &Scope,
    ) -> Result<BTreeMap<String, Found>, Exit> {
        let mut out = BTreeMap::new();
        // (path, read its children too): the singles alone, the roots with
        // everything below them.
        let mut queue: Vec<(String, bool)> = scope
            .singles
            .iter()
            .chain(&scope.create_only)
            .map(|p| (p.clone(), false))
            .chain(scope.roots.iter().map(|p| (p.clone(), true)))
            .collect();
        while !queue.is_empty() {
            let batch: Vec<(String, bool)> = queue.drain(..queue.len().min(128)).collect();
            let mut reader = client.new_multi_reader();
            for (p, below) in &batch {
                reader
                    .add_get_data(p)
                    .and_then(|()| match below {
                        true => reader.add_get_children(p),
                        false => Ok(()),
                    })
                    .map_err(|e| ZkError::new("multi-read", p.clone(), ZkErrorKind::Server(e)))?;
            }
            let results = call(
                self.deadline(),
                "multi-read",
                "an item's nodes",
                reader.commit(),
            )
            .await?;
            let mut results = results.into_iter();
            for (p, below) in &batch {
                let data = results.next();
                let children = if *below { results.next() } else { None };
                let Some(zk::MultiReadResult::Data { data, stat }) = data else {
                    continue;
                };
                if let Some(zk::MultiReadResult::Children { children }) = children {
                    queue.extend(children.iter().map(|c| (format!("{p}/{c}"), true)));
                }
                out.insert(p.clone(), Found { data, stat });
            }
            if out.len() + queue.len() > MAX_ITEM_NODES {
                return Err(SinkError::Drift {
                    root: self.root(),
                    first: self.model.applied.position,
                    last: self.model.applied.position,
                    op: format!("read {}", scope.roots.join(", ")),
                    error: format!("more than {MAX_ITEM_NODES} nodes under one item"),
                }
                .into());
            }
        }
        out.retain(|p, _| !layout::is_ephemeral_lock(p));
        Ok(out)
    }

    /// The paths of `item`'s nodes the applied checkpoint has, and those of
    /// its nodes the live tree has (ephemeral worker locks left out).
    pub(super) async fn item_nodes(
        &self,
        client: &zk::Client,
        item: &Item,
    ) -> Result<(Vec<String>, BTreeSet<String>), Exit> {
        let scope = self.scope(item, None);
        let live: BTreeSet<String> = self.read_scope(client, &scope).await?.into_keys().collect();
        let mut paths: BTreeSet<String> = scope.singles.clone();
        paths.extend(scope.create_only.iter().cloned());
        for root in &scope.roots {
            paths.extend(self.model.paths_under(root));
        }
        let expected = paths
            .into_iter()
            .filter(|p| !layout::is_ephemeral_lock(p) && self.model.applied_data(p).is_some())
            .collect();
        Ok((expected, live))
    }

    /// Converges `item`'s nodes to the applied checkpoint's view in one
    /// transaction fenced on the checkpoint (`version`) and records what
    /// was found. `Ok(true)`: repaired (the checkpoint's version moved by
    /// one); `Ok(false)`: the item's nodes already match, or changed again
    /// while being repaired (read again next time).
    pub(super) async fn repair_item(
        &mut self,
        client: &zk::Client,
        version: i32,
        item: &Item,
        failed: Option<&str>,
        reason: &str,
    ) -> Result<bool, Exit> {
        // A job whose foreign status change the engine adopted: its nodes
        // are put back silently, the adopted event (recorded with the
        // client as actor) being the record.
        let adopted = match item {
            Item::Job(j) => self.adopted.remove(j).is_some(),
            Item::Batch(b) => self.adopted_batches.remove(b).is_some(),
            Item::Access(_, q) => self.adopted_access.remove(q).is_some(),
            Item::Lock(p) => self.adopted_locks.remove(p).is_some(),
            _ => false,
        };
        let scope = self.scope(item, failed);
        let live = self.read_scope(client, &scope).await?;
        let mut expected: BTreeMap<String, Vec<u8>> = BTreeMap::new();
        let mut paths: BTreeSet<String> = scope.singles.clone();
        paths.extend(scope.create_only.iter().cloned());
        for root in &scope.roots {
            paths.extend(self.model.paths_under(root));
        }
        for p in paths {
            if layout::is_ephemeral_lock(&p) {
                continue;
            }
            if let Some(d) = self.model.applied_data(&p) {
                expected.insert(p, d);
            }
        }
        let mut nodes: Vec<ForeignNode> = Vec::new();
        let mut deletes: Vec<Fix> = Vec::new();
        let mut sets: Vec<Fix> = Vec::new();
        let mut creates: Vec<Fix> = Vec::new();
        let all: BTreeSet<&String> = live.keys().chain(expected.keys()).collect();
        for p in all {
            let node = |kind, found: Option<&Found>| ForeignNode {
                kind,
                path: p.clone(),
                found: found.map(|f| found_text(&f.data)).unwrap_or_default(),
                zxid: found.map_or(0, |f| f.stat.mzxid),
                mtime: found.map_or(0, |f| f.stat.mtime),
                session: found.map_or(0, |f| f.stat.ephemeral_owner),
            };
            match (expected.get(p), live.get(p)) {
                (Some(want), None) => {
                    nodes.push(node(ForeignChangeKind::Missing, None));
                    creates.push(Fix::Create(p.clone(), want.clone()));
                }
                (None, Some(f)) if !scope.create_only.contains(p) => {
                    nodes.push(node(ForeignChangeKind::Extra, Some(f)));
                    deletes.push(Fix::Delete(p.clone(), f.stat.version));
                }
                (Some(want), Some(f)) if *want != f.data => {
                    nodes.push(node(ForeignChangeKind::Changed, Some(f)));
                    sets.push(Fix::Set(p.clone(), want.clone(), f.stat.version));
                }
                _ => {}
            }
        }
        if nodes.is_empty() {
            return Ok(false);
        }
        // Children before parents when deleting, parents first when creating.
        deletes.reverse();
        let mut w = self.fenced_multi(client, version)?;
        let add = super::runner::multi_add;
        let access = &self.cfg.zk.access;
        for fix in deletes.iter().chain(&sets).chain(&creates) {
            match fix {
                Fix::Delete(p, v) => add(w.add_delete(p, Some(*v)), p)?,
                Fix::Set(p, d, v) => add(w.add_set_data(p, d, Some(*v)), p)?,
                Fix::Create(p, d) => add(w.add_create(p, d, &access.acl(p).persistent()), p)?,
            }
        }
        let deadline = self.deadline();
        match tokio::time::timeout(deadline, w.commit()).await {
            Ok(Ok(_)) => {}
            Ok(Err(zk::MultiWriteError::OperationFailed { index: 0, source })) => {
                return Err(match source {
                    zk::Error::BadVersion => Exit::Conflict,
                    zk::Error::NoNode => Exit::Retry,
                    other => {
                        ZkError::new("multi", CHECKPOINT_NODE, ZkErrorKind::Server(other)).into()
                    }
                });
            }
            Ok(Err(zk::MultiWriteError::OperationFailed { index, source })) => {
                tracing::info!(
                    root = %self.cfg.zk.root,
                    item = %item.name(),
                    index,
                    error = %source,
                    "a node of an item being repaired changed again; reading it again"
                );
                return Ok(false);
            }
            Ok(Err(zk::MultiWriteError::RequestFailed { source })) => {
                return Err(ZkError::new("multi", item.name(), ZkErrorKind::Server(source)).into());
            }
            Err(_) => {
                return Err(
                    ZkError::new("multi", item.name(), ZkErrorKind::Timeout(deadline)).into(),
                );
            }
        }
        // Nodes adopted but not yet written by their event: the tree now
        // has them as the repair left them.
        for fix in deletes.iter().chain(&creates) {
            let (p, exists) = match fix {
                Fix::Delete(p, _) => (p, false),
                Fix::Create(p, _) => (p, true),
                Fix::Set(..) => continue,
            };
            if let Some((_, e)) = self.adopted_locks.get_mut(p) {
                *e = exists;
            }
        }
        if adopted {
            tracing::info!(
                root = %self.cfg.zk.root,
                item = %item.name(),
                nodes = nodes.len(),
                "converged the nodes of an item whose foreign change was adopted"
            );
            return Ok(true);
        }
        let shown: Vec<String> = nodes
            .iter()
            .take(4)
            .map(|n| format!("{} {}", n.kind, n.path))
            .collect();
        tracing::warn!(
            root = %self.cfg.zk.root,
            item = %item.name(),
            nodes = nodes.len(),
            found = %shown.join(", "),
            reason = %ingest_protocol::bounded(reason),
            "another ZooKeeper client changed nodes of this item; converged them back to the log and recorded it"
        );
        if let Some(rec) = &self.cfg.foreign {
            nodes.truncate(ingest_events::command::MAX_FOREIGN_NODES);
            rec.0.record(
                item.stream(),
                ForeignChangeRepaired {
                    item: item.name(),
                    nodes,
                    reason: ingest_protocol::cut(reason, 512).into_owned(),
                },
            );
        }
        Ok(true)
    }

    /// Sets watches on the pause and hold locks.
    pub(super) async fn watch_locks(&self, client: &zk::Client) -> Result<LockWatch, Exit> {
        let exists = |p: String| async move {
            call(
                self.deadline(),
                "exists+watch",
                &p,
                client.check_and_watch_stat(&p),
            )
            .await
            .map(|(_, w)| w)
        };
        let ingest = exists(layout::QUEUE_LOCK.to_string()).await?;
        let small = exists(layout::access_queue_lock(AccessQueue::Small)).await?;
        let large = exists(layout::access_queue_lock(AccessQueue::Large)).await?;
        let (_, _, holds) = call(
            self.deadline(),
            "get_children+watch",
            layout::LOCKS_COLLECTIONS,
            client.get_and_watch_children(layout::LOCKS_COLLECTIONS),
        )
        .await?;
        Ok(Box::pin(async move {
            tokio::select! {
                _ = ingest.changed() => {}
                _ = small.changed() => {}
                _ = large.changed() => {}
                _ = holds.changed() => {}
            }
        }))
    }

    /// Converges every pause and hold lock that differs from the log.
    /// Returns the checkpoint version after the repairs.
    pub(super) async fn check_locks(
        &mut self,
        client: &zk::Client,
        mut version: i32,
    ) -> Result<i32, Exit> {
        // Between transactions, as every write of the sink (see `ProjectorGate`).
        let gate = std::sync::Arc::clone(&self.cfg.gate.lock);
        let _turn = tokio::select! {
            turn = gate.read_owned() => turn,
            _ = self.shutdown.cancelled() => return Ok(version),
        };
        let mut paths: BTreeSet<String> = queue_locks().into_iter().collect();
        paths.extend(
            self.model
                .paths_under(layout::LOCKS_COLLECTIONS)
                .into_iter()
                .filter(|p| p != layout::LOCKS_COLLECTIONS),
        );
        let children = call(
            self.deadline(),
            "get_children",
            layout::LOCKS_COLLECTIONS,
            client.list_children(layout::LOCKS_COLLECTIONS),
        )
        .await?;
        paths.extend(
            children
                .iter()
                .map(|c| format!("{}/{c}", layout::LOCKS_COLLECTIONS)),
        );
        for p in paths {
            let reason = match self.adopt_lock(client, &p).await? {
                Some(super::adopt::LockAdoption::Adopted) => continue,
                Some(super::adopt::LockAdoption::Refused(why)) => why,
                None => "a watch on the pause and hold locks fired".to_string(),
            };
            if self
                .repair_item(client, version, &Item::Lock(p), None, &reason)
                .await?
            {
                version += 1;
            }
        }
        Ok(version)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ingest_events::{Jid, Qid};

    #[test]
    fn paths_name_their_item() {
        let none = |_: &str| None;
        let j = Jid(7);
        let b = Bid(3);
        for (path, item) in [
            ("/jobs/jid0000000007", Some(Item::Job(j))),
            ("/jobs/jid0000000007/status", Some(Item::Job(j))),
            ("/jobs/states/pending/05-jid0000000007", Some(Item::Job(j))),
            (
                "/batches/bid0000000003/states/batch-processing/jid0000000007",
                Some(Item::Job(j)),
            ),
            ("/batches/bid0000000003", Some(Item::Batch(b))),
            (
                "/batches/bid0000000003/states/batch-failed",
                Some(Item::Batch(b)),
            ),
            (
                "/access/small/qid0000000002/status",
                Some(Item::Access(AccessQueue::Small, Qid(2))),
            ),
            (
                "/locks/queue/ingest",
                Some(Item::Lock("/locks/queue/ingest".into())),
            ),
            (
                "/locks/collections/demo",
                Some(Item::Lock("/locks/collections/demo".into())),
            ),
            // Base nodes and what the projection does not own: no item.
            ("/jobs/states/pending", None),
            ("/jobs", None),
            ("/locks/queue", None),
            ("/locks/storage/ark_a_b", None),
            ("/jobs/states/pending/05-nonsense", None),
            ("/batch-uuids/unknown", None),
        ] {
            assert_eq!(Item::of(path, none), item, "{path}");
        }
        assert_eq!(
            Item::of("/batch-uuids/u-1", |u| (u == "u-1").then_some(b)),
            Some(Item::Batch(b))
        );
    }

    #[test]
    fn found_data_is_bounded_and_printable() {
        let long = "é".repeat(ForeignNode::MAX_FOUND_BYTES);
        let t = found_text(long.as_bytes());
        assert!(t.len() <= ForeignNode::MAX_FOUND_BYTES && t.starts_with('é'));
        assert_eq!(found_text(b"a\nb\x00\xff"), "a?b?\u{fffd}");
    }
}
