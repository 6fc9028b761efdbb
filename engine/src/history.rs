//! Audit history: every event of a batch and its jobs, or of one job, in log order.

use anyhow::{Context, Result};
use ingest_events::log::Log;
use ingest_events::{Bid, Event, Jid, State, StreamId};
pub use ingest_protocol::history::{HistoryQuery, HistoryRow};

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

/// What a history query covers besides its filters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// Every stream of the log.
    Log,
    /// A batch's stream and the streams of these jobs (its jobs).
    Batch(Bid, Vec<Jid>),
    /// One job's stream.
    Job(Jid),
}

/// The collection a system event is about (a hold, a release).
fn collection_of(event: &Event) -> Option<&str> {
    match event {
        Event::CollectionHeld(e) => Some(&e.profile),
        Event::CollectionReleased(e) => Some(&e.profile),
        _ => None,
    }
}

/// The rows of a history query, by position, and whether more matched than
/// its limit.
///
/// Answered from indexes, never by scanning the log: the time window is a
/// binary search over positions (the log's timestamps never go backwards),
/// a scope or collection is read from the stream and collection indexes,
/// an actor from the actor index; only the records that match are read.
/// Only durable events are answered.
///
/// # Errors
/// When the log cannot be read.
pub fn query(log: &Log, scope: &Scope, q: &HistoryQuery) -> Result<(Vec<HistoryRow>, bool)> {
    let durable = log.durable_position();
    let lo = match q.since {
        Some(t) => log.first_position_from(t)?,
        None => 1,
    };
    let hi = match q.until {
        Some(t) => log.first_position_from(t)?.saturating_sub(1),
        None => durable,
    }
    .min(durable);
    if lo > hi {
        return Ok((Vec::new(), false));
    }
    let mut streams: Option<Vec<StreamId>> = match scope {
        Scope::Log => None,
        Scope::Batch(bid, jobs) => Some(
            std::iter::once(StreamId::Batch(*bid))
                .chain(jobs.iter().map(|j| StreamId::Job(*j)))
                .collect(),
        ),
        Scope::Job(jid) => Some(vec![StreamId::Job(*jid)]),
    };
    if let Some(c) = &q.collection {
        let of_collection = log.collection_streams(c)?;
        streams = Some(match streams {
            None => of_collection,
            Some(s) => {
                let keep: std::collections::HashSet<StreamId> = of_collection.into_iter().collect();
                s.into_iter().filter(|s| keep.contains(s)).collect()
            }
        });
    }
    // The collection's own events (its holds and releases) are in the
    // system stream, which the collection index does not name.
    let mut own = Vec::new();
    if let (Some(c), Scope::Log) = (&q.collection, scope) {
        for p in log.stream_positions(StreamId::System)? {
            if (lo..=hi).contains(&p) && collection_of(&log.read_one(p)?.event) == Some(c.as_str())
            {
                own.push(p);
            }
        }
    }
    let listed: Option<Vec<u64>> = match streams {
        None => None,
        Some(streams) => {
            let mut positions = own;
            for s in streams {
                positions.extend(
                    log.stream_positions(s)?
                        .into_iter()
                        .filter(|p| (lo..=hi).contains(p)),
                );
            }
            positions.sort_unstable();
            positions.dedup();
            Some(positions)
        }
    };
    let runs = match &q.actor {
        Some(a) => Some(log.actor_runs(a, lo..=hi)?),
        None => None,
    };
    let in_runs = |p: u64, runs: &[std::ops::RangeInclusive<u64>]| {
        let i = runs.partition_point(|r| *r.start() <= p);
        i > 0 && runs[i - 1].contains(&p)
    };
    let positions: Box<dyn Iterator<Item = u64>> = match (listed, runs) {
        (Some(list), Some(runs)) => Box::new(list.into_iter().filter(move |p| in_runs(*p, &runs))),
        (Some(list), None) => Box::new(list.into_iter()),
        (None, Some(runs)) => Box::new(runs.into_iter().flatten()),
        (None, None) => Box::new(lo..=hi),
    };
    let limit = q.row_limit();
    let mut rows = Vec::new();
    for p in positions {
        let r = log.read_one(p)?;
        // The actor index is keyed by a hash: compare the actor itself.
        if q.actor.as_ref().is_some_and(|a| *a != r.envelope.actor) {
            continue;
        }
        if rows.len() == limit {
            return Ok((rows, true));
        }
        rows.push(HistoryRow::from(&r));
    }
    Ok((rows, false))
}
