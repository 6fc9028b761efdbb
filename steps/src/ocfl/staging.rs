//! Staging that belongs to one [`OcflTarget`](super::OcflTarget), so that
//! many processes (on one machine or many, over a shared file system) can
//! store into one storage root at once.
//!
//! Layout under `<root>/extensions/rocfl-staging/`:
//!
//! - `proc-<pid>-<random>.lock`: the owner's lock file, held with an
//!   exclusive `flock` for the target's whole life. The kernel (or the NFS
//!   lock manager) releases it when the process ends, however it ends, so a
//!   lock that can be taken is proof that its owner is gone.
//! - `proc-<pid>-<random>/`: the owner's rocfl staging root (staged versions
//!   and rocfl's own per-object lock files, which therefore never block
//!   another process).
//! - `ark-locks/<xyz>.lock`: 4,096 shared lock files, one taken (`flock`,
//!   blocking) around each store of an ark whose hash starts with `xyz`, so
//!   two processes never commit versions of one object at once.
//!
//! A target removes its own staging when dropped, and the staging of owners
//! proven gone when it claims its own. Anything else found there is the
//! single shared staging of earlier versions of `ingest` and is removed too.
//! A live owner's staging is never touched.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};

use rustix::fs::{flock, FlockOperation};
use sha2::{Digest, Sha512};

/// The prefix of every per-owner entry.
const PREFIX: &str = "proc-";
/// The directory of the shared per-ark lock files.
const ARK_LOCKS: &str = "ark-locks";

/// One target's own staging directory and the lock that proves it alive.
pub(super) struct Staging {
    dir: PathBuf,
    lock_path: PathBuf,
    /// Holds the exclusive `flock` until drop.
    _owner: File,
}

/// A fresh owner name: the process id (for operators reading the
/// directory) and 64 random bits (several targets per process, pid reuse).
pub(super) fn new_owner_name() -> String {
    let mut random = [0u8; 8];
    // Without randomness the pid and the time still tell owners apart.
    if getrandom::getrandom(&mut random).is_err() {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        random = (nanos as u64).to_le_bytes();
    }
    format!("{PREFIX}{}-{}", std::process::id(), hex::encode(random))
}

impl Staging {
    /// Claims `parent/name` as this owner's staging and removes the staging
    /// of owners proven gone.
    pub(super) fn claim(parent: &Path, name: &str) -> io::Result<Staging> {
        fs::create_dir_all(parent)?;
        let lock_path = parent.join(format!("{name}.lock"));
        let mut attempts = 0;
        let owner = loop {
            attempts += 1;
            match take_fresh_lock(parent, name, &lock_path) {
                Ok(owner) => break owner,
                // A sweeper took the half-made lock file for a dead one.
                Err(e) if attempts < 5 && e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        };
        let dir = parent.join(name);
        fs::create_dir_all(&dir)?;
        sweep(parent, name);
        Ok(Staging {
            dir,
            lock_path,
            _owner: owner,
        })
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        // The directory first, then the lock (still held): a sweeper never
        // sees a lock-less directory of a live owner.
        if let Err(e) = remove_dir_if_present(&self.dir) {
            tracing::warn!(dir = %self.dir.display(), error = %e, "could not remove this process's OCFL staging");
        }
        if let Err(e) = fs::remove_file(&self.lock_path) {
            if e.kind() != io::ErrorKind::NotFound {
                tracing::warn!(file = %self.lock_path.display(), error = %e, "could not remove this process's staging lock");
            }
        }
    }
}

/// Creates `name.lock.new`, locks it, then renames it to `name.lock`, so a
/// `.lock` file is always locked by a live owner or by nobody.
fn take_fresh_lock(parent: &Path, name: &str, lock_path: &Path) -> io::Result<File> {
    let fresh = parent.join(format!("{name}.lock.new"));
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&fresh)?;
    if !try_lock(&file)? {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            "a sweeper holds the fresh lock file",
        ));
    }
    fs::rename(&fresh, lock_path)?;
    Ok(file)
}

/// Removes every entry of `parent` that belongs to no live owner.
fn sweep(parent: &Path, own: &str) {
    let entries = match fs::read_dir(parent) {
        Ok(entries) => entries,
        Err(e) => {
            tracing::warn!(dir = %parent.display(), error = %e, "could not list OCFL staging");
            return;
        }
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name == ARK_LOCKS || name == own || name.starts_with(&format!("{own}.")) {
            continue;
        }
        let path = entry.path();
        let result = if let Some(owner) = owner_of_lock(&name) {
            sweep_owner(parent, owner, &path)
        } else if name.starts_with(PREFIX) {
            // A directory: its owner's lock file decides (swept with it).
            if parent.join(format!("{name}.lock")).exists() {
                Ok(())
            } else {
                remove_entry(&path)
            }
        } else {
            // The shared staging of earlier versions.
            remove_entry(&path)
        };
        if let Err(e) = result {
            tracing::warn!(entry = %path.display(), error = %e, "could not remove stale OCFL staging");
        }
    }
}

/// The owner named by a lock file name, `None` when `name` is not one.
fn owner_of_lock(name: &str) -> Option<&str> {
    if !name.starts_with(PREFIX) {
        return None;
    }
    name.strip_suffix(".lock")
        .or_else(|| name.strip_suffix(".lock.new"))
}

/// Removes `owner`'s staging when its lock file can be taken (the owner is
/// gone); leaves it when the lock is held.
fn sweep_owner(parent: &Path, owner: &str, lock_path: &Path) -> io::Result<()> {
    let file = match File::open(lock_path) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    if !try_lock(&file)? {
        return Ok(());
    }
    tracing::info!(owner, "removing the OCFL staging of a process that is gone");
    remove_dir_if_present(&parent.join(owner))?;
    match fs::remove_file(lock_path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

fn remove_entry(path: &Path) -> io::Result<()> {
    let result = if path.is_dir() {
        fs::remove_dir_all(path)
    } else {
        fs::remove_file(path)
    };
    match result {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

fn remove_dir_if_present(dir: &Path) -> io::Result<()> {
    match fs::remove_dir_all(dir) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Takes the shared lock of `ark`'s bucket under `parent`, blocking until
/// another process's store of an ark of that bucket ends. Released on drop
/// (or when the process ends).
pub(super) fn lock_ark(parent: &Path, ark: &str) -> io::Result<File> {
    let dir = parent.join(ARK_LOCKS);
    fs::create_dir_all(&dir)?;
    let bucket = &hex::encode(Sha512::digest(ark.as_bytes()))[..3];
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(dir.join(format!("{bucket}.lock")))?;
    flock(&file, FlockOperation::LockExclusive)?;
    Ok(file)
}

/// Takes an exclusive `flock` on `file` without waiting: `false` when
/// another open file holds it.
fn try_lock(file: &File) -> io::Result<bool> {
    match flock(file, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(true),
        Err(rustix::io::Errno::WOULDBLOCK) => Ok(false),
        Err(e) => Err(e.into()),
    }
}
