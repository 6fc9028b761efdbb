//! The follower's side: find where this engine's log stands in the tail,
//! and apply the tail from there, whole commands at a time.

use std::time::Duration;

use ingest_engine::{EngineError, EngineHandle, ServiceError};
use ingest_projections::zk::{call, ZkError, ZkErrorKind};
use serde::{Deserialize, Serialize};
use zookeeper_client as zk;

use crate::paths;
use crate::tail::{self, NodeName, MULTI_BYTES};

/// Where the trimmed part of the tail ended: the node and the position
/// (with its hash) every replica had applied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Base {
    pub seq: u64,
    pub pos: u64,
    /// Hex of the record's hash at `pos` (the genesis hash for 0).
    pub hash: String,
}

/// Where this engine resumes in the tail: after the complete node `seq`,
/// whose last record is `pos`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Cursor {
    pub seq: u64,
    pub pos: u64,
}

/// Why a follower cannot go on from its log.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FollowError {
    /// The log ends before what the tail still holds: copy from a peer.
    #[error("this engine's log ends at {head}, before the replicated tail (which starts after {base}): it copies the log from a peer")]
    Behind { head: u64, base: u64 },
    /// The log is not a prefix of the group's history.
    #[error("this engine's log is not a prefix of the group's history: {0}")]
    Divergent(String),
    /// ZooKeeper failed.
    #[error(transparent)]
    Zk(#[from] ZkError),
    /// The engine refused or failed to write what the tail holds.
    #[error("applying the tail: {0}")]
    Engine(#[from] ServiceError),
}

impl FollowError {
    /// Whether the writer refused the records (they do not continue the
    /// log) rather than failing.
    pub fn from_import(e: ServiceError) -> FollowError {
        match e {
            ServiceError::Engine(EngineError::Import(i)) => FollowError::Divergent(i.to_string()),
            other => FollowError::Engine(other),
        }
    }
}

/// Reads the base node, `None` when the group has none yet.
pub(crate) async fn read_base(
    client: &zk::Client,
    deadline: Duration,
) -> Result<Option<(Base, i32)>, ZkError> {
    match call(deadline, "get", paths::BASE, client.get_data(paths::BASE)).await {
        Ok((data, stat)) => {
            let base: Base = serde_json::from_slice(&data).map_err(|_| {
                ZkError::new(
                    "decode",
                    paths::BASE,
                    ZkErrorKind::Server(zk::Error::UnexpectedError(
                        "the base node is not JSON".into(),
                    )),
                )
            })?;
            Ok(Some((base, stat.version)))
        }
        Err(e) if e.code() == Some(&zk::Error::NoNode) => Ok(None),
        Err(e) => Err(e),
    }
}

/// The tail's nodes, in order.
pub(crate) async fn list_tail(
    client: &zk::Client,
    deadline: Duration,
) -> Result<Vec<NodeName>, ZkError> {
    let children = call(
        deadline,
        "list",
        paths::TAIL,
        client.list_children(paths::TAIL),
    )
    .await?;
    Ok(tail::sorted(&children))
}

/// Finds where a log whose head is `(head, head_hash)` resumes.
pub(crate) fn locate(
    base: &Base,
    nodes: &[NodeName],
    head: u64,
    head_hash: &str,
) -> Result<Cursor, FollowError> {
    if head < base.pos {
        return Err(FollowError::Behind {
            head,
            base: base.pos,
        });
    }
    if head == base.pos {
        if head_hash != base.hash {
            return Err(FollowError::Divergent(format!(
                "the record at position {head} has hash {head_hash}, the group's has {}",
                base.hash
            )));
        }
        return Ok(Cursor {
            seq: base.seq,
            pos: head,
        });
    }
    // Past the base: the complete node that ends at the head (the hash is
    // checked by the next record's previous hash when it is imported).
    match nodes.iter().find(|n| n.complete && n.pos == head) {
        Some(n) => Ok(Cursor {
            seq: n.seq,
            pos: head,
        }),
        None => Err(FollowError::Divergent(format!(
            "no command of the replicated tail ends at this log's head {head}"
        ))),
    }
}

/// Applies every whole command of the tail after `cursor` (nodes of an
/// unfinished command at the end are left for the next call). Returns the
/// number of nodes applied.
pub(crate) async fn catch_up(
    client: &zk::Client,
    engine: &EngineHandle,
    cursor: &mut Cursor,
    nodes: &[NodeName],
    deadline: Duration,
) -> Result<usize, FollowError> {
    let after: Vec<NodeName> = nodes
        .iter()
        .copied()
        .filter(|n| n.seq > cursor.seq)
        .collect();
    let Some(last_complete) = after.iter().rposition(|n| n.complete) else {
        return Ok(0);
    };
    let run = &after[..=last_complete];
    if run[0].seq != cursor.seq + 1 {
        // The node after ours was trimmed: we were dropped meanwhile.
        return Err(FollowError::Behind {
            head: cursor.pos,
            base: run[0].pos,
        });
    }
    let mut pending: Vec<u8> = Vec::new();
    // The end of the last whole group in `pending`, and its node.
    let mut ready: Option<(usize, NodeName)> = None;
    let mut complete = 0;
    let mut applied = 0;
    let mut i = 0;
    while i < run.len() {
        // One multi-read for as many nodes as fit one answer.
        let mut j = i;
        let mut bytes = 0;
        while j < run.len() && (j == i || bytes + run[j].len <= MULTI_BYTES) {
            bytes += run[j].len;
            j += 1;
        }
        let mut reader = client.new_multi_reader();
        for n in &run[i..j] {
            reader
                .add_get_data(&paths::tail_node(&n.to_string()))
                .map_err(|e| ZkError::new("multi-read", paths::TAIL, ZkErrorKind::Server(e)))?;
        }
        let results = call(deadline, "multi-read", paths::TAIL, reader.commit()).await?;
        for (n, result) in run[i..j].iter().zip(results) {
            let data = match result {
                zk::MultiReadResult::Data { data, .. } => data,
                zk::MultiReadResult::Error { err } => {
                    if err == zk::Error::NoNode {
                        return Err(FollowError::Behind {
                            head: cursor.pos,
                            base: n.pos,
                        });
                    }
                    return Err(ZkError::new(
                        "get",
                        paths::tail_node(&n.to_string()),
                        ZkErrorKind::Server(err),
                    )
                    .into());
                }
                _ => {
                    return Err(FollowError::Divergent(
                        "a tail read answered with something other than data".into(),
                    ))
                }
            };
            let frames =
                tail::payload(n, data).map_err(|e| FollowError::Divergent(e.to_string()))?;
            pending.extend_from_slice(&frames);
            if n.complete {
                ready = Some((pending.len(), *n));
                complete += 1;
            }
        }
        // Every whole group this read brought, in one import: one write
        // and one wait for the disk, where a group at a time cost one each
        // (most of a busy follower's work).
        if let Some((len, last)) = ready.take() {
            let rest = pending.split_off(len);
            let position = engine
                .import(std::mem::replace(&mut pending, rest))
                .await
                .map_err(FollowError::from_import)?;
            if position != last.pos {
                return Err(FollowError::Divergent(format!(
                    "tail node {} should end at position {}, the log is at {position}",
                    last.seq, last.pos
                )));
            }
            *cursor = Cursor {
                seq: last.seq,
                pos: last.pos,
            };
            applied += std::mem::take(&mut complete);
        }
        i = j;
    }
    Ok(applied)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tail::node;

    #[test]
    fn a_log_resumes_after_the_node_that_ends_at_its_head() {
        let base = Base {
            seq: 4,
            pos: 100,
            hash: "aa".into(),
        };
        let nodes = [node(5, 100, false), node(6, 110, true), node(7, 120, true)];
        assert_eq!(
            locate(&base, &nodes, 100, "aa").unwrap(),
            Cursor { seq: 4, pos: 100 }
        );
        assert_eq!(
            locate(&base, &nodes, 110, "whatever").unwrap(),
            Cursor { seq: 6, pos: 110 }
        );
        assert!(matches!(
            locate(&base, &nodes, 99, "x"),
            Err(FollowError::Behind {
                head: 99,
                base: 100
            })
        ));
        assert!(matches!(
            locate(&base, &nodes, 100, "bb"),
            Err(FollowError::Divergent(_))
        ));
        assert!(matches!(
            locate(&base, &nodes, 105, "x"),
            Err(FollowError::Divergent(_))
        ));
        assert!(matches!(
            locate(&base, &nodes, 130, "x"),
            Err(FollowError::Divergent(_))
        ));
    }
}
