//! The engine's own bookkeeping in ZooKeeper: the projection checkpoint and
//! the projector leader node, under `/ingest-engine` (outside every Merritt
//! path, so Merritt's workers and tools never see it).
//!
//! ```text
//! /ingest-engine              (persistent, empty)
//! /ingest-engine/checkpoint   (persistent) {"position":N,"hash":"<hex of record N's hash>"}
//! /ingest-engine/leader       (ephemeral)  the identity of the projector that writes
//! /ingest-engine/rebuilding   (persistent, only while a rebuild runs) {"by","started","target","hash"}
//! ```
//!
//! The checkpoint says which prefix of the log the live tree holds: every
//! event up to `position`, whose record hash is `hash` (so a tree can be told
//! apart from one projected from another log). Two optional fields appear
//! only in rare states:
//! - `partial`: an event too large for one transaction is applied in parts
//!   (cut at its [`crate::EventOps::split_points`]); between two parts the
//!   checkpoint says how many parts of the next event the tree already holds;
//! - `rebuilding`: set by `rebuild` and `diff --repair` while they converge
//!   the tree; a projector that finds it while holding leadership knows the
//!   repair was interrupted and refuses to project onto a half-repaired tree.

use std::fmt;

use ingest_events::codec::GENESIS_HASH;
use ingest_events::Hash;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The engine's node under the root.
pub const ENGINE_NODE: &str = "/ingest-engine";
/// The checkpoint node: JSON [`Checkpoint`].
pub const CHECKPOINT_NODE: &str = "/ingest-engine/checkpoint";
/// The leader node: ephemeral, data = the identity of the projector holding it.
pub const LEADER_NODE: &str = "/ingest-engine/leader";
/// Present while a rebuild converges the tree: JSON [`RebuildMarker`]. A
/// rebuild that dies leaves it (and the queue paused); the next `rebuild`,
/// or a projector that leads, finishes the rebuild and removes it.
pub const REBUILDING_NODE: &str = "/ingest-engine/rebuilding";
/// The layout version the tree was projected with (decimal text). A tree
/// without it was projected by a release before 0.3.0 (layout 1).
pub const LAYOUT_NODE: &str = "/ingest-engine/layout";
/// The layout this release projects. When it changes, the running
/// projector of a newer release converges a tree projected under an older
/// one item by item while it serves (see `sink`), and the CHANGELOG says
/// what changed in the tree:
/// - 1: 0.1.0 and 0.2.0 (0.1.0 wrote each job's `configuration` without
///   `profile`, `submissionDate`, `filename`, `title`, `creator`);
/// - 2: the tree records its layout in [`LAYOUT_NODE`];
/// - 3: an access request's token node carries `content` (and `bag` when
///   asked), and the delivery's keys once it is delivered.
pub const LAYOUT_VERSION: u32 = 3;

/// What `/ingest-engine/rebuilding` says: who rebuilds, since when, and
/// which position of which log the tree is being brought to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RebuildMarker {
    /// Who is rebuilding (the admin command's identity).
    pub by: String,
    /// When the rebuild started (RFC 3339, UTC).
    pub started: String,
    /// The log position the tree is being rebuilt to.
    pub target: u64,
    /// The hash of that position's record (hex): which log it is.
    pub hash: String,
    /// Started with `--force` (a take-over of a tree whose checkpoint was
    /// not this log's): only another forced rebuild may finish it, so the
    /// admin's confirmation and its `TreeRepaired` record are not skipped.
    /// Absent in markers written before it (not forced).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub forced: bool,
}

impl RebuildMarker {
    /// The node data (compact JSON).
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Reads node data; `None` when it is not a marker (then the rebuild
    /// is still unfinished, by someone unknown).
    pub fn from_json(data: &[u8]) -> Option<RebuildMarker> {
        serde_json::from_slice(data).ok()
    }
}

impl fmt::Display for RebuildMarker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "a {}rebuild by {} started at {} towards position {}",
            if self.forced { "forced " } else { "" },
            ingest_protocol::cut(&self.by, 200),
            ingest_protocol::cut(&self.started, 40),
            self.target
        )
    }
}

/// Whether `path` is the engine's bookkeeping (`/ingest-engine` or below),
/// which diffs and tree listings leave out.
pub fn is_engine_path(path: &str) -> bool {
    path == ENGINE_NODE
        || path
            .strip_prefix(ENGINE_NODE)
            .is_some_and(|rest| rest.starts_with('/'))
}

/// What the live tree holds: the log up to `position`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// The last event whose operations are all in the tree (0: only the base
    /// nodes).
    pub position: u64,
    /// The hash of the record at `position` ([`GENESIS_HASH`] for 0), hex in
    /// JSON.
    #[serde(serialize_with = "hash_to_hex", deserialize_with = "hash_from_hex")]
    pub hash: Hash,
    /// Parts of the next event already applied, for an event applied in
    /// several transactions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partial: Option<Partial>,
    /// Set while a rebuild or repair converges the tree: who is doing it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rebuilding: Option<String>,
}

/// The first parts of an event already in the tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Partial {
    /// The event (always the checkpoint's position + 1).
    pub position: u64,
    /// How many of its parts ([`crate::EventOps::parts`]) are applied.
    pub parts: usize,
}

impl Checkpoint {
    /// The checkpoint of a tree holding only the base nodes.
    pub fn genesis() -> Checkpoint {
        Checkpoint::at(0, GENESIS_HASH)
    }

    /// A checkpoint after the whole event at `position`.
    pub fn at(position: u64, hash: Hash) -> Checkpoint {
        Checkpoint {
            position,
            hash,
            partial: None,
            rebuilding: None,
        }
    }

    /// The node data (compact JSON).
    pub fn to_json(&self) -> Vec<u8> {
        // Serializing plain fields into a Vec cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Reads node data.
    ///
    /// # Errors
    /// A [`CheckpointError`] saying what is wrong with the data.
    pub fn from_json(data: &[u8]) -> Result<Checkpoint, CheckpointError> {
        let cp: Checkpoint = serde_json::from_slice(data)?;
        if let Some(p) = cp.partial {
            if p.position != cp.position + 1 || p.parts == 0 {
                return Err(CheckpointError::Partial {
                    position: p.position,
                    parts: p.parts,
                    after: cp.position,
                });
            }
        }
        Ok(cp)
    }

    /// The hash as hex.
    pub fn hash_hex(&self) -> String {
        hex::encode(self.hash)
    }

    /// The same checkpoint marked as being rebuilt by `who`.
    pub fn rebuilding_by(&self, who: &str) -> Checkpoint {
        Checkpoint {
            rebuilding: Some(who.to_string()),
            ..self.clone()
        }
    }
}

/// Checkpoint node data that is not a checkpoint.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CheckpointError {
    /// Not the JSON of a checkpoint.
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    /// A partial mark that does not follow the position.
    #[error("partial {{position: {position}, parts: {parts}}} does not follow position {after}")]
    Partial {
        /// The partial position.
        position: u64,
        /// Its parts.
        parts: usize,
        /// The checkpoint's position.
        after: u64,
    },
}

impl fmt::Display for Checkpoint {
    /// `position 42 (hash 1a2b…)`, with the partial and rebuilding marks.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "position {} (hash {})", self.position, self.hash_hex())?;
        if let Some(p) = self.partial {
            write!(f, " + {} part(s) of position {}", p.parts, p.position)?;
        }
        if let Some(who) = &self.rebuilding {
            write!(f, ", being rebuilt by {who}")?;
        }
        Ok(())
    }
}

fn hash_to_hex<S: Serializer>(hash: &Hash, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&hex::encode(hash))
}

fn hash_from_hex<'de, D: Deserializer<'de>>(d: D) -> Result<Hash, D::Error> {
    use serde::de::Error;
    let text = String::deserialize(d)?;
    let bytes = hex::decode(&text).map_err(D::Error::custom)?;
    bytes
        .try_into()
        .map_err(|b: Vec<u8>| D::Error::custom(format!("hash has {} bytes, not 32", b.len())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_form_is_position_and_hex_hash() {
        let cp = Checkpoint::at(42, [0xab; 32]);
        let json = String::from_utf8(cp.to_json()).expect("utf-8");
        assert_eq!(
            json,
            format!(r#"{{"position":42,"hash":"{}"}}"#, "ab".repeat(32))
        );
        assert_eq!(Checkpoint::from_json(json.as_bytes()).ok(), Some(cp));
    }

    #[test]
    fn partial_and_rebuilding_round_trip() {
        let mut cp = Checkpoint::genesis().rebuilding_by("engine-a");
        cp.partial = Some(Partial {
            position: 1,
            parts: 2,
        });
        assert_eq!(Checkpoint::from_json(&cp.to_json()).ok(), Some(cp));
    }

    #[test]
    fn bad_data_is_refused() {
        assert!(Checkpoint::from_json(b"").is_err());
        assert!(Checkpoint::from_json(br#"{"position":1,"hash":"zz"}"#).is_err());
        assert!(Checkpoint::from_json(br#"{"position":1,"hash":"abcd"}"#).is_err());
        let bad_partial = format!(
            r#"{{"position":1,"hash":"{}","partial":{{"position":5,"parts":1}}}}"#,
            "00".repeat(32)
        );
        assert!(Checkpoint::from_json(bad_partial.as_bytes()).is_err());
    }

    #[test]
    fn engine_paths() {
        assert!(is_engine_path("/ingest-engine"));
        assert!(is_engine_path("/ingest-engine/checkpoint"));
        assert!(!is_engine_path("/ingest-engines"));
        assert!(!is_engine_path("/jobs"));
    }
}
