//! A file's identity and last change, to tell whether its bytes can have
//! changed since they were hashed without reading them again.
//!
//! The download step hashes each file as it writes it and records its
//! [`FileStamp`] (device, inode, size, modification and status-change
//! times, in nanoseconds) once the file is in place. Any write through the
//! file system moves the status-change time (`ctime`), which no system call
//! lets a process set, and replacing the file changes its inode; so a file
//! whose stamp is still the recorded one holds the bytes that were hashed,
//! short of a change below the file system (a raw device write, a memory
//! error). The storing step reads again only the files whose stamp moved:
//! under `tools/load --mode real` the re-read of every file was a sixth of
//! the worker's CPU.
//!
//! ```
//! use ingest_steps::stamp::FileStamp;
//!
//! let dir = tempfile::tempdir().unwrap();
//! let path = dir.path().join("a");
//! std::fs::write(&path, b"one").unwrap();
//! let stamp = FileStamp::of_path(&path).unwrap();
//! assert!(stamp.matches(&path));
//! std::fs::write(&path, b"two").unwrap();
//! assert!(!stamp.matches(&path));
//! ```

use std::fs::Metadata;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use serde::{Deserialize, Serialize};

/// What a file's metadata says about its bytes: which file it is and when
/// it last changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileStamp {
    /// The file system's device number.
    pub dev: u64,
    /// The inode number.
    pub ino: u64,
    /// The size in bytes.
    pub size: u64,
    /// The last modification, nanoseconds since the epoch.
    pub mtime_ns: i64,
    /// The last status change (a write, a rename, a link, a change of
    /// mode), nanoseconds since the epoch.
    pub ctime_ns: i64,
}

impl FileStamp {
    /// The stamp of a regular file's metadata; `None` for anything else.
    pub fn of(meta: &Metadata) -> Option<FileStamp> {
        if !meta.is_file() {
            return None;
        }
        let ns = |secs: i64, nanos: i64| secs.saturating_mul(1_000_000_000).saturating_add(nanos);
        Some(FileStamp {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.len(),
            mtime_ns: ns(meta.mtime(), meta.mtime_nsec()),
            ctime_ns: ns(meta.ctime(), meta.ctime_nsec()),
        })
    }

    /// The stamp of the regular file at `path` (a symbolic link is not
    /// followed).
    ///
    /// # Errors
    /// The error of reading the metadata; [`io::ErrorKind::InvalidInput`]
    /// when `path` is not a regular file.
    pub fn of_path(path: &Path) -> io::Result<FileStamp> {
        let meta = std::fs::symlink_metadata(path)?;
        FileStamp::of(&meta).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} is not a regular file", path.display()),
            )
        })
    }

    /// Whether the file at `path` still has this stamp; `false` when it
    /// cannot be read.
    pub fn matches(&self, path: &Path) -> bool {
        FileStamp::of_path(path).is_ok_and(|now| now == *self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rename_a_link_or_a_rewrite_of_the_same_bytes_moves_the_stamp() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"bytes").unwrap();
        let stamp = FileStamp::of_path(&path).unwrap();
        assert!(stamp.matches(&path), "reading the metadata changes nothing");
        let _ = std::fs::read(&path).unwrap();
        assert!(stamp.matches(&path), "reading the bytes changes nothing");

        // The same bytes written again: the times move.
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(&path, b"bytes").unwrap();
        assert!(!stamp.matches(&path), "a rewrite moves mtime and ctime");

        // A hard link changes only the status-change time.
        let stamp = FileStamp::of_path(&path).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::hard_link(&path, dir.path().join("g")).unwrap();
        let linked = FileStamp::of_path(&path).unwrap();
        assert_eq!((linked.ino, linked.mtime_ns), (stamp.ino, stamp.mtime_ns));
        assert_ne!(linked.ctime_ns, stamp.ctime_ns, "a link moves ctime");

        // Another file put in its place: another inode.
        let other = dir.path().join("h");
        std::fs::write(&other, b"bytes").unwrap();
        let stamp = FileStamp::of_path(&path).unwrap();
        std::fs::rename(&other, &path).unwrap();
        assert!(!stamp.matches(&path));
    }

    #[test]
    fn a_missing_file_or_a_directory_has_no_stamp() {
        let dir = tempfile::tempdir().unwrap();
        assert!(FileStamp::of_path(&dir.path().join("none")).is_err());
        let err = FileStamp::of_path(dir.path()).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        let stamp = FileStamp {
            dev: 0,
            ino: 0,
            size: 0,
            mtime_ns: 0,
            ctime_ns: 0,
        };
        assert!(!stamp.matches(&dir.path().join("none")));
    }
}
