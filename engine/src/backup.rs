//! Backups of a running log and restores from them (`ingest backup`,
//! `ingest restore`).
//!
//! A backup is the log's records from position 1 to a position `P`, exactly
//! as stored, taken from a running engine (leader or follower) through
//! `GET /replication/frames` or from a data directory no server holds. The
//! log is append-only, so reading positions up to `P` while the engine goes
//! on appending gives a consistent copy without stopping anything.
//!
//! ```text
//! INGEST-BACKUP-1\n        16 bytes
//! frames                   each record: 4-byte big-endian length, the record
//! trailer                  JSON: position, head hash, Merkle root, records, created, source
//! trailer length           8 bytes big-endian
//! INGSTEND                 8 bytes
//! ```
//!
//! Writing checks the chain from the first record on and computes the
//! Merkle root (RFC 9162, as the signed checkpoints do); the trailer records
//! both. A restore imports the records through [`Log::import`] (every record
//! checked against the chain it builds), compares the head and the root
//! with the trailer, and runs [`Log::verify`] over the result (which also
//! checks every signed checkpoint the backup holds). A backup with one byte
//! changed, a record left out or a trailer edited is refused, and nothing is
//! left in the data directory.

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use ingest_events::codec::{decode_record, GENESIS_HASH, MAX_RECORD_BYTES};
use ingest_events::log::{Log, LogConfig};
use ingest_events::merkle::Frontier;
use serde::{Deserialize, Serialize};

const MAGIC: &[u8; 16] = b"INGEST-BACKUP-1\n";
const END: &[u8; 8] = b"INGSTEND";
/// The largest trailer read.
const MAX_TRAILER: u64 = 64 * 1024;
/// How many bytes of records one import takes.
const IMPORT_BYTES: usize = 256 * 1024;

/// How many bytes of records a restore imports before it closes and opens
/// the log again, to bound its memory.
const REOPEN_BYTES: usize = 16 * 1024 * 1024;

/// What a backup says about itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Trailer {
    /// The last position it holds.
    pub position: u64,
    /// The hash of that record (hex).
    pub head_hash: String,
    /// The Merkle root over every record it holds (hex).
    pub merkle_root: String,
    /// Bytes of records (length prefixes included).
    pub bytes: u64,
    /// When it was written.
    pub created: DateTime<Utc>,
    /// Where it was taken from (a URL or a data directory).
    pub source: String,
}

/// Why a backup or a restore failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BackupError {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The records are not a log from position 1 on (a record does not
    /// decode, does not follow the one before, or the end does not match).
    #[error("the backup is refused: {0}")]
    Invalid(String),
    /// The log being restored into failed or refused a record.
    #[error("the restored log: {0}")]
    Log(String),
    /// The target is not an empty data directory.
    #[error("{0} already holds a log: restore into a new, empty data directory")]
    NotEmpty(PathBuf),
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> BackupError + '_ {
    move |source| BackupError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Writes a backup to `out` from `records`, a stream of frames from
/// position 1 that should end at `expected` (`(position, head hash)` as the
/// source announced it); returns its trailer. The file appears only once it
/// is whole (written beside and renamed).
///
/// # Errors
/// [`BackupError`]; nothing is left at `out`.
pub fn write(
    out: &Path,
    mut records: impl Read,
    expected: Option<(u64, String)>,
    source: &str,
) -> Result<Trailer, BackupError> {
    let tmp = out.with_extension("partial");
    let result = (|| {
        let mut file = std::io::BufWriter::new(std::fs::File::create(&tmp).map_err(io(&tmp))?);
        file.write_all(MAGIC).map_err(io(&tmp))?;
        let mut chain = Chain::default();
        let mut prefix = [0u8; 4];
        loop {
            if !read_exact_or_end(&mut records, &mut prefix).map_err(io(out))? {
                break;
            }
            let len = u32::from_be_bytes(prefix) as usize;
            if len > MAX_RECORD_BYTES {
                return Err(BackupError::Invalid(format!("a record of {len} bytes")));
            }
            let mut record = vec![0u8; len];
            records
                .read_exact(&mut record)
                .map_err(|_| BackupError::Invalid("the source ended inside a record".into()))?;
            chain.take(&record)?;
            file.write_all(&prefix).map_err(io(&tmp))?;
            file.write_all(&record).map_err(io(&tmp))?;
        }
        let trailer = chain.trailer(source);
        if let Some((position, hash)) = expected {
            if trailer.position != position || trailer.head_hash != hash {
                return Err(BackupError::Invalid(format!(
                    "the source announced position {position} ({hash}) and sent up to {} ({})",
                    trailer.position, trailer.head_hash
                )));
            }
        }
        let json = serde_json::to_vec(&trailer).map_err(|e| BackupError::Invalid(e.to_string()))?;
        file.write_all(&json).map_err(io(&tmp))?;
        file.write_all(&(json.len() as u64).to_be_bytes())
            .map_err(io(&tmp))?;
        file.write_all(END).map_err(io(&tmp))?;
        let file = file.into_inner().map_err(|e| io(&tmp)(e.into_error()))?;
        file.sync_all().map_err(io(&tmp))?;
        std::fs::rename(&tmp, out).map_err(io(out))?;
        Ok(trailer)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Where a restore stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Until {
    /// Every record of the backup.
    End,
    /// The last whole command at or before this position.
    Position(u64),
    /// The last whole command at or before this time.
    Time(DateTime<Utc>),
}

/// What a restore did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Restored {
    /// The last position restored.
    pub position: u64,
    /// Its hash (hex).
    pub head_hash: String,
    /// The backup's trailer.
    pub backup: Trailer,
    /// Records checked by the final verification.
    pub verified: u64,
}

/// Reads a backup's trailer (and checks the file's frame).
///
/// # Errors
/// [`BackupError`] when the file is not a whole backup.
pub fn trailer(path: &Path) -> Result<(Trailer, u64), BackupError> {
    let mut f = std::fs::File::open(path).map_err(io(path))?;
    let len = f.metadata().map_err(io(path))?.len();
    let invalid = |why: &str| BackupError::Invalid(format!("{}: {why}", path.display()));
    let mut magic = [0u8; 16];
    f.read_exact(&mut magic).map_err(|_| invalid("too short"))?;
    if &magic != MAGIC {
        return Err(invalid("not an ingest backup (no INGEST-BACKUP-1 header)"));
    }
    if len < 32 {
        return Err(invalid("too short"));
    }
    f.seek(SeekFrom::End(-16)).map_err(io(path))?;
    let mut tail = [0u8; 16];
    f.read_exact(&mut tail).map_err(io(path))?;
    if &tail[8..] != END {
        return Err(invalid("cut short (no end marker)"));
    }
    let tlen = u64::from_be_bytes(tail[..8].try_into().unwrap_or_default());
    if tlen > MAX_TRAILER || tlen + 32 > len {
        return Err(invalid("the trailer's length is out of bounds"));
    }
    f.seek(SeekFrom::Start(len - 16 - tlen)).map_err(io(path))?;
    let mut json = vec![0u8; tlen as usize];
    f.read_exact(&mut json).map_err(io(path))?;
    let t: Trailer =
        serde_json::from_slice(&json).map_err(|_| invalid("the trailer is not JSON"))?;
    Ok((t, len - 16 - tlen - 16))
}

/// Restores `backup` into a new log in `data_dir`, up to `until`, and
/// verifies it.
///
/// # Errors
/// [`BackupError`]; on any error the log written so far is removed.
pub fn restore(backup: &Path, data_dir: &Path, until: Until) -> Result<Restored, BackupError> {
    let log_dir = crate::engine::log_dir(data_dir);
    if log_dir.exists() {
        return Err(BackupError::NotEmpty(data_dir.to_path_buf()));
    }
    let result = restore_into(backup, &log_dir, until);
    if result.is_err() {
        let _ = std::fs::remove_dir_all(&log_dir);
    }
    result
}

fn restore_into(backup: &Path, log_dir: &Path, until: Until) -> Result<Restored, BackupError> {
    let (trailer, body) = trailer(backup)?;
    if trailer.bytes != body {
        return Err(BackupError::Invalid(format!(
            "the trailer says {} bytes of records, the file holds {body}",
            trailer.bytes
        )));
    }
    let mut file = std::io::BufReader::new(std::fs::File::open(backup).map_err(io(backup))?);
    file.seek(SeekFrom::Start(16)).map_err(io(backup))?;
    let mut records = file.take(body);
    let open =
        || Log::open(log_dir, &LogConfig::default()).map_err(|e| BackupError::Log(e.to_string()));
    let mut log = open()?;
    let mut since_open = 0usize;
    let mut chain = Chain::default();
    let mut pending: Vec<u8> = Vec::new();
    let mut prefix = [0u8; 4];
    let mut stop = false;
    // The records of the command being read (a command's records share
    // actor, correlation id and timestamp): imported once the next command
    // starts, so a restore never ends inside a command.
    let mut held: Vec<(Vec<u8>, u64, String)> = Vec::new();
    while !stop {
        if !read_exact_or_end(&mut records, &mut prefix).map_err(io(backup))? {
            break;
        }
        let len = u32::from_be_bytes(prefix) as usize;
        if len > MAX_RECORD_BYTES {
            return Err(BackupError::Invalid(format!("a record of {len} bytes")));
        }
        let mut record = vec![0u8; len];
        records
            .read_exact(&mut record)
            .map_err(|_| BackupError::Invalid("the backup ends inside a record".into()))?;
        let r = decode_record(&record).map_err(|e| BackupError::Invalid(e.to_string()))?;
        let e = &r.envelope;
        let past = match until {
            Until::End => false,
            Until::Position(p) => e.position > p,
            Until::Time(t) => e.timestamp > t,
        };
        let mark = format!(
            "{}|{}|{}",
            e.actor,
            e.correlation_id,
            e.timestamp.timestamp_micros()
        );
        if past {
            // The records held back belong to a command that continues
            // past the stop: leave them out too.
            if held.first().is_some_and(|h| h.2 == mark) {
                held.clear();
            }
            stop = true;
            continue;
        }
        // A new command starts: what was held is whole.
        if held.first().is_some_and(|h| h.2 != mark) {
            for (bytes, _, _) in held.drain(..) {
                ingest_events::frame::push(&mut pending, &bytes);
            }
        }
        chain.take(&record)?;
        held.push((record, e.position, mark));
        if pending.len() >= IMPORT_BYTES {
            log.import(&pending)
                .map_err(|e| BackupError::Log(e.to_string()))?;
            since_open += pending.len();
            pending.clear();
            if since_open >= REOPEN_BYTES {
                // sled keeps what a long run of writes touched in memory
                // far past its cache capacity (a restore of 1M events
                // peaked at 8.6 GB); closing and opening the log again
                // lets it go.
                let (head, _) = log.head();
                log.wait_durable(head)
                    .map_err(|e| BackupError::Log(e.to_string()))?;
                drop(log);
                log = open()?;
                since_open = 0;
            }
        }
    }
    if !stop {
        // The end of the backup ends a command.
        for (bytes, _, _) in held.drain(..) {
            ingest_events::frame::push(&mut pending, &bytes);
        }
        let whole = chain.trailer(&trailer.source);
        if whole.position != trailer.position
            || whole.head_hash != trailer.head_hash
            || whole.merkle_root != trailer.merkle_root
        {
            return Err(BackupError::Invalid(format!(
                "the records end at position {} ({}, root {}), the trailer says {} ({}, root {})",
                whole.position,
                whole.head_hash,
                whole.merkle_root,
                trailer.position,
                trailer.head_hash,
                trailer.merkle_root
            )));
        }
    }
    if !pending.is_empty() {
        log.import(&pending)
            .map_err(|e| BackupError::Log(e.to_string()))?;
    }
    let (head, hash) = log.head();
    log.wait_durable(head)
        .map_err(|e| BackupError::Log(e.to_string()))?;
    // The verify reads the log as a later start-up will: opened afresh,
    // without what the import left in memory.
    drop(log);
    let log = open()?;
    let report = log
        .verify(|_| {})
        .map_err(|e| BackupError::Log(e.to_string()))?;
    if let Some(p) = report.problems.first() {
        return Err(BackupError::Invalid(format!(
            "the restored log does not verify: {p:?}"
        )));
    }
    Ok(Restored {
        position: head,
        head_hash: hex::encode(hash),
        backup: trailer,
        verified: report.events_checked,
    })
}

/// Reads exactly `buf`, or nothing at the end of the stream.
fn read_exact_or_end(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<bool> {
    let mut read = 0;
    while read < buf.len() {
        match r.read(&mut buf[read..]) {
            Ok(0) if read == 0 => return Ok(false),
            Ok(0) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "the stream ends inside a length",
                ))
            }
            Ok(n) => read += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// The chain of the records seen so far, from position 1.
struct Chain {
    position: u64,
    hash: [u8; 32],
    frontier: Frontier,
    bytes: u64,
}

impl Default for Chain {
    fn default() -> Self {
        Chain {
            position: 0,
            hash: GENESIS_HASH,
            frontier: Frontier::new(),
            bytes: 0,
        }
    }
}

impl Chain {
    fn take(&mut self, record: &[u8]) -> Result<(), BackupError> {
        let r = decode_record(record)
            .map_err(|e| BackupError::Invalid(format!("record {}: {e}", self.position + 1)))?;
        let e = &r.envelope;
        if e.position != self.position + 1 || e.prev_hash != self.hash {
            return Err(BackupError::Invalid(format!(
                "record {} does not follow record {} (a record is missing, out of order or from another log)",
                e.position, self.position
            )));
        }
        self.position = e.position;
        self.hash = e.hash;
        self.frontier.push(&e.hash);
        self.bytes += 4 + record.len() as u64;
        Ok(())
    }

    fn trailer(&self, source: &str) -> Trailer {
        Trailer {
            position: self.position,
            head_hash: hex::encode(self.hash),
            merkle_root: hex::encode(self.frontier.root()),
            bytes: self.bytes,
            created: Utc::now(),
            source: source.chars().take(500).collect(),
        }
    }
}
