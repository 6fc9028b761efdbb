//! What an engine of a replicated group says about itself: its role, epoch,
//! applied position, the leader, and (on the leader) every replica's lag.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tokio::sync::watch;

/// The role of an engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Not replicated: the engine takes every command on its own.
    Single,
    /// Connecting to ZooKeeper or finding its place; takes no commands.
    Starting,
    /// Applies the leader's tail; serves reads.
    Follower,
    /// Decides and appends through the replicated tail.
    Leader,
    /// Copies the log from a peer (it was behind the trimmed tail, dropped,
    /// or wiped).
    Bootstrapping,
    /// ZooKeeper cannot be reached or has no quorum; takes no commands.
    Disconnected,
    /// The local log is not a prefix of the group's history: the engine
    /// stopped replicating and needs an operator (see `reason`).
    Divergent,
}

/// One registered replica, as the leader sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaView {
    /// Its identity.
    pub id: String,
    /// Its URL.
    pub url: String,
    /// The position it applied.
    pub applied: u64,
    /// Events behind the leader.
    pub lag: u64,
    /// Whether it was dropped from the set that holds the tail back.
    pub dropped: bool,
}

/// The state of one engine of a group (or of a single engine).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaStatus {
    /// This engine's identity (empty for a single engine).
    pub id: String,
    /// Its advertised URL.
    pub url: String,
    /// Its role.
    pub role: Role,
    /// The fencing epoch this engine last saw (the one it leads in, for a
    /// leader).
    pub epoch: Option<u64>,
    /// The position of its published state.
    pub applied: u64,
    /// The hash of the record at `applied` (hex), as served by
    /// `GET /replication`: equal on every engine at the same position.
    #[serde(default)]
    pub head_hash: Option<String>,
    /// The leader's URL, when one is known.
    pub leader_url: Option<String>,
    /// The leader's identity, when one is known.
    pub leader_id: Option<String>,
    /// Events this engine is behind the leader's tail, when known.
    pub lag: Option<u64>,
    /// Why the engine is not serving in its role (bounded).
    pub reason: Option<String>,
    /// On the leader: every registered replica.
    pub replicas: Vec<ReplicaView>,
    /// Tail nodes and bytes held in ZooKeeper (on the leader).
    pub tail_nodes: u64,
    /// Bytes of the tail (on the leader).
    pub tail_bytes: u64,
    /// On the leader: ZooKeeper `multi`s written to the tail in this term.
    #[serde(default)]
    pub tail_writes: u64,
    /// On the leader: records written to the tail in this term (records
    /// per write is the group commit's effect).
    #[serde(default)]
    pub records_replicated: u64,
    /// On the leader: bytes of records written to the tail in this term,
    /// before compression.
    #[serde(default)]
    pub tail_frame_bytes: u64,
    /// On the leader: bytes of tail node data written in this term (what
    /// ZooKeeper stored; nodes that shrink are zstd-compressed).
    #[serde(default)]
    pub tail_stored_bytes: u64,
}

impl ReplicaStatus {
    /// The status of a single (not replicated) engine.
    pub fn single() -> ReplicaStatus {
        ReplicaStatus {
            id: String::new(),
            url: String::new(),
            role: Role::Single,
            epoch: None,
            applied: 0,
            head_hash: None,
            leader_url: None,
            leader_id: None,
            lag: None,
            reason: None,
            replicas: Vec::new(),
            tail_nodes: 0,
            tail_bytes: 0,
            tail_writes: 0,
            records_replicated: 0,
            tail_frame_bytes: 0,
            tail_stored_bytes: 0,
        }
    }

    /// Whether this engine takes commands.
    pub fn takes_commands(&self) -> bool {
        matches!(self.role, Role::Single | Role::Leader)
    }
}

/// The shared, watched status of this engine.
#[derive(Clone)]
pub struct StatusCell(Arc<watch::Sender<ReplicaStatus>>);

impl StatusCell {
    /// A cell holding `status`.
    pub fn new(status: ReplicaStatus) -> StatusCell {
        StatusCell(Arc::new(watch::Sender::new(status)))
    }

    /// The status now.
    pub fn get(&self) -> ReplicaStatus {
        self.0.borrow().clone()
    }

    /// Changes the status.
    pub fn update(&self, f: impl FnOnce(&mut ReplicaStatus)) {
        self.0.send_modify(f);
    }

    /// A receiver of every change.
    pub fn subscribe(&self) -> watch::Receiver<ReplicaStatus> {
        self.0.subscribe()
    }
}

/// Cuts a reason to a bound (it may quote a ZooKeeper or peer error).
pub(crate) fn reason(text: impl std::fmt::Display) -> Option<String> {
    let s = text.to_string();
    Some(match s.char_indices().nth(300) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s,
    })
}
