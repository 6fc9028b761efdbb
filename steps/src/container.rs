//! Bounded extraction of the containers depositors send: zip, tar and
//! tar.gz.
//!
//! A container is untrusted input. [`extract`] writes only regular files and
//! directories, only under `dest`, only under names that pass
//! [`paths::safe_relative_path`], and stops as soon as a limit of
//! [`ExtractLimits`] is crossed. The limits count the bytes actually
//! produced while decompressing, never the sizes the archive declares: a
//! zip bomb declares small sizes.
//!
//! ```
//! use ingest_steps::container::{extract, ExtractLimits};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dir = tempfile::tempdir()?;
//! let archive = dir.path().join("object.zip");
//! let mut zip = zip::ZipWriter::new(std::fs::File::create(&archive)?);
//! zip.start_file("data/hello.txt", zip::write::SimpleFileOptions::default())?;
//! std::io::Write::write_all(&mut zip, b"hello")?;
//! zip.finish()?;
//!
//! let files = extract(&archive, &dir.path().join("out"), &ExtractLimits::default())?;
//! assert_eq!(files[0].name, "data/hello.txt");
//! assert_eq!(files[0].size, 5);
//! # Ok(())
//! # }
//! ```
//!
//! # Cautions
//! On any error, the files already extracted stay in `dest`: the caller
//! removes `dest` (it should be a fresh, empty directory the caller owns).
//! Nothing is ever written outside `dest`, and existing files are never
//! overwritten. The checks are lexical: a symbolic link already present
//! under `dest` could lead elsewhere, which is why `dest` must be the
//! caller's own; extraction itself never creates links.
//!
//! Files are created with the process's default permissions; the modes,
//! owners and times recorded in the archive are ignored.

use std::cell::Cell;
use std::collections::HashSet;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::rc::Rc;

use flate2::CrcReader;
use thiserror::Error;
use zip::{CompressionMethod, ZipArchive};

use crate::paths::{self, PathError};

/// An entry's compression ratio is checked once it has produced more than
/// this many bytes, so that small, very compressible files pass.
pub const RATIO_GRACE_BYTES: u64 = 1024 * 1024;

/// The most bytes of tar metadata (headers, GNU long names, pax records,
/// skipped data) read between two entries. The tar crate holds long names
/// and pax records in memory, so they must be bounded.
pub const MAX_TAR_METADATA_BYTES: u64 = 1024 * 1024;

/// Limits on what [`extract`] writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExtractLimits {
    /// The most entries (files, directories and refused entries alike;
    /// default 10,000).
    pub max_entries: u64,
    /// The most bytes written in all (default 10 GiB).
    pub max_total_bytes: u64,
    /// The most bytes written for one entry (default 10 GiB).
    pub max_entry_bytes: u64,
    /// The highest ratio of bytes produced to compressed bytes read for an
    /// entry, checked once the entry has produced more than
    /// [`RATIO_GRACE_BYTES`] (default 1000, for 1000:1).
    pub max_ratio: u64,
}

impl Default for ExtractLimits {
    fn default() -> Self {
        ExtractLimits {
            max_entries: 10_000,
            max_total_bytes: 10 * 1024 * 1024 * 1024,
            max_entry_bytes: 10 * 1024 * 1024 * 1024,
            max_ratio: 1000,
        }
    }
}

/// A file written by [`extract`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtractedFile {
    /// The entry's name, normalized ([`paths::normalized_name`]).
    pub name: String,
    /// Where it was written, under `dest`.
    pub path: PathBuf,
    /// The bytes written.
    pub size: u64,
}

/// Why a container could not be extracted.
///
/// [`ContainerError::Io`] is a problem of the system; every other variant is
/// a problem of the container. In every case, remove `dest`.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ContainerError {
    /// Reading the archive or writing under `dest` failed at the system
    /// level (disk full, permissions, a vanished file).
    ///
    /// ### Handling
    /// Not the depositor's fault: retry the step later, or fail it for an
    /// operator to look at.
    #[error("I/O error on {path}: {source}")]
    Io {
        /// The file or directory involved.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// The file is not a zip, tar or tar.gz container.
    ///
    /// ### Handling
    /// Fail the job for the depositor; do not retry.
    #[error("{path} is not a zip, tar or tar.gz container")]
    UnknownFormat {
        /// The archive.
        path: PathBuf,
    },
    /// The archive is damaged or malformed (bad headers, a failed CRC-32
    /// check, a truncated entry).
    ///
    /// ### Handling
    /// Fail the job for the depositor; do not retry (unless the archive
    /// may have been damaged in transfer: then fetch it again).
    #[error("{path} is not a valid container: {message}")]
    Corrupt {
        /// The archive.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// An entry uses a feature this extractor does not support
    /// (encryption, a compression method other than stored and deflate).
    ///
    /// ### Handling
    /// Fail the job for the depositor; do not retry.
    #[error("entry {name:?} uses {feature}, which is not supported")]
    Unsupported {
        /// The entry's name as stored (cut short past 4096 bytes).
        name: String,
        /// The feature.
        feature: String,
    },
    /// An entry's name is refused by [`paths::safe_relative_path`].
    ///
    /// ### Handling
    /// Fail the job for the depositor; do not retry.
    #[error("entry name refused: {reason}")]
    UnsafeName {
        /// The entry's name as stored (cut short past 4096 bytes).
        name: String,
        /// The rule it breaks.
        reason: PathError,
    },
    /// An entry's name is not UTF-8 (tar stores bytes).
    ///
    /// ### Handling
    /// Fail the job for the depositor; do not retry.
    #[error("entry name {name:?} is not UTF-8")]
    NameNotUtf8 {
        /// The name, with invalid bytes replaced.
        name: String,
    },
    /// An entry is a symbolic link, a hard link, a device, a FIFO or another
    /// special entry. Only regular files and directories are extracted;
    /// links are never followed or created.
    ///
    /// ### Handling
    /// Fail the job for the depositor; do not retry.
    #[error("entry {name:?} is a {kind}; only regular files and directories are extracted")]
    SpecialEntry {
        /// The entry's name as stored (cut short past 4096 bytes).
        name: String,
        /// What it is (`symbolic link`, `hard link`, …).
        kind: &'static str,
    },
    /// Two entries have the same name once normalized.
    ///
    /// ### Handling
    /// Fail the job for the depositor; do not retry.
    #[error("entry name {name:?} appears twice")]
    DuplicateName {
        /// The normalized name.
        name: String,
    },
    /// Something already exists where an entry goes: the archive uses a name
    /// both as a file and as a directory (`a` and `a/b`), or two names that
    /// the file system does not tell apart (`A` and `a` on a
    /// case-insensitive one), or `dest` was not empty.
    ///
    /// ### Handling
    /// Fail the job for the depositor; do not retry.
    #[error("entry {name:?} clashes with an existing file or directory at {path}")]
    NameClash {
        /// The normalized name.
        name: String,
        /// The path where it clashes.
        path: PathBuf,
    },
    /// The archive has more than `max_entries` entries.
    ///
    /// ### Handling
    /// Fail the job for the depositor (or raise the limit); do not retry.
    #[error("the container has more than {limit} entries (max_entries)")]
    TooManyEntries {
        /// The limit.
        limit: u64,
    },
    /// Extraction would write more than `max_total_bytes` in all.
    ///
    /// ### Handling
    /// Fail the job for the depositor (or raise the limit); do not retry.
    #[error("the container expands to more than {limit} bytes (max_total_bytes)")]
    TotalBytesExceeded {
        /// The limit.
        limit: u64,
    },
    /// One entry would write more than `max_entry_bytes`.
    ///
    /// ### Handling
    /// Fail the job for the depositor (or raise the limit); do not retry.
    #[error("entry {name:?} expands to more than {limit} bytes (max_entry_bytes)")]
    EntryBytesExceeded {
        /// The normalized name.
        name: String,
        /// The limit.
        limit: u64,
    },
    /// One entry expands more than `max_ratio` times its compressed size: a
    /// likely decompression bomb.
    ///
    /// ### Handling
    /// Fail the job for the depositor (or raise the limit); do not retry.
    #[error("entry {name:?} expands more than {limit}:1 (max_ratio)")]
    RatioExceeded {
        /// The normalized name.
        name: String,
        /// The limit.
        limit: u64,
    },
}

/// Extracts the zip, tar or tar.gz container `archive` into `dest` (created
/// if missing) and returns the files written, in archive order.
/// Directories are created but not listed; an archive with no files gives
/// an empty list, and the caller decides whether that is acceptable.
///
/// The format is found from the first bytes (`PK\x03\x04` or `PK\x05\x06`
/// for zip, `\x1f\x8b` for tar.gz, `ustar` at offset 257 for tar), never
/// from the file name.
///
/// # Errors
/// A [`ContainerError`]: the first problem met. See the module's
/// cautions: on error, what was already extracted stays in `dest`.
pub fn extract(
    archive: &Path,
    dest: &Path,
    limits: &ExtractLimits,
) -> Result<Vec<ExtractedFile>, ContainerError> {
    let format = detect(archive)?;
    fs::create_dir_all(dest).map_err(io_error(dest))?;
    let mut extraction = Extraction::new(archive, dest, limits);
    match format {
        Format::Zip => extract_zip(&mut extraction)?,
        Format::Tar => extract_tar(&mut extraction, false)?,
        Format::TarGz => extract_tar(&mut extraction, true)?,
    }
    Ok(extraction.files)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    Zip,
    Tar,
    TarGz,
}

fn detect(archive: &Path) -> Result<Format, ContainerError> {
    let mut head = Vec::with_capacity(512);
    open(archive)?
        .take(512)
        .read_to_end(&mut head)
        .map_err(io_error(archive))?;
    let ustar = head.get(257..262) == Some(b"ustar".as_slice());
    // An empty tar is only its end-of-archive marker: blocks of zeros.
    let empty_tar = head.len() == 512 && head.iter().all(|&b| b == 0);
    if head.starts_with(b"PK\x03\x04") || head.starts_with(b"PK\x05\x06") {
        Ok(Format::Zip)
    } else if head.starts_with(b"\x1f\x8b") {
        Ok(Format::TarGz)
    } else if ustar || empty_tar {
        Ok(Format::Tar)
    } else {
        Err(ContainerError::UnknownFormat {
            path: archive.to_path_buf(),
        })
    }
}

/// The state of one extraction: counts, names seen and files written.
struct Extraction<'a> {
    archive: &'a Path,
    dest: &'a Path,
    limits: &'a ExtractLimits,
    entries: u64,
    total_bytes: u64,
    names: HashSet<String>,
    files: Vec<ExtractedFile>,
}

impl<'a> Extraction<'a> {
    fn new(archive: &'a Path, dest: &'a Path, limits: &'a ExtractLimits) -> Self {
        Extraction {
            archive,
            dest,
            limits,
            entries: 0,
            total_bytes: 0,
            names: HashSet::new(),
            files: Vec::new(),
        }
    }

    fn count_entry(&mut self) -> Result<(), ContainerError> {
        self.entries += 1;
        if self.entries > self.limits.max_entries {
            return Err(ContainerError::TooManyEntries {
                limit: self.limits.max_entries,
            });
        }
        Ok(())
    }

    /// The normalized name and the path under `dest` of a new entry.
    fn place(&mut self, raw: &str) -> Result<(String, PathBuf), ContainerError> {
        let unsafe_name = |reason| ContainerError::UnsafeName {
            name: shown(raw),
            reason,
        };
        let name = paths::normalized_name(raw).map_err(unsafe_name)?;
        let path = paths::join_under(self.dest, &name).map_err(unsafe_name)?;
        if !self.names.insert(name.clone()) {
            return Err(ContainerError::DuplicateName { name });
        }
        Ok((name, path))
    }

    fn directory(&mut self, raw: &str) -> Result<(), ContainerError> {
        // `tar -cf x.tar .` stores `./`: that is `dest` itself.
        if matches!(
            paths::normalized_name(raw),
            Err(PathError::NoComponents { .. })
        ) {
            return Ok(());
        }
        let (name, path) = self.place(raw)?;
        create_directories(&name, &path)
    }

    /// Writes one file from `reader`; `compressed` counts the compressed
    /// bytes consumed so far, for the ratio.
    fn file(
        &mut self,
        raw: &str,
        reader: &mut dyn Read,
        compressed: &Counter,
    ) -> Result<u64, ContainerError> {
        let (name, path) = self.place(raw)?;
        if let Some(parent) = path.parent() {
            create_directories(&name, parent)?;
        }
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|e| clash_or_io(&name, &path, e))?;
        let mut writer = LimitedWriter {
            inner: file,
            name: &name,
            limits: self.limits,
            written: 0,
            total_before: self.total_bytes,
            compressed: compressed.clone(),
            compressed_start: compressed.get(),
            tripped: None,
            write_failed: false,
        };
        let copied = io::copy(reader, &mut writer);
        self.total_bytes += writer.written;
        if let Err(error) = copied {
            return Err(match (writer.tripped.take(), writer.write_failed) {
                (Some(limit), _) => limit,
                (None, true) => io_error(&path)(error),
                (None, false) => read_error(self.archive, error),
            });
        }
        let size = writer.written;
        self.files.push(ExtractedFile { name, path, size });
        Ok(size)
    }

    fn corrupt(&self, message: String) -> ContainerError {
        ContainerError::Corrupt {
            path: self.archive.to_path_buf(),
            message,
        }
    }
}

fn create_directories(name: &str, path: &Path) -> Result<(), ContainerError> {
    fs::create_dir_all(path).map_err(|e| clash_or_io(name, path, e))
}

/// An error creating `path` is a clash when something is in the way.
fn clash_or_io(name: &str, path: &Path, error: io::Error) -> ContainerError {
    match error.kind() {
        io::ErrorKind::AlreadyExists | io::ErrorKind::NotADirectory => ContainerError::NameClash {
            name: name.to_owned(),
            path: path.to_path_buf(),
        },
        _ => io_error(path)(error),
    }
}

// ---------------------------------------------------------------- zip

fn extract_zip(x: &mut Extraction<'_>) -> Result<(), ContainerError> {
    let file = BufReader::new(open(x.archive)?);
    let mut zip = ZipArchive::new(file).map_err(|e| zip_error(x.archive, e))?;
    check_central_directory(x, zip.central_directory_start(), zip.len())?;
    for index in 0..zip.len() {
        x.count_entry()?;
        let entry = zip
            .by_index_raw(index)
            .map_err(|e| zip_error(x.archive, e))?;
        let name = entry.name().to_owned();
        if let Some(kind) = entry.unix_mode().and_then(special_kind) {
            let name = shown(&name);
            return Err(ContainerError::SpecialEntry { name, kind });
        }
        if entry.is_dir() {
            x.directory(&name)?;
            continue;
        }
        if entry.encrypted() {
            return Err(ContainerError::Unsupported {
                name: shown(&name),
                feature: "encryption".to_owned(),
            });
        }
        let expected_crc = entry.crc32();
        let method = entry.compression();
        let compressed = Counter::default();
        let raw = CountingBufRead::new(BufReader::new(entry), compressed.clone());
        let decoded: Box<dyn Read + '_> = match method {
            CompressionMethod::Stored => Box::new(raw),
            CompressionMethod::Deflated => Box::new(flate2::bufread::DeflateDecoder::new(raw)),
            other => {
                return Err(ContainerError::Unsupported {
                    name: shown(&name),
                    feature: format!("the compression method {other}"),
                })
            }
        };
        let mut checked = CrcReader::new(decoded);
        x.file(&name, &mut checked, &compressed)?;
        if checked.crc().sum() != expected_crc {
            return Err(x.corrupt(format!("entry {name:?} fails its CRC-32 check")));
        }
    }
    Ok(())
}

/// The zip crate keeps one entry per name, silently dropping earlier
/// entries of the same name. Walking the central directory ourselves finds
/// those duplicates, and counts the entries before anything is written.
fn check_central_directory(
    x: &Extraction<'_>,
    start: u64,
    distinct: usize,
) -> Result<(), ContainerError> {
    let mut reader = BufReader::new(open(x.archive)?);
    let io = io_error(x.archive);
    reader.seek(SeekFrom::Start(start)).map_err(&io)?;
    let mut names: HashSet<Vec<u8>> = HashSet::new();
    let mut count: u64 = 0;
    loop {
        let mut header = [0u8; 46];
        match reader.read_exact(&mut header) {
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => break,
            Err(e) => return Err(io(e)),
            Ok(()) if !header.starts_with(b"PK\x01\x02") => break,
            Ok(()) => {}
        }
        count += 1;
        if count > x.limits.max_entries {
            return Err(ContainerError::TooManyEntries {
                limit: x.limits.max_entries,
            });
        }
        let length = |at: usize| usize::from(u16::from_le_bytes([header[at], header[at + 1]]));
        let mut name = vec![0u8; length(28)];
        reader.read_exact(&mut name).map_err(&io)?;
        let skip = i64::try_from(length(30) + length(32)).unwrap_or(i64::MAX);
        reader.seek_relative(skip).map_err(&io)?;
        if names.contains(&name) {
            return Err(ContainerError::DuplicateName {
                name: shown(&String::from_utf8_lossy(&name)),
            });
        }
        names.insert(name);
    }
    if count != distinct as u64 {
        return Err(x.corrupt(format!(
            "the central directory lists {count} entries under {distinct} distinct names"
        )));
    }
    Ok(())
}

/// The file type bits of a Unix mode that are neither a regular file nor a
/// directory, named.
fn special_kind(mode: u32) -> Option<&'static str> {
    match mode & 0o170000 {
        0 | 0o100000 | 0o040000 => None,
        0o120000 => Some("symbolic link"),
        0o020000 => Some("character device"),
        0o060000 => Some("block device"),
        0o010000 => Some("FIFO"),
        0o140000 => Some("socket"),
        _ => Some("special file"),
    }
}

fn zip_error(archive: &Path, error: zip::result::ZipError) -> ContainerError {
    match error {
        zip::result::ZipError::Io(e) => read_error(archive, e),
        other => ContainerError::Corrupt {
            path: archive.to_path_buf(),
            message: other.to_string(),
        },
    }
}

// ---------------------------------------------------------------- tar

fn extract_tar(x: &mut Extraction<'_>, gzip: bool) -> Result<(), ContainerError> {
    let compressed = Counter::default();
    let raw = CountingBufRead::new(BufReader::new(open(x.archive)?), compressed.clone());
    let stream: Box<dyn Read> = if gzip {
        Box::new(flate2::bufread::MultiGzDecoder::new(raw))
    } else {
        Box::new(raw)
    };
    let budget = Budget::default();
    let mut tar = tar::Archive::new(Budgeted {
        inner: stream,
        budget: budget.clone(),
    });
    budget.limit(MAX_TAR_METADATA_BYTES);
    let entries = tar.entries().map_err(|e| read_error(x.archive, e))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| read_error(x.archive, e))?;
        budget.lift();
        tar_entry(x, &mut entry, &compressed)?;
        budget.limit(MAX_TAR_METADATA_BYTES);
    }
    Ok(())
}

fn tar_entry<R: Read>(
    x: &mut Extraction<'_>,
    entry: &mut tar::Entry<'_, R>,
    compressed: &Counter,
) -> Result<(), ContainerError> {
    use tar::EntryType;
    let kind = entry.header().entry_type();
    if kind.is_pax_global_extensions() {
        // Archive-wide metadata, not a member.
        return Ok(());
    }
    x.count_entry()?;
    let raw = entry.path_bytes().into_owned();
    let name = String::from_utf8(raw).map_err(|e| ContainerError::NameNotUtf8 {
        name: shown(&String::from_utf8_lossy(e.as_bytes())),
    })?;
    match kind {
        // Old tars mark directories with a trailing slash only.
        EntryType::Directory => x.directory(&name),
        EntryType::Regular if name.ends_with('/') => x.directory(&name),
        EntryType::Regular | EntryType::Continuous => {
            let declared = entry.size();
            let written = x.file(&name, entry, compressed)?;
            if written != declared {
                return Err(x.corrupt(format!(
                    "entry {name:?} is truncated: {written} of {declared} bytes"
                )));
            }
            Ok(())
        }
        other => Err(ContainerError::SpecialEntry {
            name: shown(&name),
            kind: tar_kind(other),
        }),
    }
}

fn tar_kind(kind: tar::EntryType) -> &'static str {
    use tar::EntryType;
    match kind {
        EntryType::Symlink => "symbolic link",
        EntryType::Link => "hard link",
        EntryType::Char => "character device",
        EntryType::Block => "block device",
        EntryType::Fifo => "FIFO",
        EntryType::GNUSparse => "sparse file",
        _ => "special entry",
    }
}

// ---------------------------------------------------------------- plumbing

/// An entry name as stored, to report in an error: cut short when longer
/// than any acceptable name, so that an error never carries megabytes.
fn shown(raw: &str) -> String {
    if raw.len() <= paths::MAX_PATH_BYTES {
        return raw.to_owned();
    }
    let mut cut: String = raw.chars().take(100).collect();
    cut.push('…');
    cut
}

fn open(path: &Path) -> Result<File, ContainerError> {
    File::open(path).map_err(io_error(path))
}

fn io_error(path: &Path) -> impl Fn(io::Error) -> ContainerError + '_ {
    move |source| ContainerError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// An error while reading the archive: the decoders and the tar crate
/// report malformed input with these kinds; anything else is the system's.
fn read_error(archive: &Path, error: io::Error) -> ContainerError {
    match error.kind() {
        io::ErrorKind::InvalidData
        | io::ErrorKind::InvalidInput
        | io::ErrorKind::UnexpectedEof
        | io::ErrorKind::Other => ContainerError::Corrupt {
            path: archive.to_path_buf(),
            message: error.to_string(),
        },
        _ => io_error(archive)(error),
    }
}

/// A shared count of bytes (single-threaded: extraction is synchronous).
type Counter = Rc<Cell<u64>>;

/// A `BufRead` that counts the bytes its consumer actually uses (consumes),
/// not those it buffers ahead: the exact compressed size behind what a
/// decoder has produced.
struct CountingBufRead<R> {
    inner: R,
    consumed: Counter,
}

impl<R: BufRead> CountingBufRead<R> {
    fn new(inner: R, consumed: Counter) -> Self {
        CountingBufRead { inner, consumed }
    }
}

impl<R: BufRead> Read for CountingBufRead<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let available = self.fill_buf()?;
        let n = available.len().min(buf.len());
        buf[..n].copy_from_slice(&available[..n]);
        self.consume(n);
        Ok(n)
    }
}

impl<R: BufRead> BufRead for CountingBufRead<R> {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        self.inner.fill_buf()
    }

    fn consume(&mut self, amount: usize) {
        self.consumed
            .set(self.consumed.get().saturating_add(amount as u64));
        self.inner.consume(amount);
    }
}

/// How many bytes the tar crate may still read on its own (headers, long
/// names, pax records); `None` while an entry's data is being copied, which
/// [`LimitedWriter`] bounds instead.
#[derive(Clone, Default)]
struct Budget(Rc<Cell<Option<u64>>>);

impl Budget {
    fn limit(&self, bytes: u64) {
        self.0.set(Some(bytes));
    }

    fn lift(&self) {
        self.0.set(None);
    }
}

struct Budgeted<R> {
    inner: R,
    budget: Budget,
}

impl<R: Read> Read for Budgeted<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let Some(left) = self.budget.0.get() else {
            return self.inner.read(buf);
        };
        if left == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("more than {MAX_TAR_METADATA_BYTES} bytes of tar headers and metadata before an entry"),
            ));
        }
        let room = usize::try_from(left).unwrap_or(usize::MAX).min(buf.len());
        let n = self.inner.read(&mut buf[..room])?;
        self.budget.limit(left.saturating_sub(n as u64));
        Ok(n)
    }
}

/// The file writer that enforces the byte and ratio limits on what is
/// actually written. A write that would cross a limit is refused whole, so
/// no more than the limit reaches the disk.
struct LimitedWriter<'n, 'l> {
    inner: File,
    name: &'n str,
    limits: &'l ExtractLimits,
    written: u64,
    total_before: u64,
    compressed: Counter,
    compressed_start: u64,
    /// The limit crossed, if one was.
    tripped: Option<ContainerError>,
    /// Whether the file itself failed to take a write.
    write_failed: bool,
}

impl LimitedWriter<'_, '_> {
    fn check(&self, after: u64) -> Option<ContainerError> {
        let limits = self.limits;
        let compressed = self
            .compressed
            .get()
            .saturating_sub(self.compressed_start)
            .max(1);
        if after > limits.max_entry_bytes {
            Some(ContainerError::EntryBytesExceeded {
                name: self.name.to_owned(),
                limit: limits.max_entry_bytes,
            })
        } else if self.total_before.saturating_add(after) > limits.max_total_bytes {
            Some(ContainerError::TotalBytesExceeded {
                limit: limits.max_total_bytes,
            })
        } else if after > RATIO_GRACE_BYTES && after > limits.max_ratio.saturating_mul(compressed) {
            Some(ContainerError::RatioExceeded {
                name: self.name.to_owned(),
                limit: limits.max_ratio,
            })
        } else {
            None
        }
    }
}

impl Write for LimitedWriter<'_, '_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let after = self.written.saturating_add(buf.len() as u64);
        if let Some(limit) = self.check(after) {
            let message = limit.to_string();
            self.tripped = Some(limit);
            return Err(io::Error::other(message));
        }
        let n = self
            .inner
            .write(buf)
            .inspect_err(|_| self.write_failed = true)?;
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush().inspect_err(|_| self.write_failed = true)
    }
}
