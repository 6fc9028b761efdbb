//! What an append asks of the log: the events of one command and the stream
//! versions they were decided against. `decide` builds these; the log (with
//! the `log` feature) writes them.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::event::{Actor, Event, StreamId};

/// What the writer of an append expects a stream's version to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpectedVersion {
    /// No check.
    Any,
    /// The stream must not exist yet.
    NoStream,
    /// The stream's last version must be exactly this.
    Exact(u64),
}

impl std::fmt::Display for ExpectedVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ExpectedVersion::Any => f.write_str("any version"),
            ExpectedVersion::NoStream => f.write_str("no stream"),
            ExpectedVersion::Exact(v) => write!(f, "version {v}"),
        }
    }
}

/// One event to append, with the stream it belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proposed {
    /// The stream.
    pub stream: StreamId,
    /// The event.
    pub event: Event,
}

/// The events of one command, appended atomically.
#[derive(Debug, Clone)]
pub struct AppendRequest {
    /// Who caused the events.
    pub actor: Actor,
    /// Ties the events to the command.
    pub correlation_id: Uuid,
    /// The engine's time for the command. The log never lets time go backwards:
    /// a timestamp before the head's is raised to the head's.
    pub timestamp: DateTime<Utc>,
    /// Stream versions the command was decided against.
    pub expectations: Vec<(StreamId, ExpectedVersion)>,
    /// The events, in order.
    pub events: Vec<Proposed>,
}
