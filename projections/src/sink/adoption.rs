//! What adoption mode hands the engine: each kind of write another
//! ZooKeeper client made, as read from the tree, and the [`AdoptForeign`]
//! hook (implemented by the server over the engine's `decide`) that
//! decides it.

use ingest_events::{Jid, JobState};
use zookeeper_client as zk;

use super::item::found_text;
use crate::layout;

/// A job status another client wrote, offered to the engine (adoption mode).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForeignStatus {
    /// The job.
    pub jid: Jid,
    /// The status the log has.
    pub from: JobState,
    /// The status written.
    pub to: JobState,
    /// The `message` written (cut to 512 bytes).
    pub message: String,
    /// Who wrote it, as far as ZooKeeper tells: the session holding the
    /// job's lock when the status was written (mrt-zk locks a job before it
    /// sets its status), else (a lock released before its holder was read)
    /// the zxid of the write.
    pub actor: String,
    /// What was written besides the state: `retry_count` and
    /// `last_successful_status` as found, and the node as a record keeps it.
    pub written: WrittenStatus,
}

/// A job status node as another client wrote it: the counters mrt-zk's
/// `Job.setStatus` writes (`retry_count`, `last_successful_status`), which
/// the engine computes by its own rules, and the node as found, for the
/// record of a difference.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct WrittenStatus {
    /// `retry_count` (`None`: absent or not a number).
    pub retry_count: Option<u64>,
    /// `last_successful_status` (`None`: absent; `Some(None)`: `null`; the
    /// name cut to 64 bytes).
    pub last_successful_status: Option<Option<String>>,
    /// The node's data as found, cut to
    /// [`ingest_events::event::ForeignNode::MAX_FOUND_BYTES`], printable.
    pub found: String,
    /// The node's `mzxid`.
    pub zxid: i64,
    /// The node's `mtime` (milliseconds since the Unix epoch).
    pub mtime: i64,
}

impl WrittenStatus {
    /// Reads a job status node's data and stat.
    pub(super) fn of(data: &[u8], stat: &zk::Stat) -> WrittenStatus {
        let v = serde_json::from_slice::<serde_json::Value>(data).unwrap_or_default();
        WrittenStatus {
            retry_count: v.get("retry_count").and_then(serde_json::Value::as_u64),
            last_successful_status: v
                .get("last_successful_status")
                .map(|l| l.as_str().map(|s| ingest_protocol::cut(s, 64).into_owned())),
            found: found_text(data),
            zxid: stat.mzxid,
            mtime: stat.mtime,
        }
    }
}

/// The engine's answer to a [`ForeignStatus`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Adoption {
    /// Decided and appended at this position: the projector will write it.
    Accepted(u64),
    /// Refused (why): the projector reverts it and records it.
    Refused(String),
}

/// A pause or hold lock node another client created or deleted
/// (mrt-zk's `MerrittLocks`: `lockIngestQueue`, `unlockIngestQueue`, the
/// access queues', `lockCollection`, `unlockCollection`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LockChange {
    /// `/locks/queue/ingest`: paused (created) or resumed (deleted).
    Queue(bool),
    /// `/locks/queue/accessSmall|accessLarge`: paused or resumed.
    AccessQueue(ingest_events::event::AccessQueue, bool),
    /// `/locks/collections/PROFILE`: held or released.
    Collection(String, bool),
}

impl LockChange {
    /// The change a lock node at `path` existing (`exists`) means, if the
    /// path is a pause or hold lock.
    pub fn of(path: &str, exists: bool) -> Option<LockChange> {
        use ingest_events::event::AccessQueue;
        if path == layout::QUEUE_LOCK {
            return Some(LockChange::Queue(exists));
        }
        for q in AccessQueue::ALL {
            if path == layout::access_queue_lock(q) {
                return Some(LockChange::AccessQueue(q, exists));
            }
        }
        let profile = path
            .strip_prefix(layout::LOCKS_COLLECTIONS)?
            .strip_prefix('/')?;
        (!profile.is_empty() && !profile.contains('/'))
            .then(|| LockChange::Collection(profile.to_string(), exists))
    }
}

/// A [`LockChange`] offered to the engine, with who made it as far as
/// ZooKeeper tells.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForeignLock {
    /// What changed.
    pub change: LockChange,
    /// `zk-zxid-0x…` of a created node's creation; `zk-client` for a
    /// deletion (ZooKeeper keeps nothing of a deleted node).
    pub actor: String,
}

/// A batch another client created (mrt-zk's `createBatch`: a sequential
/// `/batches/bid…` node, its `submission` and its `status`), offered to the
/// engine (adoption mode).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForeignBatch {
    /// The id ZooKeeper's sequential counter gave it.
    pub bid: ingest_events::Bid,
    /// The data of `/batches/BID/submission` (at most
    /// [`ingest_protocol::node::MAX_NODE_BYTES`]).
    pub submission: Vec<u8>,
    /// The state its `status` node names.
    pub status: String,
    /// Who created it, as far as ZooKeeper tells: `zk-zxid-0x…`, the zxid
    /// that created `/batches/BID` (ZooKeeper keeps no writer's session for
    /// a persistent node; the zxid finds it in the servers' logs).
    pub actor: String,
}

/// A batch status another client wrote (mrt-zk's `Batch.setStatus`, as
/// `acquirePendingBatch`, the reporting consumer and the admin tool call
/// it), offered to the engine (adoption mode).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForeignBatchStatus {
    /// The batch.
    pub bid: ingest_events::Bid,
    /// The status the log has.
    pub from: ingest_events::lifecycle::BatchState,
    /// The status written.
    pub to: ingest_events::lifecycle::BatchState,
    /// Who wrote it: `zk-zxid-0x…`, the zxid of the write.
    pub actor: String,
}

/// A job another client created (mrt-zk's `Job.createJob`: a sequential
/// `/jobs/jid…` node, its `bid`, `priority`, `configuration`, optional
/// `identifiers` and `metadata`, a Pending `status`, and its references),
/// offered to the engine (adoption mode).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForeignJob {
    /// The id ZooKeeper's sequential counter gave it.
    pub jid: Jid,
    /// The batch its `bid` node names.
    pub bid: ingest_events::Bid,
    /// Its `priority` node, as found (cut to 16 characters).
    pub priority: String,
    /// The data of its `configuration` node.
    pub configuration: Vec<u8>,
    /// The data of its `identifiers` node (empty when absent).
    pub identifiers: Vec<u8>,
    /// The data of its `metadata` node (empty when absent).
    pub metadata: Vec<u8>,
    /// The state its `status` node names.
    pub status: String,
    /// Who created it: the session that held `/jobs/JID/lock` while it did
    /// (mrt-zk locks a job it creates), else the zxid of its creation.
    pub actor: String,
}

/// What [`AdoptForeign`]'s methods return: the adoption, decided later.
pub type AdoptionFuture<'a> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Adoption> + Send + 'a>>;

/// Turns a foreign status change into the command it means (implemented by
/// the server over the engine's `decide`).
pub trait AdoptForeign: Send + Sync {
    /// Decides and appends `change`, or says why not.
    fn adopt(&self, change: ForeignStatus) -> AdoptionFuture<'_>;

    /// Decides and appends a pause or hold another client made or
    /// removed, or says why not (by default: not adopted, so reverted).
    fn adopt_lock(&self, change: ForeignLock) -> AdoptionFuture<'_> {
        let _ = change;
        not_adopted("pauses and holds")
    }

    /// Decides and appends a batch another client created, with the id
    /// ZooKeeper gave it, or says why not (by default: not adopted, so
    /// removed and recorded).
    fn adopt_batch(&self, batch: ForeignBatch) -> AdoptionFuture<'_> {
        let _ = batch;
        not_adopted("batch creations")
    }

    /// Decides and appends a batch status another client wrote, or says
    /// why not (by default: not adopted, so reverted).
    fn adopt_batch_status(&self, change: ForeignBatchStatus) -> AdoptionFuture<'_> {
        let _ = change;
        not_adopted("batch statuses")
    }

    /// Decides and appends a job another client created, with the id
    /// ZooKeeper gave it, or says why not (by default: removed).
    fn adopt_job(&self, job: ForeignJob) -> AdoptionFuture<'_> {
        let _ = job;
        not_adopted("job creations")
    }

    /// Decides and appends an access request status another client wrote,
    /// or says why not (by default: not adopted, so reverted).
    fn adopt_access_status(&self, change: ForeignAccessStatus) -> AdoptionFuture<'_> {
        let _ = change;
        not_adopted("access request statuses")
    }

    /// Decides and appends a batch or job another client removed, or says
    /// why not (by default: not adopted, so put back and recorded).
    fn adopt_delete(&self, deleted: ForeignDelete) -> AdoptionFuture<'_> {
        let _ = deleted;
        not_adopted("deletions")
    }
}

/// The default answer of [`AdoptForeign`]'s methods: refused, so reverted.
fn not_adopted(what: &str) -> AdoptionFuture<'static> {
    Box::pin(std::future::ready(Adoption::Refused(format!(
        "{what} are not adopted here"
    ))))
}

/// An access request status another client wrote (mrt-zk's
/// `Access.setStatus`, as mrt-store's assembly and Merritt's admin tool call
/// it), offered to the engine (adoption mode).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForeignAccessStatus {
    /// The request.
    pub qid: ingest_events::Qid,
    /// Its queue.
    pub queue: ingest_events::event::AccessQueue,
    /// The status the log has.
    pub from: ingest_events::lifecycle::AccessState,
    /// The status written.
    pub to: ingest_events::lifecycle::AccessState,
    /// The `message` written (cut to 512 bytes).
    pub message: String,
    /// Who wrote it, as for a job's status: the session holding
    /// `/access/<queue>/QID/lock` when it was written, else the zxid of the
    /// write.
    pub actor: String,
}

impl ForeignAccessStatus {
    /// Whether the move is an assembler's (taking the request, reporting
    /// its outcome), made under the request's lock; the others (requeue,
    /// delete) are the admin tool's.
    pub fn by_worker(
        from: ingest_events::lifecycle::AccessState,
        to: ingest_events::lifecycle::AccessState,
    ) -> bool {
        use ingest_events::lifecycle::AccessState::*;
        matches!(
            (from, to),
            (Pending, Processing) | (Processing, Completed | Failed)
        )
    }
}

/// A batch, job or access request whose nodes another client removed
/// (mrt-zk's `Batch.delete`, `deleteCompletedBatches`, `Job.delete`,
/// `deleteDeletedJobs`, `Access.delete`), offered to the engine (adoption
/// mode).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForeignDelete {
    /// What was removed.
    pub item: Deleted,
    /// Who removed it: `zk-client` (ZooKeeper keeps nothing of a deleted
    /// node).
    pub actor: String,
}

/// The item of a [`ForeignDelete`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deleted {
    /// `/batches/BID` removed (with its jobs, as `Batch.delete` does).
    Batch(ingest_events::Bid),
    /// `/jobs/JID` removed while its batch stays.
    Job(Jid),
    /// `/access/<queue>/QID` removed (`Access.delete`: its children, then
    /// the request).
    Access(ingest_events::event::AccessQueue, ingest_events::Qid),
}

/// A shared [`AdoptForeign`]: with it the sink runs in adoption mode.
#[derive(Clone)]
pub struct ForeignAdopter(pub std::sync::Arc<dyn AdoptForeign>);

impl std::fmt::Debug for ForeignAdopter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ForeignAdopter")
    }
}
