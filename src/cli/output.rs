//! How the CLI prints: YAML, JSON or a table; appended events; a
//! verification. Output to a closed pipe ends the process quietly.

use std::io::Write;

use anyhow::Result;
use ingest_protocol::history::HistoryRow;
use serde::Serialize;

use super::args::Format;

/// Prints appended events, one line each (`nothing to do` for none).
pub(super) fn print_rows(rows: &[HistoryRow]) {
    if rows.is_empty() {
        println!("nothing to do");
    }
    let mut out = std::io::stdout().lock();
    for r in rows {
        let _ = writeln!(
            out,
            "#{:<6} {:<13} {:<22} {}",
            r.position, r.stream, r.event, r.detail
        );
    }
}

/// Prints a verification and gives its exit code (1 when it failed).
pub(super) fn print_verified(v: &ingest_protocol::api::Verified) -> i32 {
    for p in &v.problems {
        println!("position {}: {}", p.position, p.message);
    }
    println!(
        "{} events checked, {} stream index entries checked, head position {}, head hash {}",
        v.events_checked, v.index_entries_checked, v.head_position, v.head_hash
    );
    if v.problems.is_empty() {
        println!("ok: the hash chain and the stream index verify");
        println!(
            "ok: {} signed checkpoint(s) and {} snapshot(s) verify",
            v.checkpoints_checked, v.snapshots_checked
        );
        0
    } else {
        println!("FAILED: {} problem(s)", v.problems.len());
        1
    }
}

pub(super) fn emit<T: Serialize>(value: &T, format: Format) -> Result<()> {
    match format {
        Format::Json => write_stdout(&format!("{}\n", serde_json::to_string_pretty(value)?)),
        Format::Yaml | Format::Table => write_stdout(&serde_norway::to_string(value)?),
    }
    Ok(())
}

/// Writes `text` to stdout. A reader that went away (`ingest tree | head`)
/// ends the process quietly with code 0 instead of a panic.
pub(crate) fn write_stdout(text: &str) {
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("error: cannot write to stdout: {e}");
        std::process::exit(1);
    }
}
