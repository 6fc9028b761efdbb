//! The in-memory projector: brought to what the tree holds, plus the events
//! projected and not yet applied.

use chrono::{DateTime, Utc};
use ingest_events::Hash;

use crate::checkpoint::Checkpoint;
use crate::ops::EventOps;
use crate::projector::{PreImages, Projector};

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
    /// For each pending event, each operation's pre-image (the node's data
    /// before it; `None`: absent), to tell what the tree holds.
    pub(super) before: Vec<PreImages>,
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
            before: Vec::new(),
            parts_done: 0,
            applied: Checkpoint::genesis(),
            loaded: false,
            pending_bytes: 0,
            pending_ops: 0,
        }
    }

    pub(super) fn push(&mut self, ops: EventOps, before: PreImages, meta: Meta) {
        self.pending_bytes += ops.serialized_size();
        self.pending_ops += ops.ops.len();
        self.pending.push(ops);
        self.before.push(before);
        self.meta.push(meta);
    }

    pub(super) fn drop_front(&mut self, n: usize) {
        for e in self.pending.drain(..n) {
            self.pending_bytes -= e.serialized_size();
            self.pending_ops -= e.ops.len();
        }
        self.meta.drain(..n);
        self.before.drain(..n);
    }

    pub(super) fn clear_pending(&mut self) {
        self.pending.clear();
        self.meta.clear();
        self.before.clear();
        self.parts_done = 0;
        self.pending_bytes = 0;
        self.pending_ops = 0;
    }
}

impl Model {
    /// What the tree holds at `path` once the applied checkpoint is in it
    /// and nothing after it: the pre-image of the first pending operation
    /// on `path` not applied yet, else the projector's own tree.
    pub(super) fn applied_data(&self, path: &str) -> Option<Vec<u8>> {
        for (e, event) in self.pending.iter().enumerate() {
            let skip = if e == 0 { self.applied_ops() } else { 0 };
            for (i, op) in event.ops.iter().enumerate().skip(skip) {
                if op.path() == path {
                    return self.before.get(e).and_then(|b| b.get(i)).cloned().flatten();
                }
            }
        }
        self.projector.tree().get(path).map(<[u8]>::to_vec)
    }

    /// The operations of `pending[0]` already in the tree (its applied parts).
    fn applied_ops(&self) -> usize {
        match self.pending.first() {
            Some(e) if self.parts_done > 0 => e
                .parts()
                .iter()
                .take(self.parts_done)
                .map(|p| p.len())
                .sum(),
            _ => 0,
        }
    }

    /// Every path at or below `root` the applied tree may hold: the
    /// projector's tree and the pending operations' paths (check each with
    /// [`Model::applied_data`]).
    pub(super) fn paths_under(&self, root: &str) -> std::collections::BTreeSet<String> {
        let prefix = format!("{root}/");
        let mut out: std::collections::BTreeSet<String> = self
            .projector
            .tree()
            .descendants(root)
            .map(str::to_string)
            .collect();
        out.insert(root.to_string());
        for e in &self.pending {
            for op in &e.ops {
                if op.path().starts_with(&prefix) {
                    out.insert(op.path().to_string());
                }
            }
        }
        out
    }
}
