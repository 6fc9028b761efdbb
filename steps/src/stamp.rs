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
//! Timestamps come from a clock that ticks every few milliseconds, so a
//! second change within the tick of the first can leave both times as
//! they were. Linux 6.13 and later give ext4, XFS, btrfs and tmpfs
//! *multigrain* timestamps: once a file's times have been read (as taking
//! its stamp does), its next change gets a fine-grained time, later than
//! the one read. A stamp is therefore only worth recording where
//! [`changes_always_seen`] says so; elsewhere the caller reads the bytes
//! again.
//!
//! ```
//! use ingest_steps::stamp::FileStamp;
//!
//! let dir = tempfile::tempdir().unwrap();
//! let path = dir.path().join("a");
//! std::fs::write(&path, b"one").unwrap();
//! let stamp = FileStamp::of_path(&path).unwrap();
//! assert!(stamp.matches(&path));
//! // Another file put in its place, with the same size.
//! std::fs::write(dir.path().join("b"), b"two").unwrap();
//! std::fs::rename(dir.path().join("b"), &path).unwrap();
//! assert!(!stamp.matches(&path));
//! ```

use std::fs::Metadata;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::OnceLock;

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

/// The first kernel with multigrain timestamps.
const MULTIGRAIN_KERNEL: (u32, u32) = (6, 13);

/// The file systems that have them there (`statfs(2)`'s `f_type`): ext4
/// (also serving ext2 and ext3), XFS, btrfs and tmpfs.
const MULTIGRAIN_FILE_SYSTEMS: [u64; 4] = [0xEF53, 0x5846_5342, 0x9123_683E, 0x0102_1994];

/// Whether every change to a file on the file system holding `path`, made
/// after its stamp was taken, moves the stamp: a Linux kernel with
/// multigrain timestamps ([`MULTIGRAIN_KERNEL`] or later) and one of the
/// file systems that use them. `false` when either cannot be told.
pub fn changes_always_seen(path: &Path) -> bool {
    static KERNEL: OnceLock<bool> = OnceLock::new();
    let kernel = *KERNEL.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .ok()
            .and_then(|release| kernel_version(&release))
            .is_some_and(|v| v >= MULTIGRAIN_KERNEL)
    });
    kernel
        && rustix::fs::statfs(path).is_ok_and(|fs| {
            u64::try_from(fs.f_type).is_ok_and(|t| MULTIGRAIN_FILE_SYSTEMS.contains(&t))
        })
}

/// The major and minor numbers of a kernel release (`6.18.44-fc-v657`).
fn kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.trim().split(['.', '-']);
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
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
    fn kernel_releases_are_read_by_major_and_minor() {
        assert_eq!(kernel_version("6.18.44-fc-v657\n"), Some((6, 18)));
        assert_eq!(kernel_version("5.14.0-427.el9.x86_64"), Some((5, 14)));
        assert_eq!(kernel_version("6.13"), Some((6, 13)));
        assert_eq!(kernel_version("linux"), None);
        assert!(kernel_version("5.14.0").unwrap() < MULTIGRAIN_KERNEL);
        assert!(kernel_version("6.13.1").unwrap() >= MULTIGRAIN_KERNEL);
    }

    #[test]
    fn where_changes_are_always_seen_a_change_right_after_the_stamp_moves_it() {
        // Without a pause: within one tick of the clock a coarse timestamp
        // would stay as it was.
        let dir = tempfile::tempdir().unwrap();
        if !changes_always_seen(dir.path()) {
            // An older kernel or another file system: callers read again.
            return;
        }
        let path = dir.path().join("f");
        for round in 0..100 {
            std::fs::write(&path, b"aaaa").unwrap();
            let stamp = FileStamp::of_path(&path).unwrap();
            std::fs::write(&path, b"bbbb").unwrap();
            assert!(
                !stamp.matches(&path),
                "round {round}: the change went unseen"
            );
        }
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
