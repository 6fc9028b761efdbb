//! One id space with mrt-zk's sequential nodes (adoption mode).
//!
//! mrt-zk names a new batch or job by creating a sequential node
//! (`/batches/bid`, `/jobs/jid`): ZooKeeper appends its counter of the
//! parent, ten digits. That counter counts the children ever created
//! under the parent (a deletion does not move it; the parent's `cversion`
//! counts both, so the counter is `(cversion + numChildren) / 2`). When
//! the engine takes its own ids from the log, the counter reaches ids the
//! engine already used and mrt-zk's `createBatch` fails with
//! `NodeExistsException`, or names a batch the log already has.
//!
//! [`reserve`] takes ids for the engine from the same counter: ONE `multi`
//! creates a sequential node (whose number is predicted from the parent's
//! stat), deletes it, and creates and deletes a scratch node once for each
//! further id. The multi is atomic, so no reader ever sees these nodes,
//! and it fails as a whole when the prediction is wrong (another client
//! created a child meanwhile): then the stat is read again. When it
//! commits, the counter has passed every id of the block, so ZooKeeper
//! never gives one of them to mrt-zk; and a batch mrt-zk creates keeps the
//! id ZooKeeper gave it. Neither side can take the other's id.
//!
//! The ids reserved start at `floor` at the least (the log's next id), so
//! a tree whose counter is behind the log (a rebuilt tree, a tree of an
//! older release) is first moved past every id the log holds.

use std::time::Duration;

use zookeeper_client as zk;

use crate::acl::ZkAccess;
use crate::layout;
use crate::zk::{call, ZkError, ZkErrorKind};

/// Which counter: the batches' (`/batches`) or the jobs' (`/jobs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdKind {
    /// Batch ids (`bid…`).
    Batch,
    /// Job ids (`jid…`).
    Job,
}

impl IdKind {
    /// The parent whose sequential counter names the ids.
    pub fn parent(self) -> &'static str {
        match self {
            IdKind::Batch => layout::BATCHES,
            IdKind::Job => layout::JOBS,
        }
    }
}

/// The name of the nodes a reservation creates and deletes in one `multi`
/// (never seen outside it): `PARENT/.ingest-id` and the sequential
/// `PARENT/.ingest-id-NNNNNNNNNN`.
pub const SCRATCH: &str = ".ingest-id";

/// Whether `path` is a reservation's scratch node (a watch sees its
/// creation and deletion; it belongs to no item).
pub fn is_scratch(path: &str) -> bool {
    path.rsplit('/')
        .next()
        .is_some_and(|n| n.starts_with(SCRATCH))
}

/// Why ids could not be reserved.
///
/// ### Handling
/// Nothing was taken that matters (a multi that did not commit takes no
/// id; one whose outcome is unknown only wastes ids): refuse the command
/// that needed them with 503 and let its caller retry.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IdError {
    /// ZooKeeper failed or did not answer.
    #[error(transparent)]
    Zk(#[from] ZkError),
    /// ZooKeeper's counter (an `int`) is near its end.
    #[error("ZooKeeper's sequential counter of {parent} is at its end ({at})")]
    Exhausted {
        /// `/batches` or `/jobs`.
        parent: &'static str,
        /// The counter.
        at: i64,
    },
    /// Other clients created children under the parent during every try.
    #[error("{tries} reservations in a row under {parent} met other clients' creations")]
    Contended {
        /// `/batches` or `/jobs`.
        parent: &'static str,
        /// Tries made.
        tries: u32,
    },
}

/// The most operations one reservation `multi` holds (each id costs a
/// create and a delete; a few dozen bytes each, far below `jute.maxbuffer`).
const MAX_OPS: u64 = 4096;

/// Attempts in a row whose prediction failed (other clients creating
/// children all the while) before giving up.
const MAX_TRIES: u32 = 64;

/// Reserves `n` ids of `kind` from ZooKeeper's sequential counter, each at
/// least `floor`, ascending; the counter has passed them all when this
/// returns, so no sequential create ever gets one of them.
///
/// # Errors
/// [`IdError`]: ZooKeeper failed (or the parent does not exist), its
/// counter is near its end, or [`MAX_TRIES`] predictions in a row failed.
pub async fn reserve(
    client: &zk::Client,
    access: &ZkAccess,
    deadline: Duration,
    kind: IdKind,
    n: usize,
    floor: u64,
) -> Result<Vec<u64>, IdError> {
    let parent = kind.parent();
    let seq = format!("{parent}/{SCRATCH}-");
    let scratch = format!("{parent}/{SCRATCH}");
    let acl = access.acl(&scratch);
    let sequential = zk::CreateMode::PersistentSequential.with_acls(zk::Acls::new(acl.entries()));
    let mut out: Vec<u64> = Vec::with_capacity(n);
    let mut failed = 0u32;
    while out.len() < n {
        let stat = parent_stat(client, parent, deadline).await?;
        // Deletions move `cversion` on the servers this project runs
        // (3.8); where they do not, `cversion` is the counter itself.
        let counted = (i64::from(stat.cversion) + i64::from(stat.num_children)) / 2;
        let predicted = if failed % 2 == 0 {
            counted
        } else {
            i64::from(stat.cversion)
        };
        let exhausted = IdError::Exhausted {
            parent,
            at: predicted,
        };
        let at = u64::try_from(predicted).map_err(|_| exhausted)?;
        let skip = floor.saturating_sub(at);
        let want = (n - out.len()) as u64;
        let ids = (skip + want).clamp(1, MAX_OPS / 2);
        if at + ids >= i32::MAX as u64 {
            return Err(IdError::Exhausted {
                parent,
                at: predicted,
            });
        }
        let mut w = client.new_multi_writer();
        let add = |r: Result<(), zk::Error>| {
            r.map_err(|e| ZkError::new("multi", parent, ZkErrorKind::Server(e)))
        };
        add(w.add_create(&seq, &[], &sequential))?;
        add(w.add_delete(&format!("{seq}{at:010}"), None))?;
        for _ in 1..ids {
            add(w.add_create(&scratch, &[], &acl.persistent()))?;
            add(w.add_delete(&scratch, None))?;
        }
        match tokio::time::timeout(deadline, w.commit()).await {
            Ok(Ok(_)) => {
                failed = 0;
                out.extend(
                    (at..at + ids)
                        .filter(|id| *id >= floor && *id > 0)
                        .take(n - out.len()),
                );
            }
            Ok(Err(zk::MultiWriteError::OperationFailed {
                index: 1,
                source: zk::Error::NoNode,
            })) => {
                failed += 1;
                if failed >= MAX_TRIES {
                    return Err(IdError::Contended {
                        parent,
                        tries: failed,
                    });
                }
            }
            Ok(Err(zk::MultiWriteError::OperationFailed { source, .. }))
            | Ok(Err(zk::MultiWriteError::RequestFailed { source })) => {
                return Err(ZkError::new("multi", parent, ZkErrorKind::Server(source)).into());
            }
            Err(_) => {
                return Err(ZkError::new("multi", parent, ZkErrorKind::Timeout(deadline)).into());
            }
        }
    }
    Ok(out)
}

/// The stat of `parent`, waiting up to `deadline` for it to exist: the
/// projector creates the base nodes when it starts, and a command may come
/// first.
async fn parent_stat(
    client: &zk::Client,
    parent: &'static str,
    deadline: Duration,
) -> Result<zk::Stat, ZkError> {
    let until = tokio::time::Instant::now() + deadline;
    loop {
        if let Some(stat) = call(deadline, "exists", parent, client.check_stat(parent)).await? {
            return Ok(stat);
        }
        if tokio::time::Instant::now() >= until {
            return Err(ZkError::new(
                "exists",
                parent,
                ZkErrorKind::Server(zk::Error::NoNode),
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scratch_nodes_are_told_apart() {
        assert!(is_scratch("/batches/.ingest-id"));
        assert!(is_scratch("/jobs/.ingest-id-0000000012"));
        assert!(!is_scratch("/batches/bid0000000001"));
        assert!(!is_scratch("/jobs/jid0000000001/status"));
    }
}
