//! History rows: one line per event, as `ingest history` prints them and
//! `GET /batches/{bid}/history` answers them.

use ingest_events::Recorded;
use serde::{Deserialize, Serialize};

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
