//! The reporting views: a batch with its jobs, timings and report
//! (`GET /batches/{bid}`, `ingest show batch`), the queue by state and
//! priority (`GET /queue`), and collections (`GET /collections`). The folds
//! that compute them live in `ingest_projections::views`.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// A batch: where it stands, its jobs, its retries and how long it took.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchView {
    /// `bid0000000001`.
    pub bid: String,
    /// The submission uuid.
    pub uuid: String,
    /// The collection profile.
    pub profile: String,
    /// Who submitted it.
    pub submitter: String,
    /// The payload.
    pub payload_url: String,
    /// The payload type (`object-manifest`, …).
    pub payload_type: String,
    /// The batch state.
    pub status: String,
    /// The message of its last move.
    pub message: String,
    /// Whether cleanup removed it from the live tree.
    pub cleaned_up: bool,
    /// How many jobs it has.
    pub job_count: usize,
    /// Its jobs counted by state (states with no job left out).
    pub jobs_by_state: BTreeMap<String, usize>,
    /// Its completed jobs.
    pub successful_jobs: Vec<String>,
    /// Its failed jobs.
    pub failed_jobs: Vec<String>,
    /// The batch is Failed but none of its jobs is any more: each failed
    /// job was requeued and completed (or was deleted), and at least one
    /// completed. Its depositor still has the report that said it failed
    /// until an admin asks for an update report (`ingest batch BID
    /// update-reporting`, the UI's "Update report").
    #[serde(default)]
    pub update_report_due: bool,
    /// Retries of its jobs.
    pub retries: Retries,
    /// When it reached each stage.
    pub timings: BatchTimings,
    /// The latest report, once reported.
    pub report: Option<ReportView>,
    /// Each job, in creation order.
    pub jobs: Vec<JobView>,
}

/// Retries of a batch's jobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Retries {
    /// Admin requeues out of Failed.
    pub requeues: u32,
    /// Recoverable errors retried within a step.
    pub step_retries: u32,
}

/// When a batch reached each stage, and the time between stages.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchTimings {
    /// Submitted.
    pub submitted: DateTime<Utc>,
    /// First acquired (→ Processing).
    pub acquired: Option<DateTime<Utc>>,
    /// First reached Reporting.
    pub reporting: Option<DateTime<Utc>>,
    /// Last reached Completed.
    pub completed: Option<DateTime<Utc>>,
    /// Last reached Failed.
    pub failed: Option<DateTime<Utc>>,
    /// Deleted.
    pub deleted: Option<DateTime<Utc>>,
    /// Removed from the live tree.
    pub cleaned_up: Option<DateTime<Utc>>,
    /// Submitted → acquired.
    pub submitted_to_acquired_ms: Option<i64>,
    /// Acquired → reporting.
    pub acquired_to_reporting_ms: Option<i64>,
    /// Reporting → completed.
    pub reporting_to_completed_ms: Option<i64>,
    /// Submitted → completed.
    pub submitted_to_completed_ms: Option<i64>,
}

/// A batch report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReportView {
    /// When it was made.
    pub at: DateTime<Utc>,
    /// Whether it was an update report.
    pub update: bool,
    /// Jobs reported completed.
    pub successful_jobs: Vec<String>,
    /// Jobs reported failed.
    pub failed_jobs: Vec<String>,
}

/// A job within its batch's view.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobView {
    /// `jid0000000001`.
    pub jid: String,
    /// The job state.
    pub status: String,
    /// The state before the last successful move.
    pub last_successful_status: Option<String>,
    /// 0–99, lower runs first.
    pub priority: u8,
    /// Admin requeues.
    pub retry_count: u32,
    /// Step retries.
    pub step_retries: u32,
    /// The payload.
    pub payload_url: String,
    /// Created.
    pub created: DateTime<Utc>,
    /// In the current state since.
    pub in_state_since: DateTime<Utc>,
    /// Time spent in each state left so far (the current state not included).
    pub time_in_state_ms: BTreeMap<String, i64>,
    /// The kind of its failure when its step named one (`digest_mismatch`:
    /// it cannot be requeued, a new submission is required).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
}

/// The job queue as a whole.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueView {
    /// Whether the ingest queue is paused.
    pub paused: bool,
    /// Collections on hold.
    pub held_collections: Vec<String>,
    /// Jobs in the live tree.
    pub live_jobs: usize,
    /// Every job state with its live jobs, by priority.
    pub jobs: BTreeMap<String, QueueDepth>,
    /// Live batches by state (states with no batch left out).
    pub batches_by_state: BTreeMap<String, usize>,
}

/// The depth of one job queue.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct QueueDepth {
    /// Jobs in the queue.
    pub total: usize,
    /// Jobs by two-digit priority (`05`), in the queue's order.
    pub by_priority: BTreeMap<String, usize>,
}

/// One collection (profile).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CollectionView {
    /// The profile name.
    pub profile: String,
    /// Whether the collection is on hold.
    pub held: bool,
    /// Its live batches by state.
    pub batches_by_state: BTreeMap<String, usize>,
    /// Its live jobs by state.
    pub jobs_by_state: BTreeMap<String, usize>,
    /// Its live batches.
    pub batches: Vec<String>,
    /// Every batch it ever had, cleaned up or not.
    pub batches_total: usize,
    /// Every job it ever had, cleaned up or not.
    pub jobs_total: usize,
}
