//! The bytes under every record: bincode with a bounded decoder, and the
//! error a stored value that does not decode gives. `codec` builds records
//! on it and `event` encodes payloads with it.

use serde::{de::DeserializeOwned, Serialize};

/// The schema version new records are written with.
pub const SCHEMA_VERSION: u16 = 2;

/// Why a stored record could not be read.
///
/// ### Handling
/// A record that does not decode is corruption: `ingest verify` reports it by
/// position; at the tail of the log it needs `ingest repair`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The bytes are not a record of any known schema.
    #[error("malformed record: {0}")]
    Malformed(String),
    /// The record names an event kind this build does not know.
    #[error("unknown event kind {0:?}")]
    UnknownKind(String),
    /// The record is from a newer schema than this build understands.
    #[error("schema version {0} is newer than this build understands ({SCHEMA_VERSION})")]
    FutureSchema(u16),
    /// The stored hash does not match the record's content.
    #[error("hash mismatch: stored {stored}, computed {computed}")]
    HashMismatch {
        /// The hash stored with the record.
        stored: String,
        /// The hash of the record's content.
        computed: String,
    },
}

/// The largest record the decoder accepts. A corrupt length prefix must
/// give an error, not an allocation of petabytes (bincode allocates what a
/// length prefix claims unless a limit is set).
pub const MAX_RECORD_BYTES: usize = 16 * 1024 * 1024;

fn config() -> bincode::config::Configuration {
    bincode::config::standard()
}

fn decode_config() -> bincode::config::Configuration<
    bincode::config::LittleEndian,
    bincode::config::Varint,
    bincode::config::Limit<MAX_RECORD_BYTES>,
> {
    bincode::config::standard().with_limit::<MAX_RECORD_BYTES>()
}

pub(crate) fn encode_value<T: Serialize>(value: &T) -> Vec<u8> {
    match bincode::serde::encode_to_vec(value, config()) {
        Ok(v) => v,
        // Encoding our own plain data types into a Vec cannot fail.
        Err(e) => unreachable!("bincode encoding of an event failed: {e}"),
    }
}

pub(crate) fn decode_value<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, DecodeError> {
    let (value, used) = bincode::serde::decode_from_slice(bytes, decode_config())
        .map_err(|e| DecodeError::Malformed(e.to_string()))?;
    if used != bytes.len() {
        return Err(DecodeError::Malformed(format!(
            "{} trailing bytes",
            bytes.len() - used
        )));
    }
    Ok(value)
}
