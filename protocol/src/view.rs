//! What `ingest show job` and `ingest status` print, and what
//! `GET /jobs/{jid}` and `GET /status` answer: one type each, so the CLI
//! prints the same shape whether it opened the data directory or asked a
//! server.

use std::collections::BTreeMap;

use ingest_events::event::FailureKind;
use ingest_events::state::Job;
use serde::{Deserialize, Serialize};

/// A job as `show` prints it and `GET /jobs/{jid}` answers it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobView {
    /// The job id.
    pub jid: String,
    /// Its batch.
    pub bid: String,
    /// Its state.
    pub status: String,
    /// The last state it completed.
    pub last_successful_status: Option<String>,
    /// How often it was requeued.
    pub retry_count: u32,
    /// Its priority (lower runs first).
    pub priority: u8,
    /// Bytes it needs in working storage.
    pub space_needed: u64,
    /// Its collection profile.
    pub profile: String,
    /// Its payload URL.
    pub payload_url: String,
    /// Its payload type.
    pub payload_type: String,
    /// Its ark, once known.
    pub primary_id: Option<String>,
    /// Its local ids.
    pub local_ids: Vec<String>,
    /// The message of its last transition.
    pub message: String,
    /// Step retries recorded in its current state.
    pub step_retries: u32,
    /// When it was created (RFC 3339).
    pub created: String,
    /// When it last changed (RFC 3339).
    pub last_modified: String,
    /// Whether cleanup removed it from the live tree.
    pub cleaned_up: bool,
    /// The kind of its failure when the failing step named one
    /// (`digest_mismatch`); absent for an ordinary failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<FailureView>,
    /// Why a worker keeps the job waiting in its state (Provisioning:
    /// working storage too full), as the worker last said; absent when no
    /// worker said so, or the job moved on since.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting: Option<String>,
}

/// The kind of a job's failure and what it means for the job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailureView {
    /// The kind (`digest_mismatch`).
    pub kind: String,
    /// Whether a requeue may recover the job.
    pub recoverable: bool,
    /// What happened and what follows ("… a new submission is required").
    pub explanation: String,
}

impl From<FailureKind> for FailureView {
    fn from(k: FailureKind) -> FailureView {
        FailureView {
            kind: k.name().to_string(),
            recoverable: k.recoverable(),
            explanation: format!("{}; {}", k.explanation(), k.remedy()),
        }
    }
}

impl From<&Job> for JobView {
    fn from(j: &Job) -> JobView {
        JobView {
            jid: j.jid.to_string(),
            bid: j.bid.to_string(),
            status: j.status.to_string(),
            last_successful_status: j.last_successful_status.map(|s| s.to_string()),
            retry_count: j.retry_count,
            priority: j.priority,
            space_needed: j.space_needed,
            profile: j.configuration.profile_name.clone(),
            payload_url: j.configuration.payload_url.clone(),
            payload_type: j.configuration.payload_type.to_string(),
            primary_id: j.identifiers.primary_id.clone(),
            local_ids: j.identifiers.local_ids.clone(),
            message: j.message.clone(),
            step_retries: j.step_retries,
            created: j.created.to_rfc3339(),
            last_modified: j.last_modified.to_rfc3339(),
            cleaned_up: j.cleaned_up,
            failure: j.failure.map(FailureView::from),
            waiting: None,
        }
    }
}

/// Queue-wide figures: `ingest status` and `GET /status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusView {
    /// The data directory of the engine.
    pub data_dir: String,
    /// The position of the last event.
    pub head_position: u64,
    /// Its hash, hex.
    pub head_hash: String,
    /// The last position flushed to disk.
    pub durable_position: u64,
    /// Why the log needs repair, if it does: a torn tail found at start-up
    /// (`ingest repair`), or the damage the last verify found.
    pub needs_repair: Option<String>,
    /// What the last `verify` of this data directory found (none yet:
    /// absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_verify: Option<crate::api::LastVerify>,
    /// Whether the ingest queue is paused.
    pub paused: bool,
    /// Collections on hold.
    pub held_collections: Vec<String>,
    /// Batches not yet cleaned up.
    pub live_batches: usize,
    /// Jobs not yet cleaned up.
    pub live_jobs: usize,
    /// Live batches by state.
    pub batches_by_state: BTreeMap<String, usize>,
    /// Live jobs by state.
    pub jobs_by_state: BTreeMap<String, usize>,
    /// How long the engine took to fold the log when it opened, in ms.
    pub startup_fold_ms: u64,
    /// In a replicated group: this engine's place in it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replication: Option<ReplicationSummary>,
}

/// An engine's place in a replicated group, as `ingest status` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicationSummary {
    /// This engine's identity.
    pub id: String,
    /// Its role (`leader`, `follower`, `starting`, `bootstrapping`,
    /// `disconnected`, `divergent`).
    pub role: String,
    /// The fencing epoch it last saw.
    pub epoch: Option<u64>,
    /// The leader's URL, when known.
    pub leader: Option<String>,
    /// Events it is behind the tail.
    pub lag: Option<u64>,
    /// Why it is not serving in its role, when it is not.
    pub reason: Option<String>,
    /// On the leader: every registered replica.
    pub replicas: Vec<ReplicaLag>,
}

/// One registered replica, as the leader sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaLag {
    /// Its identity.
    pub id: String,
    /// Its URL.
    pub url: String,
    /// The position it applied.
    pub applied: u64,
    /// Events behind the leader.
    pub lag: u64,
    /// Dropped from the set that holds the tail.
    pub dropped: bool,
}

/// `GET /readyz`: whether the server can do its work now, and why not.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Readiness {
    /// Every check passed.
    pub ready: bool,
    /// The engine's writer takes commands.
    pub writer: bool,
    /// The projector's state (`connected`, `standby`, `disconnected`,
    /// `starting`, `stopped`, `rebuilding`), when ZooKeeper is configured.
    pub projector: Option<String>,
    /// Durable events not in ZooKeeper yet.
    pub events_behind: Option<u64>,
    /// The age of the oldest of them, in seconds.
    pub seconds_behind: Option<f64>,
    /// What keeps the server from being ready, one line each.
    pub reasons: Vec<String>,
    /// In a replicated group: this engine's role (`leader`, `follower`,
    /// `starting`, `bootstrapping`, `disconnected`, `divergent`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    /// In a replicated group: the fencing epoch this engine last saw.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<u64>,
    /// The position of the state this engine serves.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied: Option<u64>,
    /// In a replicated group: the leader's URL, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader: Option<String>,
    /// While the projector converges items of the live tree to the log (a
    /// drift repair, or an upgrade's re-projection of a tree written under
    /// an older layout): how far it is. The server stays ready meanwhile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub converging: Option<Converging>,
}

/// How far the projector is in converging items of the live tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Converging {
    /// Items converged so far.
    pub done: usize,
    /// Items to converge in all.
    pub items: usize,
}
