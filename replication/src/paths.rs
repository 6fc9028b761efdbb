//! The replication nodes, under the engine's own `/ingest-engine`.

/// The parent of every replication node.
pub const ROOT: &str = "/ingest-engine/replication";
/// The fencing epoch: its version is the epoch.
pub const EPOCH: &str = "/ingest-engine/replication/epoch";
/// Where the trimmed part of the tail ended.
pub const BASE: &str = "/ingest-engine/replication/base";
/// The replicated tail.
pub const TAIL: &str = "/ingest-engine/replication/tail";
/// The registered replicas.
pub const REPLICAS: &str = "/ingest-engine/replication/replicas";
/// The election's candidates.
pub const ELECTION: &str = "/ingest-engine/replication/election";
/// The leader's address.
pub const LEADER: &str = "/ingest-engine/replication/leader";

/// A tail node's path.
pub fn tail_node(name: &str) -> String {
    format!("{TAIL}/{name}")
}

/// A replica's node.
pub fn replica(id: &str) -> String {
    format!("{REPLICAS}/{id}")
}

/// A candidate's node.
pub fn candidate(name: &str) -> String {
    format!("{ELECTION}/{name}")
}
