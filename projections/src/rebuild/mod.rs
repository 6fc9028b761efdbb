//! Rebuild, diff and repair of the live tree: comparing it with the tree the
//! log says it should be, and converging it in place.
//!
//! ## Which position a diff compares with
//! The live tree is compared with the log **at its checkpoint**, not at the
//! log's head. The sink's one promise is "the tree holds exactly the events
//! up to the checkpoint"; a projector that is merely behind (ZooKeeper was
//! away, a backlog is being applied) is not drift, and comparing with the
//! head would report every unprojected event as a difference. When the
//! projector is caught up the two positions are the same. The tree is read
//! between two reads of the checkpoint's version and read again if a
//! projector moved it meanwhile.
//!
//! ## Converging in place (rebuild and repair)
//! ZooKeeper has no atomic rename and Merritt's workers use fixed paths
//! (`/jobs/states/…`, `/jobs/JID/…`), so building into a fresh root and
//! switching over would need every worker to move with it, and a rename done
//! node by node would show workers half-moved queues. The tree is therefore
//! converged where it is:
//! 1. take leadership (a running projector stands by and cannot write: every
//!    transaction here also bumps the checkpoint's version);
//! 2. compute the tree the log says, read the live tree, diff them (worker
//!    lock nodes are not compared);
//! 3. group the differences by what they belong to: each job's nodes (its
//!    `/jobs/JID/…` nodes, its queue reference `/jobs/states/*/PP-JID` and its
//!    batch set child `/batches/BID/states/batch-*/JID`) form one unit, each
//!    batch's own nodes another, the rest a third kind; units are ordered so
//!    parents exist before children and children go before parents (batch
//!    and base creations and updates, then the jobs, then batch and base
//!    deletions), and packed whole into `multi` transactions, so a worker
//!    never sees a job in two queues or none (DESIGN.md invariant 6);
//! 4. every transaction first sets the checkpoint, version-checked, to the
//!    old checkpoint marked `rebuilding`: a projector that finds the mark
//!    while it leads knows the rebuild died half-way and refuses to project;
//!    up to [`AdminConfig::in_flight`] transactions are sent before the
//!    first is answered (ZooKeeper keeps a session's order; each expects the
//!    version the one before leaves), and a refused one makes those behind
//!    it fail on that version, which costs a round, not a fence;
//! 5. read the tree again and repeat until it matches (a lock taken or a
//!    node changed meanwhile only costs a round), then write the final
//!    checkpoint, which clears the mark.
//!
//! A rebuild (not a repair) also marks the tree for everyone: before its
//! first change one transaction marks the checkpoint, writes
//! `/ingest-engine/rebuilding` ([`RebuildMarker`]: who, when, the target
//! position and its hash) and pauses the queue for Merritt's readers
//! (`/locks/queue/ingest`, left out of the comparison while it runs); the
//! final transaction sets the checkpoint, removes the marker and leaves the
//! pause as the log says (an admin's pause stays). A rebuild killed
//! half-way leaves marker and pause: `diff` reports the tree incomplete, the
//! next `rebuild` finishes it (a marker naming a position of this log lets
//! it go on over a foreign checkpoint it was forced over), and a projector
//! that leads with a [`crate::sink::Resumer`] (`serve`, `project`) finishes
//! it before projecting, its status `Rebuilding` meanwhile.
//!
//! `--force` re-takes a tree whose checkpoint is not this log's (foreign,
//! ahead, or not a checkpoint): [`preview`] says what would change first.
//!
//! Worker locks are left alone, except a lock under a node that must be
//! deleted (a job the log does not have): it is deleted in the same
//! transaction as its parent, and reported; and a stale lock (a
//! `/jobs/JID/lock` or `/batches/BID/lock` no session owns, which would
//! block its item for ever) is deleted, version-checked, and reported among
//! the changed paths, so a repair's `TreeRepaired` event names it. A rebuild records nothing in the
//! log: it restores what the log says. A repair is recorded by the caller
//! (the engine's `RecordRepair` command) with the paths it changed.

use std::time::{Duration, Instant};

use ingest_events::codec::GENESIS_HASH;
use ingest_events::log::{Log, LogError};
use ingest_events::{Hash, Recorded};
use zookeeper_client as zk;

use crate::checkpoint::{Checkpoint, RebuildMarker, CHECKPOINT_NODE, REBUILDING_NODE};
use crate::layout;
use crate::leader;
use crate::projector::Projector;
use crate::sink::{read_checkpoint, SinkError};
use crate::tree::{Tree, TreeDiff};
use crate::txn::TxnLimits;
use crate::zk::{call, connect, read_tree, LiveTree, ReadOptions, ZkConfig};

mod converge;
mod diff;
mod plan;
mod run;

pub use converge::secure;
pub use diff::{compare, diff, preview, read_checkpointed, LiveRead, Preview};
pub use run::{rebuild, repair, Resume};

/// How rebuild and repair run.
#[derive(Debug, Clone)]
pub struct AdminConfig {
    /// The server and the root.
    pub zk: ZkConfig,
    /// Who is doing it (written to the leader node and the checkpoint mark).
    pub identity: String,
    /// Caps of each transaction.
    pub limits: TxnLimits,
    /// How long to wait for a running projector to give up leadership.
    pub leader_wait: Duration,
    /// Rebuild even when the tree's checkpoint belongs to another log.
    pub force: bool,
    /// A pause after each transaction (tests only: a rebuild slow enough
    /// to be killed half-way; it also sends one transaction at a time).
    pub txn_pause: Duration,
    /// Transactions sent before the first is answered (at least 1): a
    /// round trip each, one after another, left ZooKeeper idle most of the
    /// time. Each may hold up to [`TxnLimits::max_bytes`] on the server.
    pub in_flight: usize,
}

/// Transactions in flight by default (see [`AdminConfig::in_flight`]).
pub const IN_FLIGHT: usize = 8;

impl AdminConfig {
    /// Default caps, a 10 s leadership wait, no force.
    pub fn new(zk: ZkConfig, identity: impl Into<String>) -> AdminConfig {
        AdminConfig {
            zk,
            identity: identity.into(),
            limits: TxnLimits::default(),
            leader_wait: Duration::from_secs(10),
            force: false,
            txn_pause: Duration::ZERO,
            in_flight: IN_FLIGHT,
        }
    }
}

/// Progress of a long operation, for a progress bar.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// Projecting the log: `done` of `total` events.
    Projecting {
        /// Events projected.
        done: u64,
        /// Events to project.
        total: u64,
    },
    /// Reading the live tree: nodes read so far (reported once read).
    Reading {
        /// Nodes read.
        nodes: usize,
    },
    /// Writing: `done` of `total` operations of this round.
    Applying {
        /// Operations applied.
        done: usize,
        /// Operations planned.
        total: usize,
    },
}

/// What a diff found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiffReport {
    /// The tree's checkpoint (`None`: the root was never projected).
    pub checkpoint: Option<Checkpoint>,
    /// The position compared with.
    pub position: u64,
    /// The differences, the log's tree taken as the expected one.
    pub diff: TreeDiff,
    /// Nodes the log's tree has.
    pub expected_nodes: usize,
    /// Nodes read from ZooKeeper (without `/ingest-engine`).
    pub live_nodes: usize,
    /// Worker locks seen (not compared).
    pub locks: Vec<String>,
    /// Stale locks: `/jobs/JID/lock` or `/batches/BID/lock` nodes that no
    /// session owns (persistent, left by a crashed tool or an admin). They
    /// block their item for ever; a repair or rebuild removes them.
    pub stale_locks: Vec<String>,
    /// The live tree as read (what the consistency rules read too, so a
    /// report names one tree).
    pub live: LiveTree,
    /// A rebuild that did not finish (what its marker says): the tree may
    /// be partial and the queue is paused until a rebuild finishes it.
    pub rebuilding: Option<String>,
}

impl DiffReport {
    /// Whether the live tree differs from the log's, holds a stale lock,
    /// or is marked as rebuilding.
    pub fn has_drift(&self) -> bool {
        !self.diff.is_empty() || !self.stale_locks.is_empty() || self.rebuilding.is_some()
    }
}

/// The worker lock nodes of `live` that no session owns: a lock a worker
/// holds is always ephemeral, so a persistent one is stale. (A lock whose
/// session has ended goes with the session: ZooKeeper removes it when the
/// session expires.)
pub fn stale_locks(live: &LiveTree) -> Vec<String> {
    live.tree
        .iter()
        .map(|(p, _)| p)
        .filter(|p| layout::is_ephemeral_lock(p) && !live.ephemeral.contains_key(*p))
        .map(str::to_string)
        .collect()
}

/// What converging the tree did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConvergeReport {
    /// Nodes created.
    pub created: usize,
    /// Nodes whose data was set.
    pub set: usize,
    /// Nodes deleted.
    pub deleted: usize,
    /// Transactions committed.
    pub transactions: usize,
    /// Rounds of read, diff, apply.
    pub rounds: usize,
    /// Every path changed, sorted.
    pub paths: Vec<String>,
    /// Worker locks deleted with their parent (a node the log does not have).
    pub locks_deleted: Vec<String>,
    /// Worker locks left in place.
    pub locks_kept: usize,
    /// Stale (non-ephemeral) worker locks removed; also in `paths`.
    pub stale_locks_removed: Vec<String>,
}

/// What a rebuild did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RebuildReport {
    /// The checkpoint before (`None` when the root had none).
    pub previous: Option<Checkpoint>,
    /// The checkpoint written at the end.
    pub checkpoint: Checkpoint,
    /// Nodes the log's tree has.
    pub expected_nodes: usize,
    /// The changes.
    pub converge: ConvergeReport,
    /// Nodes whose ACL was set (with credentials only; 0 for an open tree):
    /// every node the projection owns and the engine's own.
    pub secured: usize,
    /// Whether a rebuild that had not finished was found (and finished).
    pub resumed: bool,
}

/// What a repair did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepairReport {
    /// The checkpoint (unchanged by the repair).
    pub checkpoint: Checkpoint,
    /// The changes.
    pub converge: ConvergeReport,
}

fn hash_at(log: &Log, position: u64) -> Result<Hash, SinkError> {
    if position == 0 {
        return Ok(GENESIS_HASH);
    }
    Ok(log.read_one(position)?.envelope.hash)
}

/// Checks that `cp` belongs to this log.
///
/// # Errors
/// [`SinkError::CheckpointAhead`] or [`SinkError::ForeignTree`].
pub fn check_checkpoint(log: &Log, root: &str, cp: &Checkpoint) -> Result<(), SinkError> {
    let durable = log.durable_position();
    let last = cp.partial.map_or(cp.position, |p| p.position);
    if last > durable {
        return Err(SinkError::CheckpointAhead {
            root: root.to_string(),
            position: last,
            durable,
        });
    }
    let hash = hash_at(log, cp.position)?;
    if hash != cp.hash {
        return Err(SinkError::ForeignTree {
            root: root.to_string(),
            position: cp.position,
            tree_hash: cp.hash_hex(),
            log_hash: hex::encode(hash),
        });
    }
    Ok(())
}

/// The tree the log says the root holds at `cp`: every event up to its
/// position, plus the applied parts of a partly applied event.
///
/// # Errors
/// [`SinkError::Log`] or [`SinkError::Project`].
pub fn expected_tree(
    log: &Log,
    cp: &Checkpoint,
    progress: &mut dyn FnMut(Progress),
) -> Result<Tree, SinkError> {
    let mut projector = Projector::new();
    projector.init()?;
    let total = cp.position;
    // Reading and decoding the records (most of a fold's cost) on a thread
    // of their own while this one projects them: two cores, not one.
    std::thread::scope(|scope| -> Result<(), SinkError> {
        let (chunks, received) =
            std::sync::mpsc::sync_channel::<Vec<Result<Recorded, LogError>>>(DECODED_CHUNKS_AHEAD);
        scope.spawn(move || {
            let mut chunk = Vec::with_capacity(DECODED_CHUNK);
            for r in log.read_range(1, cp.position) {
                let failed = r.is_err();
                chunk.push(r);
                if chunk.len() == DECODED_CHUNK || failed {
                    // The projecting side stopped (an error): so does this.
                    if chunks.send(std::mem::take(&mut chunk)).is_err() || failed {
                        return;
                    }
                }
            }
            if !chunk.is_empty() {
                let _ = chunks.send(chunk);
            }
        });
        for chunk in received {
            for r in chunk {
                projector.project(&r?)?;
                let done = projector.position();
                if done % 1000 == 0 || done == total {
                    progress(Progress::Projecting { done, total });
                }
            }
        }
        Ok(())
    })?;
    let Some(partial) = cp.partial else {
        return Ok(projector.into_tree());
    };
    let mut tree = projector.tree().clone();
    let record = log.read_one(partial.position)?;
    let ops = projector.project(&record)?;
    for part in ops.parts().into_iter().take(partial.parts) {
        tree.apply_all(part).map_err(|source| {
            SinkError::Project(crate::ProjectError::Defect {
                position: partial.position,
                kind: record.event.kind(),
                source,
            })
        })?;
    }
    Ok(tree)
}

/// Records decoded per hand-over from the reading thread to the projecting
/// one in [`expected_tree`].
const DECODED_CHUNK: usize = 1024;
/// Chunks the reading thread may decode ahead of the projection.
const DECODED_CHUNKS_AHEAD: usize = 8;

/// Opens a session and takes leadership, waiting up to `leader_wait`.
async fn lead(cfg: &AdminConfig) -> Result<zk::Client, SinkError> {
    cfg.zk
        .validate()
        .map_err(|e| SinkError::Config(e.to_string()))?;
    let client = connect(&cfg.zk).await?;
    let identity = format!("{} ({})", cfg.identity, crate::sink::instance_tag());
    match leader::acquire_within(
        &client,
        &identity,
        &cfg.zk.access,
        cfg.zk.request_timeout,
        cfg.leader_wait,
    )
    .await?
    {
        Ok(()) => Ok(client),
        Err(leader::HeldBy(holder)) => Err(SinkError::NotLeader {
            root: cfg.zk.root.clone(),
            holder,
        }),
    }
}

/// The checkpoint and its version, creating the node (at position 0) when
/// missing.
async fn checkpoint_or_genesis(
    client: &zk::Client,
    cfg: &ZkConfig,
) -> Result<(Option<Checkpoint>, Checkpoint, i32), SinkError> {
    if let Some((cp, v)) = read_checkpoint(client, cfg).await? {
        return Ok((Some(cp.clone()), cp, v));
    }
    let genesis = Checkpoint::genesis();
    match call(
        cfg.request_timeout,
        "create",
        CHECKPOINT_NODE,
        client.create(
            CHECKPOINT_NODE,
            &genesis.to_json(),
            &cfg.access.acl(CHECKPOINT_NODE).persistent(),
        ),
    )
    .await
    {
        Ok(_) => {}
        Err(e) if e.code() == Some(&zk::Error::NodeExists) => {}
        Err(e) => return Err(e.into()),
    }
    match read_checkpoint(client, cfg).await? {
        Some((cp, v)) => Ok((None, cp, v)),
        None => Err(SinkError::Fenced {
            root: cfg.root.clone(),
            what: "rebuild",
        }),
    }
}

/// The rebuild marker: `None` when absent, `Some(None)` when unreadable.
///
/// # Errors
/// A ZooKeeper error.
pub async fn read_marker(
    client: &zk::Client,
    cfg: &ZkConfig,
) -> Result<Option<Option<RebuildMarker>>, SinkError> {
    match call(
        cfg.request_timeout,
        "get_data",
        REBUILDING_NODE,
        client.get_data(REBUILDING_NODE),
    )
    .await
    {
        Ok((data, _)) => Ok(Some(RebuildMarker::from_json(&data))),
        Err(e) if e.code() == Some(&zk::Error::NoNode) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Reads the live tree, reading again when the connection broke on the
/// way (a busy server that paused), for as long as the session may live.
async fn read_live(client: &zk::Client, cfg: &ZkConfig) -> Result<LiveTree, SinkError> {
    let until = Instant::now() + cfg.session_timeout * 2;
    let mut delay = Duration::from_millis(100);
    loop {
        match read_tree(client, cfg, ReadOptions::default()).await {
            Ok(live) => return Ok(live),
            Err(e) if e.is_unknown_outcome() && Instant::now() < until => {
                tracing::warn!(error = %e, "cannot read the live tree; reading it again");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(2));
            }
            Err(e) => return Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests;
