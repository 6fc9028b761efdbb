//! Large files read and hashed ahead on threads of their own while the
//! container is written: checking each file's digest is the slowest part
//! of an assembly (one core hashes SHA-512 at about 300–530 MiB/s and
//! SHA-256, on the CPU's SHA extensions, at about 1,200 MiB/s, where `tar`
//! copies at 500–700 MiB/s), so each large file is read and hashed by a
//! thread of its own, the next one's while the current one is written, and
//! the container's writer takes the chunks as they come. Two files are
//! hashed at once on two cores; what is held is bounded by [`IN_FLIGHT`]
//! chunks a file, never by the object's size. Small files are hashed
//! inline, where a thread would cost more than it saves.

use std::fs::File;
use std::io::{self, Read};
use std::path::PathBuf;
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::thread::JoinHandle;

use crate::digest::{Algorithm, MultiHasher};

/// Files at least this long are read ahead on a thread.
pub(crate) const AHEAD_FROM: u64 = 4 << 20;

/// The size of a chunk read ahead.
const CHUNK: usize = 1 << 20;

/// Chunks of one file read ahead and not yet written, at most.
const IN_FLIGHT: usize = 4;

/// One large file being read and hashed by its thread: a reader of its
/// bytes, in order, and at the end the count and digest of what the
/// thread read.
pub(crate) struct Ahead {
    chunks: Receiver<io::Result<Vec<u8>>>,
    /// Chunks written, sent back for the thread to read into again: the
    /// same few buffers go round instead of one allocated by the thread
    /// and freed by the writer per MiB (which an allocator with per-thread
    /// heaps, such as the binary's mimalloc, returns late).
    spent: SyncSender<Vec<u8>>,
    thread: Option<JoinHandle<(u64, String)>>,
    current: Vec<u8>,
    at: usize,
}

impl Ahead {
    /// Starts reading at most `size` bytes of `path`, hashing them with
    /// `algorithm`.
    pub(crate) fn start(path: PathBuf, size: u64, algorithm: Algorithm) -> io::Result<Ahead> {
        let (to, chunks) = mpsc::sync_channel::<io::Result<Vec<u8>>>(IN_FLIGHT);
        let (spent, spare) = mpsc::sync_channel::<Vec<u8>>(IN_FLIGHT);
        let thread = std::thread::Builder::new()
            .name("assemble-read".into())
            .spawn(move || {
                let mut hasher = MultiHasher::new(&[algorithm]);
                let mut n = 0u64;
                let mut file = match File::open(&path) {
                    Ok(f) => f.take(size),
                    Err(e) => {
                        let _ = to.send(Err(e));
                        return (n, String::new());
                    }
                };
                loop {
                    // A whole chunk (or the end): fewer, larger messages.
                    let mut chunk = match spare.try_recv() {
                        Ok(mut used) => {
                            used.clear();
                            used
                        }
                        Err(_) => Vec::with_capacity(CHUNK),
                    };
                    let filled = match (&mut file).take(CHUNK as u64).read_to_end(&mut chunk) {
                        Ok(k) => k,
                        Err(e) => {
                            let _ = to.send(Err(e));
                            return (n, String::new());
                        }
                    };
                    if filled == 0 {
                        break;
                    }
                    hasher.update(&chunk);
                    n += filled as u64;
                    if to.send(Ok(chunk)).is_err() {
                        // The assembly gave up on this file.
                        return (n, String::new());
                    }
                }
                let hex = hasher
                    .finish()
                    .into_iter()
                    .next()
                    .map(|(_, hex)| hex)
                    .unwrap_or_default();
                (n, hex)
            })?;
        Ok(Ahead {
            chunks,
            spent,
            thread: Some(thread),
            current: Vec::new(),
            at: 0,
        })
    }

    /// The bytes the thread read and their digest (lower-case
    /// hexadecimal), once every byte was taken.
    pub(crate) fn finish(mut self) -> io::Result<(u64, String)> {
        self.thread
            .take()
            .ok_or_else(|| io::Error::other("finished twice"))?
            .join()
            .map_err(|_| io::Error::other("the reading thread panicked"))
    }
}

impl Read for Ahead {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.at == self.current.len() {
            match self.chunks.recv() {
                Ok(Ok(chunk)) => {
                    let used = std::mem::replace(&mut self.current, chunk);
                    if used.capacity() > 0 {
                        // Dropped when the thread has enough spares.
                        let _ = self.spent.try_send(used);
                    }
                    self.at = 0;
                }
                Ok(Err(e)) => return Err(e),
                // The thread is done: the end of the file.
                Err(_) => return Ok(0),
            }
        }
        let rest = self.current.get(self.at..).unwrap_or_default();
        let k = rest.len().min(buf.len());
        buf[..k].copy_from_slice(&rest[..k]);
        self.at += k;
        Ok(k)
    }
}

impl std::fmt::Debug for Ahead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ahead").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_read_ahead_gives_its_bytes_and_the_digest_inline_hashing_gives() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("f");
        let bytes: Vec<u8> = (0..3_500_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &bytes).expect("write");
        for algorithm in [Algorithm::Sha512, Algorithm::Sha256, Algorithm::Md5] {
            // Read in small pieces, as a container writer copies.
            let mut ahead = Ahead::start(path.clone(), 3_000_000, algorithm).expect("thread");
            let mut read = Vec::new();
            let mut piece = [0u8; 8192];
            loop {
                let k = ahead.read(&mut piece).expect("read");
                if k == 0 {
                    break;
                }
                read.extend_from_slice(&piece[..k]);
            }
            assert_eq!(read, bytes[..3_000_000]);
            let (n, digest) = ahead.finish().expect("finish");
            let mut inline = MultiHasher::new(&[algorithm]);
            inline.update(&bytes[..3_000_000]);
            let want = inline.finish().into_iter().next().expect("one").1;
            assert_eq!((n, digest), (3_000_000, want), "{algorithm:?}");
        }
    }

    #[test]
    fn a_missing_file_is_an_error_of_the_read() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut ahead =
            Ahead::start(dir.path().join("gone"), 10, Algorithm::Sha512).expect("thread");
        let err = ahead.read(&mut [0u8; 16]).expect_err("no such file");
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
    }
}
