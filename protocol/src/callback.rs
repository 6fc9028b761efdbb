//! What `ingest` POSTs to a collection profile's callback URL: one body
//! when a job completes ([`JobCallback`]) and one when a batch is reported
//! ([`BatchCallback`]). Depositors' receivers parse these.

use serde::{Deserialize, Serialize};

/// Sent when a job completes (Notify).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobCallback {
    /// The job.
    pub jid: String,
    /// Its batch.
    pub bid: String,
    /// `Completed`.
    pub status: String,
    /// The object's ark (`null` when the job has none).
    pub ark: Option<String>,
    /// The depositor's local ids.
    pub local_ids: Vec<String>,
    /// The collection profile.
    pub profile: String,
    /// Who submitted.
    pub submitter: String,
    /// A sentence for people.
    pub message: String,
}

/// Sent when a batch is reported (Reporting, UpdateReporting).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchCallback {
    /// The batch.
    pub bid: String,
    /// Its state when reported.
    pub status: String,
    /// The collection profile (`null` when unset).
    pub profile: Option<String>,
    /// Who submitted (`null` when unset).
    pub submitter: Option<String>,
    /// How many jobs completed.
    pub completed: usize,
    /// How many failed.
    pub failed: usize,
    /// Every job of the report.
    pub jobs: Vec<ReportJob>,
    /// Why the batch failed as a whole, when it did without jobs (its
    /// payload did not expand: a manifest that cannot be fetched or parsed,
    /// an empty one); absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// One job in a batch report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReportJob {
    /// The job id.
    pub jid: String,
    /// Its ark, once it has one.
    pub ark: Option<String>,
    /// The depositor's local ids.
    pub local_ids: Vec<String>,
    /// `Completed` or `Failed`.
    pub status: String,
    /// The job's last message (why it failed).
    pub message: String,
    /// The kind of its failure when its step named one (`digest_mismatch`:
    /// it cannot be requeued, a new submission is required); absent
    /// otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
}

/// Sent when an access request ended: its container is ready to download
/// (`Completed`, with the delivery's URL, size, digest and expiry) or its
/// assembly failed (`Failed`, with the reason). It goes to the callback of
/// the profile of the object's collection, as a batch's report does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccessCallback {
    /// The request (`qid` + 10 digits).
    pub qid: String,
    /// The requester's token.
    pub token: String,
    /// `Completed` or `Failed`.
    pub status: String,
    /// The object's ark.
    pub ark: String,
    /// The version asked for (0: the latest).
    pub version: u64,
    /// The collection profile.
    pub profile: String,
    /// Where the container is downloaded (`Completed` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// The container's bytes (`Completed` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    /// The container's SHA-256, hex (`Completed` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// When the URL stops answering (RFC 3339; `Completed` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires: Option<String>,
    /// A sentence for people (a failure's reason).
    pub message: String,
}
