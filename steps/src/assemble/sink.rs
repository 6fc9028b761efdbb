//! Where a container's bytes go: the delivery file, hashed (SHA-256) and
//! counted as they are written, so the delivery's size and digest need no
//! second read of the container.

use std::io::{self, Seek, SeekFrom, Write};

use crate::digest::{Algorithm, MultiHasher};

/// The size and SHA-256 of a finished container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerDigest {
    /// Its bytes.
    pub size: u64,
    /// Its SHA-256, lower-case hexadecimal.
    pub sha256: String,
    /// Whether the container was read again for them: a zip is (the zip
    /// writer seeks back to complete each entry's local header, and zip 2.6
    /// has no streaming mode that would not), a tar or tar.gz is not.
    pub read_back: bool,
}

/// A writer that hashes and counts the bytes it passes on while they are
/// written front to back. The first seek to anywhere but the end (a zip
/// writer completing a local header) gives the running hash up: the bytes
/// hashed are then no longer the file's, and [`Sink::finish`] says so.
#[derive(Debug)]
pub(crate) struct Sink<W> {
    inner: W,
    hasher: Option<MultiHasher>,
    len: u64,
}

impl<W> Sink<W> {
    pub(crate) fn new(inner: W) -> Sink<W> {
        Sink {
            inner,
            hasher: Some(MultiHasher::new(&[Algorithm::Sha256])),
            len: 0,
        }
    }

    /// The inner writer, and the size and SHA-256 of what was written when
    /// it was written front to back (`None` after a seek back).
    pub(crate) fn finish(self) -> (W, Option<(u64, String)>) {
        let digest = self.hasher.map(|h| {
            let hex = h.finish().into_iter().next().map(|(_, hex)| hex);
            (self.len, hex.unwrap_or_default())
        });
        (self.inner, digest)
    }
}

impl<W: Write> Write for Sink<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        if let Some(hasher) = &mut self.hasher {
            // Only what the inner writer took: the rest is offered again.
            hasher.update(buf.get(..n).unwrap_or(buf));
            self.len += n as u64;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

impl<W: Seek> Seek for Sink<W> {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        let at = self.inner.seek(to)?;
        if at != self.len {
            self.hasher = None;
        }
        Ok(at)
    }
}
