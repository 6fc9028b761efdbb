//! The in-memory projector: brought to what the tree holds, plus the events
//! projected and not yet applied.

use chrono::{DateTime, Utc};
use ingest_events::Hash;

use crate::checkpoint::Checkpoint;
use crate::ops::EventOps;
use crate::projector::Projector;

/// What the metadata of a projected, not yet applied event is.
#[derive(Debug, Clone, Copy)]
pub(super) struct Meta {
    pub(super) kind: &'static str,
    pub(super) hash: Hash,
    pub(super) timestamp: DateTime<Utc>,
}

/// The in-memory projector, brought to what the tree holds plus the events
/// projected and not yet applied.
pub(super) struct Model {
    pub(super) projector: Projector,
    /// Events after `applied`, in order; `projector` has projected them.
    pub(super) pending: Vec<EventOps>,
    pub(super) meta: Vec<Meta>,
    /// Parts of `pending[0]` already in the tree.
    pub(super) parts_done: usize,
    /// What the tree holds (never with `rebuilding`).
    pub(super) applied: Checkpoint,
    /// Whether the model was ever brought to a checkpoint.
    pub(super) loaded: bool,
    pub(super) pending_bytes: usize,
    pub(super) pending_ops: usize,
}

impl Model {
    pub(super) fn new() -> Model {
        Model {
            projector: Projector::new(),
            pending: Vec::new(),
            meta: Vec::new(),
            parts_done: 0,
            applied: Checkpoint::genesis(),
            loaded: false,
            pending_bytes: 0,
            pending_ops: 0,
        }
    }

    pub(super) fn push(&mut self, ops: EventOps, meta: Meta) {
        self.pending_bytes += ops.serialized_size();
        self.pending_ops += ops.ops.len();
        self.pending.push(ops);
        self.meta.push(meta);
    }

    pub(super) fn drop_front(&mut self, n: usize) {
        for e in self.pending.drain(..n) {
            self.pending_bytes -= e.serialized_size();
            self.pending_ops -= e.ops.len();
        }
        self.meta.drain(..n);
    }

    pub(super) fn clear_pending(&mut self) {
        self.pending.clear();
        self.meta.clear();
        self.parts_done = 0;
        self.pending_bytes = 0;
        self.pending_ops = 0;
    }
}
