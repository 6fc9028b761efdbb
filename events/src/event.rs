//! The events: every change to a batch, a job, or the queue as a whole.
//!
//! Each event is a struct of its own, wrapped in the [`Event`] enum. On disk an
//! event is stored under its *kind* name with its own bincode payload (see
//! [`crate::codec`]), so reordering the enum can never reinterpret old bytes,
//! and a changed payload gets a new schema version with an upcaster.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::ids::{Bid, Jid, Qid};
use crate::lifecycle::{AccessState, JobState};

/// The stream an event belongs to: one batch, one job, or the system stream
/// (queue pauses, collection holds, repairs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum StreamId {
    /// Queue-wide events.
    System,
    /// One batch.
    Batch(Bid),
    /// One job.
    Job(Jid),
    /// One access (assembly) request.
    Access(Qid),
}

impl StreamId {
    /// The key prefix of this stream in the stream index: a tag byte and the id
    /// big-endian, so a stream's events sort by version under one prefix.
    pub fn key(self) -> [u8; 9] {
        let (tag, n) = match self {
            StreamId::System => (b's', 0),
            StreamId::Batch(b) => (b'b', b.0),
            StreamId::Job(j) => (b'j', j.0),
            StreamId::Access(q) => (b'q', q.0),
        };
        let mut k = [0u8; 9];
        k[0] = tag;
        k[1..].copy_from_slice(&n.to_be_bytes());
        k
    }
}

impl fmt::Display for StreamId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StreamId::System => f.write_str("system"),
            StreamId::Batch(b) => b.fmt(f),
            StreamId::Job(j) => j.fmt(f),
            StreamId::Access(q) => q.fmt(f),
        }
    }
}

/// Who caused an event.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Actor {
    /// The kind of actor.
    pub kind: ActorKind,
    /// A name within the kind: a worker's name, an admin's user name.
    pub name: String,
}

/// The kinds of actor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[allow(missing_docs)]
pub enum ActorKind {
    Engine,
    Admin,
    Worker,
    Depositor,
}

impl Actor {
    /// The engine itself (automatic moves such as a batch reaching Reporting).
    pub fn engine() -> Actor {
        Actor {
            kind: ActorKind::Engine,
            name: "engine".into(),
        }
    }
    /// An admin by name.
    pub fn admin(name: impl Into<String>) -> Actor {
        Actor {
            kind: ActorKind::Admin,
            name: name.into(),
        }
    }
    /// A worker by name.
    pub fn worker(name: impl Into<String>) -> Actor {
        Actor {
            kind: ActorKind::Worker,
            name: name.into(),
        }
    }
    /// A depositor by name.
    pub fn depositor(name: impl Into<String>) -> Actor {
        Actor {
            kind: ActorKind::Depositor,
            name: name.into(),
        }
    }
}

impl fmt::Display for Actor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.kind {
            ActorKind::Engine => "engine",
            ActorKind::Admin => "admin",
            ActorKind::Worker => "worker",
            ActorKind::Depositor => "depositor",
        };
        if self.kind == ActorKind::Engine && self.name == "engine" {
            f.write_str(kind)
        } else {
            write!(f, "{kind}:{}", self.name)
        }
    }
}

/// A text that names none of a domain type's values (an actor, a payload
/// type, a submission mode, an access queue or content, a failure kind):
/// the message says what was given, cut to 40 characters, and what is
/// accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct UnknownName(String);

/// At most 40 characters of outside text, for a message.
fn shown(s: &str) -> String {
    s.chars().take(40).collect()
}

impl std::str::FromStr for Actor {
    type Err = UnknownName;
    /// `admin:alice`, `worker:w1`, `depositor:bob`, `engine`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (kind, name) = s.split_once(':').unwrap_or((s, ""));
        let kind = match kind {
            "engine" => ActorKind::Engine,
            "admin" => ActorKind::Admin,
            "worker" => ActorKind::Worker,
            "depositor" => ActorKind::Depositor,
            other => return Err(UnknownName(format!("unknown actor kind {:?} in {:?} (expected admin:NAME, worker:NAME, depositor:NAME or engine)", shown(other), shown(s)))),
        };
        let name = if name.is_empty() && kind == ActorKind::Engine {
            "engine"
        } else {
            name
        };
        if name.is_empty() || name.chars().any(char::is_control) {
            return Err(UnknownName(format!(
                "actor {:?} needs a name after the colon, e.g. admin:alice",
                shown(s)
            )));
        }
        Ok(Actor {
            kind,
            name: name.to_string(),
        })
    }
}

/// The kinds of payload Merritt accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum PayloadType {
    /// One file: one object.
    File,
    /// One container (zip, tar): one object.
    Container,
    /// An object manifest (`mrt-ingest-manifest`): one object of the listed files.
    ObjectManifest,
    /// `mrt-single-file-batch-manifest`: one object per line.
    SingleFileBatchManifest,
    /// `mrt-container-batch-manifest`: one object per container.
    ContainerBatchManifest,
    /// `mrt-batch-manifest`: one object per listed object manifest.
    BatchManifest,
}

impl PayloadType {
    /// Every type.
    pub const ALL: [PayloadType; 6] = [
        PayloadType::File,
        PayloadType::Container,
        PayloadType::ObjectManifest,
        PayloadType::SingleFileBatchManifest,
        PayloadType::ContainerBatchManifest,
        PayloadType::BatchManifest,
    ];

    /// The name used in submissions and in ZooKeeper (`object-manifest`, …).
    pub fn name(self) -> &'static str {
        match self {
            PayloadType::File => "file",
            PayloadType::Container => "container",
            PayloadType::ObjectManifest => "object-manifest",
            PayloadType::SingleFileBatchManifest => "single-file-batch-manifest",
            PayloadType::ContainerBatchManifest => "container-batch-manifest",
            PayloadType::BatchManifest => "batch-manifest",
        }
    }
}

impl fmt::Display for PayloadType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for PayloadType {
    type Err = UnknownName;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let folded = s.to_ascii_lowercase().replace('_', "-");
        let folded = folded.strip_prefix("mrt-").unwrap_or(&folded);
        Self::ALL
            .iter()
            .copied()
            .find(|t| {
                t.name() == folded
                    || (folded == "ingest-manifest" && *t == PayloadType::ObjectManifest)
            })
            .ok_or_else(|| {
                UnknownName(format!(
                    "unknown payload type {:?} (expected one of {})",
                    shown(s),
                    Self::ALL
                        .iter()
                        .map(|t| t.name())
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            })
    }
}

/// Whether a submission adds new objects or new versions of existing ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[allow(missing_docs)]
pub enum SubmissionMode {
    Add,
    Update,
}

impl SubmissionMode {
    /// `add` or `update`.
    pub fn name(self) -> &'static str {
        match self {
            SubmissionMode::Add => "add",
            SubmissionMode::Update => "update",
        }
    }
}

impl std::str::FromStr for SubmissionMode {
    type Err = UnknownName;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "add" => Ok(SubmissionMode::Add),
            "update" => Ok(SubmissionMode::Update),
            _ => Err(UnknownName(format!(
                "unknown submission mode {:?} (expected add or update)",
                shown(s)
            ))),
        }
    }
}

/// A depositor's submission: what `POST /batches` and `ingest submit` take.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Submission {
    /// The collection profile.
    pub profile_name: String,
    /// Who submitted it.
    pub submitter: String,
    /// Where the payload is.
    pub payload_url: String,
    /// What kind of payload it is.
    pub payload_type: PayloadType,
    /// How the depositor wants the response (`json`, `xml`, …); free text.
    pub response_type: String,
    /// Add or update.
    pub submission_mode: SubmissionMode,
    /// Inline manifest lines (`file1.checkm loc001`, `file3.checkm loc003 ark123`).
    pub manifest: Vec<String>,
    /// ERC who/what/when/where.
    pub erc: Erc,
    /// The depositor's digest of a single-file payload (`(algorithm, hex)`).
    pub digest: Option<Digest>,
    /// Any further fields, kept and projected as given.
    pub extra: BTreeMap<String, String>,
}

/// A digest a depositor supplied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Digest {
    /// `md5`, `sha1`, `sha256`, `sha512`.
    pub algorithm: String,
    /// Lower-case hex.
    pub value: String,
}

/// Electronic Resource Citation fields.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[allow(missing_docs)]
pub struct Erc {
    pub who: Option<String>,
    pub what: Option<String>,
    pub when: Option<String>,
    pub r#where: Option<String>,
}

/// A job's configuration (`/jobs/JID/configuration`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobConfiguration {
    /// The collection profile.
    pub profile_name: String,
    /// Who submitted the batch.
    pub submitter: String,
    /// This job's payload.
    pub payload_url: String,
    /// This job's payload type.
    pub payload_type: PayloadType,
    /// The depositor's response type.
    pub response_type: String,
    /// Add or update.
    pub submission_mode: SubmissionMode,
    /// The depositor's digest of this job's payload, if any.
    pub digest: Option<Digest>,
}

/// A job's identifiers (`/jobs/JID/identifiers`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identifiers {
    /// The ark, once supplied or minted.
    pub primary_id: Option<String>,
    /// The depositor's local ids.
    pub local_ids: Vec<String>,
}

/// Parameters of the storage step (`/jobs/JID/store`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreParams {
    /// Where the storage manifest is.
    pub manifest_url: String,
    /// `add` or `update`.
    pub mode: String,
    /// Whether files absent from the manifest are deleted.
    pub delete: bool,
}

/// Parameters of the inventory step (`/jobs/JID/inventory`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InventoryParams {
    /// Where the storage manifest is.
    pub manifest_url: String,
    /// `add` or `update`.
    pub mode: String,
}

/// The two access (assembly) queues of mrt-zk, `/access/small` and
/// `/access/large`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum AccessQueue {
    /// `/access/small`.
    Small,
    /// `/access/large`.
    Large,
}

impl AccessQueue {
    /// Both queues, small first.
    pub const ALL: [AccessQueue; 2] = [AccessQueue::Small, AccessQueue::Large];

    /// Merritt's default `QueueSizeLimit` (mrt-store's `storeConfig.yml`):
    /// a request for more bytes than this goes to the large queue.
    pub const DEFAULT_SIZE_LIMIT: u64 = 500_000_000;

    /// The queue mrt-store's `QueueUtil.queueAccessRequest` chooses: large
    /// when `cloud-content-byte` exceeds the limit, small otherwise.
    pub fn for_size(bytes: u64, limit: u64) -> AccessQueue {
        if bytes > limit {
            AccessQueue::Large
        } else {
            AccessQueue::Small
        }
    }

    /// `small` or `large`, as in the ZooKeeper path.
    pub fn name(self) -> &'static str {
        match self {
            AccessQueue::Small => "small",
            AccessQueue::Large => "large",
        }
    }
}

impl fmt::Display for AccessQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for AccessQueue {
    type Err = UnknownName;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "small" => Ok(AccessQueue::Small),
            "large" => Ok(AccessQueue::Large),
            _ => Err(UnknownName(format!(
                "{:?} is not an access queue (small or large)",
                shown(s)
            ))),
        }
    }
}

/// What an assembly request asks for: the data of mrt-zk's
/// `/access/<queue>/qid…/token` node (mrt-store's request JSON: `token`,
/// `cloud-content-byte`, `delivery-node`) and the object version it
/// assembles.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccessToken {
    /// The token the requester polls with (mrt-store: a uuid).
    pub token: String,
    /// The object's ark.
    pub ark: String,
    /// The version to assemble (0 for the latest).
    pub version: u32,
    /// The container format (`zip`, `tar`, `targz`).
    pub format: String,
    /// The bytes to assemble (`cloud-content-byte`); chooses the queue.
    pub size: u64,
    /// The storage node the object is read from (`delivery-node`).
    pub delivery_node: u32,
}

/// Which files of the version an assembly puts in its container
/// (mrt-store's `content` parameter).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AccessContent {
    /// The depositor's files (`producer/…`) only: mrt-store's default.
    #[default]
    Producer,
    /// Every file of the version, `system/…` included.
    Full,
    /// The whole object: every version, each with every file, under its
    /// own `vN/` (as Merritt's object download). Added after the first
    /// two, so older records decode as before.
    Object,
}

impl AccessContent {
    /// Its name on the wire: `producer` or `full`.
    pub fn name(self) -> &'static str {
        match self {
            AccessContent::Producer => "producer",
            AccessContent::Full => "full",
            AccessContent::Object => "object",
        }
    }
}

impl fmt::Display for AccessContent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for AccessContent {
    type Err = UnknownName;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "producer" => Ok(AccessContent::Producer),
            "full" => Ok(AccessContent::Full),
            "object" => Ok(AccessContent::Object),
            _ => Err(UnknownName(format!(
                "{:?} is not an assembly content (producer, full or object)",
                shown(s)
            ))),
        }
    }
}

/// How a request's container is packed beyond its format: which files, and
/// whether they are laid out as a BagIt bag. The default (producer files,
/// no bag) is what a request without `AccessPackagingChosen` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct AccessPackaging {
    /// Producer files or the full version.
    pub content: AccessContent,
    /// A BagIt bag (`bagit.txt`, `data/`, manifests) inside the container.
    pub bag: bool,
}

/// Where a finished container waits for its requester.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccessDelivery {
    /// The download URL (unguessable; served until `expires`).
    pub url: String,
    /// The container's size in bytes.
    pub size: u64,
    /// The container's SHA-256 (hex).
    pub sha256: String,
    /// The storage target it was assembled from.
    pub target: String,
    /// The version assembled (the latest resolved to its number).
    pub version: u32,
    /// When it was ready.
    pub ready: chrono::DateTime<chrono::Utc>,
    /// When the URL stops answering (410 after).
    pub expires: chrono::DateTime<chrono::Utc>,
}

/// The kind of a job's failure, where the kind decides what may follow.
/// A step's failure without a kind is an ordinary one, which an admin may
/// requeue.
///
/// On the wire (the outcome body, views, the job's status node) a kind is its
/// [`FailureKind::name`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum FailureKind {
    /// The payload's digest does not match the digest the depositor supplied
    /// with it (the transitions document's "Job: Pending --> Failed":
    /// "Recovery is not possible under these conditions. A new submission
    /// will be required."). Unrecoverable.
    DigestMismatch,
}

impl FailureKind {
    /// Every kind.
    pub const ALL: [FailureKind; 1] = [FailureKind::DigestMismatch];

    /// Its name on the wire: `digest_mismatch`.
    pub fn name(self) -> &'static str {
        match self {
            FailureKind::DigestMismatch => "digest_mismatch",
        }
    }

    /// Whether a requeue may recover a job that failed this way.
    pub fn recoverable(self) -> bool {
        match self {
            FailureKind::DigestMismatch => false,
        }
    }

    /// What happened, for messages and reports.
    pub fn explanation(self) -> &'static str {
        match self {
            FailureKind::DigestMismatch => {
                "the payload's digest does not match the digest the depositor supplied"
            }
        }
    }

    /// What follows such a failure, for messages and reports.
    pub fn remedy(self) -> &'static str {
        match self.recoverable() {
            true => "an admin may requeue the job",
            false => "it cannot be requeued: a new submission is required",
        }
    }
}

impl fmt::Display for FailureKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for FailureKind {
    type Err = UnknownName;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        FailureKind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| {
                UnknownName(format!(
                    "{:?} is not a kind of failure ({})",
                    shown(s),
                    FailureKind::ALL.map(FailureKind::name).join(", ")
                ))
            })
    }
}

/// What the projector found on a node of the live tree that was not what
/// the log says ([`ForeignChangeRepaired`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum ForeignChangeKind {
    /// The log says the node exists; it was gone.
    Missing,
    /// The node exists, with other data than the log's.
    Changed,
    /// The node exists; the log says it does not.
    Extra,
}

impl ForeignChangeKind {
    /// Every kind, in order.
    pub const ALL: [ForeignChangeKind; 3] = [
        ForeignChangeKind::Missing,
        ForeignChangeKind::Changed,
        ForeignChangeKind::Extra,
    ];

    /// The kind's name, as metrics label it (`missing`, `changed`, `extra`).
    pub fn name(self) -> &'static str {
        match self {
            ForeignChangeKind::Missing => "missing",
            ForeignChangeKind::Changed => "changed",
            ForeignChangeKind::Extra => "extra",
        }
    }

    /// What the projector did about it (`created`, `set`, `deleted`).
    pub fn action(self) -> &'static str {
        match self {
            ForeignChangeKind::Missing => "created",
            ForeignChangeKind::Changed => "set",
            ForeignChangeKind::Extra => "deleted",
        }
    }
}

impl fmt::Display for ForeignChangeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One node of a [`ForeignChangeRepaired`]: what was found and what
/// ZooKeeper says about who wrote it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForeignNode {
    /// What was wrong with it; the projector's action follows from it
    /// ([`ForeignChangeKind::action`]).
    pub kind: ForeignChangeKind,
    /// The node's path under the root.
    pub path: String,
    /// The data found (UTF-8, lossy), cut to [`ForeignNode::MAX_FOUND_BYTES`];
    /// empty for a missing node.
    pub found: String,
    /// The zxid of the node's last change (ZooKeeper's `mzxid`; 0 when the
    /// node was missing): the server's transaction log names the session
    /// that made it.
    pub zxid: i64,
    /// When the node was last changed (`mtime`, milliseconds since the Unix
    /// epoch; 0 when missing).
    pub mtime: i64,
    /// The session owning the node, for an ephemeral node (0 otherwise:
    /// ZooKeeper keeps no writer's session for a persistent node).
    pub session: i64,
}

impl ForeignNode {
    /// The most bytes of found data kept.
    pub const MAX_FOUND_BYTES: usize = 256;
}

macro_rules! events {
    ($($(#[$doc:meta])* $kind:ident $body:tt)+) => {
        $(
            $(#[$doc])*
            ///
            /// Its fields are named as in the ZooKeeper layout and the seed documents.
            #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
            #[allow(missing_docs)]
            pub struct $kind $body
        )+

        /// Every change the engine records.
        #[derive(Debug, Clone, PartialEq, Eq)]
        #[allow(missing_docs)]
        pub enum Event {
            $($kind($kind)),+
        }

        impl Event {
            /// Every kind name, as stored on disk.
            pub const KINDS: &'static [&'static str] = &[$(stringify!($kind)),+];

            /// This event's kind name, as stored on disk.
            pub fn kind(&self) -> &'static str {
                match self { $(Event::$kind(_) => stringify!($kind)),+ }
            }

            /// Encodes the payload alone (current schema).
            pub(crate) fn encode_payload(&self) -> Vec<u8> {
                match self { $(Event::$kind(p) => crate::wire::encode_value(p)),+ }
            }

            /// Decodes a payload of the current schema.
            pub(crate) fn decode_payload(kind: &str, bytes: &[u8]) -> Result<Event, crate::wire::DecodeError> {
                match kind {
                    $(stringify!($kind) => Ok(Event::$kind(crate::wire::decode_value(bytes)?)),)+
                    other => Err(crate::wire::DecodeError::UnknownKind(other.to_string())),
                }
            }
        }

        $(
            impl From<$kind> for Event {
                fn from(e: $kind) -> Event { Event::$kind(e) }
            }
        )+
    };
}

events! {
    /// A depositor submitted a batch (→ Pending).
    BatchSubmitted { pub uuid: Uuid, pub submission: Submission }
    /// The batch's collection was held when it was acquired (Pending → Held).
    BatchHeld { pub reason: String }
    /// A held batch was released (Held → Pending).
    BatchReleased { pub reason: String }
    /// The batch was acquired and expanded into these jobs, created by the
    /// `JobCreated` events of the same append (Pending → Processing).
    BatchAcquired { pub jobs: Vec<Jid> }
    /// Every job of the batch finished (Processing → Reporting).
    BatchReportingStarted { pub reason: String }
    /// The batch was reported (`/batches/BID/status-report`).
    BatchReported { pub successful_jobs: Vec<Jid>, pub failed_jobs: Vec<Jid>, pub update: bool }
    /// An admin asked for a new report of a failed batch (Failed → UpdateReporting).
    BatchUpdateReporting { pub reason: String }
    /// The batch ended well (→ Completed).
    BatchCompleted { pub message: String }
    /// The batch ended with failures (→ Failed).
    BatchFailed { pub message: String }
    /// An admin deleted the batch (→ Deleted).
    BatchDeleted { pub reason: String }
    /// Cleanup removed the finished batch and its jobs from the live tree; the
    /// history stays in the log.
    BatchCleanedUp { pub jobs: Vec<Jid> }
    /// A job was created in its batch (→ Pending).
    JobCreated {
        pub bid: Bid,
        pub priority: u8,
        pub configuration: JobConfiguration,
        pub identifiers: Identifiers,
        pub metadata: Erc,
    }
    /// A job moved from one state to another.
    JobStatusChanged {
        pub from: JobState,
        pub to: JobState,
        pub message: String,
        /// An admin requeue (`retry_count` grows by one).
        pub retry: bool,
        /// A new priority set together with the move.
        pub priority: Option<u8>,
    }
    /// The estimating step measured the space the job needs.
    JobSpaceEstimated { pub space_needed: u64, pub priority: Option<u8> }
    /// The job's ark and local ids were assigned.
    JobIdentifiersAssigned { pub identifiers: Identifiers }
    /// The storage step's parameters.
    JobStoreRecorded { pub store: StoreParams }
    /// The inventory step's parameters.
    JobInventoryRecorded { pub inventory: InventoryParams }
    /// An admin deleted the job (→ Deleted).
    JobDeleted { pub from: JobState, pub reason: String }
    /// A step hit a recoverable error and will try again.
    JobStepRetried { pub state: JobState, pub attempt: u32, pub message: String }
    /// The failure that just moved the job to Failed (the `JobStatusChanged`
    /// before it, in the same append) is of this kind. An unrecoverable kind
    /// ([`FailureKind::recoverable`]) refuses every requeue: the job can only
    /// be deleted, and the depositor must submit again.
    JobFailureClassified { pub kind: FailureKind }
    /// A collection was held: its new batches and jobs are parked in Held.
    CollectionHeld { pub profile: String, pub reason: String }
    /// A collection hold was released.
    CollectionReleased { pub profile: String, pub reason: String }
    /// The ingest queue was paused: no job leaves Pending.
    QueuePaused { pub reason: String }
    /// The ingest queue was resumed.
    QueueResumed { pub reason: String }
    /// An admin repaired drift between the live ZooKeeper tree and the log.
    TreeRepaired { pub paths: Vec<String> }
    /// An admin applied the repair of a consistency finding (`ingest check
    /// --repair`, `POST /consistency/repair`): the finding, its rule, the
    /// action, what it changed (ZooKeeper paths deleted, or the storage
    /// target, ark and version recorded in the inventory) and why.
    /// Changes nothing in the state or the tree.
    ConsistencyRepaired {
        pub finding: String,
        pub rule: String,
        pub action: String,
        pub paths: Vec<String>,
        pub reason: String,
    }
    /// A signed checkpoint: the engine's Ed25519 signature over the RFC 9162
    /// Merkle tree head of the log's first `tree_size` records (every record
    /// before this one; see [`crate::merkle`] and [`LogCheckpointed::signed_bytes`]).
    /// Changes nothing in the state or the tree.
    LogCheckpointed {
        pub tree_size: u64,
        pub root: [u8; 32],
        /// The raw 32-byte Ed25519 public key that signed.
        pub public_key: [u8; 32],
        /// The 64-byte Ed25519 signature over [`LogCheckpointed::signed_bytes`].
        pub signature: Vec<u8>,
    }
    /// An admin armed faults: the next `count` successful reports of the
    /// step of `state` are recorded as failures naming this record's actor
    /// and `reason`. Kept in the state, so a restart keeps them armed.
    FaultsArmed { pub state: JobState, pub count: u32, pub reason: String }
    /// An armed fault of `state` fired: a successful report of that step
    /// was recorded as a failure (in the same append).
    FaultFired { pub state: JobState, pub jid: Jid }
    /// An admin disarmed every fault (`disarmed` of them).
    FaultsCleared { pub disarmed: u32 }
    /// An assembly request was queued on the access queue its size chose
    /// (→ Pending).
    AccessRequested { pub queue: AccessQueue, pub token: AccessToken }
    /// An assembly request moved from one state to another (a worker
    /// started it or reported its outcome; an admin requeued or deleted it).
    AccessStatusChanged {
        pub from: AccessState,
        pub to: AccessState,
        pub message: String,
        /// An admin requeue (Failed → Pending, as Merritt's admin tool does).
        pub requeue: bool,
    }
    /// The request asks for other packaging than producer files without a
    /// bag (in the same append as its `AccessRequested`).
    AccessPackagingChosen { pub packaging: AccessPackaging }
    /// The assembly's container is ready for download (in the same append
    /// as the move to Completed).
    AccessDelivered { pub delivery: AccessDelivery }
    /// An admin paused one access queue: no request of it starts.
    AccessQueuePaused { pub queue: AccessQueue, pub reason: String }
    /// An admin resumed one access queue.
    AccessQueueResumed { pub queue: AccessQueue, pub reason: String }
    /// The projector found nodes of one item (a job, a batch, an access
    /// request, a pause or hold lock) that another ZooKeeper client had
    /// changed, and converged them back to the log's view in its own fenced
    /// transaction: `item` names it, `nodes` what was found, `reason` what
    /// showed it (the projector's own transaction that failed, or a watch).
    /// Recorded on the item's stream (the system stream for locks and items
    /// the state no longer holds). Changes nothing in the state or the tree.
    ForeignChangeRepaired { pub item: String, pub nodes: Vec<ForeignNode>, pub reason: String }
}

/// The domain separator that starts every signed tree head.
pub const TREE_HEAD_CONTEXT: &[u8] = b"ingest tree head v1\n";

impl LogCheckpointed {
    /// What the signature covers: [`TREE_HEAD_CONTEXT`], the tree size
    /// (8 bytes, big-endian) and the 32-byte root.
    pub fn signed_bytes(tree_size: u64, root: &[u8; 32]) -> Vec<u8> {
        let mut m = TREE_HEAD_CONTEXT.to_vec();
        m.extend_from_slice(&tree_size.to_be_bytes());
        m.extend_from_slice(root);
        m
    }
}

impl Event {
    /// A one-line description for history listings (the transition, or what was recorded).
    pub fn describe(&self) -> String {
        match self {
            Event::BatchSubmitted(e) => format!(
                "submitted ({} {} by {})",
                e.submission.payload_type, e.submission.payload_url, e.submission.submitter
            ),
            Event::BatchHeld(e) => format!("Pending -> Held ({})", e.reason),
            Event::BatchReleased(e) => format!("Held -> Pending ({})", e.reason),
            Event::BatchAcquired(e) => format!("Pending -> Processing ({} jobs)", e.jobs.len()),
            Event::BatchReportingStarted(e) => format!("Processing -> Reporting ({})", e.reason),
            Event::BatchReported(e) => format!(
                "{}reported: {} successful, {} failed",
                if e.update { "update " } else { "" },
                e.successful_jobs.len(),
                e.failed_jobs.len()
            ),
            Event::BatchUpdateReporting(e) => format!("Failed -> UpdateReporting ({})", e.reason),
            Event::BatchCompleted(e) => format!("-> Completed ({})", e.message),
            Event::BatchFailed(e) => format!("-> Failed ({})", e.message),
            Event::BatchDeleted(e) => format!("-> Deleted ({})", e.reason),
            Event::BatchCleanedUp(e) => {
                format!("cleaned up from the live tree ({} jobs)", e.jobs.len())
            }
            Event::JobCreated(e) => format!(
                "created in {} at priority {:02} ({} {})",
                e.bid, e.priority, e.configuration.payload_type, e.configuration.payload_url
            ),
            Event::JobStatusChanged(e) => {
                let mut s = format!("{} -> {}", e.from, e.to);
                if e.retry {
                    s.push_str(" (requeue)");
                }
                if let Some(p) = e.priority {
                    s.push_str(&format!(" priority {p:02}"));
                }
                if !e.message.is_empty() {
                    s.push_str(&format!(": {}", e.message));
                }
                s
            }
            Event::JobSpaceEstimated(e) => match e.priority {
                Some(p) => format!("space needed {} bytes, priority {p:02}", e.space_needed),
                None => format!("space needed {} bytes", e.space_needed),
            },
            Event::JobIdentifiersAssigned(e) => format!(
                "identifiers: {} [{}]",
                e.identifiers.primary_id.as_deref().unwrap_or("-"),
                e.identifiers.local_ids.join(";")
            ),
            Event::JobStoreRecorded(e) => {
                format!("store: {} ({})", e.store.manifest_url, e.store.mode)
            }
            Event::JobInventoryRecorded(e) => format!(
                "inventory: {} ({})",
                e.inventory.manifest_url, e.inventory.mode
            ),
            Event::JobDeleted(e) => format!("{} -> Deleted ({})", e.from, e.reason),
            Event::JobStepRetried(e) => format!("{} retry {}: {}", e.state, e.attempt, e.message),
            Event::JobFailureClassified(e) => format!(
                "failure kind {}: {}; {}",
                e.kind,
                e.kind.explanation(),
                e.kind.remedy()
            ),
            Event::CollectionHeld(e) => format!("collection {} held ({})", e.profile, e.reason),
            Event::CollectionReleased(e) => {
                format!("collection {} released ({})", e.profile, e.reason)
            }
            Event::QueuePaused(e) => format!("queue paused ({})", e.reason),
            Event::QueueResumed(e) => format!("queue resumed ({})", e.reason),
            Event::TreeRepaired(e) => format!("tree repaired ({} paths)", e.paths.len()),
            Event::ConsistencyRepaired(e) => format!(
                "consistency repair {} of {} ({} path(s)): {}",
                e.action,
                e.finding,
                e.paths.len(),
                e.reason
            ),
            Event::LogCheckpointed(e) => format!(
                "checkpoint: tree head over {} records, root {}",
                e.tree_size,
                hex::encode(e.root)
            ),
            Event::FaultsArmed(e) => {
                format!("{} fault(s) armed for {} ({})", e.count, e.state, e.reason)
            }
            Event::FaultFired(e) => format!("a fault of {} fired on {}", e.state, e.jid),
            Event::FaultsCleared(e) => format!("{} armed fault(s) cleared", e.disarmed),
            Event::AccessRequested(e) => format!(
                "assembly of {} v{} as {} ({} bytes) queued on {}",
                e.token.ark, e.token.version, e.token.format, e.token.size, e.queue
            ),
            Event::AccessStatusChanged(e) => {
                let mut s = format!("{} -> {}", e.from, e.to);
                if e.requeue {
                    s.push_str(" (requeue)");
                }
                if !e.message.is_empty() {
                    s.push_str(&format!(": {}", e.message));
                }
                s
            }
            Event::AccessPackagingChosen(e) => format!(
                "packed as {} files{}",
                e.packaging.content,
                if e.packaging.bag {
                    " in a BagIt bag"
                } else {
                    ""
                }
            ),
            Event::AccessDelivered(e) => format!(
                "v{} assembled from {}: {} bytes at {} until {}",
                e.delivery.version,
                e.delivery.target,
                e.delivery.size,
                e.delivery.url,
                e.delivery.expires.to_rfc3339()
            ),
            Event::AccessQueuePaused(e) => {
                format!("access queue {} paused ({})", e.queue, e.reason)
            }
            Event::AccessQueueResumed(e) => {
                format!("access queue {} resumed ({})", e.queue, e.reason)
            }
            Event::ForeignChangeRepaired(e) => {
                let mut s = format!("foreign change to {} reverted:", e.item);
                for (i, n) in e.nodes.iter().enumerate() {
                    if i == 4 {
                        s.push_str(&format!(" and {} more", e.nodes.len() - i));
                        break;
                    }
                    s.push_str(&format!(
                        "{} {} {} ({})",
                        if i == 0 { "" } else { ";" },
                        n.kind,
                        n.path,
                        n.kind.action()
                    ));
                }
                if !e.reason.is_empty() {
                    s.push_str(&format!(" [{}]", e.reason));
                }
                s
            }
        }
    }
}

#[cfg(test)]
mod name_tests {
    use super::*;

    /// A name that is none of a type's values is refused with a message
    /// that quotes at most 40 characters of it (three of them quoted the
    /// whole input).
    #[test]
    fn an_unknown_name_is_refused_and_quoted_cut() {
        let long = "x".repeat(10_000);
        let messages = [
            long.parse::<Actor>().expect_err("actor").to_string(),
            format!("{long}:a")
                .parse::<Actor>()
                .expect_err("kind")
                .to_string(),
            "admin:".parse::<Actor>().expect_err("no name").to_string(),
            long.parse::<PayloadType>().expect_err("type").to_string(),
            long.parse::<SubmissionMode>()
                .expect_err("mode")
                .to_string(),
            long.parse::<AccessQueue>().expect_err("queue").to_string(),
            long.parse::<AccessContent>()
                .expect_err("content")
                .to_string(),
            long.parse::<FailureKind>().expect_err("kind").to_string(),
        ];
        for m in &messages {
            assert!(m.len() < 300, "{} bytes: {}", m.len(), &m[..80]);
        }
        assert!(messages[3].contains("expected one of"), "{}", messages[3]);
        assert_eq!(
            "admin:alice".parse::<Actor>().map(|a| a.to_string()),
            Ok("admin:alice".into())
        );
    }
}
