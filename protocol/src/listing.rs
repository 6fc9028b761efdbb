//! Listing batches and jobs: `GET /batches`, `GET /jobs`, `ingest batches`,
//! `ingest jobs`.
//!
//! A query is a set of filters ([`BatchQuery`], [`JobQuery`]), a page size
//! and an opaque cursor. It travels as URL query pairs (`state=failed&
//! collection=demo&limit=50`); [`JobQuery::from_pairs`] and
//! [`BatchQuery::from_pairs`] are the one parser of them, shared by the
//! server and the CLI, and refuse unknown, repeated, malformed and
//! oversized parameters with a [`QueryError`] naming the parameter.
//!
//! Pages come in the queues' order: batches by id (the order of
//! `/batches`), jobs by priority then id (the order of
//! `/jobs/states/<state>/PP-JID`). The cursor is the sort key of the last
//! item given, so items appended while an operator pages never shift the
//! pages already seen: nothing is given twice and nothing that existed when
//! paging began is skipped (an item whose priority changes meanwhile may
//! move across the cursor).
//!
//! ```
//! use ingest_protocol::listing::JobQuery;
//!
//! let q = JobQuery::from_pairs([("state", "failed"), ("collection", "demo")]).unwrap();
//! assert_eq!(q.states.len(), 1);
//! let err = JobQuery::from_pairs([("colection", "demo")]).unwrap_err();
//! assert_eq!(err.param, "colection");
//! ```

use std::collections::BTreeMap;

use chrono::{DateTime, NaiveDate, Utc};
use ingest_events::{BatchState, Bid, Jid, JobState};
use serde::{Deserialize, Serialize};

use crate::cut;

/// The page size when none is given.
pub const DEFAULT_LIMIT: usize = 100;
/// The largest page size a query may ask for.
pub const MAX_LIMIT: usize = 1000;
/// The longest value of a text filter (collection, submitter), in bytes.
pub const MAX_FILTER_BYTES: usize = 256;
/// The longest message kept in a listed item, cut from the middle so that
/// its end (what to do) stays (the full one is in `show`).
pub const LISTED_MESSAGE_BYTES: usize = 256;
/// How many states one `state` filter may name.
const MAX_STATES: usize = 16;
/// The longest cursor accepted, in characters.
const MAX_CURSOR_CHARS: usize = 96;
/// How much of a refused value is quoted in an error.
const QUOTED_BYTES: usize = 64;

/// A query parameter that was refused: which one and why.
///
/// ### Handling
/// The request is wrong: fix the named parameter; nothing was read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("query parameter {param:?}: {reason}")]
pub struct QueryError {
    /// The parameter (cut when it is not one of the known names).
    pub param: String,
    /// What is wrong with it.
    pub reason: String,
}

impl QueryError {
    pub(crate) fn new(param: &str, reason: impl Into<String>) -> QueryError {
        QueryError {
            param: cut(param, QUOTED_BYTES).into_owned(),
            reason: reason.into(),
        }
    }
}

/// The filters batches and jobs share, the page size and the cursor.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filters {
    /// Only this collection (profile name).
    pub collection: Option<String>,
    /// Only batches (or jobs of batches) of this submitter.
    pub submitter: Option<String>,
    /// Created at or after.
    pub created_since: Option<DateTime<Utc>>,
    /// Created before.
    pub created_until: Option<DateTime<Utc>>,
    /// Last changed at or after.
    pub modified_since: Option<DateTime<Utc>>,
    /// Last changed before.
    pub modified_until: Option<DateTime<Utc>>,
    /// `Some(true)`: only items with failures (a batch with a failed job or
    /// in Failed; a job in Failed or requeued out of Failed before);
    /// `Some(false)`: only items without.
    pub has_failures: Option<bool>,
    /// Items per page, 1..=[`MAX_LIMIT`] ([`DEFAULT_LIMIT`] when `None`).
    pub limit: Option<usize>,
    /// Where the previous page ended (its `next_cursor`).
    pub cursor: Option<String>,
    /// Only items of these collections: set by the server from a
    /// depositor's own token (`--depositors-file`), never read from a query
    /// nor written into one. `None`: every collection.
    pub within: Option<std::collections::BTreeSet<String>>,
}

impl Filters {
    /// The page size asked for, or the default.
    pub fn page_size(&self) -> usize {
        self.limit.unwrap_or(DEFAULT_LIMIT)
    }

    /// Whether `created`/`modified` fall inside the time filters.
    pub fn times_match(&self, created: DateTime<Utc>, modified: DateTime<Utc>) -> bool {
        self.created_since.is_none_or(|t| created >= t)
            && self.created_until.is_none_or(|t| created < t)
            && self.modified_since.is_none_or(|t| modified >= t)
            && self.modified_until.is_none_or(|t| modified < t)
    }

    /// Takes one shared parameter; `false` when `key` is not one of them.
    fn take(&mut self, key: &str, value: &str) -> Result<bool, QueryError> {
        fn once<T>(slot: &mut Option<T>, key: &str, v: T) -> Result<(), QueryError> {
            if slot.is_some() {
                return Err(QueryError::new(key, "is given twice"));
            }
            *slot = Some(v);
            Ok(())
        }
        match key {
            "collection" | "submitter" => {
                let v = text_filter(key, value)?;
                let slot = if key == "collection" {
                    &mut self.collection
                } else {
                    &mut self.submitter
                };
                once(slot, key, v)?;
            }
            "created_since" => once(&mut self.created_since, key, time_param(key, value)?)?,
            "created_until" => once(&mut self.created_until, key, time_param(key, value)?)?,
            "modified_since" => once(&mut self.modified_since, key, time_param(key, value)?)?,
            "modified_until" => once(&mut self.modified_until, key, time_param(key, value)?)?,
            "has_failures" => {
                let v = match value {
                    "true" | "1" | "yes" => true,
                    "false" | "0" | "no" => false,
                    _ => return Err(QueryError::new(key, "must be true or false")),
                };
                once(&mut self.has_failures, key, v)?;
            }
            "limit" => {
                let n: usize = value
                    .parse()
                    .ok()
                    .filter(|n| (1..=MAX_LIMIT).contains(n))
                    .ok_or_else(|| {
                        QueryError::new(key, format!("must be a number from 1 to {MAX_LIMIT}"))
                    })?;
                once(&mut self.limit, key, n)?;
            }
            "cursor" => {
                if value.is_empty()
                    || value.len() > MAX_CURSOR_CHARS
                    || !value.bytes().all(|b| b.is_ascii_hexdigit())
                {
                    return Err(QueryError::new(
                        key,
                        "is not a cursor this server gave (use a page's next_cursor, or leave it out to start over)",
                    ));
                }
                once(&mut self.cursor, key, value.to_string())?;
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    fn pairs(&self, out: &mut Vec<(&'static str, String)>) {
        let time = |t: &DateTime<Utc>| t.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true);
        if let Some(v) = &self.collection {
            out.push(("collection", v.clone()));
        }
        if let Some(v) = &self.submitter {
            out.push(("submitter", v.clone()));
        }
        for (k, v) in [
            ("created_since", &self.created_since),
            ("created_until", &self.created_until),
            ("modified_since", &self.modified_since),
            ("modified_until", &self.modified_until),
        ] {
            if let Some(t) = v {
                out.push((k, time(t)));
            }
        }
        if let Some(v) = self.has_failures {
            out.push(("has_failures", v.to_string()));
        }
        if let Some(v) = self.limit {
            out.push(("limit", v.to_string()));
        }
        if let Some(v) = &self.cursor {
            out.push(("cursor", v.clone()));
        }
    }

    /// Checks what the parser checks, for queries built in code (the CLI).
    ///
    /// # Errors
    /// The first parameter out of bounds.
    pub fn validate(&self) -> Result<(), QueryError> {
        let mut copy = Filters::default();
        let mut pairs = Vec::new();
        self.pairs(&mut pairs);
        for (k, v) in pairs {
            copy.take(k, &v)?;
        }
        Ok(())
    }
}

pub(crate) fn text_filter(key: &str, value: &str) -> Result<String, QueryError> {
    if value.trim().is_empty() {
        return Err(QueryError::new(key, "is empty (leave it out to match all)"));
    }
    if value.len() > MAX_FILTER_BYTES {
        return Err(QueryError::new(
            key,
            format!("is longer than {MAX_FILTER_BYTES} bytes"),
        ));
    }
    if value.chars().any(char::is_control) {
        return Err(QueryError::new(key, "contains control characters"));
    }
    Ok(value.to_string())
}

pub(crate) fn time_param(key: &str, value: &str) -> Result<DateTime<Utc>, QueryError> {
    parse_time(value).map_err(|reason| QueryError::new(key, reason.to_string()))
}

/// A time filter that is neither RFC 3339 nor a date.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{shown:?} is not a time: give RFC 3339 (2026-11-24T08:00:00Z) or a date (2026-11-24)")]
pub struct NotATime {
    /// The text given, cut to 64 bytes.
    pub shown: String,
}

/// Parses a time filter: RFC 3339 (`2026-11-24T00:00:00Z`) or a date
/// (`2026-11-24`, midnight UTC).
///
/// # Errors
/// [`NotATime`], saying what is accepted (quoting at most 64 bytes of `s`).
pub fn parse_time(s: &str) -> Result<DateTime<Utc>, NotATime> {
    let s = s.trim();
    if let Ok(t) = DateTime::parse_from_rfc3339(s) {
        return Ok(t.with_timezone(&Utc));
    }
    if let Ok(d) = NaiveDate::parse_from_str(s, "%Y-%m-%d") {
        if let Some(t) = d.and_hms_opt(0, 0, 0) {
            return Ok(t.and_utc());
        }
    }
    Err(NotATime {
        shown: cut(s, QUOTED_BYTES).into_owned(),
    })
}

fn states<S: std::str::FromStr<Err = ingest_events::lifecycle::UnknownState> + Ord>(
    key: &str,
    value: &str,
    out: &mut Vec<S>,
) -> Result<(), QueryError> {
    if !out.is_empty() {
        return Err(QueryError::new(
            key,
            "is given twice (name several states comma-separated)",
        ));
    }
    for name in value.split(',').map(str::trim) {
        if out.len() >= MAX_STATES {
            return Err(QueryError::new(key, "names too many states"));
        }
        if name.len() > 32 {
            return Err(QueryError::new(key, "names a state that is too long"));
        }
        let s = name
            .parse::<S>()
            .map_err(|e| QueryError::new(key, e.to_string()))?;
        if !out.contains(&s) {
            out.push(s);
        }
    }
    Ok(())
}

/// `GET /batches`: which batches.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BatchQuery {
    /// Only batches in one of these states (all when empty).
    pub states: Vec<BatchState>,
    /// The shared filters.
    pub filters: Filters,
}

impl BatchQuery {
    /// The parameter names `GET /batches` takes.
    pub const PARAMS: &'static str = "state, collection, submitter, created_since, created_until, modified_since, modified_until, has_failures, limit, cursor";

    /// Parses URL query pairs.
    ///
    /// # Errors
    /// An unknown, repeated or malformed parameter.
    pub fn from_pairs<K: AsRef<str>, V: AsRef<str>>(
        pairs: impl IntoIterator<Item = (K, V)>,
    ) -> Result<BatchQuery, QueryError> {
        let mut q = BatchQuery::default();
        // Each parameter is taken once, so a long query stops at its first
        // repeated or unknown name.
        for (k, v) in pairs {
            let (k, v) = (k.as_ref(), v.as_ref());
            if k == "state" {
                states(k, v, &mut q.states)?;
            } else if !q.filters.take(k, v)? {
                return Err(QueryError::new(
                    k,
                    format!(
                        "is not a parameter of GET /batches (known: {})",
                        Self::PARAMS
                    ),
                ));
            }
        }
        Ok(q)
    }

    /// The query as URL query pairs (what [`BatchQuery::from_pairs`] reads).
    pub fn to_pairs(&self) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        if !self.states.is_empty() {
            out.push(("state", join(&self.states)));
        }
        self.filters.pairs(&mut out);
        out
    }

    /// Where this page starts: after the batch its cursor names.
    ///
    /// # Errors
    /// A cursor of another kind or not made by this server.
    pub fn after(&self) -> Result<Option<Resume<Bid>>, QueryError> {
        let Some(c) = &self.filters.cursor else {
            return Ok(None);
        };
        match decode_cursor(c) {
            Some(Cursor::Batch(after, matched)) => Ok(Some(Resume { after, matched })),
            _ => Err(bad_cursor()),
        }
    }
}

/// `GET /jobs`: which jobs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobQuery {
    /// Only jobs in one of these states (all when empty).
    pub states: Vec<JobState>,
    /// Only jobs of this batch.
    pub batch: Option<Bid>,
    /// The shared filters.
    pub filters: Filters,
}

impl JobQuery {
    /// The parameter names `GET /jobs` takes.
    pub const PARAMS: &'static str = "state, batch, collection, submitter, created_since, created_until, modified_since, modified_until, has_failures, limit, cursor";

    /// Parses URL query pairs.
    ///
    /// # Errors
    /// An unknown, repeated or malformed parameter.
    pub fn from_pairs<K: AsRef<str>, V: AsRef<str>>(
        pairs: impl IntoIterator<Item = (K, V)>,
    ) -> Result<JobQuery, QueryError> {
        let mut q = JobQuery::default();
        // Each parameter is taken once, so a long query stops at its first
        // repeated or unknown name.
        for (k, v) in pairs {
            let (k, v) = (k.as_ref(), v.as_ref());
            match k {
                "state" => states(k, v, &mut q.states)?,
                "batch" => {
                    if q.batch.is_some() {
                        return Err(QueryError::new(k, "is given twice"));
                    }
                    let bid = v
                        .trim()
                        .parse::<Bid>()
                        .map_err(|_| QueryError::new(k, "is not a batch id like bid0000000001"))?;
                    q.batch = Some(bid);
                }
                _ if q.filters.take(k, v)? => {}
                _ => {
                    return Err(QueryError::new(
                        k,
                        format!("is not a parameter of GET /jobs (known: {})", Self::PARAMS),
                    ))
                }
            }
        }
        Ok(q)
    }

    /// The query as URL query pairs (what [`JobQuery::from_pairs`] reads).
    pub fn to_pairs(&self) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        if !self.states.is_empty() {
            out.push(("state", join(&self.states)));
        }
        if let Some(b) = self.batch {
            out.push(("batch", b.to_string()));
        }
        self.filters.pairs(&mut out);
        out
    }

    /// Where this page starts: after the sort key (priority, job) its
    /// cursor names.
    ///
    /// # Errors
    /// A cursor of another kind or not made by this server.
    pub fn after(&self) -> Result<Option<Resume<(u8, Jid)>>, QueryError> {
        let Some(c) = &self.filters.cursor else {
            return Ok(None);
        };
        match decode_cursor(c) {
            Some(Cursor::Job(p, j, matched)) => Ok(Some(Resume {
                after: (p, j),
                matched,
            })),
            _ => Err(bad_cursor()),
        }
    }
}

fn join<S: std::fmt::Display>(states: &[S]) -> String {
    states
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

fn bad_cursor() -> QueryError {
    QueryError::new(
        "cursor",
        "is not a cursor of this listing (use its page's next_cursor, or leave it out to start over)",
    )
}

/// Where a page with a cursor starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resume<K> {
    /// The sort key of the previous page's last item: this page starts
    /// after it.
    pub after: K,
    /// How many items matched when the first page counted them, carried by
    /// the cursor so that no later page walks the whole state again to
    /// count; `None` from a cursor of an older server, which did not carry
    /// it (the page then counts).
    pub matched: Option<usize>,
}

/// What a cursor points after, and the first page's count (version 2;
/// version 1 cursors, without the count, are still read).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cursor {
    Batch(Bid, Option<usize>),
    Job(u8, Jid, Option<usize>),
}

fn encode_cursor(c: Cursor) -> String {
    let plain = match c {
        Cursor::Batch(b, None) => format!("b1:{}", b.0),
        Cursor::Batch(b, Some(m)) => format!("b2:{}:{m}", b.0),
        Cursor::Job(p, j, None) => format!("j1:{p}:{}", j.0),
        Cursor::Job(p, j, Some(m)) => format!("j2:{p}:{}:{m}", j.0),
    };
    plain.bytes().map(|b| format!("{b:02x}")).collect()
}

fn decode_cursor(c: &str) -> Option<Cursor> {
    if c.len() % 2 != 0 || c.len() > MAX_CURSOR_CHARS {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..c.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(c.get(i..i + 2)?, 16).ok())
        .collect();
    let plain = String::from_utf8(bytes?).ok()?;
    let parts: Vec<&str> = plain.split(':').collect();
    let cursor = match parts.as_slice() {
        ["b1", n] => Cursor::Batch(Bid(n.parse().ok()?), None),
        ["b2", n, m] => Cursor::Batch(Bid(n.parse().ok()?), Some(m.parse().ok()?)),
        ["j1", p, n] => Cursor::Job(p.parse().ok()?, Jid(n.parse().ok()?), None),
        ["j2", p, n, m] => {
            Cursor::Job(p.parse().ok()?, Jid(n.parse().ok()?), Some(m.parse().ok()?))
        }
        _ => return None,
    };
    Some(cursor)
}

/// The cursor of a batch page that ended with `last`, of a listing whose
/// first page counted `matched`.
pub fn batch_cursor(last: Bid, matched: usize) -> String {
    encode_cursor(Cursor::Batch(last, Some(matched)))
}

/// The cursor of a job page that ended with the job `last` of `priority`,
/// of a listing whose first page counted `matched`.
pub fn job_cursor(priority: u8, last: Jid, matched: usize) -> String {
    encode_cursor(Cursor::Job(priority, last, Some(matched)))
}

/// One batch in a listing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchSummary {
    /// `bid0000000001`.
    pub bid: String,
    /// The submission uuid.
    pub uuid: String,
    /// Its state.
    pub status: String,
    /// The collection profile.
    pub profile: String,
    /// Who submitted it.
    pub submitter: String,
    /// The payload type.
    pub payload_type: String,
    /// How many jobs it has.
    pub job_count: usize,
    /// Its jobs by state (states with no job left out).
    pub jobs_by_state: BTreeMap<String, usize>,
    /// Its jobs in Failed now.
    pub failed_jobs: usize,
    /// When it was submitted.
    pub created: DateTime<Utc>,
    /// When its state last changed.
    pub last_modified: DateTime<Utc>,
    /// Whether cleanup removed it from the live tree.
    pub cleaned_up: bool,
    /// The message of its last move (cut to 256 bytes).
    pub message: String,
}

/// One job in a listing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobSummary {
    /// `jid0000000001`.
    pub jid: String,
    /// Its batch.
    pub bid: String,
    /// Its state.
    pub status: String,
    /// 0–99, lower runs first.
    pub priority: u8,
    /// The collection profile.
    pub profile: String,
    /// Who submitted its batch.
    pub submitter: String,
    /// Its ark, once known.
    pub primary_id: Option<String>,
    /// Its local ids.
    pub local_ids: Vec<String>,
    /// Bytes it needs in working storage (0 until estimated).
    pub space_needed: u64,
    /// Admin requeues so far.
    pub retry_count: u32,
    /// Step retries in its current state.
    pub step_retries: u32,
    /// The state it failed in, when it failed.
    pub failed_in: Option<String>,
    /// The kind of its failure when its step named one (`digest_mismatch`:
    /// it cannot be requeued); absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
    /// Why a worker keeps it waiting in its state, as the worker last said
    /// (through a server only; see `JobView::waiting`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting: Option<String>,
    /// When it was created.
    pub created: DateTime<Utc>,
    /// When its state last changed.
    pub last_modified: DateTime<Utc>,
    /// Whether cleanup removed it from the live tree.
    pub cleaned_up: bool,
    /// The message of its last move (cut to 256 bytes).
    pub message: String,
}

/// A page of batches.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchPage {
    /// How many batches match the filters (on every page, not only this one).
    pub matched: usize,
    /// This page, in queue order.
    pub batches: Vec<BatchSummary>,
    /// The `cursor` of the next page; `None` on the last.
    pub next_cursor: Option<String>,
}

/// A page of jobs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobPage {
    /// How many jobs match the filters (on every page, not only this one).
    pub matched: usize,
    /// This page, in queue order (priority, then id).
    pub jobs: Vec<JobSummary>,
    /// The `cursor` of the next page; `None` on the last.
    pub next_cursor: Option<String>,
}

/// Encodes query pairs for a URL (`application/x-www-form-urlencoded`).
pub fn encode_query(pairs: &[(&'static str, String)]) -> String {
    fn enc(s: &str) -> String {
        let mut out = String::with_capacity(s.len());
        for b in s.bytes() {
            match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                    out.push(b as char)
                }
                b' ' => out.push('+'),
                _ => out.push_str(&format!("%{b:02X}")),
            }
        }
        out
    }
    pairs
        .iter()
        .map(|(k, v)| format!("{}={}", enc(k), enc(v)))
        .collect::<Vec<_>>()
        .join("&")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_round_trip_through_their_pairs() {
        let q = JobQuery {
            states: vec![JobState::Failed, JobState::Held],
            batch: Some(Bid(7)),
            filters: Filters {
                collection: Some("demo & co".into()),
                submitter: Some("alice".into()),
                created_since: parse_time("2026-11-24").ok(),
                modified_until: parse_time("2026-11-25T10:00:00.5Z").ok(),
                has_failures: Some(true),
                limit: Some(5),
                cursor: Some(job_cursor(5, Jid(12), 40)),
                ..Filters::default()
            },
        };
        let back = JobQuery::from_pairs(q.to_pairs()).expect("parse");
        assert_eq!(back, q);
        assert_eq!(
            back.after(),
            Ok(Some(Resume {
                after: (5, Jid(12)),
                matched: Some(40)
            }))
        );
        let b = BatchQuery {
            states: vec![BatchState::UpdateReporting],
            filters: Filters {
                cursor: Some(batch_cursor(Bid(3), 9)),
                ..Filters::default()
            },
        };
        let back = BatchQuery::from_pairs(b.to_pairs()).expect("parse");
        assert_eq!(
            back.after(),
            Ok(Some(Resume {
                after: Bid(3),
                matched: Some(9)
            }))
        );
        assert!(encode_query(&q.to_pairs()).contains("collection=demo+%26+co"));
    }

    #[test]
    fn cursors_carry_the_first_pages_count_and_older_ones_are_still_read() {
        let hex = |plain: &str| -> String { plain.bytes().map(|b| format!("{b:02x}")).collect() };
        let jobs = |c: String| JobQuery::from_pairs([("cursor", c)]).map(|q| q.after());
        // Version 1 (no count): the page counts again.
        assert_eq!(
            jobs(hex("j1:3:7")),
            Ok(Ok(Some(Resume {
                after: (3, Jid(7)),
                matched: None
            })))
        );
        let b = BatchQuery::from_pairs([("cursor", hex("b1:4"))]).expect("hex");
        assert_eq!(
            b.after(),
            Ok(Some(Resume {
                after: Bid(4),
                matched: None
            }))
        );
        // The largest cursor fits the bound on the parameter.
        let largest = job_cursor(u8::MAX, Jid(u64::MAX), usize::MAX);
        assert!(largest.len() <= MAX_CURSOR_CHARS, "{}", largest.len());
        assert!(jobs(largest).expect("parse").is_ok());
        // A count that is not a number, or one part too many, is refused.
        for forged in ["j2:3:7:x", "j2:3:7:1:1", "b2:4:-1", "b2:4"] {
            let q = JobQuery::from_pairs([("cursor", hex(forged))]).expect("hex");
            assert!(q.after().is_err(), "{forged}");
            let q = BatchQuery::from_pairs([("cursor", hex(forged))]).expect("hex");
            assert!(q.after().is_err(), "{forged}");
        }
    }

    #[test]
    fn bad_parameters_are_refused_naming_the_parameter() {
        let long = "x".repeat(MAX_FILTER_BYTES + 1);
        let cases: Vec<(Vec<(&str, &str)>, &str)> = vec![
            (vec![("stat", "failed")], "stat"),
            (vec![("state", "broken")], "state"),
            (vec![("state", "failed"), ("state", "held")], "state"),
            (vec![("limit", "0")], "limit"),
            (vec![("limit", "1001")], "limit"),
            (vec![("limit", "-1")], "limit"),
            (vec![("collection", "")], "collection"),
            (vec![("collection", &long)], "collection"),
            (vec![("submitter", "a\nb")], "submitter"),
            (vec![("submitter", "a"), ("submitter", "b")], "submitter"),
            (vec![("created_since", "yesterday")], "created_since"),
            (vec![("has_failures", "maybe")], "has_failures"),
            (vec![("cursor", "not hex!")], "cursor"),
            (vec![("batch", "jid0000000001")], "batch"),
        ];
        for (pairs, param) in cases {
            let e = JobQuery::from_pairs(pairs.clone()).expect_err("refused");
            assert_eq!(e.param, param, "{pairs:?}: {e}");
        }
        // A batch cursor is not a job cursor, and a forged one is refused.
        let q = JobQuery::from_pairs([("cursor", batch_cursor(Bid(1), 1))]).expect("hex");
        assert_eq!(q.after().expect_err("kind").param, "cursor");
        let q = JobQuery::from_pairs([("cursor", "6a313a78")]).expect("hex");
        assert!(q.after().is_err());
        // batch is a job filter only.
        assert_eq!(
            BatchQuery::from_pairs([("batch", "bid0000000001")])
                .expect_err("refused")
                .param,
            "batch"
        );
        // An unbounded unknown name is quoted cut.
        let name = "k".repeat(10_000);
        let e = JobQuery::from_pairs([(name.as_str(), "v")]).expect_err("refused");
        assert!(e.to_string().len() < 1000, "{}", e.to_string().len());
        let many: Vec<(&str, &str)> = (0..40).map(|_| ("limit", "1")).collect();
        assert_eq!(JobQuery::from_pairs(many).expect_err("many").param, "limit");
    }

    #[test]
    fn times_are_rfc3339_or_dates() {
        assert_eq!(
            parse_time("2026-11-24").map(|t| t.to_rfc3339()),
            Ok("2026-11-24T00:00:00+00:00".to_string())
        );
        assert_eq!(
            parse_time("2026-11-24T01:00:00+01:00").map(|t| t.to_rfc3339()),
            Ok("2026-11-24T00:00:00+00:00".to_string())
        );
        assert!(parse_time("24/11/2026").is_err());
    }
}
