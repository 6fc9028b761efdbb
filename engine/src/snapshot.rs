//! Snapshots of the folded state, kept beside the log so that start-up folds
//! only the tail.
//!
//! A snapshot is one file, `<data_dir>/snapshots/state-<position>.snap`
//! (the position zero-padded to 20 digits, so names sort by position):
//!
//! | bytes | what |
//! | --- | --- |
//! | 16 | magic `ingest-snapshot\n` |
//! | 4 | format version, little-endian (3; 2 is still read, 1 is not: see below) |
//! | 8 | the position it folds up to, little-endian |
//! | 32 | the hash of the record at that position |
//! | 8 | body length, little-endian |
//! | 32 | BLAKE3 of the body |
//! | … | body |
//!
//! The body of format 3 is a table of parts and the parts, so that start-up
//! can decompress and decode them on several cores at once:
//!
//! | bytes | what |
//! | --- | --- |
//! | 4 | number of parts, little-endian |
//! | 17 per part | its kind (0 the rest, 1 batches, 2 jobs), its stored length and its decoded length (u64 little-endian each) |
//! | … | the parts' stored bytes, in table order |
//!
//! Each part is zstd-compressed bincode (standard): part 0 ("the rest") is
//! the [`State`] with no batches and no jobs and the Merkle [`Frontier`];
//! the others are runs of at most [`PART_ENTRIES`] `(id, batch)` or
//! `(id, job)` pairs in ascending id order, which together make up the
//! state's batches and jobs. Formats 2 and 3 (written before) have the
//! state of access requests without their packaging and delivery, and
//! format 1 the state of jobs without the kind of their failure: a
//! snapshot of an older format is skipped with a WARN, and the log is
//! folded instead (once, after an upgrade; the next snapshot is format 4).
//!
//! A snapshot is used only when its checksum holds, its body decodes, its
//! state names the same position and hash as its header, and the log's
//! record at that position has that hash; otherwise it is skipped with a
//! WARN and an older one (or the whole log) is folded. Snapshots are not a
//! source of truth: deleting the directory only makes the next start-up
//! slower.
//!
//! Files are written to a temporary name, synced and renamed, so a crash
//! leaves either the old set or the new file, never a torn one under a
//! snapshot's name.

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use ingest_events::codec::Hash;
use ingest_events::ids::{Bid, Jid};
use ingest_events::log::Log;
use ingest_events::merkle::Frontier;
use ingest_events::state::{Batch, Job};
use ingest_events::State;
use serde::{Deserialize, Serialize};

/// The snapshot directory's name inside the data directory.
pub const SNAPSHOT_DIR: &str = "snapshots";
const MAGIC: &[u8; 16] = b"ingest-snapshot\n";
/// 4: the body in zstd-compressed parts, access requests with their
/// packaging and delivery. Older formats are skipped (the log is folded).
const FORMAT: u32 = 4;
/// How many batches or jobs one part of a format-2 body holds at most.
pub const PART_ENTRIES: usize = 50_000;
/// The zstd level parts are compressed with (the fastest: the data is
/// repetitive enough that higher levels gain little and cost write time).
const ZSTD_LEVEL: i32 = 1;
/// The most parts a body may name (a corrupt count must not allocate more).
const MAX_PARTS: usize = 1 << 16;
const PART_ENTRY_LEN: usize = 1 + 8 + 8;
const HEADER_LEN: usize = 16 + 4 + 8 + 32 + 8 + 32;
/// The largest snapshot body read back (a corrupt length must not allocate
/// more): 4 GiB, far above the state of a 100-million-event log.
const MAX_BODY: usize = 4 << 30;

/// When the engine writes snapshots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotPolicy {
    /// Write one when this many events were appended since the last one
    /// (0: never by count).
    pub every_events: u64,
    /// Write one when this much time passed since the last one and at least
    /// one event was appended (`None`: never by time).
    pub every: Option<Duration>,
    /// How many snapshots to keep (the newest; at least 1).
    pub keep: usize,
}

impl Default for SnapshotPolicy {
    fn default() -> Self {
        SnapshotPolicy {
            every_events: 100_000,
            every: Some(Duration::from_secs(600)),
            keep: 2,
        }
    }
}

/// Why a snapshot could not be written or read.
///
/// ### Handling
/// Never fatal: a snapshot that cannot be read is skipped (the fold starts
/// earlier), one that cannot be written is logged and tried again later.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SnapshotError {
    /// The file system failed.
    #[error("snapshot {}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What failed.
        source: io::Error,
    },
    /// The file is not a whole, intact snapshot.
    #[error("snapshot {} is corrupt: {reason}", path.display())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The state could not be encoded into a snapshot (nothing was
    /// written).
    #[error("a snapshot of position {position} cannot be encoded: {source}")]
    Encode {
        /// The position of the state.
        position: u64,
        /// What failed.
        source: EncodeError,
    },
    /// The snapshot is intact but is not a fold of this log.
    #[error("snapshot {} does not match the log: {reason}", path.display())]
    Mismatch {
        /// The file.
        path: PathBuf,
        /// What differs.
        reason: String,
    },
}

/// What a snapshot holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    /// The folded state; its `position` and `head_hash` are where it stops.
    pub state: State,
    /// The Merkle tree over the same records.
    pub frontier: Frontier,
}

/// Part 0 of a format-2 body as written: the state without its batches
/// and jobs (they are in the other parts), and the Merkle tree.
#[derive(Serialize)]
struct RestRef<'a> {
    state: &'a State,
    frontier: &'a Frontier,
}

/// Part 0 of a body as read back (the same bytes as [`RestRef`]).
#[derive(Deserialize)]
struct Rest {
    state: State,
    frontier: Frontier,
}

/// What a part of a body holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PartKind {
    Rest = 0,
    Batches = 1,
    Jobs = 2,
}

impl PartKind {
    fn from_byte(b: u8) -> Option<PartKind> {
        match b {
            0 => Some(PartKind::Rest),
            1 => Some(PartKind::Batches),
            2 => Some(PartKind::Jobs),
            _ => None,
        }
    }
}

/// A part as decoded.
enum Decoded {
    Rest(Box<Rest>),
    Batches(Vec<(Bid, Batch)>),
    Jobs(Vec<(Jid, Job)>),
}

/// Why a part of a snapshot could not be encoded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EncodeError {
    /// bincode refused a value.
    #[error("a part does not encode: {0}")]
    Encode(#[from] bincode::error::EncodeError),
    /// zstd could not compress a part.
    #[error("a part does not compress: {0}")]
    Compress(#[source] io::Error),
}

fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, EncodeError> {
    Ok(bincode::serde::encode_to_vec(
        value,
        bincode::config::standard(),
    )?)
}

/// Encodes and compresses one part; returns (stored bytes, decoded length).
fn compress_part(raw: &[u8]) -> Result<Vec<u8>, EncodeError> {
    zstd::block::compress(raw, ZSTD_LEVEL).map_err(EncodeError::Compress)
}

/// The body of a format-2 snapshot of `state` and `frontier`; its parts are
/// encoded on every core at once.
fn encode_body(
    state: &State,
    frontier: &Frontier,
    part_entries: usize,
) -> Result<Vec<u8>, EncodeError> {
    // Every field named, so that a field added to the state cannot be left
    // out of snapshots unnoticed (this stops compiling instead).
    let State {
        batches,
        jobs,
        held_collections,
        paused,
        system_version,
        position,
        head_hash,
        uuids,
        faults,
        access,
        paused_access,
        // Derived from the jobs, rebuilt when read.
        job_order: _,
    } = state;
    let rest = State {
        batches: BTreeMap::new(),
        jobs: BTreeMap::new(),
        held_collections: held_collections.clone(),
        paused: *paused,
        system_version: *system_version,
        position: *position,
        head_hash: *head_hash,
        uuids: uuids.clone(),
        faults: faults.clone(),
        access: access.clone(),
        paused_access: paused_access.clone(),
        job_order: Default::default(),
    };
    let batch_entries: Vec<(&Bid, &Batch)> = batches.iter().collect();
    let job_entries: Vec<(&Jid, &Job)> = jobs.iter().collect();
    type Encoder<'a> = Box<dyn Fn() -> Result<Vec<u8>, EncodeError> + Send + Sync + 'a>;
    let mut work: Vec<(PartKind, Encoder<'_>)> = Vec::new();
    let rest = &rest;
    work.push((
        PartKind::Rest,
        Box::new(move || {
            encode(&RestRef {
                state: rest,
                frontier,
            })
        }),
    ));
    for chunk in batch_entries.chunks(part_entries) {
        work.push((PartKind::Batches, Box::new(move || encode(chunk))));
    }
    for chunk in job_entries.chunks(part_entries) {
        work.push((PartKind::Jobs, Box::new(move || encode(chunk))));
    }
    let parts = on_threads(cores(), work.len(), |i| -> Result<_, EncodeError> {
        let raw = (work[i].1)()?;
        Ok((compress_part(&raw)?, raw.len() as u64))
    })?;
    let stored: usize = parts.iter().map(|(p, _)| p.len()).sum();
    let mut body = Vec::with_capacity(4 + parts.len() * PART_ENTRY_LEN + stored);
    body.extend_from_slice(&(parts.len() as u32).to_le_bytes());
    for ((kind, _), (bytes, raw_len)) in work.iter().zip(&parts) {
        body.push(*kind as u8);
        body.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
        body.extend_from_slice(&raw_len.to_le_bytes());
    }
    for (bytes, _) in &parts {
        body.extend_from_slice(bytes);
    }
    Ok(body)
}

/// The cores this process may use.
fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
}

/// Runs `f(0..n)` on `threads` threads (at most `n`, at least one) and
/// returns the results in order; the first error wins.
fn on_threads<T: Send, E: Send>(
    threads: usize,
    n: usize,
    f: impl Fn(usize) -> Result<T, E> + Sync,
) -> Result<Vec<T>, E> {
    let threads = threads.min(n).max(1);
    let next = AtomicUsize::new(0);
    let mut results: Vec<Option<Result<T, E>>> = (0..n).map(|_| None).collect();
    let done: Vec<Vec<(usize, Result<T, E>)>> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= n {
                            break mine;
                        }
                        let r = f(i);
                        let failed = r.is_err();
                        mine.push((i, r));
                        if failed {
                            // Stop handing out work: the result is an error.
                            next.store(n, Ordering::Relaxed);
                        }
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    });
    for (i, r) in done.into_iter().flatten() {
        results[i] = Some(r);
    }
    let mut out = Vec::with_capacity(n);
    for r in results {
        match r {
            Some(Ok(v)) => out.push(v),
            Some(Err(e)) => return Err(e),
            // Left undone only because another part failed (work stops
            // being handed out after an error), whose error came first.
            None => {}
        }
    }
    // Every index below `n` was handed out until an error: without one,
    // each has its result.
    debug_assert_eq!(out.len(), n);
    Ok(out)
}

/// Why a format-3 body does not decode (a corrupt snapshot, which is
/// skipped for an older one or the log).
#[derive(Debug, thiserror::Error)]
enum BodyError {
    #[error("the body is shorter than its part count")]
    NoCount,
    #[error("{0} parts (1 to {MAX_PARTS} allowed)")]
    PartCount(usize),
    #[error("the body is shorter than its table of {0} parts")]
    NoTable(usize),
    #[error("part {part} is of unknown kind {kind}")]
    UnknownKind { part: usize, kind: u8 },
    #[error("the parts decode to more than {MAX_BODY} bytes")]
    TooLarge,
    #[error("part {0} runs past the end of the body")]
    PastTheEnd(usize),
    #[error("{0} bytes after the last part")]
    Trailing(usize),
    #[error("not exactly one part holds the rest of the state")]
    NotOneRest,
    #[error("part {part} does not decompress: {source}")]
    Decompress { part: usize, source: std::io::Error },
    #[error("part {part} decompresses to {got} bytes, its table says {table}")]
    RawLength {
        part: usize,
        got: usize,
        table: usize,
    },
    #[error("part {part} does not decode: {source}")]
    Decode {
        part: usize,
        source: bincode::error::DecodeError,
    },
    #[error("part {part} has {extra} trailing bytes")]
    PartTrailing { part: usize, extra: usize },
    #[error("no part holds the rest of the state")]
    NoRest,
    #[error("the rest of the state holds batches or jobs")]
    RestHoldsItems,
    #[error("the {0} ids are not in ascending order")]
    NotAscending(&'static str),
}

/// Decodes a format-3 body into a snapshot, its parts on every core but one
/// (sled opens the log on that one meanwhile).
fn decode_body(body: &[u8]) -> Result<Snapshot, BodyError> {
    let count = body
        .get(..4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
        .ok_or(BodyError::NoCount)?;
    if count == 0 || count > MAX_PARTS {
        return Err(BodyError::PartCount(count));
    }
    let table_end = 4 + count * PART_ENTRY_LEN;
    let table = body.get(4..table_end).ok_or(BodyError::NoTable(count))?;
    let mut parts = Vec::with_capacity(count);
    let mut at = table_end;
    let mut raw_total = 0u64;
    for (i, entry) in table.chunks_exact(PART_ENTRY_LEN).enumerate() {
        let kind = PartKind::from_byte(entry[0]).ok_or(BodyError::UnknownKind {
            part: i,
            kind: entry[0],
        })?;
        let u64_at = |o: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&entry[o..o + 8]);
            u64::from_le_bytes(b)
        };
        let (stored, raw) = (u64_at(1), u64_at(9));
        raw_total = raw_total.saturating_add(raw);
        if raw_total > MAX_BODY as u64 {
            return Err(BodyError::TooLarge);
        }
        let end = usize::try_from(stored)
            .ok()
            .and_then(|s| at.checked_add(s))
            .filter(|end| *end <= body.len())
            .ok_or(BodyError::PastTheEnd(i))?;
        parts.push((kind, &body[at..end], raw as usize));
        at = end;
    }
    if at != body.len() {
        return Err(BodyError::Trailing(body.len() - at));
    }
    if parts.iter().filter(|p| p.0 == PartKind::Rest).count() != 1 {
        return Err(BodyError::NotOneRest);
    }
    let config = bincode::config::standard().with_limit::<MAX_BODY>();
    // Decoding runs while sled opens the log (`Engine::open`): one core is
    // left to the open, which is start-up's longer part at 10M events
    // (with every core decoding, the open took 3.07 s instead of 2.52).
    let decoded = on_threads(cores().saturating_sub(1).max(1), parts.len(), |i| {
        let (kind, stored, raw_len) = parts[i];
        let raw = zstd::block::decompress(stored, raw_len)
            .map_err(|source| BodyError::Decompress { part: i, source })?;
        if raw.len() != raw_len {
            return Err(BodyError::RawLength {
                part: i,
                got: raw.len(),
                table: raw_len,
            });
        }
        let undecodable = |source| BodyError::Decode { part: i, source };
        let (value, used) = match kind {
            PartKind::Rest => {
                let (r, used) =
                    bincode::serde::decode_from_slice(&raw, config).map_err(undecodable)?;
                (Decoded::Rest(Box::new(r)), used)
            }
            PartKind::Batches => {
                let (b, used) =
                    bincode::serde::decode_from_slice(&raw, config).map_err(undecodable)?;
                (Decoded::Batches(b), used)
            }
            PartKind::Jobs => {
                let (j, used) =
                    bincode::serde::decode_from_slice(&raw, config).map_err(undecodable)?;
                (Decoded::Jobs(j), used)
            }
        };
        if used != raw.len() {
            return Err(BodyError::PartTrailing {
                part: i,
                extra: raw.len() - used,
            });
        }
        Ok(value)
    })?;
    let mut rest = None;
    let mut batches = Vec::new();
    let mut jobs = Vec::new();
    for d in decoded {
        match d {
            Decoded::Rest(r) => rest = Some(r),
            Decoded::Batches(b) => batches.push(b),
            Decoded::Jobs(j) => jobs.push(j),
        }
    }
    let Rest {
        mut state,
        frontier,
    } = *rest.ok_or(BodyError::NoRest)?;
    if !state.batches.is_empty() || !state.jobs.is_empty() {
        return Err(BodyError::RestHoldsItems);
    }
    state.batches = ascending(batches, "batch")?;
    state.jobs = ascending(jobs, "job")?;
    Ok(Snapshot { state, frontier })
}

/// The map of runs of entries that must be in strictly ascending key order
/// across all runs (as written): a map built from anything else would
/// silently drop or reorder entries.
fn ascending<K: Ord + Copy, V>(
    runs: Vec<Vec<(K, V)>>,
    what: &'static str,
) -> Result<BTreeMap<K, V>, BodyError> {
    let mut last: Option<K> = None;
    for (k, _) in runs.iter().flatten() {
        if last.is_some_and(|l| l >= *k) {
            return Err(BodyError::NotAscending(what));
        }
        last = Some(*k);
    }
    // Sorted input: the map is built in one pass.
    Ok(runs.into_iter().flatten().collect())
}

/// The snapshot directory of a data directory.
pub fn snapshot_dir(data_dir: &Path) -> PathBuf {
    data_dir.join(SNAPSHOT_DIR)
}

fn file_name(position: u64) -> String {
    format!("state-{position:020}.snap")
}

/// The temporary name a snapshot is written under before its rename.
fn temp_name(position: u64) -> String {
    format!(".{}{TEMP_SUFFIX}", file_name(position))
}

const TEMP_SUFFIX: &str = ".tmp";

/// Whether `name` is a snapshot's temporary name ([`temp_name`]).
fn is_temp_name(name: &str) -> bool {
    name.strip_prefix('.')
        .and_then(|n| n.strip_suffix(TEMP_SUFFIX))
        .is_some_and(|n| position_of(n).is_some())
}

fn write_then_rename(tmp: &Path, path: &Path, bytes: &[u8]) -> Result<(), SnapshotError> {
    let mut f = fs::File::create(tmp).map_err(io_err(tmp))?;
    f.write_all(bytes).map_err(io_err(tmp))?;
    f.sync_all().map_err(io_err(tmp))?;
    drop(f);
    fs::rename(tmp, path).map_err(io_err(path))
}

/// Removes the temporary files that snapshot writes left in `dir` (a process
/// killed while writing one, or one that could not remove it after an
/// error) and returns how many were removed. Call it only while holding the
/// log (the engine's exclusive open), so no other writer is half-way
/// through one. A missing or read-only directory removes nothing; each
/// file that cannot be removed is logged at WARN.
pub fn remove_temporaries(dir: &Path) -> usize {
    let Ok(entries) = fs::read_dir(dir) else {
        return 0;
    };
    let mut removed = 0;
    for entry in entries.filter_map(Result::ok) {
        let name = entry.file_name();
        if !name.to_str().is_some_and(is_temp_name) {
            continue;
        }
        let path = entry.path();
        match fs::remove_file(&path) {
            Ok(()) => removed += 1,
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "cannot remove a snapshot's temporary file")
            }
        }
    }
    removed
}

fn position_of(name: &str) -> Option<u64> {
    name.strip_prefix("state-")?
        .strip_suffix(".snap")
        .filter(|digits| digits.len() == 20)?
        .parse()
        .ok()
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> SnapshotError + '_ {
    move |source| SnapshotError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The snapshots in `dir`, newest (highest position) first. A missing
/// directory has none.
///
/// # Errors
/// [`SnapshotError::Io`] when the directory cannot be listed.
pub fn list(dir: &Path) -> Result<Vec<(u64, PathBuf)>, SnapshotError> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_err(dir)(e)),
    };
    let mut out: Vec<(u64, PathBuf)> = entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name();
            position_of(name.to_str()?).map(|p| (p, e.path()))
        })
        .collect();
    out.sort_by_key(|b| std::cmp::Reverse(b.0));
    Ok(out)
}

/// Writes a snapshot of `snapshot` into `dir` (created if missing) and
/// returns its path.
///
/// # Errors
/// [`SnapshotError::Io`]; nothing under a snapshot's name is left half-written.
pub fn write(dir: &Path, snapshot: &Snapshot) -> Result<PathBuf, SnapshotError> {
    write_parts(dir, &snapshot.state, &snapshot.frontier)
}

/// As [`write`], from borrowed parts (no copy of the state).
///
/// # Errors
/// As [`write`].
pub fn write_parts(
    dir: &Path,
    state: &State,
    frontier: &Frontier,
) -> Result<PathBuf, SnapshotError> {
    write_split(dir, state, frontier, PART_ENTRIES)
}

/// As [`write_parts`], with at most `part_entries` batches or jobs per part
/// (tests use small parts to have many).
///
/// # Errors
/// As [`write`].
#[doc(hidden)]
pub fn write_split(
    dir: &Path,
    state: &State,
    frontier: &Frontier,
    part_entries: usize,
) -> Result<PathBuf, SnapshotError> {
    fs::create_dir_all(dir).map_err(io_err(dir))?;
    let body = encode_body(state, frontier, part_entries.max(1)).map_err(|source| {
        SnapshotError::Encode {
            position: state.position,
            source,
        }
    })?;
    let mut bytes = Vec::with_capacity(HEADER_LEN + body.len());
    bytes.extend_from_slice(MAGIC);
    bytes.extend_from_slice(&FORMAT.to_le_bytes());
    bytes.extend_from_slice(&state.position.to_le_bytes());
    bytes.extend_from_slice(&state.head_hash);
    bytes.extend_from_slice(&(body.len() as u64).to_le_bytes());
    bytes.extend_from_slice(blake3::hash(&body).as_bytes());
    bytes.extend_from_slice(&body);
    let path = dir.join(file_name(state.position));
    let tmp = dir.join(temp_name(state.position));
    let written = write_then_rename(&tmp, &path, &bytes);
    if written.is_err() {
        // A half-written temporary file would hold its space (after ENOSPC,
        // all that was free) until the next start; each failed attempt
        // left one more before.
        if let Err(e) = fs::remove_file(&tmp) {
            if e.kind() != io::ErrorKind::NotFound {
                tracing::warn!(path = %tmp.display(), error = %e, "cannot remove a failed snapshot's temporary file");
            }
        }
    }
    written?;
    // The rename is durable once the directory is.
    if let Ok(d) = fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(path)
}

/// How long loading snapshots at start-up took, by part (summed over every
/// file tried), so that start-up can say where its time went.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LoadTimes {
    /// Snapshot files tried.
    pub files: u32,
    /// Bytes read from them.
    pub bytes: u64,
    /// Reading the files.
    pub read: Duration,
    /// Checking their checksums.
    pub checksum: Duration,
    /// Decoding their bodies.
    pub decode: Duration,
    /// Checking them against the log.
    pub check: Duration,
}

/// Reads and checks one snapshot file (not yet against a log).
///
/// # Errors
/// [`SnapshotError::Io`] or [`SnapshotError::Corrupt`].
pub fn read(path: &Path) -> Result<Snapshot, SnapshotError> {
    read_timed(path, &mut LoadTimes::default())
}

/// As [`read`], adding the time of each part to `times`.
///
/// # Errors
/// As [`read`].
pub fn read_timed(path: &Path, times: &mut LoadTimes) -> Result<Snapshot, SnapshotError> {
    let started = Instant::now();
    let corrupt = |reason: String| SnapshotError::Corrupt {
        path: path.to_path_buf(),
        reason,
    };
    let bytes = fs::read(path).map_err(io_err(path))?;
    times.files += 1;
    times.bytes += bytes.len() as u64;
    times.read += started.elapsed();
    if bytes.len() < HEADER_LEN {
        return Err(corrupt(format!(
            "{} bytes, shorter than its {HEADER_LEN}-byte header",
            bytes.len()
        )));
    }
    let (header, body) = bytes.split_at(HEADER_LEN);
    if &header[..16] != MAGIC {
        return Err(corrupt("not a snapshot (wrong magic)".into()));
    }
    let u64_at = |at: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&header[at..at + 8]);
        u64::from_le_bytes(b)
    };
    let mut format = [0u8; 4];
    format.copy_from_slice(&header[16..20]);
    let format = u32::from_le_bytes(format);
    if format != FORMAT {
        return Err(corrupt(format!(
            "format {format}; this build reads format {FORMAT} only"
        )));
    }
    let position = u64_at(20);
    let head_hash: Hash = header[28..60].try_into().unwrap_or_default();
    let len = u64_at(60);
    if len != body.len() as u64 {
        return Err(corrupt(format!(
            "the header says {len} body bytes, the file has {}",
            body.len()
        )));
    }
    let started = Instant::now();
    let sum = blake3::hash(body);
    times.checksum += started.elapsed();
    if sum.as_bytes() != &header[68..100] {
        return Err(corrupt("the body fails its checksum".into()));
    }
    let started = Instant::now();
    let mut snapshot = decode_body(body).map_err(|e| corrupt(format!("the body: {e}")))?;
    snapshot.state.reindex();
    times.decode += started.elapsed();
    if snapshot.state.position != position || snapshot.state.head_hash != head_hash {
        return Err(corrupt(
            "the state inside names another position or hash than the header".into(),
        ));
    }
    if snapshot.frontier.size() != position {
        return Err(corrupt(format!(
            "the Merkle tree inside has {} leaves for position {position}",
            snapshot.frontier.size()
        )));
    }
    Ok(snapshot)
}

/// Checks that `snapshot` is a fold of `log` up to a position no later than
/// `readable`: the log's record there has the snapshot's hash.
///
/// # Errors
/// [`SnapshotError::Mismatch`].
pub fn check_against(
    path: &Path,
    snapshot: &Snapshot,
    log: &Log,
    readable: u64,
) -> Result<(), SnapshotError> {
    let mismatch = |reason: String| SnapshotError::Mismatch {
        path: path.to_path_buf(),
        reason,
    };
    let position = snapshot.state.position;
    if position > readable {
        return Err(mismatch(format!(
            "it folds up to position {position}; the readable log ends at {readable}"
        )));
    }
    let record = log
        .read_one(position)
        .map_err(|e| mismatch(format!("the log's record at {position}: {e}")))?;
    if record.envelope.hash != snapshot.state.head_hash {
        return Err(mismatch(format!(
            "the log's record at {position} has hash {}, the snapshot {}",
            hex::encode(record.envelope.hash),
            hex::encode(snapshot.state.head_hash)
        )));
    }
    Ok(())
}

/// The newest snapshot in `dir` that is intact and matches `log` up to
/// `readable`; every one skipped is logged at WARN with why. `None` when
/// none does (the fold then starts at position 1).
pub fn load_newest(dir: &Path, log: &Log, readable: u64) -> Option<Snapshot> {
    let mut times = LoadTimes::default();
    let prefetched = prefetch(dir, &mut times);
    load_prefetched(prefetched, log, readable, &mut times)
}

/// The snapshots of a directory with the newest one already read and
/// checked on its own ([`prefetch`]), to be checked against the log by
/// [`load_prefetched`]. The default has none.
#[derive(Default)]
pub struct Prefetched {
    /// Every snapshot file, newest first.
    found: Vec<(u64, PathBuf)>,
    /// The newest one as read (`None` when there is none).
    newest: Option<Result<Snapshot, SnapshotError>>,
}

/// Lists the snapshots in `dir` and reads the newest one, which needs no
/// log: start-up does this while the log opens. A directory that cannot be
/// listed has none (logged at WARN).
pub fn prefetch(dir: &Path, times: &mut LoadTimes) -> Prefetched {
    let found = match list(dir) {
        Ok(found) => found,
        Err(e) => {
            tracing::warn!(error = %e, "cannot list the snapshots; folding the whole log");
            Vec::new()
        }
    };
    let newest = found.first().map(|(_, path)| read_timed(path, times));
    Prefetched { found, newest }
}

/// The newest of the `prefetched` snapshots that matches `log` up to
/// `readable` (reading older ones when it does not); every one skipped is
/// logged at WARN with why, as [`load_newest`].
pub fn load_prefetched(
    prefetched: Prefetched,
    log: &Log,
    readable: u64,
    times: &mut LoadTimes,
) -> Option<Snapshot> {
    let Prefetched { found, mut newest } = prefetched;
    for (_, path) in found {
        let read = match newest.take() {
            Some(read) => read,
            None => read_timed(&path, times),
        };
        let checked = read.and_then(|s| {
            let started = Instant::now();
            let checked = check_against(&path, &s, log, readable);
            times.check += started.elapsed();
            checked.map(|()| s)
        });
        match checked {
            Ok(s) => return Some(s),
            Err(e) => tracing::warn!(error = %e, "snapshot ignored; the fold starts earlier"),
        }
    }
    None
}

/// Removes all but the newest `keep` snapshots.
///
/// # Errors
/// [`SnapshotError::Io`] when the directory cannot be listed.
pub fn prune(dir: &Path, keep: usize) -> Result<(), SnapshotError> {
    for (_, path) in list(dir)?.into_iter().skip(keep.max(1)) {
        if let Err(e) = fs::remove_file(&path) {
            tracing::warn!(path = %path.display(), error = %e, "cannot remove an old snapshot");
        }
    }
    Ok(())
}
