//! Times read from a batch's history: when it was submitted, when each
//! job left and entered each state.

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use chrono::{DateTime, Utc};
use ingest_protocol::history::HistoryRow;

/// When a job left Pending and when it reached Completed.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct JobTimes {
    pub(crate) started: Option<DateTime<Utc>>,
    pub(crate) completed: Option<DateTime<Utc>>,
}

/// The time of the batch's BatchSubmitted event and each job's time of
/// reaching Completed, from a batch history.
pub(crate) fn timings(
    bid: &str,
    rows: &[HistoryRow],
) -> Result<(DateTime<Utc>, BTreeMap<String, JobTimes>)> {
    let time = |row: &HistoryRow| event_time(bid, row);
    let mut submitted = None;
    let mut jobs: BTreeMap<String, JobTimes> = BTreeMap::new();
    for row in rows {
        match row.event.as_str() {
            "BatchSubmitted" if row.stream == bid => submitted = Some(time(row)?),
            "JobStatusChanged" => {
                // "Notify -> Completed", possibly followed by ": message".
                let Some((from, to)) = row.detail.split_once(" -> ") else {
                    continue;
                };
                let to = to.split(|c: char| !c.is_ascii_alphanumeric()).next();
                let jid = row.stream.clone();
                let job = jobs.entry(jid).or_default();
                if from == "Pending" && job.started.is_none() {
                    job.started = Some(time(row)?);
                }
                if to == Some("Completed") {
                    job.completed = Some(time(row)?);
                }
            }
            _ => {}
        }
    }
    let submitted = submitted
        .with_context(|| format!("batch {bid}: no BatchSubmitted event in its history"))?;
    Ok((submitted, jobs))
}

/// When batch `bid` reached Completed (its BatchCompleted event), if it did.
pub(crate) fn batch_completed(bid: &str, rows: &[HistoryRow]) -> Result<Option<DateTime<Utc>>> {
    rows.iter()
        .filter(|row| row.stream == bid && row.event == "BatchCompleted")
        .map(|row| event_time(bid, row))
        .next_back()
        .transpose()
}

/// When an event of batch `bid`'s history happened.
pub(crate) fn event_time(bid: &str, row: &HistoryRow) -> Result<DateTime<Utc>> {
    Ok(DateTime::parse_from_rfc3339(&row.time)
        .with_context(|| format!("batch {bid}: the event time {:?}", row.time))?
        .with_timezone(&Utc))
}

/// A duration in milliseconds.
pub(crate) fn ms(d: chrono::TimeDelta) -> f64 {
    d.num_microseconds().unwrap_or(i64::MAX) as f64 / 1000.0
}

/// The nearest-rank percentile of sorted values.
pub(crate) fn nearest_rank(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// The largest value of a metric (over its label sets) in a Prometheus text page.
pub(crate) fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (key, value) = l.rsplit_once(' ')?;
            let bare = key.split('{').next()?;
            (bare == name).then(|| value.parse::<f64>().ok())?
        })
        .fold(0.0, f64::max)
}

/// A job's path through the states, from its batch's history.
#[derive(Debug, Clone, Default)]
pub(crate) struct JobTrace {
    /// Its first event (JobCreated).
    pub(crate) created: Option<DateTime<Utc>>,
    /// When it first entered each state.
    pub(crate) entered: BTreeMap<String, DateTime<Utc>>,
    /// When it last left each state.
    pub(crate) left: BTreeMap<String, DateTime<Utc>>,
    pub(crate) completed: Option<DateTime<Utc>>,
    /// The bytes its Downloading step reported ("downloaded N files, B bytes").
    pub(crate) downloaded: Option<u64>,
    pub(crate) retries: usize,
}

/// The time of the batch's BatchSubmitted event and each job's trace.
pub(crate) fn traces(
    bid: &str,
    rows: &[HistoryRow],
) -> Result<(DateTime<Utc>, BTreeMap<String, JobTrace>)> {
    let mut submitted = None;
    let mut jobs: BTreeMap<String, JobTrace> = BTreeMap::new();
    for row in rows {
        let at = event_time(bid, row)?;
        let stream = row.stream.as_str();
        if stream == bid {
            if row.event == "BatchSubmitted" {
                submitted = Some(at);
            }
            continue;
        }
        let job = jobs.entry(stream.to_string()).or_default();
        job.created.get_or_insert(at);
        match row.event.as_str() {
            "JobStepRetried" => job.retries += 1,
            "JobStatusChanged" => {
                // "Downloading -> Processing: downloaded 10 files, 4194304 bytes"
                let detail = row.detail.as_str();
                let Some((from, rest)) = detail.split_once(" -> ") else {
                    continue;
                };
                let to = rest
                    .split(|c: char| !c.is_ascii_alphanumeric())
                    .next()
                    .unwrap_or_default();
                job.left.insert(from.to_string(), at);
                job.entered.entry(to.to_string()).or_insert(at);
                if to == "Completed" {
                    job.completed = Some(at);
                }
                if from == "Downloading" {
                    if let Some(b) = downloaded_bytes(rest) {
                        job.downloaded = Some(b);
                    }
                }
            }
            _ => {}
        }
    }
    let submitted = submitted
        .with_context(|| format!("batch {bid}: no BatchSubmitted event in its history"))?;
    Ok((submitted, jobs))
}

/// B of "... downloaded N files, B bytes".
pub(crate) fn downloaded_bytes(detail: &str) -> Option<u64> {
    let rest = &detail[detail.find("downloaded ")?..];
    let (_, after) = rest.split_once(", ")?;
    after.split_whitespace().next()?.parse().ok()
}
