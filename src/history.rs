//! Audit history: every event of a batch and its jobs, or of one job, in log order.

use anyhow::{Context, Result};
use ingest_events::log::Log;
use ingest_events::{Bid, Jid, Recorded, State, StreamId};
use serde::Serialize;

/// One line of history.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct HistoryRow {
    /// Global position.
    pub position: u64,
    /// UTC time, RFC 3339.
    pub time: String,
    /// Who.
    pub actor: String,
    /// The batch or job.
    pub stream: String,
    /// Version within the stream.
    pub version: u64,
    /// Event kind.
    pub event: String,
    /// The transition or what was recorded.
    pub detail: String,
    /// The command's correlation id.
    pub correlation_id: String,
}

impl From<&Recorded> for HistoryRow {
    fn from(r: &Recorded) -> HistoryRow {
        HistoryRow {
            position: r.envelope.position,
            time: r
                .envelope
                .timestamp
                .to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
            actor: r.envelope.actor.to_string(),
            stream: r.envelope.stream.to_string(),
            version: r.envelope.version,
            event: r.event.kind().to_string(),
            detail: r.event.describe(),
            correlation_id: r.envelope.correlation_id.to_string(),
        }
    }
}

/// Every event of a batch and of each of its jobs, by position.
///
/// # Errors
/// When the batch is unknown or the log cannot be read.
pub fn batch_history(log: &Log, state: &State, bid: Bid) -> Result<Vec<HistoryRow>> {
    let batch = state
        .batches
        .get(&bid)
        .with_context(|| format!("batch {bid} does not exist"))?;
    batch_rows(log, bid, &batch.jobs)
}

/// Every event of a batch and of the given jobs (its jobs), by position.
///
/// # Errors
/// When the log cannot be read.
pub fn batch_rows(log: &Log, bid: Bid, jobs: &[Jid]) -> Result<Vec<HistoryRow>> {
    let mut records = log.read_stream(StreamId::Batch(bid))?;
    for jid in jobs {
        records.extend(log.read_stream(StreamId::Job(*jid))?);
    }
    records.sort_by_key(|r| r.envelope.position);
    Ok(records.iter().map(HistoryRow::from).collect())
}

/// Every event of one job, by position.
///
/// # Errors
/// When the job is unknown or the log cannot be read.
pub fn job_history(log: &Log, state: &State, jid: Jid) -> Result<Vec<HistoryRow>> {
    state
        .jobs
        .get(&jid)
        .with_context(|| format!("job {jid} does not exist"))?;
    job_rows(log, jid)
}

/// Every event of one job's stream, by position.
///
/// # Errors
/// When the log cannot be read.
pub fn job_rows(log: &Log, jid: Jid) -> Result<Vec<HistoryRow>> {
    Ok(log
        .read_stream(StreamId::Job(jid))?
        .iter()
        .map(HistoryRow::from)
        .collect())
}

/// Renders rows as an aligned text table.
pub fn table(rows: &[HistoryRow]) -> String {
    let headers = ["POS", "TIME", "ACTOR", "STREAM", "EVENT", "DETAIL"];
    let cells: Vec<[String; 6]> = rows
        .iter()
        .map(|r| {
            [
                r.position.to_string(),
                r.time.clone(),
                r.actor.clone(),
                r.stream.clone(),
                r.event.clone(),
                r.detail.clone(),
            ]
        })
        .collect();
    let mut widths = headers.map(str::len);
    for c in &cells {
        for (w, cell) in widths.iter_mut().zip(c.iter()).take(5) {
            *w = (*w).max(cell.len());
        }
    }
    let mut out = String::new();
    let line = |out: &mut String, c: [&str; 6]| {
        for i in 0..5 {
            out.push_str(&format!("{:<w$}  ", c[i], w = widths[i]));
        }
        out.push_str(c[5]);
        out.push('\n');
    };
    line(&mut out, headers);
    for c in &cells {
        line(&mut out, [&c[0], &c[1], &c[2], &c[3], &c[4], &c[5]]);
    }
    out
}
