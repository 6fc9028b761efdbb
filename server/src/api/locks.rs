//! Fencing: a worker's report is accepted only while that worker holds the
//! item's lock, proved by a secret only the holder knows.
//!
//! Workers take `/jobs/JID/lock` and `/batches/BID/lock` as ephemeral nodes
//! (DESIGN.md: locks belong to a live session and are never projected),
//! whose data is an [`ingest_protocol::fence::LockNode`] holding the digest
//! of a random secret. A report names the worker's session and carries the
//! secret in the `ingest-fence` header. The API asks a [`LockChecker`] for
//! the lock node's ephemeral owner and data, and refuses the report with 409
//! `lock_not_held` unless the node is the named session's AND the secret
//! opens it. The refusal never names the holder. The real checker reads
//! ZooKeeper; [`NoLocks`] refuses everything.
//!
//! # Cautions
//! The check and the append are two steps: a session that expires between
//! them still gets its report recorded. The window is one engine round trip;
//! closing it would need the lock's owner inside the engine's decision.

use std::future::Future;
use std::pin::Pin;

/// A lock node as the checker found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockHolder {
    /// The session owning the node (its ephemeral owner; 0 for a
    /// persistent node).
    pub session: i64,
    /// The node's data (at most [`ingest_protocol::fence::MAX_LOCK_NODE_BYTES`]
    /// of it are read as a lock node).
    pub data: Vec<u8>,
}

/// What [`LockChecker::holder`] returns: the lock node's owner and data,
/// `None` when there is no lock.
pub type LockFuture<'a> =
    Pin<Box<dyn Future<Output = Result<Option<LockHolder>, LockCheckError>> + Send + 'a>>;

/// Who holds a lock node.
pub trait LockChecker: Send + Sync {
    /// The ephemeral owner (session id) and data of the node at `path`, relative to
    /// the Merritt tree's root (`/jobs/jid0000000001/lock`; the checker
    /// applies the configured chroot), or `None` when the node is absent.
    fn holder<'a>(&'a self, path: &'a str) -> LockFuture<'a>;
}

/// The lock could not be checked (ZooKeeper unreachable, deadline passed).
///
/// ### Handling
/// The API answers 503 `lock_check_failed`; nothing was appended; the worker
/// may retry once ZooKeeper is back (if it still holds the lock).
#[derive(Debug, Clone, thiserror::Error)]
#[error("cannot check the lock {path}: {message}")]
pub struct LockCheckError {
    /// The lock node.
    pub path: String,
    /// Why.
    pub message: String,
}

/// A checker for which no lock is ever held: every fenced report is refused.
/// For a server without ZooKeeper and for tests of the refusal.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoLocks;

impl LockChecker for NoLocks {
    fn holder<'a>(&'a self, _path: &'a str) -> LockFuture<'a> {
        Box::pin(async { Ok(None) })
    }
}

/// A checker for which one session holds every lock, with the digest of
/// [`AcceptAll::secret`]. Unit tests only.
#[cfg(test)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct AcceptAll(pub i64);

#[cfg(test)]
impl AcceptAll {
    /// The secret whose digest every lock holds.
    pub(crate) fn secret() -> ingest_protocol::fence::FenceSecret {
        ingest_protocol::fence::FenceSecret::from_bytes([1; 32])
    }
}

#[cfg(test)]
impl LockChecker for AcceptAll {
    fn holder<'a>(&'a self, _path: &'a str) -> LockFuture<'a> {
        let session = self.0;
        Box::pin(async move {
            Ok(Some(LockHolder {
                session,
                data: ingest_protocol::fence::LockNode::new("test", &AcceptAll::secret())
                    .to_bytes(),
            }))
        })
    }
}

/// The lock node of a job.
pub fn job_lock_path(jid: ingest_events::Jid) -> String {
    ingest_projections::layout::job_lock(jid)
}

/// The lock node of a batch.
pub fn batch_lock_path(bid: ingest_events::Bid) -> String {
    ingest_projections::layout::batch_lock(bid)
}
