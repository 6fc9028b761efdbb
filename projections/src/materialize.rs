//! Time travel: the tree the log implies at any earlier point of its
//! history (`ingest tree --at`, `GET /tree?at=`), by projecting records
//! from the start.

use std::borrow::Borrow;

use chrono::{DateTime, Utc};
use ingest_events::Recorded;

use crate::projector::{ProjectError, Projector};
use crate::tree::Tree;

/// How far to materialize the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Until {
    /// Every record given.
    End,
    /// Records up to and including this position.
    Position(u64),
    /// Records stamped at or before this time (the log's timestamps never go
    /// backwards, so this is a prefix of the log).
    Time(DateTime<Utc>),
}

/// The tree the log implies at a point in its history: the base nodes and
/// every record up to `until`, projected from the start. Records after the
/// point are not read.
///
/// # Errors
/// As [`Projector::project`]; the records must start at position 1.
pub fn materialize<I>(records: I, until: Until) -> Result<Tree, ProjectError>
where
    I: IntoIterator,
    I::Item: Borrow<Recorded>,
{
    let mut projector = Projector::new();
    projector.init()?;
    for r in records {
        let r = r.borrow();
        let past = match until {
            Until::End => false,
            Until::Position(p) => r.envelope.position > p,
            Until::Time(t) => r.envelope.timestamp > t,
        };
        if past {
            break;
        }
        projector.project(r)?;
    }
    Ok(projector.into_tree())
}
