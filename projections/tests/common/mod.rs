//! Shared helpers of the projection tests: a harness that runs commands
//! through `decide` and a real sled log, the data-driven scenario runner, an
//! independent "expected tree from state" oracle, the invariant checks of
//! DESIGN.md, and a readable text diff.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use chrono::{DateTime, Duration, TimeZone, Utc};
use ingest_events::codec::{Envelope, SCHEMA_VERSION};
use ingest_events::command::{decide, Command, Decision, JobSpec, Target};
use ingest_events::event::{
    Actor, Digest, Erc, Event, Identifiers, InventoryParams, PayloadType, StoreParams, StreamId,
    Submission, SubmissionMode,
};
use ingest_events::lifecycle::{JobState, Lifecycle, StateKind};
use ingest_events::log::{AppendRequest, Log, LogConfig};
use ingest_events::state::State;
use ingest_events::{Bid, Jid, Qid, Recorded};
use ingest_projections::{EventOps, Projector, Tree};
use serde::Deserialize;

/// 2024-05-16 10:11:12 UTC: command N is stamped N seconds later.
pub fn base_time() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2024, 5, 16, 10, 11, 12)
        .single()
        .expect("valid time")
}

/// The time of command `n`.
pub fn time_of(n: u64) -> DateTime<Utc> {
    base_time() + Duration::seconds(n as i64)
}

/// The fixed uuid of the `n`-th submission (from 1).
pub fn submission_uuid(n: u128) -> uuid::Uuid {
    uuid::Uuid::from_u128(0x0000_0000_0000_4000_8000_0000_0000_0000 | n)
}

/// A submission with the defaults the scenarios use.
pub fn submission(profile: &str, manifest: &[&str]) -> Submission {
    Submission {
        profile_name: profile.into(),
        submitter: "alice".into(),
        payload_url: "https://example.org/batch.checkm".into(),
        payload_type: if manifest.is_empty() {
            PayloadType::Container
        } else {
            PayloadType::BatchManifest
        },
        response_type: "json".into(),
        submission_mode: SubmissionMode::Add,
        manifest: manifest.iter().map(|s| s.to_string()).collect(),
        erc: Erc::default(),
        digest: None,
        extra: BTreeMap::new(),
    }
}

/// A job spec for an object.
pub fn spec(url: &str) -> JobSpec {
    JobSpec {
        payload_url: url.into(),
        payload_type: PayloadType::Container,
        identifiers: Identifiers::default(),
        metadata: Erc::default(),
        digest: None,
        priority: None,
    }
}

/// The jobs an inline manifest expands into: one per line,
/// `payload [local_id [primary_id]]`.
pub fn manifest_specs(lines: &[String]) -> Vec<JobSpec> {
    lines
        .iter()
        .map(|line| {
            let mut words = line.split_whitespace();
            let url = words.next().unwrap_or_default();
            let local: Vec<String> = words.next().map(str::to_string).into_iter().collect();
            let primary = words.next().map(str::to_string);
            JobSpec {
                payload_url: url.into(),
                payload_type: PayloadType::ObjectManifest,
                identifiers: Identifiers {
                    primary_id: primary,
                    local_ids: local,
                },
                metadata: Erc::default(),
                digest: None,
                priority: None,
            }
        })
        .collect()
}

/// Commands through `decide` and a real log in a temporary directory, each
/// stamped [`time_of`] its step number.
pub struct Harness {
    _dir: tempfile::TempDir,
    /// The log.
    pub log: Log,
    /// The state after the commands so far.
    pub state: State,
    /// The lifecycle.
    pub lifecycle: Lifecycle,
    /// Steps taken (including rejected ones).
    pub steps: u64,
    submissions: u128,
    access_requests: u128,
}

impl Harness {
    /// An empty log.
    pub fn new() -> Harness {
        let dir = tempfile::tempdir().expect("temp dir");
        let log = Log::open(
            dir.path(),
            &LogConfig {
                cache_capacity: 8 * 1024 * 1024,
                ..LogConfig::default()
            },
        )
        .expect("open log");
        Harness {
            _dir: dir,
            log,
            state: State::new(),
            lifecycle: Lifecycle::builtin(),
            steps: 0,
            submissions: 0,
            access_requests: 0,
        }
    }

    /// The next submission's uuid.
    pub fn next_uuid(&mut self) -> uuid::Uuid {
        self.submissions += 1;
        submission_uuid(self.submissions)
    }

    /// Decides and appends one command; returns its records.
    pub fn run(&mut self, cmd: &Command) -> Result<Vec<Recorded>, String> {
        let step = self.steps;
        self.steps += 1;
        let decision = decide(&self.state, &self.lifecycle, cmd).map_err(|e| e.to_string())?;
        let appended = self
            .log
            .append(&AppendRequest {
                actor: Actor::admin("test"),
                correlation_id: uuid::Uuid::from_u128(u128::from(step) + 1),
                timestamp: time_of(step),
                expectations: decision.expectations,
                events: decision.events,
            })
            .expect("append")
            .map_err(|c| c.to_string())?;
        for r in &appended.records {
            self.state.apply(r).expect("fold");
        }
        Ok(appended.records)
    }

    /// Runs a command that must be accepted.
    pub fn ok(&mut self, cmd: Command) -> Vec<Recorded> {
        match self.run(&cmd) {
            Ok(r) => r,
            Err(e) => panic!("{cmd:?} was rejected: {e}"),
        }
    }

    /// Every record, read back from the log.
    pub fn records(&self) -> Vec<Recorded> {
        self.log
            .read_from(1)
            .collect::<Result<Vec<_>, _>>()
            .expect("read log")
    }

    /// Submits a batch of `profile`; returns its id.
    pub fn submit(&mut self, profile: &str, manifest: &[&str]) -> Bid {
        let uuid = self.next_uuid();
        let bid = self.state.next_bid();
        self.ok(Command::SubmitBatch {
            uuid,
            submission: submission(profile, manifest),
        });
        bid
    }

    /// Acquires a batch with `n` container jobs; returns their ids.
    pub fn acquire(&mut self, bid: Bid, n: usize) -> Vec<Jid> {
        let first = self.state.next_jid();
        let jobs = (0..n)
            .map(|i| {
                spec(&format!(
                    "https://example.org/object-{}.zip",
                    first.0 + i as u64
                ))
            })
            .collect();
        self.ok(Command::AcquireBatch { bid, jobs });
        (0..n as u64).map(|i| Jid(first.0 + i)).collect()
    }

    /// Moves a job explicitly.
    pub fn set(&mut self, jid: Jid, target: Target) -> Vec<Recorded> {
        self.ok(Command::SetJobStatus {
            jid,
            target,
            message: String::new(),
            priority: None,
        })
    }
}

impl Default for Harness {
    fn default() -> Self {
        Harness::new()
    }
}

/// Appends a decision in memory (no sled): positions, stream versions and the
/// timestamp as the log would give them. For fast property tests.
pub fn append_in_memory(state: &mut State, decision: Decision, at: DateTime<Utc>) -> Vec<Recorded> {
    let mut versions: BTreeMap<StreamId, u64> = BTreeMap::new();
    let mut out = Vec::new();
    for p in decision.events {
        let v = versions
            .entry(p.stream)
            .or_insert_with(|| state.stream_version(p.stream));
        *v += 1;
        let r = Recorded {
            envelope: Envelope {
                position: state.position + 1,
                stream: p.stream,
                version: *v,
                timestamp: at,
                actor: Actor::engine(),
                correlation_id: uuid::Uuid::nil(),
                schema_version: SCHEMA_VERSION,
                prev_hash: state.head_hash,
                hash: [0; 32],
            },
            event: p.event,
        };
        state.apply(&r).expect("fold");
        out.push(r);
    }
    out
}

/// Commands through `decide` with an in-memory log (no sled): for fast tests.
pub struct MemHarness {
    /// The state after the commands so far.
    pub state: State,
    /// The lifecycle.
    pub lifecycle: Lifecycle,
    /// Every record so far.
    pub records: Vec<Recorded>,
    /// Steps taken (including rejected ones).
    pub steps: u64,
    submissions: u128,
}

impl Default for MemHarness {
    fn default() -> Self {
        MemHarness {
            state: State::new(),
            lifecycle: Lifecycle::builtin(),
            records: Vec::new(),
            steps: 0,
            submissions: 0,
        }
    }
}

impl MemHarness {
    /// Decides and appends one command; returns its records.
    pub fn run(&mut self, cmd: &Command) -> Result<Vec<Recorded>, String> {
        let at = time_of(self.steps);
        self.steps += 1;
        let decision = decide(&self.state, &self.lifecycle, cmd).map_err(|e| e.to_string())?;
        let records = append_in_memory(&mut self.state, decision, at);
        self.records.extend(records.iter().cloned());
        Ok(records)
    }

    /// Runs a command that must be accepted.
    pub fn ok(&mut self, cmd: Command) -> Vec<Recorded> {
        match self.run(&cmd) {
            Ok(r) => r,
            Err(e) => panic!("{cmd:?} was rejected: {e}"),
        }
    }

    /// Submits a batch of `profile`; returns its id.
    pub fn submit(&mut self, profile: &str) -> Bid {
        self.submissions += 1;
        let bid = self.state.next_bid();
        self.ok(Command::SubmitBatch {
            uuid: submission_uuid(self.submissions),
            submission: submission(profile, &[]),
        });
        bid
    }

    /// Acquires a batch with `n` container jobs; returns their ids.
    pub fn acquire(&mut self, bid: Bid, n: usize) -> Vec<Jid> {
        let first = self.state.next_jid();
        let jobs = (0..n)
            .map(|i| {
                spec(&format!(
                    "https://example.org/object-{}.zip",
                    first.0 + i as u64
                ))
            })
            .collect();
        self.ok(Command::AcquireBatch { bid, jobs });
        (0..n as u64).map(|i| Jid(first.0 + i)).collect()
    }

    /// Moves a job.
    pub fn set(&mut self, jid: Jid, target: Target) -> Vec<Recorded> {
        self.ok(Command::SetJobStatus {
            jid,
            target,
            message: String::new(),
            priority: None,
        })
    }
}

/// Batches a `BatchAcquired` was recorded for (the oracle cannot tell them
/// from the state alone once such a batch is Deleted).
pub fn acquired_batches<'a>(records: impl IntoIterator<Item = &'a Recorded>) -> BTreeSet<Bid> {
    records
        .into_iter()
        .filter_map(|r| match (&r.event, r.envelope.stream) {
            (Event::BatchAcquired(_), StreamId::Batch(b)) => Some(b),
            _ => None,
        })
        .collect()
}

// ---------------------------------------------------------------------------
// The oracle: the tree DESIGN.md's layout table says the state implies,
// written independently of the projector (own paths, own JSON through
// serde_json::json!, compared as JSON values rather than bytes).

fn ts(at: DateTime<Utc>) -> String {
    at.format("%Y-%m-%d %H:%M:%S +0000").to_string()
}

fn s(v: &Option<String>) -> String {
    v.clone().unwrap_or_default()
}

/// The tree the state implies.
pub fn expected_tree(state: &State, acquired: &BTreeSet<Bid>) -> BTreeMap<String, Vec<u8>> {
    use serde_json::{json, Value};
    let mut t: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    let mut put = |p: String, v: Vec<u8>| {
        t.insert(p, v);
    };
    let text = |v: &Value| v.to_string().into_bytes();
    for p in [
        "/batches",
        "/batch-uuids",
        "/jobs",
        "/jobs/states",
        "/locks",
        "/locks/queue",
        "/locks/collections",
        "/locks/localid",
        "/locks/storage",
        "/locks/inventory",
    ] {
        put(p.into(), vec![]);
    }
    // The keys Merritt's readers use (mrt-ingest's values).
    let merritt = |m: &mut serde_json::Map<String, Value>,
                   profile: &str,
                   at: DateTime<Utc>,
                   url: &str,
                   response: &str,
                   erc: &ingest_events::event::Erc| {
        let file = url
            .split(['?', '#'])
            .next()
            .map(|u| match u.split_once("://") {
                Some((_, r)) => r.split_once('/').map_or("", |(_, p)| p),
                None => u,
            })
            .and_then(|p| p.rsplit('/').find(|x| !x.is_empty()))
            .unwrap_or("");
        m.insert("profile".into(), json!(profile));
        m.insert(
            "submissionDate".into(),
            json!(at.format("%Y-%m-%dT%H:%M:%S+00:00").to_string()),
        );
        m.insert("filename".into(), json!(file));
        m.insert("responseForm".into(), json!(response));
        m.insert("title".into(), json!(s(&erc.what)));
        m.insert("creator".into(), json!(s(&erc.who)));
    };
    for st in JobState::ALL {
        put(format!("/jobs/states/{}", st.name().to_lowercase()), vec![]);
    }
    if state.paused {
        put("/locks/queue/ingest".into(), vec![]);
    }
    // The access queues (mrt-zk's Access.initNodes) and their requests, as
    // mrt-store queues them.
    for p in ["/access", "/access/small", "/access/large"] {
        put(p.into(), vec![]);
    }
    for q in &state.paused_access {
        let lock = match q.name() {
            "small" => "accessSmall",
            _ => "accessLarge",
        };
        put(format!("/locks/queue/{lock}"), vec![]);
    }
    for a in state.access.values() {
        let root = format!("/access/{}/{}", a.queue.name(), a.qid);
        put(root.clone(), vec![]);
        put(
            format!("{root}/token"),
            text(&{
                let mut token = json!({
                    "status": 201,
                    "token": a.token.token,
                    "cloud-content-byte": a.token.size,
                    "delivery-node": a.token.delivery_node,
                    "ark": a.token.ark,
                    "version": a.token.version,
                    "format": a.token.format,
                    "content": a.packaging.content.name(),
                });
                if a.packaging.bag {
                    token["bag"] = json!(true);
                }
                if let Some(d) = &a.delivery {
                    let time = |t: chrono::DateTime<chrono::Utc>| {
                        t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
                    };
                    token["url"] = json!(d.url);
                    token["delivery-size"] = json!(d.size);
                    token["delivery-digest"] = json!(d.sha256);
                    token["anticipated-availability-time"] = json!(time(d.ready));
                    token["expiration-time"] = json!(time(d.expires));
                }
                token
            }),
        );
        put(
            format!("{root}/status"),
            text(&json!({
                "status": a.status.to_string(),
                "last_modified": a.last_modified.format("%Y-%m-%d %H:%M:%S +0000").to_string(),
                "message": a.message,
            })),
        );
    }
    for p in &state.held_collections {
        put(format!("/locks/collections/{p}"), vec![]);
    }
    for b in state.batches.values().filter(|b| !b.cleaned_up) {
        let root = format!("/batches/{}", b.bid);
        put(root.clone(), vec![]);
        let sub = &b.submission;
        let mut submission = json!({
            "profile_name": sub.profile_name,
            "submitter": sub.submitter,
            "payload_url": sub.payload_url,
            "type": sub.payload_type.name(),
            "response_type": sub.response_type,
            "submission_mode": sub.submission_mode.name(),
            "erc_what": s(&sub.erc.what),
            "erc_who": s(&sub.erc.who),
            "erc_when": s(&sub.erc.when),
            "erc_where": s(&sub.erc.r#where),
            "batchID": b.uuid.to_string(),
        });
        if let Value::Object(m) = &mut submission {
            merritt(
                m,
                &sub.profile_name,
                b.created,
                &sub.payload_url,
                &sub.response_type,
                &sub.erc,
            );
            if !sub.manifest.is_empty() {
                m.insert("manifest".into(), json!(sub.manifest));
            }
            if let Some(d) = &sub.digest {
                m.insert("digest_type".into(), json!(d.algorithm));
                m.insert("digest_value".into(), json!(d.value));
            }
            for (k, v) in &sub.extra {
                m.entry(k.clone()).or_insert_with(|| json!(v));
            }
        }
        put(format!("{root}/submission"), text(&submission));
        put(
            format!("{root}/status"),
            text(
                &json!({"status": b.status.name(), "last_modified": ts(b.last_modified), "message": b.message}),
            ),
        );
        if let Some(r) = &b.report {
            let ids = |v: &[Jid]| v.iter().map(|j| j.to_string()).collect::<Vec<_>>();
            put(
                format!("{root}/status-report"),
                text(
                    &json!({"last_modified": ts(r.at), "failed_jobs": ids(&r.failed_jobs), "successful_jobs": ids(&r.successful_jobs)}),
                ),
            );
        }
        if acquired.contains(&b.bid) {
            put(format!("{root}/states"), vec![]);
        }
        put(
            format!("/batch-uuids/{}", b.uuid),
            b.bid.to_string().into_bytes(),
        );
    }
    for j in state.jobs.values().filter(|j| !j.cleaned_up) {
        let root = format!("/jobs/{}", j.jid);
        put(root.clone(), vec![]);
        put(format!("{root}/bid"), j.bid.to_string().into_bytes());
        put(
            format!("{root}/priority"),
            j.priority.to_string().into_bytes(),
        );
        put(
            format!("{root}/space_needed"),
            j.space_needed.to_string().into_bytes(),
        );
        let c = &j.configuration;
        let mut conf = json!({
            "profile_name": c.profile_name,
            "submitter": c.submitter,
            "payload_url": c.payload_url,
            "payload_type": c.payload_type.name(),
            "response_type": c.response_type,
            "submission_mode": c.submission_mode.name(),
        });
        if let Value::Object(m) = &mut conf {
            if let Some(d) = &c.digest {
                m.insert("digest_type".into(), json!(d.algorithm));
                m.insert("digest_value".into(), json!(d.value));
            }
            m.insert("type".into(), json!(c.payload_type.name()));
            let submitted = state.batches.get(&j.bid).map_or(j.created, |b| b.created);
            merritt(
                m,
                &c.profile_name,
                submitted,
                &c.payload_url,
                &c.response_type,
                &j.metadata,
            );
        }
        put(format!("{root}/configuration"), text(&conf));
        let ids = &j.identifiers;
        if ids.primary_id.is_some() || !ids.local_ids.is_empty() {
            put(
                format!("{root}/identifiers"),
                text(&json!({"primary_id": s(&ids.primary_id), "local_id": ids.local_ids})),
            );
        }
        let m = &j.metadata;
        if m.who.is_some() || m.what.is_some() || m.when.is_some() || m.r#where.is_some() {
            put(
                format!("{root}/metadata"),
                text(
                    &json!({"erc_who": s(&m.who), "erc_what": s(&m.what), "erc_when": s(&m.when), "erc_where": s(&m.r#where)}),
                ),
            );
        }
        put(
            format!("{root}/status"),
            text(&json!({
                "status": j.status.name(),
                "last_modified": ts(j.last_modified),
                "message": j.message,
                "last_successful_status": j.last_successful_status.map(|s| s.name()),
                "retry_count": j.retry_count,
            })),
        );
        if let Some(st) = &j.store {
            put(
                format!("{root}/store"),
                text(&json!({"manifest_url": st.manifest_url, "mode": st.mode, "delete": ""})),
            );
        }
        if let Some(i) = &j.inventory {
            put(
                format!("{root}/inventory"),
                text(&json!({"manifest_url": i.manifest_url, "mode": i.mode})),
            );
        }
        put(
            format!(
                "/jobs/states/{}/{:02}-{}",
                j.status.name().to_lowercase(),
                j.priority,
                j.jid
            ),
            vec![],
        );
        let set = match j.status {
            JobState::Failed => "batch-failed",
            JobState::Completed => "batch-completed",
            JobState::Deleted => "batch-deleted",
            _ => "batch-processing",
        };
        put(format!("/batches/{}/states/{set}", j.bid), vec![]);
        put(format!("/batches/{}/states/{set}/{}", j.bid, j.jid), vec![]);
    }
    t
}

/// Compares the projected tree with the oracle; `None` when they agree.
/// Empty `batch-*` set nodes are left out of the comparison: the projection
/// keeps a set node once created (as mrt-zk does), the state does not say
/// which sets a batch ever used.
pub fn oracle_mismatch(state: &State, acquired: &BTreeSet<Bid>, tree: &Tree) -> Option<String> {
    let expected = expected_tree(state, acquired);
    let actual: BTreeMap<&str, &[u8]> = tree
        .iter()
        .filter(|(p, _)| !is_batch_set(p) || tree.has_children(p))
        .collect();
    let mut problems = Vec::new();
    for (p, want) in &expected {
        match actual.get(p.as_str()) {
            None => problems.push(format!("missing {p}")),
            Some(got) if !same_data(want, got) => problems.push(format!(
                "differs {p}\n    expected {}\n    actual   {}",
                String::from_utf8_lossy(want),
                String::from_utf8_lossy(got)
            )),
            Some(_) => {}
        }
    }
    for p in actual.keys() {
        if !expected.contains_key(*p) {
            problems.push(format!("unexpected {p}"));
        }
    }
    (!problems.is_empty()).then(|| problems.join("\n"))
}

fn is_batch_set(p: &str) -> bool {
    let parts: Vec<&str> = p.split('/').collect();
    parts.len() == 5
        && parts[1] == "batches"
        && parts[3] == "states"
        && parts[4].starts_with("batch-")
}

fn same_data(a: &[u8], b: &[u8]) -> bool {
    match (
        serde_json::from_slice::<serde_json::Value>(a),
        serde_json::from_slice::<serde_json::Value>(b),
    ) {
        (Ok(x @ serde_json::Value::Object(_)), Ok(y)) => x == y,
        _ => a == b,
    }
}

/// DESIGN.md invariant 6, and no reference to a job that is not live: every
/// live job has exactly one queue reference (at its state and priority) and
/// exactly one batch set child (at its state's set).
pub fn check_invariants(state: &State, tree: &Tree) -> Result<(), String> {
    let mut queue_refs: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut batch_refs: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (p, _) in tree.iter() {
        let parts: Vec<&str> = p.split('/').collect();
        match parts.as_slice() {
            ["", "jobs", "states", _, name] => {
                let jid = name.get(3..).unwrap_or_default().to_string();
                queue_refs.entry(jid).or_default().push(p.to_string());
            }
            ["", "batches", _, "states", _, jid] => {
                batch_refs
                    .entry(jid.to_string())
                    .or_default()
                    .push(p.to_string());
            }
            _ => {}
        }
    }
    let live: BTreeMap<String, &ingest_events::state::Job> = state
        .jobs
        .values()
        .filter(|j| !j.cleaned_up)
        .map(|j| (j.jid.to_string(), j))
        .collect();
    for (jid, j) in &live {
        let q = queue_refs.get(jid).cloned().unwrap_or_default();
        let want_q = format!(
            "/jobs/states/{}/{:02}-{jid}",
            j.status.queue_name(),
            j.priority
        );
        if q != [want_q.clone()] {
            return Err(format!(
                "job {jid} ({}) has queue refs {q:?}, expected [{want_q}]",
                j.status
            ));
        }
        let b = batch_refs.get(jid).cloned().unwrap_or_default();
        if b.len() != 1 || !b[0].starts_with(&format!("/batches/{}/states/batch-", j.bid)) {
            return Err(format!("job {jid} ({}) has batch refs {b:?}", j.status));
        }
    }
    for jid in queue_refs.keys().chain(batch_refs.keys()) {
        if !live.contains_key(jid) {
            return Err(format!("reference to {jid}, which is not a live job"));
        }
    }
    Ok(())
}

/// Projects records one by one, checking after each event that the tree keeps
/// the invariants and equals the oracle; returns the operations.
pub fn project_checked(records: &[Recorded]) -> (Projector, Vec<EventOps>) {
    let mut p = Projector::new();
    let mut out = vec![p.init().expect("init")];
    let mut acquired = BTreeSet::new();
    for r in records {
        if let (Event::BatchAcquired(_), StreamId::Batch(b)) = (&r.event, r.envelope.stream) {
            acquired.insert(b);
        }
        let ops = p
            .project(r)
            .unwrap_or_else(|e| panic!("projecting position {}: {e}", r.envelope.position));
        if let Err(e) = check_invariants(p.state(), p.tree()) {
            panic!(
                "after position {} ({}): {e}",
                r.envelope.position,
                r.event.describe()
            );
        }
        if let Some(m) = oracle_mismatch(p.state(), &acquired, p.tree()) {
            panic!(
                "after position {} ({}), the tree differs from the state's:\n{m}",
                r.envelope.position,
                r.event.describe()
            );
        }
        out.push(ops);
    }
    (p, out)
}

// ---------------------------------------------------------------------------
// A readable line diff.

/// `expected` against `actual` as a unified-style line diff (`-` expected
/// only, `+` actual only), with two lines of context.
pub fn text_diff(expected: &str, actual: &str) -> String {
    let a: Vec<&str> = expected.lines().collect();
    let b: Vec<&str> = actual.lines().collect();
    let (n, m) = (a.len(), b.len());
    let mut lcs = vec![vec![0usize; m + 1]; n + 1];
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            lcs[i][j] = if a[i] == b[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    let mut lines: Vec<(char, &str)> = Vec::new();
    let (mut i, mut j) = (0, 0);
    while i < n || j < m {
        if i < n && j < m && a[i] == b[j] {
            lines.push((' ', a[i]));
            i += 1;
            j += 1;
        } else if j < m && (i == n || lcs[i][j + 1] >= lcs[i + 1][j]) {
            lines.push(('+', b[j]));
            j += 1;
        } else {
            lines.push(('-', a[i]));
            i += 1;
        }
    }
    let changed: Vec<usize> = (0..lines.len()).filter(|k| lines[*k].0 != ' ').collect();
    let near = |k: usize| changed.iter().any(|c| c.abs_diff(k) <= 2);
    let mut out = String::new();
    let mut skipped = false;
    for (k, (tag, line)) in lines.iter().enumerate() {
        if near(k) {
            if skipped {
                out.push_str("  ...\n");
                skipped = false;
            }
            out.push(*tag);
            out.push(' ');
            out.push_str(line);
            out.push('\n');
        } else {
            skipped = true;
        }
    }
    out
}

// ---------------------------------------------------------------------------
// Scenarios: a few lines of YAML give the steps and the expected tree.

/// A scenario file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Steps, in order.
    #[serde(deserialize_with = "steps")]
    pub steps: Vec<Step>,
    /// Expected dumps by prefix (`/` for the whole tree).
    #[serde(default)]
    pub expect: Option<BTreeMap<String, String>>,
    /// Prefixes to write when blessing a scenario without `expect`.
    #[serde(default)]
    pub dump: Option<Vec<String>>,
}

/// Steps are written `- name: args` (a one-key mapping) or `- name`;
/// serde_norway reads enums from YAML tags (`!name args`), so each one-key
/// mapping is turned into a tagged value first.
fn steps<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<Step>, D::Error> {
    use serde::de::Error;
    let raw: Vec<serde_norway::Value> = Vec::deserialize(d)?;
    raw.into_iter()
        .map(|v| serde_norway::from_value(tagged(v)).map_err(D::Error::custom))
        .collect()
}

fn tagged(v: serde_norway::Value) -> serde_norway::Value {
    use serde_norway::value::{Tag, TaggedValue};
    use serde_norway::Value;
    match v {
        Value::Mapping(m) if m.len() == 1 && m.keys().all(Value::is_string) => {
            let (k, inner) = m.into_iter().next().expect("one entry");
            let k = k.as_str().unwrap_or_default().to_string();
            let inner = if k == "reject" { tagged(inner) } else { inner };
            Value::Tagged(Box::new(TaggedValue {
                tag: Tag::new(k),
                value: inner,
            }))
        }
        other => other,
    }
}

/// One step of a scenario.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case")]
#[allow(clippy::enum_variant_names)] // `step_retry` is the command's name.
pub enum Step {
    /// `submit: {profile: p, manifest: [..], erc: {..}, extra: {..}, digest: [md5, hex]}`.
    Submit(SubmitArgs),
    /// `acquire: {batch: 1, manifest: true}` or `{batch: 1, count: 2}` or `{batch: 1, jobs: [..]}`.
    Acquire(AcquireArgs),
    /// `create_job: {batch: 1, url: ..}`.
    CreateJob(CreateJobArgs),
    /// `start: JOB`.
    Start(u64),
    /// `success: JOB` or `{job, message, priority}`.
    Success(JobArg),
    /// `fail: JOB` or `{job, message, priority}`.
    Fail(JobArg),
    /// `move: {job, to: State, priority, message}`.
    Move(MoveArgs),
    /// `space: {job, bytes, priority}`.
    Space(SpaceArgs),
    /// `identifiers: {job, primary_id, local_id: [..]}`.
    Identifiers(IdentifiersArgs),
    /// `store: {job, manifest_url, mode, delete}`.
    Store(StoreArgs),
    /// `inventory: {job, manifest_url, mode}`.
    Inventory(InventoryArgs),
    /// `step_retry: JOB`.
    StepRetry(JobArg),
    /// `requeue: JOB`.
    Requeue(u64),
    /// `hold_job: JOB`.
    HoldJob(u64),
    /// `release_job: JOB`.
    ReleaseJob(u64),
    /// `delete_job: JOB`.
    DeleteJob(u64),
    /// `release_batch: BATCH`.
    ReleaseBatch(u64),
    /// `delete_batch: BATCH`.
    DeleteBatch(u64),
    /// `update_reporting: BATCH`.
    UpdateReporting(u64),
    /// `report: BATCH` or `{batch, error}`.
    Report(ReportArg),
    /// `hold_collection: PROFILE`.
    HoldCollection(String),
    /// `release_collection: PROFILE`.
    ReleaseCollection(String),
    /// `release_held_jobs: PROFILE`.
    ReleaseHeldJobs(String),
    /// `pause`.
    Pause,
    /// `resume`.
    Resume,
    /// `cleanup`.
    Cleanup,
    /// `reject: STEP`: the step must be rejected (nothing appended).
    Reject(Box<Step>),
    /// `check: {prefix: dump}`: the tree at this point.
    Check(BTreeMap<String, String>),
    /// `request_access: {bytes, ark, version, format}`: an assembly request.
    RequestAccess(AccessArgs),
    /// `start_access: QID`.
    StartAccess(u64),
    /// `access_success: QID`.
    AccessSuccess(u64),
    /// `access_fail: {access, message}` or `access_fail: QID`.
    AccessFail(AccessFailArg),
    /// `requeue_access: QID`.
    RequeueAccess(u64),
    /// `delete_access: QID`.
    DeleteAccess(u64),
    /// `pause_access: small|large`.
    PauseAccess(String),
    /// `resume_access: small|large`.
    ResumeAccess(String),
}

/// Arguments of `request_access`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AccessArgs {
    #[serde(default)]
    bytes: u64,
    #[serde(default)]
    ark: Option<String>,
    #[serde(default)]
    version: u32,
    #[serde(default)]
    format: Option<String>,
}

/// An access request, bare or with a failure message.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum AccessFailArg {
    /// `QID`.
    Id(u64),
    /// `{access, message}`.
    With {
        /// The request.
        access: u64,
        /// The failure.
        message: String,
    },
}

/// Arguments of `submit`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubmitArgs {
    #[serde(default)]
    profile: Option<String>,
    #[serde(default)]
    url: Option<String>,
    #[serde(default, rename = "type")]
    payload_type: Option<String>,
    #[serde(default)]
    manifest: Vec<String>,
    #[serde(default)]
    erc: Option<ErcArgs>,
    #[serde(default)]
    extra: BTreeMap<String, String>,
    #[serde(default)]
    digest: Option<(String, String)>,
}

/// ERC fields.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ErcArgs {
    #[serde(default)]
    who: Option<String>,
    #[serde(default)]
    what: Option<String>,
    #[serde(default)]
    when: Option<String>,
    #[serde(default, rename = "where")]
    r#where: Option<String>,
}

impl From<ErcArgs> for Erc {
    fn from(e: ErcArgs) -> Erc {
        Erc {
            who: e.who,
            what: e.what,
            when: e.when,
            r#where: e.r#where,
        }
    }
}

/// Arguments of `acquire`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AcquireArgs {
    batch: u64,
    #[serde(default)]
    manifest: bool,
    #[serde(default)]
    count: usize,
    #[serde(default)]
    jobs: Vec<JobArgs>,
}

/// One job of `acquire` or `create_job`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobArgs {
    url: String,
    #[serde(default, rename = "type")]
    payload_type: Option<String>,
    #[serde(default)]
    primary_id: Option<String>,
    #[serde(default)]
    local_id: Vec<String>,
    #[serde(default)]
    priority: Option<u8>,
    #[serde(default)]
    erc: Option<ErcArgs>,
    #[serde(default)]
    digest: Option<(String, String)>,
}

impl JobArgs {
    fn spec(&self) -> JobSpec {
        JobSpec {
            payload_url: self.url.clone(),
            payload_type: self
                .payload_type
                .as_deref()
                .map_or(PayloadType::Container, |t| t.parse().expect("payload type")),
            identifiers: Identifiers {
                primary_id: self.primary_id.clone(),
                local_ids: self.local_id.clone(),
            },
            metadata: self.erc.clone().map(Erc::from).unwrap_or_default(),
            digest: self
                .digest
                .clone()
                .map(|(algorithm, value)| Digest { algorithm, value }),
            priority: self.priority,
        }
    }
}

/// Arguments of `create_job`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateJobArgs {
    batch: u64,
    #[serde(flatten)]
    job: JobArgs,
}

/// A job, bare or with a message and a priority.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum JobArg {
    /// `JOB`.
    Id(u64),
    /// `{job, message, priority}`.
    With {
        /// The job.
        job: u64,
        /// The message.
        #[serde(default)]
        message: Option<String>,
        /// A new priority.
        #[serde(default)]
        priority: Option<u8>,
    },
}

impl JobArg {
    fn parts(&self) -> (Jid, String, Option<u8>) {
        match self {
            JobArg::Id(j) => (Jid(*j), String::new(), None),
            JobArg::With {
                job,
                message,
                priority,
            } => (Jid(*job), message.clone().unwrap_or_default(), *priority),
        }
    }
}

/// Arguments of `move`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MoveArgs {
    job: u64,
    to: String,
    #[serde(default)]
    priority: Option<u8>,
    #[serde(default)]
    message: Option<String>,
}

/// Arguments of `space`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpaceArgs {
    job: u64,
    bytes: u64,
    #[serde(default)]
    priority: Option<u8>,
}

/// Arguments of `identifiers`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IdentifiersArgs {
    job: u64,
    #[serde(default)]
    primary_id: Option<String>,
    #[serde(default)]
    local_id: Vec<String>,
}

/// Arguments of `store`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreArgs {
    job: u64,
    manifest_url: String,
    #[serde(default = "add")]
    mode: String,
    #[serde(default)]
    delete: bool,
}

/// Arguments of `inventory`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InventoryArgs {
    job: u64,
    manifest_url: String,
    #[serde(default = "add")]
    mode: String,
}

fn add() -> String {
    "add".into()
}

/// A batch, bare or with a notification error.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum ReportArg {
    /// `BATCH`.
    Id(u64),
    /// `{batch, error}`.
    With {
        /// The batch.
        batch: u64,
        /// The notification error.
        #[serde(default)]
        error: Option<String>,
    },
}

impl Harness {
    /// The command a step stands for (`None` for `check` and `reject`).
    pub fn command(&mut self, step: &Step) -> Option<Command> {
        let reason = || "scenario".to_string();
        Some(match step {
            Step::Submit(a) => {
                let mut sub = submission(
                    a.profile.as_deref().unwrap_or("demo_content"),
                    &a.manifest.iter().map(String::as_str).collect::<Vec<_>>(),
                );
                if let Some(u) = &a.url {
                    sub.payload_url = u.clone();
                }
                if let Some(t) = &a.payload_type {
                    sub.payload_type = t.parse().expect("payload type");
                }
                sub.erc = a.erc.clone().map(Erc::from).unwrap_or_default();
                sub.extra = a.extra.clone();
                sub.digest = a
                    .digest
                    .clone()
                    .map(|(algorithm, value)| Digest { algorithm, value });
                Command::SubmitBatch {
                    uuid: self.next_uuid(),
                    submission: sub,
                }
            }
            Step::Acquire(a) => {
                let bid = Bid(a.batch);
                let mut jobs: Vec<JobSpec> = a.jobs.iter().map(JobArgs::spec).collect();
                if a.manifest {
                    let lines = self
                        .state
                        .batches
                        .get(&bid)
                        .map(|b| b.submission.manifest.clone())
                        .unwrap_or_default();
                    jobs.extend(manifest_specs(&lines));
                }
                let first = self.state.next_jid().0 + jobs.len() as u64;
                jobs.extend(
                    (0..a.count as u64)
                        .map(|i| spec(&format!("https://example.org/object-{}.zip", first + i))),
                );
                Command::AcquireBatch { bid, jobs }
            }
            Step::CreateJob(a) => Command::CreateJob {
                bid: Bid(a.batch),
                spec: a.job.spec(),
            },
            Step::Start(j) => Command::StartJob { jid: Jid(*j) },
            Step::Success(a) | Step::Fail(a) => {
                let (jid, message, priority) = a.parts();
                Command::SetJobStatus {
                    jid,
                    target: if matches!(step, Step::Success(_)) {
                        Target::Success
                    } else {
                        Target::Fail
                    },
                    message,
                    priority,
                }
            }
            Step::Move(a) => Command::SetJobStatus {
                jid: Jid(a.job),
                target: Target::To(a.to.parse().expect("job state")),
                message: a.message.clone().unwrap_or_default(),
                priority: a.priority,
            },
            Step::Space(a) => Command::RecordSpace {
                jid: Jid(a.job),
                space_needed: a.bytes,
                priority: a.priority,
            },
            Step::Identifiers(a) => Command::RecordIdentifiers {
                jid: Jid(a.job),
                identifiers: Identifiers {
                    primary_id: a.primary_id.clone(),
                    local_ids: a.local_id.clone(),
                },
            },
            Step::Store(a) => Command::RecordStore {
                jid: Jid(a.job),
                store: StoreParams {
                    manifest_url: a.manifest_url.clone(),
                    mode: a.mode.clone(),
                    delete: a.delete,
                },
            },
            Step::Inventory(a) => Command::RecordInventory {
                jid: Jid(a.job),
                inventory: InventoryParams {
                    manifest_url: a.manifest_url.clone(),
                    mode: a.mode.clone(),
                },
            },
            Step::StepRetry(a) => {
                let (jid, message, _) = a.parts();
                Command::RecordStepRetry {
                    jid,
                    attempt: 2,
                    message,
                }
            }
            Step::Requeue(j) => Command::RequeueJob {
                jid: Jid(*j),
                reason: reason(),
            },
            Step::HoldJob(j) => Command::HoldJob {
                jid: Jid(*j),
                reason: reason(),
            },
            Step::ReleaseJob(j) => Command::ReleaseJob {
                jid: Jid(*j),
                reason: reason(),
            },
            Step::DeleteJob(j) => Command::DeleteJob {
                jid: Jid(*j),
                reason: reason(),
            },
            Step::ReleaseBatch(b) => Command::ReleaseBatch {
                bid: Bid(*b),
                reason: reason(),
            },
            Step::DeleteBatch(b) => Command::DeleteBatch {
                bid: Bid(*b),
                reason: reason(),
            },
            Step::UpdateReporting(b) => Command::UpdateReporting {
                bid: Bid(*b),
                reason: reason(),
            },
            Step::Report(a) => match a {
                ReportArg::Id(b) => Command::ReportBatch {
                    bid: Bid(*b),
                    notification_error: None,
                },
                ReportArg::With { batch, error } => Command::ReportBatch {
                    bid: Bid(*batch),
                    notification_error: error.clone(),
                },
            },
            Step::HoldCollection(p) => Command::HoldCollection {
                profile: p.clone(),
                reason: reason(),
            },
            Step::ReleaseCollection(p) => Command::ReleaseCollection {
                profile: p.clone(),
                reason: reason(),
            },
            Step::ReleaseHeldJobs(p) => Command::ReleaseHeldJobs {
                profile: p.clone(),
                reason: reason(),
            },
            Step::Pause => Command::PauseQueue { reason: reason() },
            Step::Resume => Command::ResumeQueue { reason: reason() },
            Step::Cleanup => Command::Cleanup { before: None },
            Step::RequestAccess(a) => {
                self.access_requests += 1;
                Command::RequestAccess {
                    token: ingest_events::event::AccessToken {
                        token: submission_uuid(0x00ac_0000 | self.access_requests).to_string(),
                        ark: a
                            .ark
                            .clone()
                            .unwrap_or_else(|| "ark:/99999/fk4access".into()),
                        version: a.version,
                        format: a.format.clone().unwrap_or_else(|| "zip".into()),
                        size: a.bytes,
                        delivery_node: 9501,
                    },
                    packaging: Default::default(),
                    size_limit: ingest_events::event::AccessQueue::DEFAULT_SIZE_LIMIT,
                }
            }
            Step::StartAccess(q) => Command::StartAccess { qid: Qid(*q) },
            Step::AccessSuccess(q) => Command::AccessOutcome {
                qid: Qid(*q),
                success: true,
                message: String::new(),
                delivery: None,
            },
            Step::AccessFail(a) => {
                let (qid, message) = match a {
                    AccessFailArg::Id(q) => (Qid(*q), "assembly failed".to_string()),
                    AccessFailArg::With { access, message } => (Qid(*access), message.clone()),
                };
                Command::AccessOutcome {
                    qid,
                    success: false,
                    message,
                    delivery: None,
                }
            }
            Step::RequeueAccess(q) => Command::RequeueAccess {
                qid: Qid(*q),
                reason: reason(),
            },
            Step::DeleteAccess(q) => Command::DeleteAccess {
                qid: Qid(*q),
                reason: reason(),
            },
            Step::PauseAccess(q) => Command::PauseAccessQueue {
                queue: q.parse().expect("small or large"),
                reason: reason(),
            },
            Step::ResumeAccess(q) => Command::ResumeAccessQueue {
                queue: q.parse().expect("small or large"),
                reason: reason(),
            },
            Step::Reject(_) | Step::Check(_) => return None,
        })
    }
}

/// The directory of the scenario files.
pub fn scenario_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/scenarios")
}

fn compare_dumps(
    file: &Path,
    what: &str,
    tree: &Tree,
    expected: &BTreeMap<String, String>,
) -> Vec<String> {
    let mut failures = Vec::new();
    for (prefix, want) in expected {
        let got = tree.dump_yaml(Some(prefix));
        if &got != want {
            failures.push(format!(
                "{}: {what}, the tree under {prefix} differs (- expected, + actual):\n{}",
                file.display(),
                text_diff(want, &got)
            ));
        }
    }
    failures
}

/// What a scenario run produced.
pub struct ScenarioRun {
    /// The harness (log and state) after the steps.
    pub harness: Harness,
    /// The operations of each event, projected live (position 0 is `init`).
    pub live_ops: Vec<EventOps>,
    /// The tree after each position, projected live (index = position).
    pub snapshots: Vec<Tree>,
}

/// Runs a scenario file: each step through `decide` and the log, projected
/// live with the invariants and the oracle checked after every event; then
/// the records read back from the log are projected again and must give the
/// same operations; the final tree is compared with `expect`.
///
/// With `INGEST_BLESS=1`, a scenario without `expect` gets one appended
/// (never an existing expectation overwritten).
pub fn run_scenario(name: &str) -> ScenarioRun {
    let file = scenario_dir().join(name);
    let text = std::fs::read_to_string(&file)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", file.display()));
    let scenario: Scenario = serde_norway::from_str(&text)
        .unwrap_or_else(|e| panic!("{} is not a valid scenario: {e}", file.display()));
    let mut h = Harness::new();
    let mut projector = Projector::new();
    let mut live_ops = vec![projector.init().expect("init")];
    let mut snapshots = vec![projector.tree().clone()];
    let mut acquired = BTreeSet::new();
    let mut failures = Vec::new();
    for (i, step) in scenario.steps.iter().enumerate() {
        let n = i + 1;
        match step {
            Step::Check(expected) => {
                failures.extend(compare_dumps(
                    &file,
                    &format!("at step {n} (check)"),
                    projector.tree(),
                    expected,
                ));
                continue;
            }
            Step::Reject(inner) => {
                let cmd = h.command(inner).expect("a command to reject");
                if let Ok(records) = h.run(&cmd) {
                    panic!(
                        "{}: step {n}: {cmd:?} was accepted ({} events), expected a rejection",
                        file.display(),
                        records.len()
                    );
                }
                continue;
            }
            _ => {}
        }
        let cmd = h.command(step).expect("a command");
        let records = h
            .run(&cmd)
            .unwrap_or_else(|e| panic!("{}: step {n}: {cmd:?} was rejected: {e}", file.display()));
        for r in &records {
            if let (Event::BatchAcquired(_), StreamId::Batch(b)) = (&r.event, r.envelope.stream) {
                acquired.insert(b);
            }
            let ops = projector.project(r).unwrap_or_else(|e| {
                panic!(
                    "{}: step {n}: projecting position {}: {e}",
                    file.display(),
                    r.envelope.position
                )
            });
            if let Err(e) = check_invariants(projector.state(), projector.tree()) {
                panic!(
                    "{}: step {n}, after {}: {e}",
                    file.display(),
                    r.event.describe()
                );
            }
            if let Some(m) = oracle_mismatch(projector.state(), &acquired, projector.tree()) {
                panic!(
                    "{}: step {n}, after {}: the tree differs from the state's:\n{m}",
                    file.display(),
                    r.event.describe()
                );
            }
            live_ops.push(ops);
            snapshots.push(projector.tree().clone());
        }
    }
    // Replay what the log holds: same operations, same tree.
    let records = h.records();
    let (replayed, replayed_ops) = project_checked(&records);
    assert_eq!(
        replayed_ops,
        live_ops,
        "{}: replaying the log gave other operations",
        file.display()
    );
    assert_eq!(
        replayed.tree(),
        projector.tree(),
        "{}: replaying the log gave another tree",
        file.display()
    );
    match &scenario.expect {
        Some(expected) => failures.extend(compare_dumps(
            &file,
            "at the end",
            projector.tree(),
            expected,
        )),
        None => {
            let prefixes = scenario.dump.clone().unwrap_or_else(|| vec!["/".into()]);
            let mut block = String::from("expect:\n");
            for p in &prefixes {
                block.push_str(&format!("  {p}: |\n"));
                for line in projector.tree().dump_yaml(Some(p)).lines() {
                    block.push_str("    ");
                    block.push_str(line);
                    block.push('\n');
                }
            }
            if std::env::var("INGEST_BLESS").is_ok_and(|v| v == "1") {
                let mut new_text = text.clone();
                if !new_text.ends_with('\n') {
                    new_text.push('\n');
                }
                new_text.push_str(&block);
                std::fs::write(&file, new_text)
                    .unwrap_or_else(|e| panic!("cannot write {}: {e}", file.display()));
                eprintln!("blessed {}", file.display());
            } else {
                failures.push(format!(
                    "{} has no `expect`; run with INGEST_BLESS=1 to append the actual tree, review it, and commit:\n{block}",
                    file.display()
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    ScenarioRun {
        harness: h,
        live_ops,
        snapshots,
    }
}

/// Time of a job state by name, for readable assertions.
pub fn job_state(name: &str) -> JobState {
    JobState::from_name(name).expect("a job state")
}
