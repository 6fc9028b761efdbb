//! Snapshots of the folded state, kept beside the log so that start-up folds
//! only the tail.
//!
//! A snapshot is one file, `<data_dir>/snapshots/state-<position>.snap`
//! (the position zero-padded to 20 digits, so names sort by position):
//!
//! | bytes | what |
//! | --- | --- |
//! | 16 | magic `ingest-snapshot\n` |
//! | 4 | format version, little-endian (1) |
//! | 8 | the position it folds up to, little-endian |
//! | 32 | the hash of the record at that position |
//! | 8 | body length, little-endian |
//! | 32 | BLAKE3 of the body |
//! | … | body: bincode (standard) of the [`State`] and the Merkle [`Frontier`] |
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

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ingest_events::codec::Hash;
use ingest_events::log::Log;
use ingest_events::merkle::Frontier;
use ingest_events::State;
use serde::{Deserialize, Serialize};

/// The snapshot directory's name inside the data directory.
pub const SNAPSHOT_DIR: &str = "snapshots";
const MAGIC: &[u8; 16] = b"ingest-snapshot\n";
const FORMAT: u32 = 1;
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

/// What [`write_parts`] encodes: the same bytes as a [`Snapshot`].
#[derive(Serialize)]
struct SnapshotRef<'a> {
    state: &'a State,
    frontier: &'a Frontier,
}

/// The snapshot directory of a data directory.
pub fn snapshot_dir(data_dir: &Path) -> PathBuf {
    data_dir.join(SNAPSHOT_DIR)
}

fn file_name(position: u64) -> String {
    format!("state-{position:020}.snap")
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
    fs::create_dir_all(dir).map_err(io_err(dir))?;
    let parts = SnapshotRef { state, frontier };
    let body = bincode::serde::encode_to_vec(&parts, bincode::config::standard()).map_err(|e| {
        SnapshotError::Io {
            path: dir.to_path_buf(),
            source: io::Error::other(e.to_string()),
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
    let tmp = dir.join(format!(".{}.tmp", file_name(state.position)));
    let mut f = fs::File::create(&tmp).map_err(io_err(&tmp))?;
    f.write_all(&bytes).map_err(io_err(&tmp))?;
    f.sync_all().map_err(io_err(&tmp))?;
    drop(f);
    fs::rename(&tmp, &path).map_err(io_err(&path))?;
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
            "format {format}; this build reads format {FORMAT}"
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
    let config = bincode::config::standard().with_limit::<MAX_BODY>();
    let (snapshot, used): (Snapshot, usize) = bincode::serde::decode_from_slice(body, config)
        .map_err(|e| corrupt(format!("the body does not decode: {e}")))?;
    times.decode += started.elapsed();
    if used != body.len() {
        return Err(corrupt(format!("{} trailing bytes", body.len() - used)));
    }
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
    load_newest_timed(dir, log, readable, &mut LoadTimes::default())
}

/// As [`load_newest`], adding the time of each part to `times`.
pub fn load_newest_timed(
    dir: &Path,
    log: &Log,
    readable: u64,
    times: &mut LoadTimes,
) -> Option<Snapshot> {
    let found = match list(dir) {
        Ok(found) => found,
        Err(e) => {
            tracing::warn!(error = %e, "cannot list the snapshots; folding the whole log");
            return None;
        }
    };
    for (_, path) in found {
        let checked = read_timed(&path, times).and_then(|s| {
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
