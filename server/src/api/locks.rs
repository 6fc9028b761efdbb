//! Fencing: a worker's report is accepted only while that worker's
//! ZooKeeper session still holds the item's lock.
//!
//! Workers take `/jobs/JID/lock` and `/batches/BID/lock` as ephemeral nodes
//! (DESIGN.md: locks belong to a live session and are never projected). The
//! API asks a [`LockChecker`] who owns the lock node (its ephemeral owner)
//! and refuses the report with 409 `lock_not_held` unless it is the session
//! the worker names. The real checker reads ZooKeeper; [`NoLocks`] refuses
//! everything.
//!
//! # Cautions
//! The check and the append are two steps: a session that expires between
//! them still gets its report recorded. The window is one engine round trip;
//! closing it would need the lock's owner inside the engine's decision.

use std::future::Future;
use std::pin::Pin;

/// What [`LockChecker::holder`] returns: the session id owning the lock
/// node (its ephemeral owner), `None` when there is no lock.
pub type LockFuture<'a> =
    Pin<Box<dyn Future<Output = Result<Option<i64>, LockCheckError>> + Send + 'a>>;

/// Who holds a lock node.
pub trait LockChecker: Send + Sync {
    /// The ephemeral owner (session id) of the node at `path`, relative to
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

/// A checker for which one session holds every lock. Unit tests only.
#[cfg(test)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct AcceptAll(pub i64);

#[cfg(test)]
impl LockChecker for AcceptAll {
    fn holder<'a>(&'a self, _path: &'a str) -> LockFuture<'a> {
        let session = self.0;
        Box::pin(async move { Ok(Some(session)) })
    }
}

/// The lock node of a job.
pub fn job_lock_path(jid: ingest_events::Jid) -> String {
    format!("/jobs/{jid}/lock")
}

/// The lock node of a batch.
pub fn batch_lock_path(bid: ingest_events::Bid) -> String {
    format!("/batches/{bid}/lock")
}
