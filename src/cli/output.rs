//! How the CLI prints: YAML, JSON or a table; appended events; a
//! verification. Output to a closed pipe ends the process quietly.

use std::io::Write;

use anyhow::Result;
use ingest_protocol::history::HistoryRow;
use serde::Serialize;

use super::opts::Format;

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
    if let Some(first) = &v.first_cause {
        println!(
            "first cause, position {}: {}",
            first.position,
            cell(&first.message)
        );
        for g in &v.after_first {
            println!(
                "  after it: {} {} problem(s), positions {}..={}",
                g.count, g.kind, g.first_position, g.last_position
            );
        }
        if v.problems.len() > 1 {
            println!("every problem:");
        }
    }
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
        Format::Yaml => write_stdout(&serde_norway::to_string(value)?),
        Format::Table => write_stdout(&value_table(&serde_json::to_value(value)?)),
    }
    Ok(())
}

/// One table cell: control characters (a message's newlines) become spaces.
fn cell(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// An aligned text table: a header line, then one line per row; columns
/// two spaces apart, the last one not padded.
pub(super) fn table(headers: &[&str], rows: Vec<Vec<String>>) -> String {
    let rows: Vec<Vec<String>> = rows
        .into_iter()
        .map(|r| r.iter().map(|c| cell(c)).collect())
        .collect();
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for r in &rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let last = cells.len().saturating_sub(1);
        let mut out = String::new();
        for (i, (c, w)) in cells.iter().zip(&widths).enumerate() {
            if i == last {
                out.push_str(c);
            } else {
                out.push_str(&format!("{c:<w$}  "));
            }
        }
        out.truncate(out.trim_end().len());
        out.push('\n');
        out
    };
    let mut out = line(headers.to_vec());
    for r in &rows {
        out.push_str(&line(r.iter().map(String::as_str).collect()));
    }
    out
}

/// A scalar as a table cell; `None` for objects and arrays of objects.
fn scalar(v: &serde_json::Value) -> Option<String> {
    use serde_json::Value;
    match v {
        Value::Null => Some("-".into()),
        Value::String(s) => Some(s.clone()),
        Value::Bool(_) | Value::Number(_) => Some(v.to_string()),
        Value::Array(items) if items.iter().all(|i| !i.is_object() && !i.is_array()) => Some(
            items
                .iter()
                .filter_map(scalar)
                .collect::<Vec<_>>()
                .join(", "),
        ),
        _ => None,
    }
}

/// Any value as tables: a FIELD/VALUE table of its scalars (nested objects
/// flattened as `outer.inner`), then one table per list of objects (a
/// batch's jobs, an object's versions), titled with the field's name.
pub(super) fn value_table(v: &serde_json::Value) -> String {
    use serde_json::Value;
    fn flatten(
        prefix: &str,
        v: &Value,
        pairs: &mut Vec<Vec<String>>,
        lists: &mut Vec<(String, Vec<Value>)>,
    ) {
        match v {
            Value::Object(map) => {
                for (k, inner) in map {
                    let key = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    flatten(&key, inner, pairs, lists);
                }
            }
            Value::Array(items) if scalar(v).is_none() => {
                lists.push((prefix.to_string(), items.clone()))
            }
            other => pairs.push(vec![prefix.to_string(), scalar(other).unwrap_or_default()]),
        }
    }
    let mut pairs = Vec::new();
    let mut lists = Vec::new();
    flatten("", v, &mut pairs, &mut lists);
    let mut out = table(&["FIELD", "VALUE"], pairs);
    for (name, items) in lists {
        let mut columns: Vec<String> = Vec::new();
        for item in &items {
            if let Value::Object(map) = item {
                for k in map.keys() {
                    if !columns.contains(k) {
                        columns.push(k.clone());
                    }
                }
            }
        }
        // Ids and the state first; the rest as the value names them.
        const FIRST: [&str; 5] = ["jid", "bid", "ark", "version", "status"];
        columns.sort_by_key(|c| FIRST.iter().position(|f| f == c).unwrap_or(FIRST.len()));
        let rows = items
            .iter()
            .map(|item| {
                columns
                    .iter()
                    .map(|c| match item.get(c) {
                        Some(v) => scalar(v).unwrap_or_else(|| v.to_string()),
                        None => String::new(),
                    })
                    .collect()
            })
            .collect();
        let headers: Vec<String> = columns.iter().map(|c| c.to_uppercase()).collect();
        let headers: Vec<&str> = headers.iter().map(String::as_str).collect();
        out.push_str(&format!("\n{name}:\n"));
        out.push_str(&table(&headers, rows));
    }
    out
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

/// A time as the tables show it (UTC, to the second).
pub(super) fn time(t: &chrono::DateTime<chrono::Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S").to_string()
}
