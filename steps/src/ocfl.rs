//! A local-disk OCFL storage target: the place the storing step writes an
//! object version to.
//!
//! Objects are keyed by their ark (`ark:/99999/fk4…`), which is the OCFL
//! object id as is. A new storage root uses the
//! `0004-hashed-n-tuple-storage-layout` extension, so an ark's `/` and `:`
//! never reach a directory name.
//!
//! Storing is done with [rocfl](https://docs.rs/rocfl): a version is built in
//! a staging area and moved into the object by a commit. A version whose
//! files are moved in, with digests the caller already has
//! ([`OcflTarget::store_checked_with`]), is written by this crate's own
//! writer instead (`direct`): a new object whole, a later version into
//! the object, each file one map lookup (rocfl's update path walks every
//! content path of a file's digest per file, N² for N files sharing one).
//! [`OcflTarget::store_version`] always leaves the staging area empty for its
//! ark, whether it succeeds or fails, so a retry starts fresh.
//!
//! # Many processes, one root
//!
//! Every target that stores has its own staging directory,
//! `<root>/extensions/rocfl-staging/proc-<pid>-<random>/`, with rocfl's lock
//! files inside it, and holds an exclusive `flock` on the matching
//! `proc-….lock` file while it lives. Opening a target removes only the
//! staging of owners whose lock can be taken (processes that are gone,
//! however they ended); starting, crashing or stopping one process never
//! disturbs another's stores. Two processes storing one ark take turns on a
//! shared per-ark `flock` (`rocfl-staging/ark-locks/`), which the kernel
//! releases when a holder dies, so no lock outlives its process.
//!
//! ```no_run
//! use chrono::Utc;
//! use ingest_steps::ocfl::{OcflTarget, VersionMeta};
//! use std::path::Path;
//!
//! # fn main() -> Result<(), ingest_steps::ocfl::StorageError> {
//! let target = OcflTarget::open_or_init("local", Path::new("/data/ocfl"))?;
//! let meta = VersionMeta {
//!     user_name: "ingest".into(),
//!     user_address: None,
//!     message: "bid0000000001 / jid0000000001".into(),
//!     created: Utc::now(),
//! };
//! let stored = target.store_version("ark:/99999/fk4abc", Path::new("/tmp/producer"), &meta)?;
//! assert!(target.verify(&stored.ark)?.ok);
//! # Ok(())
//! # }
//! ```
#![warn(missing_docs)]

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, OnceLock, PoisonError};

use chrono::{DateTime, Local, Utc};
use rocfl::ocfl::{
    CommitMeta, DigestAlgorithm, LayoutExtensionName, LogicalPath, OcflRepo, RocflError,
    SpecVersion, StorageLayout, ValidationResult, VersionRef,
};

/// One OCFL storage root on local disk.
///
/// # Concurrency
///
/// `OcflTarget` is `Send + Sync`. Different arks are stored concurrently;
/// two stores of the same ark are serialized: the second waits for the first
/// to finish, then adds the next version.
pub struct OcflTarget {
    name: String,
    root: PathBuf,
    repo: OcflRepo,
    arks: ArkLocks,
    /// This target's own staging, claimed on open ([`OcflTarget::open_or_init`])
    /// or before the first store ([`OcflTarget::open_existing`]).
    staging: Mutex<Option<staging::Staging>>,
    /// The name of this target's staging directory under [`STAGING`].
    owner: String,
    /// The root's storage layout, for writing new objects directly
    /// ([`direct`]); `None` when they go through rocfl.
    layout: OnceLock<Option<StorageLayout>>,
    /// How long a direct write waits half built, in milliseconds
    /// ([`OcflTarget::set_build_pause`]).
    build_pause_ms: AtomicU64,
}

mod direct;
mod staging;

/// What the caller of [`OcflTarget::store_checked_with`] knows of the files
/// it stores, by logical path.
#[derive(Debug, Clone, Copy)]
pub struct Checks<'a> {
    /// Every file's SHA-512, computed as its bytes arrived: a new object's
    /// inventory takes them as given.
    pub sha512: &'a BTreeMap<String, String>,
    /// Every file's SHA-256 from the same pass: a file not in `unchanged`
    /// is read again and must have it.
    pub sha256: &'a BTreeMap<String, String>,
    /// The files the caller has shown to be the very files hashed, unchanged
    /// since (their [`crate::stamp::FileStamp`] kept): not read again.
    pub unchanged: &'a BTreeSet<String>,
}

/// The metadata of a new version, written into the OCFL inventory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VersionMeta {
    /// Who made the version (OCFL `user.name`), e.g. the depositor.
    pub user_name: String,
    /// The user's address (OCFL `user.address`, a URI such as `mailto:…`).
    pub user_address: Option<String>,
    /// What the version is (OCFL `message`), e.g. the batch and job ids.
    pub message: String,
    /// When the version was made (OCFL `created`).
    pub created: DateTime<Utc>,
}

/// What [`OcflTarget::store_version`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredVersion {
    /// The object's ark (its OCFL id).
    pub ark: String,
    /// The version number written (1 for a new object).
    pub version: u32,
    /// The state of the new version, sorted by logical path.
    pub files: Vec<StoredFile>,
    /// The object's root directory on disk.
    pub object_root: PathBuf,
}

/// One version of an object, read back from the storage root
/// ([`OcflTarget::version_info`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VersionInfo {
    /// The version number.
    pub version: u32,
    /// The OCFL message (the storing step writes `MODE: batch BID job JID`).
    pub message: String,
    /// When the version was made.
    pub created: DateTime<Utc>,
    /// The digest algorithm of the files' digests (`sha512` or `sha256`).
    pub digest_algorithm: String,
    /// The files of the version, sorted by logical path; `sha512` holds
    /// the digest in `digest_algorithm`.
    pub files: Vec<StoredFile>,
}

/// One file in the state of a stored version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredFile {
    /// The path inside the object, `/`-separated, relative to the source directory.
    pub logical_path: String,
    /// Size in bytes.
    pub size: u64,
    /// SHA-512, lower-case hex.
    pub sha512: String,
}

/// One stored version as [`OcflTarget::version_content`] reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VersionContent {
    /// The object's ark.
    pub ark: String,
    /// The version number.
    pub version: u32,
    /// When it was made (OCFL `created`).
    pub created: DateTime<Utc>,
    /// OCFL `user.name`.
    pub user_name: Option<String>,
    /// OCFL `user.address`.
    pub user_address: Option<String>,
    /// OCFL `message`.
    pub message: Option<String>,
    /// Its files, sorted by logical path.
    pub files: Vec<ContentFile>,
}

/// One file of a stored version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContentFile {
    /// The file's logical path, checked safe and normalized.
    pub logical_path: String,
    /// Where its content lies on disk (inside the object's directory).
    pub path: PathBuf,
    /// The inventory's digest algorithm (`sha512` or `sha256`).
    pub digest_algorithm: String,
    /// The inventory's digest, lower-case hex.
    pub digest: String,
    /// The SHA-256 the inventory's fixity block gives the file's content
    /// path, lower-case hex, when it gives one of 64 hexadecimal digits
    /// (every object `ingest` stores has them; see `direct::FIXITY`).
    pub fixity_sha256: Option<String>,
}

/// The outcome of [`OcflTarget::verify`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FixityReport {
    /// `true` when the object has no validation error (warnings do not count).
    pub ok: bool,
    /// Every validation error, with its OCFL code (`E093: Content file … failed sha512 fixity check…`).
    pub problems: Vec<String>,
    /// Every validation warning, with its OCFL code; informational only.
    pub warnings: Vec<String>,
}

/// Why a storage operation failed.
///
/// [`StorageError::is_recoverable`] tells whether retrying the same call may
/// succeed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StorageError {
    /// The storage root exists, is not empty, and is not a usable OCFL root.
    ///
    /// ### Handling
    /// Not recoverable: a configuration error; point the target at an empty
    /// directory or an OCFL root with a storage layout.
    #[error("storage root {dir} is not usable: {reason}")]
    UnusableRoot {
        /// The storage root.
        dir: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The ark cannot be an OCFL object id here.
    ///
    /// ### Handling
    /// Not recoverable: the ark was minted or typed wrong.
    #[error("invalid ark {ark:?}: {reason}")]
    InvalidArk {
        /// The ark as given.
        ark: String,
        /// Why it is refused.
        reason: String,
    },
    /// The source directory does not exist or is not a directory.
    ///
    /// ### Handling
    /// Not recoverable: an earlier step did not produce the object's files.
    #[error("source directory {dir} is missing or not a directory")]
    SourceMissing {
        /// The source directory.
        dir: PathBuf,
    },
    /// The source directory holds no file: a version cannot be empty.
    ///
    /// ### Handling
    /// Not recoverable: the job has nothing to store.
    #[error("source directory {dir} holds no file")]
    EmptySource {
        /// The source directory.
        dir: PathBuf,
    },
    /// An entry of the source directory cannot be stored: a symbolic link, a
    /// special file, or a name that is not UTF-8 or holds a `\`.
    ///
    /// ### Handling
    /// Not recoverable: the producer files must be fixed by an earlier step.
    #[error("cannot store {path}: {reason}")]
    UnsupportedEntry {
        /// The entry on disk.
        path: PathBuf,
        /// Why it is refused.
        reason: String,
    },
    /// The object, the version or the logical path does not exist.
    ///
    /// ### Handling
    /// Not recoverable: re-read what exists ([`OcflTarget::versions`]).
    #[error("{}", missing(.ark, .detail))]
    NotFound {
        /// The object's ark.
        ark: String,
        /// What was missing, in rocfl's words (`Object ARK version v2 path
        /// a.txt`); empty for the object itself.
        detail: String,
    },
    /// rocfl's lock on the object is held. rocfl's locks live in this
    /// target's own staging and stores of one ark are serialized before
    /// rocfl is called, so this means something outside `ingest` wrote there.
    ///
    /// ### Handling
    /// Recoverable: retry later. The staging (and its lock files) of a
    /// process that is gone is removed when the next target is opened.
    #[error("object {ark} is locked ({lock_file})")]
    Busy {
        /// The object's ark.
        ark: String,
        /// rocfl's lock file.
        lock_file: String,
    },
    /// Copying the source files into the staged version failed.
    ///
    /// ### Handling
    /// Recoverable: usually an I/O failure (disk full, unreadable file); the
    /// staged version was discarded, so a retry starts fresh.
    #[error("copying files into object {ark} failed: {}", problems.join("; "))]
    Copy {
        /// The object's ark.
        ark: String,
        /// One line per file that failed, in rocfl's words.
        problems: Vec<String>,
    },
    /// The staged version is not exactly the source directory (rocfl mapped
    /// a path differently). Nothing was committed.
    ///
    /// ### Handling
    /// Not recoverable: a bug; report it with the paths.
    #[error("staged version of {ark} differs from the source: missing {missing:?}, unexpected {unexpected:?}")]
    StagedMismatch {
        /// The object's ark.
        ark: String,
        /// Source files absent from the staged state.
        missing: Vec<String>,
        /// Staged paths absent from the source.
        unexpected: Vec<String>,
    },
    /// A staged file's SHA-512 is not the one the caller expected (the
    /// bytes on disk are not the bytes it hashed), or a file is missing or
    /// unexpected; nothing was committed.
    ///
    /// ### Handling
    /// Not recoverable: the working copy changed since it was hashed.
    #[error("the fixity check of {ark} failed before commit: {}", problems.join("; "))]
    DigestMismatch {
        /// The object's ark.
        ark: String,
        /// One line per file.
        problems: Vec<String>,
    },
    /// A disk operation failed.
    ///
    /// ### Handling
    /// Recoverable: retry a bounded number of times, then stop and alert.
    #[error("I/O error on {context}: {source}")]
    Io {
        /// The path or object involved.
        context: String,
        /// The underlying error.
        source: io::Error,
    },
    /// The process is stopping ([`stop_stores`]): the store ended before
    /// its commit, and nothing of it is in the object.
    ///
    /// ### Handling
    /// Not retried in this process (every later store would stop too): the
    /// job is left for the next process, which stores the version again.
    #[error("the store of {ark} was stopped before its commit: the process is stopping")]
    Stopped {
        /// The object that was being stored.
        ark: String,
    },
    /// Any other rocfl failure, e.g. a version directory that already exists
    /// or a corrupt inventory.
    ///
    /// ### Handling
    /// Not recoverable: the object needs an operator's attention
    /// ([`OcflTarget::verify`] tells more).
    #[error("OCFL error on object {ark}: {detail}")]
    Ocfl {
        /// The object's ark, or the storage root.
        ark: String,
        /// rocfl's message.
        detail: String,
    },
}

impl StorageError {
    /// Whether retrying the same call may succeed (I/O and lock failures).
    pub fn is_recoverable(&self) -> bool {
        matches!(
            self,
            StorageError::Busy { .. } | StorageError::Copy { .. } | StorageError::Io { .. }
        )
    }
}

/// Set once the process is stopping ([`stop_stores`]).
static STOPPING: AtomicBool = AtomicBool::new(false);

/// Stops every store of this process before its commit: a direct write
/// checks it between files, in its test pause and just before the rename
/// that commits, a store through rocfl before its commit. Each such store
/// then fails with [`StorageError::Stopped`], its half-built version
/// removed, and every later one at once. For a process's shutdown: a store
/// of 100,000 files must not hold it for its whole run (issue 25).
pub fn stop_stores() {
    STOPPING.store(true, Ordering::SeqCst);
}

/// Whether [`stop_stores`] was called.
pub fn stores_stopped() -> bool {
    STOPPING.load(Ordering::SeqCst)
}

/// [`StorageError::Stopped`] for `ark` once the process is stopping.
fn check_stopping(ark: &str) -> Result<(), StorageError> {
    if stores_stopped() {
        return Err(StorageError::Stopped {
            ark: ark.to_string(),
        });
    }
    Ok(())
}

/// The parent of every target's own staging directory, at rocfl's default
/// place inside the root.
const STAGING: &str = "extensions/rocfl-staging";

impl OcflTarget {
    /// Opens the OCFL root at `root`, or creates one (OCFL 1.1, hashed n-tuple
    /// layout) when `root` is absent or an empty directory.
    ///
    /// Opening claims this target's own staging directory and removes the
    /// staging of processes that are gone (leftovers of a crash, including
    /// their rocfl lock files); the staging of live processes is left alone.
    ///
    /// # Errors
    ///
    /// [`StorageError::UnusableRoot`] when `root` is a file, or a non-empty
    /// directory without an OCFL namaste file or a storage layout;
    /// [`StorageError::Io`] when the disk fails.
    pub fn open_or_init(name: &str, root: &Path) -> Result<OcflTarget, StorageError> {
        let owner = staging::new_owner_name();
        let own_staging = root.join(STAGING).join(&owner);
        let repo = if is_absent_or_empty(root)? {
            init_repo(root, &own_staging)?
        } else {
            check_ocfl_root(root)?;
            OcflRepo::fs_repo(root, Some(&own_staging)).map_err(|e| root_error(root, e))?
        };
        let target = OcflTarget {
            name: name.to_string(),
            root: root.to_path_buf(),
            repo,
            arks: ArkLocks::default(),
            staging: Mutex::new(None),
            owner,
            layout: OnceLock::new(),
            build_pause_ms: AtomicU64::new(0),
        };
        target.claim_staging()?;
        Ok(target)
    }

    /// Opens an existing OCFL root without writing anything to it until the
    /// first store, for readers (audits, `verify` of a read-only copy,
    /// tests) beside the processes that store into it.
    ///
    /// # Errors
    ///
    /// [`StorageError::UnusableRoot`] when `root` is not an OCFL root.
    pub fn open_existing(name: &str, root: &Path) -> Result<OcflTarget, StorageError> {
        check_ocfl_root(root)?;
        let owner = staging::new_owner_name();
        let own_staging = root.join(STAGING).join(&owner);
        let repo = OcflRepo::fs_repo(root, Some(&own_staging)).map_err(|e| root_error(root, e))?;
        Ok(OcflTarget {
            name: name.to_string(),
            root: root.to_path_buf(),
            repo,
            arks: ArkLocks::default(),
            staging: Mutex::new(None),
            owner,
            layout: OnceLock::new(),
            build_pause_ms: AtomicU64::new(0),
        })
    }

    /// This target's own staging directory (created by the first store when
    /// the target was opened with [`OcflTarget::open_existing`]).
    pub fn staging_dir(&self) -> PathBuf {
        self.root.join(STAGING).join(&self.owner)
    }

    /// Claims this target's staging once (see [`staging`]).
    fn claim_staging(&self) -> Result<(), StorageError> {
        let mut own = self.staging.lock().unwrap_or_else(PoisonError::into_inner);
        if own.is_none() {
            let parent = self.root.join(STAGING);
            let claimed =
                staging::Staging::claim(&parent, &self.owner).map_err(|e| io_error(&parent, e))?;
            *own = Some(claimed);
        }
        Ok(())
    }

    /// Tests only: from now on every new object written directly waits
    /// `pause` with its files moved into the half-built object in this
    /// target's staging, so that a test can kill the process in the middle
    /// of a store (`ingest worker --store-pause-ms`, hidden).
    pub fn set_build_pause(&self, pause: std::time::Duration) {
        let ms = u64::try_from(pause.as_millis()).unwrap_or(u64::MAX);
        self.build_pause_ms.store(ms, Ordering::Relaxed);
    }

    /// The target's name, as configured.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The storage root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Stores the files under `source_dir` as the next version of `ark`:
    /// version 1 when the object does not exist, else a new version whose
    /// state is exactly the files of `source_dir` (files absent from it are
    /// not in the new version; unchanged content is deduplicated by OCFL).
    ///
    /// Logical paths are relative to `source_dir`, `/`-separated. A store of
    /// an ark waits for a running store of the same ark.
    ///
    /// # Errors
    ///
    /// See [`StorageError`]; on every error, the staged version is discarded
    /// and nothing is committed, so the call can be retried as is.
    ///
    /// # Cautions
    ///
    /// When rocfl reports an error *after* the version was moved into place
    /// (e.g. while clearing the staging area), the version is kept and the
    /// call succeeds: the object's head is re-read to tell.
    pub fn store_version(
        &self,
        ark: &str,
        source_dir: &Path,
        meta: &VersionMeta,
    ) -> Result<StoredVersion, StorageError> {
        self.store_from(ark, source_dir, meta, false, None, None)
    }

    /// [`OcflTarget::store_version`], with the SHA-512 every file must
    /// have (`expected_sha512`, by logical path) checked before the version
    /// is committed: rocfl reads each file once for its inventory's
    /// SHA-512, and a file that differs (or is missing or unexpected)
    /// fails the store with [`StorageError::DigestMismatch`], committing
    /// nothing.
    ///
    /// With `moving`, the files of `source_dir` are *moved* into the object
    /// (a rename: no byte is copied) when `source_dir` is on the storage
    /// root's file system and the object's digest algorithm is SHA-512;
    /// otherwise they are copied. After a move (successful or not) the
    /// files of `source_dir` may be gone, so a retry needs a fresh one.
    ///
    /// # Errors
    ///
    /// As [`OcflTarget::store_version`], and
    /// [`StorageError::DigestMismatch`].
    pub fn store_checked(
        &self,
        ark: &str,
        source_dir: &Path,
        meta: &VersionMeta,
        moving: bool,
        expected_sha512: &BTreeMap<String, String>,
    ) -> Result<StoredVersion, StorageError> {
        self.store_from(ark, source_dir, meta, moving, Some(expected_sha512), None)
    }

    /// [`OcflTarget::store_checked`], for a caller that also has every
    /// file's SHA-256 and knows which files are unchanged since they were
    /// hashed ([`Checks`]).
    ///
    /// A version of an object in an OCFL 1.1 root is then written directly
    /// rather than through rocfl ([`direct`]). When its files are moved
    /// (`moving`, on the storage root's file system), its inventory takes
    /// the SHA-512 of `checks.sha512` as given (computed as the bytes
    /// arrived), and every file not in `checks.unchanged` is re-read once
    /// for its SHA-256 (with the CPU's SHA extensions, about half the cost
    /// of SHA-512), which must match `checks.sha256` before anything is
    /// committed. Otherwise each file is copied, its SHA-512 computed from
    /// the copied bytes and compared with `checks.sha512` before the
    /// commit, and the source is left whole. Every other store is
    /// [`OcflTarget::store_checked`]'s.
    ///
    /// # Errors
    ///
    /// As [`OcflTarget::store_checked`]; a file whose SHA-256 differs is a
    /// [`StorageError::DigestMismatch`] naming it.
    pub fn store_checked_with(
        &self,
        ark: &str,
        source_dir: &Path,
        meta: &VersionMeta,
        moving: bool,
        checks: &Checks<'_>,
    ) -> Result<StoredVersion, StorageError> {
        self.store_from(
            ark,
            source_dir,
            meta,
            moving,
            Some(checks.sha512),
            Some(checks),
        )
    }

    fn store_from(
        &self,
        ark: &str,
        source_dir: &Path,
        meta: &VersionMeta,
        moving: bool,
        expected_sha512: Option<&BTreeMap<String, String>>,
        checks: Option<&Checks<'_>>,
    ) -> Result<StoredVersion, StorageError> {
        check_ark(ark)?;
        check_stopping(ark)?;
        let sources = list_source(source_dir)?;
        self.claim_staging()?;
        let _guard = self.arks.lock(ark);
        let parent = self.root.join(STAGING);
        let _shared = staging::lock_ark(&parent, ark).map_err(|e| io_error(&parent, e))?;
        self.discard_staged(ark)?;
        let current = self.head(ark)?;
        let moving = moving && same_file_system(source_dir, &self.root);
        if let Some(checks) = checks {
            let bring = if moving {
                direct::Bring::Move
            } else {
                direct::Bring::Copy
            };
            if let Some(stored) =
                self.store_direct(ark, source_dir, &sources, meta, (bring, checks), current)?
            {
                return Ok(stored);
            }
        }
        let staged = self
            .stage(ark, source_dir, &sources, current.is_some(), moving)
            .and_then(|()| self.staged_files(ark, source_dir, &sources));
        let checked = staged.and_then(|files| match expected_sha512 {
            Some(expected) => check_digests(ark, expected, &files).map(|()| files),
            None => Ok(files),
        });
        let checked = checked.and_then(|files| check_stopping(ark).map(|()| files));
        let files = match checked {
            Ok(files) => files,
            Err(e) => return Err(self.discard_after(ark, e)),
        };
        let version = current.map_or(1, |v| v + 1);
        self.commit(ark, meta, version)?;
        Ok(StoredVersion {
            ark: ark.to_string(),
            version,
            files,
            object_root: self.object_root(ark)?,
        })
    }

    /// Writes version `head + 1` of `ark` directly (see [`direct`]): a new
    /// object when `head` is `None`, else the next version into it, from
    /// `source_dir` with the SHA-512 of `expected`, its files brought in as
    /// `bring` says (a move after checking every file's SHA-256, or a copy
    /// checking the copied bytes' SHA-512). `Ok(None)` when the object is not one the direct
    /// writer takes, or the root's layout cannot be read (nothing was
    /// touched).
    fn store_direct(
        &self,
        ark: &str,
        source_dir: &Path,
        sources: &[SourceFile],
        meta: &VersionMeta,
        (bring, expected): (direct::Bring, &Checks<'_>),
        head: Option<u32>,
    ) -> Result<Option<StoredVersion>, StorageError> {
        let Some(layout) = self.layout.get_or_init(|| direct::layout_of(&self.root)) else {
            return Ok(None);
        };
        let files = expected_files(sources, expected);
        check_digests(ark, expected.sha512, &files)?;
        if bring == direct::Bring::Move {
            direct::check_sha256(ark, source_dir, &files, expected)?;
        }
        let object_root = match head {
            None => layout.map_object_id(ark),
            Some(_) => {
                let path = self.object_root(ark)?;
                path.strip_prefix(&self.root)
                    .map_err(|_| unusable(&path, "the object lies outside its storage root"))?
                    .to_string_lossy()
                    .into_owned()
            }
        };
        let build = self
            .staging_dir()
            .join(format!("direct-{}", staging::new_owner_name()));
        let place = direct::Place {
            root: &self.root,
            object_root: &object_root,
            build: &build,
            pause: std::time::Duration::from_millis(self.build_pause_ms.load(Ordering::Relaxed)),
            bring,
            checks: expected,
        };
        let written = match head {
            None => direct::write_v1(&place, ark, source_dir, &files, meta).map(|_| Some(1))?,
            Some(head) => direct::write_next(&place, ark, source_dir, &files, meta, head)?,
        };
        Ok(written.map(|version| StoredVersion {
            ark: ark.to_string(),
            version,
            files,
            object_root: self.root.join(&object_root),
        }))
    }

    /// Validates the object, including the fixity of every content file.
    ///
    /// # Errors
    ///
    /// [`StorageError::NotFound`] when the object does not exist; a
    /// damaged object is not an error but a report with `ok: false`.
    pub fn verify(&self, ark: &str) -> Result<FixityReport, StorageError> {
        self.validate(ark, true)
    }

    /// Validates the object's structure and inventories without reading
    /// its content files: for a version whose content digests the caller
    /// has just compared with digests of its own
    /// ([`OcflTarget::store_checked`]).
    ///
    /// # Errors
    ///
    /// As [`OcflTarget::verify`].
    pub fn verify_structure(&self, ark: &str) -> Result<FixityReport, StorageError> {
        self.validate(ark, false)
    }

    fn validate(&self, ark: &str, fixity: bool) -> Result<FixityReport, StorageError> {
        check_ark(ark)?;
        if self.head(ark)?.is_none() {
            return Err(not_found(ark));
        }
        let result = self
            .repo
            .validate_object(ark, fixity)
            .map_err(|e| rocfl_error(ark, e))?;
        let problems: Vec<String> = result
            .errors()
            .iter()
            .map(|e| format!("{}: {}", e.code, e.text))
            .collect();
        let warnings = result
            .warnings()
            .iter()
            .map(|w| format!("{}: {}", w.code, w.text))
            .collect();
        Ok(FixityReport {
            ok: problems.is_empty(),
            problems,
            warnings,
        })
    }

    /// The object's version numbers, ascending.
    ///
    /// # Errors
    ///
    /// [`StorageError::NotFound`] when the object does not exist.
    pub fn versions(&self, ark: &str) -> Result<Vec<u32>, StorageError> {
        check_ark(ark)?;
        let versions = self
            .repo
            .list_object_versions(ark)
            .map_err(|e| rocfl_error(ark, e))?;
        Ok(versions.iter().map(|v| v.version_num.number).collect())
    }

    /// Every object id (ark) in the storage root, sorted. An object rocfl
    /// cannot read is skipped with a WARN (a reader must not stop at one
    /// damaged object).
    ///
    /// # Errors
    ///
    /// [`StorageError::Io`] or another storage error when the root itself
    /// cannot be listed.
    pub fn arks(&self) -> Result<Vec<String>, StorageError> {
        self.arks_unless(&|| false)
    }

    /// [`OcflTarget::arks`], stopping before the next object once `stop`
    /// says so (each object's inventory is read to learn its id, so the
    /// listing of a large root is itself long): the arks listed so far.
    ///
    /// # Errors
    ///
    /// As [`OcflTarget::arks`].
    pub fn arks_unless(&self, stop: &dyn Fn() -> bool) -> Result<Vec<String>, StorageError> {
        let iter = self
            .repo
            .list_objects(None)
            .map_err(|e| rocfl_error("(listing)", e))?;
        let mut arks = Vec::new();
        for item in iter {
            if stop() {
                break;
            }
            match item {
                Ok(details) => arks.push(details.id),
                Err(e) => {
                    tracing::warn!(target = %self.name, error = %e, "skipped an object the storage root cannot read");
                }
            }
        }
        arks.sort();
        Ok(arks)
    }

    /// One version of the object as the storage root describes it: its
    /// OCFL message and creation time, and its files (logical path, size,
    /// digest in the object's algorithm, normally SHA-512).
    ///
    /// # Errors
    ///
    /// [`StorageError::NotFound`] when the object or the version does not
    /// exist; [`StorageError::Io`] when a content file cannot be read.
    pub fn version_info(&self, ark: &str, version: u32) -> Result<VersionInfo, StorageError> {
        check_ark(ark)?;
        let vref = VersionRef::try_from(version).map_err(|e| rocfl_error(ark, e))?;
        let object = self
            .repo
            .get_object_details(ark, vref)
            .map_err(|e| rocfl_error(ark, e))?;
        let object_root = self.root.join(&object.object_root);
        let state = version_state(ark, &object_root, version)?;
        let mut files = Vec::with_capacity(state.len());
        for entry in state {
            let on_disk = object_root.join(&entry.content_path);
            let size = fs::metadata(&on_disk)
                .map_err(|e| io_error(&on_disk, e))?
                .len();
            files.push(StoredFile {
                logical_path: entry.logical_path,
                size,
                sha512: entry.digest,
            });
        }
        files.sort_by(|a, b| a.logical_path.cmp(&b.logical_path));
        let details = object.version_details;
        Ok(VersionInfo {
            version,
            message: details.message.unwrap_or_default(),
            created: details.created.with_timezone(&Utc),
            digest_algorithm: object.digest_algorithm.to_string(),
            files,
        })
    }

    /// The content of `logical_path` in `version` of the object (the head
    /// version when `None`), read whole into memory.
    ///
    /// # Errors
    ///
    /// [`StorageError::NotFound`] when the object, the version or the path
    /// does not exist.
    pub fn read_file(
        &self,
        ark: &str,
        version: Option<u32>,
        logical_path: &str,
    ) -> Result<Vec<u8>, StorageError> {
        check_ark(ark)?;
        let version = match version {
            None => VersionRef::Head,
            Some(v) => VersionRef::try_from(v).map_err(|e| rocfl_error(ark, e))?,
        };
        let path = LogicalPath::try_from(logical_path).map_err(|e| rocfl_error(ark, e))?;
        let mut content = Vec::new();
        self.repo
            .get_object_file(ark, &path, version, &mut content)
            .map_err(|e| rocfl_error(ark, e))?;
        Ok(content)
    }

    /// What `version` of the object holds (the head version when `None`):
    /// its metadata and, for each file, its logical path and where its
    /// content lies on disk. Reads only; nothing in the root is written.
    ///
    /// Every logical path must be a safe relative name
    /// ([`crate::paths::normalized_name`]: no `..`, not absolute, no
    /// control characters) and every content path must lie inside the
    /// object's directory: an inventory that says otherwise is refused,
    /// naming the path (bounded), so a reader never writes or reads outside
    /// where it means to.
    ///
    /// # Errors
    ///
    /// [`StorageError::NotFound`] when the object or version does not
    /// exist; [`StorageError::Ocfl`] for a hostile or unreadable inventory.
    pub fn version_content(
        &self,
        ark: &str,
        version: Option<u32>,
    ) -> Result<VersionContent, StorageError> {
        check_ark(ark)?;
        let version = match version {
            None => VersionRef::Head,
            Some(v) => VersionRef::try_from(v).map_err(|e| rocfl_error(ark, e))?,
        };
        let object = self
            .repo
            .get_object_details(ark, version)
            .map_err(|e| rocfl_error(ark, e))?;
        let hostile = |what: &str, path: &str, why: String| StorageError::Ocfl {
            ark: ark.to_string(),
            detail: format!(
                "the inventory's {what} {:?} is refused: {why}",
                ingest_protocol::cut(path, 200)
            ),
        };
        let object_root = self.root.join(&object.object_root);
        let inside = std::fs::canonicalize(&object_root)
            .ok()
            .zip(std::fs::canonicalize(&self.root).ok())
            .is_some_and(|(o, r)| o.starts_with(&r) && o != r);
        if !inside {
            return Err(hostile(
                "object root",
                &object.object_root,
                "it is not a directory inside the storage root".into(),
            ));
        }
        // rocfl quietly strips a leading `/` from inventory paths; read the
        // inventory's own text, so an absolute path is seen and refused.
        let inventory_path = object_root.join("inventory.json");
        let raw: serde_json::Value = std::fs::read(&inventory_path)
            .map_err(|e| io_error(&inventory_path, e))
            .and_then(|bytes| {
                serde_json::from_slice(&bytes).map_err(|e| StorageError::Ocfl {
                    ark: ark.to_string(),
                    detail: format!("the inventory is not JSON: {e}"),
                })
            })?;
        let number = object.version_details.version_num.number;
        let raw_paths = raw["versions"]
            .as_object()
            .and_then(|versions| {
                versions.iter().find(|(k, _)| {
                    k.strip_prefix('v')
                        .and_then(|n| n.parse::<u32>().ok())
                        .is_some_and(|n| n == number)
                })
            })
            .and_then(|(_, v)| v["state"].as_object())
            .into_iter()
            .flat_map(|state| state.values())
            .filter_map(|paths| paths.as_array())
            .flatten()
            .filter_map(|p| p.as_str());
        for logical in raw_paths {
            match crate::paths::normalized_name(logical) {
                Ok(name) if name == logical => {}
                Ok(_) => {
                    return Err(hostile(
                        "logical path",
                        logical,
                        "it is not in normal form".into(),
                    ))
                }
                Err(e) => return Err(hostile("logical path", logical, e.to_string())),
            }
        }
        let fixity = fixity_sha256(&raw);
        let state = version_state(ark, &object_root, number)?;
        let digest_algorithm = object.digest_algorithm.to_string();
        let mut files = Vec::with_capacity(state.len());
        for entry in &state {
            let logical = entry.logical_path.as_str();
            let name = crate::paths::normalized_name(logical)
                .map_err(|e| hostile("logical path", logical, e.to_string()))?;
            if name != logical {
                return Err(hostile(
                    "logical path",
                    logical,
                    "it is not in normal form".into(),
                ));
            }
            let content = entry.content_path.as_str();
            let stored = crate::paths::normalized_name(content)
                .map_err(|e| hostile("content path", content, e.to_string()))?;
            files.push(ContentFile {
                logical_path: name,
                path: object_root.join(stored),
                digest_algorithm: digest_algorithm.clone(),
                digest: entry.digest.to_ascii_lowercase(),
                fixity_sha256: fixity.get(content).cloned(),
            });
        }
        files.sort_by(|a, b| a.logical_path.cmp(&b.logical_path));
        let v = &object.version_details;
        Ok(VersionContent {
            ark: ark.to_string(),
            version: v.version_num.number,
            created: v.created.with_timezone(&Utc),
            user_name: v.user_name.clone(),
            user_address: v.user_address.clone(),
            message: v.message.clone(),
            files,
        })
    }

    /// The head version number of the object, `None` when it does not exist.
    fn head(&self, ark: &str) -> Result<Option<u32>, StorageError> {
        match self.repo.get_object_details(ark, VersionRef::Head) {
            Ok(details) => Ok(Some(details.version_details.version_num.number)),
            Err(RocflError::NotFound(_)) => Ok(None),
            Err(e) => Err(rocfl_error(ark, e)),
        }
    }

    fn object_root(&self, ark: &str) -> Result<PathBuf, StorageError> {
        let details = self
            .repo
            .get_object_details(ark, VersionRef::Head)
            .map_err(|e| rocfl_error(ark, e))?;
        Ok(self.root.join(details.object_root))
    }

    /// Builds the new version in staging: a new object, or the head version
    /// emptied, then every source file copied in (moved, when `moving` and
    /// the object's digests are SHA-512, so that [`Self::staged_files`]
    /// never needs the source again).
    fn stage(
        &self,
        ark: &str,
        source_dir: &Path,
        sources: &[SourceFile],
        exists: bool,
        moving: bool,
    ) -> Result<(), StorageError> {
        let started = if exists {
            self.repo.remove_files(ark, &["*"], true)
        } else {
            self.repo
                .create_object(ark, None, DigestAlgorithm::Sha512, "content", 0)
        };
        started.map_err(|e| rocfl_error(ark, e))?;
        let moving = moving
            && (!exists
                || self
                    .repo
                    .get_staged_object(ark)
                    .map_err(|e| rocfl_error(ark, e))?
                    .digest_algorithm
                    == DigestAlgorithm::Sha512);
        // rocfl maps each top-level entry to a logical path relative to its
        // parent when the destination is the root directory (which always
        // exists), so `source_dir` itself never appears in the paths.
        let tops = top_level(source_dir, sources);
        let added = if moving {
            self.repo.move_files_external(ark, &tops, "/")
        } else {
            self.repo.copy_files_external(ark, &tops, "/", true)
        };
        added.map_err(|e| rocfl_error(ark, e))
    }

    /// The staged state as stored files, checked to be exactly `sources`.
    fn staged_files(
        &self,
        ark: &str,
        source_dir: &Path,
        sources: &[SourceFile],
    ) -> Result<Vec<StoredFile>, StorageError> {
        let staged = self
            .repo
            .get_staged_object(ark)
            .map_err(|e| rocfl_error(ark, e))?;
        let digests: BTreeMap<String, String> = staged
            .state
            .iter()
            .map(|(path, details)| (path.to_string(), details.digest.to_string()))
            .collect();
        check_same_paths(ark, sources, &digests)?;
        let sha512_known = staged.digest_algorithm == DigestAlgorithm::Sha512;
        sources
            .iter()
            .map(|source| {
                let sha512 = match digests.get(&source.logical_path) {
                    Some(digest) if sha512_known => digest.clone(),
                    // An object made elsewhere with another algorithm.
                    _ => sha512_file(&source_dir.join(&source.logical_path))?,
                };
                Ok(StoredFile {
                    logical_path: source.logical_path.clone(),
                    size: source.size,
                    sha512,
                })
            })
            .collect()
    }

    /// Commits the staged version, resolving an error by re-reading the head.
    fn commit(&self, ark: &str, meta: &VersionMeta, version: u32) -> Result<(), StorageError> {
        let result = commit_meta(meta).and_then(|m| self.repo.commit(ark, m, None, false));
        let Err(e) = result else {
            return Ok(());
        };
        let e = self.discard_after(ark, rocfl_error(ark, e));
        match self.head(ark) {
            Ok(Some(head)) if head == version => {
                tracing::warn!(ark, version, error = %e, "OCFL commit reported an error after the version was written; keeping it");
                Ok(())
            }
            _ => Err(e),
        }
    }

    /// Drops the ark's staged version, if any.
    fn discard_staged(&self, ark: &str) -> Result<(), StorageError> {
        self.repo.reset_all(ark).map_err(|e| rocfl_error(ark, e))
    }

    /// Drops the ark's staged version after `error`, which is returned; a
    /// failure to drop it is logged (the next store drops it first anyway).
    fn discard_after(&self, ark: &str, error: StorageError) -> StorageError {
        if let Err(cleanup) = self.discard_staged(ark) {
            tracing::warn!(ark, error = %cleanup, "could not discard the staged OCFL version");
        }
        error
    }
}

/// `sources` as stored files with the SHA-512 of `expected` (empty where
/// it has none, which [`check_digests`] then refuses).
fn expected_files(sources: &[SourceFile], expected: &Checks<'_>) -> Vec<StoredFile> {
    sources
        .iter()
        .map(|s| StoredFile {
            logical_path: s.logical_path.clone(),
            size: s.size,
            sha512: expected
                .sha512
                .get(&s.logical_path)
                .cloned()
                .unwrap_or_default(),
        })
        .collect()
}

/// A file found under the source directory.
#[derive(Debug)]
struct SourceFile {
    logical_path: String,
    size: u64,
}

/// Every regular file under `dir`, sorted by logical path.
fn list_source(dir: &Path) -> Result<Vec<SourceFile>, StorageError> {
    if !dir.is_dir() {
        return Err(StorageError::SourceMissing {
            dir: dir.to_path_buf(),
        });
    }
    let mut files = Vec::new();
    let mut pending = vec![(dir.to_path_buf(), String::new())];
    while let Some((path, prefix)) = pending.pop() {
        for entry in fs::read_dir(&path).map_err(|e| io_error(&path, e))? {
            let entry = entry.map_err(|e| io_error(&path, e))?;
            let logical_path = format!("{prefix}{}", entry_name(&entry.path())?);
            let meta = entry.metadata().map_err(|e| io_error(&entry.path(), e))?;
            if meta.is_dir() {
                pending.push((entry.path(), format!("{logical_path}/")));
            } else if meta.is_file() {
                let size = meta.len();
                files.push(SourceFile { logical_path, size });
            } else {
                return Err(unsupported(
                    &entry.path(),
                    "not a regular file or directory",
                ));
            }
        }
    }
    if files.is_empty() {
        return Err(StorageError::EmptySource {
            dir: dir.to_path_buf(),
        });
    }
    files.sort_by(|a, b| a.logical_path.cmp(&b.logical_path));
    Ok(files)
}

/// The entry's file name as one logical path segment.
fn entry_name(path: &Path) -> Result<&str, StorageError> {
    let name = path.file_name().and_then(|n| n.to_str());
    match name {
        None => Err(unsupported(path, "the name is not UTF-8")),
        // rocfl turns `\` into `/`, which would change the path.
        Some(name) if name.contains('\\') => Err(unsupported(path, "the name holds a `\\`")),
        Some(name) => Ok(name),
    }
}

/// The distinct top-level entries of `sources`, as paths under `source_dir`.
fn top_level(source_dir: &Path, sources: &[SourceFile]) -> Vec<PathBuf> {
    let tops: BTreeSet<&str> = sources
        .iter()
        .filter_map(|s| s.logical_path.split('/').next())
        .collect();
    tops.into_iter().map(|top| source_dir.join(top)).collect()
}

fn check_same_paths(
    ark: &str,
    sources: &[SourceFile],
    staged: &BTreeMap<String, String>,
) -> Result<(), StorageError> {
    let expected: HashSet<&str> = sources.iter().map(|s| s.logical_path.as_str()).collect();
    let missing: Vec<String> = sources
        .iter()
        .filter(|s| !staged.contains_key(&s.logical_path))
        .map(|s| s.logical_path.clone())
        .collect();
    let unexpected: Vec<String> = staged
        .keys()
        .filter(|path| !expected.contains(path.as_str()))
        .cloned()
        .collect();
    if missing.is_empty() && unexpected.is_empty() {
        return Ok(());
    }
    Err(StorageError::StagedMismatch {
        ark: ark.to_string(),
        missing,
        unexpected,
    })
}

/// Compares the staged files' SHA-512 with `expected` (by logical path).
fn check_digests(
    ark: &str,
    expected: &BTreeMap<String, String>,
    staged: &[StoredFile],
) -> Result<(), StorageError> {
    let mut problems = Vec::new();
    for file in staged {
        match expected.get(&file.logical_path) {
            Some(want) if want.eq_ignore_ascii_case(&file.sha512) => {}
            Some(want) => problems.push(format!(
                "{} has SHA-512 {} on disk, not {want}",
                file.logical_path, file.sha512
            )),
            None => problems.push(format!("{} was not expected", file.logical_path)),
        }
    }
    let staged: HashSet<&str> = staged.iter().map(|f| f.logical_path.as_str()).collect();
    for path in expected.keys().filter(|p| !staged.contains(p.as_str())) {
        problems.push(format!("{path} is missing"));
    }
    if problems.is_empty() {
        return Ok(());
    }
    Err(StorageError::DigestMismatch {
        ark: ark.to_string(),
        problems,
    })
}

/// Whether `a` and `b` are on one file system (so a rename moves a file
/// from one to the other); `false` when either cannot be read.
fn same_file_system(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (fs::metadata(a), fs::metadata(b)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev(),
        _ => false,
    }
}

fn sha512_file(path: &Path) -> Result<String, StorageError> {
    let (_, digests) = crate::digest::digest_file(path, &[crate::digest::Algorithm::Sha512])
        .map_err(|e| io_error(path, e))?;
    Ok(digests
        .into_iter()
        .next()
        .map(|(_, hex)| hex)
        .unwrap_or_default())
}

fn commit_meta(meta: &VersionMeta) -> Result<CommitMeta, RocflError> {
    Ok(CommitMeta::new()
        .with_user(Some(meta.user_name.clone()), meta.user_address.clone())?
        .with_message(Some(meta.message.clone()))
        .with_created(Some(meta.created.with_timezone(&Local))))
}

/// Refuses arks rocfl would silently change (it trims object ids) or that
/// cannot be an id.
fn check_ark(ark: &str) -> Result<(), StorageError> {
    let reason = if ark.is_empty() {
        "it is empty"
    } else if ark.trim() != ark {
        "it has leading or trailing white space"
    } else if ark.chars().any(char::is_control) {
        "it holds a control character"
    } else {
        return Ok(());
    };
    Err(StorageError::InvalidArk {
        ark: ark.to_string(),
        reason: reason.to_string(),
    })
}

fn is_absent_or_empty(root: &Path) -> Result<bool, StorageError> {
    match fs::read_dir(root) {
        Ok(mut entries) => Ok(entries.next().is_none()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(true),
        Err(_) if root.exists() && !root.is_dir() => Err(unusable(root, "it is not a directory")),
        Err(e) => Err(io_error(root, e)),
    }
}

fn init_repo(root: &Path, staging: &Path) -> Result<OcflRepo, StorageError> {
    let layout = StorageLayout::new(LayoutExtensionName::HashedNTupleLayout, None)
        .map_err(|e| root_error(root, e))?;
    OcflRepo::init_fs_repo(root, Some(staging), SpecVersion::Ocfl1_1, Some(layout))
        .map_err(|e| root_error(root, e))
}

/// rocfl opens any directory as a repository, so the namaste file and the
/// layout (without which no object can be created) are checked here.
fn check_ocfl_root(root: &Path) -> Result<(), StorageError> {
    let mut has_namaste = false;
    for entry in fs::read_dir(root).map_err(|e| io_error(root, e))? {
        let entry = entry.map_err(|e| io_error(root, e))?;
        has_namaste |= entry.file_name().to_string_lossy().starts_with("0=ocfl_1.");
    }
    if !has_namaste {
        return Err(unusable(
            root,
            "not empty and no OCFL namaste file (0=ocfl_1.x)",
        ));
    }
    if !root.join("ocfl_layout.json").is_file() {
        return Err(unusable(
            root,
            "the OCFL root has no storage layout (ocfl_layout.json)",
        ));
    }
    Ok(())
}

fn rocfl_error(ark: &str, error: RocflError) -> StorageError {
    let ark = ark.to_string();
    match error {
        RocflError::NotFound(detail) => StorageError::NotFound { ark, detail },
        RocflError::LockAcquire(_, lock_file) => StorageError::Busy { ark, lock_file },
        RocflError::CopyMoveError(problems) => StorageError::Copy {
            ark,
            problems: problems.0,
        },
        RocflError::Io(source) => StorageError::Io {
            context: format!("object {ark}"),
            source,
        },
        other => StorageError::Ocfl {
            ark,
            detail: other.to_string(),
        },
    }
}

fn root_error(root: &Path, error: RocflError) -> StorageError {
    match error {
        RocflError::Io(source) => io_error(root, source),
        other => unusable(root, &other.to_string()),
    }
}

fn not_found(ark: &str) -> StorageError {
    StorageError::NotFound {
        ark: ark.to_string(),
        detail: String::new(),
    }
}

/// What is missing, said once: rocfl's detail repeats the object (`Object
/// ARK version v3 path a.txt`), which the message quoted after naming the
/// object itself ("not found in object ARK: Object ARK …").
fn missing(ark: &str, detail: &str) -> String {
    let rest = detail
        .strip_prefix("Object ")
        .and_then(|d| d.strip_prefix(ark))
        .map(str::trim);
    match rest {
        _ if detail.is_empty() => format!("object {ark} does not exist"),
        Some("") => format!("object {ark} does not exist"),
        Some(rest) => match rest.strip_prefix("version ") {
            Some(v) => match v.split_once(" path ") {
                Some((version, path)) => {
                    format!("object {ark} has no file {path} in version {version}")
                }
                None => format!("object {ark} has no version {v}"),
            },
            None => format!("not found in object {ark}: {rest}"),
        },
        None => format!("not found in object {ark}: {detail}"),
    }
}

fn unusable(dir: &Path, reason: &str) -> StorageError {
    StorageError::UnusableRoot {
        dir: dir.to_path_buf(),
        reason: reason.to_string(),
    }
}

fn unsupported(path: &Path, reason: &str) -> StorageError {
    StorageError::UnsupportedEntry {
        path: path.to_path_buf(),
        reason: reason.to_string(),
    }
}

fn io_error(path: &Path, source: io::Error) -> StorageError {
    StorageError::Io {
        context: path.display().to_string(),
        source,
    }
}

/// The arks being stored, so that two stores of one ark run one after the
/// other. The set holds only the arks in progress, so it stays small.
#[derive(Default)]
struct ArkLocks {
    busy: Mutex<HashSet<String>>,
    freed: Condvar,
}

struct ArkGuard<'a> {
    locks: &'a ArkLocks,
    ark: String,
}

impl ArkLocks {
    fn lock(&self, ark: &str) -> ArkGuard<'_> {
        // A panic while the set is locked cannot leave it inconsistent (each
        // guard removes its own ark on drop), so poisoning is ignored.
        let mut busy = self.busy.lock().unwrap_or_else(PoisonError::into_inner);
        while busy.contains(ark) {
            busy = self
                .freed
                .wait(busy)
                .unwrap_or_else(PoisonError::into_inner);
        }
        busy.insert(ark.to_string());
        ArkGuard {
            locks: self,
            ark: ark.to_string(),
        }
    }
}

impl Drop for ArkGuard<'_> {
    fn drop(&mut self) {
        let mut busy = self
            .locks
            .busy
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        busy.remove(&self.ark);
        self.locks.freed.notify_all();
    }
}

/// One file of a version's state, read from the inventory's own text.
#[derive(Debug, Clone, PartialEq, Eq)]
struct StateEntry {
    logical_path: String,
    /// Relative to the object root.
    content_path: String,
    /// As the inventory spells it.
    digest: String,
}

/// The parts of an inventory [`version_state`] reads.
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawInventory {
    #[serde(default)]
    content_directory: Option<String>,
    manifest: HashMap<String, Vec<String>>,
    versions: HashMap<String, RawVersion>,
}

#[derive(serde::Deserialize)]
struct RawVersion {
    state: BTreeMap<String, Vec<String>>,
}

/// The number of an OCFL version directory name (`v3`, `v003`).
fn version_number(name: &str) -> Option<u32> {
    name.strip_prefix('v')?.parse().ok()
}

/// Every file of `version` of the object at `object_root`, with the
/// content path that holds it, in time linear in the inventory's size.
///
/// rocfl's `get_object` resolves each logical path with
/// `content_path_for_digest`, which walks every content path of the
/// file's digest: a version of N files with one content is N² steps (issue
/// 25: 30,000 one-byte files took 107 s). Here every content path is put
/// in a set once; a logical path's own content path
/// (`vK/CONTENT/LOGICAL`, K ≤ version) is a lookup, and only a
/// deduplicated file takes its digest's first content path of a version
/// up to `version` (rocfl's rule).
///
/// # Errors
/// [`StorageError::Io`] when the inventory cannot be read,
/// [`StorageError::Ocfl`] when it is not an inventory or lacks the version
/// or a digest.
/// The inventory's `sha256` fixity block (OCFL 1.1 §3.5.4) as content path
/// → digest (lower-case). An entry whose digest is not 64 hexadecimal
/// digits is left out (its file is then checked against the manifest's
/// digest), as is a block that is not the shape OCFL gives it.
fn fixity_sha256(inventory: &serde_json::Value) -> std::collections::HashMap<&str, String> {
    let mut by_path = std::collections::HashMap::new();
    let Some(block) = inventory["fixity"][direct::FIXITY].as_object() else {
        return by_path;
    };
    for (digest, paths) in block {
        if !crate::digest::Algorithm::Sha256.is_digest(digest) {
            continue;
        }
        for path in paths
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|p| p.as_str())
        {
            by_path.insert(path, digest.to_ascii_lowercase());
        }
    }
    by_path
}

fn version_state(
    ark: &str,
    object_root: &Path,
    version: u32,
) -> Result<Vec<StateEntry>, StorageError> {
    let path = object_root.join("inventory.json");
    let bytes = fs::read(&path).map_err(|e| io_error(&path, e))?;
    let corrupt = |detail: String| StorageError::Ocfl {
        ark: ark.to_string(),
        detail,
    };
    let inventory: RawInventory = serde_json::from_slice(&bytes)
        .map_err(|e| corrupt(format!("the inventory cannot be read: {e}")))?;
    let content_dir = inventory.content_directory.as_deref().unwrap_or("content");
    let state = inventory
        .versions
        .iter()
        .find(|(name, _)| version_number(name) == Some(version))
        .map(|(_, v)| &v.state)
        .ok_or_else(|| corrupt(format!("the inventory has no version {version}")))?;
    let in_version = |content: &str| {
        content
            .split('/')
            .next()
            .and_then(version_number)
            .filter(|k| *k <= version)
    };
    // Each content path under the logical path and digest it was stored
    // for (`vK/CONTENT/LOGICAL`), the newest version up to `version` kept.
    let mut own: HashMap<(&str, &str), (u32, &str)> = HashMap::new();
    for (digest, content) in inventory
        .manifest
        .iter()
        .flat_map(|(d, ps)| ps.iter().map(move |p| (d.as_str(), p.as_str())))
    {
        let Some(k) = in_version(content) else {
            continue;
        };
        let logical = content
            .split_once('/')
            .and_then(|(_, rest)| rest.strip_prefix(content_dir))
            .and_then(|rest| rest.strip_prefix('/'));
        if let Some(logical) = logical {
            let kept = own.entry((logical, digest)).or_insert((k, content));
            if k > kept.0 {
                *kept = (k, content);
            }
        }
    }
    let mut entries = Vec::new();
    for (digest, logicals) in state {
        let first = inventory
            .manifest
            .get(digest)
            .and_then(|ps| ps.iter().find(|p| in_version(p).is_some()));
        for logical in logicals {
            let own = own
                .get(&(logical.as_str(), digest.as_str()))
                .map(|(_, p)| (*p).to_string());
            let content_path = match (own, first) {
                (Some(own), _) => own,
                (None, Some(first)) => first.clone(),
                (None, None) => {
                    return Err(corrupt(format!(
                        "the digest of {:?} is not in the manifest",
                        ingest_protocol::cut(logical, 200)
                    )))
                }
            };
            entries.push(StateEntry {
                logical_path: logical.clone(),
                content_path,
                digest: digest.clone(),
            });
        }
    }
    entries.sort_by(|a, b| a.logical_path.cmp(&b.logical_path));
    Ok(entries)
}

#[cfg(test)]
mod state_tests {
    use super::*;

    fn inventory(dir: &Path, text: &str) {
        fs::write(dir.join("inventory.json"), text).expect("written");
    }

    // Regression (issue 25, finding 2): the state is read from the
    // inventory with one lookup per file, and each logical path still gets
    // the content path rocfl would give it: its own when stored under its
    // name (the newest up to the version, with the same digest), else its
    // digest's first.
    #[test]
    fn each_file_gets_its_own_content_path_or_its_digests_first() {
        let dir = tempfile::tempdir().expect("dir");
        inventory(
            dir.path(),
            r#"{"contentDirectory":"content",
                "manifest":{
                  "aa":["v1/content/a","v1/content/b","v1/content/c"],
                  "bb":["v2/content/a"]},
                "versions":{
                  "v1":{"state":{"aa":["a","b","c"]}},
                  "v2":{"state":{"bb":["a"],"aa":["b","c","d"]}},
                  "v3":{"state":{"aa":["a"]}}}}"#,
        );
        let read = |v| {
            version_state("ark:/1/x", dir.path(), v)
                .expect("read")
                .into_iter()
                .map(|e| (e.logical_path, e.content_path, e.digest))
                .collect::<Vec<_>>()
        };
        let e = |l: &str, c: &str, d: &str| (l.to_string(), c.to_string(), d.to_string());
        assert_eq!(
            read(1),
            vec![
                e("a", "v1/content/a", "aa"),
                e("b", "v1/content/b", "aa"),
                e("c", "v1/content/c", "aa")
            ]
        );
        assert_eq!(
            read(2),
            vec![
                e("a", "v2/content/a", "bb"),
                e("b", "v1/content/b", "aa"),
                e("c", "v1/content/c", "aa"),
                e("d", "v1/content/a", "aa")
            ]
        );
        // `a` went back to its first content: v1's file, not v2's.
        assert_eq!(read(3), vec![e("a", "v1/content/a", "aa")]);
        assert!(matches!(
            version_state("ark:/1/x", dir.path(), 4),
            Err(StorageError::Ocfl { .. })
        ));
    }
}
