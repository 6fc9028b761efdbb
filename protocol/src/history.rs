//! History rows: one line per event, as `ingest history` prints them and
//! `GET /batches/{bid}/history` answers them.

use chrono::{DateTime, Utc};
use ingest_events::{Actor, Bid, Jid, Recorded};
use serde::{Deserialize, Serialize};

use crate::listing::{text_filter, time_param, QueryError};

/// The most rows one history answer carries when no `limit` is given.
pub const DEFAULT_HISTORY_LIMIT: usize = 100_000;
/// The largest `limit` a history query may ask for.
pub const MAX_HISTORY_LIMIT: usize = 1_000_000;

/// Which events a history answer holds: the scope (a batch with its jobs,
/// one job, or the whole log) and filters, all optional and combined with
/// AND. As URL query pairs: `batch`, `job`, `since`, `until`, `actor`,
/// `collection`, `limit` (`GET /history`; the per-batch and per-job routes
/// take the same pairs without `batch` and `job`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HistoryQuery {
    /// Only this batch and its jobs.
    pub batch: Option<Bid>,
    /// Only this job.
    pub job: Option<Jid>,
    /// Events at or after this time.
    pub since: Option<DateTime<Utc>>,
    /// Events before this time.
    pub until: Option<DateTime<Utc>>,
    /// Events caused by this actor (`admin:alice`, `worker:w1`, `engine`).
    pub actor: Option<Actor>,
    /// Events of the batches and jobs of this collection (profile).
    pub collection: Option<String>,
    /// At most this many rows, 1..=[`MAX_HISTORY_LIMIT`]
    /// ([`DEFAULT_HISTORY_LIMIT`] when `None`).
    pub limit: Option<usize>,
}

impl HistoryQuery {
    /// The parameter names `GET /history` takes.
    pub const PARAMS: &'static str = "batch, job, since, until, actor, collection, limit";

    /// The row limit asked for, or the default.
    pub fn row_limit(&self) -> usize {
        self.limit.unwrap_or(DEFAULT_HISTORY_LIMIT)
    }

    /// Whether any filter beyond the scope is set.
    pub fn filtered(&self) -> bool {
        self.since.is_some()
            || self.until.is_some()
            || self.actor.is_some()
            || self.collection.is_some()
    }

    /// Parses URL query pairs.
    ///
    /// # Errors
    /// An unknown, repeated or malformed parameter, or both `batch` and `job`.
    pub fn from_pairs<K: AsRef<str>, V: AsRef<str>>(
        pairs: impl IntoIterator<Item = (K, V)>,
    ) -> Result<HistoryQuery, QueryError> {
        fn once<T>(slot: &mut Option<T>, key: &str, v: T) -> Result<(), QueryError> {
            if slot.is_some() {
                return Err(QueryError::new(key, "is given twice"));
            }
            *slot = Some(v);
            Ok(())
        }
        let mut q = HistoryQuery::default();
        for (k, v) in pairs {
            let (k, v) = (k.as_ref(), v.as_ref());
            match k {
                "batch" => once(
                    &mut q.batch,
                    k,
                    v.parse()
                        .map_err(|_| QueryError::new(k, "is not a batch id (bid0001)"))?,
                )?,
                "job" => once(
                    &mut q.job,
                    k,
                    v.parse()
                        .map_err(|_| QueryError::new(k, "is not a job id (jid0001)"))?,
                )?,
                "since" => once(&mut q.since, k, time_param(k, v)?)?,
                "until" => once(&mut q.until, k, time_param(k, v)?)?,
                "actor" => {
                    let a = text_filter(k, v)?
                        .parse::<Actor>()
                        .map_err(|e| QueryError::new(k, e.to_string()))?;
                    once(&mut q.actor, k, a)?;
                }
                "collection" => once(&mut q.collection, k, text_filter(k, v)?)?,
                "limit" => {
                    let n: usize = v
                        .parse()
                        .ok()
                        .filter(|n| (1..=MAX_HISTORY_LIMIT).contains(n))
                        .ok_or_else(|| {
                            QueryError::new(
                                k,
                                format!("must be a number from 1 to {MAX_HISTORY_LIMIT}"),
                            )
                        })?;
                    once(&mut q.limit, k, n)?;
                }
                _ => {
                    return Err(QueryError::new(
                        k,
                        format!(
                            "is not a parameter of GET /history (known: {})",
                            Self::PARAMS
                        ),
                    ))
                }
            }
        }
        if q.batch.is_some() && q.job.is_some() {
            return Err(QueryError::new("job", "give batch or job, not both"));
        }
        Ok(q)
    }

    /// The query as URL query pairs (what [`HistoryQuery::from_pairs`] reads).
    pub fn to_pairs(&self) -> Vec<(&'static str, String)> {
        let time = |t: &DateTime<Utc>| t.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true);
        let mut out = Vec::new();
        if let Some(b) = self.batch {
            out.push(("batch", b.to_string()));
        }
        if let Some(j) = self.job {
            out.push(("job", j.to_string()));
        }
        if let Some(t) = &self.since {
            out.push(("since", time(t)));
        }
        if let Some(t) = &self.until {
            out.push(("until", time(t)));
        }
        if let Some(a) = &self.actor {
            out.push(("actor", a.to_string()));
        }
        if let Some(c) = &self.collection {
            out.push(("collection", c.clone()));
        }
        if let Some(n) = self.limit {
            out.push(("limit", n.to_string()));
        }
        out
    }

    /// Checks what the parser checks, for queries built in code (the CLI).
    ///
    /// # Errors
    /// The first parameter out of bounds.
    pub fn validate(&self) -> Result<(), QueryError> {
        HistoryQuery::from_pairs(self.to_pairs()).map(|_| ())
    }
}

/// One line of history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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
