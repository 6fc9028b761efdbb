//! Rebuild and repair: leadership, the rebuild marker and the queue pause
//! ([`Resume`] finishes a killed rebuild), then converging the tree.

use ingest_events::log::Log;
use zookeeper_client as zk;

use super::converge::{converge, resolve, secure};
use super::{
    check_checkpoint, checkpoint_or_genesis, expected_tree, hash_at, lead, read_marker,
    AdminConfig, Progress, RebuildReport, RepairReport,
};
use crate::checkpoint::{Checkpoint, RebuildMarker, CHECKPOINT_NODE, REBUILDING_NODE};
use crate::layout;
use crate::leader;
use crate::ops::Op;
use crate::sink::SinkError;
use crate::zk::{call, ZkError};

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
    pub(super) log: std::sync::Arc<Log>,
    pub(super) cfg: AdminConfig,
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
