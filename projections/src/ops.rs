//! Node operations: what the projector asks ZooKeeper to do.
//!
//! An [`Op`] is one ZooKeeper write (create, set data, delete) on an absolute
//! path inside the Merritt root (`/batches/...`); the chroot is the sink's
//! business. The projector returns the operations of one event as an
//! [`EventOps`], tagged with the event's log position, so that a sink can put
//! several events into one `multi` transaction and cap each transaction by its
//! serialized size ([`Op::serialized_size`], [`batches_by_size`]).

use std::fmt;
use std::ops::Range;

/// One ZooKeeper write. Data is UTF-8 text (JSON, decimal numbers, ids) or empty.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Op {
    /// Create a persistent node; fails if it exists or its parent does not.
    Create {
        /// Absolute path.
        path: String,
        /// The node's data.
        data: Vec<u8>,
    },
    /// Replace the data of an existing node (any version).
    SetData {
        /// Absolute path.
        path: String,
        /// The new data.
        data: Vec<u8>,
    },
    /// Delete an existing node that has no children (any version).
    Delete {
        /// Absolute path.
        path: String,
    },
}

/// The kind of an [`Op`], for messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OpKind {
    /// [`Op::Create`].
    Create,
    /// [`Op::SetData`].
    SetData,
    /// [`Op::Delete`].
    Delete,
}

impl fmt::Display for OpKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OpKind::Create => "create",
            OpKind::SetData => "set",
            OpKind::Delete => "delete",
        })
    }
}

/// Bytes of a `multi` sub-request header (type `int`, done `bool`, err `int`).
const MULTI_HEADER: usize = 4 + 1 + 4;
/// Bytes of a length-prefixed string or buffer, without its content.
const LEN_PREFIX: usize = 4;
/// Bytes of the `OPEN_ACL_UNSAFE` ACL list: count, then perms + "world" + "anyone".
const OPEN_ACL: usize = 4 + (4 + LEN_PREFIX + 5 + LEN_PREFIX + 6);
/// Bytes of a version or flags `int`.
const INT: usize = 4;

/// Bytes a `multi` request needs beyond its operations: the frame length, the
/// request header (xid, type) and the closing sub-request header.
pub const TRANSACTION_OVERHEAD: usize = 4 + 8 + MULTI_HEADER;

impl Op {
    /// A create with UTF-8 text data.
    pub fn create(path: impl Into<String>, data: impl Into<Vec<u8>>) -> Op {
        Op::Create {
            path: path.into(),
            data: data.into(),
        }
    }

    /// A set-data with UTF-8 text data.
    pub fn set(path: impl Into<String>, data: impl Into<Vec<u8>>) -> Op {
        Op::SetData {
            path: path.into(),
            data: data.into(),
        }
    }

    /// A delete.
    pub fn delete(path: impl Into<String>) -> Op {
        Op::Delete { path: path.into() }
    }

    /// The path the operation writes.
    pub fn path(&self) -> &str {
        match self {
            Op::Create { path, .. } | Op::SetData { path, .. } | Op::Delete { path } => path,
        }
    }

    /// The data written, if the operation writes data.
    pub fn data(&self) -> Option<&[u8]> {
        match self {
            Op::Create { data, .. } | Op::SetData { data, .. } => Some(data),
            Op::Delete { .. } => None,
        }
    }

    /// What kind of operation it is.
    pub fn kind(&self) -> OpKind {
        match self {
            Op::Create { .. } => OpKind::Create,
            Op::SetData { .. } => OpKind::SetData,
            Op::Delete { .. } => OpKind::Delete,
        }
    }

    /// An estimate of the bytes this operation takes inside a ZooKeeper
    /// `multi` request (jute encoding: sub-request header, length-prefixed
    /// path and data, version, and for a create the ACL list and flags).
    ///
    /// # Cautions
    /// The ACL part assumes `OPEN_ACL_UNSAFE` (one `world:anyone` entry), as
    /// mrt-zk uses; a sink that writes other ACLs must add their size. Keep the
    /// transaction cap well under the server's `jute.maxbuffer` (1 MiB by
    /// default) rather than close to it.
    pub fn serialized_size(&self) -> usize {
        let path = LEN_PREFIX + self.path().len();
        MULTI_HEADER
            + match self {
                Op::Create { data, .. } => path + LEN_PREFIX + data.len() + OPEN_ACL + INT,
                Op::SetData { data, .. } => path + LEN_PREFIX + data.len() + INT,
                Op::Delete { .. } => path + INT,
            }
    }
}

impl fmt::Display for Op {
    /// `create /path = data`, `set /path = data`, `delete /path`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.kind(), self.path())?;
        if let Some(data) = self.data() {
            write!(f, " = {}", String::from_utf8_lossy(data))?;
        }
        Ok(())
    }
}

/// The operations one event projects to, in the order they must be applied.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EventOps {
    /// The event's log position (0 for the base nodes of [`crate::Projector::init`]).
    pub position: u64,
    /// The operations, valid against the tree the previous events left.
    pub ops: Vec<Op>,
    /// Indices into `ops` where the list may be cut into separate
    /// transactions without leaving a job half-written, for an event too large
    /// for one transaction (the cleanup of a very large batch). Each index is
    /// the start of a new part; empty when the event must be applied whole.
    pub split_points: Vec<usize>,
}

impl EventOps {
    /// The estimated serialized size of all the event's operations
    /// (without [`TRANSACTION_OVERHEAD`]).
    pub fn serialized_size(&self) -> usize {
        self.ops.iter().map(Op::serialized_size).sum()
    }

    /// Whether the event writes nothing.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// The parts of `ops` delimited by [`EventOps::split_points`].
    pub fn parts(&self) -> Vec<&[Op]> {
        let mut parts = Vec::with_capacity(self.split_points.len() + 1);
        let mut start = 0;
        for &p in &self.split_points {
            if p > start && p < self.ops.len() {
                parts.push(&self.ops[start..p]);
                start = p;
            }
        }
        parts.push(&self.ops[start..]);
        parts
    }
}

/// Groups consecutive events into transactions whose operations fit
/// `max_bytes` (including [`TRANSACTION_OVERHEAD`]), never splitting an event.
/// Returns ranges of indices into `events`, in order, covering all of them.
///
/// # Cautions
/// An event larger than `max_bytes` on its own gets a range of its own and
/// still exceeds the cap; the sink must then apply it in the parts given by
/// [`EventOps::parts`] (and checkpoint within the event), or fail loudly.
pub fn batches_by_size(events: &[EventOps], max_bytes: usize) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut size = TRANSACTION_OVERHEAD;
    for (i, e) in events.iter().enumerate() {
        let s = e.serialized_size();
        if i > start && size + s > max_bytes {
            out.push(start..i);
            start = i;
            size = TRANSACTION_OVERHEAD;
        }
        size += s;
    }
    if start < events.len() {
        out.push(start..events.len());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_count_path_data_and_fixed_parts() {
        let c = Op::create("/a", "xy");
        assert_eq!(c.serialized_size(), 9 + (4 + 2) + (4 + 2) + 27 + 4);
        let s = Op::set("/a", "xy");
        assert_eq!(s.serialized_size(), 9 + (4 + 2) + (4 + 2) + 4);
        let d = Op::delete("/a");
        assert_eq!(d.serialized_size(), 9 + (4 + 2) + 4);
    }

    #[test]
    fn batches_never_split_an_event_and_cover_all() {
        let e = |n: usize| EventOps {
            position: n as u64,
            ops: (0..n).map(|i| Op::delete(format!("/n{i}"))).collect(),
            split_points: vec![],
        };
        let events = vec![e(1), e(2), e(30), e(1), e(0)];
        let cap = TRANSACTION_OVERHEAD + e(3).serialized_size();
        let ranges = batches_by_size(&events, cap);
        assert_eq!(ranges, vec![0..2, 2..3, 3..5]);
        assert!(batches_by_size(&[], cap).is_empty());
    }

    #[test]
    fn parts_follow_split_points() {
        let ops: Vec<Op> = (0..5).map(|i| Op::delete(format!("/n{i}"))).collect();
        let e = EventOps {
            position: 1,
            ops,
            split_points: vec![2, 4],
        };
        let parts = e.parts();
        assert_eq!(parts.iter().map(|p| p.len()).collect::<Vec<_>>(), [2, 2, 1]);
    }

    #[test]
    fn display_names_the_op_and_path() {
        assert_eq!(Op::set("/a/b", "5").to_string(), "set /a/b = 5");
        assert_eq!(Op::delete("/a").to_string(), "delete /a");
    }
}
