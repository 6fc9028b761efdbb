//! Replication of `ingest`'s event log through ZooKeeper.
//!
//! Several engines run on one root. One leads: it decides commands and, for
//! every group it commits, first writes the group's records to a **tail**
//! of ZooKeeper nodes in a `multi` that also checks the **fencing epoch**
//! (the version of `/ingest-engine/replication/epoch`), then commits them to
//! its own sled log; a command is acknowledged only when both hold it. The
//! others follow: they read the tail in order, check every record against
//! their own log's hash chain ([`ingest_events::log::Log::import`]), write
//! it, and publish how far they are. Each engine's log is a full copy with
//! the same positions, hashes and head.
//!
//! Leadership is a ZooKeeper election (ephemeral sequential candidates, the
//! lowest leads). A new leader first bumps the epoch, so anything the old
//! leader still sends fails its check; then applies the whole tail, so
//! nothing acknowledged is missing; then removes a trailing command the old
//! leader had only half written (never acknowledged), and only then takes
//! commands and starts the projector.
//!
//! The tail is trimmed by the leader once every registered replica applied
//! it; a replica that falls further behind than a bound (events, bytes,
//! nodes) is dropped from the set that holds the tail back, says so at
//! ERROR, and rejoins by copying the log from a peer over HTTP
//! ([`bootstrap`]).
//!
//! ```text
//! /ingest-engine/replication/
//!   epoch                 version = the fencing epoch; data: the leader that set it
//!   base                  {"seq","pos","hash"}: where the trimmed tail ended
//!   tail/t<seq>-<pos>-<c|p>-<len>   a chunk of frames; c: ends at a command boundary
//!   replicas/<id>         {"applied","url","dropped"}: each registered engine
//!   election/c-<seq>      ephemeral candidates (data: the engine's id)
//!   leader                ephemeral {"id","url","epoch"}: where writes go
//! ```
#![deny(missing_docs)]

pub mod bootstrap;
mod controller;
mod follow;
pub mod paths;
mod replicator;
pub mod status;
pub mod tail;

use std::path::Path;
use std::time::Duration;

pub use controller::{run, LeaderDuties};
pub use status::{ReplicaStatus, ReplicaView, Role, StatusCell};

use ingest_projections::ZkConfig;

/// How one engine of a replicated group runs.
#[derive(Debug, Clone)]
pub struct ReplicationConfig {
    /// The ZooKeeper ensemble and root (the projection's).
    pub zk: ZkConfig,
    /// This engine's identity in the group: stable across restarts (and
    /// across a wiped data directory when it is configured by name).
    pub id: String,
    /// The URL other engines, workers and clients reach this engine at.
    pub url: String,
    /// A follower further behind the leader than this many events is
    /// dropped from the set that holds the tail back.
    pub max_lag_events: u64,
    /// The tail is never let grow past this many bytes for a replica that
    /// is behind: the furthest-behind replica is dropped instead.
    pub max_lag_bytes: u64,
    /// Nor past this many nodes (ZooKeeper lists a node's children in one
    /// answer, bounded by its `jute.maxbuffer`).
    pub max_tail_nodes: usize,
    /// The admin token this engine presents to a peer it copies the log
    /// from.
    pub peer_token: Option<String>,
    /// How often a follower looks at the tail when no watch fired, and a
    /// leader trims it.
    pub poll: Duration,
}

impl ReplicationConfig {
    /// Defaults for an engine `id` at `url` on `zk`.
    pub fn new(zk: ZkConfig, id: impl Into<String>, url: impl Into<String>) -> ReplicationConfig {
        ReplicationConfig {
            zk,
            id: id.into(),
            url: url.into(),
            max_lag_events: 1_000_000,
            max_lag_bytes: 256 * 1024 * 1024,
            max_tail_nodes: 10_000,
            peer_token: None,
            poll: Duration::from_millis(500),
        }
    }
}

/// Why an engine's identity could not be read or made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IdError {
    /// The file could not be read or written.
    #[error("cannot read or write the engine id in {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The file or the configured name is not an identity.
    #[error("the engine id {0:?} is not 1 to 64 letters, digits, '-', '_' or '.'")]
    Invalid(String),
}

/// Checks an engine identity: it names a ZooKeeper node.
///
/// # Errors
/// [`IdError::Invalid`].
pub fn check_id(id: &str) -> Result<(), IdError> {
    let ok = !id.is_empty()
        && id.len() <= 64
        && id != "."
        && id != ".."
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err(IdError::Invalid(id.chars().take(80).collect()))
    }
}

/// The identity kept in `DATA_DIR/engine-id`, made (a random uuid) when
/// missing.
///
/// # Errors
/// [`IdError`] when the file cannot be read or written or holds no identity.
pub fn engine_id(data_dir: &Path) -> Result<String, IdError> {
    let path = data_dir.join("engine-id");
    let io = |source| IdError::Io {
        path: path.display().to_string(),
        source,
    };
    match std::fs::read_to_string(&path) {
        Ok(s) => {
            let id = s.trim().to_string();
            check_id(&id)?;
            Ok(id)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir_all(data_dir).map_err(io)?;
            let id = uuid::Uuid::new_v4().to_string();
            let tmp = data_dir.join("engine-id.tmp");
            std::fs::write(&tmp, format!("{id}\n")).map_err(io)?;
            std::fs::rename(&tmp, &path).map_err(io)?;
            Ok(id)
        }
        Err(e) => Err(io(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_name_nodes() {
        assert!(check_id("engine-1").is_ok());
        assert!(check_id("0f8c.a_b").is_ok());
        for bad in ["", ".", "..", "a/b", "a b", &"x".repeat(65)] {
            assert!(check_id(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn an_engine_keeps_its_id() {
        let dir = tempfile::tempdir().unwrap();
        let a = engine_id(dir.path()).unwrap();
        assert_eq!(engine_id(dir.path()).unwrap(), a);
        std::fs::write(dir.path().join("engine-id"), "../x\n").unwrap();
        assert!(engine_id(dir.path()).is_err());
    }
}
