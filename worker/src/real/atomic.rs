//! The one atomic file write of the real steps: the ERC, Dublin Core,
//! manifest and signature files Processing writes, the markers Storing
//! writes, and the e-mails the outbox keeps. Below every step, so that none
//! imports another for it.

use std::io::{self, Write};
use std::path::Path;

/// Writes `bytes` to `path` through the temporary file `tmp` (on the same
/// file system), synced before it is renamed into place: a crash leaves
/// either the old file, or none, or the whole new one at `path`, never a
/// partial one. The temporary file is removed when the write fails.
pub(crate) fn write_atomically(tmp: &Path, path: &Path, bytes: &[u8]) -> io::Result<()> {
    let written = (|| {
        let mut file = std::fs::File::create(tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(tmp, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(tmp);
    }
    written
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_the_whole_file_and_leaves_no_temporary() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (tmp, path) = (dir.path().join(".a.tmp"), dir.path().join("a"));
        std::fs::write(&path, b"old").expect("old");
        write_atomically(&tmp, &path, b"new").expect("write");
        assert_eq!(std::fs::read(&path).expect("read"), b"new");
        assert!(!tmp.exists());
    }

    #[test]
    fn a_failed_write_keeps_the_old_file_and_removes_the_temporary() {
        let dir = tempfile::tempdir().expect("tempdir");
        let tmp = dir.path().join(".a.tmp");
        // The target is a non-empty directory: the rename fails after the
        // temporary file was written.
        let path = dir.path().join("a");
        std::fs::create_dir(&path).expect("dir");
        std::fs::write(path.join("x"), b"x").expect("x");
        let err = write_atomically(&tmp, &path, b"new").expect_err("refused");
        assert!(!tmp.exists(), "{err}");
        assert!(path.join("x").exists());
    }
}
