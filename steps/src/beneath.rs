//! Opening a file below a directory without following any symbolic link on
//! the way: for files whose path comes from data someone else could have
//! written (an OCFL inventory, a storage root another process writes), so a
//! link planted inside cannot lead the reader out of it.
//!
//! On Linux 5.6 and later this is one `openat2` with `RESOLVE_BENEATH` and
//! `RESOLVE_NO_SYMLINKS`; where `openat2` is missing it opens component by
//! component with `O_NOFOLLOW`.
//!
//! ```no_run
//! use std::path::Path;
//! let file = ingest_steps::beneath::open_file(Path::new("/srv/store"), Path::new("obj/v1/content/a.txt"))?;
//! # Ok::<(), std::io::Error>(())
//! ```

use std::fs::File;
use std::io;
use std::path::{Component, Path};

use rustix::fs::{Mode, OFlags, ResolveFlags};

/// Opens `relative` below `root` for reading, following no symbolic link in
/// `relative` (the root itself is the caller's and may be one).
///
/// # Errors
/// An `io::Error` of the open; a symbolic link on the way is `ELOOP` (or
/// `EXDEV` from `openat2`), and a `relative` that is absolute or has a `..`
/// is `InvalidInput`. Both say the same to a caller: refused.
pub fn open_file(root: &Path, relative: &Path) -> io::Result<File> {
    let mut names = Vec::new();
    for c in relative.components() {
        match c {
            Component::Normal(n) => names.push(n),
            Component::CurDir => {}
            _ => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "the path is not a plain relative path",
                ))
            }
        }
    }
    if names.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "the path is empty",
        ));
    }
    let dir = rustix::fs::open(
        root,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let file_flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    match rustix::fs::openat2(
        &dir,
        relative,
        file_flags,
        Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS,
    ) {
        Ok(fd) => Ok(File::from(fd)),
        Err(e) if e == rustix::io::Errno::NOSYS => by_components(dir, &names),
        Err(e) => Err(e.into()),
    }
}

/// Without openat2: one component at a time from `dir`, none of them a link.
fn by_components(mut dir: rustix::fd::OwnedFd, names: &[&std::ffi::OsStr]) -> io::Result<File> {
    let file_flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let Some((last, parents)) = names.split_last() else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "the path is empty",
        ));
    };
    for name in parents {
        dir = rustix::fs::openat(
            &dir,
            *name,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
    }
    Ok(File::from(rustix::fs::openat(
        &dir,
        *last,
        file_flags,
        Mode::empty(),
    )?))
}

/// Whether `e` is what [`open_file`] answers for a symbolic link on the way.
pub fn is_link_refused(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(code) if code == rustix::io::Errno::LOOP.raw_os_error()
            || code == rustix::io::Errno::XDEV.raw_os_error()
            || code == rustix::io::Errno::NOTDIR.raw_os_error()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_link_anywhere_on_the_way_is_refused_and_a_plain_file_opens() {
        let dir = tempfile::tempdir().expect("tempdir");
        let outside = tempfile::tempdir().expect("tempdir");
        std::fs::write(outside.path().join("secret"), b"secret").expect("write");
        let root = dir.path();
        std::fs::create_dir_all(root.join("obj/v1")).expect("dirs");
        std::fs::write(root.join("obj/v1/a.txt"), b"a").expect("write");
        std::os::unix::fs::symlink(outside.path().join("secret"), root.join("obj/v1/link"))
            .expect("link");
        std::os::unix::fs::symlink(outside.path(), root.join("obj/out")).expect("link");
        std::os::unix::fs::symlink("a.txt", root.join("obj/v1/inside")).expect("link");
        let read = |p: &str| {
            let mut s = String::new();
            io::Read::read_to_string(&mut open_file(root, Path::new(p))?, &mut s)?;
            Ok::<_, io::Error>(s)
        };
        assert_eq!(read("obj/v1/a.txt").expect("plain"), "a");
        for p in ["obj/v1/link", "obj/out/secret", "obj/v1/inside"] {
            let e = read(p).expect_err(p);
            assert!(is_link_refused(&e), "{p}: {e}");
        }
        for p in ["../x", "/etc/passwd", ""] {
            assert!(read(p).is_err(), "{p}");
        }
        // The fallback for kernels without openat2 refuses the same links.
        let fallback = |p: &str| {
            let names: Vec<&std::ffi::OsStr> = Path::new(p).iter().collect();
            let dir = rustix::fs::open(root, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())?;
            by_components(dir, &names)
        };
        assert!(fallback("obj/v1/a.txt").is_ok());
        for p in ["obj/v1/link", "obj/out/secret", "obj/v1/inside"] {
            let e = fallback(p).expect_err(p);
            assert!(is_link_refused(&e), "{p}: {e}");
        }
    }
}
