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
//! 5. read the tree again and repeat until it matches (a lock taken or a
//!    node changed meanwhile only costs a round), then write the final
//!    checkpoint, which clears the mark.
//!
//! Worker locks are left alone, except a lock under a node that must be
//! deleted (a job the log does not have): it is deleted in the same
//! transaction as its parent, and reported; and a stale lock (a
//! `/jobs/JID/lock` or `/batches/BID/lock` no session owns, which would
//! block its item for ever) is deleted, version-checked, and reported among
//! the changed paths, so a repair's `TreeRepaired` event names it. A rebuild records nothing in the
//! log: it restores what the log says. A repair is recorded by the caller
//! (the engine's `RecordRepair` command) with the paths it changed.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use ingest_events::codec::GENESIS_HASH;
use ingest_events::log::Log;
use ingest_events::{Bid, Hash};
use zookeeper_client as zk;

use crate::checkpoint::{Checkpoint, CHECKPOINT_NODE};
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
}

impl AdminConfig {
    /// Default caps, a 10 s leadership wait, no force.
    pub fn new(zk: ZkConfig, identity: impl Into<String>) -> AdminConfig {
        AdminConfig {
            zk,
            identity: identity.into(),
            limits: TxnLimits::default(),
            leader_wait: Duration::from_secs(10),
            force: false,
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
}

impl DiffReport {
    /// Whether the live tree differs from the log's or holds a stale lock.
    pub fn has_drift(&self) -> bool {
        !self.diff.is_empty() || !self.stale_locks.is_empty()
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
    for r in log.read_range(1, cp.position) {
        projector.project(&r?)?;
        let done = projector.position();
        if done % 1000 == 0 || done == total {
            progress(Progress::Projecting { done, total });
        }
    }
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
    progress: &mut dyn FnMut(Progress),
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
    let at = checkpoint.clone().unwrap_or_else(Checkpoint::genesis);
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
    progress: &mut dyn FnMut(Progress),
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
    progress: &mut dyn FnMut(Progress),
) -> Result<RebuildReport, SinkError> {
    let (previous, current, mut version) = checkpoint_or_genesis(client, &cfg.zk).await?;
    if previous.is_some() && !cfg.force {
        let plain = Checkpoint {
            rebuilding: None,
            ..current.clone()
        };
        check_checkpoint(log, &cfg.zk.root, &plain)?;
    }
    let target = log.durable_position();
    let final_cp = Checkpoint::at(target, hash_at(log, target)?);
    tracing::info!(
        root = %cfg.zk.root,
        from = %current,
        position = target,
        "rebuilding the live tree from the log"
    );
    let expected = expected_tree(log, &final_cp, progress)?;
    let marker = current.rebuilding_by(&cfg.identity);
    let converge = converge(
        client,
        cfg,
        &expected,
        &current,
        &marker,
        &final_cp,
        &mut version,
        "rebuild",
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
    })
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
    progress: &mut dyn FnMut(Progress),
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
    progress: &mut dyn FnMut(Progress),
) -> Result<ConvergeReport, SinkError> {
    let deadline = cfg.zk.request_timeout;
    let mut report = ConvergeReport::default();
    let mut paths: BTreeSet<String> = BTreeSet::new();
    let mut converged = false;
    let mut remaining = 0;
    let marker_json = marker.to_json();
    for round in 1..=MAX_ROUNDS {
        report.rounds = round;
        let live = read_tree(client, &cfg.zk, ReadOptions::default()).await?;
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
        let diff = expected.diff_filtered(&live.tree, layout::is_owned);
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
        for ops in txns {
            let mut w = client.new_multi_writer();
            let add = |r: Result<(), zk::Error>, p: &str| {
                r.map_err(|e| {
                    ZkError::new("multi", p.to_string(), crate::zk::ZkErrorKind::Server(e))
                })
            };
            add(
                w.add_set_data(CHECKPOINT_NODE, &marker_json, Some(*version)),
                CHECKPOINT_NODE,
            )?;
            for op in &ops {
                let r = match op {
                    Op::Create { path, data } => {
                        w.add_create(path, data, &cfg.zk.access.acl(path).persistent())
                    }
                    Op::SetData { path, data } => w.add_set_data(path, data, None),
                    Op::Delete { path } => w.add_delete(path, None),
                };
                add(r, op.path())?;
            }
            let landed = match tokio::time::timeout(deadline, w.commit()).await {
                Ok(Ok(_)) => true,
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
                    break;
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
                    if !resolve(client, cfg, version, what).await? {
                        break;
                    }
                    true
                }
                Err(_) => {
                    if !resolve(client, cfg, version, what).await? {
                        break;
                    }
                    true
                }
            };
            if landed {
                *version += 1;
                report.transactions += 1;
                for op in &ops {
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
                done += ops.len();
                progress(Progress::Applying { done, total });
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
    if report.transactions > 0 || final_cp != current {
        let data = final_cp.to_json();
        match call(
            deadline,
            "set_data",
            CHECKPOINT_NODE,
            client.set_data(CHECKPOINT_NODE, &data, Some(*version)),
        )
        .await
        {
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
    let until = Instant::now() + cfg.zk.session_timeout * 2;
    let mut delay = Duration::from_millis(100);
    loop {
        match read_checkpoint(client, &cfg.zk).await {
            Ok(Some((_, v))) if v == *version => return Ok(false),
            Ok(Some((_, v))) if v == *version + 1 => return Ok(true),
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
