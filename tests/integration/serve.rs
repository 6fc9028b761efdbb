//! `ingest serve` as an operator runs it: one process with the engine, the
//! ZooKeeper projector and the HTTP API, fencing worker reports on real
//! ZooKeeper lock nodes, and stopping cleanly on SIGTERM.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use zookeeper_client as zk;

use crate::util::ingest_bin;
use crate::zk_server::{shared, unique_root};

const ADMIN: &str = "admin-token-0123456789";
const DEPOSITOR: &str = "depositor-token-0123456789";
const WORKER: &str = "worker-token-0123456789";

struct Server {
    child: Child,
    base: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(data_dir: &std::path::Path, hosts: &str, root: &str) -> Server {
    let mut child = Command::new(ingest_bin())
        .args(["--data-dir"])
        .arg(data_dir)
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--zk",
            hosts,
            "--zk-root",
            root,
        ])
        .env("INGEST_ADMIN_TOKEN", ADMIN)
        .env("INGEST_DEPOSITOR_TOKEN", DEPOSITOR)
        .env("INGEST_WORKER_TOKEN", WORKER)
        .env_remove("INGEST_DATA_DIR")
        .env_remove("INGEST_CONFIG")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start ingest serve");
    let stdout = child.stdout.take().expect("stdout");
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .expect("read the listening line");
    let base = line
        .trim()
        .strip_prefix("ingest serve listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_string();
    Server { child, base }
}

async fn call(
    client: &reqwest::Client,
    method: reqwest::Method,
    url: String,
    token: &str,
    body: Value,
) -> (u16, Value) {
    let resp = client
        .request(method, url)
        .bearer_auth(token)
        .json(&body)
        .send()
        .await
        .expect("request");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// Polls `check` until it gives `Some` or the deadline passes.
async fn eventually<T>(what: &str, mut check: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_projects_fences_on_real_locks_and_stops_cleanly() {
    let zk_server = shared();
    let hosts = zk_server.hosts();
    let root = unique_root("serve");
    let dir = tempfile::tempdir().expect("tempdir");
    let mut server = start(dir.path(), &hosts, &root);
    let http = reqwest::Client::new();
    let base = server.base.clone();

    // A depositor submits; the projector puts the batch into ZooKeeper.
    let (status, body) = call(
        &http,
        reqwest::Method::POST,
        format!("{base}/batches"),
        DEPOSITOR,
        json!({"profile": "demo", "submitter": "alice", "type": "file", "payload_url": "https://example.org/a.txt"}),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let bid = body["bid"].as_str().expect("bid").to_string();
    let client = zk::Client::connect(&format!("{hosts}{root}"))
        .await
        .expect("zookeeper");
    let status_path = format!("/batches/{bid}/status");
    eventually("the batch in ZooKeeper", async || {
        client.get_data(&status_path).await.ok()
    })
    .await;

    // A report from a session that holds no lock is refused; nothing changes.
    let (status, body) = call(
        &http,
        reqwest::Method::POST,
        format!("{base}/batches/{bid}/acquire"),
        WORKER,
        json!({"worker": "w1", "session_id": 12345}),
    )
    .await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"]["code"], "lock_not_held", "{body}");

    // The same report from the session that holds the batch's lock node goes through.
    let lock = format!("/batches/{bid}/lock");
    let ephemeral = zk::CreateMode::Ephemeral.with_acls(zk::Acls::anyone_all());
    client
        .create(&lock, b"", &ephemeral)
        .await
        .expect("create the lock");
    let session = client.session_id().0;
    let (status, body) = call(
        &http,
        reqwest::Method::POST,
        format!("{base}/batches/{bid}/acquire"),
        WORKER,
        json!({"worker": "w1", "session_id": session}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    client.delete(&lock, None).await.expect("release the lock");
    let jobs: Vec<String> = eventually("the job's queue reference", async || {
        let jobs = client.list_children("/jobs/states/pending").await.ok()?;
        (!jobs.is_empty()).then_some(jobs)
    })
    .await;
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    let (data, _) = client.get_data(&status_path).await.expect("batch status");
    let status: Value = serde_json::from_slice(&data).expect("status JSON");
    assert_eq!(status["status"], "Processing");

    // An admin pauses the queue: the lock node appears in ZooKeeper.
    let (code, body) = call(
        &http,
        reqwest::Method::POST,
        format!("{base}/queue/pause"),
        ADMIN,
        json!({"reason": "maintenance"}),
    )
    .await;
    assert_eq!(code, 200, "{body}");
    eventually("the pause lock", async || {
        client
            .check_stat("/locks/queue/ingest")
            .await
            .ok()
            .flatten()
    })
    .await;

    // SIGTERM: the server finishes and exits 0; the log verifies afterwards.
    let pid = server.child.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill")
        .success());
    let deadline = Instant::now() + Duration::from_secs(30);
    let exit = loop {
        if let Some(s) = server.child.try_wait().expect("wait") {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "ingest serve did not stop after SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(exit.success(), "{exit:?}");
    let verify = Command::new(ingest_bin())
        .arg("--data-dir")
        .arg(dir.path())
        .arg("verify")
        .output()
        .expect("verify");
    assert!(
        verify.status.success(),
        "{}",
        String::from_utf8_lossy(&verify.stdout)
    );
}
