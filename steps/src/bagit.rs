//! A BagIt 1.0 bag (RFC 8493) of one stored object version, for handing an
//! object to another repository or a depositor.
//!
//! The bag is read through an [`OcflTarget`] and written to a new
//! directory; the storage root is only read. Layout:
//!
//! - `bagit.txt`: `BagIt-Version: 1.0`, `Tag-File-Character-Encoding: UTF-8`;
//! - `bag-info.txt`: `Source-Organization`, `External-Identifier` (the ark),
//!   `External-Description`, `Bagging-Date`, `Bag-Software-Agent`,
//!   `Payload-Oxum`, and the version's OCFL metadata as `Ingest-Version`,
//!   `Ingest-Version-Created`, `Ingest-Version-User`,
//!   `Ingest-Version-User-Address`, `Ingest-Version-Message`;
//! - `data/`: the version's files under their logical paths;
//! - `manifest-ALG.txt` and `tagmanifest-ALG.txt` for each chosen algorithm
//!   (default SHA-256 and SHA-512).
//!
//! Every file is copied while it is hashed; when the inventory's digest
//! uses one of the hashed algorithms (OCFL's SHA-512 always is) it must
//! match, so a damaged content file is never bagged as if it were sound.
//! The bag is built in a sibling directory and renamed into place at the
//! end: a failed export leaves no half-written bag at `DIR`.

use std::fmt::Write as _;
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use chrono::Utc;

use crate::digest::{Algorithm, HashingWriter};
use crate::ocfl::{OcflTarget, StorageError, VersionContent};

/// What the bag says of itself, beyond what the version gives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BagOptions {
    /// `Source-Organization`.
    pub source_organization: String,
    /// The manifests written (at least one); SHA-256 and SHA-512 by default.
    pub algorithms: Vec<Algorithm>,
}

impl Default for BagOptions {
    fn default() -> BagOptions {
        BagOptions {
            source_organization: "ingest".into(),
            algorithms: vec![Algorithm::Sha256, Algorithm::Sha512],
        }
    }
}

/// What [`export_bag`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BagSummary {
    /// The bag's directory.
    pub dir: PathBuf,
    /// The object's ark.
    pub ark: String,
    /// The version bagged.
    pub version: u32,
    /// Payload files.
    pub files: usize,
    /// Payload bytes.
    pub bytes: u64,
}

/// Why an export failed. Nothing is left at the bag's directory.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BagError {
    /// The destination exists and is not an empty directory.
    ///
    /// ### Handling
    /// Choose another directory or empty it; an export never overwrites.
    #[error(
        "{dir} exists and is not an empty directory: a bag is written only into a new or empty one"
    )]
    DestinationNotEmpty {
        /// The destination.
        dir: PathBuf,
    },
    /// No algorithm was chosen.
    ///
    /// ### Handling
    /// Pass at least one of md5, sha1, sha256, sha512.
    #[error("a bag needs at least one manifest algorithm")]
    NoAlgorithm,
    /// Reading the object from storage failed (not found, a hostile
    /// inventory, I/O).
    ///
    /// ### Handling
    /// As [`StorageError`]'s variant says.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// A content file does not match the inventory's digest.
    ///
    /// ### Handling
    /// The stored object is damaged: `verify` it and repair from another
    /// storage target.
    #[error("{logical_path} of {ark} v{version} does not match the inventory's {algorithm} digest: the stored content is damaged")]
    Fixity {
        /// The object.
        ark: String,
        /// The version.
        version: u32,
        /// The file.
        logical_path: String,
        /// The inventory's algorithm.
        algorithm: String,
    },
    /// Writing the bag failed.
    ///
    /// ### Handling
    /// Usually space or permissions at the destination; retry after fixing.
    #[error("writing the bag at {path}: {source}")]
    Io {
        /// The path written.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
}

fn io_at(path: &Path) -> impl FnOnce(io::Error) -> BagError + '_ {
    move |source| BagError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Writes a bag of `version` of `ark` (the head when `None`) read from
/// `target` into `dir`, which must not exist or be an empty directory.
///
/// # Errors
/// See [`BagError`]; on any error nothing is left at `dir` (an empty `dir`
/// that existed stays).
pub fn export_bag(
    target: &OcflTarget,
    ark: &str,
    version: Option<u32>,
    dir: &Path,
    options: &BagOptions,
) -> Result<BagSummary, BagError> {
    if options.algorithms.is_empty() {
        return Err(BagError::NoAlgorithm);
    }
    let existed = match fs::symlink_metadata(dir) {
        Ok(meta) if meta.is_dir() => {
            if fs::read_dir(dir).map_err(io_at(dir))?.next().is_some() {
                return Err(BagError::DestinationNotEmpty {
                    dir: dir.to_path_buf(),
                });
            }
            true
        }
        Ok(_) => {
            return Err(BagError::DestinationNotEmpty {
                dir: dir.to_path_buf(),
            })
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => false,
        Err(e) => return Err(io_at(dir)(e)),
    };
    let content = target.version_content(ark, version)?;
    let building = sibling(dir);
    let _ = fs::remove_dir_all(&building);
    let built = write_bag(&content, &building, options);
    let placed = built.and_then(|summary| {
        if existed {
            fs::remove_dir(dir).map_err(io_at(dir))?;
        }
        fs::rename(&building, dir).map_err(io_at(dir))?;
        Ok(summary)
    });
    match placed {
        Ok((files, bytes)) => Ok(BagSummary {
            dir: dir.to_path_buf(),
            ark: content.ark,
            version: content.version,
            files,
            bytes,
        }),
        Err(e) => {
            let _ = fs::remove_dir_all(&building);
            Err(e)
        }
    }
}

/// `DIR` → `.DIR.bagging-PID` beside it.
fn sibling(dir: &Path) -> PathBuf {
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "bag".into());
    let parent = dir
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    parent.join(format!(".{name}.bagging-{}", std::process::id()))
}

/// Writes the whole bag into `root`; the payload's file count and bytes.
fn write_bag(
    content: &VersionContent,
    root: &Path,
    options: &BagOptions,
) -> Result<(usize, u64), BagError> {
    let data = root.join("data");
    fs::create_dir_all(&data).map_err(io_at(&data))?;
    let mut hash_with = options.algorithms.clone();
    let inventory_alg = content
        .files
        .first()
        .and_then(|f| f.digest_algorithm.parse::<Algorithm>().ok());
    if let Some(a) = inventory_alg {
        if !hash_with.contains(&a) {
            hash_with.push(a);
        }
    }
    let mut manifests: Vec<String> = vec![String::new(); options.algorithms.len()];
    let mut bytes = 0u64;
    for file in &content.files {
        let dest = data.join(&file.logical_path);
        if let Some(parent) = dest.parent() {
            fs::create_dir_all(parent).map_err(io_at(parent))?;
        }
        let (size, digests) = copy_hashed(&file.path, &dest, &hash_with)?;
        bytes += size;
        if let Ok(alg) = file.digest_algorithm.parse::<Algorithm>() {
            let ours = digests.iter().find(|(a, _)| *a == alg).map(|(_, d)| d);
            if ours.is_some_and(|d| !d.eq_ignore_ascii_case(&file.digest)) {
                return Err(BagError::Fixity {
                    ark: content.ark.clone(),
                    version: content.version,
                    logical_path: file.logical_path.clone(),
                    algorithm: file.digest_algorithm.clone(),
                });
            }
        }
        let line_path = encode_path(&format!("data/{}", file.logical_path));
        for (i, alg) in options.algorithms.iter().enumerate() {
            if let Some((_, d)) = digests.iter().find(|(a, _)| a == alg) {
                let _ = writeln!(manifests[i], "{d}  {line_path}");
            }
        }
    }
    write(root, "bagit.txt", BAGIT_TXT.as_bytes())?;
    write(
        root,
        "bag-info.txt",
        bag_info(content, options, content.files.len(), bytes).as_bytes(),
    )?;
    let mut tag_files = vec!["bagit.txt".to_string(), "bag-info.txt".to_string()];
    for (i, alg) in options.algorithms.iter().enumerate() {
        let name = format!("manifest-{}.txt", alg.name());
        write(root, &name, manifests[i].as_bytes())?;
        tag_files.push(name);
    }
    for alg in &options.algorithms {
        let mut tags = String::new();
        for name in &tag_files {
            let path = root.join(name);
            let (_, digests) = crate::digest::digest_file(&path, &[*alg]).map_err(io_at(&path))?;
            if let Some((_, d)) = digests.first() {
                let _ = writeln!(tags, "{d}  {name}");
            }
        }
        write(
            root,
            &format!("tagmanifest-{}.txt", alg.name()),
            tags.as_bytes(),
        )?;
    }
    Ok((content.files.len(), bytes))
}

const BAGIT_TXT: &str = "BagIt-Version: 1.0\nTag-File-Character-Encoding: UTF-8\n";

/// The `bag-info.txt` text.
fn bag_info(content: &VersionContent, options: &BagOptions, files: usize, bytes: u64) -> String {
    let mut out = String::new();
    let mut tag = |label: &str, value: &str| {
        let value = one_line(value);
        if !value.is_empty() {
            let _ = writeln!(out, "{label}: {value}");
        }
    };
    tag("Source-Organization", &options.source_organization);
    tag("External-Identifier", &content.ark);
    tag(
        "External-Description",
        &format!("Version {} of {}", content.version, content.ark),
    );
    tag("Bagging-Date", &Utc::now().format("%Y-%m-%d").to_string());
    tag(
        "Bag-Software-Agent",
        &format!("ingest {}", env!("CARGO_PKG_VERSION")),
    );
    tag("Payload-Oxum", &format!("{bytes}.{files}"));
    tag("Ingest-Version", &content.version.to_string());
    tag("Ingest-Version-Created", &content.created.to_rfc3339());
    tag(
        "Ingest-Version-User",
        content.user_name.as_deref().unwrap_or(""),
    );
    tag(
        "Ingest-Version-User-Address",
        content.user_address.as_deref().unwrap_or(""),
    );
    tag(
        "Ingest-Version-Message",
        content.message.as_deref().unwrap_or(""),
    );
    out
}

/// A tag value on one line: control characters become spaces, trimmed,
/// at most 1000 bytes.
fn one_line(value: &str) -> String {
    let cleaned: String = value
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    // 960 bytes of value leave room for `cut`'s marker within 1000.
    ingest_protocol::cut(cleaned.trim(), 960).into_owned()
}

/// A manifest path as RFC 8493 §2.1.3 wants it: `%`, CR and LF
/// percent-encoded.
pub fn encode_path(path: &str) -> String {
    path.replace('%', "%25")
        .replace('\r', "%0D")
        .replace('\n', "%0A")
}

fn write(root: &Path, name: &str, bytes: &[u8]) -> Result<(), BagError> {
    let path = root.join(name);
    fs::write(&path, bytes).map_err(io_at(&path))
}

/// Copies `from` to a new file `to`, hashing with `algorithms`.
fn copy_hashed(
    from: &Path,
    to: &Path,
    algorithms: &[Algorithm],
) -> Result<(u64, Vec<(Algorithm, String)>), BagError> {
    let mut source = File::open(from).map_err(|e| {
        BagError::Storage(StorageError::Io {
            context: from.display().to_string(),
            source: e,
        })
    })?;
    let dest = File::options()
        .write(true)
        .create_new(true)
        .open(to)
        .map_err(io_at(to))?;
    let mut writer = HashingWriter::new(io::BufWriter::new(dest), algorithms);
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match source.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                return Err(BagError::Storage(StorageError::Io {
                    context: from.display().to_string(),
                    source: e,
                }))
            }
        };
        writer.write_all(&buf[..n]).map_err(io_at(to))?;
    }
    let (inner, size, digests) = writer.finish();
    let file = inner.into_inner().map_err(|e| io_at(to)(e.into_error()))?;
    file.sync_all().map_err(io_at(to))?;
    Ok((size, digests))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifest_paths_are_percent_encoded() {
        assert_eq!(encode_path("data/a%b\r\nc d"), "data/a%25b%0D%0Ac d");
    }

    #[test]
    fn tag_values_stay_on_one_line() {
        assert_eq!(one_line(" a\nb\tc "), "a b c");
        assert!(one_line(&"x".repeat(5000)).len() <= 1000);
    }
}
