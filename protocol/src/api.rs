//! The request and response bodies of the HTTP API, one type per body,
//! shared by the server (which parses requests and builds answers) and
//! every client (which does the reverse).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Deserializer, Serialize};

use ingest_events::event::FailureKind;

use crate::history::HistoryRow;
use crate::inventory::ObjectVersionRecord;
use crate::profile::Notification;

// ---- admin routes

/// The body of an admin action.
#[derive(Debug, PartialEq, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AdminBody {
    /// Checked for form (a name or `admin:NAME`) and otherwise ignored: the
    /// actor recorded is the admin the bearer token names (`admin:NAME` for
    /// a token of the admins file, `admin:admin` for the shared token).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub actor: Option<String>,
    /// Why; recorded with the event.
    pub reason: String,
}

/// The cleanup body.
#[derive(Debug, PartialEq, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CleanupBody {
    /// Checked for form (a name or `admin:NAME`) and otherwise ignored: the
    /// actor recorded is the admin the bearer token names (`admin:NAME` for
    /// a token of the admins file, `admin:admin` for the shared token).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub actor: Option<String>,
    /// Why; recorded with the event.
    pub reason: String,
    /// Only batches last changed before this time (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub before: Option<DateTime<Utc>>,
}

/// The cleaned up.
#[derive(Debug, PartialEq, Clone, Serialize, Deserialize)]
pub struct CleanedUp {
    /// Batches removed from the live tree.
    pub batches: Vec<String>,
    /// The events the request appended, by position.
    pub events: Vec<HistoryRow>,
}

// ---- mod routes

/// The events a command appended, as answered to clients.
#[derive(Debug, PartialEq, Clone, Serialize, Deserialize)]
pub struct Appended {
    /// One row per event, as in the history.
    pub events: Vec<HistoryRow>,
}

// ---- objects routes

/// The body of `POST /jobs/{jid}/ark` (answered [`ArkAssigned`]): a
/// fenced worker call about a job.
#[derive(Debug, PartialEq, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ArkBody {
    /// The reporting worker's name (recorded as `worker:NAME`).
    pub worker: String,
    /// The worker's ZooKeeper session (the lock's owner).
    pub session_id: SessionId,
}

/// The body of `POST /jobs/{jid}/lookup` (answered [`LookedUp`]).
#[derive(Debug, PartialEq, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LookupBody {
    /// The reporting worker's name (recorded as `worker:NAME`).
    pub worker: String,
    /// The worker's ZooKeeper session (the lock's owner).
    pub session_id: SessionId,
    /// The collection (profile name).
    pub collection: String,
    /// Local ids.
    pub local_ids: Vec<String>,
}

/// The body of `POST /jobs/{jid}/object` (answered [`ObjectRecorded`]).
#[derive(Debug, PartialEq, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ObjectBody {
    /// The reporting worker's name (recorded as `worker:NAME`).
    pub worker: String,
    /// The worker's ZooKeeper session (the lock's owner).
    pub session_id: SessionId,
    /// The inventory record of the stored version.
    pub record: ObjectVersionRecord,
}

/// An object and its versions.
#[derive(Debug, PartialEq, Clone, Serialize, Deserialize)]
pub struct ObjectView {
    /// The object's ark.
    pub ark: String,
    /// Every stored version, oldest first.
    pub versions: Vec<ObjectVersionRecord>,
}

/// The query of `GET /objects`.
#[derive(Debug, PartialEq, Eq, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ObjectQuery {
    /// The collection (profile name).
    pub collection: String,
    /// The local id.
    pub local_id: String,
}

// ---- ops routes

/// The body of `POST /faults`.
#[derive(Debug, PartialEq, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FaultBody {
    /// The job state whose step fails (`Downloading`, `storing`, …).
    pub state: String,
    /// How many of the next reports fail (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u32>,
    /// Checked for form (a name or `admin:NAME`) and otherwise ignored: the
    /// actor recorded is the admin the bearer token names (`admin:NAME` for
    /// a token of the admins file, `admin:admin` for the shared token).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub actor: Option<String>,
    /// Why; recorded with the event.
    pub reason: String,
}

/// Faults armed, by state.
#[derive(Debug, PartialEq, Clone, Serialize, Deserialize)]
pub struct FaultsView {
    /// The armed.
    pub armed: BTreeMap<String, usize>,
}

/// The answer of `GET /verify`.
#[derive(Debug, PartialEq, Clone, Serialize, Deserialize)]
pub struct Verified {
    /// The events checked.
    pub events_checked: u64,
    /// The index entries checked.
    pub index_entries_checked: u64,
    /// The head position.
    pub head_position: u64,
    /// The head hash.
    pub head_hash: String,
    /// The problems.
    pub problems: Vec<ProblemView>,
    /// Signed checkpoints checked (tree head recomputed, signature verified).
    #[serde(default)]
    pub checkpoints_checked: u64,
    /// Snapshots compared with the full fold.
    #[serde(default)]
    pub snapshots_checked: u64,
    /// The first problem by position: the cause to look at first. What the
    /// others are follows from where it is (a damaged record makes every
    /// signed checkpoint after it fail, and every snapshot after it
    /// differ).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_cause: Option<ProblemView>,
    /// The problems after the first cause, grouped by what they are about.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub after_first: Vec<ProblemGroup>,
}

/// Problems of one kind after a verify's first cause.
#[derive(Debug, PartialEq, Eq, Clone, Serialize, Deserialize)]
pub struct ProblemGroup {
    /// What they are about (`signed checkpoint`, `snapshot`, `fold`,
    /// `hash chain and index`).
    pub kind: String,
    /// How many.
    pub count: u64,
    /// The first one's position.
    pub first_position: u64,
    /// The last one's position.
    pub last_position: u64,
}

/// What the last `verify` of a data directory found, as `status` shows it.
#[derive(Debug, PartialEq, Eq, Clone, Serialize, Deserialize)]
pub struct LastVerify {
    /// When it ran (RFC 3339, UTC).
    pub at: String,
    /// The head position it verified up to.
    pub head_position: u64,
    /// How many problems it found.
    pub problems: u64,
    /// The first of them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_cause: Option<ProblemView>,
}

/// The problem view.
#[derive(Debug, PartialEq, Eq, Clone, Serialize, Deserialize)]
pub struct ProblemView {
    /// A log position.
    pub position: u64,
    /// The message recorded with the transition.
    pub message: String,
}

/// The query of `GET /tree`.
#[derive(Debug, PartialEq, Eq, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TreeQuery {
    /// A log position or an RFC 3339 time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<String>,
    /// Only this node and those under it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
}

/// The answer of `GET /diff`.
#[derive(Debug, PartialEq, Clone, Serialize, Deserialize)]
pub struct Diffed {
    /// The live tree's checkpoint (`None`: never projected).
    pub checkpoint: Option<String>,
    /// The log position compared with.
    pub position: u64,
    /// The expected nodes.
    pub expected_nodes: usize,
    /// The live nodes.
    pub live_nodes: usize,
    /// Worker locks seen (not compared).
    pub locks: Vec<String>,
    /// The missing.
    pub missing: Vec<String>,
    /// The unexpected.
    pub unexpected: Vec<String>,
    /// The differing.
    pub differing: Vec<String>,
    /// The differences as `ingest diff` prints them.
    pub text: String,
    /// Stale worker locks: lock nodes under a job or batch that no session
    /// owns (drift; `ingest diff --repair` removes them).
    #[serde(default)]
    pub stale_locks: Vec<String>,
}

/// The body of `POST /diff/repair`.
#[derive(Debug, PartialEq, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct DiffRepairBody {
    /// Checked for form (a name or `admin:NAME`) and otherwise ignored: the
    /// actor recorded is the admin the bearer token names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub actor: Option<String>,
    /// Why; recorded with every item the repair converges.
    pub reason: String,
}

/// The answer of `POST /diff/repair`: what the running projector
/// converged, and the live tree compared with the log again afterwards.
#[derive(Debug, PartialEq, Clone, Serialize, Deserialize)]
pub struct DiffRepaired {
    /// The differences found before the repair (missing, unexpected and
    /// differing nodes, and stale locks).
    pub found: usize,
    /// The items the projector rewrote (`job jid…`, `batch bid…`, a path
    /// of no item), each recorded in its history with the reason.
    pub repaired: Vec<String>,
    /// Stale locks removed (lock nodes no session owned).
    pub stale_locks_removed: Vec<String>,
    /// The position of the `TreeRepaired` record (0: nothing was changed,
    /// so nothing was recorded).
    pub position: u64,
    /// The comparison made after the repair.
    pub after: Diffed,
}

// ---- depositor routes

/// The submitted.
#[derive(Debug, PartialEq, Clone, Serialize, Deserialize)]
pub struct Submitted {
    /// The batch id.
    pub bid: String,
    /// The submission's uuid.
    pub uuid: String,
    /// The state now.
    pub status: String,
}

/// The history.
#[derive(Debug, PartialEq, Clone, Serialize, Deserialize)]
pub struct History {
    /// The batch or job (`log` for a query of the whole log).
    pub id: String,
    /// Every event, by position.
    pub events: Vec<HistoryRow>,
    /// More events matched than the query's limit: `events` holds the first.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
}

/// The uuid lookup.
#[derive(Debug, PartialEq, Clone, Serialize, Deserialize)]
pub struct UuidLookup {
    /// The submission's uuid.
    pub uuid: String,
    /// The batch id.
    pub bid: String,
    /// The state now.
    pub status: String,
}

// ---- worker routes

/// A ZooKeeper session id: a JSON integer, or a string in decimal or
/// `0x` hex (ids above 2^53 do not survive JavaScript numbers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionId(pub i64);

/// Who is reporting: the worker's name and its ZooKeeper session; the
/// whole body of `POST /jobs/{jid}/start` (answered [`JobMoved`]).
#[derive(Debug, PartialEq, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerRef {
    /// The reporting worker's name (recorded as `worker:NAME`).
    pub worker: String,
    /// The worker's ZooKeeper session (the lock's owner).
    pub session_id: SessionId,
}

/// The body of `POST /jobs/{jid}/waiting`: why a worker keeps the job
/// waiting in `state` (cut to [`crate::MAX_MESSAGE_BYTES`]).
#[derive(Debug, PartialEq, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WaitingBody {
    /// The state the job waits in.
    pub state: String,
    /// Why.
    pub reason: String,
}

/// The answer of `POST /batches/{bid}/acquire`.
#[derive(Debug, PartialEq, Clone, Serialize, Deserialize)]
pub struct Acquired {
    /// The batch id.
    pub bid: String,
    /// Processing, Held (collection on hold) or Failed (nothing to do).
    pub status: String,
    /// The jobs created, in order.
    pub jobs: Vec<String>,
    /// The priority the jobs got.
    pub priority: u8,
    /// Why the payload expanded into no jobs, when it did not expand.
    pub expansion_error: Option<String>,
    /// The batch's status message after the request: why it failed when
    /// it failed at acquisition (empty from a server older than issue 26).
    #[serde(default)]
    pub message: String,
    /// The profile's notification settings (summary at queueing, …).
    pub notification: Option<Notification>,
    /// The events the request appended, by position.
    pub events: Vec<HistoryRow>,
}

/// A job a worker expanded from a batch's payload.
#[derive(Debug, PartialEq, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct JobBody {
    /// The payload url.
    pub payload_url: String,
    /// The payload type.
    pub payload_type: String,
    /// The ark, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub primary_id: Option<String>,
    /// Local ids.
    #[serde(default)]
    pub local_ids: Vec<String>,
    /// The erc who.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub erc_who: Option<String>,
    /// The erc what.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub erc_what: Option<String>,
    /// The erc when.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub erc_when: Option<String>,
    /// The erc where.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub erc_where: Option<String>,
    /// `ALGORITHM:HEX`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
}

/// The body of `POST /batches/{bid}/acquire`: the worker, and either the
/// jobs it expanded the payload into or why the payload does not expand
/// (without both, the server expands the simple forms itself). Answered
/// [`Acquired`].
#[derive(Debug, PartialEq, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AcquireBody {
    /// The reporting worker's name (recorded as `worker:NAME`).
    pub worker: String,
    /// The worker's ZooKeeper session (the lock's owner).
    pub session_id: SessionId,
    /// The jobs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jobs: Option<Vec<JobBody>>,
    /// The expansion error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expansion_error: Option<String>,
}

/// The body of `POST /batches/{bid}/report` (answered [`Reported`]).
#[derive(Debug, PartialEq, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ReportBody {
    /// The reporting worker's name (recorded as `worker:NAME`).
    pub worker: String,
    /// The worker's ZooKeeper session (the lock's owner).
    pub session_id: SessionId,
    /// The error of sending the report, if it could not be sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notification_error: Option<String>,
}

/// The answer of `POST /batches/{bid}/report`.
#[derive(Debug, PartialEq, Clone, Serialize, Deserialize)]
pub struct Reported {
    /// The batch id.
    pub bid: String,
    /// The state now.
    pub status: String,
    /// The events the request appended, by position.
    pub events: Vec<HistoryRow>,
}

/// The most batches one answer of `GET /reporting-batches` lists.
pub const MAX_REPORTING_LISTED: usize = 1000;

/// The answer of `GET /reporting-batches?status=Reporting|UpdateReporting`:
/// the batches the engine has in that status, oldest first, at most
/// [`MAX_REPORTING_LISTED`]. The workers' reporting daemons sweep it for
/// batches no report named (a worker that died between a job's last report
/// and the batch's, an admin's update-reporting), without reading
/// ZooKeeper: its cost does not grow with the finished batches in the tree.
#[derive(Debug, PartialEq, Clone, Serialize, Deserialize)]
pub struct ReportingBatches {
    /// The status asked for (`Reporting` or `UpdateReporting`).
    pub status: String,
    /// The batch ids, oldest first.
    pub bids: Vec<String>,
    /// Whether more batches are in that status than were listed.
    pub more: bool,
}

/// The answer of `POST /jobs/{jid}/start`, `…/outcome` and `…/retries`.
#[derive(Debug, PartialEq, Clone, Serialize, Deserialize)]
pub struct JobMoved {
    /// The job id.
    pub jid: String,
    /// The job's state now.
    pub status: String,
    /// Its batch's state now (Reporting once the last job finished).
    pub batch_status: String,
    /// Its batch (empty from servers older than this field).
    #[serde(default)]
    pub bid: String,
    /// The events the request appended, by position.
    pub events: Vec<HistoryRow>,
}

/// The outcome kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OutcomeKind {
    /// The step succeeded: the job moves on.
    Success,
    /// The step failed: the job fails (an admin may requeue it).
    Failure,
}

/// The identifiers body.
#[derive(Debug, PartialEq, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct IdentifiersBody {
    /// The ark, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub primary_id: Option<String>,
    /// Local ids.
    #[serde(default)]
    pub local_ids: Vec<String>,
}

/// The store body.
#[derive(Debug, PartialEq, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct StoreBody {
    /// Where the manifest is.
    pub manifest_url: String,
    /// `add` or `update`.
    #[serde(default = "add")]
    pub mode: String,
    /// Whether files are deleted.
    #[serde(default)]
    pub delete: bool,
}

/// The inventory body.
#[derive(Debug, PartialEq, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct InventoryBody {
    /// Where the manifest is.
    pub manifest_url: String,
    /// `add` or `update`.
    #[serde(default = "add")]
    pub mode: String,
}

/// The body of `POST /jobs/{jid}/outcome`: a step's outcome (answered
/// [`JobMoved`]).
#[derive(Debug, PartialEq, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct OutcomeBody {
    /// The reporting worker's name (recorded as `worker:NAME`).
    pub worker: String,
    /// The worker's ZooKeeper session (the lock's owner).
    pub session_id: SessionId,
    /// The state the worker worked on.
    pub state: String,
    /// Success or failure.
    pub outcome: OutcomeKind,
    /// The message recorded with the transition.
    #[serde(default)]
    pub message: String,
    /// The priority (0-99, lower runs first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<u8>,
    /// The space needed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub space_needed: Option<u64>,
    /// The identifiers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identifiers: Option<IdentifiersBody>,
    /// The store.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store: Option<StoreBody>,
    /// The inventory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inventory: Option<InventoryBody>,
    /// How long the step took, for the step-duration metrics.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    /// The kind of a failure (`digest_mismatch`), only with `outcome:
    /// failure`. An unrecoverable kind makes every later requeue of the job
    /// refused (409 `unrecoverable_failure`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<FailureKind>,
}

/// The body of `POST /jobs/{jid}/retries` (answered [`JobMoved`]).
#[derive(Debug, PartialEq, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RetryBody {
    /// The reporting worker's name (recorded as `worker:NAME`).
    pub worker: String,
    /// The worker's ZooKeeper session (the lock's owner).
    pub session_id: SessionId,
    /// The state the step runs in.
    pub state: String,
    /// The attempt that follows (2 for the first retry).
    pub attempt: u32,
    /// The recoverable error.
    pub message: String,
}

impl<'de> Deserialize<'de> for SessionId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize, PartialEq, Clone)]
        #[serde(untagged)]
        enum Raw {
            Signed(i64),
            Unsigned(u64),
            Text(String),
        }
        let parsed = match Raw::deserialize(d)? {
            Raw::Signed(v) => Some(v),
            // Session ids are 64-bit patterns; ZooKeeper prints them unsigned.
            Raw::Unsigned(v) => Some(v as i64),
            Raw::Text(t) => {
                let t = t.trim();
                match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
                    Some(hex) => u64::from_str_radix(hex, 16).ok().map(|v| v as i64),
                    None => t.parse::<i64>().ok(),
                }
            }
        };
        parsed.map(SessionId).ok_or_else(|| {
            serde::de::Error::custom("a session id is an integer, or a string in decimal or 0x hex")
        })
    }
}

impl Serialize for SessionId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // As hex text: ids above 2^53 do not survive JavaScript numbers.
        s.serialize_str(&format!("{:#x}", self.0))
    }
}

fn add() -> String {
    "add".into()
}

// ---- errors

/// The body of every non-2xx answer: `{"error": {"code", "message", …}}`.
/// The server may add fields naming what was wrong (`field`, `path`, …);
/// readers ignore the ones they do not know.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// The error.
    #[serde(default)]
    pub error: ErrorDetail,
}

/// The error object of an [`ErrorBody`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorDetail {
    /// A stable code (`invalid_field`, `not_found`, `lock_not_held`, …):
    /// what callers decide on.
    #[serde(default)]
    pub code: String,
    /// A message for people; never parsed.
    #[serde(default)]
    pub message: String,
    /// With `not_leader`: the URL of the engine that leads, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader: Option<String>,
}

// ---- answers of the object routes

/// The answer of `POST /jobs/{jid}/ark`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArkAssigned {
    /// The job's ark.
    pub ark: String,
    /// `true` when it was minted now, `false` when the job had one already.
    pub minted: bool,
}

/// The answer of `POST /jobs/{jid}/lookup`: each local id's ark, `None`
/// when the inventory binds it to none.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LookedUp {
    /// Arks by local id.
    pub arks: BTreeMap<String, Option<String>>,
}

/// The answer of `POST /jobs/{jid}/object`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectRecorded {
    /// `true` when the version is new to the inventory, `false` when the
    /// same record was there already.
    pub new: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn wire(body: &impl Serialize) -> Value {
        serde_json::to_value(body).expect("serializes")
    }

    /// The worker's bodies keep the wire form the server parses: the
    /// session id as hex text, unset optional fields left out.
    #[test]
    fn worker_bodies_keep_their_wire_form() {
        let who = WorkerRef {
            worker: "w1".into(),
            session_id: SessionId(0x7f),
        };
        assert_eq!(wire(&who), json!({"worker": "w1", "session_id": "0x7f"}));
        let acquire = AcquireBody {
            worker: "w1".into(),
            session_id: SessionId(0x7f),
            jobs: Some(vec![JobBody {
                payload_url: "https://example.org/a".into(),
                payload_type: "file".into(),
                primary_id: None,
                local_ids: vec!["L1".into()],
                erc_who: Some("Doe".into()),
                erc_what: None,
                erc_when: None,
                erc_where: None,
                digest: None,
            }]),
            expansion_error: None,
        };
        assert_eq!(
            wire(&acquire),
            json!({"worker": "w1", "session_id": "0x7f", "jobs": [{
                "payload_url": "https://example.org/a", "payload_type": "file",
                "local_ids": ["L1"], "erc_who": "Doe"}]})
        );
        let outcome = OutcomeBody {
            worker: "w1".into(),
            session_id: SessionId(0x7f),
            state: "Estimating".into(),
            outcome: OutcomeKind::Success,
            message: "ok".into(),
            priority: None,
            space_needed: Some(42),
            identifiers: None,
            store: None,
            inventory: None,
            duration_ms: Some(5),
            failure: None,
        };
        assert_eq!(
            wire(&outcome),
            json!({"worker": "w1", "session_id": "0x7f", "state": "Estimating",
                "outcome": "success", "message": "ok", "space_needed": 42, "duration_ms": 5})
        );
        let mismatch = OutcomeBody {
            state: "Downloading".into(),
            outcome: OutcomeKind::Failure,
            space_needed: None,
            duration_ms: None,
            failure: Some(FailureKind::DigestMismatch),
            ..outcome.clone()
        };
        assert_eq!(
            wire(&mismatch),
            json!({"worker": "w1", "session_id": "0x7f", "state": "Downloading",
                "outcome": "failure", "message": "ok", "failure": "digest_mismatch"})
        );
        let unknown: Result<OutcomeBody, _> = serde_json::from_value(
            json!({"worker": "w1", "session_id": "0x7f", "state": "Downloading",
                "outcome": "failure", "failure": "bad_luck"}),
        );
        assert!(unknown.is_err());
        let report = ReportBody {
            worker: "w1".into(),
            session_id: SessionId(0x7f),
            notification_error: None,
        };
        assert_eq!(wire(&report), json!({"worker": "w1", "session_id": "0x7f"}));
        let retry = RetryBody {
            worker: "w1".into(),
            session_id: SessionId(0x7f),
            state: "Downloading".into(),
            attempt: 2,
            message: "503".into(),
        };
        assert_eq!(
            wire(&retry),
            json!({"worker": "w1", "session_id": "0x7f", "state": "Downloading",
                "attempt": 2, "message": "503"})
        );
        let lookup = LookupBody {
            worker: "w1".into(),
            session_id: SessionId(0x7f),
            collection: "demo".into(),
            local_ids: vec!["L1".into()],
        };
        assert_eq!(
            wire(&lookup),
            json!({"worker": "w1", "session_id": "0x7f", "collection": "demo", "local_ids": ["L1"]})
        );
        // Each body reads back as itself (the server's side of the wire).
        assert_eq!(
            serde_json::from_value::<AcquireBody>(wire(&acquire)).ok(),
            Some(acquire)
        );
        assert_eq!(
            serde_json::from_value::<OutcomeBody>(wire(&outcome)).ok(),
            Some(outcome)
        );
        assert_eq!(
            serde_json::from_value::<RetryBody>(wire(&retry)).ok(),
            Some(retry)
        );
    }

    /// The answers a worker reads decode from what the server writes.
    #[test]
    fn worker_answers_decode() {
        let row = json!({"position": 3, "time": "2026-01-01T00:00:00.000000Z",
            "actor": "worker:w1", "stream": "jid1", "version": 2, "event": "JobMoved",
            "detail": "Pending -> Estimating", "correlation_id": "c"});
        let moved: JobMoved = serde_json::from_value(json!({"jid": "jid1",
            "status": "Estimating", "batch_status": "Processing", "events": [row]}))
        .expect("JobMoved");
        assert_eq!(moved.events.len(), 1);
        let acquired: Acquired = serde_json::from_value(json!({"bid": "bid1",
            "status": "Processing", "jobs": ["jid1"], "priority": 5,
            "expansion_error": null, "notification": null, "events": []}))
        .expect("Acquired");
        assert_eq!(acquired.jobs, ["jid1"]);
        let reported: Reported = serde_json::from_value(json!({"bid": "bid1",
            "status": "Completed", "events": []}))
        .expect("Reported");
        assert_eq!(reported.status, "Completed");
    }
}
