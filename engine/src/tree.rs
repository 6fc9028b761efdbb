//! The tree the log projects, at its head or at an earlier position or
//! time (`ingest tree --at`, `GET /tree?at=`).

use anyhow::{bail, Context, Result};
use chrono::{DateTime, Utc};
use ingest_events::log::Log;
use ingest_projections::{Projector, Tree};

/// How far back `--at` goes.
pub enum At {
    /// A log position.
    Position(u64),
    /// A time: every event up to it.
    Time(DateTime<Utc>),
}

/// Parses `--at`: a log position or an RFC 3339 time.
///
/// # Errors
/// Neither.
pub fn parse_at(text: &str) -> Result<At> {
    if let Ok(p) = text.parse::<u64>() {
        return Ok(At::Position(p));
    }
    DateTime::parse_from_rfc3339(text)
        .map(|t| At::Time(t.with_timezone(&Utc)))
        .with_context(|| {
            format!("--at {text:?} is neither a log position nor an RFC 3339 time (e.g. 2024-05-16T10:11:12Z)")
        })
}

/// The tree the log projects, as of `at` (a position or an RFC 3339 time).
///
/// # Errors
/// A bad `at`, a position beyond the log, or an unreadable log.
pub fn tree_from_log(log: &Log, at: Option<&str>) -> Result<Tree> {
    let durable = log.durable_position();
    let at = at.map(parse_at).transpose()?;
    if let Some(At::Position(p)) = at {
        if p > durable {
            bail!("position {p} is beyond the end of the log ({durable})");
        }
    }
    let mut projector = Projector::new();
    projector.init().context("projecting the base nodes")?;
    for record in log.read_from(1) {
        let record = record.context("reading the event log")?;
        let past = match at {
            None => false,
            Some(At::Position(p)) => record.envelope.position > p,
            Some(At::Time(t)) => record.envelope.timestamp > t,
        };
        if past {
            break;
        }
        projector
            .project(&record)
            .with_context(|| format!("projecting position {}", record.envelope.position))?;
    }
    Ok(projector.into_tree())
}
