//! The projector: one recorded event → the ZooKeeper operations it implies.
//!
//! [`Projector`] is deterministic. Its output depends only on the events it
//! has seen (their data and their envelopes' timestamps), never on the clock
//! or on anything outside the log, so the same log always gives the same
//! operations and the same tree, byte for byte.
//!
//! It keeps two models:
//! - the [`State`] of `ingest-events`, folded from the same records, so that
//!   `last_successful_status`, `retry_count`, priorities and messages follow
//!   exactly the rules the engine decides with (they are not re-implemented
//!   here);
//! - the [`Tree`] it has produced so far, against which every operation is
//!   checked with ZooKeeper's rules as it is generated: parents are created
//!   before children, children deleted before parents, no node is created
//!   twice and no missing node is set or deleted.
//!
//! Every job's queue reference (`/jobs/states/<state>/PP-JID`) and batch set
//! child (`/batches/BID/states/batch-*/JID`) are moved by the same event's
//! operations, so applying one event's operations in one transaction never
//! leaves a job in two queues or none (DESIGN.md invariant 6).

use std::collections::{BTreeMap, BTreeSet};

use ingest_events::event::{Event, StreamId};
use ingest_events::state::{FoldError, Job, State};
use ingest_events::{Jid, Recorded};

use crate::layout::{self, BatchSet};
use crate::ops::{EventOps, Op};
use crate::tree::{Tree, TreeError};

/// Why a record could not be projected.
///
/// ### Handling
/// None of these is retryable: the same record gives the same error. A
/// [`ProjectError::Fold`] means the log does not fit its own rules (run
/// `ingest verify`); the projector is unchanged. A [`ProjectError::Defect`] is
/// a bug in the projector; it stops ([`ProjectError::Poisoned`] afterwards)
/// and must be rebuilt from the log once fixed. Never skip a record.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProjectError {
    /// The record does not fit the folded state (out of order, unknown item).
    #[error(transparent)]
    Fold(#[from] FoldError),
    /// An operation the projector generated breaks ZooKeeper's rules against
    /// its own tree.
    #[error("projector defect at position {position} ({kind}): {source}")]
    Defect {
        /// The record's position.
        position: u64,
        /// The event kind.
        kind: &'static str,
        /// The rule broken.
        source: TreeError,
    },
    /// An earlier defect stopped the projector.
    #[error(
        "the projector stopped after a defect at position {position}; rebuild it from the log"
    )]
    Poisoned {
        /// Where the defect happened.
        position: u64,
    },
}

/// Each operation's pre-image: the data of its node just before it (`None`:
/// the node did not exist).
pub type PreImages = Vec<Option<Vec<u8>>>;

/// Where a job's two references are in the tree the projector produced.
#[derive(Debug, Clone, PartialEq, Eq)]
struct JobRefs {
    queue: String,
    batch: String,
}

/// Turns recorded events into ZooKeeper operations, keeping a model of the
/// tree they produce.
#[derive(Debug, Clone, Default)]
pub struct Projector {
    state: State,
    tree: Tree,
    refs: BTreeMap<Jid, JobRefs>,
    poisoned: Option<u64>,
}

impl Projector {
    /// A projector before any event, with an empty tree (see [`Projector::init`]).
    pub fn new() -> Projector {
        Projector {
            state: State::new(),
            tree: Tree::new(),
            refs: BTreeMap::new(),
            poisoned: None,
        }
    }

    /// Creates the base nodes (mrt-zk's `initNodes` plus the lock parents)
    /// that the tree does not have yet, as position 0. Calling it again
    /// returns no operations.
    ///
    /// # Errors
    /// [`ProjectError::Poisoned`] after a defect.
    pub fn init(&mut self) -> Result<EventOps, ProjectError> {
        if let Some(position) = self.poisoned {
            return Err(ProjectError::Poisoned { position });
        }
        let mut tx = Txn::new(&mut self.tree);
        let result = layout::base_paths().iter().try_for_each(|p| tx.ensure(p));
        match result {
            Ok(()) => Ok(tx.finish(0)),
            Err(source) => {
                tx.rollback();
                self.poisoned = Some(0);
                Err(ProjectError::Defect {
                    position: 0,
                    kind: "init",
                    source,
                })
            }
        }
    }

    /// Projects one record: folds it into the state and returns the
    /// operations that bring the tree from what the previous records left to
    /// what this one implies, in order. Records must come in position order
    /// from position 1.
    ///
    /// # Errors
    /// [`ProjectError::Fold`] when the record does not fit (nothing changes);
    /// [`ProjectError::Defect`] / [`ProjectError::Poisoned`] on a projector bug.
    pub fn project(&mut self, record: &Recorded) -> Result<EventOps, ProjectError> {
        self.project_traced(record).map(|(ops, _)| ops)
    }

    /// [`Projector::project`], with each operation's pre-image: the data of
    /// its node just before it (`None`: the node did not exist), so a sink
    /// can tell what the tree held before operations it has not applied.
    ///
    /// # Errors
    /// As [`Projector::project`].
    pub fn project_traced(
        &mut self,
        record: &Recorded,
    ) -> Result<(EventOps, PreImages), ProjectError> {
        if let Some(position) = self.poisoned {
            return Err(ProjectError::Poisoned { position });
        }
        self.state.apply(record)?;
        let position = record.envelope.position;
        let Projector {
            state, tree, refs, ..
        } = self;
        let mut tx = Txn::new(tree);
        match project_event(state, refs, &mut tx, record) {
            Ok(()) => {
                let before = tx.undo.iter().map(|(_, b)| b.clone()).collect();
                Ok((tx.finish(position), before))
            }
            Err(source) => {
                tx.rollback();
                self.poisoned = Some(position);
                Err(ProjectError::Defect {
                    position,
                    kind: record.event.kind(),
                    source,
                })
            }
        }
    }

    /// Projects records in order, collecting each one's operations.
    ///
    /// # Errors
    /// The first record's error, as [`Projector::project`]; the records before
    /// it stay projected.
    pub fn project_all<'a>(
        &mut self,
        records: impl IntoIterator<Item = &'a Recorded>,
    ) -> Result<Vec<EventOps>, ProjectError> {
        records.into_iter().map(|r| self.project(r)).collect()
    }

    /// The tree the operations so far produce.
    pub fn tree(&self) -> &Tree {
        &self.tree
    }

    /// The tree, consuming the projector.
    pub fn into_tree(self) -> Tree {
        self.tree
    }

    /// The state folded from the records so far.
    pub fn state(&self) -> &State {
        &self.state
    }

    /// The position of the last record projected (0 before any).
    pub fn position(&self) -> u64 {
        self.state.position
    }
}

fn project_event(
    state: &State,
    refs: &mut BTreeMap<Jid, JobRefs>,
    tx: &mut Txn<'_>,
    record: &Recorded,
) -> Result<(), TreeError> {
    let stream = record.envelope.stream;
    match (&record.event, stream) {
        (Event::BatchSubmitted(e), StreamId::Batch(bid)) => {
            let Some(b) = state.batches.get(&bid) else {
                return Ok(());
            };
            tx.create(&layout::batch(bid), "")?;
            tx.create(
                &layout::batch_submission(bid),
                layout::submission_json(&e.uuid, &e.submission, b.created),
            )?;
            tx.create(
                &layout::batch_status(bid),
                layout::batch_status_json(b.status, b.last_modified, &b.message),
            )?;
            tx.create(&layout::batch_uuid(&e.uuid), bid.to_string())?;
        }
        (
            Event::BatchHeld(_)
            | Event::BatchReleased(_)
            | Event::BatchAcquired(_)
            | Event::BatchReportingStarted(_)
            | Event::BatchUpdateReporting(_)
            | Event::BatchCompleted(_)
            | Event::BatchFailed(_)
            | Event::BatchDeleted(_),
            StreamId::Batch(bid),
        ) => {
            let Some(b) = state.batches.get(&bid) else {
                return Ok(());
            };
            if matches!(record.event, Event::BatchAcquired(_)) {
                // mrt-zk marks an acquired batch by creating its `states` node.
                tx.ensure(&layout::batch_states(bid))?;
            }
            tx.upsert(
                &layout::batch_status(bid),
                layout::batch_status_json(b.status, b.last_modified, &b.message),
            )?;
        }
        (Event::BatchReported(_), StreamId::Batch(bid)) => {
            if let Some(report) = state.batches.get(&bid).and_then(|b| b.report.as_ref()) {
                tx.upsert(
                    &layout::batch_status_report(bid),
                    layout::status_report_json(report),
                )?;
            }
        }
        (Event::BatchCleanedUp(e), StreamId::Batch(bid)) => {
            let Some(b) = state.batches.get(&bid) else {
                return Ok(());
            };
            let jobs: BTreeSet<Jid> = e.jobs.iter().chain(&b.jobs).copied().collect();
            for jid in jobs {
                // Each job's nodes go together, so a sink that must split a
                // huge cleanup never leaves a job half-deleted.
                tx.split_here();
                if let Some(r) = refs.remove(&jid) {
                    tx.delete_if_exists(&r.queue)?;
                    tx.delete_if_exists(&r.batch)?;
                }
                tx.delete_tree(&layout::job(jid))?;
            }
            tx.split_here();
            tx.delete_tree(&layout::batch(bid))?;
            tx.delete_if_exists(&layout::batch_uuid(&b.uuid))?;
        }
        (Event::JobCreated(e), StreamId::Job(jid)) => {
            let Some(j) = state.jobs.get(&jid) else {
                return Ok(());
            };
            tx.create(&layout::job(jid), "")?;
            tx.create(&layout::job_bid(jid), e.bid.to_string())?;
            tx.create(&layout::job_priority(jid), j.priority.to_string())?;
            tx.create(&layout::job_space_needed(jid), j.space_needed.to_string())?;
            tx.create(
                &layout::job_configuration(jid),
                layout::configuration_json(
                    &j.configuration,
                    &j.metadata,
                    state.batches.get(&e.bid).map_or(j.created, |b| b.created),
                ),
            )?;
            if let Some(data) = layout::identifiers_json(&j.identifiers) {
                tx.create(&layout::job_identifiers(jid), data)?;
            }
            if let Some(data) = layout::metadata_json(&j.metadata) {
                tx.create(&layout::job_metadata(jid), data)?;
            }
            tx.create(&layout::job_status(jid), layout::job_status_json(j))?;
            place(refs, tx, j)?;
        }
        (Event::JobStatusChanged(_) | Event::JobDeleted(_), StreamId::Job(jid)) => {
            let Some(j) = state.jobs.get(&jid) else {
                return Ok(());
            };
            // The order of the transitions document: job data, then the queue
            // reference, then the batch set.
            tx.upsert(&layout::job_status(jid), layout::job_status_json(j))?;
            tx.upsert(&layout::job_priority(jid), j.priority.to_string())?;
            place(refs, tx, j)?;
        }
        // The kind of the failure the job just moved to Failed with: its
        // status node names it.
        (Event::JobFailureClassified(_), StreamId::Job(jid)) => {
            if let Some(j) = state.jobs.get(&jid) {
                tx.upsert(&layout::job_status(jid), layout::job_status_json(j))?;
            }
        }
        (Event::JobSpaceEstimated(_), StreamId::Job(jid)) => {
            let Some(j) = state.jobs.get(&jid) else {
                return Ok(());
            };
            tx.upsert(&layout::job_space_needed(jid), j.space_needed.to_string())?;
            tx.upsert(&layout::job_priority(jid), j.priority.to_string())?;
            place(refs, tx, j)?;
        }
        (Event::JobIdentifiersAssigned(_), StreamId::Job(jid)) => {
            let Some(j) = state.jobs.get(&jid) else {
                return Ok(());
            };
            let path = layout::job_identifiers(jid);
            match layout::identifiers_json(&j.identifiers) {
                Some(data) => tx.upsert(&path, data)?,
                // Readers treat a missing node as empty identifiers.
                None => tx.delete_if_exists(&path)?,
            }
        }
        (Event::JobStoreRecorded(_), StreamId::Job(jid)) => {
            if let Some(s) = state.jobs.get(&jid).and_then(|j| j.store.as_ref()) {
                tx.upsert(&layout::job_store(jid), layout::store_json(s))?;
            }
        }
        (Event::JobInventoryRecorded(_), StreamId::Job(jid)) => {
            if let Some(i) = state.jobs.get(&jid).and_then(|j| j.inventory.as_ref()) {
                tx.upsert(&layout::job_inventory(jid), layout::inventory_json(i))?;
            }
        }
        (Event::CollectionHeld(e), StreamId::System) => {
            tx.create(&layout::collection_lock(&e.profile), "")?;
        }
        (Event::CollectionReleased(e), StreamId::System) => {
            tx.delete(&layout::collection_lock(&e.profile))?;
        }
        (Event::QueuePaused(_), StreamId::System) => {
            tx.create(layout::QUEUE_LOCK, "")?;
        }
        (Event::QueueResumed(_), StreamId::System) => {
            tx.delete(layout::QUEUE_LOCK)?;
        }
        (Event::AccessRequested(e), StreamId::Access(qid)) => {
            let Some(a) = state.access.get(&qid) else {
                return Ok(());
            };
            // mrt-zk's `createAssembly`: the token, then the status.
            tx.create(&layout::access(e.queue, qid), "")?;
            tx.create(
                &layout::access_token(e.queue, qid),
                layout::access_token_json(a),
            )?;
            tx.create(
                &layout::access_status(e.queue, qid),
                layout::access_status_json(a),
            )?;
        }
        (Event::AccessStatusChanged(_), StreamId::Access(qid)) => {
            let Some(a) = state.access.get(&qid) else {
                return Ok(());
            };
            tx.upsert(
                &layout::access_status(a.queue, qid),
                layout::access_status_json(a),
            )?;
        }
        (Event::AccessPackagingChosen(_) | Event::AccessDelivered(_), StreamId::Access(qid)) => {
            let Some(a) = state.access.get(&qid) else {
                return Ok(());
            };
            tx.upsert(
                &layout::access_token(a.queue, qid),
                layout::access_token_json(a),
            )?;
        }
        (Event::AccessQueuePaused(e), StreamId::System) => {
            tx.create(&layout::access_queue_lock(e.queue), "")?;
        }
        (Event::AccessQueueResumed(e), StreamId::System) => {
            tx.delete(&layout::access_queue_lock(e.queue))?;
        }
        // Recorded for history and reports; nothing in the tree changes.
        (
            Event::JobStepRetried(_)
            | Event::TreeRepaired(_)
            | Event::ConsistencyRepaired(_)
            | Event::ForeignChangeRepaired(_),
            _,
        ) => {}
        // A signed checkpoint is audit evidence only.
        (Event::LogCheckpointed(_), _) => {}
        // Any other pairing of event and stream is refused by the fold before
        // this point.
        _ => {}
    }
    Ok(())
}

/// Puts a job's queue reference and batch set child where its state says,
/// moving them when they changed (delete the old one, then create the new).
fn place(refs: &mut BTreeMap<Jid, JobRefs>, tx: &mut Txn<'_>, job: &Job) -> Result<(), TreeError> {
    let want = JobRefs {
        queue: layout::queue_ref(job.status, job.priority, job.jid),
        batch: layout::batch_child(job.bid, BatchSet::of(job.status), job.jid),
    };
    let old = refs.get(&job.jid).cloned();
    if old.as_ref().map(|o| &o.queue) != Some(&want.queue) {
        if let Some(o) = &old {
            tx.delete_if_exists(&o.queue)?;
        }
        tx.create(&want.queue, "")?;
    }
    if old.as_ref().map(|o| &o.batch) != Some(&want.batch) {
        if let Some(o) = &old {
            tx.delete_if_exists(&o.batch)?;
        }
        tx.create(&want.batch, "")?;
    }
    refs.insert(job.jid, want);
    Ok(())
}

/// The operations of one event, applied to the model as they are generated
/// (so later operations see earlier ones) and undone together on a defect.
struct Txn<'a> {
    tree: &'a mut Tree,
    ops: Vec<Op>,
    undo: Vec<(String, Option<Vec<u8>>)>,
    split_points: Vec<usize>,
}

impl<'a> Txn<'a> {
    fn new(tree: &'a mut Tree) -> Txn<'a> {
        Txn {
            tree,
            ops: Vec::new(),
            undo: Vec::new(),
            split_points: Vec::new(),
        }
    }

    fn emit(&mut self, op: Op) -> Result<(), TreeError> {
        let previous = self.tree.get(op.path()).map(<[u8]>::to_vec);
        self.tree.apply(&op)?;
        self.undo.push((op.path().to_string(), previous));
        self.ops.push(op);
        Ok(())
    }

    /// Creates the missing ancestors of `path` (empty), parents first.
    fn ensure_parents(&mut self, path: &str) -> Result<(), TreeError> {
        let mut missing = Vec::new();
        let mut p = parent(path);
        while let Some(dir) = p {
            if self.tree.contains(dir) {
                break;
            }
            missing.push(dir.to_string());
            p = parent(dir);
        }
        for dir in missing.into_iter().rev() {
            self.emit(Op::create(dir, Vec::new()))?;
        }
        Ok(())
    }

    /// Creates a node that must not exist yet, and its missing ancestors.
    fn create(&mut self, path: &str, data: impl Into<Vec<u8>>) -> Result<(), TreeError> {
        self.ensure_parents(path)?;
        self.emit(Op::create(path, data))
    }

    /// Creates an empty node (and its ancestors) unless it exists.
    fn ensure(&mut self, path: &str) -> Result<(), TreeError> {
        if self.tree.contains(path) {
            return Ok(());
        }
        self.create(path, Vec::new())
    }

    /// Creates the node, or sets its data when it differs.
    fn upsert(&mut self, path: &str, data: impl Into<Vec<u8>>) -> Result<(), TreeError> {
        let data = data.into();
        match self.tree.get(path) {
            None => self.create(path, data),
            Some(current) if current == data.as_slice() => Ok(()),
            Some(_) => self.emit(Op::set(path, data)),
        }
    }

    /// Deletes a node that must exist.
    fn delete(&mut self, path: &str) -> Result<(), TreeError> {
        self.emit(Op::delete(path))
    }

    fn delete_if_exists(&mut self, path: &str) -> Result<(), TreeError> {
        if self.tree.contains(path) {
            self.delete(path)?;
        }
        Ok(())
    }

    /// Deletes a node and everything under it, deepest first.
    fn delete_tree(&mut self, path: &str) -> Result<(), TreeError> {
        let below: Vec<String> = self.tree.descendants(path).map(str::to_string).collect();
        for p in below.iter().rev() {
            self.delete(p)?;
        }
        self.delete_if_exists(path)
    }

    /// Marks the current end of the list as a place the event may be cut.
    fn split_here(&mut self) {
        let at = self.ops.len();
        if at > 0 && self.split_points.last() != Some(&at) {
            self.split_points.push(at);
        }
    }

    fn finish(self, position: u64) -> EventOps {
        let len = self.ops.len();
        let mut split_points = self.split_points;
        split_points.retain(|p| *p < len);
        EventOps {
            position,
            ops: self.ops,
            split_points,
        }
    }

    fn rollback(self) {
        for (path, previous) in self.undo.into_iter().rev() {
            self.tree.restore(path, previous);
        }
    }
}

/// The parent of an absolute path (`None` for the root).
fn parent(path: &str) -> Option<&str> {
    match path.rfind('/') {
        Some(0) if path.len() > 1 => Some("/"),
        Some(0) | None => None,
        Some(i) => Some(&path[..i]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parents_of_paths() {
        assert_eq!(parent("/a/b"), Some("/a"));
        assert_eq!(parent("/a"), Some("/"));
        assert_eq!(parent("/"), None);
    }

    #[test]
    fn init_creates_base_nodes_once() {
        let mut p = Projector::new();
        let first = p.init().expect("init");
        assert_eq!(first.position, 0);
        assert!(first.ops.iter().all(|o| matches!(o, Op::Create { .. })));
        assert!(!p.tree().contains("/jobs/states/updatereporting"));
        assert!(p.tree().contains("/jobs/states/storing"));
        assert!(p.tree().contains("/locks/collections"));
        assert!(p.init().expect("again").ops.is_empty());
    }
}
