//! The items of the tree whose nodes converge together: a job, a batch,
//! an access request, a pause or hold lock, or a node of no item.

use ingest_events::event::{AccessQueue, StreamId};
use ingest_events::{Bid, Jid, Qid};

/// One item of the tree whose nodes converge together.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Item {
    Job(Jid),
    Batch(Bid),
    Access(AccessQueue, Qid),
    /// A pause or hold lock, by path.
    Lock(String),
    /// A node of no item (a base node), by path: converged alone when a
    /// request names it (see `converge`); a failed transaction on one
    /// still stops the projector.
    Node(String),
}

impl Item {
    /// The item a path belongs to, if any.
    pub(super) fn of(path: &str, uuids: impl Fn(&str) -> Option<Bid>) -> Option<Item> {
        let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        match parts.as_slice() {
            ["jobs", "states", _, name] => {
                let (_, jid) = name.split_once('-')?;
                jid.parse().ok().map(Item::Job)
            }
            ["jobs", id, ..] => id.parse().ok().map(Item::Job),
            ["batches", _, "states", _, id] => id.parse().ok().map(Item::Job),
            ["batches", id, ..] => id.parse().ok().map(Item::Batch),
            ["batch-uuids", uuid] => uuids(uuid).map(Item::Batch),
            ["access", queue, id, ..] => {
                let queue = AccessQueue::ALL.into_iter().find(|q| q.name() == *queue)?;
                id.parse().ok().map(|q| Item::Access(queue, q))
            }
            ["locks", "queue", "ingest" | "accessSmall" | "accessLarge"]
            | ["locks", "collections", _] => Some(Item::Lock(path.to_string())),
            _ => None,
        }
    }

    /// The stream its record goes on.
    pub(super) fn stream(&self) -> StreamId {
        match self {
            Item::Job(j) => StreamId::Job(*j),
            Item::Batch(b) => StreamId::Batch(*b),
            Item::Access(_, q) => StreamId::Access(*q),
            Item::Lock(_) | Item::Node(_) => StreamId::System,
        }
    }

    /// How the record names it.
    pub(super) fn name(&self) -> String {
        match self {
            Item::Job(j) => format!("job {j}"),
            Item::Batch(b) => format!("batch {b}"),
            Item::Access(q, id) => format!("access request {id} ({q})"),
            Item::Lock(p) => format!("lock {p}"),
            Item::Node(p) => format!("node {p}"),
        }
    }
}

/// The found data as a record keeps it: UTF-8 (lossy), control characters
/// replaced, cut to [`ingest_events::event::ForeignNode::MAX_FOUND_BYTES`].
pub(super) fn found_text(data: &[u8]) -> String {
    let text: String = String::from_utf8_lossy(data)
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect();
    let mut end = text
        .len()
        .min(ingest_events::event::ForeignNode::MAX_FOUND_BYTES);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_string()
}
