//! The real steps end to end: `ingest serve` with in-process daemons running
//! the real steps, payloads served by a local HTTP server, objects stored in
//! local OCFL repositories, recorded in the inventory, callbacks received.

use std::collections::BTreeMap;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use axum::extract::{Path as UrlPath, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use reqwest::Method;
use serde_json::{json, Value};

use crate::server::{eventually, start_with, Server, ADMIN, DEPOSITOR};
use crate::zk_server::{shared, unique_root};

/// What the local depositor server saw and serves.
#[derive(Default)]
pub(crate) struct Depot {
    files: BTreeMap<String, Vec<u8>>,
    /// Requests per file name.
    hits: BTreeMap<String, u32>,
    /// Failures still to give per file name (503 each).
    flaky: BTreeMap<String, u32>,
    callbacks: Vec<Value>,
    /// Arks minted by the fake EZID.
    ezid_mints: u32,
    /// The bodies of the mint requests the fake EZID received.
    ezid_bodies: Vec<String>,
    /// File names answered with a redirect (307) to the URL.
    redirects: BTreeMap<String, String>,
}

pub(crate) type Shared = Arc<Mutex<Depot>>;

async fn serve_file(
    method: Method,
    State(depot): State<Shared>,
    UrlPath(name): UrlPath<String>,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let mut d = depot.lock().expect("depot");
    if let Some(to) = d.redirects.get(&name) {
        return axum::response::Redirect::temporary(to).into_response();
    }
    serve_file_of(&mut d, &method, name).into_response()
}

fn serve_file_of(d: &mut Depot, method: &Method, name: String) -> (StatusCode, Vec<u8>) {
    // Only downloads (GET) count and meet the failures; the estimating
    // step's HEAD requests do not.
    if *method != Method::GET {
        return match d.files.get(&name) {
            Some(body) => (StatusCode::OK, body.clone()),
            None => (StatusCode::NOT_FOUND, Vec::new()),
        };
    }
    *d.hits.entry(name.clone()).or_default() += 1;
    if name.starts_with("always-500") {
        return (StatusCode::INTERNAL_SERVER_ERROR, b"broken".to_vec());
    }
    if let Some(n) = d.flaky.get_mut(&name) {
        if *n > 0 {
            *n -= 1;
            return (StatusCode::SERVICE_UNAVAILABLE, b"busy".to_vec());
        }
    }
    match d.files.get(&name) {
        Some(body) => (StatusCode::OK, body.clone()),
        None => (StatusCode::NOT_FOUND, b"no such file".to_vec()),
    }
}

/// A fake EZID: `POST /ezid/shoulder/SHOULDER` mints the next ark.
async fn ezid(
    State(depot): State<Shared>,
    UrlPath(shoulder): UrlPath<String>,
    headers: axum::http::HeaderMap,
    body: String,
) -> (StatusCode, String) {
    // "ezid-user:ezid-secret"
    if headers.get("authorization").and_then(|v| v.to_str().ok())
        != Some("Basic ZXppZC11c2VyOmV6aWQtc2VjcmV0")
    {
        return (StatusCode::UNAUTHORIZED, "error: unauthorized".into());
    }
    let mut d = depot.lock().expect("depot");
    d.ezid_mints += 1;
    d.ezid_bodies.push(body);
    (
        StatusCode::CREATED,
        format!("success: {shoulder}ezid{}\n", d.ezid_mints),
    )
}

async fn callback(State(depot): State<Shared>, Json(body): Json<Value>) -> StatusCode {
    depot.lock().expect("depot").callbacks.push(body);
    StatusCode::OK
}

/// A local HTTP server for payloads (`/files/NAME`) and callbacks (`/callback`).
async fn depot() -> (Shared, String) {
    let depot: Shared = Arc::default();
    let app = Router::new()
        .route("/files/{name}", get(serve_file))
        .route("/callback", post(callback))
        .route("/ezid/shoulder/{*shoulder}", post(ezid))
        .with_state(Arc::clone(&depot));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr: SocketAddr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (depot, format!("http://{addr}"))
}

pub(crate) fn add(depot: &Shared, name: &str, body: &[u8]) {
    depot
        .lock()
        .expect("depot")
        .files
        .insert(name.to_string(), body.to_vec());
}

pub(crate) fn sha256(bytes: &[u8]) -> String {
    let mut h = ingest_steps::digest::MultiHasher::new(&[ingest_steps::digest::Algorithm::Sha256]);
    h.update(bytes);
    h.finish().remove(0).1
}

pub(crate) fn zip(entries: &[(&str, &[u8])]) -> Vec<u8> {
    let mut out = std::io::Cursor::new(Vec::new());
    {
        let mut w = zip::ZipWriter::new(&mut out);
        for (name, body) in entries {
            w.start_file(*name, zip::write::SimpleFileOptions::default())
                .expect("zip entry");
            w.write_all(body).expect("zip body");
        }
        w.finish().expect("zip");
    }
    out.into_inner()
}

fn manifest(profile: &str, fields: &str, lines: &[String]) -> Vec<u8> {
    let mut m = format!(
        "#%checkm_0.7\n#%profile | http://uc3.cdlib.org/registry/ingest/manifest/{profile}\n#%prefix | mrt: | http://merritt.cdlib.org/terms#\n#%prefix | nfo: | http://www.semanticdesktop.org/ontologies/2007/03/22/nfo#\n#%fields | {fields}\n"
    );
    for l in lines {
        m.push_str(l);
        m.push('\n');
    }
    m.push_str("#%eof\n");
    m.into_bytes()
}

const BATCH_FIELDS: &str = "nfo:fileUrl | nfo:hashAlgorithm | nfo:hashValue | nfo:fileSize | nfo:fileLastModified | nfo:fileName | mrt:primaryIdentifier | mrt:localIdentifier | mrt:creator | mrt:title | mrt:date";
const OBJECT_FIELDS: &str = "nfo:fileUrl | nfo:hashAlgorithm | nfo:hashValue | nfo:fileSize | nfo:fileLastModified | nfo:fileName | mrt:mimeType";

pub(crate) struct Rig {
    pub(crate) server: Server,
    pub(crate) depot: Shared,
    pub(crate) base: String,
    pub(crate) storage: PathBuf,
    /// `HOSTS/ROOT` of the server's tree.
    pub(crate) zk_at: String,
    pub(crate) _dir: tempfile::TempDir,
    /// Keeps the shared ZooKeeper running while the rig lives.
    _zk: std::sync::Arc<crate::zk_server::ZkServer>,
}

pub(crate) async fn rig(name: &str, extra: &[String]) -> Rig {
    let zk_server = shared();
    let dir = tempfile::tempdir().expect("tempdir");
    let (depot, base) = depot().await;
    let profiles = dir.path().join("profiles");
    std::fs::create_dir_all(&profiles).expect("profiles");
    std::fs::write(
        profiles.join("demo.yaml"),
        format!("name: demo\nnotification:\n  callback_url: {base}/callback\n  emails: [curator@example.org]\n"),
    )
    .expect("profile");
    let storage = dir.path().join("ocfl");
    let mut args = rig_args(dir.path());
    args.extend(extra.iter().cloned());
    let root = unique_root(name);
    let server = start_with(
        dir.path(),
        &zk_server.hosts(),
        &root,
        Some(&[]),
        "real",
        &args,
    );
    Rig {
        server,
        depot,
        base,
        storage,
        zk_at: format!("{}{root}", zk_server.hosts()),
        _dir: dir,
        _zk: zk_server,
    }
}

/// Puts `bytes` in the rig's depot as `name` and submits it as a batch of
/// one file job located at `local`; the batch id.
async fn submit_file(rig: &Rig, name: &str, bytes: &[u8], local: &str) -> String {
    add(&rig.depot, name, bytes);
    rig.submit(
        json!({"profile": "demo", "submitter": "alice", "type": "file",
                      "payload_url": format!("{}/files/{name}", rig.base), "erc_where": local}),
    )
    .await
}

/// Asserts that no version of `ark` is in the storage target at `storage`.
fn assert_nothing_stored(storage: &Path, ark: &str) {
    let target =
        ingest_steps::ocfl::OcflTarget::open_existing("check", storage).expect("open storage");
    assert!(
        matches!(
            target.versions(ark),
            Err(ingest_steps::ocfl::StorageError::NotFound { .. })
        ),
        "nothing of {ark} was stored"
    );
}

/// The `serve` arguments of a rig in `dir` (its profiles, storage target
/// and outbox), before the test's own.
fn rig_args(dir: &Path) -> Vec<String> {
    [
        "--profiles-dir",
        &dir.join("profiles").display().to_string(),
        "--storage-target",
        &format!("primary={}", dir.join("ocfl").display()),
        "--outbox",
        &dir.join("outbox").display().to_string(),
        "--retry-backoff-ms",
        "20",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

impl Rig {
    pub(crate) async fn submit(&self, body: Value) -> String {
        let (status, reply) = self
            .server
            .call(Method::POST, "/batches", DEPOSITOR, Some(body))
            .await;
        assert_eq!(status, 201, "{reply}");
        reply["bid"].as_str().expect("bid").to_string()
    }

    /// Waits until the batch ended (Completed or Failed); its view.
    pub(crate) async fn finished(&self, bid: &str) -> Value {
        eventually(&format!("batch {bid} finished"), 90, async || {
            let b = self.server.get(&format!("/batches/{bid}")).await;
            matches!(b["status"].as_str(), Some("Completed" | "Failed")).then_some(b)
        })
        .await
    }

    pub(crate) async fn job(&self, jid: &str) -> Value {
        self.server.get(&format!("/jobs/{jid}")).await
    }

    /// The job's moves as its history describes them (`From -> To: …`).
    async fn moves(&self, jid: &str) -> Vec<String> {
        self.history(jid)
            .await
            .iter()
            .filter(|r| r["event"] == "JobStatusChanged")
            .filter_map(|r| r["detail"].as_str().map(str::to_string))
            .collect()
    }

    /// An admin deletes the job, which must succeed.
    async fn delete_job(&self, jid: &str, reason: &str) {
        let (status, body) = self
            .admin(Method::DELETE, &format!("/jobs/{jid}"), reason)
            .await;
        assert_eq!(status, 200, "{body}");
    }

    /// An admin's `method` on `path` with `reason`: the status and body.
    async fn admin(&self, method: Method, path: &str, reason: &str) -> (u16, Value) {
        self.server
            .call(method, path, ADMIN, Some(json!({ "reason": reason })))
            .await
    }

    async fn history(&self, jid: &str) -> Vec<Value> {
        self.server.get(&format!("/jobs/{jid}/history")).await["events"]
            .as_array()
            .expect("events")
            .clone()
    }

    pub(crate) fn jobs(batch: &Value) -> Vec<String> {
        batch["jobs"]
            .as_array()
            .expect("jobs")
            .iter()
            .map(|j| j["jid"].as_str().expect("jid").to_string())
            .collect()
    }

    /// Asserts the job's object is stored (fixity verified by OCFL) and
    /// inventoried by ark and by local id; returns the ark.
    async fn assert_stored(&self, jid: &str, local_id: Option<&str>, files: &[&str]) -> String {
        let job = self.job(jid).await;
        assert_eq!(job["status"], "Completed", "{job}");
        let ark = job["primary_id"].as_str().expect("an ark").to_string();
        assert!(
            ingest_steps::noid::verify(&ark),
            "{ark} fails its check character"
        );
        let target = ingest_steps::ocfl::OcflTarget::open_existing("check", &self.storage)
            .expect("open storage");
        let report = target.verify(&ark).expect("verify");
        assert!(report.ok, "fixity of {ark}: {:?}", report.problems);
        let object = self.server.get(&format!("/objects/{ark}")).await;
        let stored: Vec<String> = object["versions"][0]["files"]
            .as_array()
            .expect("files")
            .iter()
            .map(|f| f["path"].as_str().unwrap_or_default().to_string())
            .collect();
        for f in files {
            assert!(
                stored.iter().any(|s| s == &format!("producer/{f}")),
                "{f} not in {stored:?}"
            );
            let bytes = target
                .read_file(&ark, None, &format!("producer/{f}"))
                .expect("read back");
            let depot = self.depot.lock().expect("depot");
            if let Some(original) = depot.files.get(*f) {
                assert_eq!(&bytes, original, "{f} stored differently");
            }
        }
        if let Some(local) = local_id {
            let found = self
                .server
                .get(&format!("/objects?collection=demo&local_id={local}"))
                .await;
            assert_eq!(found["ark"], ark.as_str());
        }
        ark
    }

    /// The inventory's version numbers of `ark`, and its object view.
    async fn versions(&self, ark: &str) -> (Vec<u64>, Value) {
        let object = self.server.get(&format!("/objects/{ark}")).await;
        let versions = object["versions"]
            .as_array()
            .expect("versions")
            .iter()
            .filter_map(|v| v["version"].as_u64())
            .collect();
        (versions, object)
    }

    /// Requeues a failed job and waits until it is Completed.
    async fn requeue_until_completed(&self, jid: &str) {
        let (status, body) = self
            .server
            .call(
                Method::POST,
                &format!("/jobs/{jid}/requeue"),
                ADMIN,
                Some(json!({"reason": "drill over"})),
            )
            .await;
        assert_eq!(status, 200, "{body}");
        eventually("the requeued job completed", 60, async || {
            (self.job(jid).await["status"] == "Completed").then_some(())
        })
        .await;
    }

    /// The callbacks received so far whose `key` is `value`.
    pub(crate) fn callbacks_with(&self, key: &str, value: &str) -> Vec<Value> {
        self.depot
            .lock()
            .expect("depot")
            .callbacks
            .iter()
            .filter(|c| c[key] == value)
            .cloned()
            .collect()
    }

    /// The outbox's first message containing `needle`, once there is one.
    pub(crate) async fn mail_containing(&self, needle: &str) -> String {
        let outbox = self._dir.path().join("outbox");
        eventually(&format!("an e-mail with {needle:?}"), 60, async || {
            std::fs::read_dir(&outbox)
                .ok()?
                .filter_map(|e| std::fs::read_to_string(e.ok()?.path()).ok())
                .find(|m| m.contains(needle))
        })
        .await
    }

    fn callbacks_for(&self, jid: &str) -> usize {
        self.depot
            .lock()
            .expect("depot")
            .callbacks
            .iter()
            .filter(|c| c["jid"] == jid)
            .count()
    }
}

fn retries(history: &[Value]) -> usize {
    history
        .iter()
        .filter(|r| r["event"] == "JobStepRetried")
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_batch_form_ends_stored_inventoried_and_reported() {
    let rig = rig("forms", &[]).await;
    let hello = b"hello, preservation\n".to_vec();
    add(&rig.depot, "hello.txt", &hello);
    add(&rig.depot, "a.txt", b"file a");
    add(&rig.depot, "b.txt", b"file b");
    add(
        &rig.depot,
        "c.zip",
        &zip(&[("data/one.txt", b"one"), ("two.txt", b"two")]),
    );
    let b = &rig.base;
    add(
        &rig.depot,
        "object.checkm",
        &manifest(
            "mrt-ingest-manifest",
            OBJECT_FIELDS,
            &[
                format!(
                    "{b}/files/a.txt | sha256 | {} | | | a.txt | text/plain",
                    sha256(b"file a")
                ),
                format!("{b}/files/b.txt | | | | | sub/b.txt |"),
            ],
        ),
    );
    add(
        &rig.depot,
        "single.checkm",
        &manifest(
            "mrt-single-file-batch-manifest",
            BATCH_FIELDS,
            &[
                format!("{b}/files/a.txt | | | | | a.txt | | loc-single-a | Alice | A | 2024 |"),
                format!("{b}/files/b.txt | | | | | b.txt | | loc-single-b | | | |"),
            ],
        ),
    );
    add(
        &rig.depot,
        "containers.checkm",
        &manifest(
            "mrt-container-batch-manifest",
            BATCH_FIELDS,
            &[format!(
                "{b}/files/c.zip | | | | | c.zip | | loc-zip | | | |"
            )],
        ),
    );
    add(
        &rig.depot,
        "batch.checkm",
        &manifest(
            "mrt-batch-manifest",
            BATCH_FIELDS,
            &[format!(
                "{b}/files/object.checkm | | | | | object.checkm | | loc-batch | | | |"
            )],
        ),
    );

    let submission = |ty: &str, url: String, local: &str| {
        json!({"profile": "demo", "submitter": "alice", "type": ty, "payload_url": url,
               "erc_who": "Alice", "erc_what": "A test", "erc_when": "2024", "erc_where": local})
    };
    let mut with_digest = submission("file", format!("{b}/files/hello.txt"), "loc-file");
    with_digest["digest"] = json!(format!("sha256:{}", sha256(&hello)));
    let batches = [
        (
            "file",
            rig.submit(with_digest).await,
            vec![("loc-file", vec!["hello.txt"])],
        ),
        (
            "object-manifest",
            rig.submit(submission(
                "object-manifest",
                format!("{b}/files/object.checkm"),
                "loc-object",
            ))
            .await,
            vec![("loc-object", vec!["a.txt", "sub/b.txt"])],
        ),
        (
            "single-file-batch-manifest",
            rig.submit(submission(
                "single-file-batch-manifest",
                format!("{b}/files/single.checkm"),
                "",
            ))
            .await,
            vec![
                ("loc-single-a", vec!["a.txt"]),
                ("loc-single-b", vec!["b.txt"]),
            ],
        ),
        (
            "container-batch-manifest",
            rig.submit(submission(
                "container-batch-manifest",
                format!("{b}/files/containers.checkm"),
                "",
            ))
            .await,
            vec![("loc-zip", vec!["data/one.txt", "two.txt"])],
        ),
        (
            "batch-manifest",
            rig.submit(submission(
                "batch-manifest",
                format!("{b}/files/batch.checkm"),
                "",
            ))
            .await,
            vec![("loc-batch", vec!["a.txt", "sub/b.txt"])],
        ),
    ];
    for (form, bid, expected) in &batches {
        let batch = rig.finished(bid).await;
        assert_eq!(batch["status"], "Completed", "{form}: {batch}");
        let jobs = Rig::jobs(&batch);
        assert_eq!(jobs.len(), expected.len(), "{form}: {batch}");
        let mut arks = Vec::new();
        for jid in &jobs {
            let job = rig.job(jid).await;
            let local = job["local_ids"][0].as_str().unwrap_or_default().to_string();
            let files = &expected
                .iter()
                .find(|(l, _)| *l == local)
                .unwrap_or_else(|| panic!("{form}: unexpected local id {local:?} of {job}"))
                .1;
            arks.push(rig.assert_stored(jid, Some(&local), files).await);
            assert_eq!(rig.callbacks_for(jid), 1, "{form}: one callback per job");
        }
        let shown = tokio::task::block_in_place(|| {
            std::process::Command::new(crate::util::ingest_bin())
                .args([
                    "--engine",
                    &rig.server.base,
                    "inventory",
                    &arks[0],
                    "--format",
                    "json",
                ])
                .env("INGEST_ADMIN_TOKEN", ADMIN)
                .output()
                .expect("ingest inventory")
        });
        assert!(shown.status.success(), "{shown:?}");
        let shown: Value = serde_json::from_slice(&shown.stdout).expect("inventory json");
        assert_eq!(shown["ark"], arks[0].as_str(), "{form}");
        let report = rig.server.get(&format!("/batches/{bid}/report")).await;
        let listed = report.to_string();
        for jid in &jobs {
            assert!(
                listed.contains(jid.as_str()),
                "{form}: {jid} not in {report}"
            );
        }
    }
    // One report e-mail per batch for the profile's recipient (no SMTP: the outbox).
    let outbox = rig._dir.path().join("outbox");
    let mails: Vec<String> = std::fs::read_dir(&outbox)
        .expect("outbox")
        .filter_map(|e| std::fs::read_to_string(e.ok()?.path()).ok())
        .filter(|m| m.contains("curator@example.org"))
        .collect();
    for (_, bid, _) in &batches {
        assert!(
            mails.iter().any(|m| m.contains(bid.as_str())),
            "no report e-mail for {bid} in {outbox:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recoverable_errors_are_retried_and_bad_payloads_fail_with_the_reason() {
    let rig = rig(
        "failures",
        &[
            "--step-retries".into(),
            "2".into(),
            "--max-object-bytes".into(),
            (4 * 1024 * 1024).to_string(),
            "--janitor-interval-secs".into(),
            "1".into(),
        ],
    )
    .await;
    add(&rig.depot, "big.bin", &vec![7u8; 5 * 1024 * 1024]);
    let b = rig.base.clone();
    add(&rig.depot, "flaky.txt", b"eventually here");
    rig.depot
        .lock()
        .expect("depot")
        .flaky
        .insert("flaky.txt".into(), 2);
    add(&rig.depot, "good.txt", b"good");
    add(
        &rig.depot,
        "bomb.zip",
        &zip(&[("zeros.bin", &vec![0u8; 8 * 1024 * 1024])]),
    );
    add(&rig.depot, "evil.zip", &zip(&[("../evil.txt", b"evil")]));
    let single = |url: String| json!({"profile": "demo", "submitter": "alice", "type": "file", "payload_url": url});
    let container = |url: String| json!({"profile": "demo", "submitter": "alice", "type": "container", "payload_url": url});

    let flaky = rig.submit(single(format!("{b}/files/flaky.txt"))).await;
    let mut mismatch = single(format!("{b}/files/good.txt"));
    mismatch["digest"] = json!(format!("sha256:{}", sha256(b"not good")));
    let mismatch = rig.submit(mismatch).await;
    let missing = rig.submit(single(format!("{b}/files/missing.txt"))).await;
    let broken = rig
        .submit(single(format!("{b}/files/always-500.txt")))
        .await;
    let bomb = rig.submit(container(format!("{b}/files/bomb.zip"))).await;
    let evil = rig.submit(container(format!("{b}/files/evil.zip"))).await;
    let big = rig.submit(single(format!("{b}/files/big.bin"))).await;

    // Two 503s, then the file: two retries recorded, the job completes.
    let batch = rig.finished(&flaky).await;
    assert_eq!(batch["status"], "Completed", "{batch}");
    let jid = &Rig::jobs(&batch)[0];
    assert_eq!(retries(&rig.history(jid).await), 2);

    for (bid, needle) in [
        (&mismatch, "mismatch"),
        (&missing, "404"),
        (&broken, "always-500.txt"),
        (&bomb, "zeros.bin"),
        (&evil, "evil"),
        (&big, "4194304"),
    ] {
        let batch = rig.finished(bid).await;
        assert_eq!(batch["status"], "Failed", "{needle}: {batch}");
        let jid = &Rig::jobs(&batch)[0];
        let job = rig.job(jid).await;
        assert_eq!(job["status"], "Failed", "{job}");
        assert_eq!(job["last_successful_status"], "Provisioning", "{job}");
        let message = job["message"].as_str().unwrap_or_default();
        assert!(message.contains(needle), "{needle:?} not in {message:?}");
    }
    // The server that always fails was tried 1 + 2 times, each retry an event.
    let batch = rig.server.get(&format!("/batches/{broken}")).await;
    let jid = &Rig::jobs(&batch)[0];
    assert_eq!(retries(&rig.history(jid).await), 2);
    assert_eq!(rig.depot.lock().expect("depot").hits["always-500.txt"], 3);

    // A failed job's working files stay (a requeue resumes from them) until
    // the job is deleted; then the janitor removes them.
    let batch = rig.server.get(&format!("/batches/{mismatch}")).await;
    let jid = Rig::jobs(&batch)[0].clone();
    let dir = rig._dir.path().join("work").join(&mismatch).join(&jid);
    assert!(
        dir.join("producer").exists(),
        "{dir:?} was removed while Failed"
    );
    rig.delete_job(&jid, "bad digest; resubmitted").await;
    eventually("the deleted job's files removed", 30, async || {
        (!dir.exists()).then_some(())
    })
    .await;
}

/// The transitions document's "Job: Pending --> Failed": a payload whose
/// digest does not match the depositor's fails the job with no recovery; a
/// new submission is required. Here the real Downloading step finds it
/// (the payload is first read there), the failure's kind is recorded, and
/// every requeue (the API, the CLI through the server) is refused with 409
/// `unrecoverable_failure` and appends nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_file_payload_whose_digest_differs_fails_for_good() {
    let rig = rig("digest", &[]).await;
    let b = rig.base.clone();
    add(&rig.depot, "payload.txt", b"the bytes the server has");
    let supplied = sha256(b"the bytes the depositor meant");
    // One batch of `type` from `name` with the depositor's digest `supplied`:
    // the batch and its failed job.
    let submit = async |r#type: &str, name: &str| {
        let bid = rig
            .submit(
                json!({"profile": "demo", "submitter": "alice", "type": r#type,
                "payload_url": format!("{b}/files/{name}"),
                "digest": format!("sha256:{supplied}")}),
            )
            .await;
        let (jid, job) = failed_job(&rig, &bid).await;
        assert_eq!(job["failure"]["kind"], "digest_mismatch", "{job}");
        (bid, jid, job)
    };
    let (bid, jid, job) = submit("file", "payload.txt").await;
    assert_eq!(job["failure"]["recoverable"], false, "{job}");
    let message = job["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(&format!("sha256 mismatch: expected {supplied}"))
            && message.contains("a new submission is required"),
        "{message}"
    );
    let history = rig.history(&jid).await;
    let kinds: Vec<&str> = history.iter().filter_map(|r| r["event"].as_str()).collect();
    assert_eq!(
        kinds.last(),
        Some(&"JobFailureClassified"),
        "the kind is recorded after the move: {kinds:?}"
    );

    // The job's status node, as Merritt's readers and the batch reporter read it.
    let zk = zookeeper_client::Client::connect(&rig.zk_at)
        .await
        .expect("zk");
    let (node, _) = zk
        .get_data(&format!("/jobs/{jid}/status"))
        .await
        .expect("status node");
    let node: Value = serde_json::from_slice(&node).expect("status JSON");
    assert_eq!(node["status"], "Failed", "{node}");
    assert_eq!(node["failure"], "digest_mismatch", "{node}");
    // … and the tree the log projects has it too: no drift.
    let (status, diff) = rig.server.call(Method::GET, "/diff", ADMIN, None).await;
    assert_eq!(status, 200, "{diff}");
    for key in ["missing", "unexpected", "differing"] {
        assert_eq!(diff[key], json!([]), "{diff}");
    }

    // The batch is reported with the job failed, saying why and what now.
    let report = rig.server.get(&format!("/batches/{bid}/report")).await;
    assert_eq!(report["failed_jobs"], json!([jid]), "{report}");
    let batch = rig.server.get(&format!("/batches/{bid}")).await;
    assert_eq!(batch["jobs"][0]["failure"], "digest_mismatch", "{batch}");
    let listed = rig.server.get(&format!("/jobs?batch={bid}")).await;
    assert_eq!(listed["jobs"][0]["failure"], "digest_mismatch", "{listed}");
    assert!(
        batch
            .to_string()
            .contains("cannot be requeued: a new submission is required"),
        "{batch}"
    );
    let callback = eventually("the batch's callback", 30, async || {
        let depot = rig.depot.lock().expect("depot");
        depot.callbacks.iter().find(|c| c["bid"] == bid).cloned()
    })
    .await;
    assert_eq!(callback["failed"], 1, "{callback}");
    assert_eq!(
        callback["jobs"][0]["failure"], "digest_mismatch",
        "{callback}"
    );
    let outbox = rig._dir.path().join("outbox");
    let mail = eventually("the report e-mail", 30, async || {
        std::fs::read_dir(&outbox)
            .ok()?
            .filter_map(|e| std::fs::read_to_string(e.ok()?.path()).ok())
            .find(|m| m.contains(&format!("ingest batch {bid}: 0 completed, 1 failed")))
    })
    .await;
    assert!(
        mail.contains("failure: digest_mismatch") && mail.contains("a new submission is required"),
        "{mail}"
    );

    // An object manifest is the payload too: its digest is first known in
    // Estimating, which reads it, and the job fails there for good.
    add(
        &rig.depot,
        "object.checkm",
        &manifest(
            "mrt-ingest-manifest",
            OBJECT_FIELDS,
            &[format!("{b}/files/payload.txt | | | | | payload.txt |")],
        ),
    );
    let (_, object_jid, object_job) = submit("object-manifest", "object.checkm").await;
    assert_eq!(
        object_job["last_successful_status"], "Pending",
        "{object_job}"
    );
    let moves = rig.moves(&object_jid).await;
    assert!(
        moves
            .last()
            .is_some_and(|m| m.starts_with("Estimating -> Failed")),
        "{moves:?}"
    );
    assert_eq!(
        rig.depot.lock().expect("depot").hits.get("payload.txt"),
        Some(&1),
        "the object manifest's job downloaded its file"
    );

    // Every requeue is refused and appends nothing.
    let head = || async {
        rig.server.get("/status").await["head_position"]
            .as_u64()
            .expect("head_position")
    };
    let before = head().await;
    for jid in [&jid, &object_jid] {
        let (status, body) = rig
            .admin(Method::POST, &format!("/jobs/{jid}/requeue"), "try again")
            .await;
        assert_eq!(status, 409, "{body}");
        assert_eq!(body["error"]["code"], "unrecoverable_failure", "{body}");
        assert_eq!(body["error"]["failure"], "digest_mismatch", "{body}");
        assert_eq!(body["error"]["new_submission_required"], true, "{body}");
        assert!(
            body["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("a new submission is required")),
            "{body}"
        );
    }
    let cli = tokio::task::block_in_place(|| {
        std::process::Command::new(crate::util::ingest_bin())
            .args(["job", &jid, "requeue", "--reason", "try again"])
            .env("INGEST_ENGINE", &rig.server.base)
            .env("INGEST_ADMIN_TOKEN", ADMIN)
            .env_remove("INGEST_ADMIN_TOKEN_FILE")
            .env_remove("INGEST_DATA_DIR")
            .output()
            .expect("run ingest")
    });
    let stderr = String::from_utf8_lossy(&cli.stderr);
    assert_eq!(cli.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("a new submission is required"), "{stderr}");
    // The admin UI shows the kind and offers no requeue; a requeue posted
    // anyway is refused by the API's own handler.
    let session = crate::ui::login(&rig.server, ADMIN).await;
    let cookie = crate::ui::cookie_of(&session).expect("a session cookie");
    let job_page = format!("/ui/jobs/{jid}");
    let (status, html) = crate::ui::page(&rig.server, &cookie, &job_page).await;
    assert_eq!(status, 200, "{html}");
    assert!(
        html.contains("digest_mismatch") && html.contains("a new submission is required"),
        "{html}"
    );
    let requeue_form = format!("{job_page}/requeue");
    assert!(!html.contains(&requeue_form), "a Requeue button: {html}");
    assert!(html.contains(&format!("{job_page}/delete")), "{html}");
    let csrf = crate::ui::csrf_in(&html);
    let posted = crate::ui::post(
        &rig.server,
        &cookie,
        Some(&rig.server.base),
        &requeue_form,
        &[("csrf", &csrf), ("reason", "try again")],
    )
    .await;
    assert_eq!(posted.status(), 303);
    let (_, html) = crate::ui::page(&rig.server, &cookie, &job_page).await;
    assert!(
        html.contains("Refused: ") && html.contains("cannot be requeued"),
        "{html}"
    );
    assert_eq!(head().await, before, "a refused requeue appended");
    assert_eq!(rig.job(&jid).await["status"], "Failed");
    // What remains to do with it: delete it.
    rig.delete_job(&jid, "resubmitted with the right file")
        .await;
}

/// Issue 25, finding 3: a manifest with one 20 MB line logged a WARN line
/// of 20 MB at every attempt, and the batch never failed: its failure
/// report quoted the line, exceeded the server's `--max-body-bytes` (413)
/// and was retried every 10 s, downloading the manifest again each time.
/// The batch now fails once with a cut message and the log stays small.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manifest_with_a_huge_line_fails_its_batch_once_with_a_cut_message() {
    let rig = rig("huge-line", &[]).await;
    let b = rig.base.clone();
    const HEAD: &[u8] = b"#%checkm_0.7\n#%profile | http://uc3.cdlib.org/registry/ingest/manifest/mrt-single-file-batch-manifest\n#%fields | nfo:fileUrl | nfo:fileName\n";
    // Serves `lines` as a single-file batch manifest and submits it; the
    // batch, once it failed, and its message.
    let failed = async |name: &str, lines: Vec<u8>| {
        let mut body = HEAD.to_vec();
        body.extend(lines);
        body.extend_from_slice(b"#%eof\n");
        add(&rig.depot, name, &body);
        let bid = rig
            .submit(json!({"profile": "demo", "submitter": "alice", "type": "single-file-batch-manifest", "payload_url": format!("{b}/files/{name}")}))
            .await;
        let batch = rig.finished(&bid).await;
        assert_eq!(batch["status"], "Failed", "{batch}");
        let message = batch["message"].as_str().unwrap_or_default().to_string();
        assert!(
            message.len() <= ingest_protocol::MAX_MESSAGE_BYTES,
            "{} bytes",
            message.len()
        );
        // Failed once: one acquisition and one failure in its history.
        let history = rig.server.get(&format!("/batches/{bid}/history")).await;
        let count = |kind: &str| {
            history["events"]
                .as_array()
                .map_or(0, |e| e.iter().filter(|e| e["event"] == kind).count())
        };
        assert_eq!(count("BatchFailed"), 1, "{history}");
        assert_eq!(count("BatchAcquired"), 1, "{history}");
        message
    };
    let mut huge = vec![b'x'; 20 * 1024 * 1024];
    huge.extend_from_slice(b" | a\n");
    let message = failed("huge.checkm", huge).await;
    assert!(message.contains("does not expand"), "{message}");
    // Lines under the line limit whose jobs together are more than the
    // server's body limit (1 MiB): the acquire is refused 413, and the batch
    // fails once with a report that fits.
    let mut many = Vec::new();
    for i in 0..40 {
        let path = "y".repeat(40 * 1024);
        many.extend_from_slice(format!("{b}/files/{path}{i} | f{i}\n").as_bytes());
    }
    let message = failed("many.checkm", many).await;
    assert!(message.contains("413"), "{message}");
    let size = std::fs::metadata(&rig.server.log).expect("log").len();
    assert!(size < 1024 * 1024, "the log is {size} bytes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_manifest_fails_the_batch_naming_the_line() {
    let rig = rig("corrupt", &[]).await;
    let b = rig.base.clone();
    add(
        &rig.depot,
        "noeof.checkm",
        b"#%checkm_0.7\n#%profile | http://uc3.cdlib.org/registry/ingest/manifest/mrt-single-file-batch-manifest\n#%fields | nfo:fileUrl | nfo:fileName\nhttp://x/a | a | extra | more\n",
    );
    let bid = rig
        .submit(json!({"profile": "demo", "submitter": "alice", "type": "single-file-batch-manifest", "payload_url": format!("{b}/files/noeof.checkm")}))
        .await;
    let batch = rig.finished(&bid).await;
    assert_eq!(batch["status"], "Failed", "{batch}");
    let text = batch.to_string();
    assert!(text.contains("line 4"), "{text}");
    assert!(Rig::jobs(&batch).is_empty());
    // B5: the depositor hears of it, by callback and e-mail, as of every
    // batch failure (it never enters Reporting).
    let callback = eventually("the failed batch's callback", 30, async || {
        let depot = rig.depot.lock().expect("depot");
        depot.callbacks.iter().find(|c| c["bid"] == bid).cloned()
    })
    .await;
    assert_eq!(callback["status"], "Failed", "{callback}");
    assert_eq!(callback["jobs"], json!([]), "{callback}");
    let message = callback["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("does not expand") && message.contains("line 4"),
        "{callback}"
    );
    let outbox = rig._dir.path().join("outbox");
    let mail = eventually("the failed batch's e-mail", 30, async || {
        std::fs::read_dir(&outbox)
            .ok()?
            .filter_map(|e| std::fs::read_to_string(e.ok()?.path()).ok())
            .find(|m| m.contains(&format!("Subject: ingest batch {bid} failed: ")))
    })
    .await;
    assert!(mail.contains("line 4"), "{mail}");
    // D2: the batch's `states` node, which the engine projects empty for a
    // batch without jobs, is no finding of `GET /consistency`.
    let zk = zookeeper_client::Client::connect(&rig.zk_at)
        .await
        .expect("zk");
    let states = format!("/batches/{bid}/states");
    eventually("the projected states node", 30, async || {
        zk.check_stat(&states).await.expect("stat")
    })
    .await;
    let report = rig.server.get("/consistency").await;
    assert_eq!(report["findings"], json!([]), "{report:#}");

    // A file name that escapes the object fails the batch at once, naming it.
    add(
        &rig.depot,
        "escape.checkm",
        &manifest(
            "mrt-ingest-manifest",
            OBJECT_FIELDS,
            &[format!("{b}/files/a.txt | | | | | ../../outside.txt |")],
        ),
    );
    let bid = rig
        .submit(json!({"profile": "demo", "submitter": "alice", "type": "object-manifest", "payload_url": format!("{b}/files/escape.checkm")}))
        .await;
    let batch = rig.finished(&bid).await;
    assert_eq!(batch["status"], "Failed", "{batch}");
    let text = batch.to_string();
    assert!(text.contains("../../outside.txt"), "{text}");
}

/// A rig whose one job (file `file` with `body`, local id `local_id`) was
/// stored and then failed in Storing, by a fault armed with `reason`: the
/// rig, the job and the job's view.
async fn failed_in_storing(
    name: &str,
    file: &str,
    body: &[u8],
    reason: &str,
    local_id: &str,
) -> (Rig, String, Value) {
    let rig = rig(name, &[]).await;
    add(&rig.depot, file, body);
    let (status, answer) = rig
        .server
        .call(
            Method::POST,
            "/faults",
            ADMIN,
            Some(json!({"state": "Storing", "reason": reason})),
        )
        .await;
    assert_eq!(status, 201, "{answer}");
    let bid = rig
        .submit(json!({"profile": "demo", "submitter": "alice", "type": "file", "payload_url": format!("{}/files/{file}", rig.base), "erc_where": local_id}))
        .await;
    let batch = rig.finished(&bid).await;
    let jid = Rig::jobs(&batch)[0].clone();
    let job = rig.job(&jid).await;
    assert_eq!(job["status"], "Failed", "{job}");
    (rig, jid, job)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_failed_in_storing_resumes_there_without_a_second_ark() {
    let (rig, jid, job) =
        failed_in_storing("requeue", "r.txt", b"requeue me", "storage drill", "loc-r").await;
    assert_eq!(job["last_successful_status"], "Processing", "{job}");
    let ark = job["primary_id"]
        .as_str()
        .expect("ark minted in Processing")
        .to_string();

    rig.requeue_until_completed(&jid).await;
    let job = rig.job(&jid).await;
    assert_eq!(job["primary_id"], ark.as_str(), "a second ark was minted");
    assert_eq!(job["retry_count"], 1);
    let moves = rig.moves(&jid).await;
    assert!(
        moves.iter().any(|m| m.starts_with("Failed -> Storing")),
        "{moves:?}"
    );
    assert_eq!(
        moves
            .iter()
            .filter(|m| m.starts_with("Processing -> "))
            .count(),
        1,
        "{moves:?}"
    );
    rig.assert_stored(&jid, Some("loc-r"), &["r.txt"]).await;
}

/// Issue 15 item 9: the stored manifest names the version it is stored
/// as, so a second run of Storing writes other bytes (the next version's
/// URLs) than the run that committed. A run that committed its version but
/// ended before writing its marker is still recognised, by the manifest's
/// comment naming the job, and its version adopted rather than stored
/// again as v2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_committed_without_its_marker_is_adopted_by_the_requeued_job() {
    let (rig, jid, job) =
        failed_in_storing("adopt", "m.txt", b"marker lost", "storage drill", "loc-m").await;
    let bid = job["bid"].as_str().expect("bid").to_string();
    let marker = rig
        ._dir
        .path()
        .join("work")
        .join(&bid)
        .join(&jid)
        .join("stored-primary.json");
    std::fs::remove_file(&marker).expect("the version was stored: its marker exists");
    rig.requeue_until_completed(&jid).await;
    let ark = rig.assert_stored(&jid, Some("loc-m"), &["m.txt"]).await;
    let target =
        ingest_steps::ocfl::OcflTarget::open_existing("check", &rig.storage).expect("storage");
    assert_eq!(
        target.versions(&ark).expect("versions"),
        [1],
        "the committed version was stored again"
    );
    assert_eq!(rig.versions(&ark).await.0, [1]);
    let text = follow_stored_manifest_unsigned(&rig, &ark, 1).await;
    assert!(
        text.contains(&format!("# ingest job {jid} of batch {bid}\n")),
        "{text}"
    );
}

/// A storage probe the test turns, counting how often it is read.
struct Dial {
    percent: Mutex<f64>,
    reads: std::sync::atomic::AtomicU32,
    /// The whole working storage, in bytes.
    capacity: std::sync::atomic::AtomicU64,
}

impl ingest_worker::step::StorageProbe for Dial {
    fn used_percent(&self, _: &std::path::Path) -> std::io::Result<f64> {
        self.reads.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(*self.percent.lock().expect("dial"))
    }

    fn capacity_bytes(&self, _: &std::path::Path) -> std::io::Result<u64> {
        Ok(self.capacity.load(std::sync::atomic::Ordering::SeqCst))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_job_waits_in_provisioning_while_working_storage_is_over_the_threshold() {
    use ingest_config::{DaemonKind, Profiles};
    use ingest_worker::real::{self, RealArgs, RealConfig};
    use ingest_worker::{WorkerOptions, Workers};
    let zk_server = shared();
    let hosts = zk_server.hosts();
    let root = unique_root("provision");
    let dir = tempfile::tempdir().expect("tempdir");
    let (depot, base) = depot().await;
    add(&depot, "p.txt", b"provision me");
    // The server runs no daemons; this test's worker runs the real steps
    // with a probe it controls.
    let server = crate::server::start(dir.path(), &hosts, &root, None);
    let dial = Arc::new(Dial {
        percent: Mutex::new(95.0),
        reads: std::sync::atomic::AtomicU32::new(0),
        capacity: std::sync::atomic::AtomicU64::new(u64::MAX),
    });
    let storage = dir.path().join("ocfl");
    let args = RealArgs {
        storage_targets: vec![format!("primary={}", storage.display())],
        outbox: Some(dir.path().join("outbox")),
        step_retries: 1,
        retry_backoff_ms: 20,
        max_object_bytes: 1 << 30,
        max_object_files: 1000,
        transfers_per_job: 2,
        transfers: 4,
        mail_from: "ingest@localhost".into(),
        // The depot listens on 127.0.0.1.
        allow_networks: vec!["127.0.0.1/32".into()],
        content_url: Some(server.base.clone()),
        ..RealArgs::default()
    };
    let steps = real::steps(
        RealConfig {
            work_dir: dir.path().join("real-work"),
            args,
            profiles: Profiles::unrestricted(),
        },
        Arc::clone(&dial) as Arc<dyn ingest_worker::step::StorageProbe>,
        70.0,
    )
    .expect("real steps");
    let daemons = DaemonKind::ALL.iter().map(|k| (*k, 1)).collect();
    let workers = Workers::start(WorkerOptions {
        engine: server.base.clone(),
        token: crate::server::WORKER.into(),
        zk: ingest_projections::ZkConfig::new(hosts.clone()).with_root(root.clone()),
        name: "provisioner".into(),
        daemons,
        steps,
    })
    .expect("workers");
    let (status, reply) = server
        .call(
            Method::POST,
            "/batches",
            DEPOSITOR,
            Some(json!({"profile": "demo", "submitter": "alice", "type": "file", "payload_url": format!("{base}/files/p.txt")})),
        )
        .await;
    assert_eq!(status, 201, "{reply}");
    let bid = reply["bid"].as_str().expect("bid").to_string();
    let jid = eventually("the job in Provisioning", 30, async || {
        let b = server.get(&format!("/batches/{bid}")).await;
        let jid = b["jobs"][0]["jid"].as_str()?.to_string();
        (server.get(&format!("/jobs/{jid}")).await["status"] == "Provisioning").then_some(jid)
    })
    .await;
    // Several provisioning cycles look at the full disk; the job stays.
    let seen = dial.reads.load(std::sync::atomic::Ordering::SeqCst);
    eventually("three more provisioning cycles", 30, async || {
        (dial.reads.load(std::sync::atomic::Ordering::SeqCst) >= seen + 3).then_some(())
    })
    .await;
    assert_eq!(
        server.get(&format!("/jobs/{jid}")).await["status"],
        "Provisioning"
    );
    // D8: why it waits is shown with the job, in the listing and by the CLI.
    let job = server.get(&format!("/jobs/{jid}")).await;
    assert!(
        job["waiting"]
            .as_str()
            .is_some_and(|w| w.contains("95.0% full (threshold 70%)")),
        "{job}"
    );
    let listed = server.get(&format!("/jobs?batch={bid}")).await;
    assert_eq!(listed["jobs"][0]["waiting"], job["waiting"], "{listed}");
    let engine = server.base.clone();
    let table = tokio::task::block_in_place(|| {
        crate::util::ingest_remote(
            &engine,
            &[("INGEST_ADMIN_TOKEN", ADMIN)],
            &["jobs", "--batch", &bid],
        )
    })
    .ok();
    assert!(
        table.stdout.contains("waiting: working storage"),
        "{}",
        table.stdout
    );
    // Space frees up: the job goes on to Completed.
    *dial.percent.lock().expect("dial") = 40.0;
    eventually("the job completed", 60, async || {
        (server.get(&format!("/jobs/{jid}")).await["status"] == "Completed").then_some(())
    })
    .await;
    // D8: a job larger than the whole working storage fails at once, saying
    // so (it waited for ever).
    dial.capacity.store(4, std::sync::atomic::Ordering::SeqCst);
    let (status, reply) = server
        .call(
            Method::POST,
            "/batches",
            DEPOSITOR,
            Some(json!({"profile": "demo", "submitter": "alice", "type": "file", "payload_url": format!("{base}/files/p.txt")})),
        )
        .await;
    assert_eq!(status, 201, "{reply}");
    let big = reply["bid"].as_str().expect("bid").to_string();
    let failed = eventually("the oversized job failed", 60, async || {
        let b = server.get(&format!("/batches/{big}")).await;
        let jid = b["jobs"].get(0)?["jid"].as_str()?.to_string();
        let job = server.get(&format!("/jobs/{jid}")).await;
        (job["status"] == "Failed").then_some(job)
    })
    .await;
    assert_eq!(failed["last_successful_status"], "Estimating", "{failed}");
    let message = failed["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("can ever hold") && message.contains("--working-storage"),
        "{failed}"
    );
    workers.shutdown().await;
    let history = server.get(&format!("/jobs/{jid}/history")).await;
    let left: Vec<&Value> = history["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter(|r| {
            r["detail"]
                .as_str()
                .is_some_and(|d| d.starts_with("Provisioning -> "))
        })
        .collect();
    assert_eq!(left.len(), 1, "{history}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn arks_come_from_ezid_when_it_is_configured() {
    let secret = tempfile::NamedTempFile::new().expect("password file");
    std::fs::write(secret.path(), "ezid-secret\n").expect("write password");
    let (fake, fake_base) = depot().await;
    let rig = rig(
        "ezid",
        &[
            "--ezid-url".into(),
            format!("{fake_base}/ezid"),
            "--ezid-user".into(),
            "ezid-user".into(),
            "--ezid-password-file".into(),
            secret.path().display().to_string(),
        ],
    )
    .await;
    add(&rig.depot, "e.txt", b"an object with an EZID ark");
    let bid = rig
        .submit(json!({"profile": "demo", "submitter": "alice", "type": "file", "payload_url": format!("{}/files/e.txt", rig.base),
                       "erc_who": "Doe, Jane: editor", "erc_what": "100% cotton", "erc_when": "2024-05", "erc_where": "loc-ezid"}))
        .await;
    let batch = rig.finished(&bid).await;
    assert_eq!(batch["status"], "Completed", "{batch}");
    let jid = &Rig::jobs(&batch)[0];
    let job = rig.job(jid).await;
    assert_eq!(job["primary_id"], "ark:/99999/fk4ezid1", "{job}");
    assert_eq!(fake.lock().expect("fake").ezid_mints, 1);
    // The mint request carried the ERC metadata in EZID's escaped ANVL.
    assert_eq!(
        fake.lock().expect("fake").ezid_bodies,
        vec![
            "_profile: erc\nerc.who: Doe, Jane%3A editor\nerc.what: 100%25 cotton\n\
              erc.when: 2024-05\nerc.where: loc-ezid\n"
                .to_string()
        ]
    );
    let found = rig
        .server
        .get("/objects?collection=demo&local_id=loc-ezid")
        .await;
    assert_eq!(found["ark"], "ark:/99999/fk4ezid1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_local_id_again_adds_a_version_to_the_same_ark() {
    let rig = rig("versions", &[]).await;
    add(&rig.depot, "v1.txt", b"first version");
    add(&rig.depot, "v2.txt", b"second version");
    let submit = |file: &str, mode: &str| {
        json!({"profile": "demo", "submitter": "alice", "type": "file",
               "payload_url": format!("{}/files/{file}", rig.base),
               "submission_mode": mode, "erc_where": "loc-versioned"})
    };
    let first = rig.submit(submit("v1.txt", "add")).await;
    let batch = rig.finished(&first).await;
    let jid1 = Rig::jobs(&batch)[0].clone();
    let ark = rig
        .assert_stored(&jid1, Some("loc-versioned"), &["v1.txt"])
        .await;
    // Completed jobs leave no working files behind.
    let work = rig._dir.path().join("work");
    let leftovers: Vec<_> = walk(&work)
        .into_iter()
        .filter(|p| p.to_string_lossy().contains(&jid1))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");

    let second = rig.submit(submit("v2.txt", "update")).await;
    let batch = rig.finished(&second).await;
    assert_eq!(batch["status"], "Completed", "{batch}");
    let jid2 = Rig::jobs(&batch)[0].clone();
    let job2 = rig.job(&jid2).await;
    assert_eq!(
        job2["primary_id"],
        ark.as_str(),
        "a second ark for the same local id"
    );
    let (versions, object) = rig.versions(&ark).await;
    assert_eq!(versions, [1, 2], "{object}");
    let target =
        ingest_steps::ocfl::OcflTarget::open_existing("check", &rig.storage).expect("storage");
    assert_eq!(target.versions(&ark).expect("versions"), [1, 2]);
    assert_eq!(
        target
            .read_file(&ark, Some(2), "producer/v2.txt")
            .expect("v2 file"),
        b"second version"
    );
    assert_eq!(
        target
            .read_file(&ark, Some(1), "producer/v1.txt")
            .expect("v1 file"),
        b"first version"
    );
    assert!(target.verify(&ark).expect("verify").ok);
}

/// Every path under `dir` (files and directories).
fn walk(dir: &std::path::Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        }
        out.push(p);
    }
    out
}

/// Issue 15 item 2 / issue 12: three submissions of one new local id at
/// once, with different files, each step run by three tasks: the local-id
/// lock (`/locks/localid/<lid>_<collection>`, Merritt's form) serialises
/// them from Processing to Recording, so they give ONE ark with three
/// successive versions, no orphan OCFL object and no inventory conflict.
/// Before the lock, each minted its own ark and two failed at Recording.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_submissions_of_one_new_local_id_give_one_ark_and_successive_versions() {
    let rig = rig(
        "lid-lock",
        &[
            "--daemons".to_string(),
            "downloading=3,processing=3,storing=3,recording=3,notify=3,batch_pending=3".to_string(),
        ],
    )
    .await;
    for n in 1..=3 {
        add(
            &rig.depot,
            &format!("same-{n}.txt"),
            format!("file {n}").as_bytes(),
        );
    }
    let submit = |n: u32| {
        json!({"profile": "demo", "submitter": "alice", "type": "file",
               "payload_url": format!("{}/files/same-{n}.txt", rig.base),
               "submission_mode": "update", "erc_where": "loc-raced"})
    };
    let (a, b, c) = tokio::join!(
        rig.submit(submit(1)),
        rig.submit(submit(2)),
        rig.submit(submit(3))
    );
    let mut arks = std::collections::BTreeSet::new();
    let mut jids = Vec::new();
    for bid in [a, b, c] {
        let batch = rig.finished(&bid).await;
        assert_eq!(batch["status"], "Completed", "{batch}");
        let jid = Rig::jobs(&batch)[0].clone();
        let job = rig.job(&jid).await;
        arks.insert(job["primary_id"].as_str().expect("ark").to_string());
        let history = rig.history(&jid).await;
        assert!(
            !history
                .iter()
                .any(|r| r.to_string().contains("inventory_conflict")),
            "{history:?}"
        );
        jids.push(jid);
    }
    assert_eq!(arks.len(), 1, "one local id, one object: {arks:?}");
    let ark = arks.into_iter().next().expect("ark");
    let (versions, object) = rig.versions(&ark).await;
    assert_eq!(versions, [1, 2, 3], "{object}");
    let target =
        ingest_steps::ocfl::OcflTarget::open_existing("check", &rig.storage).expect("storage");
    assert_eq!(target.versions(&ark).expect("versions"), [1, 2, 3]);
    assert!(target.verify(&ark).expect("verify").ok);
    // No other object in storage: nothing orphaned.
    let inventories: Vec<_> = walk(&rig.storage)
        .into_iter()
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n == "0=ocfl_object_1.1" || n == "0=ocfl_object_1.0")
        })
        .collect();
    assert_eq!(inventories.len(), 1, "{inventories:?}");
    // The lock is released once every job recorded.
    let lock = format!(
        "/locks/localid/{}",
        ingest_projections::layout::lock_name("loc-raced_demo")
    );
    let zk = zookeeper_client::Client::connect(&rig.zk_at)
        .await
        .expect("zk");
    assert!(
        zk.check_stat(&lock).await.expect("stat").is_none(),
        "{lock} left behind"
    );
    assert!(
        zk.check_stat("/locks/localid")
            .await
            .expect("stat")
            .is_some(),
        "the projection creates Merritt's lock parents"
    );
    // The store hand-off in mrt-store's form: action/nodeID/urlencoded-ark
    // (node 1: the first target's default), an empty delete list.
    let encoded = ark.replace(':', "%3A").replace('/', "%2F");
    for jid in &jids {
        let (data, _) = zk
            .get_data(&format!("/jobs/{jid}/store"))
            .await
            .expect("the store node");
        let store: Value = serde_json::from_slice(&data).expect("JSON");
        assert_eq!(store["mode"], format!("update/1/{encoded}"), "{store}");
        assert_eq!(store["delete"], "", "{store}");
    }
}
/// What a raw payload server answers to one request: the status line and
/// headers (without the blank line), the body, and the pause before each
/// byte of the body (none: all at once).
type RawAnswer = (String, Vec<u8>, Option<std::time::Duration>);

/// A payload server that speaks HTTP/1.1 by hand on `ip`, so that it can
/// lie (a Content-Length that is not the body's) and trickle; it counts
/// the connections it accepts. HEAD gets the headers only.
async fn raw_server(
    ip: &str,
    answer: fn(&str) -> RawAnswer,
) -> (String, Arc<std::sync::atomic::AtomicUsize>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind((ip, 0)).await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let seen = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = Arc::clone(&seen);
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            tokio::spawn(async move {
                let mut request = vec![0u8; 8192];
                let n = conn.read(&mut request).await.unwrap_or(0);
                let text = String::from_utf8_lossy(&request[..n]).to_string();
                let path = text.split_whitespace().nth(1).unwrap_or("/").to_string();
                let (head, body, pause) = answer(&path);
                let head = format!("{head}\r\nConnection: close\r\n\r\n");
                if conn.write_all(head.as_bytes()).await.is_err() || text.starts_with("HEAD") {
                    return;
                }
                match pause {
                    None => {
                        let _ = conn.write_all(&body).await;
                    }
                    Some(pause) => {
                        for byte in body {
                            tokio::time::sleep(pause).await;
                            if conn.write_all(&[byte]).await.is_err() {
                                return;
                            }
                        }
                    }
                }
            });
        }
    });
    (format!("http://{addr}"), seen)
}

/// The job of a finished one-job batch.
async fn failed_job(rig: &Rig, bid: &str) -> (String, Value) {
    let batch = rig.finished(bid).await;
    assert_eq!(batch["status"], "Failed", "{batch}");
    let jid = Rig::jobs(&batch)[0].clone();
    let job = rig.job(&jid).await;
    assert_eq!(job["status"], "Failed", "{job}");
    (jid, job)
}

fn trickle(_: &str) -> RawAnswer {
    (
        "HTTP/1.1 200 OK\r\nContent-Length: 100000".into(),
        vec![b'x'; 100_000],
        Some(std::time::Duration::from_millis(200)),
    )
}

/// A rig with `options` and one single-file batch from a server that
/// trickles, run until it failed: the rig, the URL, the job id, the job.
async fn slow_job(name: &str, options: &[&str]) -> (Rig, String, String, Value) {
    let options: Vec<String> = options.iter().map(|o| o.to_string()).collect();
    let rig = rig(name, &options).await;
    let (slow, _) = raw_server("127.0.0.1", trickle).await;
    let url = format!("{slow}/slow.bin");
    let bid = rig
        .submit(
            json!({"profile": "demo", "submitter": "alice", "type": "file", "payload_url": url}),
        )
        .await;
    let (jid, job) = failed_job(&rig, &bid).await;
    (rig, url, jid, job)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_payload_server_is_cut_below_the_minimum_rate_and_retried() {
    let options = [
        "--min-transfer-rate",
        "1000",
        "--transfer-rate-window-secs",
        "1",
        "--step-retries",
        "1",
    ];
    let (rig, url, jid, job) = slow_job("slow", &options).await;
    assert_eq!(job["last_successful_status"], "Provisioning", "{job}");
    let message = job["message"].as_str().unwrap_or_default();
    assert!(message.contains(&url), "{message}");
    assert!(
        message.contains("slower than the minimum transfer rate of 1000 bytes/s"),
        "{message}"
    );
    // The first cut was recorded as a retry.
    assert_eq!(retries(&rig.history(&jid).await), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_download_past_its_deadline_fails_naming_the_url() {
    let options = ["--min-transfer-rate", "0", "--download-deadline-secs", "2"];
    let (_rig, url, _, job) = slow_job("deadline", &options).await;
    let message = job["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("did not finish within its deadline of 2 s"),
        "{message}"
    );
    assert!(message.contains(&url), "{message}");
}

fn secret(_: &str) -> RawAnswer {
    (
        "HTTP/1.1 200 OK\r\nContent-Length: 6".into(),
        b"secret".to_vec(),
        None,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payloads_to_refused_addresses_fail_without_reaching_them() {
    // The servers of the rigs allow 127.0.0.1 (the depot) only; the
    // internal service listens on 127.0.0.2.
    let (internal, seen) = raw_server("127.0.0.2", secret).await;
    let port = internal.rsplit(':').next().expect("port").to_string();
    let strict = rig("outbound", &[]).await;
    let b = strict.base.clone();
    let refused_urls = [
        format!("{internal}/secret"),
        format!("http://2130706434:{port}/secret"),
        format!("http://127.2:{port}/secret"),
        format!("http://[::ffff:127.0.0.2]:{port}/secret"),
    ];
    // At submission: a literal address in any form is refused, naming the
    // field; nothing is appended (no batch is created).
    for url in &refused_urls {
        let (status, reply) = strict
            .server
            .call(
                Method::POST,
                "/batches",
                DEPOSITOR,
                Some(json!({"profile": "demo", "submitter": "alice", "type": "file", "payload_url": url})),
            )
            .await;
        assert_eq!(status, 422, "{url}: {reply}");
        assert_eq!(reply["error"]["field"], "payload_url", "{reply}");
        assert!(
            reply["error"]["message"]
                .as_str()
                .unwrap_or_default()
                .contains("refused by outbound policy"),
            "{reply}"
        );
    }
    // In a manifest (not resolved at submission) and behind a redirect
    // from an allowed host: refused by the worker.
    add(
        &strict.depot,
        "inside.checkm",
        &manifest(
            "mrt-ingest-manifest",
            OBJECT_FIELDS,
            &refused_urls
                .iter()
                .take(1)
                .map(|u| format!("{u} | | | | | secret.txt |"))
                .collect::<Vec<_>>(),
        ),
    );
    let mut bids = vec![
        strict.submit(json!({"profile": "demo", "submitter": "alice", "type": "object-manifest", "payload_url": format!("{b}/files/inside.checkm")}))
            .await,
    ];
    for (n, url) in refused_urls.iter().enumerate() {
        let name = format!("redirect-{n}");
        strict
            .depot
            .lock()
            .expect("depot")
            .redirects
            .insert(name.clone(), url.clone());
        bids.push(
            strict.submit(json!({"profile": "demo", "submitter": "alice", "type": "file", "payload_url": format!("{b}/files/{name}")}))
                .await,
        );
    }
    for bid in &bids {
        let (_, job) = failed_job(&strict, bid).await;
        let message = job["message"].as_str().unwrap_or_default();
        assert!(message.contains("refused by outbound policy"), "{message}");
        assert!(!message.contains("secret.txt returned"), "{message}");
    }
    assert_eq!(
        seen.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "the internal service was reached"
    );

    // With an allow rule, the same redirect is followed and stored.
    let open = rig(
        "outbound-allowed",
        &["--allow-network".into(), "127.0.0.2/32".into()],
    )
    .await;
    open.depot.lock().expect("depot").redirects.insert(
        "redirect".into(),
        format!("http://2130706434:{port}/secret"),
    );
    let bid = open
        .submit(json!({"profile": "demo", "submitter": "alice", "type": "file", "payload_url": format!("{}/files/redirect", open.base)}))
        .await;
    let batch = open.finished(&bid).await;
    assert_eq!(batch["status"], "Completed", "{batch}");
    assert!(seen.load(std::sync::atomic::Ordering::SeqCst) > 0);
}

fn liar(path: &str) -> RawAnswer {
    match path {
        // Announces 5 bytes and sends 10 MiB.
        "/long.bin" => (
            "HTTP/1.1 200 OK\r\nContent-Length: 5".into(),
            vec![b'L'; 10 << 20],
            None,
        ),
        // Announces 100 bytes and sends 10.
        _ => (
            "HTTP/1.1 200 OK\r\nContent-Length: 100".into(),
            b"only these".to_vec(),
            None,
        ),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sizes_that_differ_from_the_manifest_or_content_length_fail_the_file() {
    let rig = rig("sizes", &["--step-retries".into(), "1".into()]).await;
    let (lying, _) = raw_server("127.0.0.1", liar).await;
    add(&rig.depot, "a.txt", b"file a");
    let b = rig.base.clone();
    let object = |name: &str, line: String| {
        add(
            &rig.depot,
            name,
            &manifest("mrt-ingest-manifest", OBJECT_FIELDS, &[line]),
        );
        json!({"profile": "demo", "submitter": "alice", "type": "object-manifest", "payload_url": format!("{b}/files/{name}")})
    };
    // The depot's a.txt is 6 bytes; the manifest says 7.
    let declared = rig
        .submit(object(
            "declared.checkm",
            format!("{b}/files/a.txt | | | 7 | | a.txt |"),
        ))
        .await;
    // 5 bytes announced, 10 MiB sent, 10 MiB declared.
    let long = rig
        .submit(object(
            "long.checkm",
            format!("{lying}/long.bin | | | {} | | long.bin |", 10 << 20),
        ))
        .await;
    // 100 bytes announced, 10 sent.
    let short = rig
        .submit(json!({"profile": "demo", "submitter": "alice", "type": "file", "payload_url": format!("{lying}/short.bin")}))
        .await;
    for (bid, needles) in [
        (
            &declared,
            vec!["a.txt", "6 bytes downloaded", "declares 7 bytes"],
        ),
        (
            &long,
            vec!["long.bin", "5 bytes downloaded", "declares 10485760 bytes"],
        ),
        (&short, vec!["short.bin"]),
    ] {
        let (_, job) = failed_job(&rig, bid).await;
        let message = job["message"].as_str().unwrap_or_default();
        for needle in needles {
            assert!(message.contains(needle), "{needle:?} not in {message:?}");
        }
    }
    // Nothing of the lies was stored.
    assert!(
        !walk(&rig.storage)
            .iter()
            .any(|p| p.ends_with("long.bin") || p.ends_with("short.bin")),
        "a lying payload was stored"
    );
}

/// Issue 15 item 2 / issue 13: a version stored in OCFL whose job failed
/// before Recording (a fault armed on Storing: the store happens, then the
/// outcome is recorded as a failure) is found by the consistency report,
/// through `ingest --engine URL check` and `GET /consistency`, as an
/// `unrecorded-version` FAIL with a `record-version` repair; the repair
/// records it in the inventory through its normal path and appends a
/// `ConsistencyRepaired` event; the report is then clean, and the same
/// repair again is refused (404 `no_such_finding`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_stored_but_never_recorded_is_found_and_recorded_by_repair() {
    let (rig, jid, job) = failed_in_storing(
        "unrecorded",
        "u.txt",
        b"stored, never recorded",
        "fail after the store",
        "loc-u",
    )
    .await;
    let ark = job["primary_id"].as_str().expect("ark").to_string();
    let (status, _) = rig
        .server
        .call(Method::GET, &format!("/objects/{ark}"), ADMIN, None)
        .await;
    assert_eq!(status, 404, "the inventory does not have it yet");

    let cli = |args: &[&str]| {
        let mut all = vec!["--engine", rig.server.base.as_str(), "check"];
        all.extend(args);
        tokio::task::block_in_place(|| {
            std::process::Command::new(crate::util::ingest_bin())
                .args(&all)
                .env("INGEST_ADMIN_TOKEN", ADMIN)
                .output()
                .expect("ingest check")
        })
    };
    let out = cli(&["--format", "json"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let report: Value = serde_json::from_slice(&out.stdout).expect("report json");
    let findings = report["findings"].as_array().expect("findings");
    assert_eq!(findings.len(), 1, "{report:#}");
    let f = &findings[0];
    assert_eq!(f["rule"], "unrecorded-version", "{f}");
    assert_eq!(f["severity"], "FAIL");
    assert_eq!(f["subject"], jid.as_str());
    assert_eq!(f["repair"]["action"], "record-version", "{f}");
    assert_eq!(
        rig.server.get("/consistency").await["findings"],
        report["findings"]
    );

    let id = f["id"].as_str().expect("id").to_string();
    let body = json!({"finding": id, "reason": "stored before the drill failed it"});
    let (status, done) = rig
        .server
        .call(
            Method::POST,
            "/consistency/repair",
            ADMIN,
            Some(body.clone()),
        )
        .await;
    assert_eq!(status, 200, "{done}");
    assert!(done["position"].as_u64().expect("position") > 0, "{done}");
    let object = rig.server.get(&format!("/objects/{ark}")).await;
    assert_eq!(object["versions"][0]["version"], 1, "{object}");
    assert_eq!(object["versions"][0]["jid"], jid.as_str(), "{object}");
    assert_eq!(
        object["versions"][0]["local_ids"],
        json!(["loc-u"]),
        "{object}"
    );
    let clean = cli(&[]);
    assert_eq!(clean.status.code(), Some(0), "{clean:?}");
    assert!(String::from_utf8_lossy(&clean.stdout).starts_with("PASS"));
    let (status, again) = rig
        .server
        .call(Method::POST, "/consistency/repair", ADMIN, Some(body))
        .await;
    assert_eq!(status, 404, "{again}");
    assert_eq!(again["error"]["code"], "no_such_finding", "{again}");
    let (status, _) = rig
        .server
        .call(
            Method::POST,
            "/consistency/repair",
            ADMIN,
            Some(json!({"finding": "x", "reason": ""})),
        )
        .await;
    assert_eq!(status, 422, "a repair needs a reason");
}

/// `GET /consistency` and `POST /consistency/repair` on a running `serve`:
/// a node a foreign client wrote (an orphan `/batch-uuids` entry) is
/// reported and deleted by its repair, which the server records; drift
/// (a projected node's data changed by hand) is reported and repaired by
/// the running projector, recorded twice (the repair and the node found),
/// while the server keeps serving (issue 22: drift repair used to be
/// refused with 409 `needs_projector` until the server was stopped).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_server_reports_and_repairs_foreign_nodes() {
    let zk_server = shared();
    let root = unique_root("check-serve");
    let dir = tempfile::tempdir().expect("tempdir");
    let server = crate::server::start(dir.path(), &zk_server.hosts(), &root, Some(&[]));
    eventually("the projector created the base nodes", 30, async || {
        let r = server.get("/consistency").await;
        (r["findings"] == json!([])).then_some(())
    })
    .await;
    let zk = zookeeper_client::Client::connect(&format!("{}{root}", zk_server.hosts()))
        .await
        .expect("zk");
    let acl =
        zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all());
    zk.create("/batch-uuids/foreign", b"bid0000000077", &acl)
        .await
        .expect("a foreign node");
    zk.set_data("/locks/queue", b"hand-edited", None)
        .await
        .expect("drift");
    let report = server.get("/consistency").await;
    let findings = report["findings"].as_array().expect("findings");
    let by_rule = |rule: &str| {
        findings
            .iter()
            .find(|f| f["rule"] == rule)
            .unwrap_or_else(|| panic!("no {rule} in {report:#}"))
            .clone()
    };
    let orphan = by_rule("orphan-batch-uuid");
    assert_eq!(orphan["path"], "/batch-uuids/foreign");
    let drift = by_rule("drift");
    assert_eq!(drift["path"], "/locks/queue");
    assert_eq!(drift["repair"]["action"], "repair-drift");

    let (status, body) = server
        .call(
            Method::POST,
            "/consistency/repair",
            ADMIN,
            Some(json!({"finding": orphan["id"], "reason": "written by a test client", "actor": "carol"})),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert!(zk
        .check_stat("/batch-uuids/foreign")
        .await
        .expect("stat")
        .is_none());
    let after = server.get("/consistency").await;
    let rules: Vec<&Value> = after["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .map(|f| &f["rule"])
        .collect();
    assert_eq!(rules, [&json!("drift")], "{after:#}");
    let (status, body) = server
        .call(
            Method::POST,
            "/consistency/repair",
            crate::server::DEPOSITOR,
            Some(json!({"finding": drift["id"], "reason": "not mine"})),
        )
        .await;
    assert_eq!(status, 401, "admin only: {body}");

    // The drift is repaired by the running projector, and recorded.
    let (status, body) = server
        .call(
            Method::POST,
            "/consistency/repair",
            ADMIN,
            Some(json!({"finding": drift["id"], "reason": "hand edit", "actor": "carol"})),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["summary"], "repair-drift: /locks/queue", "{body}");
    let (data, _) = zk.get_data("/locks/queue").await.expect("read");
    assert_ne!(data, b"hand-edited", "the node is the log's again");
    let after = server.get("/consistency").await;
    assert_eq!(after["findings"], json!([]), "{after:#}");
    let history = server.get("/history?limit=1000").await;
    let kinds: Vec<&str> = history["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter_map(|e| e["event"].as_str())
        .collect();
    assert!(
        kinds.contains(&"ForeignChangeRepaired") && kinds.contains(&"ConsistencyRepaired"),
        "{kinds:?}"
    );
    // Submissions go on being projected meanwhile and after.
    let bid = server.submit(1).await;
    eventually("the batch after the repair is projected", 30, async || {
        zk.check_stat(&format!("/batches/{bid}"))
            .await
            .ok()
            .flatten()
            .map(|_| ())
    })
    .await;
}

/// `ingest --engine URL diff --repair` while the server runs (issue 22:
/// it was refused, "stop the server"): drift of every kind another client
/// can leave (a node's data changed, a node deleted, a node added, a
/// persistent lock no session owns) is converged by the server's running
/// projector, each item recorded with the reason and the whole repair as
/// `TreeRepaired`; the tree then matches the log and the queue goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn diff_repair_through_a_running_server_converges_every_kind_of_drift() {
    let zk_server = shared();
    let root = unique_root("diff-repair-serve");
    let dir = tempfile::tempdir().expect("tempdir");
    // No worker daemons: the batch stays Pending, and its nodes are
    // written by the projector only.
    let server = crate::server::start(dir.path(), &zk_server.hosts(), &root, None);
    let bid = server.submit(1).await;
    let zk = zookeeper_client::Client::connect(&format!("{}{root}", zk_server.hosts()))
        .await
        .expect("zk");
    let status_path = format!("/batches/{bid}/status");
    eventually("the batch is projected", 30, async || {
        zk.check_stat(&status_path).await.ok().flatten().map(|_| ())
    })
    .await;
    let mut uuid_path = None;
    for child in zk.list_children("/batch-uuids").await.expect("uuids") {
        let path = format!("/batch-uuids/{child}");
        let (data, _) = zk.get_data(&path).await.expect("uuid");
        if data == bid.as_bytes() {
            uuid_path = Some(path);
        }
    }
    let uuid_path = uuid_path.expect("the batch's uuid node");
    let acl =
        zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all());
    zk.set_data(&status_path, b"{\"status\":\"Completed\"}", None)
        .await
        .expect("changed");
    zk.delete(&uuid_path, None).await.expect("deleted");
    zk.create(&format!("/batches/{bid}/extra"), b"x", &acl)
        .await
        .expect("added");
    let lock = format!("/batches/{bid}/lock");
    zk.create(&lock, b"stale", &acl).await.expect("stale lock");

    let cli = |args: &[&str]| {
        let mut all = vec!["--engine", server.base.as_str()];
        all.extend_from_slice(args);
        tokio::task::block_in_place(|| {
            std::process::Command::new(crate::util::ingest_bin())
                .args(&all)
                .env("INGEST_ADMIN_TOKEN", ADMIN)
                .output()
                .expect("ingest runs")
        })
    };
    let out = cli(&["diff"]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(1), "drift: {text}");
    assert!(
        text.contains(&status_path) && text.contains(&uuid_path),
        "{text}"
    );

    let out = cli(&["diff", "--repair"]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains(&format!("repaired batch {bid}")), "{text}");
    assert!(
        text.contains(&format!("removed stale lock {lock}")),
        "{text}"
    );
    assert!(text.contains("no differences"), "{text}");
    let (data, _) = zk.get_data(&status_path).await.expect("status");
    assert!(
        String::from_utf8_lossy(&data).contains("Pending"),
        "the status is the log's again: {}",
        String::from_utf8_lossy(&data)
    );
    assert!(zk.check_stat(&uuid_path).await.expect("stat").is_some());
    assert!(zk.check_stat(&lock).await.expect("stat").is_none());
    let diff = server.get("/diff").await;
    for list in ["missing", "unexpected", "differing", "stale_locks"] {
        assert_eq!(diff[list], json!([]), "{list}: {diff:#}");
    }
    let history = server.get("/history?limit=1000").await.to_string();
    assert!(history.contains("TreeRepaired"), "{history}");
    assert!(
        history.contains("ForeignChangeRepaired") && history.contains("diff repair by admin"),
        "{history}"
    );
    // Nothing left to repair: exit 0, nothing recorded.
    let out = cli(&["diff", "--repair"]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("nothing to repair"), "{text}");
    // A depositor may not.
    let (status, body) = server
        .call(
            Method::POST,
            "/diff/repair",
            crate::server::DEPOSITOR,
            Some(json!({"reason": "not mine"})),
        )
        .await;
    assert_eq!(status, 401, "admin only: {body}");
    // The queue goes on.
    let next = server.submit(1).await;
    eventually("a batch after the repair is projected", 30, async || {
        zk.check_stat(&format!("/batches/{next}"))
            .await
            .ok()
            .flatten()
            .map(|_| ())
    })
    .await;
}

/// `ingest worker` processes killed on drop (a test that fails leaves none
/// behind), and their log files, whose last lines a failing test prints.
pub(crate) struct WorkerProcs(pub(crate) Vec<std::process::Child>, pub(crate) Vec<PathBuf>);

impl Drop for WorkerProcs {
    fn drop(&mut self) {
        for w in &mut self.0 {
            let _ = w.kill();
            let _ = w.wait();
        }
        if std::thread::panicking() {
            for log in &self.1 {
                let text = std::fs::read_to_string(log).unwrap_or_default();
                let lines: Vec<&str> = text.lines().collect();
                let tail = &lines[lines.len().saturating_sub(60)..];
                eprintln!("--- {} (last lines) ---", log.display());
                for line in tail {
                    eprintln!("{line}");
                }
            }
        }
    }
}

/// Every daemon, for a worker process that does all the work.
const EVERY_DAEMON: &str = "batch_pending,batch_reporting,batch_update_reporting,job_pending,estimating,provisioning,downloading,processing,storing,recording,notify";

/// The staging directories of the process `pid` under an OCFL root.
fn staging_of(storage: &std::path::Path, pid: u32) -> Vec<PathBuf> {
    let prefix = format!("proc-{pid}-");
    std::fs::read_dir(storage.join("extensions/rocfl-staging"))
        .map(|entries| {
            entries
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
                .filter(|e| e.path().is_dir())
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default()
}

/// Whether a staging directory holds a staged object (a store in progress):
/// rocfl's hashed layout puts objects under 3-character directories, and a
/// new object written directly is built in a `direct-…` directory.
fn stages_an_object(staging: &std::path::Path) -> bool {
    std::fs::read_dir(staging).is_ok_and(|entries| {
        entries.flatten().any(|e| {
            let name = e.file_name();
            e.path().is_dir() && (name.len() == 3 || name.to_string_lossy().starts_with("direct-"))
        })
    })
}

/// Issue 15, item 1: `ingest serve` (its target open, its own staging
/// claimed) and two `ingest worker --steps real` processes that store into
/// the same storage target at once (as docs/real-steps.md tells operators to
/// deploy); one worker is killed with SIGKILL in the middle of a store. Every job completes (the killed worker's on another process),
/// every object verifies in OCFL, and nothing the dead process left (its
/// staging, its locks) blocks a store. Before, starting a second process on
/// the target deleted the shared staging, and every later store of the
/// first failed with "object … is locked".
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn processes_sharing_a_storage_target_store_side_by_side_and_survive_a_kill() {
    // Every worker holds a new object half built for a while (a direct
    // write is otherwise over in a moment), so a store is there to be killed
    // in the middle of. The server runs no job daemon (it acquires and
    // reports batches, and still opens the target and claims its staging):
    // with chaining, whoever starts a job stores it, and the warm server
    // started all of them while the workers were starting; and a chain that
    // ends early (a download retried under the full suite's load) leaves its
    // job in a queue the server's daemons took it from, storing it without
    // the pause. Either way no worker was ever seen storing and the wait
    // timed out. The hold is 1.5 s. (Until the layering of the
    // configuration kept `--store-pause-ms`, no store held at all and the
    // test caught a store only when a 50 ms poll happened to fall inside
    // rocfl-free direct writes of about 40 ms: CI's run missed all 12.)
    let pause = ["--store-pause-ms".to_string(), "1500".to_string()];
    let rig = rig("shared-storage", &no_job_daemons()).await;
    let b = rig.base.clone();
    // Submitted before the workers start; one of them stores it while the
    // server holds its own staging on the target.
    add(&rig.depot, "first.txt", b"stored before the workers start");
    let first = rig
        .submit(
            json!({"profile": "demo", "submitter": "alice", "type": "file",
                       "payload_url": format!("{b}/files/first.txt"), "erc_where": "loc-first"}),
        )
        .await;

    let mut workers = WorkerProcs(Vec::new(), Vec::new());
    for n in 1..=2 {
        storer(&rig, &format!("storer{n}"), &pause, &mut workers);
    }
    let pids: Vec<u32> = workers.0.iter().map(std::process::Child::id).collect();
    eventually("the workers to open their storage target", 30, async || {
        pids.iter()
            .all(|pid| !staging_of(&rig.storage, *pid).is_empty())
            .then_some(())
    })
    .await;
    let done = rig.finished(&first).await;
    assert_eq!(done["status"], "Completed", "{done}");

    // Jobs big enough that a store takes a moment.
    let mut lines = Vec::new();
    let mut files = Vec::new();
    for i in 0..12 {
        let name = format!("big{i}.bin");
        let body: Vec<u8> = (0..(3 << 20))
            .map(|j: u32| (j.wrapping_mul(31) ^ i) as u8)
            .collect();
        add(&rig.depot, &name, &body);
        lines.push(format!(
            "{b}/files/{name} | | | | | {name} | | loc-big{i} | | | |"
        ));
        files.push(name);
    }
    add(
        &rig.depot,
        "big.checkm",
        &manifest("mrt-single-file-batch-manifest", BATCH_FIELDS, &lines),
    );
    let bid = rig
        .submit(
            json!({"profile": "demo", "submitter": "alice", "type": "single-file-batch-manifest",
                       "payload_url": format!("{b}/files/big.checkm")}),
        )
        .await;

    // SIGKILL the first worker found staging an object; no other process
    // knows.
    let (victim, staged) = eventually("a worker to be in the middle of a store", 120, async || {
        pids.iter().enumerate().find_map(|(i, pid)| {
            staging_of(&rig.storage, *pid)
                .into_iter()
                .find(|s| stages_an_object(s))
                .map(|s| (i, s))
        })
    })
    .await;
    workers.0[victim].kill().expect("SIGKILL the worker");
    workers.0[victim].wait().expect("reap the worker");
    assert!(
        staged.exists(),
        "the dead worker's staging is left as it was"
    );

    let batch = eventually(&format!("batch {bid} finished"), 240, async || {
        let b = rig.server.get(&format!("/batches/{bid}")).await;
        matches!(b["status"].as_str(), Some("Completed" | "Failed")).then_some(b)
    })
    .await;
    assert_eq!(batch["status"], "Completed", "{batch}");
    let jobs = Rig::jobs(&batch);
    assert_eq!(jobs.len(), 12, "{batch}");
    let mut stored_by = std::collections::BTreeSet::new();
    for jid in &jobs {
        let job = rig.job(jid).await;
        let url = job["payload_url"].as_str().expect("payload_url");
        let name = url.rsplit('/').next().expect("a file name");
        rig.assert_stored(jid, None, &[name]).await;
        for row in rig.history(jid).await {
            if row["detail"]
                .as_str()
                .is_some_and(|d| d.starts_with("Storing -> "))
            {
                if let Some(actor) = row["actor"].as_str() {
                    stored_by.insert(actor.to_string());
                }
            }
        }
    }
    // The victim was caught with an object half built: it stored too, side
    // by side with the others, whether or not it finished a store before.
    stored_by.insert(format!("worker:storer{}", victim + 1));
    assert!(
        stored_by.len() >= 2,
        "more than one process stored: {stored_by:?}"
    );
    // A new process on the target removes what the dead one left; nothing
    // of it blocks a store of the arks it was storing.
    let target = ingest_steps::ocfl::OcflTarget::open_or_init("check", &rig.storage)
        .expect("open the target");
    assert!(!staged.exists(), "the dead worker's staging outlived it");
    for jid in &jobs {
        let ark = rig.job(jid).await["primary_id"]
            .as_str()
            .expect("ark")
            .to_string();
        let src = tempfile::tempdir().expect("source");
        std::fs::write(src.path().join("again.txt"), b"again").expect("source file");
        let meta = ingest_steps::ocfl::VersionMeta {
            user_name: "test".into(),
            user_address: None,
            message: "after the kill".into(),
            created: chrono::Utc::now(),
        };
        target
            .store_version(&ark, src.path(), &meta)
            .unwrap_or_else(|e| panic!("a store of {ark} after the kill: {e}"));
    }
}

/// Starts an `ingest worker` named `name` running every job daemon with
/// the real steps on `rig`'s storage target, with `extra` arguments; its
/// log is `NAME.log` in the rig's directory. Kept in `workers`.
fn storer(rig: &Rig, name: &str, extra: &[String], workers: &mut WorkerProcs) {
    let dir = rig._dir.path();
    let hosts_root = rig.zk_at.clone();
    let (hosts, root) = hosts_root.split_at(hosts_root.find('/').expect("a root"));
    let log = dir.join(format!("{name}.log"));
    let child = std::process::Command::new(crate::util::ingest_bin())
        .args(["worker", "--engine", &rig.server.base, "--zk", hosts])
        .args([
            "--zk-root",
            root,
            "--daemons",
            EVERY_DAEMON,
            "--steps",
            "real",
        ])
        .args(["--name", name, "--provisioning-threshold", "100"])
        .arg("--working-storage")
        .arg(dir.join("work"))
        .arg("--profiles-dir")
        .arg(dir.join("profiles"))
        .arg("--storage-target")
        .arg(format!("primary={}", rig.storage.display()))
        .arg("--outbox")
        .arg(dir.join("outbox"))
        .args([
            "--retry-backoff-ms",
            "20",
            "--allow-network",
            "127.0.0.1/32",
        ])
        .args(extra)
        .env("INGEST_WORKER_TOKEN", crate::server::WORKER)
        .env_remove("INGEST_DATA_DIR")
        .env_remove("INGEST_CONFIG")
        .env_remove("INGEST_DAEMONS")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log"))
        .spawn()
        .expect("start ingest worker");
    workers.0.push(child);
    workers.1.push(log);
}

/// The server arguments of a rig whose jobs only `ingest worker`
/// processes step (the server acquires and reports batches).
fn no_job_daemons() -> [String; 2] {
    [
        "--daemons".to_string(),
        "job_pending=off,estimating=off,provisioning=off,downloading=off,processing=off,\
         storing=off,recording=off,notify=off"
            .to_string(),
    ]
}

/// Issue 25, finding 2: SIGTERM to a worker in the middle of a store (a new
/// object held half built by `--store-pause-ms` for a minute, as a store
/// of 100,000 files would take) stops the worker before the store's
/// commit, well within its 20 s shutdown grace (the poll's deadline is
/// below it): nothing is stored or reported, the job stays in Storing, and
/// the next worker stores it. Before, the worker waited on the store for
/// the whole grace and then abandoned it still running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigterm_stops_a_worker_in_the_middle_of_a_store_and_the_next_worker_stores_it() {
    let rig = rig("store-sigterm", &no_job_daemons()).await;
    let bid = submit_file(
        &rig,
        "held.txt",
        b"held half built at the SIGTERM",
        "loc-held",
    )
    .await;
    let mut workers = WorkerProcs(Vec::new(), Vec::new());
    let pause = ["--store-pause-ms".to_string(), "60000".to_string()];
    storer(&rig, "held", &pause, &mut workers);
    let pid = workers.0[0].id();
    let staged = eventually(
        "the worker to be in the middle of a store",
        120,
        async || {
            staging_of(&rig.storage, pid)
                .into_iter()
                .find(|s| stages_an_object(s))
        },
    )
    .await;
    assert!(std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .expect("kill")
        .success());
    let exit = eventually("the worker to exit after SIGTERM", 15, async || {
        workers.0[0].try_wait().expect("wait")
    })
    .await;
    assert!(exit.success(), "{exit:?}");
    let log = std::fs::read_to_string(&workers.1[0]).expect("the worker's log");
    assert!(
        log.contains("the store was stopped before its commit"),
        "{log}"
    );
    assert!(
        !staged.exists() || !stages_an_object(&staged),
        "the half-built object was removed"
    );
    let batch = rig.server.get(&format!("/batches/{bid}")).await;
    let jid = Rig::jobs(&batch).remove(0);
    let job = rig.job(&jid).await;
    assert_eq!(job["status"], "Storing", "{job}");
    let ark = job["primary_id"].as_str().expect("an ark").to_string();
    assert_nothing_stored(&rig.storage, &ark);

    storer(&rig, "next", &[], &mut workers);
    let done = rig.finished(&bid).await;
    assert_eq!(done["status"], "Completed", "{done}");
    rig.assert_stored(&jid, Some("loc-held"), &["held.txt"])
        .await;
}

/// Issue 11: an object whose inventory record the server would refuse
/// (larger than `--max-record-bytes`) fails in Storing, naming the limit,
/// before anything is stored; an object whose record fits is stored and
/// recorded under the same limit. Before, the large one was stored, then
/// refused at Recording with 413: an OCFL version the inventory never knew.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_whose_record_is_too_large_is_refused_before_storing() {
    let limit = "6144";
    let rig = rig(
        "record-limit",
        &[
            "--max-body-bytes".into(),
            limit.into(),
            "--max-record-bytes".into(),
            limit.into(),
        ],
    )
    .await;
    let b = rig.base.clone();
    let mut lines = Vec::new();
    for i in 0..60 {
        let name = format!("part-{i:03}.txt");
        add(&rig.depot, &name, format!("part {i}").as_bytes());
        lines.push(format!("{b}/files/{name} | | | | | {name} |"));
    }
    add(
        &rig.depot,
        "many.checkm",
        &manifest("mrt-ingest-manifest", OBJECT_FIELDS, &lines),
    );
    add(&rig.depot, "one.txt", b"one small file");
    let many = rig
        .submit(
            json!({"profile": "demo", "submitter": "alice", "type": "object-manifest",
                       "payload_url": format!("{b}/files/many.checkm"), "erc_where": "loc-many"}),
        )
        .await;
    let one = rig
        .submit(
            json!({"profile": "demo", "submitter": "alice", "type": "file",
                       "payload_url": format!("{b}/files/one.txt"), "erc_where": "loc-one"}),
        )
        .await;

    let (jid, job) = failed_job(&rig, &many).await;
    assert_eq!(job["last_successful_status"], "Processing", "{job}");
    let message = job["message"].as_str().unwrap_or_default();
    for needle in ["--max-record-bytes", limit, "nothing was stored"] {
        assert!(message.contains(needle), "{needle:?} not in {message:?}");
    }
    let ark = job["primary_id"].as_str().expect("an ark from Processing");
    let target =
        ingest_steps::ocfl::OcflTarget::open_existing("check", &rig.storage).expect("open storage");
    assert!(
        target.versions(ark).is_err(),
        "{ark} of {jid} was stored although its record cannot be recorded"
    );
    let done = rig.finished(&one).await;
    assert_eq!(done["status"], "Completed", "{done}");
    let small = Rig::jobs(&done);
    rig.assert_stored(&small[0], Some("loc-one"), &["one.txt"])
        .await;
}

/// Issue 11 finding 5: an object of 20,000 files (within
/// `--max-object-files`) is stored and recorded. Its inventory record is
/// several MiB, far over the API's body limit (256 KiB here), and goes
/// through the record route's own limit (`--max-record-bytes`). Before,
/// Recording failed with 413 and the version stayed in OCFL unrecorded; at
/// 100,000 files the error was "error sending request", retried for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_twenty_thousand_file_object_is_stored_and_recorded() {
    const FILES: usize = 20_000;
    let rig = rig(
        "many-files",
        &["--max-body-bytes".to_string(), "262144".to_string()],
    )
    .await;
    let names: Vec<String> = (0..FILES)
        .map(|i| format!("part{:02}/file-{i:05}.txt", i % 50))
        .collect();
    let entries: Vec<(&str, &[u8])> = names.iter().map(|n| (n.as_str(), n.as_bytes())).collect();
    add(&rig.depot, "many.zip", &zip(&entries));
    let bid = rig
        .submit(
            json!({"profile": "demo", "submitter": "alice", "type": "container",
            "payload_url": format!("{}/files/many.zip", rig.base), "erc_where": "loc-many"}),
        )
        .await;
    let batch = eventually(&format!("batch {bid} finished"), 600, async || {
        let b = rig.server.get(&format!("/batches/{bid}")).await;
        matches!(b["status"].as_str(), Some("Completed" | "Failed")).then_some(b)
    })
    .await;
    let jid = Rig::jobs(&batch)[0].clone();
    let job = rig.job(&jid).await;
    assert_eq!(job["status"], "Completed", "{job}");
    let ark = job["primary_id"].as_str().expect("ark").to_string();
    let (versions, object) = rig.versions(&ark).await;
    assert_eq!(versions, [1], "{ark}");
    let files = object["versions"][0]["files"].as_array().expect("files");
    let producer: Vec<&str> = files
        .iter()
        .filter_map(|f| f["path"].as_str())
        .filter(|p| p.starts_with("producer/"))
        .collect();
    assert_eq!(
        producer.len(),
        FILES,
        "every file is in the inventory record"
    );
    assert!(producer.contains(&"producer/part07/file-19957.txt"));
    let record_bytes = serde_json::to_vec(&object).expect("json").len();
    assert!(
        record_bytes > 262_144,
        "the record ({record_bytes} bytes) should be over the body limit for this test to mean anything"
    );
    let target =
        ingest_steps::ocfl::OcflTarget::open_existing("check", &rig.storage).expect("open storage");
    let report = target.verify(&ark).expect("verify");
    assert!(report.ok, "fixity of {ark}: {:?}", report.problems);
    let bytes = target
        .read_file(&ark, None, "producer/part07/file-19957.txt")
        .expect("read back");
    assert_eq!(bytes, b"part07/file-19957.txt");
}

/// Issue 13, what depositors and curators receive: the depositor's MIME
/// types in the stored manifest (and detected ones where none was given),
/// the OCFL version's user name and address (from the profile), reports
/// and callbacks that name no working path, and `ingest export bagit`
/// giving a bag that PyPI's `bagit` validates, holding the ingested bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn depositors_and_curators_receive_names_types_addresses_and_a_valid_bag() {
    let rig = rig("outputs", &[]).await;
    let b = rig.base.clone();
    add(&rig.depot, "a.txt", b"file a\n");
    add(&rig.depot, "table.csv", b"x,y\n1,2\n");
    add(
        &rig.depot,
        "object.checkm",
        &manifest(
            "mrt-ingest-manifest",
            OBJECT_FIELDS,
            &[
                format!("{b}/files/a.txt | | | | | a.txt | text/x-depositor-given"),
                format!("{b}/files/table.csv | | | | | data/table.csv |"),
                // A missing file: its job fails with a message about it.
            ],
        ),
    );
    add(
        &rig.depot,
        "broken.checkm",
        &manifest(
            "mrt-ingest-manifest",
            OBJECT_FIELDS,
            &[format!(
                "{b}/files/a.txt | sha256 | {} | | | a.txt |",
                sha256(b"something else")
            )],
        ),
    );
    let submission = |url: String, local: &str| {
        json!({"profile": "demo", "submitter": "alice", "type": "object-manifest",
               "payload_url": url, "erc_who": "Alice", "erc_what": "Outputs",
               "erc_when": "2024", "erc_where": local})
    };
    let bid = rig
        .submit(submission(format!("{b}/files/object.checkm"), "loc-out"))
        .await;
    let failing = rig
        .submit(submission(format!("{b}/files/broken.checkm"), "loc-broken"))
        .await;
    let batch = rig.finished(&bid).await;
    assert_eq!(batch["status"], "Completed", "{batch}");
    rig.finished(&failing).await;
    let jid = Rig::jobs(&batch)[0].clone();
    let ark = rig
        .assert_stored(&jid, Some("loc-out"), &["a.txt", "data/table.csv"])
        .await;

    // The stored manifest keeps the depositor's type and detects the rest.
    let target =
        ingest_steps::ocfl::OcflTarget::open_existing("check", &rig.storage).expect("open storage");
    let manifest = String::from_utf8(
        target
            .read_file(&ark, None, "system/mrt-manifest.txt")
            .expect("the stored manifest"),
    )
    .expect("utf-8");
    let type_of = |name: &str| {
        manifest
            .lines()
            .find(|l| l.split(" | ").nth(5) == Some(name))
            .and_then(|l| l.split(" | ").nth(6))
            .unwrap_or_else(|| panic!("no line for {name} in {manifest}"))
            .to_string()
    };
    assert_eq!(type_of("producer/a.txt"), "text/x-depositor-given");
    assert_eq!(type_of("producer/data/table.csv"), "text/csv");
    assert_eq!(type_of("system/mrt-dc.xml"), "application/xml");

    // The store and inventory hand-offs point into storage: after Notify
    // removed the working directory, the URL still gives the manifest.
    let zk = zookeeper_client::Client::connect(&rig.zk_at)
        .await
        .expect("zk");
    for node in ["store", "inventory"] {
        let (data, _) = zk
            .get_data(&format!("/jobs/{jid}/{node}"))
            .await
            .unwrap_or_else(|e| panic!("/jobs/{jid}/{node}: {e}"));
        let hand_off: Value = serde_json::from_slice(&data).expect("json");
        let url = hand_off["manifest_url"].as_str().expect("manifest_url");
        let path = reqwest::Url::parse(url)
            .expect("a URL")
            .to_file_path()
            .expect("a file URL");
        assert!(
            path.starts_with(&rig.storage),
            "{node}: {url} is not in storage"
        );
        assert_eq!(
            std::fs::read_to_string(&path).expect("the manifest URL resolves"),
            manifest,
            "{node}: {url}"
        );
    }
    assert!(
        !rig._dir.path().join("work").join(&bid).join(&jid).exists(),
        "Notify removed the working directory"
    );

    // The OCFL inventory names the depositor and the profile's address.
    let inventory: Value = walk(&rig.storage)
        .into_iter()
        .filter(|p| p.file_name().is_some_and(|n| n == "inventory.json"))
        .filter_map(|p| serde_json::from_slice::<Value>(&std::fs::read(p).ok()?).ok())
        .find(|inv| inv["id"] == ark.as_str())
        .expect("the object's inventory.json");
    let user = &inventory["versions"]["v1"]["user"];
    assert_eq!(user["name"], "alice", "{inventory}");
    assert_eq!(user["address"], "mailto:curator@example.org", "{inventory}");

    // No report, callback or status report shows the working directory.
    let work = rig._dir.path().join("work");
    let mut work_paths = vec![work.display().to_string()];
    if let Ok(canonical) = std::fs::canonicalize(&work) {
        work_paths.push(canonical.display().to_string());
    }
    let outbox = rig._dir.path().join("outbox");
    let mut received: Vec<(String, String)> = std::fs::read_dir(&outbox)
        .expect("outbox")
        .filter_map(|e| {
            let p = e.ok()?.path();
            Some((p.display().to_string(), std::fs::read_to_string(&p).ok()?))
        })
        .collect();
    assert!(
        received.iter().any(|(_, m)| m.contains(&failing)),
        "no report of the failing batch"
    );
    for c in &rig.depot.lock().expect("depot").callbacks {
        received.push(("a callback".into(), c.to_string()));
    }
    for id in [&bid, &failing] {
        let report = rig.server.get(&format!("/batches/{id}/report")).await;
        received.push((format!("/batches/{id}/report"), report.to_string()));
    }
    for (what, text) in &received {
        for w in &work_paths {
            assert!(!text.contains(w.as_str()), "{what} shows {w}:\n{text}");
        }
    }

    // A bag of the stored version, validated by PyPI's bagit.
    let bags = tempfile::tempdir().expect("tempdir");
    let bag = bags.path().join("bag");
    let export = |dir: &std::path::Path, extra: &[&str]| {
        let mut cmd = std::process::Command::new(crate::util::ingest_bin());
        cmd.args(extra)
            .args(["export", "bagit", &ark])
            .arg(dir)
            .args([
                "--storage-target",
                &format!("primary={}", rig.storage.display()),
                "--source-organization",
                "Test Library",
            ]);
        crate::util::Run::from_output(cmd.output().expect("ingest export"))
    };
    let run = tokio::task::block_in_place(|| export(&bag, &[]));
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(
        std::fs::read(bag.join("data/producer/a.txt")).expect("bagged a.txt"),
        b"file a\n"
    );
    assert_eq!(
        std::fs::read(bag.join("data/producer/data/table.csv")).expect("bagged csv"),
        b"x,y\n1,2\n"
    );
    let again = tokio::task::block_in_place(|| export(&bag, &[]));
    assert_eq!(again.code, 1, "a second export into the bag: {again:?}");
    assert!(again.stderr.contains("not an empty directory"), "{again:?}");
    let remote = tokio::task::block_in_place(|| {
        export(&bags.path().join("remote"), &["--engine", &rig.server.base])
    });
    assert_eq!(remote.code, 2, "{remote:?}");
    assert!(remote.stderr.contains("--engine"), "{remote:?}");
    let Some(python) = tokio::task::spawn_blocking(|| {
        crate::util::venv_python("bagit-venv", "bagit==1.9.0", "bagit")
    })
    .await
    .expect("the venv task") else {
        return;
    };
    let check = "import bagit, sys\n\
                 bag = bagit.Bag(sys.argv[1])\n\
                 bag.validate()\n\
                 print(bag.info['External-Identifier'], bag.info['Source-Organization'], sorted(bag.algorithms))\n";
    let validated = std::process::Command::new(&python)
        .args(["-c", check])
        .arg(&bag)
        .output()
        .expect("python bagit");
    assert!(validated.status.success(), "bagit: {validated:?}");
    assert_eq!(
        String::from_utf8_lossy(&validated.stdout).trim(),
        format!("{ark} Test Library ['sha256', 'sha512']")
    );
}

/// One line of a stored storage manifest: URL, SHA-256, size, file name.
struct ManifestLine {
    url: String,
    sha256: String,
    size: u64,
    name: String,
}

/// The file lines of a checkm storage manifest (as `ingest` writes them:
/// URL | sha256 | digest | size | modified | name | MIME type).
fn manifest_lines(text: &str) -> Vec<ManifestLine> {
    text.lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .map(|l| {
            let f: Vec<&str> = l.split(" | ").collect();
            assert_eq!(f.len(), 7, "a manifest line of 7 fields: {l}");
            assert_eq!(f[1], "sha256", "{l}");
            ManifestLine {
                url: f[0].to_string(),
                sha256: f[2].to_string(),
                size: f[3].parse().expect("size"),
                name: f[5].to_string(),
            }
        })
        .collect()
}

/// [`follow_stored_manifest`] and checks the manifest's signature.
async fn follow_stored_manifest(rig: &Rig, ark: &str, version: u32) -> String {
    let text = follow_stored_manifest_unsigned(rig, ark, version).await;
    let target =
        ingest_steps::ocfl::OcflTarget::open_existing("check", &rig.storage).expect("storage");
    let sig = target
        .read_file(ark, Some(version), "system/mrt-manifest.txt.sig")
        .expect("signature");
    let public = target
        .read_file(ark, Some(version), "system/mrt-signing-key.pub")
        .expect("public key");
    ingest_steps::signing::verify(
        &String::from_utf8_lossy(&public),
        text.as_bytes(),
        &String::from_utf8_lossy(&sig),
    )
    .expect("the stored manifest's signature verifies");
    text
}

/// Follows every URL of the manifest stored in `version` of `ark`: each must
/// answer (with a reader's token) the bytes the line describes. Returns the
/// manifest's text.
async fn follow_stored_manifest_unsigned(rig: &Rig, ark: &str, version: u32) -> String {
    let target =
        ingest_steps::ocfl::OcflTarget::open_existing("check", &rig.storage).expect("storage");
    let stored = target
        .read_file(ark, Some(version), "system/mrt-manifest.txt")
        .expect("the stored manifest");
    let text = String::from_utf8(stored.clone()).expect("utf-8");
    let lines = manifest_lines(&text);
    assert!(lines.len() >= 3, "{text}");
    let http = reqwest::Client::new();
    let prefix = format!("{}/content/1/", rig.server.base);
    for line in &lines {
        assert!(
            line.url.starts_with(&prefix),
            "{} does not point into storage ({prefix}…)",
            line.url
        );
        let file = ingest_steps::storage_manifest::encode_segment(&line.name);
        assert!(
            line.url.ends_with(&format!("/{version}/{file}")),
            "{} names another version or file than {version}/{file}",
            line.url
        );
        let reply = http
            .get(&line.url)
            .bearer_auth(DEPOSITOR)
            .send()
            .await
            .expect("GET");
        assert_eq!(reply.status(), 200, "{}", line.url);
        let body = reply.bytes().await.expect("body");
        assert_eq!(body.len() as u64, line.size, "{}", line.url);
        assert_eq!(sha256(&body), line.sha256, "{}", line.url);
    }
    text
}

/// Issue 15 item 9: the storage manifest stored in the object
/// (`system/mrt-manifest.txt`) named the job's working files (`file://…`),
/// which Notify deletes. Its URLs are now Merritt's storage content URLs
/// (`BASE/content/NODE/ARK/VERSION/FILE`) served by `ingest serve` from the
/// storage target: every one answers the file's bytes after the job's
/// working directory is gone, including a file OCFL deduplicated into an
/// earlier version's content and one stored once for two names of a
/// version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stored_manifest_names_stored_files_that_outlive_the_working_files() {
    let keys = tempfile::tempdir().expect("tempdir");
    let key = keys.path().join("signing.pem");
    ingest_steps::signing::SigningKeyFile::generate(&key).expect("key");
    let rig = rig(
        "manifest-urls",
        &["--signing-key".into(), key.display().to_string()],
    )
    .await;
    let shared = b"the same bytes in both versions".to_vec();
    add(&rig.depot, "shared.txt", &shared);
    add(&rig.depot, "twin.txt", &shared);
    add(&rig.depot, "first.txt", b"only in the first version");
    add(&rig.depot, "second.txt", b"only in the second version");
    let b = rig.base.clone();
    let object = |name: &str, files: &[&str]| {
        let lines: Vec<String> = files
            .iter()
            .map(|f| format!("{b}/files/{f} | | | | | {f} |"))
            .collect();
        add(
            &rig.depot,
            name,
            &manifest("mrt-ingest-manifest", OBJECT_FIELDS, &lines),
        );
        json!({"profile": "demo", "submitter": "alice", "type": "object-manifest",
               "payload_url": format!("{b}/files/{name}"), "erc_where": "loc-urls",
               "submission_mode": if name == "v1.checkm" { "add" } else { "update" }})
    };
    let work = rig._dir.path().join("work");

    let first = rig
        .submit(object(
            "v1.checkm",
            &["shared.txt", "twin.txt", "first.txt"],
        ))
        .await;
    let batch = rig.finished(&first).await;
    assert_eq!(batch["status"], "Completed", "{batch}");
    let jid1 = Rig::jobs(&batch)[0].clone();
    let ark = rig
        .assert_stored(&jid1, Some("loc-urls"), &["shared.txt", "twin.txt"])
        .await;
    let gone = |jid: &str| {
        walk(&work)
            .into_iter()
            .filter(|p| p.to_string_lossy().contains(jid))
            .collect::<Vec<_>>()
    };
    assert!(gone(&jid1).is_empty(), "Notify removed the working files");
    let v1 = follow_stored_manifest(&rig, &ark, 1).await;
    assert!(
        v1.contains(&format!("\n# ingest job {jid1} of batch {first}\n")),
        "the manifest names its job: {v1}"
    );
    assert!(!v1.contains("file://"), "{v1}");

    let second = rig
        .submit(object("v2.checkm", &["shared.txt", "second.txt"]))
        .await;
    let batch = rig.finished(&second).await;
    assert_eq!(batch["status"], "Completed", "{batch}");
    let jid2 = Rig::jobs(&batch)[0].clone();
    assert!(gone(&jid2).is_empty(), "Notify removed the working files");
    let target =
        ingest_steps::ocfl::OcflTarget::open_existing("check", &rig.storage).expect("storage");
    assert_eq!(target.versions(&ark).expect("versions"), [1, 2]);
    // OCFL stored the shared file once: v2's names v1's content.
    let v2_content = target.version_content(&ark, Some(2)).expect("v2");
    let shared_path = v2_content
        .files
        .iter()
        .find(|f| f.logical_path == "producer/shared.txt")
        .map(|f| f.path.display().to_string())
        .expect("shared.txt in v2");
    assert!(
        shared_path.contains("/v1/content/"),
        "deduplicated into v1: {shared_path}"
    );
    follow_stored_manifest(&rig, &ark, 2).await;
    // The first version's URLs still answer.
    follow_stored_manifest(&rig, &ark, 1).await;

    // What the content route refuses, with a reader's token.
    let http = reqwest::Client::new();
    let enc = ingest_steps::storage_manifest::encode_segment(&ark);
    let base = &rig.server.base;
    for (path, status) in [
        (format!("/content/1/{enc}/2/producer%2Ffirst.txt"), 404),
        (format!("/content/7/{enc}/1/producer%2Ffirst.txt"), 404),
        (format!("/content/1/{enc}/3/producer%2Fshared.txt"), 404),
        (format!("/content/1/{enc}/0/producer%2Fshared.txt"), 400),
        (
            format!("/content/1/{enc}/1/producer%2F..%2F..%2Finventory.json"),
            400,
        ),
        (
            "/content/1/ark%3A%2F99999%2Fnone/1/producer%2Fa.txt".to_string(),
            404,
        ),
        (format!("/content/x/{enc}/1/producer%2Fshared.txt"), 400),
    ] {
        let reply = http
            .get(format!("{base}{path}"))
            .bearer_auth(DEPOSITOR)
            .send()
            .await
            .expect("GET");
        assert_eq!(reply.status(), status, "{path}");
        let error: Value = reply.json().await.expect("a JSON error");
        let code = if status == 404 {
            "not_found"
        } else {
            "invalid_id"
        };
        assert_eq!(error["error"]["code"], code, "{path}: {error}");
        if path.starts_with("/content/7/") {
            assert!(
                error["error"]["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("serves no storage node 7")),
                "{error}"
            );
        }
    }
    let reply = http
        .get(format!("{base}/content/1/{enc}/1/producer/first.txt"))
        .send()
        .await
        .expect("GET");
    assert_eq!(reply.status(), 401, "a token is needed");

    // Issue 25, finding 11: a symbolic link planted in a stored object (by
    // whoever can write the storage) was followed, so the route served any
    // file the server could read. It is refused; a plain file still answers.
    let secret_dir = tempfile::tempdir().expect("tempdir");
    let secret = secret_dir.path().join("secret.txt");
    std::fs::write(&secret, b"not for depositors").expect("secret");
    let first_path = target
        .version_content(&ark, Some(1))
        .expect("v1")
        .files
        .into_iter()
        .find(|f| f.logical_path == "producer/first.txt")
        .map(|f| f.path)
        .expect("first.txt in v1");
    std::fs::remove_file(&first_path).expect("remove the stored file");
    std::os::unix::fs::symlink(&secret, &first_path).expect("plant a link");
    let get = |path: String| {
        http.get(format!("{base}{path}"))
            .bearer_auth(DEPOSITOR)
            .send()
    };
    let reply = get(format!("/content/1/{enc}/1/producer%2Ffirst.txt"))
        .await
        .expect("GET");
    assert_eq!(reply.status(), 403);
    let text = reply.text().await.expect("body");
    assert!(!text.contains("not for depositors"), "{text}");
    assert!(text.contains("\"refused\""), "{text}");
    let reply = get(format!("/content/1/{enc}/2/producer%2Fsecond.txt"))
        .await
        .expect("GET");
    assert_eq!(reply.status(), 200);
    assert_eq!(
        reply.bytes().await.expect("body").as_ref(),
        b"only in the second version"
    );
}

/// Issue 25, finding 1: `GET /consistency` holds the projector only while
/// it reads the tree, never while it scans storage. A storage target holds
/// an object whose `inventory.json` is a FIFO, so the scan blocks there
/// until the test writes to it: a batch submitted meanwhile is still
/// projected (its node appears in ZooKeeper) and its job completes. Before,
/// the projector waited for the whole check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consistency_check_scanning_storage_does_not_hold_up_the_queue() {
    let rig = rig("unheld", &[]).await;
    // One good object first: the target exists and the check has a
    // version to compare.
    add(&rig.depot, "first.txt", b"stored before the check");
    let first = rig
        .submit(json!({"profile": "demo", "submitter": "alice", "type": "file", "payload_url": format!("{}/files/first.txt", rig.base)}))
        .await;
    assert_eq!(rig.finished(&first).await["status"], "Completed");

    // An object directory whose inventory blocks whoever reads it.
    let stuck = rig.storage.join("blocking-object");
    std::fs::create_dir_all(&stuck).expect("object dir");
    std::fs::write(stuck.join("0=ocfl_object_1.0"), "ocfl_object_1.0\n").expect("declaration");
    let fifo = stuck.join("inventory.json");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("mkfifo");
    assert!(made.success());

    let url = format!("{}/consistency", rig.server.base);
    let check = tokio::spawn(async move {
        let r = reqwest::Client::new()
            .get(url)
            .bearer_auth(ADMIN)
            .send()
            .await
            .expect("GET /consistency");
        (r.status().as_u16(), r.text().await.unwrap_or_default())
    });
    // Opening a FIFO for writing without blocking succeeds only once a
    // reader has it open: then the check is inside its storage scan. The
    // writer stays open (and silent), so the reader waits.
    let writer = eventually("the check reading the blocking inventory", 60, async || {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32)
            .open(&fifo)
            .ok()
    })
    .await;

    add(&rig.depot, "during.txt", b"submitted while the check scans");
    let during = rig
        .submit(json!({"profile": "demo", "submitter": "alice", "type": "file", "payload_url": format!("{}/files/during.txt", rig.base)}))
        .await;
    let zk = zookeeper_client::Client::connect(&rig.zk_at)
        .await
        .expect("zk");
    let node = format!("/batches/{during}");
    eventually(
        "the batch submitted during the check projected",
        60,
        async || zk.check_stat(&node).await.expect("stat"),
    )
    .await;
    assert_eq!(rig.finished(&during).await["status"], "Completed");
    assert!(!check.is_finished(), "the check was still scanning storage");
    // The admin UI's overview does not wait for a check either: it shows
    // the last report (none yet) and starts one in the background.
    let login = crate::ui::login(&rig.server, ADMIN).await;
    let cookie = crate::ui::cookie_of(&login).expect("session cookie");
    let (status, page) = crate::ui::page(&rig.server, &cookie, "/ui").await;
    assert_eq!(status, 200);
    assert!(page.contains(r#"id="report-age""#), "{page}");

    // Let the scan go on: the check ends (the object it could not read is
    // skipped or named), and the queue never waited for it.
    drop(writer);
    let (status, report) = check.await.expect("the check task");
    assert!(status == 200 || status == 500, "{status} {report}");
}

/// Issue 25, finding 1: a check whose client goes away stops scanning
/// storage instead of reading on for nobody. Two objects' inventories are
/// FIFOs; the client gives up while the scan blocks on one, which the
/// test then lets go: the scan stops before the other
/// (`ingest_consistency_checks_total{outcome="cancelled"}`). Before, it went
/// on to the next object and blocked there, for nobody.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consistency_check_whose_client_goes_away_stops_scanning_storage() {
    let rig = rig("cancelled", &[]).await;
    add(&rig.depot, "first.txt", b"stored before the check");
    let first = rig
        .submit(json!({"profile": "demo", "submitter": "alice", "type": "file", "payload_url": format!("{}/files/first.txt", rig.base)}))
        .await;
    assert_eq!(rig.finished(&first).await["status"], "Completed");
    let mut fifos = Vec::new();
    for name in ["blocking-a", "blocking-b"] {
        let dir = rig.storage.join(name);
        std::fs::create_dir_all(&dir).expect("object dir");
        std::fs::write(dir.join("0=ocfl_object_1.0"), "ocfl_object_1.0\n").expect("declaration");
        let fifo = dir.join("inventory.json");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .expect("mkfifo");
        assert!(made.success());
        fifos.push(fifo);
    }
    let cancelled = async || {
        let page = reqwest::Client::new()
            .get(format!("{}/metrics", rig.server.base))
            .send()
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        page.lines()
            .find(|l| l.starts_with("ingest_consistency_checks_total{outcome=\"cancelled\"}"))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<u64>().ok())
    };
    assert_eq!(cancelled().await, Some(0));

    // The client gives up while the scan is blocked on one of the FIFOs.
    let url = format!("{}/consistency", rig.server.base);
    let client = tokio::spawn(async move {
        reqwest::Client::new()
            .get(url)
            .bearer_auth(ADMIN)
            .send()
            .await
            .map(|r| r.status().as_u16())
    });
    let writer = eventually("the check reading a blocking inventory", 60, async || {
        use std::os::unix::fs::OpenOptionsExt;
        fifos.iter().find_map(|fifo| {
            std::fs::OpenOptions::new()
                .write(true)
                .custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32)
                .open(fifo)
                .ok()
        })
    })
    .await;
    client.abort();
    let _ = client.await;
    // The server learns that its client went away when the connection
    // closes (a margin for that, not a measured time); then the blocked
    // read is let go (end of file: that object is skipped), and the scan
    // must stop before the other FIFO.
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    drop(writer);
    eventually("the check counted as cancelled", 60, async || {
        cancelled().await.filter(|n| *n == 1).map(|_| ())
    })
    .await;
    // The other FIFO was never opened by a reader: a writer cannot open it.
    for fifo in &fifos {
        use std::os::unix::fs::OpenOptionsExt;
        let open = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32)
            .open(fifo);
        assert!(open.is_err(), "a reader still has {}", fifo.display());
    }
}

/// Issue 25, finding 2's "never holding up other jobs' storing": one worker
/// with one task per daemon, every store held 25 s by `--store-pause-ms`
/// (as a store of 100,000 files holds it for minutes). A job that reaches
/// Storing in the first seconds of the first store is handed to the storing
/// task's inbox and taken from there by the daemon's spare once that store
/// counts as long (`LONG_STEP`); a job that reaches Storing later is stored
/// at once in the task of its earlier step. All three objects are staged
/// while the first is still held. Before the spare, the second job waited
/// in the inbox until the first store ended; before the long-step rule, the
/// third did too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_store_holds_none_of_the_jobs_behind_it() {
    let rig = rig("store-lane", &no_job_daemons()).await;
    let b = rig.base.clone();
    for i in 0..3 {
        add(
            &rig.depot,
            &format!("lane{i}.txt"),
            format!("job {i}").as_bytes(),
        );
    }
    let pause = ["--store-pause-ms".to_string(), "25000".to_string()];
    let mut workers = WorkerProcs(Vec::new(), Vec::new());
    storer(&rig, "lane", &pause, &mut workers);
    let pid = workers.0[0].id();
    let staged = || {
        staging_of(&rig.storage, pid)
            .iter()
            .flat_map(|s| std::fs::read_dir(s).into_iter().flatten().flatten())
            .filter(|e| e.file_name().to_string_lossy().starts_with("direct-"))
            .count()
    };
    let submit = async |i: usize| {
        rig.submit(
            json!({"profile": "demo", "submitter": "alice", "type": "file",
                           "payload_url": format!("{b}/files/lane{i}.txt"),
                           "erc_where": format!("loc-lane{i}")}),
        )
        .await
    };
    let first = submit(0).await;
    eventually("the first store under way", 60, async || {
        (staged() >= 1).then_some(())
    })
    .await;
    // At once: the second job reaches Storing while the storing task's
    // step is not yet long, so it is handed to that task's inbox, where
    // the daemon's spare takes it once the store has lasted LONG_STEP.
    let second = submit(1).await;
    eventually(
        "the second object staged beside the first",
        30,
        async || (staged() >= 2).then_some(()),
    )
    .await;
    // The storing task and the spare are now on long steps: the third job
    // is stored by the task that ran its step before.
    tokio::time::sleep(ingest_worker::daemon::LONG_STEP + std::time::Duration::from_secs(1)).await;
    let third = submit(2).await;
    eventually("all three objects staged at once", 20, async || {
        (staged() >= 3).then_some(())
    })
    .await;
    for bid in [first, second, third] {
        let batch = eventually(&format!("batch {bid} finished"), 120, async || {
            let b = rig.server.get(&format!("/batches/{bid}")).await;
            matches!(b["status"].as_str(), Some("Completed" | "Failed")).then_some(b)
        })
        .await;
        assert_eq!(batch["status"], "Completed", "{batch}");
    }
}

/// Issue 25, finding 2: SIGTERM to `ingest serve` while its own worker is
/// in the middle of a store (a new object held half built by
/// `--store-pause-ms` for a minute, as a store of 100,000 files would
/// take) stops the server within its grace and before the store's commit:
/// nothing is stored, the job stays in Storing, and the server started
/// again on the same data directory stores it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigterm_stops_serve_in_the_middle_of_a_store_and_the_next_start_stores_it() {
    let pause = ["--store-pause-ms".to_string(), "60000".to_string()];
    let mut rig = rig("serve-store-sigterm", &pause).await;
    let bid = submit_file(
        &rig,
        "held.txt",
        b"held half built at the SIGTERM",
        "loc-held",
    )
    .await;
    let pid = rig.server.child.id();
    let staged = eventually("serve to be in the middle of a store", 120, async || {
        staging_of(&rig.storage, pid)
            .into_iter()
            .find(|s| stages_an_object(s))
    })
    .await;
    let batch = rig.server.get(&format!("/batches/{bid}")).await;
    let jid = Rig::jobs(&batch).remove(0);
    let job = rig.job(&jid).await;
    assert_eq!(job["status"], "Storing", "{job}");
    let ark = job["primary_id"].as_str().expect("an ark").to_string();
    // Well within the 60 s the store is held: exit 0.
    rig.server.terminate(40).await;
    let log = std::fs::read_to_string(&rig.server.log).unwrap_or_default();
    assert!(
        log.contains("the store was stopped before its commit"),
        "{log}"
    );
    assert!(
        !staged.exists() || !stages_an_object(&staged),
        "the half-built object was removed"
    );
    assert_nothing_stored(&rig.storage, &ark);

    let (hosts, root) = rig.zk_at.split_at(rig.zk_at.find('/').expect("a root"));
    rig.server = crate::server::start_with(
        rig._dir.path(),
        hosts,
        root,
        Some(&[]),
        "real",
        &rig_args(rig._dir.path()),
    );
    let done = rig.finished(&bid).await;
    assert_eq!(done["status"], "Completed", "{done}");
    rig.assert_stored(&jid, Some("loc-held"), &["held.txt"])
        .await;
}
