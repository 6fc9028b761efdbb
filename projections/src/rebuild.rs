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

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use ingest_events::codec::GENESIS_HASH;
use ingest_events::log::{Log, LogError};
use ingest_events::{Bid, Hash, Recorded};
use zookeeper_client as zk;

use crate::checkpoint::{Checkpoint, RebuildMarker, CHECKPOINT_NODE, REBUILDING_NODE};
use crate::layout;
use crate::leader;
use crate::ops::{Op, TRANSACTION_OVERHEAD};
use crate::projector::Projector;
use crate::sink::{read_checkpoint, SinkError};
use crate::tree::{Tree, TreeDiff};
use crate::txn::TxnLimits;
use crate::zk::{call, connect, read_tree, LiveTree, ReadOptions, ZkConfig, ZkError};

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

/// Compares the live tree under `zk.root` with the log at the tree's
/// checkpoint (see the module docs), ignoring `/ingest-engine` and worker
/// locks.
///
/// # Errors
/// [`SinkError::Zk`] on I/O; [`SinkError::ForeignTree`] /
/// [`SinkError::CheckpointAhead`] when the tree is not this log's;
/// [`SinkError::Busy`] when a projector kept moving the checkpoint.
pub async fn diff(
    log: &Log,
    zk_config: &ZkConfig,
    progress: &mut (dyn FnMut(Progress) + Send),
) -> Result<DiffReport, SinkError> {
    zk_config.validate().map_err(SinkError::Config)?;
    let client = connect(zk_config).await?;
    let mut snapshot = None;
    for _ in 0..5 {
        let before = read_checkpoint(&client, zk_config).await?;
        let live = read_tree(&client, zk_config, ReadOptions::default()).await?;
        progress(Progress::Reading {
            nodes: live.tree.len(),
        });
        let after = read_checkpoint(&client, zk_config).await?;
        if before.as_ref().map(|(_, v)| *v) == after.as_ref().map(|(_, v)| *v) {
            snapshot = Some((after.map(|(cp, _)| cp), live));
            break;
        }
    }
    let Some((checkpoint, live)) = snapshot else {
        return Err(SinkError::Busy {
            root: zk_config.root.clone(),
        });
    };
    let rebuilding = match read_marker(&client, zk_config).await? {
        Some(Some(m)) => Some(m.to_string()),
        Some(None) => Some("an unreadable rebuild marker".to_string()),
        None => checkpoint
            .as_ref()
            .and_then(|c| c.rebuilding.as_ref())
            .map(|by| format!("a rebuild or repair by {}", ingest_protocol::cut(by, 200))),
    };
    let at = checkpoint.clone().unwrap_or_else(Checkpoint::genesis);
    let at = Checkpoint {
        rebuilding: None,
        ..at
    };
    check_checkpoint(log, &zk_config.root, &at)?;
    let expected = expected_tree(log, &at, progress)?;
    let diff = expected.diff_filtered(&live.tree, layout::is_owned);
    let stale = stale_locks(&live);
    let locks = live
        .tree
        .iter()
        .map(|(p, _)| p)
        .filter(|p| layout::is_ephemeral_lock(p) && !stale.iter().any(|s| s == p))
        .map(str::to_string)
        .collect();
    Ok(DiffReport {
        checkpoint,
        position: at.position,
        expected_nodes: expected.len(),
        live_nodes: live.tree.len(),
        diff,
        locks,
        stale_locks: stale,
        live,
        rebuilding,
    })
}

/// What a forced rebuild would change, computed before it takes anything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Preview {
    /// What the checkpoint node holds now, in words (bounded).
    pub checkpoint: String,
    /// The log position the rebuild would bring the tree to.
    pub target: u64,
    /// The changes: `missing` would be created, `differing` set,
    /// `unexpected` deleted (worker locks and `/ingest-engine` left out).
    pub diff: TreeDiff,
    /// Stale (non-ephemeral) worker locks it would remove.
    pub stale_locks: Vec<String>,
}

/// Computes what [`rebuild`] would change in the live tree now, writing
/// nothing and taking no leadership (so a projector may still move the
/// tree meanwhile; the rebuild itself converges whatever it finds).
///
/// # Errors
/// [`SinkError::Zk`] when ZooKeeper cannot be read.
pub async fn preview(
    log: &Log,
    zk_config: &ZkConfig,
    progress: &mut (dyn FnMut(Progress) + Send),
) -> Result<Preview, SinkError> {
    zk_config.validate().map_err(SinkError::Config)?;
    let client = connect(zk_config).await?;
    let checkpoint = match read_checkpoint(&client, zk_config).await {
        Ok(Some((cp, _))) => match check_checkpoint(
            log,
            &zk_config.root,
            &Checkpoint {
                rebuilding: None,
                ..cp.clone()
            },
        ) {
            Ok(()) => format!("{cp} (this log's)"),
            Err(e) => format!("{cp}: {e}"),
        },
        Ok(None) => "none (never projected)".to_string(),
        Err(e @ SinkError::BadCheckpoint { .. }) => e.to_string(),
        Err(e) => return Err(e),
    };
    let live = read_tree(&client, zk_config, ReadOptions::default()).await?;
    progress(Progress::Reading {
        nodes: live.tree.len(),
    });
    let target = log.durable_position();
    let expected = expected_tree(
        log,
        &Checkpoint::at(target, hash_at(log, target)?),
        progress,
    )?;
    Ok(Preview {
        checkpoint: ingest_protocol::cut(&checkpoint, 600).into_owned(),
        target,
        diff: expected.diff_filtered(&live.tree, layout::is_owned),
        stale_locks: stale_locks(&live),
    })
}

/// Opens a session and takes leadership, waiting up to `leader_wait`.
async fn lead(cfg: &AdminConfig) -> Result<zk::Client, SinkError> {
    cfg.zk.validate().map_err(SinkError::Config)?;
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
        Err(holder) => Err(SinkError::NotLeader {
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

/// Rebuilds the live tree from the log, up to the log's durable position,
/// converging it in place (see the module docs), and sets the checkpoint.
///
/// # Errors
/// [`SinkError::NotLeader`] when a projector keeps leadership;
/// [`SinkError::ForeignTree`] / [`SinkError::CheckpointAhead`] unless
/// `force`; [`SinkError::Zk`] on I/O (retrying is safe).
pub async fn rebuild(
    log: &Log,
    cfg: &AdminConfig,
    progress: &mut (dyn FnMut(Progress) + Send),
) -> Result<RebuildReport, SinkError> {
    let client = lead(cfg).await?;
    let result = rebuild_led(&client, log, cfg, progress).await;
    let _ = leader::release(&client, cfg.zk.request_timeout).await;
    result
}

async fn rebuild_led(
    client: &zk::Client,
    log: &Log,
    cfg: &AdminConfig,
    progress: &mut (dyn FnMut(Progress) + Send),
) -> Result<RebuildReport, SinkError> {
    let (previous, current, mut version) = match checkpoint_or_genesis(client, &cfg.zk).await {
        Err(SinkError::BadCheckpoint { .. }) if cfg.force => {
            // Not a checkpoint at all: with --force, overwritten like any
            // other foreign one (version-checked from here on).
            let stat = call(
                cfg.zk.request_timeout,
                "exists",
                CHECKPOINT_NODE,
                client.check_stat(CHECKPOINT_NODE),
            )
            .await?
            .ok_or_else(|| SinkError::Fenced {
                root: cfg.zk.root.clone(),
                what: "rebuild",
            })?;
            (None, Checkpoint::genesis(), stat.version)
        }
        r => r?,
    };
    let marker = read_marker(client, &cfg.zk).await?;
    // A rebuild of this log that died half-way: its marker names a position
    // of this log, and the checkpoint may still be a foreign one it was
    // forced over.
    let ours = match &marker {
        Some(Some(m)) => {
            m.target <= log.durable_position() && hex::encode(hash_at(log, m.target)?) == m.hash
        }
        _ => false,
    };
    if let Some(Some(m)) = &marker {
        if m.forced && !cfg.force {
            return Err(SinkError::ForcedRebuildUnfinished {
                root: cfg.zk.root.clone(),
                marker: m.to_string(),
            });
        }
    }
    if let Some(m) = &marker {
        let what = m.as_ref().map_or_else(
            || "an unreadable rebuild marker".to_string(),
            ToString::to_string,
        );
        tracing::warn!(root = %cfg.zk.root, marker = %what, resumed = ours, "finishing a rebuild that did not finish");
    }
    if previous.is_some() && !cfg.force && !ours {
        let plain = Checkpoint {
            rebuilding: None,
            ..current.clone()
        };
        check_checkpoint(log, &cfg.zk.root, &plain)?;
    }
    let target = log.durable_position();
    let target_hash = hash_at(log, target)?;
    let final_cp = Checkpoint::at(target, target_hash);
    tracing::info!(
        root = %cfg.zk.root,
        from = %current,
        position = target,
        "rebuilding the live tree from the log"
    );
    let expected = expected_tree(log, &final_cp, progress)?;
    let mark = current.rebuilding_by(&cfg.identity);
    let info = RebuildMarker {
        by: cfg.identity.clone(),
        started: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        target,
        hash: hex::encode(target_hash),
        forced: cfg.force,
    };
    begin(client, cfg, &mark, &info, marker.is_some(), &mut version).await?;
    // The pause is the rebuild's while it runs; at the end the tree gets
    // the pause the log says (an admin's pause stays).
    let paused = expected.contains(layout::QUEUE_LOCK);
    let finish = [
        Some(Op::delete(REBUILDING_NODE)),
        (!paused).then(|| Op::delete(layout::QUEUE_LOCK)),
    ];
    let finish: Vec<Op> = finish.into_iter().flatten().collect();
    let converge = converge(
        client,
        cfg,
        &expected,
        &mark,
        &mark,
        &final_cp,
        &mut version,
        "rebuild",
        Some(layout::QUEUE_LOCK),
        &finish,
        progress,
    )
    .await?;
    let secured = secure(client, &cfg.zk, &expected).await?;
    tracing::info!(
        root = %cfg.zk.root,
        position = target,
        secured,
        created = converge.created,
        set = converge.set,
        deleted = converge.deleted,
        transactions = converge.transactions,
        "rebuild done"
    );
    Ok(RebuildReport {
        previous,
        checkpoint: final_cp,
        expected_nodes: expected.len(),
        converge,
        secured,
        resumed: marker.is_some(),
    })
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

/// Marks the tree as rebuilding in one transaction: the checkpoint marked
/// (version-checked), `/ingest-engine/rebuilding` written, and the queue
/// paused for Merritt's readers (`/locks/queue/ingest`, with its parents
/// when a tree was never initialised).
async fn begin(
    client: &zk::Client,
    cfg: &AdminConfig,
    mark: &Checkpoint,
    info: &RebuildMarker,
    marker_exists: bool,
    version: &mut i32,
) -> Result<(), SinkError> {
    let deadline = cfg.zk.request_timeout;
    let pause_exists = call(
        deadline,
        "exists",
        layout::QUEUE_LOCK,
        client.check_stat(layout::QUEUE_LOCK),
    )
    .await?
    .is_some();
    // The pause's parents are base nodes the rebuild would create anyway.
    let mut parents = Vec::new();
    for p in [layout::LOCKS, layout::LOCKS_QUEUE] {
        if call(deadline, "exists", p, client.check_stat(p))
            .await?
            .is_none()
        {
            parents.push(p);
        }
    }
    let mut w = client.new_multi_writer();
    let add = |r: Result<(), zk::Error>, p: &str| {
        r.map_err(|e| ZkError::new("multi", p.to_string(), crate::zk::ZkErrorKind::Server(e)))
    };
    add(
        w.add_set_data(CHECKPOINT_NODE, &mark.to_json(), Some(*version)),
        CHECKPOINT_NODE,
    )?;
    let data = info.to_json();
    let acl = cfg.zk.access.acl(REBUILDING_NODE);
    if marker_exists {
        add(
            w.add_set_data(REBUILDING_NODE, &data, None),
            REBUILDING_NODE,
        )?;
    } else {
        add(
            w.add_create(REBUILDING_NODE, &data, &acl.persistent()),
            REBUILDING_NODE,
        )?;
    }
    for p in &parents {
        add(w.add_create(p, b"", &cfg.zk.access.acl(p).persistent()), p)?;
    }
    let pause_acl = cfg.zk.access.acl(layout::QUEUE_LOCK);
    if !pause_exists {
        add(
            w.add_create(layout::QUEUE_LOCK, b"", &pause_acl.persistent()),
            layout::QUEUE_LOCK,
        )?;
    }
    match tokio::time::timeout(deadline, w.commit()).await {
        Ok(Ok(_)) => {}
        Ok(Err(zk::MultiWriteError::OperationFailed { index: 0, .. })) => {
            return Err(SinkError::Fenced {
                root: cfg.zk.root.clone(),
                what: "rebuild",
            })
        }
        Ok(Err(zk::MultiWriteError::OperationFailed { index, source })) => {
            return Err(ZkError::new(
                "multi",
                format!("marking the rebuild (operation {index})"),
                crate::zk::ZkErrorKind::Server(source),
            )
            .into())
        }
        Ok(Err(zk::MultiWriteError::RequestFailed { source })) => {
            let e = ZkError::new(
                "multi",
                CHECKPOINT_NODE,
                crate::zk::ZkErrorKind::Server(source),
            );
            if !e.is_unknown_outcome() || !resolve(client, cfg, version, "rebuild").await? {
                return Err(e.into());
            }
        }
        Err(_) => {
            if !resolve(client, cfg, version, "rebuild").await? {
                return Err(ZkError::new(
                    "multi",
                    CHECKPOINT_NODE,
                    crate::zk::ZkErrorKind::Timeout(deadline),
                )
                .into());
            }
        }
    }
    *version += 1;
    tracing::info!(root = %cfg.zk.root, target = info.target, "marked the tree as rebuilding and paused the queue");
    Ok(())
}

/// Finishes an interrupted rebuild from a projector that leads (see
/// [`crate::sink::ResumeRebuild`]): the same rebuild, with the sink's session.
pub struct Resume {
    log: std::sync::Arc<Log>,
    cfg: AdminConfig,
}

impl Resume {
    /// A resumer rebuilding from `log` under `cfg` (its identity names the
    /// projector).
    pub fn new(log: std::sync::Arc<Log>, cfg: AdminConfig) -> Resume {
        Resume { log, cfg }
    }
}

impl crate::sink::ResumeRebuild for Resume {
    fn resume<'a>(
        &'a self,
        client: &'a zk::Client,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), SinkError>> + Send + 'a>>
    {
        Box::pin(async move {
            let report = rebuild_led(client, &self.log, &self.cfg, &mut |_| {}).await?;
            tracing::info!(
                root = %self.cfg.zk.root,
                checkpoint = %report.checkpoint,
                created = report.converge.created,
                set = report.converge.set,
                deleted = report.converge.deleted,
                "finished the interrupted rebuild"
            );
            Ok(())
        })
    }
}

/// Makes the live tree equal to the log at its checkpoint (the checkpoint
/// itself is unchanged), holding leadership. The caller records the repair
/// in the log.
///
/// # Errors
/// As [`rebuild`], never forced.
pub async fn repair(
    log: &Log,
    cfg: &AdminConfig,
    progress: &mut (dyn FnMut(Progress) + Send),
) -> Result<RepairReport, SinkError> {
    let client = lead(cfg).await?;
    let result = async {
        let (_, current, mut version) = checkpoint_or_genesis(&client, &cfg.zk).await?;
        let plain = Checkpoint {
            rebuilding: None,
            ..current.clone()
        };
        check_checkpoint(log, &cfg.zk.root, &plain)?;
        let expected = expected_tree(log, &plain, progress)?;
        let marker = plain.rebuilding_by(&cfg.identity);
        let converge = converge(
            &client,
            cfg,
            &expected,
            &current,
            &marker,
            &plain,
            &mut version,
            "repair",
            None,
            &[],
            progress,
        )
        .await?;
        Ok(RepairReport {
            checkpoint: plain,
            converge,
        })
    }
    .await;
    let _ = leader::release(&client, cfg.zk.request_timeout).await;
    result
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

/// Rounds of read, diff, apply before giving up.
const MAX_ROUNDS: usize = 5;

/// Converges the live tree to `expected` (see the module docs).
#[allow(clippy::too_many_arguments)]
async fn converge(
    client: &zk::Client,
    cfg: &AdminConfig,
    expected: &Tree,
    current: &Checkpoint,
    marker: &Checkpoint,
    final_cp: &Checkpoint,
    version: &mut i32,
    what: &'static str,
    keep: Option<&str>,
    finish: &[Op],
    progress: &mut (dyn FnMut(Progress) + Send),
) -> Result<ConvergeReport, SinkError> {
    let compared = |p: &str| layout::is_owned(p) && Some(p) != keep;
    let deadline = cfg.zk.request_timeout;
    let mut report = ConvergeReport::default();
    let mut paths: BTreeSet<String> = BTreeSet::new();
    let mut converged = false;
    let mut remaining = 0;
    let marker_json = marker.to_json();
    for round in 1..=MAX_ROUNDS {
        report.rounds = round;
        let live = read_live(client, &cfg.zk).await?;
        progress(Progress::Reading {
            nodes: live.tree.len(),
        });
        for path in stale_locks(&live) {
            if remove_stale_lock(client, deadline, &path).await? {
                tracing::warn!(root = %cfg.zk.root, %path, "removed a stale (non-ephemeral) worker lock");
                report.stale_locks_removed.push(path.clone());
                paths.insert(path);
            }
        }
        let diff = expected.diff_filtered(&live.tree, compared);
        report.locks_kept = live
            .tree
            .iter()
            .filter(|(p, _)| layout::is_ephemeral_lock(p) && live.ephemeral.contains_key(*p))
            .count();
        if diff.is_empty() {
            converged = true;
            break;
        }
        remaining = diff.missing.len() + diff.unexpected.len() + diff.differing.len();
        if round == MAX_ROUNDS {
            break;
        }
        tracing::info!(
            root = %cfg.zk.root,
            round,
            missing = diff.missing.len(),
            unexpected = diff.unexpected.len(),
            differing = diff.differing.len(),
            "converging the live tree"
        );
        let units = plan_units(&diff, expected, &live);
        let txns = pack(units, cfg.limits.for_events());
        let total: usize = txns.iter().map(Vec::len).sum();
        let mut done = 0;
        progress(Progress::Applying { done, total });
        // Up to `window` transactions in flight: ZooKeeper applies one
        // session's requests in the order they were sent, and each expects
        // the checkpoint version the one before it leaves.
        let window = if cfg.txn_pause.is_zero() {
            cfg.in_flight.max(1)
        } else {
            1
        };
        let mut txns = txns.into_iter();
        let mut pending: VecDeque<(Vec<Op>, Commit<'_>)> = VecDeque::new();
        // A transaction was refused: those sent after it fail behind it
        // (their checkpoint version never comes); read the tree again.
        let mut refused = false;
        loop {
            while !refused && pending.len() < window {
                let Some(ops) = txns.next() else { break };
                let expects = *version + pending.len() as i32;
                let commit = send(client, cfg, &marker_json, expects, &ops)?;
                pending.push_back((ops, commit));
            }
            let Some((ops, commit)) = pending.pop_front() else {
                break;
            };
            let unknown = match tokio::time::timeout(deadline, commit).await {
                Ok(Ok(_)) => false,
                Ok(Err(zk::MultiWriteError::OperationFailed { index: 0, .. })) if refused => {
                    continue
                }
                Ok(Err(zk::MultiWriteError::OperationFailed { index: 0, source })) => {
                    tracing::error!(root = %cfg.zk.root, error = %source, "the checkpoint changed under the {what}");
                    return Err(SinkError::Fenced {
                        root: cfg.zk.root.clone(),
                        what,
                    });
                }
                Ok(Err(zk::MultiWriteError::OperationFailed { index, source })) => {
                    // The tree changed since it was read (a worker's lock,
                    // a node written by someone else): read it again.
                    tracing::info!(
                        root = %cfg.zk.root,
                        op = %ops.get(index - 1).map(Op::to_string).unwrap_or_default(),
                        error = %source,
                        "a repair transaction was refused; reading the tree again"
                    );
                    refused = true;
                    continue;
                }
                Ok(Err(zk::MultiWriteError::RequestFailed { source })) => {
                    let e = ZkError::new(
                        "multi",
                        CHECKPOINT_NODE,
                        crate::zk::ZkErrorKind::Server(source),
                    );
                    if !e.is_unknown_outcome() {
                        return Err(e.into());
                    }
                    true
                }
                Err(_) => true,
            };
            let mut landed = vec![ops];
            if unknown {
                // This transaction's outcome and those of the ones sent
                // after it: the checkpoint's version, read after them,
                // says how many landed (in order).
                landed.extend(pending.drain(..).map(|(ops, _)| ops));
                let sent = landed.len();
                let n = resolve_many(client, cfg, *version, sent, what).await?;
                landed.truncate(n);
                refused = n < sent;
            }
            for ops in landed {
                *version += 1;
                report.transactions += 1;
                record(&mut report, &mut paths, &ops);
                done += ops.len();
                progress(Progress::Applying { done, total });
                if !cfg.txn_pause.is_zero() {
                    tokio::time::sleep(cfg.txn_pause).await;
                }
            }
        }
    }
    if !converged {
        return Err(SinkError::NotConverged {
            root: cfg.zk.root.clone(),
            rounds: report.rounds,
            remaining,
        });
    }
    report.paths = paths.into_iter().collect();
    if report.transactions > 0 || final_cp != current || !finish.is_empty() {
        let data = final_cp.to_json();
        let mut w = client.new_multi_writer();
        let added = w
            .add_set_data(CHECKPOINT_NODE, &data, Some(*version))
            .and_then(|()| {
                finish.iter().try_for_each(|op| match op {
                    Op::Create { path, data } => {
                        w.add_create(path, data, &cfg.zk.access.acl(path).persistent())
                    }
                    Op::SetData { path, data } => w.add_set_data(path, data, None),
                    Op::Delete { path } => w.add_delete(path, None),
                })
            });
        added.map_err(|e| {
            ZkError::new("multi", CHECKPOINT_NODE, crate::zk::ZkErrorKind::Server(e))
        })?;
        let written = match tokio::time::timeout(deadline, w.commit()).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(zk::MultiWriteError::OperationFailed { index: 0, source }))
            | Ok(Err(zk::MultiWriteError::RequestFailed { source })) => Err(ZkError::new(
                "multi",
                CHECKPOINT_NODE,
                crate::zk::ZkErrorKind::Server(source),
            )),
            Ok(Err(zk::MultiWriteError::OperationFailed { index, source })) => Err(ZkError::new(
                "multi",
                finish
                    .get(index - 1)
                    .map(|op| op.path().to_string())
                    .unwrap_or_default(),
                crate::zk::ZkErrorKind::Server(source),
            )),
            Err(_) => Err(ZkError::new(
                "multi",
                CHECKPOINT_NODE,
                crate::zk::ZkErrorKind::Timeout(deadline),
            )),
        };
        match written {
            Ok(_) => *version += 1,
            Err(e) if e.is_unknown_outcome() => {
                if !resolve(client, cfg, version, what).await? {
                    return Err(e.into());
                }
                *version += 1;
            }
            Err(e) if e.code() == Some(&zk::Error::BadVersion) => {
                return Err(SinkError::Fenced {
                    root: cfg.zk.root.clone(),
                    what,
                })
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(report)
}

/// A `multi` request sent and not yet answered.
type Commit<'c> = std::pin::Pin<
    Box<
        dyn std::future::Future<Output = Result<Vec<zk::MultiWriteResult>, zk::MultiWriteError>>
            + Send
            + 'c,
    >,
>;

/// Sends one converging transaction: the checkpoint set to `marker`
/// (expecting `version`), then `ops`. The request leaves now (ZooKeeper
/// keeps a session's order); the answer comes with the returned future.
fn send<'c>(
    client: &'c zk::Client,
    cfg: &AdminConfig,
    marker: &[u8],
    version: i32,
    ops: &[Op],
) -> Result<Commit<'c>, SinkError> {
    let mut w = client.new_multi_writer();
    let add = |r: Result<(), zk::Error>, p: &str| {
        r.map_err(|e| ZkError::new("multi", p.to_string(), crate::zk::ZkErrorKind::Server(e)))
    };
    add(
        w.add_set_data(CHECKPOINT_NODE, marker, Some(version)),
        CHECKPOINT_NODE,
    )?;
    for op in ops {
        let r = match op {
            Op::Create { path, data } => {
                w.add_create(path, data, &cfg.zk.access.acl(path).persistent())
            }
            Op::SetData { path, data } => w.add_set_data(path, data, None),
            Op::Delete { path } => w.add_delete(path, None),
        };
        add(r, op.path())?;
    }
    Ok(Box::pin(w.commit()))
}

/// Counts a transaction that landed.
fn record(report: &mut ConvergeReport, paths: &mut BTreeSet<String>, ops: &[Op]) {
    for op in ops {
        match op {
            Op::Create { .. } => report.created += 1,
            Op::SetData { .. } => report.set += 1,
            Op::Delete { path } => {
                report.deleted += 1;
                if layout::is_ephemeral_lock(path) {
                    report.locks_deleted.push(path.clone());
                }
            }
        }
        paths.insert(op.path().to_string());
    }
}

/// Requests in flight at once while setting ACLs.
const ACL_BATCH: usize = 256;

/// With credentials, sets the ACL [`crate::ZkAccess::acl`] gives each node
/// of `expected`, the engine's nodes and the root (when it is a chroot):
/// how an open tree is taken over, and how one whose ACLs were changed is
/// put right. Returns the nodes set; 0 without credentials (an anonymous
/// session could not set them, and an open tree stays as it is).
///
/// # Errors
/// A [`ZkError`] other than a node gone meanwhile (`NoAuth` when the
/// nodes belong to another identity).
pub async fn secure(
    client: &zk::Client,
    cfg: &ZkConfig,
    expected: &Tree,
) -> Result<usize, SinkError> {
    if cfg.access.is_open() {
        return Ok(0);
    }
    let mut paths: Vec<String> = Vec::new();
    if cfg.root != "/" {
        paths.push("/".to_string());
    }
    paths.push(crate::checkpoint::ENGINE_NODE.to_string());
    paths.push(CHECKPOINT_NODE.to_string());
    paths.extend(expected.iter().map(|(p, _)| p.to_string()));
    let mut set = 0;
    for chunk in paths.chunks(ACL_BATCH) {
        let mut tasks = tokio::task::JoinSet::new();
        for path in chunk {
            let client = client.clone();
            let acl = cfg.access.acl(path);
            let path = path.clone();
            let deadline = cfg.request_timeout;
            tasks.spawn(async move {
                let r = call(
                    deadline,
                    "set_acl",
                    &path,
                    client.set_acl(&path, acl.entries(), None),
                )
                .await;
                (path, r)
            });
        }
        while let Some(done) = tasks.join_next().await {
            let Ok((_, r)) = done else { continue };
            match r {
                Ok(_) => set += 1,
                Err(e) if e.code() == Some(&zk::Error::NoNode) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    tracing::info!(root = %cfg.root, nodes = set, "set the ACLs of the projected nodes");
    Ok(set)
}

/// Deletes the worker lock at `path` if it is still not ephemeral, version
/// checked (a lock a worker took meanwhile is ephemeral and is left alone);
/// `true` when it was removed.
async fn remove_stale_lock(
    client: &zk::Client,
    deadline: Duration,
    path: &str,
) -> Result<bool, SinkError> {
    let stat = match call(deadline, "exists", path, client.check_stat(path)).await? {
        Some(stat) if stat.ephemeral_owner == 0 => stat,
        _ => return Ok(false),
    };
    match call(
        deadline,
        "delete",
        path,
        client.delete(path, Some(stat.version)),
    )
    .await
    {
        Ok(()) => Ok(true),
        Err(e)
            if matches!(
                e.code(),
                Some(&zk::Error::NoNode | &zk::Error::BadVersion | &zk::Error::NotEmpty)
            ) =>
        {
            Ok(false)
        }
        Err(e) => Err(e.into()),
    }
}

/// Resolves a write of unknown outcome by reading the checkpoint's version:
/// `true` when it landed (the version moved by one), `false` when not.
async fn resolve(
    client: &zk::Client,
    cfg: &AdminConfig,
    version: &i32,
    what: &'static str,
) -> Result<bool, SinkError> {
    Ok(resolve_many(client, cfg, *version, 1, what).await? == 1)
}

/// Resolves `sent` writes of unknown outcome, sent in order on this session
/// and each moving the checkpoint's version by one from `version`, by
/// reading that version: how many of them landed (always the first ones).
async fn resolve_many(
    client: &zk::Client,
    cfg: &AdminConfig,
    version: i32,
    sent: usize,
    what: &'static str,
) -> Result<usize, SinkError> {
    let until = Instant::now() + cfg.zk.session_timeout * 2;
    let mut delay = Duration::from_millis(100);
    loop {
        match read_checkpoint(client, &cfg.zk).await {
            Ok(Some((_, v))) if v >= version && i64::from(v - version) <= sent as i64 => {
                return Ok((v - version) as usize)
            }
            Ok(_) => {
                return Err(SinkError::Fenced {
                    root: cfg.zk.root.clone(),
                    what,
                })
            }
            Err(SinkError::Zk(e)) if !e.is_session_lost() && Instant::now() < until => {
                tracing::warn!(error = %e, "cannot read the checkpoint yet; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(2));
            }
            Err(e) => return Err(e),
        }
    }
}

/// What a node belongs to, for keeping its changes together.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Group {
    /// Base nodes, queue directories, admin locks.
    Other,
    /// A batch's own nodes (and its `/batch-uuids` entry).
    Batch(String),
    /// A job's nodes, queue reference and batch set child.
    Job(String),
}

fn group_of(path: &str, data: Option<&[u8]>) -> Group {
    let parts: Vec<&str> = path.split('/').collect();
    match parts.as_slice() {
        ["", "jobs", "states", _, name] => match name.split_once('-') {
            Some((_, jid)) => Group::Job(jid.to_string()),
            None => Group::Other,
        },
        ["", "jobs", "states", ..] => Group::Other,
        ["", "jobs", jid, ..] => Group::Job(jid.to_string()),
        ["", "batches", _, "states", _, jid] => Group::Job(jid.to_string()),
        ["", "batches", bid, ..] => Group::Batch(bid.to_string()),
        ["", "batch-uuids", _] => match data
            .and_then(|d| std::str::from_utf8(d).ok())
            .and_then(|t| t.parse::<Bid>().ok())
        {
            Some(bid) => Group::Batch(bid.to_string()),
            None => Group::Other,
        },
        _ => Group::Other,
    }
}

/// The operations of one group, applied together.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Unit {
    ops: Vec<Op>,
}

/// Turns a diff into ordered units (see the module docs).
fn plan_units(diff: &TreeDiff, expected: &Tree, live: &LiveTree) -> Vec<Unit> {
    #[derive(Default)]
    struct Changes {
        creates: BTreeMap<String, Vec<u8>>,
        sets: BTreeMap<String, Vec<u8>>,
        deletes: BTreeSet<String>,
    }
    let mut groups: BTreeMap<Group, Changes> = BTreeMap::new();
    for p in &diff.missing {
        let data = expected.get(p).unwrap_or_default().to_vec();
        let g = group_of(p, Some(&data));
        groups.entry(g).or_default().creates.insert(p.clone(), data);
    }
    for d in &diff.differing {
        let g = group_of(&d.path, Some(&d.expected));
        groups
            .entry(g)
            .or_default()
            .sets
            .insert(d.path.clone(), d.expected.clone());
    }
    let doomed: BTreeSet<&str> = diff.unexpected.iter().map(String::as_str).collect();
    for p in &diff.unexpected {
        let g = group_of(p, live.tree.get(p));
        let c = groups.entry(g).or_default();
        c.deletes.insert(p.clone());
        // A worker's lock under a node that must go goes with it.
        let lock = format!("{p}/lock");
        if layout::is_ephemeral_lock(&lock)
            && live.tree.contains(&lock)
            && !doomed.contains(lock.as_str())
        {
            c.deletes.insert(lock);
        }
    }
    let creates_and_sets = |c: &Changes| -> Vec<Op> {
        let mut ops: Vec<Op> = c
            .creates
            .iter()
            .map(|(p, d)| Op::create(p.clone(), d.clone()))
            .collect();
        ops.extend(c.sets.iter().map(|(p, d)| Op::set(p.clone(), d.clone())));
        ops
    };
    // Children sort after their parents: deleting in reverse order goes
    // children first.
    let deletes = |c: &Changes| -> Vec<Op> {
        c.deletes
            .iter()
            .rev()
            .map(|p| Op::delete(p.clone()))
            .collect()
    };
    let mut first = Vec::new();
    let mut jobs = Vec::new();
    let mut last = Vec::new();
    for (g, c) in &groups {
        match g {
            Group::Job(_) => {
                let mut ops = deletes(c);
                ops.extend(creates_and_sets(c));
                jobs.push(Unit { ops });
            }
            Group::Other | Group::Batch(_) => {
                let ops = creates_and_sets(c);
                if !ops.is_empty() {
                    first.push(Unit { ops });
                }
                let ops = deletes(c);
                if !ops.is_empty() {
                    last.push(Unit { ops });
                }
            }
        }
    }
    // Groups come in the order Other, batches, jobs: base nodes are created
    // before the batches that need `/batches`; deletions go the other way.
    let mut out = first;
    out.extend(jobs);
    out.extend(last.into_iter().rev());
    out
}

/// Packs units into transactions within `limits`, never splitting a unit
/// that fits in one transaction.
fn pack(units: Vec<Unit>, limits: TxnLimits) -> Vec<Vec<Op>> {
    let fits = |bytes: usize, ops: usize| {
        TRANSACTION_OVERHEAD + bytes <= limits.max_bytes && ops <= limits.max_ops
    };
    let mut out: Vec<Vec<Op>> = Vec::new();
    let mut cur: Vec<Op> = Vec::new();
    let mut cur_bytes = 0;
    for unit in units {
        let bytes: usize = unit.ops.iter().map(Op::serialized_size).sum();
        if !cur.is_empty() && !fits(cur_bytes + bytes, cur.len() + unit.ops.len()) {
            out.push(std::mem::take(&mut cur));
            cur_bytes = 0;
        }
        if fits(bytes, unit.ops.len()) {
            cur_bytes += bytes;
            cur.extend(unit.ops);
            continue;
        }
        // Larger than a transaction (a huge set of base or batch changes):
        // cut it, in order.
        tracing::warn!(
            ops = unit.ops.len(),
            bytes,
            "a unit of changes is larger than one transaction; applying it in several"
        );
        for op in unit.ops {
            let b = op.serialized_size();
            if !cur.is_empty() && !fits(cur_bytes + b, cur.len() + 1) {
                out.push(std::mem::take(&mut cur));
                cur_bytes = 0;
            }
            cur_bytes += b;
            cur.push(op);
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_grouped_by_job_and_batch() {
        let job = Group::Job("jid0000000007".into());
        assert_eq!(group_of("/jobs/jid0000000007", None), job);
        assert_eq!(group_of("/jobs/jid0000000007/status", None), job);
        assert_eq!(group_of("/jobs/states/pending/05-jid0000000007", None), job);
        assert_eq!(
            group_of(
                "/batches/bid0000000001/states/batch-processing/jid0000000007",
                None
            ),
            job
        );
        let batch = Group::Batch("bid0000000001".into());
        assert_eq!(group_of("/batches/bid0000000001/status", None), batch);
        assert_eq!(
            group_of("/batches/bid0000000001/states/batch-failed", None),
            batch
        );
        assert_eq!(group_of("/batch-uuids/u", Some(b"bid0000000001")), batch);
        assert_eq!(group_of("/batch-uuids/u", Some(b"junk")), Group::Other);
        assert_eq!(group_of("/jobs/states/pending", None), Group::Other);
        assert_eq!(group_of("/locks/queue/ingest", None), Group::Other);
    }

    #[test]
    fn units_create_parents_first_and_delete_children_first() {
        let mut expected = Tree::new();
        expected
            .apply_all(&[
                Op::create("/jobs", ""),
                Op::create("/jobs/states", ""),
                Op::create("/jobs/states/pending", ""),
                Op::create("/jobs/jid0000000001", ""),
                Op::create("/jobs/jid0000000001/status", "x"),
                Op::create("/jobs/states/pending/05-jid0000000001", ""),
            ])
            .expect("valid");
        let mut live_tree = Tree::new();
        live_tree
            .apply_all(&[
                Op::create("/jobs", ""),
                Op::create("/jobs/states", ""),
                Op::create("/jobs/states/pending", ""),
                Op::create("/jobs/jid0000000002", ""),
                Op::create("/jobs/jid0000000002/status", "y"),
                Op::create("/jobs/jid0000000002/lock", ""),
                Op::create("/jobs/states/pending/05-jid0000000002", ""),
            ])
            .expect("valid");
        let live = LiveTree {
            tree: live_tree.clone(),
            ephemeral: [("/jobs/jid0000000002/lock".to_string(), 7)].into(),
            ctimes: BTreeMap::new(),
        };
        let diff = expected.diff_filtered(&live_tree, |p| !layout::is_ephemeral_lock(p));
        let units = plan_units(&diff, &expected, &live);
        let rendered: Vec<Vec<String>> = units
            .iter()
            .map(|u| u.ops.iter().map(Op::to_string).collect())
            .collect();
        assert_eq!(
            rendered,
            vec![
                vec![
                    "create /jobs/jid0000000001 = ".to_string(),
                    "create /jobs/jid0000000001/status = x".to_string(),
                    "create /jobs/states/pending/05-jid0000000001 = ".to_string(),
                ],
                vec![
                    "delete /jobs/states/pending/05-jid0000000002".to_string(),
                    "delete /jobs/jid0000000002/status".to_string(),
                    "delete /jobs/jid0000000002/lock".to_string(),
                    "delete /jobs/jid0000000002".to_string(),
                ],
            ]
        );
        let mut t = live_tree;
        for u in &units {
            t.apply_all(&u.ops).expect("each unit applies in order");
        }
        assert_eq!(t, expected);
    }

    #[test]
    fn packing_keeps_units_whole() {
        let unit = |n: usize, tag: &str| Unit {
            ops: (0..n).map(|i| Op::delete(format!("/{tag}{i}"))).collect(),
        };
        let limits = TxnLimits {
            max_bytes: 1 << 20,
            max_ops: 5,
        };
        let txns = pack(
            vec![unit(3, "a"), unit(3, "b"), unit(2, "c"), unit(7, "d")],
            limits,
        );
        let sizes: Vec<usize> = txns.iter().map(Vec::len).collect();
        assert_eq!(sizes, vec![3, 5, 5, 2]);
    }
}
