//! Several engines on one root (`ingest serve --replicas N`; file section
//! `replication`): one leads and appends through ZooKeeper, the others
//! follow, serve reads and take over.

use clap::Args;
use serde::{Deserialize, Serialize};

/// How this engine takes part in a replicated group.
#[derive(Debug, Clone, PartialEq, Eq, Args, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ReplicationArgs {
    /// How many engines run on this root. 1 (the default): this engine is the only one and takes every command itself, also while ZooKeeper is down. 2 or more: it is one of a replicated group: it appends only while it leads (elected through ZooKeeper), every append is durable in ZooKeeper's quorum before it is acknowledged, and without a quorum writes are refused (503 no_quorum). Needs --zk-hosts.
    #[arg(long, env = "INGEST_REPLICAS", value_name = "N", default_value_t = 1)]
    pub replicas: u32,
    /// This engine's name in the group (letters, digits, '-', '_', '.'; at most 64). Default: an id kept in DATA_DIR/engine-id. Naming it keeps its place in the group when its data directory is lost.
    #[arg(long, env = "INGEST_ENGINE_ID", value_name = "NAME")]
    pub engine_id: Option<String>,
    /// The URL other engines, workers and clients reach this engine at (default: http:// and the listen address).
    #[arg(long, env = "INGEST_ADVERTISE_URL", value_name = "URL")]
    pub advertise_url: Option<String>,
    /// A follower more than this many events behind the leader is dropped from the set that holds the replicated tail in ZooKeeper; it rejoins by copying the log from a peer.
    #[arg(
        long = "max-replica-lag-events",
        env = "INGEST_MAX_REPLICA_LAG_EVENTS",
        value_name = "N",
        default_value_t = 1_000_000
    )]
    pub max_lag_events: u64,
    /// The replicated tail held in ZooKeeper for a lagging follower never grows past this many bytes: the furthest-behind follower is dropped instead.
    #[arg(
        long = "max-replica-lag-bytes",
        env = "INGEST_MAX_REPLICA_LAG_BYTES",
        value_name = "BYTES",
        default_value_t = 256 * 1024 * 1024
    )]
    pub max_lag_bytes: u64,
}

impl Default for ReplicationArgs {
    fn default() -> Self {
        ReplicationArgs {
            replicas: 1,
            engine_id: None,
            advertise_url: None,
            max_lag_events: 1_000_000,
            max_lag_bytes: 256 * 1024 * 1024,
        }
    }
}

impl ReplicationArgs {
    /// Whether this engine is one of a replicated group.
    pub fn is_replicated(&self) -> bool {
        self.replicas > 1
    }
}
