//! Frames of stored records: the unit that engines copy between each other.
//!
//! A frame is a run of records exactly as the log stores them
//! ([`crate::codec`]), each preceded by its length as a 4-byte big-endian
//! integer. Replication, bootstrap, backups and restores all move frames, so
//! a record travels as the bytes its hash covers and is verified where it
//! lands ([`crate::log::Log::import`]), never re-encoded on the way.

use crate::codec::MAX_RECORD_BYTES;

/// Why a frame could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    /// The frame ends inside a length prefix or a record.
    #[error("the frame is cut at byte {offset}: a record's length or bytes are missing")]
    Truncated {
        /// Where the cut record starts.
        offset: usize,
    },
    /// A length prefix names more bytes than any record may have.
    #[error("a record at byte {offset} claims {len} bytes; records have at most {limit}")]
    TooLarge {
        /// Where the record starts.
        offset: usize,
        /// The length it claims.
        len: usize,
        /// [`MAX_RECORD_BYTES`].
        limit: usize,
    },
}

/// Appends one record's stored bytes to `frame`.
pub fn push(frame: &mut Vec<u8>, record: &[u8]) {
    // A stored record is at most MAX_RECORD_BYTES (16 MiB), well inside u32.
    let len = u32::try_from(record.len()).unwrap_or(u32::MAX);
    frame.extend_from_slice(&len.to_be_bytes());
    frame.extend_from_slice(record);
}

/// The records of a frame, in order, as borrowed slices.
///
/// # Errors
/// [`FrameError`] for the first length prefix that is cut or too large;
/// nothing after it is returned.
pub fn split(frame: &[u8]) -> Result<Vec<&[u8]>, FrameError> {
    let mut out = Vec::new();
    let mut at = 0usize;
    while at < frame.len() {
        let Some(prefix) = frame.get(at..at + 4) else {
            return Err(FrameError::Truncated { offset: at });
        };
        let len = u32::from_be_bytes([prefix[0], prefix[1], prefix[2], prefix[3]]) as usize;
        if len > MAX_RECORD_BYTES {
            return Err(FrameError::TooLarge {
                offset: at,
                len,
                limit: MAX_RECORD_BYTES,
            });
        }
        let Some(record) = frame.get(at + 4..at + 4 + len) else {
            return Err(FrameError::Truncated { offset: at });
        };
        out.push(record);
        at += 4 + len;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_come_back_in_order() {
        let mut f = Vec::new();
        push(&mut f, b"one");
        push(&mut f, b"");
        push(&mut f, b"three");
        assert_eq!(split(&f).unwrap(), vec![&b"one"[..], b"", b"three"]);
    }

    #[test]
    fn a_cut_frame_is_refused_at_the_cut_record() {
        let mut f = Vec::new();
        push(&mut f, b"one");
        push(&mut f, b"three");
        let cut = &f[..f.len() - 1];
        assert_eq!(split(cut), Err(FrameError::Truncated { offset: 7 }));
        assert_eq!(split(&f[..2]), Err(FrameError::Truncated { offset: 0 }));
    }

    #[test]
    fn a_length_past_the_record_limit_is_refused() {
        let f = u32::MAX.to_be_bytes();
        assert!(matches!(split(&f), Err(FrameError::TooLarge { .. })));
    }
}
