//! The append-only event log, kept in sled.
//!
//! ## Layout
//! One sled tree, `log`, holds two kinds of keys:
//! - `e` + position (u64 big-endian) → the encoded record ([`crate::codec`]);
//! - `i` + stream key ([`StreamId::key`]) + version (u64 big-endian) → position.
//!
//! and the audit-read indexes (see [`crate::audit_keys`] for their layout):
//! - `a` + actor hash + first position → last position: runs of consecutive
//!   positions written by one actor;
//! - `c` + collection hash + stream key → the collection's name: the batch and
//!   job streams of each collection;
//! - `x` + `audit-index-v1` → empty: the audit indexes cover the whole log.
//!
//! Reads by time need no index: the log never lets time go backwards (an
//! append's timestamp is raised to the head's), so timestamps are sorted by
//! position and a binary search over positions finds any instant.
//!
//! An append writes all of a command's records and their index entries in one
//! `sled::Batch`, which sled applies atomically: after a crash a command's
//! events are all there or none are.
//!
//! ## Durability: group commit
//! [`Log::append`] returns only after its records are flushed. The first
//! appender that finds no flush running becomes the leader: it notes the
//! written head, flushes, publishes the durable position and wakes the others.
//! Appenders that arrived meanwhile are covered by that flush or elect the
//! next leader, so concurrent appends share flushes instead of queueing one
//! flush each.
//!
//! ## The hash chain
//! Each record carries the previous record's hash and its own. [`Log::open`]
//! re-checks the tail; if it fails, the log opens read-only and appends are
//! refused with [`LogError::NeedsRepair`] until [`Log::repair_tail`] truncates
//! the torn tail. [`Log::verify`] re-checks the whole chain and the index.

use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use tokio::sync::watch;

use crate::codec::{
    decode_record, encode_record, Hash, NewRecord, Recorded, GENESIS_HASH, MAX_RECORD_BYTES,
};
use crate::event::StreamId;

const EVENT: u8 = b'e';
const INDEX: u8 = b'i';
use crate::audit_keys::{self as ai, ActorRun};
/// How many records at the tail [`Log::open`] re-checks.
const TAIL_CHECK: u64 = 64;

pub use crate::append::{AppendRequest, ExpectedVersion, Proposed};

/// A stream version did not match what the command expected.
///
/// ### Handling
/// A logical conflict, not an I/O failure: nothing was appended. Re-read the
/// stream, decide again, or report 409 to the caller.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("stream {stream} is at version {actual}, the command expected {expected}")]
pub struct Conflict {
    /// The stream.
    pub stream: StreamId,
    /// What the command expected.
    pub expected: ExpectedVersion,
    /// What the log holds (0 when the stream does not exist).
    pub actual: u64,
}

/// The result of an append that went through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Appended {
    /// The positions written, first to last (empty for an empty request).
    pub positions: RangeInclusive<u64>,
    /// The records written, as they will be read back.
    pub records: Vec<Recorded>,
}

/// The log could not do what was asked for a reason other than a conflict.
///
/// ### Handling
/// `Storage` is an I/O failure: the append's outcome is unknown until the log
/// is re-opened and read. `NeedsRepair` and `Corrupt` need an operator.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LogError {
    /// sled failed (disk full, I/O error, damaged files).
    #[error("event log storage error: {}", describe_sled(.0))]
    Storage(#[from] sled::Error),
    /// The log's files cannot be opened: damaged (flipped bytes, a cut or
    /// zeroed file, a missing file) or unreadable.
    #[error("cannot read the event log in {path}: {detail}. Its files are damaged or unreadable; nothing was changed. Restore the data directory from a backup and run `ingest verify` on it (`ingest repair` only truncates a torn tail of a log that opens)")]
    Damaged {
        /// The log's directory.
        path: PathBuf,
        /// What could not be read.
        detail: String,
    },
    /// Another process holds the log.
    #[error("the event log at {path} is in use by another process (sled allows one process per data directory); stop that process or talk to it through its API")]
    Locked {
        /// The log's directory.
        path: PathBuf,
    },
    /// The tail of the log fails the hash chain; appends are refused.
    #[error("the event log fails its hash chain at position {position} ({reason}); appends are refused until an operator runs `ingest repair`, which truncates the torn tail")]
    NeedsRepair {
        /// The first bad position.
        position: u64,
        /// What is wrong there.
        reason: String,
    },
    /// A record read back is corrupt.
    #[error("event log record at position {position} is corrupt: {reason}")]
    Corrupt {
        /// Where.
        position: u64,
        /// What.
        reason: String,
    },
    /// A record is larger than the log can read back
    /// ([`crate::codec::MAX_RECORD_BYTES`]); nothing was written.
    #[error("event {kind} would be a {bytes}-byte record; the log accepts at most {limit} bytes per record; nothing was appended")]
    RecordTooLarge {
        /// The event kind.
        kind: &'static str,
        /// Its encoded size.
        bytes: usize,
        /// The limit.
        limit: usize,
    },
    /// A repair was asked for where it cannot help.
    #[error("cannot repair: {0}")]
    Unrepairable(String),
}

/// Records copied from another log could not be imported.
///
/// ### Handling
/// `Refused` means the records do not continue this log (another history,
/// a gap, damaged bytes): nothing was written; the copy must come from a
/// log this one is a prefix of (a replica bootstraps again). `Log` is as for
/// appends.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ImportError {
    /// A record does not continue this log; nothing was written.
    #[error("a copied record does not continue this log{}: {reason}", .position.map(|p| format!(" at position {p}")).unwrap_or_default())]
    Refused {
        /// The position this log expected next, when a record was read.
        position: Option<u64>,
        /// What did not fit.
        reason: String,
    },
    /// The log failed.
    #[error(transparent)]
    Log(#[from] LogError),
}

/// Options for opening a log.
#[derive(Debug, Clone)]
pub struct LogConfig {
    /// sled's page cache, in bytes.
    pub cache_capacity: u64,
    /// sled's segment size in bytes (a power of two, 256 B to 16 MiB), for a
    /// new log; an existing log keeps the size it was created with.
    pub segment_size: usize,
    /// zstd level (1-22) of sled's page compression for a new log, or `None`
    /// for none; an existing log keeps what it was created with.
    pub compression: Option<i32>,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            cache_capacity: 256 * 1024 * 1024,
            segment_size: SEGMENT_SIZE,
            compression: COMPRESSION,
        }
    }
}

/// The segment size of a new log (see [`LogConfig::segment_size`]).
pub const SEGMENT_SIZE: usize = 512 * 1024;
/// The compression of a new log (see [`LogConfig::compression`]): none.
/// sled compresses each page it writes with a zstd context of its own, and
/// making a context asks the CPU for its features (CPUID), which a
/// hypervisor traps: on a virtual machine that was a fifth of the server's
/// CPU and zstd a third, for half the bytes per event (`tools/load`, one
/// worker: 402-435 jobs/s with level 3, 505-531 without, in one run).
/// `ingest serve --log-compression LEVEL` creates a compressed log.
pub const COMPRESSION: Option<i32> = None;

/// The storage parameters sled persisted when it created the log in `dir`
/// (`conf`: `segment_size` and `use_compression`), which a re-open must
/// repeat; `None` for a new directory.
fn persisted_storage(dir: &Path) -> Option<(usize, bool)> {
    // The settings text is followed by a 4-byte CRC, so read it lossily.
    let bytes = std::fs::read(dir.join("conf")).ok()?;
    let text = String::from_utf8_lossy(&bytes);
    let mut segment = None;
    let mut compression = None;
    for line in text.lines() {
        match line.split_once(": ") {
            Some(("segment_size", v)) => segment = v.trim().parse().ok(),
            Some(("use_compression", v)) => compression = v.trim().parse().ok(),
            _ => {}
        }
    }
    Some((segment?, compression?))
}

/// What `verify` found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifyReport {
    /// How many records were checked.
    pub events_checked: u64,
    /// The hash of the last good record ([`GENESIS_HASH`] for an empty log).
    pub head_hash: Hash,
    /// The last position checked.
    pub head_position: u64,
    /// Stream index entries checked.
    pub index_entries_checked: u64,
    /// Every problem, by position.
    pub problems: Vec<VerifyProblem>,
}

/// One problem `verify` found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifyProblem {
    /// Where (0 for a problem of the index that has no position).
    pub position: u64,
    /// What.
    pub message: String,
}

/// Commands staged to be written together in one sled batch.
///
/// Each staged command keeps its own expectation checks and all-or-nothing
/// effect; the group as a whole is also all-or-nothing (one `sled::Batch`).
/// The records a stage returns carry their final positions and hashes, so a
/// single writer can fold them before the group is committed.
pub struct Group<'a> {
    log: &'a Log,
    writer: MutexGuard<'a, Writer>,
    batch: sled::Batch,
    head: u64,
    head_hash: Hash,
    head_time: DateTime<Utc>,
    versions: std::collections::HashMap<StreamId, u64>,
    staged: usize,
    actor_run: Option<ActorRun>,
    /// One frame per staged command ([`crate::frame`]): what a replicated
    /// leader sends before it commits.
    frames: Vec<Vec<u8>>,
}

impl Group<'_> {
    /// The frames of the commands staged so far, one per command, in order:
    /// each holds the command's records exactly as they will be stored.
    pub fn frames(&self) -> &[Vec<u8>] {
        &self.frames
    }

    /// The current version of a stream, counting what this group staged.
    fn version(&self, stream: StreamId) -> Result<u64, LogError> {
        match self.versions.get(&stream) {
            Some(v) => Ok(*v),
            None => self.log.stream_version(stream),
        }
    }

    /// Checks and stages one command. Nothing of a refused command is staged.
    ///
    /// # Errors
    /// As [`Log::append`]; `RecordTooLarge` refuses this command only.
    pub fn stage(&mut self, request: &AppendRequest) -> AppendResult {
        if let Some((position, reason)) = &self.writer.needs_repair {
            return Err(LogError::NeedsRepair {
                position: *position,
                reason: reason.clone(),
            });
        }
        for (stream, expected) in &request.expectations {
            let actual = self.version(*stream)?;
            let ok = match expected {
                ExpectedVersion::Any => true,
                ExpectedVersion::NoStream => actual == 0,
                ExpectedVersion::Exact(v) => actual == *v,
            };
            if !ok {
                return Ok(Err(Conflict {
                    stream: *stream,
                    expected: *expected,
                    actual,
                }));
            }
        }
        if request.events.is_empty() {
            return Ok(Ok(Appended {
                positions: (self.head + 1)..=self.head,
                records: Vec::new(),
            }));
        }
        let timestamp = request.timestamp.max(self.head_time);
        let mut versions: Vec<(StreamId, u64)> = Vec::new();
        let mut encoded = Vec::with_capacity(request.events.len());
        let mut records = Vec::with_capacity(request.events.len());
        let mut pos = self.head;
        let mut prev_hash = self.head_hash;
        for p in &request.events {
            pos += 1;
            let version = match versions.iter_mut().find(|(s, _)| *s == p.stream) {
                Some((_, v)) => {
                    *v += 1;
                    *v
                }
                None => {
                    let v = self.version(p.stream)? + 1;
                    versions.push((p.stream, v));
                    v
                }
            };
            let new = NewRecord {
                position: pos,
                stream: p.stream,
                version,
                timestamp,
                actor: &request.actor,
                correlation_id: request.correlation_id,
                prev_hash,
                event: &p.event,
            };
            let (bytes, hash) = encode_record(&new);
            if bytes.len() > MAX_RECORD_BYTES {
                // Checked before anything is staged: a record the decoder
                // refuses must never be acknowledged.
                return Err(LogError::RecordTooLarge {
                    kind: p.event.kind(),
                    bytes: bytes.len(),
                    limit: MAX_RECORD_BYTES,
                });
            }
            encoded.push((pos, p.stream, version, bytes));
            records.push(Recorded {
                envelope: crate::codec::Envelope {
                    position: pos,
                    stream: p.stream,
                    version,
                    timestamp: chrono_micros(timestamp),
                    actor: request.actor.clone(),
                    correlation_id: request.correlation_id,
                    schema_version: crate::codec::SCHEMA_VERSION,
                    prev_hash,
                    hash,
                },
                event: p.event.clone(),
            });
            prev_hash = hash;
        }
        let mut frame = Vec::new();
        for (_, _, _, bytes) in &encoded {
            crate::frame::push(&mut frame, bytes);
        }
        self.frames.push(frame);
        for (pos, stream, version, bytes) in encoded {
            self.batch.insert(&event_key(pos), bytes);
            self.batch
                .insert(&index_key(stream, version), &pos.to_be_bytes());
        }
        let first = self.head + 1;
        // The audit indexes, in the same batch as the records they index.
        self.actor_run = Some(ai::stage_actor(
            &mut self.batch,
            self.actor_run,
            &request.actor,
            first..=pos,
        ));
        for p in &request.events {
            ai::stage_collection(&mut self.batch, p.stream, &p.event);
        }
        self.versions.extend(versions);
        self.head = pos;
        self.head_hash = prev_hash;
        self.head_time = timestamp;
        self.staged += 1;
        Ok(Ok(Appended {
            positions: first..=pos,
            records,
        }))
    }

    /// Writes everything staged in one atomic sled batch (not yet flushed).
    /// Returns the last position written, `None` when nothing was staged.
    ///
    /// # Errors
    /// [`LogError::Storage`]: nothing of the group was written.
    pub fn commit(mut self) -> Result<Option<u64>, LogError> {
        if self.head == self.writer.head {
            return Ok(None);
        }
        self.log.tree.apply_batch(std::mem::take(&mut self.batch))?;
        self.writer.head = self.head;
        self.writer.head_hash = self.head_hash;
        self.writer.head_time = self.head_time;
        self.writer.actor_run = self.actor_run;
        Ok(Some(self.head))
    }
}

/// The append-only event log. One per data directory; cheap to share by reference.
pub struct Log {
    db: sled::Db,
    tree: sled::Tree,
    path: PathBuf,
    writer: Mutex<Writer>,
    durable: Mutex<Durable>,
    durable_changed: Condvar,
    durable_tx: watch::Sender<u64>,
    combiner: Mutex<Combiner>,
    combined: Condvar,
}

/// What an append returns: an I/O or repair error, a conflict, or the records.
pub type AppendResult = Result<Result<Appended, Conflict>, LogError>;

/// The queue of concurrent [`Log::append`] callers (flat combining).
#[derive(Default)]
struct Combiner {
    queue: Vec<(u64, AppendRequest)>,
    results: std::collections::HashMap<u64, AppendResult>,
    leading: bool,
    next_ticket: u64,
    groups: u64,
}

struct Writer {
    head: u64,
    head_hash: Hash,
    head_time: DateTime<Utc>,
    needs_repair: Option<(u64, String)>,
    /// The actor run the last append extended or started (`None` after an
    /// open or a repair: the next append starts a new run).
    actor_run: Option<ActorRun>,
}

struct Durable {
    position: u64,
    flushing: bool,
    failed: Option<String>,
}

fn event_key(pos: u64) -> [u8; 9] {
    let mut k = [0u8; 9];
    k[0] = EVENT;
    k[1..].copy_from_slice(&pos.to_be_bytes());
    k
}

fn index_key(stream: StreamId, version: u64) -> [u8; 18] {
    let mut k = [0u8; 18];
    k[0] = INDEX;
    k[1..10].copy_from_slice(&stream.key());
    k[10..].copy_from_slice(&version.to_be_bytes());
    k
}

fn index_prefix(stream: StreamId) -> [u8; 10] {
    let mut k = [0u8; 10];
    k[0] = INDEX;
    k[1..].copy_from_slice(&stream.key());
    k
}

fn be_u64(bytes: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(bytes.try_into().ok()?))
}

/// sled's error in words an operator can act on (sled's own `Corruption`
/// text is "Read corrupted data at file offset None backtrace ()").
fn describe_sled(e: &sled::Error) -> String {
    match e {
        // sled's offset (`Inline(130)`) tells an operator nothing.
        sled::Error::Corruption { .. } => "the log's files hold damaged data".to_string(),
        sled::Error::Io(io) => format!("I/O error: {io}"),
        sled::Error::ReportableBug(_) => {
            "the log's files are in a state sled cannot read (damaged files)".to_string()
        }
        other => other.to_string(),
    }
}

/// Runs `f` (opening the log at `dir`); a panic inside sled (which it does
/// on some cut files) becomes [`LogError::Damaged`] instead of a crash,
/// without a backtrace on stderr.
fn without_panics<T>(dir: &Path, f: impl FnOnce() -> Result<T, LogError>) -> Result<T, LogError> {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    std::panic::set_hook(previous);
    outcome.unwrap_or_else(|panic| {
        let said = panic
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| panic.downcast_ref::<&str>().copied())
            .unwrap_or("no message");
        Err(LogError::Damaged {
            path: dir.to_path_buf(),
            detail: format!(
                "sled stopped while reading its files ({})",
                cut_chars(said, 200)
            ),
        })
    })
}

/// The first `max` characters of `s` (the events crate cannot use the
/// protocol crate's `cut`).
fn cut_chars(s: &str, max: usize) -> &str {
    match s.char_indices().nth(max) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding these locks leaves plain numbers behind, which
    // stay consistent; keep going rather than poisoning every later append.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Log {
    /// Opens (or creates) the log in `dir`.
    ///
    /// # Errors
    /// [`LogError::Locked`] when another process has it open,
    /// [`LogError::Storage`] on I/O errors. A tail that fails the hash chain
    /// does not fail the open: the log opens read-only (see [`Log::needs_repair`]).
    pub fn open(dir: &Path, config: &LogConfig) -> Result<Log, LogError> {
        without_panics(dir, || Self::open_inner(dir, config)).map_err(|e| match e {
            // An I/O error (permissions, a full disk) is not damage.
            LogError::Storage(e) if !matches!(e, sled::Error::Io(_)) => damaged(dir, &e),
            other => other,
        })
    }

    fn open_inner(dir: &Path, config: &LogConfig) -> Result<Log, LogError> {
        // sled keeps its data in `db`, described by `conf` (which sled
        // re-creates when missing): a log with `conf` and no `db` lost its
        // data (sled would call it corrupt data at some offset).
        if dir.join("conf").exists() && !dir.join("db").exists() {
            return Err(LogError::Damaged {
                path: dir.to_path_buf(),
                detail: "its data file db is missing".into(),
            });
        }
        // sled releases its file lock a moment after a `Db` is dropped (its I/O
        // threads let go of the file late, spacejam/sled#1289), so a reopen in
        // the same process may briefly see the lock: retry for a short grace.
        let deadline = Instant::now() + Duration::from_millis(500);
        let (segment_size, compression) = match persisted_storage(dir) {
            Some((segment, compressed)) => (
                segment,
                compressed.then_some(config.compression.unwrap_or(3)),
            ),
            None => (config.segment_size, config.compression),
        };
        let db = loop {
            let opened = sled::Config::new()
                .path(dir)
                .cache_capacity(config.cache_capacity)
                .segment_size(segment_size)
                .use_compression(compression.is_some())
                .compression_factor(compression.unwrap_or(3))
                .flush_every_ms(None)
                .open();
            match opened {
                Ok(db) => break db,
                Err(sled::Error::Io(ref io))
                    if io.to_string().contains("could not acquire lock") =>
                {
                    if Instant::now() >= deadline {
                        return Err(LogError::Locked {
                            path: dir.to_path_buf(),
                        });
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(other) => return Err(LogError::Storage(other)),
            }
        };
        let tree = db.open_tree("log")?;
        let mut writer = Writer {
            head: 0,
            head_hash: GENESIS_HASH,
            head_time: DateTime::<Utc>::MIN_UTC,
            needs_repair: None,
            actor_run: None,
        };
        if let Some((k, _)) = tree.scan_prefix([EVENT]).next_back().transpose()? {
            writer.head = be_u64(&k[1..]).unwrap_or(0);
        }
        let mut log = Log {
            db,
            tree,
            path: dir.to_path_buf(),
            writer: Mutex::new(Writer {
                head: 0,
                head_hash: GENESIS_HASH,
                head_time: writer.head_time,
                needs_repair: None,
                actor_run: None,
            }),
            durable: Mutex::new(Durable {
                position: writer.head,
                flushing: false,
                failed: None,
            }),
            durable_changed: Condvar::new(),
            durable_tx: watch::channel(writer.head).0,
            combiner: Mutex::new(Combiner::default()),
            combined: Condvar::new(),
        };
        log.check_tail(&mut writer)?;
        *log.writer.get_mut().unwrap_or_else(|e| e.into_inner()) = writer;
        {
            let head = log.head().0;
            ai::build_if_missing(&log.tree, head, log.read_range(1, head).map(Result::ok))?;
        }
        Ok(log)
    }

    /// Re-checks the last records; sets `needs_repair` on the first failure.
    fn check_tail(&self, w: &mut Writer) -> Result<(), LogError> {
        if w.head == 0 {
            return Ok(());
        }
        let start = w.head.saturating_sub(TAIL_CHECK).max(1);
        let mut prev = if start == 1 {
            Some(GENESIS_HASH)
        } else {
            match self.read_one(start - 1) {
                Ok(r) => Some(r.envelope.hash),
                Err(_) => None,
            }
        };
        for pos in start..=w.head {
            match self.read_one(pos) {
                Ok(r) => {
                    if let Some(p) = prev {
                        if r.envelope.prev_hash != p {
                            w.needs_repair = Some((pos, "previous-hash link broken".into()));
                            return Ok(());
                        }
                    }
                    prev = Some(r.envelope.hash);
                    w.head_hash = r.envelope.hash;
                    w.head_time = r.envelope.timestamp;
                }
                Err(LogError::Storage(e)) => return Err(LogError::Storage(e)),
                Err(e) => {
                    let reason = match e {
                        LogError::Corrupt { reason, .. } => reason,
                        other => other.to_string(),
                    };
                    w.needs_repair = Some((pos, reason));
                    return Ok(());
                }
            }
        }
        Ok(())
    }

    /// The directory the log lives in.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Where the tail fails the chain, if it does.
    pub fn needs_repair(&self) -> Option<(u64, String)> {
        lock(&self.writer).needs_repair.clone()
    }

    /// Another tree of the log's sled database, for state that lives beside
    /// the log in the data directory (the object inventory, the ark
    /// minter). Such trees are not part of the log: they are not hashed,
    /// verified or replayed.
    ///
    /// # Errors
    /// `name` is the log's own tree (`log`), or sled failed.
    pub fn side_tree(&self, name: &str) -> Result<sled::Tree, LogError> {
        if name == "log" || name.starts_with("__sled") {
            return Err(LogError::Storage(sled::Error::Unsupported(format!(
                "{name:?} is reserved for the log"
            ))));
        }
        Ok(self.db.open_tree(name)?)
    }

    /// The last written position (durable or not) and its hash.
    pub fn head(&self) -> (u64, Hash) {
        let w = lock(&self.writer);
        (w.head, w.head_hash)
    }

    /// The last position known to be on disk.
    pub fn durable_position(&self) -> u64 {
        lock(&self.durable).position
    }

    /// A receiver that sees the durable position each time it advances: the
    /// live tail for projectors. Read up to the value seen, then await a change.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.durable_tx.subscribe()
    }

    /// The current version of a stream (0 when it has no events).
    ///
    /// # Errors
    /// [`LogError::Storage`] on I/O errors.
    pub fn stream_version(&self, stream: StreamId) -> Result<u64, LogError> {
        Ok(
            match self
                .tree
                .scan_prefix(index_prefix(stream))
                .next_back()
                .transpose()?
            {
                Some((k, _)) => be_u64(&k[10..]).unwrap_or(0),
                None => 0,
            },
        )
    }

    /// Appends one command's events atomically and returns once they are durable.
    ///
    /// Concurrent callers share flushes (flat combining): each caller queues
    /// its request; whoever finds no leader at work becomes the leader, writes
    /// every queued request (each as its own atomic batch) and flushes once for
    /// all of them, while new requests queue for the next round. Only the
    /// leader touches sled, which matters because sled 0.34's `apply_batch`
    /// waits for a running flush (they share a process-wide lock), so callers
    /// that wrote for themselves would each pay for a flush of their own.
    ///
    /// # Errors
    /// The outer error is I/O or a log that needs repair: the append's effect
    /// is unknown (`Storage`) or nothing was written (`NeedsRepair`). The inner
    /// [`Conflict`] means an expectation failed and nothing was written.
    pub fn append(&self, request: &AppendRequest) -> Result<Result<Appended, Conflict>, LogError> {
        let mut c = lock(&self.combiner);
        let ticket = c.next_ticket;
        c.next_ticket += 1;
        c.queue.push((ticket, request.clone()));
        loop {
            if let Some(result) = c.results.remove(&ticket) {
                return result;
            }
            if c.leading {
                c = self.combined.wait(c).unwrap_or_else(|e| e.into_inner());
                continue;
            }
            c.leading = true;
            let group = std::mem::take(&mut c.queue);
            drop(c);
            let results = self.write_group(group);
            c = lock(&self.combiner);
            c.results.extend(results);
            c.leading = false;
            c.groups += 1;
            self.combined.notify_all();
        }
    }

    /// Writes each request of a group in one sled batch and flushes once.
    fn write_group(&self, requests: Vec<(u64, AppendRequest)>) -> Vec<(u64, AppendResult)> {
        let mut group = self.begin_group();
        let mut out: Vec<(u64, AppendResult)> = requests
            .iter()
            .map(|(ticket, request)| (*ticket, group.stage(request)))
            .collect();
        let failure = match group.commit() {
            Ok(None) => None,
            Ok(Some(last)) => self.wait_durable(last).err(),
            Err(e) => Some(e),
        };
        if let Some(e) = failure {
            let why = e.to_string();
            for (_, r) in out.iter_mut() {
                if matches!(r, Ok(Ok(_))) {
                    *r = Err(LogError::Storage(sled::Error::Io(std::io::Error::other(
                        why.clone(),
                    ))));
                }
            }
        }
        out
    }

    /// How many groups [`Log::append`] has written (each with at most one
    /// flush): with concurrent appenders this is less than the number of appends.
    pub fn append_groups(&self) -> u64 {
        lock(&self.combiner).groups
    }

    /// Writes one command's events atomically without waiting for the flush.
    /// The caller must not acknowledge them before [`Log::wait_durable`]
    /// returns for the last position. This lets a single writer decide the
    /// next command while the previous one's flush is still running.
    ///
    /// # Errors
    /// As [`Log::append`].
    pub fn append_unflushed(&self, request: &AppendRequest) -> AppendResult {
        let mut group = self.begin_group();
        let result = group.stage(request);
        group.commit()?;
        result
    }

    /// Starts a group of commands written together in ONE sled batch (one
    /// I/O-buffer roll in sled), each command checked and staged on its own.
    /// Holds the writer lock until [`Group::commit`] or drop (drop discards).
    pub fn begin_group(&self) -> Group<'_> {
        let w = lock(&self.writer);
        Group {
            log: self,
            head: w.head,
            head_hash: w.head_hash,
            head_time: w.head_time,
            actor_run: w.actor_run,
            writer: w,
            batch: sled::Batch::default(),
            versions: std::collections::HashMap::new(),
            staged: 0,
            frames: Vec::new(),
        }
    }

    /// Writes records copied from another engine's log (a replicated tail,
    /// a bootstrap, a restore) after checking each against this log: it
    /// must decode and verify its own hash, follow the head (position + 1,
    /// previous hash, a stream version one past the stream's, a timestamp
    /// not before the head's). Every record of `frame` is written in one
    /// sled batch, with its index and audit entries, or none is; the caller
    /// waits for [`Log::wait_durable`] before it counts them as applied.
    ///
    /// # Errors
    /// [`ImportError::Refused`] names the first record that does not fit
    /// (nothing is written); [`ImportError::Log`] for I/O or a log that
    /// needs repair.
    pub fn import(&self, frame: &[u8]) -> Result<Vec<Recorded>, ImportError> {
        self.import_checked(frame, &mut |_| Ok::<(), std::convert::Infallible>(()))
    }

    /// As [`Log::import`], with `check` asked about each record (in order,
    /// after the chain checks, before anything is written): a refusal
    /// refuses the whole frame, naming the record's position. The engine
    /// checks the signed checkpoints a peer sends against the records
    /// before them this way.
    ///
    /// # Errors
    /// As [`Log::import`]; [`ImportError::Refused`] with `check`'s reason.
    pub fn import_checked<E: std::fmt::Display>(
        &self,
        frame: &[u8],
        check: &mut dyn FnMut(&Recorded) -> Result<(), E>,
    ) -> Result<Vec<Recorded>, ImportError> {
        let raw = crate::frame::split(frame).map_err(|e| ImportError::Refused {
            position: None,
            reason: e.to_string(),
        })?;
        let mut w = lock(&self.writer);
        if let Some((position, reason)) = &w.needs_repair {
            return Err(ImportError::Log(LogError::NeedsRepair {
                position: *position,
                reason: reason.clone(),
            }));
        }
        let (mut head, mut head_hash, mut head_time) = (w.head, w.head_hash, w.head_time);
        let mut actor_run = w.actor_run;
        let mut versions: std::collections::HashMap<StreamId, u64> = Default::default();
        let mut batch = sled::Batch::default();
        let mut records = Vec::with_capacity(raw.len());
        for bytes in raw {
            let expected = head + 1;
            let refuse = |reason: String| ImportError::Refused {
                position: Some(expected),
                reason,
            };
            let r = decode_record(bytes).map_err(|e| refuse(e.to_string()))?;
            let e = &r.envelope;
            if e.position != expected {
                return Err(refuse(format!("the record claims position {}", e.position)));
            }
            if e.prev_hash != head_hash {
                return Err(refuse(format!(
                    "its previous hash {} is not the head's {}",
                    hex::encode(e.prev_hash),
                    hex::encode(head_hash)
                )));
            }
            if e.timestamp < head_time {
                return Err(refuse("its timestamp is before the head's".into()));
            }
            // The record must be its stream's next version. Stream index
            // keys are dense (1..=version), so two point reads tell it: the
            // version before is there (or is 0) and this one is not. sled's
            // reverse prefix scan (`stream_version`) cost a restore of 1M
            // events most of its time.
            let follows = match versions.get(&e.stream) {
                Some(v) => *v + 1 == e.version,
                None => {
                    let has = |v: u64| -> Result<bool, ImportError> {
                        self.tree
                            .contains_key(index_key(e.stream, v))
                            .map_err(|e| ImportError::Log(e.into()))
                    };
                    e.version >= 1 && (e.version == 1 || has(e.version - 1)?) && !has(e.version)?
                }
            };
            if !follows {
                let current = self.stream_version(e.stream).map_err(ImportError::Log)?;
                return Err(refuse(format!(
                    "stream {} is at version {current}, the record says {}",
                    e.stream, e.version
                )));
            }
            check(&r).map_err(|e| refuse(e.to_string()))?;
            versions.insert(e.stream, e.version);
            batch.insert(&event_key(e.position), bytes);
            batch.insert(&index_key(e.stream, e.version), &e.position.to_be_bytes());
            actor_run = Some(ai::stage_actor(
                &mut batch,
                actor_run,
                &e.actor,
                e.position..=e.position,
            ));
            ai::stage_collection(&mut batch, e.stream, &r.event);
            head = e.position;
            head_hash = e.hash;
            head_time = e.timestamp;
            records.push(r);
        }
        if records.is_empty() {
            return Ok(records);
        }
        self.tree
            .apply_batch(batch)
            .map_err(|e| ImportError::Log(e.into()))?;
        w.head = head;
        w.head_hash = head_hash;
        w.head_time = head_time;
        w.actor_run = actor_run;
        Ok(records)
    }

    /// The stored bytes of the records from `from` to `to` (clamped to the
    /// written head), as frames of at most about `max_bytes` each (a record
    /// larger than that gets a frame of its own): what a peer bootstraps
    /// from and a backup holds.
    pub fn read_frames(
        &self,
        from: u64,
        to: u64,
        max_bytes: usize,
    ) -> impl Iterator<Item = Result<(u64, Vec<u8>), LogError>> + '_ {
        let from = from.max(1);
        let to = to.min(self.head().0);
        let mut iter = self.tree.range(event_key(from)..=event_key(to.max(from)));
        let mut expected = from;
        let mut done = from > to;
        std::iter::from_fn(move || {
            if done {
                return None;
            }
            let mut frame = Vec::new();
            let mut last = expected.saturating_sub(1);
            while frame.len() < max_bytes {
                match iter.next() {
                    None => {
                        done = true;
                        break;
                    }
                    Some(Err(e)) => {
                        done = true;
                        return Some(Err(e.into()));
                    }
                    Some(Ok((k, v))) => {
                        let position = be_u64(&k[1..]).unwrap_or(0);
                        if position != expected {
                            done = true;
                            return Some(Err(LogError::Corrupt {
                                position: expected,
                                reason: "missing (gap in positions)".into(),
                            }));
                        }
                        crate::frame::push(&mut frame, &v);
                        last = position;
                        expected += 1;
                    }
                }
            }
            if frame.is_empty() {
                return None;
            }
            Some(Ok((last, frame)))
        })
    }

    /// Blocks until `position` is durable, flushing if no flush is running
    /// (group commit: one flush covers every append written before it started).
    ///
    /// # Errors
    /// [`LogError::Storage`] when the flush fails; the outcome of the appends
    /// it covered is then unknown.
    pub fn wait_durable(&self, position: u64) -> Result<(), LogError> {
        let mut d = lock(&self.durable);
        loop {
            if let Some(reason) = &d.failed {
                return Err(LogError::Storage(sled::Error::Io(std::io::Error::other(
                    reason.clone(),
                ))));
            }
            if d.position >= position {
                return Ok(());
            }
            if d.flushing {
                d = self
                    .durable_changed
                    .wait(d)
                    .unwrap_or_else(|e| e.into_inner());
                continue;
            }
            d.flushing = true;
            drop(d);
            // Everything written before this point is covered by the flush.
            let target = lock(&self.writer).head;
            let result = self.db.flush();
            d = lock(&self.durable);
            d.flushing = false;
            match result {
                Ok(_) => {
                    d.position = d.position.max(target);
                    self.durable_tx.send_replace(d.position);
                }
                Err(e) => {
                    // A failed flush leaves the on-disk state unknown; refuse
                    // to acknowledge anything further in this process.
                    d.failed = Some(e.to_string());
                }
            }
            self.durable_changed.notify_all();
        }
    }

    /// Reads one record.
    ///
    /// # Errors
    /// [`LogError::Corrupt`] when the position is missing or the record does
    /// not decode; [`LogError::Storage`] on I/O errors.
    pub fn read_one(&self, position: u64) -> Result<Recorded, LogError> {
        let bytes = self
            .tree
            .get(event_key(position))?
            .ok_or_else(|| LogError::Corrupt {
                position,
                reason: "missing".into(),
            })?;
        let r = decode_record(&bytes).map_err(|e| LogError::Corrupt {
            position,
            reason: e.to_string(),
        })?;
        if r.envelope.position != position {
            return Err(LogError::Corrupt {
                position,
                reason: format!("record claims position {}", r.envelope.position),
            });
        }
        Ok(r)
    }

    /// The stored bytes of one record, as written (for audit bundles, which
    /// carry the bytes their hashes cover).
    ///
    /// # Errors
    /// [`LogError::Corrupt`] when the position is missing.
    pub fn read_raw(&self, position: u64) -> Result<Vec<u8>, LogError> {
        Ok(self
            .tree
            .get(event_key(position))?
            .ok_or_else(|| LogError::Corrupt {
                position,
                reason: "missing".into(),
            })?
            .to_vec())
    }

    /// Reads records by position, forwards, from `from` up to and including
    /// `to` (clamped to the written head).
    pub fn read_range(
        &self,
        from: u64,
        to: u64,
    ) -> impl Iterator<Item = Result<Recorded, LogError>> + '_ {
        let from = from.max(1);
        let iter = self.tree.range(event_key(from)..=event_key(to.max(from)));
        let mut expected = from;
        iter.take_while(move |_| from <= to).map(move |item| {
            let (k, v) = item?;
            let position = be_u64(&k[1..]).unwrap_or(0);
            if position != expected {
                return Err(LogError::Corrupt {
                    position: expected,
                    reason: "missing (gap in positions)".into(),
                });
            }
            expected += 1;
            let r = decode_record(&v).map_err(|e| LogError::Corrupt {
                position,
                reason: e.to_string(),
            })?;
            if r.envelope.position != position {
                return Err(LogError::Corrupt {
                    position,
                    reason: format!("record claims position {}", r.envelope.position),
                });
            }
            Ok(r)
        })
    }

    /// Reads every durable record from `from` on.
    pub fn read_from(&self, from: u64) -> impl Iterator<Item = Result<Recorded, LogError>> + '_ {
        self.read_range(from, self.durable_position())
    }

    /// Reads every record of one stream, in version order.
    ///
    /// # Errors
    /// [`LogError::Corrupt`] when an index entry points nowhere valid.
    pub fn read_stream(&self, stream: StreamId) -> Result<Vec<Recorded>, LogError> {
        let mut out = Vec::new();
        for item in self.tree.scan_prefix(index_prefix(stream)) {
            let (_, v) = item?;
            let position = be_u64(&v).ok_or_else(|| LogError::Corrupt {
                position: 0,
                reason: format!("bad index entry for {stream}"),
            })?;
            out.push(self.read_one(position)?);
        }
        Ok(out)
    }

    /// Blocks until the durable position passes `position` or the timeout ends;
    /// returns the durable position.
    pub fn wait_beyond(&self, position: u64, timeout: Duration) -> u64 {
        let deadline = Instant::now() + timeout;
        let mut d = lock(&self.durable);
        while d.position <= position {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            d = self
                .durable_changed
                .wait_timeout(d, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        d.position
    }

    /// Re-checks the whole hash chain and every stream index entry.
    /// `progress` is called with each position checked.
    ///
    /// # Errors
    /// [`LogError::Storage`] on I/O errors; corruption is reported in the
    /// [`VerifyReport`], not as an error.
    pub fn verify(&self, progress: impl FnMut(u64)) -> Result<VerifyReport, LogError> {
        self.verify_with(progress, |_| {})
    }

    /// As [`Log::verify`], handing each record that decodes to `each` in
    /// position order, so further checks (signed checkpoints, snapshots)
    /// share the one pass over the log.
    ///
    /// # Errors
    /// As [`Log::verify`].
    pub fn verify_with(
        &self,
        mut progress: impl FnMut(u64),
        mut each: impl FnMut(&Recorded),
    ) -> Result<VerifyReport, LogError> {
        let mut report = VerifyReport {
            events_checked: 0,
            head_hash: GENESIS_HASH,
            head_position: 0,
            index_entries_checked: 0,
            problems: Vec::new(),
        };
        let mut prev_hash = GENESIS_HASH;
        let mut expected_pos = 1u64;
        let mut streams: std::collections::HashMap<StreamId, u64> =
            std::collections::HashMap::new();
        // One consistent view while writes go on: the log up to the durable
        // position of this moment. Records and index entries appended after
        // it belong to a later log and are not looked at (a command's
        // records and index entries land in one atomic batch).
        let limit = self.durable_position();
        for item in self.tree.scan_prefix([EVENT]) {
            let (k, v) = item?;
            let position = be_u64(&k[1..]).unwrap_or(0);
            if position > limit {
                break;
            }
            progress(position);
            report.events_checked += 1;
            if position != expected_pos {
                report.problems.push(VerifyProblem {
                    position: expected_pos,
                    message: format!("positions jump from {} to {position}", expected_pos - 1),
                });
            }
            expected_pos = position + 1;
            match decode_record(&v) {
                Err(e) => {
                    report.problems.push(VerifyProblem {
                        position,
                        message: e.to_string(),
                    });
                    // Chain from what the next record claims, so one bad record is one problem.
                    prev_hash = GENESIS_HASH;
                    continue;
                }
                Ok(r) => {
                    let env = &r.envelope;
                    if env.position != position {
                        report.problems.push(VerifyProblem {
                            position,
                            message: format!("record claims position {}", env.position),
                        });
                    }
                    if env.prev_hash != prev_hash && !(prev_hash == GENESIS_HASH && position != 1) {
                        report.problems.push(VerifyProblem {
                            position,
                            message: format!(
                                "previous-hash link broken: record says {}, previous record hashes to {}",
                                hex::encode(env.prev_hash),
                                hex::encode(prev_hash)
                            ),
                        });
                    }
                    let v = streams.entry(env.stream).or_insert(0);
                    *v += 1;
                    if env.version != *v {
                        report.problems.push(VerifyProblem {
                            position,
                            message: format!(
                                "stream {} version {} where {} was expected",
                                env.stream, env.version, v
                            ),
                        });
                        *v = env.version;
                    }
                    match self.tree.get(index_key(env.stream, env.version))? {
                        Some(p) if be_u64(&p) == Some(position) => {}
                        Some(p) => report.problems.push(VerifyProblem {
                            position,
                            message: format!(
                                "stream index {}#{} points at position {:?}",
                                env.stream,
                                env.version,
                                be_u64(&p)
                            ),
                        }),
                        None => report.problems.push(VerifyProblem {
                            position,
                            message: format!(
                                "stream index has no entry for {}#{}",
                                env.stream, env.version
                            ),
                        }),
                    }
                    prev_hash = env.hash;
                    report.head_hash = env.hash;
                    report.head_position = position;
                    each(&r);
                }
            }
        }
        let total_versions: u64 = streams.values().sum();
        for item in self.tree.scan_prefix([INDEX]) {
            let (_, v) = item?;
            let pos = be_u64(&v).unwrap_or(0);
            if pos > limit {
                continue;
            }
            report.index_entries_checked += 1;
            if pos == 0 || pos >= expected_pos {
                report.problems.push(VerifyProblem {
                    position: pos,
                    message: "stream index entry points past the end of the log".into(),
                });
            }
        }
        if report.index_entries_checked != total_versions && report.problems.is_empty() {
            report.problems.push(VerifyProblem {
                position: 0,
                message: format!(
                    "stream index has {} entries for {} events",
                    report.index_entries_checked, total_versions
                ),
            });
        }
        report.problems.sort_by_key(|p| p.position);
        Ok(report)
    }

    /// Truncates a torn tail: the records from the first failing position to
    /// the head, when none of them is intact. Returns the positions removed.
    ///
    /// # Errors
    /// [`LogError::Unrepairable`] when the log does not need repair or the
    /// damage is not confined to the tail (an intact record follows it).
    pub fn repair_tail(&self) -> Result<RangeInclusive<u64>, LogError> {
        let mut w = lock(&self.writer);
        let plan = self.plan_for(&w)?;
        let (first_bad, head) = (*plan.start(), *plan.end());
        let mut batch = sled::Batch::default();
        for pos in first_bad..=head {
            batch.remove(&event_key(pos));
        }
        for item in self.tree.scan_prefix([INDEX]) {
            let (k, v) = item?;
            if be_u64(&v).is_some_and(|p| p >= first_bad) {
                batch.remove(k);
            }
        }
        ai::stage_truncation(&self.tree, &mut batch, first_bad)?;
        self.tree.apply_batch(batch)?;
        self.db.flush()?;
        let mut fresh = Writer {
            head: first_bad - 1,
            head_hash: GENESIS_HASH,
            head_time: DateTime::<Utc>::MIN_UTC,
            needs_repair: None,
            actor_run: None,
        };
        self.check_tail(&mut fresh)?;
        if let Some((p, reason)) = &fresh.needs_repair {
            return Err(LogError::Unrepairable(format!(
                "after truncation position {p} still fails: {reason}"
            )));
        }
        *w = fresh;
        let mut d = lock(&self.durable);
        d.position = w.head;
        self.durable_tx.send_replace(d.position);
        Ok(first_bad..=head)
    }

    /// What [`Log::repair_tail`] would do now, without doing it: the
    /// positions it would remove. The preview of `ingest repair` and the
    /// repair run this one check, so they always agree.
    ///
    /// # Errors
    /// As [`Log::repair_tail`]: [`LogError::Unrepairable`] when there is
    /// nothing to repair or the damage is not confined to the tail.
    pub fn repair_plan(&self) -> Result<RangeInclusive<u64>, LogError> {
        let w = lock(&self.writer);
        self.plan_for(&w)
    }

    fn plan_for(&self, w: &Writer) -> Result<RangeInclusive<u64>, LogError> {
        let Some((first_bad, _)) = w.needs_repair.clone() else {
            return Err(LogError::Unrepairable(
                "the log's tail verifies; nothing to repair".into(),
            ));
        };
        let head = w.head;
        for pos in (first_bad + 1)..=head {
            if self.read_one(pos).is_ok() {
                return Err(LogError::Unrepairable(format!(
                    "position {first_bad} is damaged but position {pos} after it is intact: this is not a torn tail, and truncating would lose intact events; run `ingest verify` and restore the data directory from a backup"
                )));
            }
        }
        Ok(first_bad..=head)
    }

    /// Test and tooling access to the raw tree (fault injection, benches).
    #[doc(hidden)]
    pub fn raw_tree(&self) -> &sled::Tree {
        &self.tree
    }

    /// The raw key of a record, for fault injection in tests.
    #[doc(hidden)]
    pub fn raw_event_key(position: u64) -> [u8; 9] {
        event_key(position)
    }
}

fn damaged(dir: &Path, e: &sled::Error) -> LogError {
    LogError::Damaged {
        path: dir.to_path_buf(),
        detail: describe_sled(e),
    }
}

fn chrono_micros(t: DateTime<Utc>) -> DateTime<Utc> {
    // Records store microseconds; report what will be read back.
    DateTime::from_timestamp_micros(t.timestamp_micros()).unwrap_or(t)
}
