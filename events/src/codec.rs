//! The binary form of an event record, its hash, and upcasting of old schemas.
//!
//! A stored record is the bincode encoding (standard configuration) of
//! [`StoredRecord`]: the envelope [`Header`], the event's kind name, the
//! payload bytes, and the record's hash. The hash is BLAKE3 over the encoded
//! header (which carries the previous record's hash) followed by the payload,
//! so any change to the metadata, the payload or the order breaks the chain.
//!
//! ## Schema versions
//! - **1**: `JobStatusChanged` had no `retry` and `priority` fields (the form
//!   used before requeues and priority changes were recorded on the move
//!   itself). Decoded through [`v1`] and upcast with `retry: false,
//!   priority: None`.
//! - **2** (current): every event as defined in [`crate::event`].
//!
//! Kinds whose payload did not change between versions decode the same way.

use chrono::{DateTime, TimeZone, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::event::{Actor, Event, StreamId};
use crate::wire::{decode_value, encode_value};
pub use crate::wire::{DecodeError, MAX_RECORD_BYTES, SCHEMA_VERSION};

/// A 32-byte BLAKE3 hash.
pub type Hash = [u8; 32];

/// The hash that precedes the first record.
pub const GENESIS_HASH: Hash = [0u8; 32];

/// Where and when an event happened, and how it chains to its predecessor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope {
    /// Global position, gap-free from 1.
    pub position: u64,
    /// The stream the event belongs to.
    pub stream: StreamId,
    /// The event's version within its stream, from 1.
    pub version: u64,
    /// When the engine decided it (UTC, microsecond precision).
    pub timestamp: DateTime<Utc>,
    /// Who caused it.
    pub actor: Actor,
    /// Ties together the events of one command (and of a request that spans several).
    pub correlation_id: Uuid,
    /// The schema version the payload was written with.
    pub schema_version: u16,
    /// The hash of the previous record ([`GENESIS_HASH`] for position 1).
    pub prev_hash: Hash,
    /// This record's hash.
    pub hash: Hash,
}

/// An event with its envelope, as read back from the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    /// Position, stream, time, actor, hashes.
    pub envelope: Envelope,
    /// The event, upcast to the current schema.
    pub event: Event,
}

/// The envelope fields covered by the hash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Header {
    pub schema_version: u16,
    pub position: u64,
    pub stream: StreamId,
    pub version: u64,
    pub timestamp_micros: i64,
    pub actor: Actor,
    pub correlation_id: Uuid,
    pub prev_hash: Hash,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct StoredRecord {
    header: Header,
    kind: String,
    payload: Vec<u8>,
    hash: Hash,
}

/// What the log needs to know to write a new record.
pub(crate) struct NewRecord<'a> {
    pub position: u64,
    pub stream: StreamId,
    pub version: u64,
    pub timestamp: DateTime<Utc>,
    pub actor: &'a Actor,
    pub correlation_id: Uuid,
    pub prev_hash: Hash,
    pub event: &'a Event,
}

/// Encodes a new record with the current schema; returns its bytes and hash.
pub(crate) fn encode_record(r: &NewRecord<'_>) -> (Vec<u8>, Hash) {
    encode_record_with(r, SCHEMA_VERSION, r.event.encode_payload())
}

fn encode_record_with(r: &NewRecord<'_>, schema_version: u16, payload: Vec<u8>) -> (Vec<u8>, Hash) {
    let header = Header {
        schema_version,
        position: r.position,
        stream: r.stream,
        version: r.version,
        timestamp_micros: r.timestamp.timestamp_micros(),
        actor: r.actor.clone(),
        correlation_id: r.correlation_id,
        prev_hash: r.prev_hash,
    };
    let hash = record_hash(&header, r.event.kind(), &payload);
    let stored = StoredRecord {
        header,
        kind: r.event.kind().to_string(),
        payload,
        hash,
    };
    (encode_value(&stored), hash)
}

fn record_hash(header: &Header, kind: &str, payload: &[u8]) -> Hash {
    let mut h = blake3::Hasher::new();
    h.update(&encode_value(header));
    // The kind decides how the payload is read, so it is covered too,
    // length-prefixed so kind and payload cannot trade bytes.
    h.update(&(kind.len() as u64).to_le_bytes());
    h.update(kind.as_bytes());
    h.update(payload);
    *h.finalize().as_bytes()
}

/// A stored record taken apart into what its hash covers, for audit
/// bundles: a verifier recomputes `hash = BLAKE3(header ‖ len(kind) as u64
/// little-endian ‖ kind ‖ payload)` without decoding the payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordParts {
    /// The encoded envelope header (bincode standard: schema version,
    /// position, stream, version, timestamp, actor, correlation id, previous hash).
    pub header: Vec<u8>,
    /// The event kind.
    pub kind: String,
    /// The payload bytes as stored (in the record's own schema).
    pub payload: Vec<u8>,
    /// The record's hash as stored.
    pub hash: Hash,
}

impl RecordParts {
    /// Takes stored record bytes apart.
    ///
    /// # Errors
    /// [`DecodeError::Malformed`] when the bytes are not a record.
    pub fn of(bytes: &[u8]) -> Result<RecordParts, DecodeError> {
        let stored: StoredRecord = decode_value(bytes)?;
        Ok(RecordParts {
            header: encode_value(&stored.header),
            kind: stored.kind,
            payload: stored.payload,
            hash: stored.hash,
        })
    }

    /// The hash the parts compute to (compare with [`RecordParts::hash`]).
    pub fn computed_hash(&self) -> Hash {
        let mut h = blake3::Hasher::new();
        h.update(&self.header);
        h.update(&(self.kind.len() as u64).to_le_bytes());
        h.update(self.kind.as_bytes());
        h.update(&self.payload);
        *h.finalize().as_bytes()
    }

    /// Decodes the parts into a record, checking the hash and upcasting.
    ///
    /// # Errors
    /// As [`decode_record`].
    pub fn decode(&self) -> Result<Recorded, DecodeError> {
        let header: Header = decode_value(&self.header)?;
        decode_stored(StoredRecord {
            header,
            kind: self.kind.clone(),
            payload: self.payload.clone(),
            hash: self.hash,
        })
    }
}

/// Decodes a stored record, checks its own hash, and upcasts its payload.
///
/// # Errors
/// [`DecodeError`] when the bytes are not a record, the hash does not match
/// the content, or the kind or schema is unknown.
pub fn decode_record(bytes: &[u8]) -> Result<Recorded, DecodeError> {
    decode_stored(decode_value(bytes)?)
}

fn decode_stored(stored: StoredRecord) -> Result<Recorded, DecodeError> {
    let computed = record_hash(&stored.header, &stored.kind, &stored.payload);
    if computed != stored.hash {
        return Err(DecodeError::HashMismatch {
            stored: hex::encode(stored.hash),
            computed: hex::encode(computed),
        });
    }
    let h = stored.header;
    let event = match h.schema_version {
        1 => v1::decode(&stored.kind, &stored.payload)?,
        SCHEMA_VERSION => Event::decode_payload(&stored.kind, &stored.payload)?,
        v => return Err(DecodeError::FutureSchema(v)),
    };
    let timestamp = Utc
        .timestamp_micros(h.timestamp_micros)
        .single()
        .ok_or_else(|| {
            DecodeError::Malformed(format!("timestamp {} out of range", h.timestamp_micros))
        })?;
    Ok(Recorded {
        envelope: Envelope {
            position: h.position,
            stream: h.stream,
            version: h.version,
            timestamp,
            actor: h.actor,
            correlation_id: h.correlation_id,
            schema_version: h.schema_version,
            prev_hash: h.prev_hash,
            hash: stored.hash,
        },
        event,
    })
}

/// Schema version 1 and its upcaster.
pub mod v1 {
    use serde::{Deserialize, Serialize};

    use super::{decode_value, DecodeError};
    use crate::event::{self, Event};
    use crate::lifecycle::JobState;

    /// `JobStatusChanged` as schema 1 wrote it.
    #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
    pub struct JobStatusChanged {
        /// The state left.
        pub from: JobState,
        /// The state entered.
        pub to: JobState,
        /// Why.
        pub message: String,
    }

    pub(super) fn decode(kind: &str, payload: &[u8]) -> Result<Event, DecodeError> {
        match kind {
            "JobStatusChanged" => {
                let old: JobStatusChanged = decode_value(payload)?;
                Ok(Event::JobStatusChanged(event::JobStatusChanged {
                    from: old.from,
                    to: old.to,
                    message: old.message,
                    retry: false,
                    priority: None,
                }))
            }
            other => Event::decode_payload(other, payload),
        }
    }
}

/// Test support: writes a record in schema 1 form, for fixtures of the upcaster.
#[doc(hidden)]
pub fn encode_v1_job_status_changed_for_fixture(
    envelope: &Envelope,
    old: &v1::JobStatusChanged,
) -> Vec<u8> {
    let event = Event::JobStatusChanged(crate::event::JobStatusChanged {
        from: old.from,
        to: old.to,
        message: old.message.clone(),
        retry: false,
        priority: None,
    });
    let r = NewRecord {
        position: envelope.position,
        stream: envelope.stream,
        version: envelope.version,
        timestamp: envelope.timestamp,
        actor: &envelope.actor,
        correlation_id: envelope.correlation_id,
        prev_hash: envelope.prev_hash,
        event: &event,
    };
    encode_record_with(&r, 1, encode_value(old)).0
}

/// Test support: encodes a record exactly as the log would.
#[doc(hidden)]
pub fn encode_for_fixture(envelope: &Envelope, event: &Event) -> (Vec<u8>, Hash) {
    encode_record(&NewRecord {
        position: envelope.position,
        stream: envelope.stream,
        version: envelope.version,
        timestamp: envelope.timestamp,
        actor: &envelope.actor,
        correlation_id: envelope.correlation_id,
        prev_hash: envelope.prev_hash,
        event,
    })
}
