//! A real `ingest serve` child process for tests, shared by the server,
//! worker and other end-to-end tests: it starts on a free port, is killed when
//! dropped, and prints the tail of its log when a test fails.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::util::ingest_bin;

pub const ADMIN: &str = "admin-token-0123456789";
pub const DEPOSITOR: &str = "depositor-token-0123456789";
pub const WORKER: &str = "worker-token-0123456789";

/// The states a job passes through on its way to Completed.
pub const WALK: [&str; 8] = [
    "Pending",
    "Estimating",
    "Provisioning",
    "Downloading",
    "Processing",
    "Storing",
    "Recording",
    "Notify",
];

pub struct Server {
    pub child: Child,
    pub base: String,
    /// The server's stderr.
    pub log: std::path::PathBuf,
    http: reqwest::Client,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            if let Ok(dir) = std::env::var("INGEST_TEST_KEEP_LOGS") {
                let name = format!("serve-{}.log", self.child.id());
                let _ = std::fs::copy(&self.log, std::path::Path::new(&dir).join(name));
            }
            let text = std::fs::read_to_string(&self.log).unwrap_or_default();
            // Request lines drown the rest: show what the server did.
            let tail: Vec<&str> = text
                .lines()
                .rev()
                .filter(|l| !l.contains("ingest_server::api: answered"))
                .take(60)
                .collect();
            eprintln!("--- ingest serve log (last lines) ---");
            for l in tail.iter().rev() {
                eprintln!("{l}");
            }
        }
    }
}

/// Starts `ingest serve` on a free port with its data under `dir`. With
/// `Some(daemons)` the in-process worker daemons run simulated steps (each
/// entry a `--daemon` setting); with `None` no daemon runs.
pub fn start(dir: &Path, hosts: &str, root: &str, daemons: Option<&[&str]>) -> Server {
    start_with(dir, hosts, root, daemons, "simulate", &[])
}

/// [`start`] with the in-process daemons running `steps` (`simulate` or
/// `real`) and further `serve` arguments.
pub fn start_with(
    dir: &Path,
    hosts: &str,
    root: &str,
    daemons: Option<&[&str]>,
    steps: &str,
    args: &[String],
) -> Server {
    start_in(dir, &dir.join("data"), hosts, root, daemons, steps, args)
}

/// [`start`] without daemons on an existing data directory `data` (its log
/// under `dir`).
pub fn start_with_data(dir: &Path, data: &Path, hosts: &str, root: &str) -> Server {
    start_in(dir, data, hosts, root, None, "simulate", &[])
}

fn start_in(
    dir: &Path,
    data: &Path,
    hosts: &str,
    root: &str,
    daemons: Option<&[&str]>,
    steps: &str,
    args: &[String],
) -> Server {
    let log = dir.join("serve.log");
    let mut cmd = Command::new(ingest_bin());
    cmd.arg("--data-dir").arg(data).args([
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--zk",
        hosts,
        "--zk-root",
        root,
        "--provisioning-threshold",
        "100",
        "--working-storage",
    ]);
    // Not created here: `serve` creates its working storage (before, jobs
    // waited in Provisioning for ever on a fresh data directory).
    cmd.arg(dir.join("work"))
        // The tests' payload servers listen on 127.0.0.1, which the outbound
        // policy refuses unless allowed (127.0.0.2 stays refused: the
        // outbound tests' forbidden servers listen there).
        .args(["--allow-network", "127.0.0.1/32"])
        .args(args);
    if let Some(daemons) = daemons {
        cmd.env("INGEST_WORKER_STEPS", steps)
            .env("INGEST_SIMULATE_SEED", "7");
        for d in daemons {
            cmd.args(["--daemon", d]);
        }
    } else {
        cmd.env_remove("INGEST_WORKER_STEPS");
    }
    let mut child = cmd
        .env("INGEST_ADMIN_TOKEN", ADMIN)
        .env("INGEST_DEPOSITOR_TOKEN", DEPOSITOR)
        .env("INGEST_WORKER_TOKEN", WORKER)
        .env_remove("INGEST_DATA_DIR")
        .env_remove("INGEST_CONFIG")
        .env_remove("INGEST_DAEMONS")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).expect("log file"))
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
    Server {
        child,
        base,
        log,
        http: reqwest::Client::new(),
    }
}

impl Server {
    pub async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        token: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(token);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.expect("request");
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    /// [`Server::call`] as a lock holder: with its secret in the fence
    /// header.
    pub async fn call_fenced(
        &self,
        path: &str,
        secret: &ingest_protocol::fence::FenceSecret,
        body: Value,
    ) -> (u16, Value) {
        let resp = self
            .http
            .post(format!("{}{path}", self.base))
            .bearer_auth(WORKER)
            .header(ingest_protocol::fence::FENCE_HEADER, secret.to_header())
            .json(&body)
            .send()
            .await
            .expect("request");
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    /// Sends SIGTERM and waits (at most `secs`) for the server to exit;
    /// asserts that it exited 0.
    pub async fn terminate(&mut self, secs: u64) {
        let pid = self.child.id().to_string();
        assert!(std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("kill")
            .success());
        let exit = eventually("ingest serve to exit", secs, async || {
            self.child.try_wait().expect("wait")
        })
        .await;
        assert!(exit.success(), "{exit:?}");
    }

    pub async fn get(&self, path: &str) -> Value {
        let (status, body) = self.call(reqwest::Method::GET, path, ADMIN, None).await;
        assert_eq!(status, 200, "GET {path}: {body}");
        body
    }

    /// Submits a batch of `jobs` inline manifest lines through the typed
    /// client (`ingest-client`, as depositors' tools and the CLI do); its bid.
    pub async fn submit(&self, jobs: usize) -> String {
        self.submit_to("demo", jobs).await
    }

    /// [`Server::submit`] to collection `profile`.
    pub async fn submit_to(&self, profile: &str, jobs: usize) -> String {
        let client = ingest_client::Client::new(&self.base, DEPOSITOR).expect("client");
        let input = ingest_protocol::submission::SubmissionInput {
            submitter: Some("alice".into()),
            profile: Some(profile.into()),
            payload_type: Some("object-manifest".into()),
            payload_url: Some("https://example.org/batch.checkm".into()),
            manifest: (0..jobs)
                .map(|i| format!("https://example.org/{i}.txt loc{i}"))
                .collect(),
            ..Default::default()
        };
        client.submit(&input).await.expect("submitted").bid
    }

    /// Asserts that the job completed and made exactly one move out of
    /// every state on the way.
    pub async fn assert_walked_once(&self, jid: &str) {
        let job = self.get(&format!("/jobs/{jid}")).await;
        assert_eq!(job["status"], "Completed", "{job}");
        let history = self.get(&format!("/jobs/{jid}/history")).await;
        let rows = history["events"].as_array().expect("events");
        for state in WALK {
            let prefix = format!("{state} -> ");
            let moves = rows
                .iter()
                .filter(|r| r["event"] == "JobStatusChanged")
                .filter(|r| r["detail"].as_str().is_some_and(|d| d.starts_with(&prefix)))
                .count();
            assert_eq!(moves, 1, "{jid} left {state} {moves} times: {history}");
        }
    }

    /// Asserts that each of `jids` walked once ([`Server::assert_walked_once`])
    /// and returns the worker actors (`worker:NAME`) that moved them.
    pub async fn worker_actors(&self, jids: &[Value]) -> std::collections::BTreeSet<String> {
        let mut actors = std::collections::BTreeSet::new();
        for jid in jids {
            let jid = jid.as_str().expect("jid");
            self.assert_walked_once(jid).await;
            let history = self.get(&format!("/jobs/{jid}/history")).await;
            for row in history["events"].as_array().expect("events") {
                if let Some(a) = row["actor"].as_str().filter(|a| a.starts_with("worker:")) {
                    actors.insert(a.to_string());
                }
            }
        }
        actors
    }
}

/// Polls `check` until it gives `Some` or the deadline passes.
pub async fn eventually<T>(what: &str, secs: u64, mut check: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until the server's `GET /diff` finds no drift (nothing missing,
/// unexpected or differing) for at most `secs`; fails with `what` and the
/// last answer, so a tree that never converges says how.
pub async fn until_no_drift(s: &Server, what: &str, secs: u64) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let (status, diff) = s.call(reqwest::Method::GET, "/diff", ADMIN, None).await;
        if status == 200
            && ["missing", "unexpected", "differing"]
                .iter()
                .all(|k| diff[*k] == serde_json::json!([]))
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}; the last /diff ({status}): {diff}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Records stored object versions in the inventory of the data directory
/// [`start`] uses under `dir` (before the server starts: it holds the log),
/// as the recording step would: `(ark, version, file sizes)`, the files
/// `producer/fN`. For tests of requests about stored objects whose content
/// they do not read (the access queue refuses an ark the inventory lacks).
pub fn seed_objects(dir: &Path, objects: &[(&str, u32, &[u64])]) {
    seed_objects_in(dir, "demo", objects);
}

/// [`seed_objects`] into collection `collection`.
pub fn seed_objects_in(dir: &Path, collection: &str, objects: &[(&str, u32, &[u64])]) {
    seed_objects_at(&dir.join("data"), collection, objects);
}

/// [`seed_objects_in`] the data directory `data` itself.
pub fn seed_objects_at(data: &Path, collection: &str, objects: &[(&str, u32, &[u64])]) {
    let log = ingest_events::Log::open(&data.join("log"), &Default::default()).expect("the log");
    let inventory = ingest_engine::objects::open_inventory(&log).expect("the inventory");
    for (ark, version, sizes) in objects {
        let files = sizes
            .iter()
            .enumerate()
            .map(|(n, size)| ingest_protocol::inventory::InventoryFile {
                path: format!("producer/f{n}"),
                size: *size,
                digests: Default::default(),
            })
            .collect();
        inventory
            .record(&ingest_protocol::inventory::ObjectVersionRecord {
                ark: (*ark).to_string(),
                version: *version,
                collection: collection.into(),
                local_ids: Vec::new(),
                files,
                storage_targets: vec!["t1".into()],
                jid: "jid0000000001".into(),
                bid: "bid0000000001".into(),
                recorded_at: chrono::Utc::now(),
                erc: Default::default(),
            })
            .expect("record");
    }
    drop(inventory);
    drop(log); // sled writes its trees out when the last handle goes.
}
