//! Recording: the stored object version goes into the server's inventory
//! (`POST /jobs/JID/object`), queryable by ark and by local id.
//!
//! The version number comes from the storage markers the storing step
//! wrote (`<job>/stored-<target>.json`); every target must hold the job's
//! files as the same version, and the storage manifest must be the one
//! that was stored. The files are those of the stored version: the producer
//! files (sizes and digests from the download step's list, SHA-256 computed
//! where it has none) and the files of `system/` (SHA-256 computed).
//!
//! Recording is idempotent on the server: a retry or a requeue that
//! records the same version again is answered `{"new": false}`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;

use chrono::Utc;
use ingest_protocol::api::{InventoryBody, ObjectBody, WorkerRef};
use ingest_protocol::endpoint::RecordObject;
use ingest_steps::erc::ErcFields;
use ingest_steps::inventory::{InventoryFile, ObjectVersionRecord};

use super::fetch::RetryPolicy;
use super::marker::{read_marker, target_names};
use super::process::{self, call_api, erc_fields, job_data, local_ids, primary_id, MANIFEST_FILE};
use super::{locks, RealConfig};
use crate::step::{JobCtx, JobData, Outcome, Step, StepError, StepFuture, StepResult};

/// The step.
pub struct Record {
    config: Arc<RealConfig>,
    targets: Vec<Arc<ingest_steps::ocfl::OcflTarget>>,
}

impl Record {
    /// The step; `targets` are the storage targets, whose first one the
    /// inventory hand-off's manifest URL points into.
    pub fn new(
        config: Arc<RealConfig>,
        targets: Vec<Arc<ingest_steps::ocfl::OcflTarget>>,
    ) -> Record {
        Record { config, targets }
    }

    /// Takes the job's local-id locks (again, when an earlier step's
    /// session has gone) and the object's inventory lock, then records;
    /// every lock is released at the end: the object is in the inventory,
    /// so the next job of the local id finds its ark.
    async fn locked(&self, job: &JobCtx) -> StepResult {
        let policy = self.config.retry();
        let data = match job_data(job, policy).await {
            Ok(d) => d,
            Err(e) => return StepResult::Report(Outcome::from(e)),
        };
        let Some(ark) = primary_id(&data.identifiers) else {
            return StepResult::Report(Outcome::failure("no ark: Processing did not assign one"));
        };
        let lid_locks = locks::localid_locks(
            &data.configuration.profile_name,
            &local_ids(&data.identifiers),
        );
        if let Err(wait) = locks::acquire(job, &lid_locks, locks::Holder::AcrossSteps, policy).await
        {
            return wait;
        }
        let inventory = [ingest_projections::layout::inventory_lock(&ark)];
        if let Err(wait) = locks::acquire(job, &inventory, locks::Holder::WithinStep, policy).await
        {
            return wait;
        }
        let outcome = self.record(job, data, ark).await;
        locks::release_all(job, &inventory).await;
        locks::release_all(job, &lid_locks).await;
        StepResult::Report(outcome)
    }

    async fn record(&self, job: &JobCtx, data: JobData, ark: String) -> Outcome {
        let policy = self.config.retry();
        let mode = match data.configuration.submission_mode.as_str() {
            "update" => "update",
            _ => "add",
        };
        let job_dir = self.config.job_dir(&data.bid, job.jid);
        let input = RecordInput {
            ark,
            collection: data.configuration.profile_name.clone(),
            local_ids: local_ids(&data.identifiers),
            targets: target_names(&self.config.args.storage_targets),
            jid: job.jid.to_string(),
            bid: data.bid.clone(),
            erc: erc_fields(&data.metadata),
        };
        let built = {
            let dir = job_dir.clone();
            tokio::task::spawn_blocking(move || build_record(&dir, &input)).await
        };
        let record = match built {
            Ok(Ok(built)) => built,
            Ok(Err(e)) => return Outcome::from(e),
            Err(e) => {
                return Outcome::failure(format!("building the inventory record failed: {e}"))
            }
        };
        let manifest_url = match super::marker::stored_manifest_url(
            &self.targets,
            &record.ark,
            Some(record.version),
        )
        .await
        {
            Ok(url) => url,
            Err(e) => return Outcome::from(e),
        };
        match send_record(job, policy, &record).await {
            Ok(new) => {
                tracing::info!(jid = %job.jid, state = %job.state, ark = %record.ark, version = record.version, new, "recorded");
                let again = if new { "" } else { " (already recorded)" };
                Outcome::success(format!(
                    "recorded {} v{}{again}",
                    record.ark, record.version
                ))
                .with_inventory(InventoryBody {
                    manifest_url,
                    mode: mode.to_string(),
                })
            }
            Err(e) => Outcome::from(e),
        }
    }
}

impl Step for Record {
    fn run<'a>(&'a self, job: &'a JobCtx) -> StepFuture<'a> {
        Box::pin(self.locked(job))
    }
}

/// What [`build_record`] needs besides the working directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordInput {
    /// The object's ark.
    pub ark: String,
    /// The collection (profile name).
    pub collection: String,
    /// The depositor's local ids.
    pub local_ids: Vec<String>,
    /// The configured storage targets; empty: whichever targets left a
    /// marker in the working directory.
    pub targets: Vec<String>,
    /// The job.
    pub jid: String,
    /// Its batch.
    pub bid: String,
    /// The ERC metadata (`who`, `what`, `when` are recorded).
    pub erc: ErcFields,
}

/// The inventory record of the version the storing step stored from
/// `job_dir`.
///
/// # Errors
/// No storage marker for a target, markers for another ark or disagreeing
/// on the version (the message names each target and version), a storage
/// manifest changed since it was stored, or a file that cannot be read.
pub fn build_record(job_dir: &Path, input: &RecordInput) -> Result<ObjectVersionRecord, StepError> {
    let targets = if input.targets.is_empty() {
        marker_targets(job_dir)?
    } else {
        input.targets.clone()
    };
    if targets.is_empty() {
        return Err(StepError::permanent(format!(
            "no storage target holds {}: Storing did not finish",
            input.ark
        )));
    }
    let (_, manifest_sha256) = process::sha256_of(&job_dir.join("system").join(MANIFEST_FILE))?;
    let mut versions = Vec::with_capacity(targets.len());
    for target in &targets {
        let marker = read_marker(job_dir, target)?.ok_or_else(|| {
            format!(
                "target {target} holds no version of {}: Storing did not finish",
                input.ark
            )
        })?;
        if marker.ark != input.ark {
            return Err(StepError::permanent(format!(
                "target {target} stored {}, not the job's ark {}",
                marker.ark, input.ark
            )));
        }
        if marker.manifest_sha256 != manifest_sha256 {
            return Err(StepError::permanent(format!(
                "the storage manifest changed after target {target} stored {} v{}: store again",
                input.ark, marker.version
            )));
        }
        versions.push((target.clone(), marker.version));
    }
    let distinct: BTreeSet<u32> = versions.iter().map(|(_, v)| *v).collect();
    let version = match distinct.first() {
        Some(v) if distinct.len() == 1 => *v,
        _ => {
            let each: Vec<String> = versions
                .iter()
                .map(|(t, v)| format!("v{v} in {t}"))
                .collect();
            return Err(StepError::permanent(format!(
                "the storage targets disagree on the version of {}: {}",
                input.ark,
                each.join(", ")
            )));
        }
    };
    Ok(assemble(input, version, targets, record_files(job_dir)?))
}

/// The files of the version stored from `job_dir`, sorted by path: the
/// producer files (digests from the download step) and `system/`.
fn record_files(job_dir: &Path) -> Result<Vec<InventoryFile>, StepError> {
    let mut files: Vec<InventoryFile> = process::producer_files(job_dir)?
        .into_iter()
        .map(|f| InventoryFile {
            path: format!("producer/{}", f.name),
            size: f.size,
            digests: f.digests,
        })
        .collect();
    for (name, path) in process::walk(&job_dir.join("system"))? {
        let (size, sha256) = process::sha256_of(&path)?;
        files.push(InventoryFile {
            path: format!("system/{name}"),
            size,
            digests: BTreeMap::from([("sha256".to_string(), sha256)]),
        });
    }
    files.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(files)
}

fn assemble(
    input: &RecordInput,
    version: u32,
    targets: Vec<String>,
    files: Vec<InventoryFile>,
) -> ObjectVersionRecord {
    let mut erc = BTreeMap::new();
    for (key, value) in [
        ("who", &input.erc.who),
        ("what", &input.erc.what),
        ("when", &input.erc.when),
    ] {
        if let Some(v) = value {
            erc.insert(key.to_string(), v.clone());
        }
    }
    ObjectVersionRecord {
        ark: input.ark.clone(),
        version,
        collection: input.collection.clone(),
        local_ids: input.local_ids.clone(),
        files,
        storage_targets: targets,
        jid: input.jid.clone(),
        bid: input.bid.clone(),
        recorded_at: Utc::now(),
        erc,
    }
}

/// The size in bytes of the `POST /jobs/JID/object` body Recording will
/// send for the version about to be stored from `job_dir`, computed before
/// Storing from the same files (the version number and the worker's names
/// taken at their longest), so that an object whose record the server would
/// refuse is refused before anything is stored.
///
/// # Errors
/// A working file that cannot be read, with its path.
pub fn record_body_bytes(job_dir: &Path, input: &RecordInput) -> Result<usize, StepError> {
    let record = assemble(
        input,
        u32::MAX,
        input.targets.clone(),
        record_files(job_dir)?,
    );
    let body = ObjectBody {
        // Longer than any worker name and session id sent.
        worker: "w".repeat(256),
        session_id: ingest_protocol::api::SessionId(i64::MIN),
        record,
    };
    serde_json::to_vec(&body)
        .map(|b| b.len())
        .map_err(|e| StepError::permanent(format!("the inventory record cannot be encoded: {e}")))
}

/// Sends `record` to `POST /jobs/JID/object`; `true` when the version is
/// new to the inventory, `false` when it was recorded already.
///
/// # Errors
/// A refusal (409, e.g. `inventory_conflict`: a version gap, a local id
/// bound to another ark) with the server's message, or an API error left
/// when retries run out.
pub async fn send_record(
    job: &JobCtx,
    policy: RetryPolicy,
    record: &ObjectVersionRecord,
) -> Result<bool, StepError> {
    let answer = call_api(job, policy, &RecordObject(job.jid), |who: WorkerRef| {
        ObjectBody {
            worker: who.worker,
            session_id: who.session_id,
            record: record.clone(),
        }
    })
    .await?;
    Ok(answer.new)
}

/// The targets that left a marker in `job_dir`, sorted.
fn marker_targets(job_dir: &Path) -> Result<Vec<String>, StepError> {
    let entries = std::fs::read_dir(job_dir)
        .map_err(|e| format!("cannot list {}: {e}", job_dir.display()))?;
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| format!("cannot list {}: {e}", job_dir.display()))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(target) = name
            .strip_prefix("stored-")
            .and_then(|n| n.strip_suffix(".json"))
        {
            names.push(target.to_string());
        }
    }
    names.sort();
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::real::marker::{marker_path, StoredMarker};
    use crate::step::ApiCtx;
    use ingest_client::Client as EngineClient;
    use ingest_events::JobState;
    use serde_json::json;
    use std::path::PathBuf;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Duration;

    const ARK: &str = "ark:/99999/fk4rec";

    fn job_dir(root: &Path) -> PathBuf {
        let dir = root.join("jid1");
        std::fs::create_dir_all(dir.join("producer")).expect("mkdir");
        std::fs::write(dir.join("producer/a.txt"), b"abc").expect("write");
        let erc = ErcFields {
            who: Some("Doe".into()),
            ..ErcFields::default()
        };
        process::write_object_files(&dir, ARK, &["L1".into()], &erc, None).expect("files");
        dir
    }

    fn mark(dir: &Path, target: &str, version: u32) {
        let (_, sha) = process::sha256_of(&dir.join("system").join(MANIFEST_FILE)).expect("sha");
        let marker = StoredMarker {
            target: target.into(),
            ark: ARK.into(),
            version,
            manifest_sha256: sha,
        };
        std::fs::write(
            marker_path(dir, target),
            serde_json::to_vec(&marker).expect("json"),
        )
        .expect("marker");
    }

    fn input(targets: &[&str]) -> RecordInput {
        RecordInput {
            ark: ARK.into(),
            collection: "demo".into(),
            local_ids: vec!["L1".into()],
            targets: targets.iter().map(|t| t.to_string()).collect(),
            jid: "jid1".into(),
            bid: "bid1".into(),
            erc: ErcFields {
                who: Some("Doe".into()),
                ..ErcFields::default()
            },
        }
    }

    #[test]
    fn the_record_lists_the_stored_version() {
        let root = tempfile::tempdir().expect("tempdir");
        let dir = job_dir(root.path());
        let err = build_record(&dir, &input(&[]))
            .expect_err("not stored")
            .to_string();
        assert!(err.contains("Storing did not finish"), "{err}");
        mark(&dir, "one", 2);
        mark(&dir, "two", 2);
        let rec = build_record(&dir, &input(&[])).expect("record");
        assert_eq!(rec.version, 2);
        assert_eq!(rec.storage_targets, vec!["one", "two"]);
        assert_eq!(rec.collection, "demo");
        assert_eq!(rec.erc.get("who").map(String::as_str), Some("Doe"));
        let paths: Vec<&str> = rec.files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(
            paths,
            vec![
                "producer/a.txt",
                "system/mrt-dc.xml",
                "system/mrt-erc.txt",
                "system/mrt-manifest.txt"
            ]
        );
        assert_eq!(rec.files[0].size, 3);
        assert_eq!(
            rec.files[0].digests["sha256"],
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );

        let err = build_record(&dir, &input(&["one", "three"]))
            .expect_err("missing")
            .to_string();
        assert!(err.contains("target three"), "{err}");
        mark(&dir, "two", 3);
        let err = build_record(&dir, &input(&["one", "two"]))
            .expect_err("disagree")
            .to_string();
        assert!(err.contains("v2 in one, v3 in two"), "{err}");
        assert!(build_record(&dir, &input(&["one"])).is_ok());
        std::fs::write(dir.join("system").join(MANIFEST_FILE), b"changed").expect("write");
        let err = build_record(&dir, &input(&["one"]))
            .expect_err("changed manifest")
            .to_string();
        assert!(err.contains("changed after target one"), "{err}");
    }

    /// A local API: `/jobs/{jid}/object` fails with 503 `fail_first` times,
    /// then answers `status` with `body`; retries are counted.
    async fn api(
        fail_first: u32,
        status: u16,
        body: serde_json::Value,
    ) -> (String, Arc<AtomicU32>, Arc<AtomicU32>) {
        use axum::http::StatusCode;
        use axum::routing::post;
        let calls = Arc::new(AtomicU32::new(0));
        let retries = Arc::new(AtomicU32::new(0));
        let (c, r) = (Arc::clone(&calls), Arc::clone(&retries));
        let app = axum::Router::new()
            .route(
                <RecordObject as ingest_protocol::endpoint::Endpoint>::ROUTE,
                post(move |axum::Json(req): axum::Json<serde_json::Value>| {
                    let c = Arc::clone(&c);
                    let body = body.clone();
                    async move {
                        assert_eq!(req["worker"], "w1");
                        assert_eq!(req["record"]["ark"], ARK);
                        let n = c.fetch_add(1, Ordering::SeqCst);
                        if n < fail_first {
                            return (StatusCode::SERVICE_UNAVAILABLE, axum::Json(json!({})));
                        }
                        let status = StatusCode::from_u16(status)
                            .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
                        (status, axum::Json(body))
                    }
                }),
            )
            .route(
                "/jobs/{jid}/retries",
                post(move || {
                    let r = Arc::clone(&r);
                    async move {
                        r.fetch_add(1, Ordering::SeqCst);
                        axum::Json(ingest_protocol::api::JobMoved {
                            jid: "jid1".into(),
                            status: "Recording".into(),
                            batch_status: "Processing".into(),
                            bid: "bid1".into(),
                            events: Vec::new(),
                        })
                    }
                }),
            );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        (format!("http://{addr}"), calls, retries)
    }

    fn job(base: &str) -> JobCtx {
        let mut job = JobCtx::detached(ingest_events::Jid(1), JobState::Recording, 5);
        job.api = Some(ApiCtx {
            engine: EngineClient::new(base, "token").expect("client"),
            worker: "w1".into(),
            session_id: 7,
            fence: ingest_protocol::fence::FenceSecret::from_bytes([7; 32]),
        });
        job
    }

    fn policy() -> RetryPolicy {
        RetryPolicy {
            retries: 3,
            first_backoff: Duration::from_millis(1),
            max_backoff: Duration::from_millis(5),
        }
    }

    #[tokio::test]
    async fn recording_retries_and_reports_conflicts() {
        let root = tempfile::tempdir().expect("tempdir");
        let dir = job_dir(root.path());
        mark(&dir, "one", 1);
        let rec = build_record(&dir, &input(&["one"])).expect("record");

        let (base, calls, retries) = api(2, 200, json!({"new": true})).await;
        assert_eq!(send_record(&job(&base), policy(), &rec).await, Ok(true));
        assert_eq!(calls.load(Ordering::SeqCst), 3);
        assert_eq!(retries.load(Ordering::SeqCst), 2, "each retry is recorded");

        let (base, _, _) = api(0, 200, json!({"new": false})).await;
        assert_eq!(send_record(&job(&base), policy(), &rec).await, Ok(false));

        let conflict =
            json!({"error": {"code": "inventory_conflict", "message": "version gap: v3 after v1"}});
        let (base, calls, _) = api(0, 409, conflict).await;
        let err = send_record(&job(&base), policy(), &rec)
            .await
            .expect_err("conflict")
            .to_string();
        assert!(err.contains("version gap: v3 after v1"), "{err}");
        assert_eq!(calls.load(Ordering::SeqCst), 1, "a conflict is not retried");

        let (base, calls, _) = api(10, 200, json!({})).await;
        let err = send_record(&job(&base), policy(), &rec)
            .await
            .expect_err("always failing")
            .to_string();
        assert!(err.contains("503"), "{err}");
        assert_eq!(calls.load(Ordering::SeqCst), 4);
    }

    /// A fenced call's error keeps its kind: the engine's refusal (409)
    /// with its code, a retryable error whose retries ran out, and a
    /// permanent one (400), each without reading a message.
    #[tokio::test]
    async fn call_errors_say_refused_recoverable_or_permanent() {
        use crate::step::StepError;
        use ingest_protocol::api::ObjectBody;
        let root = tempfile::tempdir().expect("tempdir");
        let dir = job_dir(root.path());
        mark(&dir, "one", 1);
        let rec = build_record(&dir, &input(&["one"])).expect("record");
        let call = |base: String| {
            let rec = rec.clone();
            async move {
                call_api(
                    &job(&base),
                    policy(),
                    &RecordObject(ingest_events::Jid(1)),
                    |who| ObjectBody {
                        worker: who.worker,
                        session_id: who.session_id,
                        record: rec.clone(),
                    },
                )
                .await
            }
        };
        let conflict = json!({"error": {"code": "inventory_conflict", "message": "gap"}});
        let (base, _, _) = api(0, 409, conflict).await;
        assert!(matches!(
            call(base).await,
            Err(StepError::Refused { ref code, .. }) if code == "inventory_conflict"
        ));
        let (base, _, _) = api(10, 200, json!({})).await;
        assert!(matches!(call(base).await, Err(StepError::Recoverable(_))));
        let (base, calls, _) = api(0, 400, json!({"error": {"code": "invalid_field"}})).await;
        assert!(matches!(call(base).await, Err(StepError::Permanent { .. })));
        assert_eq!(calls.load(Ordering::SeqCst), 1, "a 400 is not retried");
    }
}
