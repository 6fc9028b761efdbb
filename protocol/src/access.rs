//! The access (assembly) queue's HTTP bodies and views (issue 12): what a
//! requester sends to `POST /access`, what `GET /access` and
//! `GET /access/{qid}` answer, and the worker's start and outcome reports.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::api::{OutcomeKind, SessionId};
use crate::history::HistoryRow;
pub use ingest_events::event::{AccessContent, AccessDelivery, AccessPackaging};

/// The body of `POST /access`: an object version to assemble. The queue is
/// chosen by `size` as mrt-store chooses it (large above the server's
/// `access_queue_size_limit`).
#[derive(Debug, PartialEq, Eq, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AccessRequestBody {
    /// The token the requester polls with; a new uuid when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// The object's ark (`ark:/NAAN/name`).
    pub ark: String,
    /// The version to assemble (0, the default, for the latest; the
    /// request records the version it resolved to).
    #[serde(default)]
    pub version: u32,
    /// `zip` (the default), `tar` or `targz`.
    #[serde(default = "default_format")]
    pub format: String,
    /// The bytes to assemble (mrt-store's `cloud-content-byte`), an
    /// admin's override: without it (and always for a depositor) the engine
    /// takes the size of the version from the inventory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    /// The storage node the object is read from (`delivery-node`; 0 when
    /// unknown).
    #[serde(default)]
    pub delivery_node: u32,
    /// `producer` (the default: the depositor's files) or `full` (every
    /// file of the version, `system/` included), as mrt-store's `content`.
    #[serde(default)]
    pub content: AccessContent,
    /// The files laid out as a BagIt bag inside the container.
    #[serde(default)]
    pub bag: bool,
}

fn default_format() -> String {
    "zip".into()
}

/// One access request as the engine's state has it (`GET /access/{qid}`).
#[derive(Debug, PartialEq, Eq, Clone, Deserialize, Serialize)]
pub struct AccessView {
    /// `qid` + 10 digits.
    pub qid: String,
    /// `small` or `large`.
    pub queue: String,
    /// Its ZooKeeper node (`/access/small/qid…`).
    pub path: String,
    /// Pending, Processing, Completed, Failed or Deleted.
    pub status: String,
    /// The message of the last move (a failure's error).
    pub message: String,
    /// The requester's token.
    pub token: String,
    /// The object's ark.
    pub ark: String,
    /// The version.
    pub version: u32,
    /// The container format.
    pub format: String,
    /// Bytes to assemble.
    pub size: u64,
    /// The storage node.
    pub delivery_node: u32,
    /// Admin requeues so far.
    pub retry_count: u32,
    /// When it was requested.
    pub created: DateTime<Utc>,
    /// When its status last changed.
    pub last_modified: DateTime<Utc>,
    /// `producer` or `full`.
    #[serde(default)]
    pub content: AccessContent,
    /// Whether the container holds a BagIt bag.
    #[serde(default)]
    pub bag: bool,
    /// Where the finished container waits (once Completed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivery: Option<AccessDelivery>,
    /// Whether the delivery's time is over: its URL answers 410 and the
    /// janitor removes the container.
    #[serde(default)]
    pub expired: bool,
    /// How far the assembly got, as its worker last said (only while
    /// Processing, and only on the engine the worker reports to: the
    /// leader of a replicated group).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<AccessProgress>,
}

/// The body of `POST /access/{qid}/progress`: how far a worker's assembly
/// got, fenced on the request's lock like its start. Not an event: the
/// engine keeps the last one in memory while the request is Processing.
#[derive(Debug, PartialEq, Eq, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AccessProgressBody {
    /// The reporting worker's name.
    pub worker: String,
    /// The worker's ZooKeeper session (the lock's owner).
    pub session_id: SessionId,
    /// The storage target being read (at most
    /// [`MAX_PROGRESS_TARGET_BYTES`]).
    pub target: String,
    /// The files packed whole so far.
    pub files: u64,
    /// The bytes of stored files read and checked so far.
    pub bytes: u64,
}

/// The longest target name a progress report may carry.
pub const MAX_PROGRESS_TARGET_BYTES: usize = 256;

/// How far a Processing request's assembly got (`GET /access/{qid}`).
#[derive(Debug, PartialEq, Eq, Clone, Deserialize, Serialize)]
pub struct AccessProgress {
    /// The worker assembling it.
    pub worker: String,
    /// The storage target being read (a failover starts again on the
    /// next).
    pub target: String,
    /// The files packed whole so far.
    pub files: u64,
    /// The bytes of stored files read and checked so far (the request's
    /// `size` is the whole).
    pub bytes: u64,
    /// When the worker said so.
    pub at: DateTime<Utc>,
}

/// `GET /access`: every request in queue order (small, then large; each
/// by id), and which queues are paused.
#[derive(Debug, PartialEq, Eq, Clone, Deserialize, Serialize)]
pub struct AccessList {
    /// The requests.
    pub items: Vec<AccessView>,
    /// The paused queues (`small`, `large`).
    pub paused: Vec<String>,
}

/// The answer of `POST /access` and of the worker's start and outcome
/// reports.
#[derive(Debug, PartialEq, Eq, Clone, Deserialize, Serialize)]
pub struct AccessMoved {
    /// The request now.
    pub request: AccessView,
    /// The events the request appended, by position.
    pub events: Vec<HistoryRow>,
}

/// The body of `POST /access/{qid}/outcome`: the assembly's outcome,
/// fenced on `/access/<queue>/QID/lock` like a job step's.
#[derive(Debug, PartialEq, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AccessOutcomeBody {
    /// The reporting worker's name (recorded as `worker:NAME`).
    pub worker: String,
    /// The worker's ZooKeeper session (the lock's owner).
    pub session_id: SessionId,
    /// Success or failure.
    pub outcome: OutcomeKind,
    /// The error of a failure.
    #[serde(default)]
    pub message: String,
    /// Where a successful assembly's container waits for its requester.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivery: Option<AccessDelivery>,
}

impl From<&ingest_events::state::AccessRequest> for AccessView {
    fn from(a: &ingest_events::state::AccessRequest) -> AccessView {
        AccessView {
            qid: a.qid.to_string(),
            queue: a.queue.name().to_string(),
            path: format!("/access/{}/{}", a.queue.name(), a.qid),
            status: a.status.to_string(),
            message: a.message.clone(),
            token: a.token.token.clone(),
            ark: a.token.ark.clone(),
            version: a.token.version,
            format: a.token.format.clone(),
            size: a.token.size,
            delivery_node: a.token.delivery_node,
            retry_count: a.retry_count,
            created: a.created,
            last_modified: a.last_modified,
            content: a.packaging.content,
            bag: a.packaging.bag,
            delivery: a.delivery.clone(),
            expired: a.delivery.as_ref().is_some_and(|d| d.expires < Utc::now()),
            progress: None,
        }
    }
}

impl AccessList {
    /// Every request of `state`, small queue first, each by id.
    pub fn of(state: &ingest_events::State) -> AccessList {
        let mut items: Vec<&ingest_events::state::AccessRequest> = state.access.values().collect();
        items.sort_by_key(|a| (a.queue, a.qid));
        AccessList {
            items: items.into_iter().map(AccessView::from).collect(),
            paused: state
                .paused_access
                .iter()
                .map(|q| q.name().to_string())
                .collect(),
        }
    }
}
