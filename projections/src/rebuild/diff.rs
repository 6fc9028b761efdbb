//! Comparing the live tree with the log at its checkpoint: [`diff`] and the
//! [`preview`] of what `rebuild --force` would change.

use ingest_events::log::Log;

use super::{
    check_checkpoint, expected_tree, hash_at, read_marker, stale_locks, DiffReport, Progress,
};
use crate::checkpoint::Checkpoint;
use crate::layout;
use crate::sink::{read_checkpoint, SinkError};
use crate::tree::TreeDiff;
use crate::zk::{connect, read_tree, LiveTree, ReadOptions, ZkConfig};

/// Compares the live tree under `zk.root` with the log at the tree's
/// checkpoint (see the module docs), ignoring `/ingest-engine` and worker
/// locks: [`read_checkpointed`], then [`compare`].
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
    let live = read_checkpointed(zk_config, progress).await?;
    compare(log, zk_config, live, progress)
}

/// The live tree as [`read_checkpointed`] read it: one position of the checkpoint.
#[derive(Debug, Clone)]
pub struct LiveRead {
    checkpoint: Option<Checkpoint>,
    live: LiveTree,
    rebuilding: Option<String>,
}

/// Reads the live tree under `zk.root` and its checkpoint, the same before
/// and after the read (five tries): the ZooKeeper half of [`diff`], all
/// I/O and no log reads, so a server runs it on its runtime.
///
/// # Errors
/// [`SinkError::Zk`] on I/O; [`SinkError::Busy`] when a projector kept
/// moving the checkpoint.
pub async fn read_checkpointed(
    zk_config: &ZkConfig,
    progress: &mut (dyn FnMut(Progress) + Send),
) -> Result<LiveRead, SinkError> {
    zk_config
        .validate()
        .map_err(|e| SinkError::Config(e.to_string()))?;
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
    Ok(LiveRead {
        checkpoint,
        live,
        rebuilding,
    })
}

/// Compares what [`read_checkpointed`] read with the log at the tree's checkpoint:
/// the log half of [`diff`], reads of the log and folding, no I/O to
/// ZooKeeper (blocking: a server runs it on a blocking thread).
///
/// # Errors
/// [`SinkError::ForeignTree`] / [`SinkError::CheckpointAhead`] when the
/// tree is not this log's; a log read error.
pub fn compare(
    log: &Log,
    zk_config: &ZkConfig,
    read: LiveRead,
    progress: &mut (dyn FnMut(Progress) + Send),
) -> Result<DiffReport, SinkError> {
    let LiveRead {
        checkpoint,
        live,
        rebuilding,
    } = read;
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
    zk_config
        .validate()
        .map_err(|e| SinkError::Config(e.to_string()))?;
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
