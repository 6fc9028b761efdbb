//! The Merritt ZooKeeper layout (mrt-zk 2.x): node paths and node data.
//!
//! Every path the projection writes and every byte of node data comes from
//! here, so the projector, the sink and the tools agree on them. Data is UTF-8:
//! JSON objects of the node types of `ingest_protocol::node` (their fields
//! serialise in declaration order, so the bytes never depend on a map's
//! order; workers read the same types back), plain decimal text for numbers,
//! the id for id nodes, and empty data for reference nodes.
//!
//! Where mrt-zk and the seed documents leave a choice, the choice is the one
//! that a Merritt reader (mrt-zk's `Job`/`Batch` loaders) accepts:
//! - absent strings are written as `""`, never `null` (mrt-zk reads them with
//!   `getString`), except `last_successful_status`, which mrt-zk itself
//!   writes as `null` until the first move;
//! - `/jobs/JID/identifiers` and `/jobs/JID/metadata` exist only when they
//!   carry something: mrt-zk's `createJob` skips empty ones, and its readers
//!   treat a missing node as an empty object;
//! - the `delete` of `/jobs/JID/store` is the delete list mrt-ingest writes
//!   (empty: `ingest` stores complete versions), and its `mode` the
//!   `action/nodeID/ark` mrt-store parses.

use std::fmt::Display;

use chrono::{DateTime, Utc};
use ingest_events::command::is_reserved_submission_key;
use ingest_events::event::{
    AccessQueue, Digest, Erc, Identifiers, InventoryParams, JobConfiguration, StoreParams,
    Submission,
};
use ingest_events::lifecycle::{BatchState, JobState, StateKind};
use ingest_events::state::{AccessRequest, Job, Report};
use ingest_events::{Bid, Jid, Qid};
use ingest_protocol::node::{
    payload_file_name, AccessStatusNode, AccessTokenNode, BatchStatusNode, ConfigurationNode,
    IdentifiersNode, InventoryNode, JobStatusNode, MerrittKeys, MetadataNode, StatusReportNode,
    StoreNode, SubmissionNode,
};

/// Parent of every batch.
pub const BATCHES: &str = "/batches";
/// Parent of the submission-uuid index.
pub const BATCH_UUIDS: &str = "/batch-uuids";
/// Parent of every job (and of the job queues).
pub const JOBS: &str = "/jobs";
/// Parent of the job queues, one child per job state.
pub const JOB_STATES: &str = "/jobs/states";
/// Parent of the admin locks.
pub const LOCKS: &str = "/locks";
/// Parent of the queue locks.
pub const LOCKS_QUEUE: &str = "/locks/queue";
/// Parent of the collection holds.
pub const LOCKS_COLLECTIONS: &str = "/locks/collections";
/// Present while the ingest queue is paused.
pub const QUEUE_LOCK: &str = "/locks/queue/ingest";
/// Parent of the local-id locks (`/locks/localid/<lid>_<owner>`).
pub const LOCKS_LOCALID: &str = "/locks/localid";
/// Parent of the object storage locks (`/locks/storage/ark_a_b`).
pub const LOCKS_STORAGE: &str = "/locks/storage";
/// Parent of the object inventory locks (`/locks/inventory/ark_a_b`).
pub const LOCKS_INVENTORY: &str = "/locks/inventory";

/// Parent of the access (assembly) queues.
pub const ACCESS: &str = "/access";

/// The base nodes, parents first: what mrt-zk's `initNodes` (and
/// `Access.initNodes`: `/access`, `/access/small`, `/access/large`) creates,
/// plus the lock parents its `MerrittLocks.initLocks` creates.
pub fn base_paths() -> Vec<String> {
    let mut out: Vec<String> = [BATCHES, BATCH_UUIDS, JOBS, JOB_STATES]
        .iter()
        .map(|s| s.to_string())
        .collect();
    out.extend(JobState::ALL.iter().map(|s| queue(*s)));
    out.push(ACCESS.to_string());
    out.extend(AccessQueue::ALL.iter().map(|q| access_queue(*q)));
    out.extend(LOCK_PARENTS.iter().map(|s| s.to_string()));
    out
}

/// `/access/small` or `/access/large`: one access queue; its children are
/// the requests, `qid` + 10 digits, which sort in request order (mrt-zk's
/// `acquirePendingAssembly` takes the first Pending one).
pub fn access_queue(queue: AccessQueue) -> String {
    format!("{ACCESS}/{}", queue.name())
}

/// `/access/<queue>/QID`.
pub fn access(queue: AccessQueue, qid: Qid) -> String {
    format!("{}/{qid}", access_queue(queue))
}

/// `/access/<queue>/QID/token` ([`AccessTokenNode`]).
pub fn access_token(queue: AccessQueue, qid: Qid) -> String {
    format!("{}/token", access(queue, qid))
}

/// `/access/<queue>/QID/status` ([`AccessStatusNode`]).
pub fn access_status(queue: AccessQueue, qid: Qid) -> String {
    format!("{}/status", access(queue, qid))
}

/// `/access/<queue>/QID/lock`: the ephemeral lock of the worker assembling
/// the request ([`is_ephemeral_lock`]).
pub fn access_lock(queue: AccessQueue, qid: Qid) -> String {
    format!("{}/lock", access(queue, qid))
}

/// `/locks/queue/accessSmall` or `/locks/queue/accessLarge`: present while
/// that access queue is paused (mrt-zk's `MerrittLocks`).
pub fn access_queue_lock(queue: AccessQueue) -> String {
    match queue {
        AccessQueue::Small => format!("{LOCKS_QUEUE}/accessSmall"),
        AccessQueue::Large => format!("{LOCKS_QUEUE}/accessLarge"),
    }
}

/// `/access/<queue>/QID/token` ([`AccessTokenNode`]): `status` 201 as
/// mrt-store queues a request, then the packaging, and once the container
/// is ready its URL, size, digest, ready time and expiry.
pub fn access_token_json(a: &AccessRequest) -> String {
    let t = &a.token;
    let d = a.delivery.as_ref();
    let time = |at: DateTime<Utc>| at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    json(&AccessTokenNode {
        status: 201,
        token: t.token.clone(),
        cloud_content_byte: t.size,
        delivery_node: u64::from(t.delivery_node),
        ark: t.ark.clone(),
        version: u64::from(t.version),
        format: t.format.clone(),
        content: a.packaging.content.name().to_string(),
        bag: a.packaging.bag,
        url: d.map(|d| d.url.clone()).unwrap_or_default(),
        delivery_size: d.map_or(0, |d| d.size),
        delivery_digest: d.map(|d| d.sha256.clone()).unwrap_or_default(),
        available: d.map(|d| time(d.ready)).unwrap_or_default(),
        expires: d.map(|d| time(d.expires)).unwrap_or_default(),
    })
}

/// `/access/<queue>/QID/status` ([`AccessStatusNode`]).
pub fn access_status_json(a: &AccessRequest) -> String {
    json(&AccessStatusNode {
        status: a.status.name().to_string(),
        last_modified: timestamp(a.last_modified),
        message: a.message.clone(),
    })
}

/// Every node mrt-zk's `MerrittLocks.initLocks` creates, parents first. The
/// projection creates them at start and in rebuild; only `/locks`,
/// `/locks/queue` and `/locks/collections` are its own, the object lock
/// parents are created if missing and never removed (see [`is_owned`]).
pub const LOCK_PARENTS: [&str; 6] = [
    LOCKS,
    LOCKS_QUEUE,
    LOCKS_LOCALID,
    LOCKS_STORAGE,
    LOCKS_INVENTORY,
    LOCKS_COLLECTIONS,
];

/// A lock node's name for an ark or local id, as mrt-zk's `MerrittLocks`
/// forms it: every `/` and `:/` becomes `_` (`ark:/99999/fk4x` →
/// `ark_99999_fk4x`). Characters ZooKeeper refuses in a name (controls and
/// the ranges it reserves) become `_` too, and a name of only dots gets a
/// `_`, so any input gives a valid node name; two ids that differ only
/// there share a lock, which serialises more, never less.
pub fn lock_name(id: &str) -> String {
    let merritt = id.replace(":/", "_").replace('/', "_");
    let name: String = merritt
        .chars()
        .map(|c| match c {
            '\u{0}'..='\u{1f}' | '\u{7f}'..='\u{9f}' | '\u{e000}'..='\u{f8ff}' | '\u{fff0}'.. => {
                '_'
            }
            c => c,
        })
        .collect();
    if name.chars().all(|c| c == '.') {
        format!("{name}_")
    } else {
        name
    }
}

/// `/locks/storage/ark_a_b`: held while an object is written to storage.
pub fn storage_lock(ark: &str) -> String {
    format!("{LOCKS_STORAGE}/{}", lock_name(ark))
}

/// `/locks/inventory/ark_a_b`: held while an object is recorded.
pub fn inventory_lock(ark: &str) -> String {
    format!("{LOCKS_INVENTORY}/{}", lock_name(ark))
}

/// `/locks/localid/<lid>_<owner>`: held from an object's Processing to the
/// end of its Recording, so one local id of one owner is ingested once at a
/// time (mrt-ingest's `getLocalIDLock`).
pub fn localid_lock(local_id: &str, owner: &str) -> String {
    format!(
        "{LOCKS_LOCALID}/{}",
        lock_name(&format!("{local_id}_{owner}"))
    )
}

/// The `mode` of `/jobs/JID/store` as mrt-store parses it:
/// `action/nodeID/ark`, the ark URL-encoded as Java's `URLEncoder` does
/// (`add/9501/ark%3A%2F99999%2Ffk4x`).
pub fn store_mode(action: &str, node_id: u32, ark: &str) -> String {
    let mut encoded = String::with_capacity(ark.len() * 3);
    for b in ark.bytes() {
        match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'.' | b'-' | b'*' | b'_' => {
                encoded.push(char::from(b))
            }
            b' ' => encoded.push('+'),
            b => encoded.push_str(&format!("%{b:02X}")),
        }
    }
    format!("{action}/{node_id}/{encoded}")
}

/// The four sets a batch sorts its jobs into (`/batches/BID/states/batch-*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum BatchSet {
    /// `batch-processing`: every job that is not completed, failed or deleted.
    Processing,
    /// `batch-completed`.
    Completed,
    /// `batch-failed`.
    Failed,
    /// `batch-deleted`.
    Deleted,
}

impl BatchSet {
    /// Every set.
    pub const ALL: [BatchSet; 4] = [
        BatchSet::Processing,
        BatchSet::Completed,
        BatchSet::Failed,
        BatchSet::Deleted,
    ];

    /// The node name (`batch-processing`, …).
    pub fn name(self) -> &'static str {
        match self {
            BatchSet::Processing => "batch-processing",
            BatchSet::Completed => "batch-completed",
            BatchSet::Failed => "batch-failed",
            BatchSet::Deleted => "batch-deleted",
        }
    }

    /// The set a job in `state` belongs to (mrt-zk's `batchStateSubpath`).
    pub fn of(state: JobState) -> BatchSet {
        match state {
            JobState::Failed => BatchSet::Failed,
            JobState::Completed => BatchSet::Completed,
            JobState::Deleted => BatchSet::Deleted,
            _ => BatchSet::Processing,
        }
    }
}

/// `/batches/BID`.
pub fn batch(bid: Bid) -> String {
    format!("{BATCHES}/{bid}")
}

/// `/batches/BID/submission`.
pub fn batch_submission(bid: Bid) -> String {
    format!("{BATCHES}/{bid}/submission")
}

/// `/batches/BID/status`.
pub fn batch_status(bid: Bid) -> String {
    format!("{BATCHES}/{bid}/status")
}

/// `/batches/BID/status-report`.
pub fn batch_status_report(bid: Bid) -> String {
    format!("{BATCHES}/{bid}/status-report")
}

/// `/batches/BID/states`; its absence marks a batch that was never acquired.
pub fn batch_states(bid: Bid) -> String {
    format!("{BATCHES}/{bid}/states")
}

/// `/batches/BID/lock`: the ephemeral lock of the worker acquiring or
/// reporting the batch ([`is_ephemeral_lock`]; the projection never writes
/// it).
pub fn batch_lock(bid: Bid) -> String {
    format!("{BATCHES}/{bid}/lock")
}

/// `/batches/BID/states/batch-SET`.
pub fn batch_set(bid: Bid, set: BatchSet) -> String {
    format!("{BATCHES}/{bid}/states/{}", set.name())
}

/// `/batches/BID/states/batch-SET/JID`.
pub fn batch_child(bid: Bid, set: BatchSet, jid: Jid) -> String {
    format!("{BATCHES}/{bid}/states/{}/{jid}", set.name())
}

/// `/batch-uuids/UUID`.
pub fn batch_uuid(uuid: &impl Display) -> String {
    format!("{BATCH_UUIDS}/{uuid}")
}

/// `/jobs/JID`.
pub fn job(jid: Jid) -> String {
    format!("{JOBS}/{jid}")
}

/// `/jobs/JID/bid`.
pub fn job_bid(jid: Jid) -> String {
    format!("{JOBS}/{jid}/bid")
}

/// `/jobs/JID/priority`.
pub fn job_priority(jid: Jid) -> String {
    format!("{JOBS}/{jid}/priority")
}

/// `/jobs/JID/space_needed`.
pub fn job_space_needed(jid: Jid) -> String {
    format!("{JOBS}/{jid}/space_needed")
}

/// `/jobs/JID/configuration`.
pub fn job_configuration(jid: Jid) -> String {
    format!("{JOBS}/{jid}/configuration")
}

/// `/jobs/JID/identifiers`.
pub fn job_identifiers(jid: Jid) -> String {
    format!("{JOBS}/{jid}/identifiers")
}

/// `/jobs/JID/metadata`.
pub fn job_metadata(jid: Jid) -> String {
    format!("{JOBS}/{jid}/metadata")
}

/// `/jobs/JID/status`.
pub fn job_status(jid: Jid) -> String {
    format!("{JOBS}/{jid}/status")
}

/// `/jobs/JID/lock`: the ephemeral lock of the worker running the job's
/// steps ([`is_ephemeral_lock`]; the projection never writes it).
pub fn job_lock(jid: Jid) -> String {
    format!("{JOBS}/{jid}/lock")
}

/// `/jobs/JID/store`.
pub fn job_store(jid: Jid) -> String {
    format!("{JOBS}/{jid}/store")
}

/// `/jobs/JID/inventory`.
pub fn job_inventory(jid: Jid) -> String {
    format!("{JOBS}/{jid}/inventory")
}

/// `/jobs/states/<state lower-case>`.
pub fn queue(state: JobState) -> String {
    format!("{JOB_STATES}/{}", state.queue_name())
}

/// `/jobs/states/<state lower-case>/PP-JID`, `PP` the priority as two digits.
pub fn queue_ref(state: JobState, priority: u8, jid: Jid) -> String {
    format!("{JOB_STATES}/{}/{priority:02}-{jid}", state.queue_name())
}

/// `/locks/collections/<profile>`.
pub fn collection_lock(profile: &str) -> String {
    format!("{LOCKS_COLLECTIONS}/{profile}")
}

/// Whether the projection owns `path`: the Merritt paths it writes
/// (`/batches`, `/batch-uuids`, `/jobs` and below, the queue pause lock,
/// the collection holds and the lock parents under `/locks`), but not
/// worker locks. Rebuild, repair and diff compare and change only these;
/// everything else under the root — the object locks under
/// `/locks/storage`, `/locks/inventory`, `/locks/localid`, other queues'
/// locks, other sessions' nodes — belongs to its holder. The lock parents
/// are in every tree the log gives, so a rebuild creates them and never
/// deletes them.
pub fn is_owned(path: &str) -> bool {
    if is_ephemeral_lock(path) {
        return false;
    }
    let mut parts = path.trim_start_matches('/').split('/');
    match parts.next() {
        Some("batches" | "batch-uuids" | "jobs" | "access") => true,
        Some("locks") => matches!(
            (parts.next(), parts.next(), parts.next()),
            (None, _, _)
                | (Some("queue"), None, _)
                | (Some("queue"), Some("ingest" | "accessSmall" | "accessLarge"), None)
                | (Some("collections"), _, None)
                // The object lock parents (created with the base nodes);
                // the locks under them are their holders'.
                | (Some("localid" | "storage" | "inventory"), None, _)
        ),
        _ => false,
    }
}

/// Whether `path` is a worker's ephemeral lock (`/batches/BID/lock`,
/// `/jobs/JID/lock`, `/access/<queue>/QID/lock`), which the projection never
/// writes and diffs ignore.
pub fn is_ephemeral_lock(path: &str) -> bool {
    let parts: Vec<&str> = path.splitn(7, '/').collect();
    match parts.as_slice() {
        ["", "batches" | "jobs", id, "lock"] => !id.is_empty() && *id != "states",
        ["", "access", "small" | "large", id, "lock"] => !id.is_empty(),
        _ => false,
    }
}

/// A timestamp as mrt-zk writes `last_modified` (`2024-05-16 10:11:12 +0000`).
pub fn timestamp(at: DateTime<Utc>) -> String {
    at.format("%Y-%m-%d %H:%M:%S %z").to_string()
}

/// `/batches/BID/submission`: the submission as given, with its uuid
/// ([`SubmissionNode`]).
///
/// Keys: `profile_name`, `submitter`, `payload_url`, `type`, `response_type`,
/// `submission_mode`, `erc_what`, `erc_who`, `erc_when`, `erc_where`,
/// `batchID`, then `manifest` (the inline lines) and `digest_type` /
/// `digest_value` when present, then the extra fields in key order. An extra
/// field whose name is already taken is left out: the named fields win.
pub fn submission_json(uuid: &impl Display, s: &Submission, submitted: DateTime<Utc>) -> String {
    let (digest_type, digest_value) = digest(s.digest.as_ref());
    let mut node = SubmissionNode {
        profile_name: s.profile_name.clone(),
        submitter: s.submitter.clone(),
        payload_url: s.payload_url.clone(),
        payload_type: s.payload_type.name().to_string(),
        response_type: s.response_type.clone(),
        submission_mode: s.submission_mode.name().to_string(),
        erc_what: opt(&s.erc.what),
        erc_who: opt(&s.erc.who),
        erc_when: opt(&s.erc.when),
        erc_where: opt(&s.erc.r#where),
        batch_id: uuid.to_string(),
        merritt: merritt_keys(
            &s.profile_name,
            submitted,
            &s.payload_url,
            &s.response_type,
            &s.erc,
        ),
        manifest: s.manifest.clone(),
        digest_type,
        digest_value,
        extra: Default::default(),
    };
    // An extra field may take a named key only when the named one is left
    // out of this node (an empty manifest, no digest).
    let left_out = |k: &str| match k {
        "manifest" => s.manifest.is_empty(),
        "digest_type" | "digest_value" => s.digest.is_none(),
        _ => false,
    };
    node.extra = s
        .extra
        .iter()
        .filter(|(k, _)| !is_reserved_submission_key(k) || left_out(k))
        .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
        .collect();
    json(&node)
}

/// `/batches/BID/status` ([`BatchStatusNode`]).
pub fn batch_status_json(status: BatchState, at: DateTime<Utc>, message: &str) -> String {
    json(&BatchStatusNode {
        status: status.name().to_string(),
        last_modified: timestamp(at),
        message: message.to_string(),
    })
}

/// `/batches/BID/status-report` ([`StatusReportNode`]).
pub fn status_report_json(report: &Report) -> String {
    let ids = |v: &[Jid]| v.iter().map(|j| j.to_string()).collect::<Vec<_>>();
    json(&StatusReportNode {
        last_modified: timestamp(report.at),
        failed_jobs: ids(&report.failed_jobs),
        successful_jobs: ids(&report.successful_jobs),
    })
}

/// `/jobs/JID/status` ([`JobStatusNode`]).
pub fn job_status_json(job: &Job) -> String {
    json(&JobStatusNode {
        status: job.status.name().to_string(),
        last_modified: timestamp(job.last_modified),
        message: job.message.clone(),
        last_successful_status: job.last_successful_status.map(|s| s.name().to_string()),
        retry_count: job.retry_count,
        failure: job.failure.map(|k| k.name().to_string()),
    })
}

/// `/jobs/JID/configuration` ([`ConfigurationNode`]): `digest_type` /
/// `digest_value` only when the depositor gave a digest; then the keys
/// Merritt's readers use (`type`, and [`MerrittKeys`] from the job's ERC and
/// its batch's submission time).
pub fn configuration_json(c: &JobConfiguration, erc: &Erc, submitted: DateTime<Utc>) -> String {
    let (digest_type, digest_value) = digest(c.digest.as_ref());
    json(&ConfigurationNode {
        profile_name: c.profile_name.clone(),
        submitter: c.submitter.clone(),
        payload_url: c.payload_url.clone(),
        payload_type: c.payload_type.name().to_string(),
        response_type: c.response_type.clone(),
        submission_mode: c.submission_mode.name().to_string(),
        digest_type,
        digest_value,
        merritt_type: c.payload_type.name().to_string(),
        merritt: merritt_keys(
            &c.profile_name,
            submitted,
            &c.payload_url,
            &c.response_type,
            erc,
        ),
    })
}

/// The keys Merritt's readers use, with the values mrt-ingest gives them.
fn merritt_keys(
    profile: &str,
    submitted: DateTime<Utc>,
    payload_url: &str,
    response_type: &str,
    erc: &Erc,
) -> MerrittKeys {
    MerrittKeys {
        profile: profile.to_string(),
        submission_date: submitted.format("%Y-%m-%dT%H:%M:%S%:z").to_string(),
        filename: payload_file_name(payload_url),
        response_form: response_type.to_string(),
        title: opt(&erc.what),
        creator: opt(&erc.who),
    }
}

/// `/jobs/JID/identifiers` ([`IdentifiersNode`]), or `None` when the job has
/// neither an ark nor a local id (the node is then absent, as mrt-zk leaves
/// it).
pub fn identifiers_json(ids: &Identifiers) -> Option<String> {
    if ids.primary_id.is_none() && ids.local_ids.is_empty() {
        return None;
    }
    Some(json(&IdentifiersNode {
        primary_id: opt(&ids.primary_id),
        local_id: ids.local_ids.clone(),
    }))
}

/// `/jobs/JID/metadata` ([`MetadataNode`]), or `None` when every field is
/// absent (the node is then absent).
pub fn metadata_json(erc: &Erc) -> Option<String> {
    if erc.who.is_none() && erc.what.is_none() && erc.when.is_none() && erc.r#where.is_none() {
        return None;
    }
    Some(json(&MetadataNode {
        erc_who: opt(&erc.who),
        erc_what: opt(&erc.what),
        erc_when: opt(&erc.when),
        erc_where: opt(&erc.r#where),
    }))
}

/// `/jobs/JID/store` ([`StoreNode`]): `mode` as the worker reported it
/// (`add/NODE/ark`, see [`store_mode`]), `delete` the delete list mrt-store
/// passes on in update mode. `ingest`'s steps store complete versions and
/// never send a list, so it is empty; a report's `delete: true` has no list
/// to give either and is written as empty too.
pub fn store_json(s: &StoreParams) -> String {
    json(&StoreNode {
        manifest_url: s.manifest_url.clone(),
        mode: s.mode.clone(),
        delete: String::new(),
    })
}

/// `/jobs/JID/inventory` ([`InventoryNode`]).
pub fn inventory_json(i: &InventoryParams) -> String {
    json(&InventoryNode {
        manifest_url: i.manifest_url.clone(),
        mode: i.mode.clone(),
    })
}

fn opt(v: &Option<String>) -> String {
    v.clone().unwrap_or_default()
}

fn digest(d: Option<&Digest>) -> (Option<String>, Option<String>) {
    match d {
        Some(d) => (Some(d.algorithm.clone()), Some(d.value.clone())),
        None => (None, None),
    }
}

/// A node's data: the type's fields in declaration order.
fn json(node: &impl serde::Serialize) -> String {
    // Plain strings, numbers and maps of them always serialise; the
    // fallback is unreachable.
    serde_json::to_string(node).unwrap_or_else(|_| String::from("{}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn timestamp_has_the_mrt_zk_form() {
        let at = Utc.with_ymd_and_hms(2024, 5, 16, 10, 11, 12).single();
        assert_eq!(
            at.map(timestamp).as_deref(),
            Some("2024-05-16 10:11:12 +0000")
        );
    }

    #[test]
    fn queue_refs_carry_a_two_digit_priority() {
        assert_eq!(
            queue_ref(JobState::Pending, 5, Jid(1)),
            "/jobs/states/pending/05-jid0000000001"
        );
    }

    #[test]
    fn the_projection_owns_its_paths_and_no_object_lock() {
        for owned in [
            "/batches",
            "/batches/bid0000000001/status",
            "/batch-uuids/u",
            "/jobs/states/pending/05-jid0000000001",
            "/locks",
            "/locks/queue",
            "/locks/queue/ingest",
            "/locks/collections",
            "/locks/collections/demo",
            "/locks/storage",
            "/locks/inventory",
            "/locks/localid",
            "/locks/queue/accessSmall",
            "/locks/queue/accessLarge",
            "/access",
            "/access/small",
            "/access/large/qid0000000001/status",
        ] {
            assert!(is_owned(owned), "{owned}");
        }
        for parent in LOCK_PARENTS {
            assert!(base_paths().iter().any(|p| p == parent), "{parent}");
        }
        for foreign in [
            "/jobs/jid0000000001/lock",
            "/batches/bid0000000001/lock",
            "/locks/storage/ark_99999_fk4x",
            "/locks/inventory/ark_99999_fk4x",
            "/locks/localid/loc_owner",
            "/locks/queue/other",
            "/access/small/qid0000000001/lock",
            "/zookeeper",
        ] {
            assert!(!is_owned(foreign), "{foreign}");
        }
    }

    #[test]
    fn object_lock_names_have_merritts_form_and_are_valid_node_names() {
        assert_eq!(
            storage_lock("ark:/99999/fk4x"),
            "/locks/storage/ark_99999_fk4x"
        );
        assert_eq!(
            inventory_lock("ark:/13030/m5abc"),
            "/locks/inventory/ark_13030_m5abc"
        );
        assert_eq!(
            localid_lock("L/1", "ark:/99999/owner"),
            "/locks/localid/L_1_ark_99999_owner"
        );
        assert_eq!(lock_name(".."), ".._");
        assert_eq!(lock_name("a\u{0}b\u{7f}\u{e000}\u{1f600}"), "a_b___");
        assert_eq!(
            store_mode("add", 9501, "ark:/99999/fk4 x"),
            "add/9501/ark%3A%2F99999%2Ffk4+x"
        );
    }

    #[test]
    fn lock_paths_are_recognized() {
        assert!(is_ephemeral_lock("/jobs/jid0000000001/lock"));
        assert!(is_ephemeral_lock("/batches/bid0000000001/lock"));
        assert!(!is_ephemeral_lock("/locks/queue/ingest"));
        assert!(!is_ephemeral_lock("/jobs/states/lock"));
        assert!(!is_ephemeral_lock("/jobs/jid0000000001/lock/x"));
        assert!(!is_ephemeral_lock("/jobs/jid0000000001/status"));
        assert_eq!(job_lock(Jid(1)), "/jobs/jid0000000001/lock");
        assert_eq!(batch_lock(Bid(2)), "/batches/bid0000000002/lock");
        assert!(is_ephemeral_lock(&job_lock(Jid(1))));
        assert!(is_ephemeral_lock(&batch_lock(Bid(2))));
        let qid: Qid = "qid0000000007".parse().expect("qid");
        let lock = access_lock(AccessQueue::Large, qid);
        assert_eq!(lock, "/access/large/qid0000000007/lock");
        assert!(is_ephemeral_lock(&lock));
    }

    #[test]
    fn json_keeps_key_order_and_escapes() {
        let s = store_json(&StoreParams {
            manifest_url: "http://x/\"m\"".into(),
            mode: "add".into(),
            delete: false,
        });
        assert_eq!(
            s,
            r#"{"manifest_url":"http://x/\"m\"","mode":"add","delete":""}"#
        );
        assert_eq!(identifiers_json(&Identifiers::default()), None);
    }

    /// The writer and the readers share one type: what the projector writes,
    /// a worker reads back field for field; extra fields never shadow a
    /// named one that is written.
    #[test]
    fn submission_nodes_round_trip_and_extras_never_shadow_named_keys() {
        use ingest_events::event::{PayloadType, SubmissionMode};
        let mut s = Submission {
            profile_name: "demo".into(),
            submitter: "alice".into(),
            payload_url: "https://example.org/a".into(),
            payload_type: PayloadType::File,
            response_type: "json".into(),
            submission_mode: SubmissionMode::Add,
            manifest: vec![],
            erc: Erc {
                what: Some("A title".into()),
                ..Erc::default()
            },
            digest: None,
            extra: [
                ("type".to_string(), "evil".to_string()),
                ("manifest".to_string(), "kept".to_string()),
                ("zz".to_string(), "last".to_string()),
            ]
            .into(),
        };
        let text = submission_json(&"u-1", &s, chrono::DateTime::UNIX_EPOCH);
        assert!(
            text.ends_with(r#""batchID":"u-1","profile":"demo","submissionDate":"1970-01-01T00:00:00+00:00","filename":"a","responseForm":"json","title":"A title","creator":"","manifest":"kept","zz":"last"}"#),
            "{text}"
        );
        let node: SubmissionNode =
            ingest_protocol::node::decode("/batches/BID/submission", text.as_bytes())
                .expect("reads");
        assert_eq!(node.payload_type, "file");
        assert_eq!(node.erc_what, "A title");
        assert_eq!(node.batch_id, "u-1");
        assert_eq!(node.merritt.profile, "demo", "where Merritt's readers look");
        for key in MerrittKeys::KEYS {
            assert!(is_reserved_submission_key(key), "{key}");
        }
        let written: serde_json::Value = serde_json::from_str(&text).expect("json");
        let keys: Vec<&str> = written
            .as_object()
            .expect("object")
            .keys()
            .map(String::as_str)
            .collect();
        for key in MerrittKeys::KEYS {
            assert!(keys.contains(&key), "{key} is written");
        }
        s.manifest = vec!["https://example.org/b".into()];
        let text = submission_json(&"u-1", &s, chrono::DateTime::UNIX_EPOCH);
        assert!(
            text.contains(r#""manifest":["https://example.org/b"],"zz":"last"}"#),
            "{text}"
        );
        assert!(!text.contains("evil") && !text.contains("kept"), "{text}");
    }
}
