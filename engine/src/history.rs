//! Audit history: every event of a batch and its jobs, or of one job, in log order.

use anyhow::{Context, Result};
use ingest_events::log::Log;
use ingest_events::{Bid, Jid, State, StreamId};
pub use ingest_protocol::history::HistoryRow;

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
