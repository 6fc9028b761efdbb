//! The container's bytes sent to the disk while it is still being
//! written: every [`FLUSH_EVERY`] bytes, a thread of its own asks the
//! kernel to write out what was written so far (`fdatasync` on a
//! duplicate of the file's descriptor), so the disk works while the next
//! files are read and hashed, and the final sync finds little left to do.
//! Without it the whole container waited in the page cache for that sync
//! (about a fifth of a 256 MiB assembly's time here).
//!
//! A duplicate descriptor shares the file's error state with the
//! original, so an error this thread's sync reports would not be reported
//! again to the final one: the first such error is kept and
//! [`Flushing::finish`] returns it, failing the assembly.

use std::fs::File;
use std::io::{self, Seek, SeekFrom, Write};
use std::sync::mpsc::{self, SyncSender, TrySendError};
use std::thread::JoinHandle;

/// Bytes written between two early flushes.
const FLUSH_EVERY: u64 = 16 << 20;

/// The thread flushing the file when asked.
struct Flusher {
    kick: SyncSender<()>,
    thread: JoinHandle<io::Result<()>>,
}

/// A file being written whose bytes are flushed early (see the module).
pub(crate) struct Flushing {
    file: File,
    flusher: Option<Flusher>,
    unflushed: u64,
}

impl Flushing {
    /// `file`, flushed early by a thread of its own when one can be
    /// started (else only by the caller's final sync).
    pub(crate) fn new(file: File) -> Flushing {
        let flusher = file.try_clone().ok().and_then(|dup| {
            let (kick, kicks) = mpsc::sync_channel::<()>(1);
            std::thread::Builder::new()
                .name("assemble-flush".into())
                .spawn(move || {
                    for () in kicks {
                        dup.sync_data()?;
                    }
                    Ok(())
                })
                .ok()
                .map(|thread| Flusher { kick, thread })
        });
        Flushing {
            file,
            flusher,
            unflushed: 0,
        }
    }

    /// The file, once the thread has stopped; the first error its flushes
    /// met, if any.
    pub(crate) fn finish(self) -> io::Result<File> {
        if let Some(Flusher { kick, thread }) = self.flusher {
            drop(kick);
            match thread.join() {
                Ok(flushed) => flushed?,
                Err(_) => return Err(io::Error::other("the flushing thread stopped")),
            }
        }
        Ok(self.file)
    }
}

impl Write for Flushing {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.file.write(buf)?;
        self.unflushed += n as u64;
        if self.unflushed >= FLUSH_EVERY {
            self.unflushed = 0;
            if let Some(flusher) = &self.flusher {
                // A flush under way takes these bytes too, or the next one
                // does: a kick already waiting is enough.
                match flusher.kick.try_send(()) {
                    Ok(()) | Err(TrySendError::Full(())) => {}
                    // The thread stopped on an error: `finish` gives it.
                    Err(TrySendError::Disconnected(())) => {}
                }
            }
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

impl Seek for Flushing {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        self.file.seek(to)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn bytes_written_past_several_early_flushes_arrive_whole_and_in_order() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("c");
        let mut out = Flushing::new(File::create(&path).expect("create"));
        assert!(out.flusher.is_some());
        let piece: Vec<u8> = (0..(1u32 << 20)).map(|i| (i % 253) as u8).collect();
        let pieces = 3 * (FLUSH_EVERY >> 20) + 5;
        for i in 0..pieces {
            let mut p = piece.clone();
            p[0] = i as u8;
            out.write_all(&p).expect("write");
        }
        // A seek back and an overwrite (as a zip writer does) still land.
        out.seek(SeekFrom::Start(1)).expect("seek");
        out.write_all(b"Z").expect("write");
        let file = out.finish().expect("no flush failed");
        file.sync_all().expect("sync");
        let mut bytes = Vec::new();
        File::open(&path)
            .expect("open")
            .read_to_end(&mut bytes)
            .expect("read");
        assert_eq!(bytes.len() as u64, pieces << 20);
        for (i, chunk) in bytes.chunks(1 << 20).enumerate() {
            assert_eq!(chunk[0], i as u8);
            let rest = if i == 0 { &chunk[2..] } else { &chunk[1..] };
            assert_eq!(rest, &piece[chunk.len() - rest.len()..]);
        }
        assert_eq!(bytes[1], b'Z');
    }
}
