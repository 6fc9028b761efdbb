//! Assembly of a stored object version into a container for download (the
//! access queue's work, issue 24): the version is read through its OCFL
//! inventory ([`OcflTarget::version_content`], so files deduplicated into
//! earlier versions are found), every file is streamed into a zip, tar or
//! tar.gz container while its bytes are hashed, and the digest is checked
//! against the inventory's as the file ends: the SHA-256 of its fixity
//! block when it gives the file one (every object `ingest` stores), else
//! the manifest's digest (see `Check`). A checksum manifest
//! (`manifest-<algorithm>.txt`, BagIt's line form, the manifest's digests)
//! closes the container.
//!
//! Nothing holds a whole file in memory: each is copied through a fixed
//! buffer. The container's own size and SHA-256 are computed as it is
//! written ([`ContainerDigest`]; a zip, whose writer seeks back, is read
//! once more). A mismatch fails the assembly naming the file and the
//! target; [`assemble_from_any`] then tries the next target, writing the
//! container anew. An observer is told how far it got as it goes
//! ([`Progress`]).

use std::fs::File;
use std::io::{self, Read, Seek, Write};
use std::path::{Path, PathBuf};

use crate::digest::{Algorithm, MultiHasher};
use crate::ocfl::{ContentFile, OcflTarget, StorageError};

mod flush;
mod meter;
mod pipe;
mod sink;
use flush::Flushing;
use meter::Meter;
pub use meter::{Observer, Progress, TELL_EVERY};
use pipe::Ahead;
pub use sink::ContainerDigest;
use sink::Sink;

/// The container formats (the request's `format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Container {
    /// A zip file (deflated).
    Zip,
    /// A tar file.
    Tar,
    /// A gzip-compressed tar file (`targz`).
    TarGz,
}

impl Container {
    /// The request's format name: `zip`, `tar` or `targz`.
    pub fn parse(format: &str) -> Option<Container> {
        match format {
            "zip" => Some(Container::Zip),
            "tar" => Some(Container::Tar),
            "targz" => Some(Container::TarGz),
            _ => None,
        }
    }

    /// The file name extension.
    pub fn extension(self) -> &'static str {
        match self {
            Container::Zip => "zip",
            Container::Tar => "tar",
            Container::TarGz => "tar.gz",
        }
    }
}

/// Which files of the version go into the container (mrt-store's two
/// forms).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Content {
    /// The depositor's files (`producer/…`) only.
    Producer,
    /// Every file of the version, `system/…` included.
    Full,
    /// Every version (1 to the one asked for), each with every file, under
    /// its own `<ark>/v<N>/` with its own manifest.
    Object,
}

/// What an assembly wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assembled {
    /// The target read.
    pub target: String,
    /// The version assembled.
    pub version: u32,
    /// The object files put in (the manifest not counted).
    pub files: usize,
    /// Their bytes.
    pub bytes: u64,
}

/// Why an assembly failed.
#[derive(Debug, thiserror::Error)]
pub enum AssembleError {
    /// The target could not give the version.
    #[error("storage target {target}: {source}")]
    Storage {
        /// The target.
        target: String,
        /// Why.
        source: StorageError,
    },
    /// A file's bytes do not have the inventory's digest.
    #[error("storage target {target}: {path} does not have its inventory digest ({algorithm} {expected}, read {actual})")]
    Mismatch {
        /// The target.
        target: String,
        /// The file's logical path (cut).
        path: String,
        /// The algorithm.
        algorithm: String,
        /// The inventory's digest.
        expected: String,
        /// The digest of the bytes read.
        actual: String,
    },
    /// The inventory names a digest algorithm the assembler does not know.
    #[error("storage target {target}: unknown digest algorithm {algorithm:?}")]
    Algorithm {
        /// The target.
        target: String,
        /// The name (cut).
        algorithm: String,
    },
    /// Reading a stored file or writing the container failed.
    #[error("{what} {path}: {source}", path = path.display())]
    Io {
        /// What was being done.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The bag writer refused the version (a damaged file, a missing
    /// version, I/O).
    #[error("storage target {target}: {source}")]
    Bag {
        /// The target.
        target: String,
        /// Why.
        source: Box<crate::bagit::BagError>,
    },
    /// No target was given.
    #[error("no storage target holds the object")]
    NoTarget,
}

/// The logical paths a container holds under one top directory, named
/// after the ark (`ark+99999+fk4x/v2/producer/a.txt`).
fn entry_name(ark: &str, version: u32, logical: &str) -> String {
    let safe: String = ark
        .chars()
        .map(|c| if c == '/' || c == ':' { '+' } else { c })
        .collect();
    format!("{safe}/v{version}/{logical}")
}

/// A reader that hashes (unless its bytes were hashed already) and counts
/// what passes through it, and tells the assembly's meter.
struct Hashing<'m, 'o, R: Read> {
    inner: R,
    hasher: Option<MultiHasher>,
    n: u64,
    meter: &'m mut Meter<'o>,
}

impl<R: Read> Read for Hashing<'_, '_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        if let Some(hasher) = self.hasher.as_mut() {
            hasher.update(buf.get(..n).unwrap_or(buf));
        }
        self.n += n as u64;
        self.meter.read(n as u64);
        Ok(n)
    }
}

/// A stored file's bytes as the container takes them: read and hashed
/// here, or ahead on a thread of its own (a large file).
enum Source {
    Here(File),
    Ahead(Ahead),
}

impl Read for Source {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Source::Here(f) => f.read(buf),
            Source::Ahead(a) => a.read(buf),
        }
    }
}

/// A container being written.
enum Writer<W: Write + Seek> {
    Zip(Box<zip::ZipWriter<W>>),
    Tar(Box<tar::Builder<W>>),
    TarGz(Box<tar::Builder<flate2::write::GzEncoder<W>>>),
}

fn zip_io(e: zip::result::ZipError) -> io::Error {
    io::Error::other(e.to_string())
}

fn tar_header(size: u64) -> tar::Header {
    let mut header = tar::Header::new_gnu();
    header.set_size(size);
    header.set_mode(0o644);
    header.set_entry_type(tar::EntryType::Regular);
    header.set_mtime(0);
    header
}

impl<W: Write + Seek> Writer<W> {
    fn new(container: Container, out: W) -> Writer<W> {
        match container {
            Container::Zip => Writer::Zip(Box::new(zip::ZipWriter::new(out))),
            Container::Tar => Writer::Tar(Box::new(tar::Builder::new(out))),
            Container::TarGz => Writer::TarGz(Box::new(tar::Builder::new(
                flate2::write::GzEncoder::new(out, flate2::Compression::default()),
            ))),
        }
    }

    /// Adds one entry of `size` bytes read from `data` (streamed; a tar
    /// entry whose reader gives fewer bytes fails).
    fn entry(&mut self, name: &str, size: u64, data: &mut dyn Read) -> io::Result<()> {
        match self {
            Writer::Zip(z) => {
                let options = zip::write::SimpleFileOptions::default()
                    .compression_method(zip::CompressionMethod::Deflated)
                    .large_file(size >= u64::from(u32::MAX));
                z.start_file(name, options).map_err(zip_io)?;
                io::copy(data, z.as_mut()).map(|_| ())
            }
            Writer::Tar(t) => t.append_data(&mut tar_header(size), name, data),
            Writer::TarGz(t) => t.append_data(&mut tar_header(size), name, data),
        }
    }

    fn finish(self) -> io::Result<W> {
        match self {
            Writer::Zip(z) => z.finish().map_err(zip_io),
            Writer::Tar(t) => t.into_inner(),
            Writer::TarGz(t) => t.into_inner()?.finish(),
        }
    }
}

/// Assembles `version` (the head when `None`) of `ark` from `target` into
/// `out` as `container`, checking every file's digest as it streams.
///
/// # Errors
/// [`AssembleError`]: the version cannot be read, a file's digest differs
/// (naming it and the target), or the container cannot be written. `out`
/// then holds a partial container the caller discards.
pub fn assemble<W: Write + Seek>(
    target: &OcflTarget,
    ark: &str,
    version: Option<u32>,
    content: Content,
    container: Container,
    out: W,
) -> Result<(Assembled, W), AssembleError> {
    let request = Request {
        ark,
        version,
        content,
        container,
        bag: false,
    };
    assemble_metered(target, &request, out, &mut Meter::silent())
}

/// [`assemble`], telling `meter` as it reads.
fn assemble_metered<W: Write + Seek>(
    target: &OcflTarget,
    &Request {
        ark,
        version,
        content,
        container,
        ..
    }: &Request<'_>,
    out: W,
    meter: &mut Meter<'_>,
) -> Result<(Assembled, W), AssembleError> {
    let name = target.name().to_string();
    let storage = |source| AssembleError::Storage {
        target: name.clone(),
        source,
    };
    let head = target.version_content(ark, version).map_err(storage)?;
    let mut writer = Writer::new(container, out);
    let (mut files, mut bytes) = (0usize, 0u64);
    if content == Content::Object {
        // Every version, oldest first, each read through its own state
        // (so a file deduplicated into an earlier version is found).
        for n in 1..head.version {
            let v = target.version_content(ark, Some(n)).map_err(storage)?;
            let (f, b) = pack_version(&mut writer, (&name, ark), &v, true, meter)?;
            files += f;
            bytes += b;
        }
    }
    let all = content != Content::Producer;
    let (f, b) = pack_version(&mut writer, (&name, ark), &head, all, meter)?;
    files += f;
    bytes += b;
    let out = writer.finish().map_err(|source| AssembleError::Io {
        what: "cannot finish",
        path: PathBuf::from(entry_name(ark, head.version, "")),
        source,
    })?;
    Ok((
        Assembled {
            target: name,
            version: head.version,
            files,
            bytes,
        },
        out,
    ))
}

/// Packs the files of version `v` (producer files only unless `all`) under
/// `<ark>/v<N>/`, each checked against its digest as it streams, then the
/// version's `manifest-<alg>.txt`; the files and bytes packed.
fn pack_version<W: Write + Seek>(
    writer: &mut Writer<W>,
    (name, ark): (&str, &str),
    v: &crate::ocfl::VersionContent,
    all: bool,
    meter: &mut Meter<'_>,
) -> Result<(usize, u64), AssembleError> {
    let files: Vec<&ContentFile> = v
        .files
        .iter()
        .filter(|f| all || f.logical_path.starts_with("producer/"))
        .collect();
    let io_err = |what: &'static str, path: &Path| {
        let path = path.to_path_buf();
        move |source| AssembleError::Io { what, path, source }
    };
    let mut manifest = String::new();
    let mut bytes = 0u64;
    let mut algorithm_name = String::new();
    // Each file's manifest algorithm, the digest its bytes are checked
    // against and its size, known before any is read, so that the next
    // large file can be read ahead while one is written.
    let mut known: Vec<(Algorithm, Check<'_>, u64)> = Vec::with_capacity(files.len());
    for f in &files {
        let algorithm: Algorithm =
            f.digest_algorithm
                .parse()
                .map_err(|_| AssembleError::Algorithm {
                    target: name.to_string(),
                    algorithm: ingest_protocol::cut(&f.digest_algorithm, 32).into_owned(),
                })?;
        let size = std::fs::metadata(&f.path)
            .map_err(io_err("cannot read", &f.path))?
            .len();
        known.push((algorithm, Check::of(f, algorithm), size));
    }
    let large = |i: usize| known.get(i).is_some_and(|k| k.2 >= pipe::AHEAD_FROM);
    let start_ahead = |i: usize| -> Result<Ahead, AssembleError> {
        let f = files[i];
        let (_, check, size) = known[i];
        Ahead::start(f.path.clone(), size, check.algorithm).map_err(io_err("cannot read", &f.path))
    };
    // The large file being read ahead, by index.
    let mut ahead: Option<(usize, Ahead)> = None;
    for (i, f) in files.iter().enumerate() {
        let (algorithm, check, size) = known[i];
        algorithm_name = algorithm.name().to_string();
        let entry = entry_name(ark, v.version, &f.logical_path);
        let (source, hasher) = if large(i) {
            let this = match ahead.take() {
                Some((j, a)) if j == i => a,
                _ => start_ahead(i)?,
            };
            // The next large file is read while this one is written.
            if let Some(next) = (i + 1..files.len()).find(|&j| large(j)) {
                ahead = Some((next, start_ahead(next)?));
            }
            (Source::Ahead(this), None)
        } else {
            let file = File::open(&f.path).map_err(io_err("cannot read", &f.path))?;
            (
                Source::Here(file),
                Some(MultiHasher::new(&[check.algorithm])),
            )
        };
        // At most the size the entry's header announced is read.
        let mut reader = Hashing {
            inner: source.take(size),
            hasher,
            n: 0,
            meter: &mut *meter,
        };
        writer
            .entry(&entry, size, &mut reader)
            .map_err(io_err("cannot assemble", &f.path))?;
        let n = reader.n;
        let actual = match (reader.hasher.take(), reader.inner.into_inner()) {
            (Some(hasher), _) => hasher
                .finish()
                .into_iter()
                .next()
                .map(|(_, hex)| hex)
                .unwrap_or_default(),
            (None, Source::Ahead(a)) => {
                // What the thread read and hashed is what was written.
                let (read, digest) = a.finish().map_err(io_err("cannot read", &f.path))?;
                if read != n {
                    return Err(AssembleError::Io {
                        what: "short read of",
                        path: f.path.clone(),
                        source: io::Error::other(format!("{read} read, {n} written")),
                    });
                }
                digest
            }
            (None, Source::Here(_)) => String::new(),
        };
        if n != size {
            return Err(AssembleError::Io {
                what: "short read of",
                path: f.path.clone(),
                source: io::Error::other(format!("{n} of {size} bytes")),
            });
        }
        if !actual.eq_ignore_ascii_case(check.expected) {
            return Err(AssembleError::Mismatch {
                target: name.to_string(),
                path: ingest_protocol::cut(&f.logical_path, 512).into_owned(),
                algorithm: check.algorithm.name().into(),
                expected: check.expected.to_string(),
                actual,
            });
        }
        bytes += size;
        meter.file_done();
        manifest.push_str(&format!("{}  {}\n", f.digest, f.logical_path));
    }
    if algorithm_name.is_empty() {
        algorithm_name = "sha512".into();
    }
    let manifest_name = entry_name(ark, v.version, &format!("manifest-{algorithm_name}.txt"));
    let here = PathBuf::from(&manifest_name);
    writer
        .entry(
            &manifest_name,
            manifest.len() as u64,
            &mut manifest.as_bytes(),
        )
        .map_err(io_err("cannot write", &here))?;
    Ok((files.len(), bytes))
}

/// The digest a stored file's bytes are checked against as they stream:
/// the SHA-256 of the inventory's fixity block when it has one for the
/// file (every object `ingest` stores: SHA-256 runs on the CPU's SHA
/// extensions at about twice SHA-512's speed, and checking SHA-512 was
/// the slowest part of an assembly), else the manifest's own digest. Both
/// were written from the one pass that hashed the file's bytes as they
/// arrived, and the store checked them before its commit; `ingest verify`
/// still checks every manifest digest.
#[derive(Debug, Clone, Copy)]
struct Check<'f> {
    algorithm: Algorithm,
    expected: &'f str,
}

impl<'f> Check<'f> {
    fn of(f: &'f ContentFile, manifest: Algorithm) -> Check<'f> {
        match f.fixity_sha256.as_deref() {
            Some(sha256) if manifest != Algorithm::Sha256 => Check {
                algorithm: Algorithm::Sha256,
                expected: sha256,
            },
            _ => Check {
                algorithm: manifest,
                expected: &f.digest,
            },
        }
    }
}

/// What a request asks to assemble.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// The object.
    pub ark: &'a str,
    /// The version (the head when `None`).
    pub version: Option<u32>,
    /// Which files.
    pub content: Content,
    /// The container.
    pub container: Container,
    /// Whether the container holds a BagIt bag of the version.
    pub bag: bool,
}

/// The buffer a container is written through.
const OUT_BUFFER: usize = 1 << 20;

/// What [`assemble_from_any`] gives: the assembly, and the finished
/// container's size and SHA-256.
pub type Delivered = (Assembled, ContainerDigest);

/// [`assemble`] into the file `dest` from the first of `targets` that
/// gives the version whole and intact; each failure (a mismatch names the
/// file and target) is in the list returned beside the result, and the
/// last one is the error when none succeeds. With `bag`, the version is
/// first exported as a BagIt bag (the project's bag writer, which checks
/// every file against the inventory) into `<dest>.bag`, and the bag is
/// packed; the bag directory is removed afterwards. The container is
/// hashed as it is written. `observe`, when given, is told how far the
/// assembly got ([`Progress`]) as it reads each target.
///
/// # Errors
/// The last target's [`AssembleError`], or [`AssembleError::NoTarget`].
pub fn assemble_from_any<'a>(
    targets: impl IntoIterator<Item = &'a OcflTarget>,
    request: &Request<'_>,
    dest: &Path,
    observe: Option<Observer<'_>>,
) -> (Result<Delivered, AssembleError>, Vec<AssembleError>) {
    let mut failures = Vec::new();
    let io_err = |what: &'static str| {
        move |source| AssembleError::Io {
            what,
            path: dest.to_path_buf(),
            source,
        }
    };
    for target in targets {
        // Written through a large buffer: a tar entry is then copied in
        // reads of up to its size instead of 8 KiB (`io::copy` fills a
        // `BufWriter`'s free space directly).
        let file = match File::create(dest) {
            Ok(f) => io::BufWriter::with_capacity(OUT_BUFFER, Sink::new(Flushing::new(f))),
            Err(source) => return (Err(io_err("cannot create")(source)), failures),
        };
        let mut meter = Meter::start(observe, target.name());
        let built = if request.bag {
            assemble_bag(target, request, dest, file, &mut meter)
        } else {
            assemble_metered(target, request, file, &mut meter)
        };
        let finished = built.and_then(|(done, buffered)| {
            let sink = buffered
                .into_inner()
                .map_err(|e| io_err("cannot write")(e.into_error()))?;
            let (flushing, digest) = sink.finish();
            let file = flushing.finish().map_err(io_err("cannot sync"))?;
            file.sync_all().map_err(io_err("cannot sync"))?;
            let digest = match digest {
                Some((size, sha256)) => ContainerDigest {
                    size,
                    sha256,
                    read_back: false,
                },
                None => {
                    let (size, digests) = crate::digest::digest_file(dest, &[Algorithm::Sha256])
                        .map_err(io_err("cannot read"))?;
                    let sha256 = digests.into_iter().next().map(|(_, hex)| hex);
                    ContainerDigest {
                        size,
                        sha256: sha256.unwrap_or_default(),
                        read_back: true,
                    }
                }
            };
            Ok((done, digest))
        });
        match finished {
            Ok(delivered) => return (Ok(delivered), failures),
            Err(e) => failures.push(e),
        }
    }
    let _ = std::fs::remove_file(dest);
    let last = failures.pop().unwrap_or(AssembleError::NoTarget);
    (Err(last), failures)
}

/// A BagIt bag of the version (every file: a bag is the full version)
/// exported beside `dest` and packed into `out` under `<ark>/v<N>/`
/// (`meter` counts the packing of the bag's files).
fn assemble_bag<W: Write + Seek>(
    target: &OcflTarget,
    &Request {
        ark,
        version,
        container,
        ..
    }: &Request<'_>,
    dest: &Path,
    out: W,
    meter: &mut Meter<'_>,
) -> Result<(Assembled, W), AssembleError> {
    let mut dir = dest.as_os_str().to_owned();
    dir.push(".bag");
    let dir = PathBuf::from(dir);
    let _ = std::fs::remove_dir_all(&dir);
    let name = target.name().to_string();
    let summary = crate::bagit::export_bag(
        target,
        ark,
        version,
        &dir,
        &crate::bagit::BagOptions::default(),
    )
    .map_err(|source| AssembleError::Bag {
        target: name.clone(),
        source: Box::new(source),
    });
    let packed = summary.and_then(|summary| {
        let out = pack_dir(&dir, (ark, summary.version), container, out, meter)?;
        Ok((
            Assembled {
                target: name,
                version: summary.version,
                files: summary.files,
                bytes: summary.bytes,
            },
            out,
        ))
    });
    let _ = std::fs::remove_dir_all(&dir);
    packed
}

/// Every regular file under `dir` (sorted, links not followed) packed into
/// `out` under `<ark>/v<version>/`.
fn pack_dir<W: Write + Seek>(
    dir: &Path,
    (ark, version): (&str, u32),
    container: Container,
    out: W,
    meter: &mut Meter<'_>,
) -> Result<W, AssembleError> {
    let mut files = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let entries = std::fs::read_dir(&d).map_err(|source| AssembleError::Io {
            what: "cannot list",
            path: d.clone(),
            source,
        })?;
        for entry in entries {
            let entry = entry.map_err(|source| AssembleError::Io {
                what: "cannot list",
                path: d.clone(),
                source,
            })?;
            let kind = entry.file_type().map_err(|source| AssembleError::Io {
                what: "cannot read",
                path: entry.path(),
                source,
            })?;
            if kind.is_dir() {
                todo.push(entry.path());
            } else if kind.is_file() {
                files.push(entry.path());
            }
        }
    }
    files.sort();
    let mut writer = Writer::new(container, out);
    for path in &files {
        let rel = path
            .strip_prefix(dir)
            .unwrap_or(path)
            .to_string_lossy()
            .into_owned();
        let file = File::open(path).map_err(|source| AssembleError::Io {
            what: "cannot read",
            path: path.clone(),
            source,
        })?;
        let size = file
            .metadata()
            .map_err(|source| AssembleError::Io {
                what: "cannot read",
                path: path.clone(),
                source,
            })?
            .len();
        let mut reader = Hashing {
            inner: file.take(size),
            hasher: None,
            n: 0,
            meter: &mut *meter,
        };
        writer
            .entry(&entry_name(ark, version, &rel), size, &mut reader)
            .map_err(|source| AssembleError::Io {
                what: "cannot assemble",
                path: path.clone(),
                source,
            })?;
        meter.file_done();
    }
    writer.finish().map_err(|source| AssembleError::Io {
        what: "cannot finish",
        path: dir.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests;
