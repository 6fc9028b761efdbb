//! The tree the log projects, at its head or at an earlier position or
//! time (`ingest tree --at`, `GET /tree?at=`).

use anyhow::{bail, Context, Result};
use chrono::{DateTime, Utc};
use ingest_events::log::Log;
use ingest_projections::{materialize, Tree, Until};

/// Parses `--at`: a log position or an RFC 3339 time.
///
/// # Errors
/// Neither.
pub fn parse_at(text: &str) -> Result<Until> {
    if let Ok(p) = text.parse::<u64>() {
        return Ok(Until::Position(p));
    }
    DateTime::parse_from_rfc3339(text)
        .map(|t| Until::Time(t.with_timezone(&Utc)))
        .with_context(|| {
            format!(
                "--at {} is neither a log position nor an RFC 3339 time (e.g. 2024-05-16T10:11:12Z)",
                ingest_protocol::submission::quoted(text)
            )
        })
}

/// The tree the log projects, as of `at` (a position or an RFC 3339 time;
/// the whole log without it). Records after the point are not read.
///
/// # Errors
/// A bad `at`, a position beyond the log, or an unreadable log.
pub fn tree_from_log(log: &Log, at: Option<&str>) -> Result<Tree> {
    let durable = log.durable_position();
    let until = at.map(parse_at).transpose()?.unwrap_or(Until::End);
    if let Until::Position(p) = until {
        if p > durable {
            bail!("position {p} is beyond the end of the log ({durable})");
        }
    }
    let mut unreadable = None;
    let records = log.read_from(1).map_while(|r| match r {
        Ok(r) => Some(r),
        Err(e) => {
            unreadable = Some(e);
            None
        }
    });
    let tree = materialize(records, until).context("projecting the log")?;
    match unreadable {
        Some(e) => Err(e).context("reading the event log"),
        None => Ok(tree),
    }
}
