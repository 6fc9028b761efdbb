//! Converging the live tree to the expected one in rounds of read, diff and
//! apply; unknown outcomes resolved from the checkpoint's version; ACLs set.

use std::collections::{BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use zookeeper_client as zk;

use super::plan::{pack, plan_units};
use super::{read_live, stale_locks, AdminConfig, ConvergeReport, Progress};
use crate::checkpoint::{Checkpoint, CHECKPOINT_NODE};
use crate::layout;
use crate::ops::Op;
use crate::sink::{read_checkpoint, SinkError};
use crate::tree::Tree;
use crate::zk::{call, ZkConfig, ZkError};

/// Rounds of read, diff, apply before giving up.
const MAX_ROUNDS: usize = 5;

/// Converges the live tree to `expected` (see the module docs).
#[allow(clippy::too_many_arguments)]
pub(super) async fn converge(
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
pub(super) fn record(report: &mut ConvergeReport, paths: &mut BTreeSet<String>, ops: &[Op]) {
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
pub(super) async fn resolve(
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
