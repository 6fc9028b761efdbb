//! What `verify` found, as the protocol shows it: the first cause named
//! and the problems after it grouped (one damaged record otherwise reads as
//! a dozen unrelated problems), and kept in the data directory
//! (`last-verify.json`) so that `status` reports the damage the last verify
//! found, not only a torn tail seen at start-up.

use std::path::{Path, PathBuf};

use chrono::{DateTime, SecondsFormat, Utc};
use ingest_protocol::api::{LastVerify, ProblemGroup, ProblemView, Verified};

use crate::audit::FullReport;

/// The file in the data directory that keeps the last verify's result.
pub const LAST_VERIFY_FILE: &str = "last-verify.json";
/// The most bytes of that file read back (it is a few hundred).
const MAX_LAST_VERIFY_BYTES: u64 = 64 * 1024;

/// `full` in the protocol's shape, its first cause named and the problems
/// after it grouped by kind.
pub fn view(full: &FullReport) -> Verified {
    let report = &full.log;
    let problems: Vec<ProblemView> = report
        .problems
        .iter()
        .map(|p| ProblemView {
            position: p.position,
            message: p.message.clone(),
        })
        .collect();
    let mut after_first: Vec<ProblemGroup> = Vec::new();
    for (p, kind) in report.problems.iter().zip(&full.kinds).skip(1) {
        match after_first.iter_mut().find(|g| g.kind == kind.name()) {
            Some(g) => {
                g.count += 1;
                g.last_position = g.last_position.max(p.position);
            }
            None => after_first.push(ProblemGroup {
                kind: kind.name().to_string(),
                count: 1,
                first_position: p.position,
                last_position: p.position,
            }),
        }
    }
    Verified {
        checkpoints_checked: full.checkpoints_checked,
        snapshots_checked: full.snapshots_checked,
        events_checked: report.events_checked,
        index_entries_checked: report.index_entries_checked,
        head_position: report.head_position,
        head_hash: hex::encode(report.head_hash),
        first_cause: problems.first().cloned(),
        after_first,
        problems,
    }
}

fn path(data_dir: &Path) -> PathBuf {
    data_dir.join(LAST_VERIFY_FILE)
}

/// Keeps what `verified` found at `at` in `data_dir` (written to a
/// temporary file and renamed, so a reader never sees half of it).
///
/// # Errors
/// When the file cannot be written.
pub fn remember(data_dir: &Path, verified: &Verified, at: DateTime<Utc>) -> std::io::Result<()> {
    let last = LastVerify {
        at: at.to_rfc3339_opts(SecondsFormat::Secs, true),
        head_position: verified.head_position,
        problems: verified.problems.len() as u64,
        first_cause: verified.first_cause.clone().map(|mut p| {
            p.message =
                ingest_protocol::cut(&p.message, ingest_protocol::MAX_MESSAGE_BYTES).into_owned();
            p
        }),
    };
    let tmp = data_dir.join(format!("{LAST_VERIFY_FILE}.tmp"));
    std::fs::write(
        &tmp,
        serde_json::to_vec(&last).map_err(std::io::Error::other)?,
    )?;
    std::fs::rename(&tmp, path(data_dir))
}

/// What the last verify of `data_dir` found; `None` when none was kept
/// (or the file cannot be read: it is a report, never a reason to fail).
pub fn last(data_dir: &Path) -> Option<LastVerify> {
    use std::io::Read as _;
    let file = std::fs::File::open(path(data_dir)).ok()?;
    let mut bytes = Vec::new();
    file.take(MAX_LAST_VERIFY_BYTES)
        .read_to_end(&mut bytes)
        .ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// The damage the last verify found, as `status` says it.
pub fn damage(last: &LastVerify) -> Option<String> {
    let first = last.first_cause.as_ref()?;
    Some(format!(
        "the verify of {} found {} problem(s); the first, the one to look at, at position {}: {}",
        last.at, last.problems, first.position, first.message
    ))
}
