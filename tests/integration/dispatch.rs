//! Dispatch (issue 10) against a real ZooKeeper and a real `ingest serve`
//! without in-process daemons: the worker under test is the library
//! `ingest worker` runs, so its counters can be read.
//!
//! - one worker running every daemon chains a job from Pending to Completed
//!   under ONE job lock, and the history still shows every transition;
//! - a chained step runs in a task of its own state's daemon, so a worker
//!   with one job_pending task still has several jobs in its later steps;
//! - a batch of a held collection at the head of the queue does not keep a
//!   later batch of another collection Pending;
//! - a report with the lock's session but without its secret is refused
//!   with 409, appends nothing, and the refusal does not name the holder.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use ingest_config::DaemonKind;
use ingest_projections::ZkConfig;
use ingest_protocol::fence::{FenceSecret, LockNode, FENCE_HEADER};
use ingest_worker::step::{FixedProbe, SimSettings, Steps};
use ingest_worker::{WorkerOptions, Workers};
use serde_json::{json, Value};
use zookeeper_client as zk;

use crate::server::{eventually, start, Server, ADMIN, DEPOSITOR, WORKER};
use crate::zk_server::{shared, unique_root};

/// Submits a batch of `jobs` manifest lines to collection `profile`.
async fn submit_to(s: &Server, profile: &str, jobs: usize) -> String {
    let (status, body) = s
        .call(
            reqwest::Method::POST,
            "/batches",
            DEPOSITOR,
            Some(json!({
                "submitter": "alice",
                "profile": profile,
                "type": "object-manifest",
                "payload_url": "https://example.org/batch.checkm",
                "manifest": (0..jobs).map(|i| format!("https://example.org/{i}.txt loc{i}")).collect::<Vec<_>>(),
            })),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    body["bid"].as_str().expect("bid").to_string()
}

async fn batch_in(s: &Server, bid: &str, status: &str, secs: u64) -> Value {
    eventually(&format!("batch {bid} to be {status}"), secs, async || {
        let batch = s.get(&format!("/batches/{bid}")).await;
        (batch["status"] == status).then_some(batch)
    })
    .await
}

/// A worker running every daemon with one task each.
fn every_daemon(s: &Server, hosts: &str, root: &str, dir: &std::path::Path) -> Workers {
    daemons_with(s, hosts, root, dir, |_| 1, Duration::ZERO)
}

/// A worker running every daemon with `tasks(daemon)` tasks, its simulated
/// steps taking `step` each.
fn daemons_with(
    s: &Server,
    hosts: &str,
    root: &str,
    dir: &std::path::Path,
    tasks: impl Fn(DaemonKind) -> u32,
    step: Duration,
) -> Workers {
    Workers::start(WorkerOptions {
        engine: s.base.clone(),
        token: WORKER.into(),
        zk: ZkConfig::new(hosts).with_root(root),
        name: "chain".into(),
        daemons: DaemonKind::ALL.iter().map(|k| (*k, tasks(*k))).collect(),
        steps: Steps::simulated(
            SimSettings {
                duration: step,
                ..SimSettings::default()
            },
            Some(5),
            Arc::new(FixedProbe::new(0.0)),
            70.0,
            dir.to_path_buf(),
        ),
    })
    .expect("start the worker")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_worker_takes_a_job_from_pending_to_completed_under_one_lock() {
    let zk_server = shared();
    let hosts = zk_server.hosts();
    let root = unique_root("dispatch-chain");
    let dir = tempfile::tempdir().expect("tempdir");
    let s = start(dir.path(), &hosts, &root, None);
    let workers = every_daemon(&s, &hosts, &root, dir.path());
    let bid = submit_to(&s, "demo", 1).await;
    let batch = batch_in(&s, &bid, "Completed", 60).await;
    let jid = batch["successful_jobs"][0]
        .as_str()
        .expect("a successful job")
        .to_string();
    let stats = workers.stats();
    workers.shutdown().await;
    // Every transition is its own event, made once...
    s.assert_walked_once(&jid).await;
    // ...under one lock: 8 steps, 7 of them chained to the one before.
    assert_eq!(
        stats.job_locks.load(Ordering::Relaxed),
        1,
        "job locks taken"
    );
    assert_eq!(stats.chained.load(Ordering::Relaxed), 7, "steps chained");
    // Each chained step ran in a task of its own state's daemon (their
    // inboxes were empty).
    assert_eq!(
        stats.handoffs.load(Ordering::Relaxed),
        7,
        "steps handed off"
    );
    // The batch was reported because the answer to its last job's report
    // said it entered Reporting, not found by scanning every batch.
    assert_eq!(
        stats.named_reports.load(Ordering::Relaxed),
        1,
        "batches reported from answers"
    );
}

/// Regression: a chain ran wholly in the job_pending task that took the
/// job, so a worker's job_pending tasks bounded the jobs in its whole
/// pipeline (real ingest reached 0.16 of curl with 4). Now each chained
/// step is handed to a task of its state's daemon: with ONE job_pending
/// task and four of every other daemon, several jobs are in later steps
/// at once, and each job still takes one lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_chain_goes_on_in_the_next_daemons_tasks_not_in_the_pending_task() {
    let zk_server = shared();
    let hosts = zk_server.hosts();
    let root = unique_root("dispatch-handoff");
    let dir = tempfile::tempdir().expect("tempdir");
    let s = start(dir.path(), &hosts, &root, None);
    let jobs = 8;
    let bid = submit_to(&s, "demo", jobs).await;
    let workers = daemons_with(
        &s,
        &hosts,
        &root,
        dir.path(),
        |k| if k == DaemonKind::JobPending { 1 } else { 4 },
        Duration::from_millis(150),
    );
    let batch = batch_in(&s, &bid, "Completed", 120).await;
    assert_eq!(
        batch["successful_jobs"].as_array().map(Vec::len),
        Some(jobs),
        "{batch}"
    );
    let stats = workers.stats();
    workers.shutdown().await;
    let peak = stats.peak_in_flight.load(Ordering::Relaxed);
    assert!(
        peak > 1,
        "one job_pending task kept one job at a time in the steps (peak {peak})"
    );
    assert_eq!(
        stats.job_locks.load(Ordering::Relaxed),
        u64::try_from(jobs).expect("jobs"),
        "one lock per job"
    );
    assert!(stats.handoffs.load(Ordering::Relaxed) > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_held_collection_at_the_head_does_not_keep_other_batches_pending() {
    let zk_server = shared();
    let hosts = zk_server.hosts();
    let root = unique_root("dispatch-held");
    let dir = tempfile::tempdir().expect("tempdir");
    let s = start(dir.path(), &hosts, &root, None);
    let (status, body) = s
        .call(
            reqwest::Method::POST,
            "/collections/held/hold",
            ADMIN,
            Some(json!({"reason": "routine hold"})),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    // The held collection's batches come first in the queue.
    let held: Vec<String> =
        futures::future::join_all((0..3).map(|_| submit_to(&s, "held", 2))).await;
    let later = submit_to(&s, "demo", 2).await;
    let workers = every_daemon(&s, &hosts, &root, dir.path());
    batch_in(&s, &later, "Completed", 60).await;
    for bid in &held {
        let batch = s.get(&format!("/batches/{bid}")).await;
        assert!(
            batch["status"] == "Pending" || batch["status"] == "Held",
            "a batch of a held collection moved on: {batch}"
        );
    }
    workers.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_report_without_the_lock_holders_secret_is_refused_and_names_nobody() {
    let zk_server = shared();
    let hosts = zk_server.hosts();
    let root = unique_root("dispatch-fence");
    let dir = tempfile::tempdir().expect("tempdir");
    let s = start(dir.path(), &hosts, &root, None);
    let bid = submit_to(&s, "demo", 1).await;
    let client = zk::Client::connect(&format!("{hosts}{root}"))
        .await
        .expect("zookeeper");
    eventually("the batch projected", 30, async || {
        client
            .check_stat(&format!("/batches/{bid}/status"))
            .await
            .ok()
            .flatten()
    })
    .await;
    // The holder: a session with a lock whose data holds its secret's
    // digest, as an `ingest worker` takes it.
    let secret = FenceSecret::from_bytes([42; 32]);
    let ephemeral = zk::CreateMode::Ephemeral.with_acls(zk::Acls::anyone_all());
    let lock = format!("/batches/{bid}/lock");
    client
        .create(
            &lock,
            &LockNode::new("holder", &secret).to_bytes(),
            &ephemeral,
        )
        .await
        .expect("lock");
    let session = client.session_id().0;
    let acquire = |claimed: i64, fence: Option<String>| {
        let http = reqwest::Client::new();
        let url = format!("{}/batches/{bid}/acquire", s.base);
        async move {
            let mut req = http
                .post(url)
                .bearer_auth(WORKER)
                .json(&json!({"worker": "forger", "session_id": claimed}));
            if let Some(f) = fence {
                req = req.header(FENCE_HEADER, f);
            }
            let resp = req.send().await.expect("send");
            (resp.status().as_u16(), resp.text().await.expect("text"))
        }
    };
    // A wrong session: the refusal does not name the one that holds it
    // (before, it did, and a second try naming it was accepted).
    let (status, text) = acquire(0x5151, Some(secret.to_header())).await;
    assert_eq!(status, 409, "{text}");
    assert!(text.contains("lock_not_held"), "{text}");
    assert!(
        !text.contains(&format!("{session:x}")) && !text.contains(&session.to_string()),
        "the refusal names the holder's session: {text}"
    );
    // The holder's session (anyone can read a node's owner) without the
    // secret: no secret, another secret, or the digest the node shows.
    for fence in [
        None,
        Some(FenceSecret::from_bytes([7; 32]).to_header()),
        Some(secret.digest()),
    ] {
        let (status, text) = acquire(session, fence).await;
        assert_eq!(status, 409, "{text}");
        assert!(text.contains("lock_not_held"), "{text}");
    }
    let batch = s.get(&format!("/batches/{bid}")).await;
    assert_eq!(
        batch["status"], "Pending",
        "a refused acquire changed nothing"
    );
    // The holder's own report, with its secret, is accepted.
    let (status, text) = acquire(session, Some(secret.to_header())).await;
    assert_eq!(status, 200, "{text}");
}

/// `tools/zk-op-count`, the proxy the request counts of issue 10 come from,
/// counts a ZooKeeper client's requests by operation: one session's known
/// requests through it (a create, three reads, two existence checks, a
/// delete) show up as such, and a four-letter word is named, not decoded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zk_op_count_counts_a_sessions_requests_by_operation() {
    let zk_server = shared();
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("ops.json");
    let (mut proxy, through) = op_counter(&zk_server.hosts(), &out);
    {
        let client = zk::Client::connect(&through)
            .await
            .expect("connect through the proxy");
        let path = unique_root("op-count");
        client
            .create(
                &path,
                b"x",
                &zk::CreateMode::Ephemeral.with_acls(zk::Acls::anyone_all()),
            )
            .await
            .expect("create");
        for _ in 0..3 {
            client.get_data(&path).await.expect("read");
        }
        for _ in 0..2 {
            client.check_stat(&path).await.expect("exists");
        }
        client.delete(&path, None).await.expect("delete");
    }
    {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(&through)
            .await
            .expect("connect");
        s.write_all(b"ruok").await.expect("ask");
        let mut answer = String::new();
        let _ = s.read_to_string(&mut answer).await;
    }
    let counted = eventually("the counts", 30, async || {
        let text = std::fs::read_to_string(&out).ok()?;
        let v: Value = serde_json::from_str(&text).ok()?;
        (v.as_array()?.len() == 2 && v[0]["ops"]["delete"] == 1).then_some(v)
    })
    .await;
    stop_op_counter(&mut proxy);
    let ops = &counted[0]["ops"];
    assert_eq!(
        ops["create2"].as_u64().or(ops["create"].as_u64()),
        Some(1),
        "{counted}"
    );
    assert_eq!(ops["getData"], 3, "{counted}");
    assert_eq!(ops["exists"], 2, "{counted}");
    assert_eq!(ops["delete"], 1, "{counted}");
    assert_eq!(counted[1]["ops"]["four-letter word ruok"], 1, "{counted}");
    assert_eq!(counted[1]["requests"], 0, "{counted}");
}

/// Starts `tools/zk-op-count` in front of ZooKeeper at `hosts`, writing its
/// counts to `out`; returns the process and the address to connect to.
pub(crate) fn op_counter(hosts: &str, out: &std::path::Path) -> (std::process::Child, String) {
    use std::io::{BufRead, BufReader};
    let tool = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/zk-op-count");
    let mut proxy = std::process::Command::new(tool)
        .arg("0")
        .arg(hosts)
        .arg(out)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start tools/zk-op-count");
    let mut banner = String::new();
    BufReader::new(proxy.stderr.take().expect("stderr"))
        .read_line(&mut banner)
        .expect("the proxy's first line");
    let port = banner
        .split("127.0.0.1:")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no port in {banner:?}"))
        .to_string();
    (proxy, format!("127.0.0.1:{port}"))
}

/// Stops an [`op_counter`] (SIGINT: it writes its counts once more).
pub(crate) fn stop_op_counter(proxy: &mut std::process::Child) {
    assert!(std::process::Command::new("kill")
        .args(["-INT", &proxy.id().to_string()])
        .status()
        .expect("kill")
        .success());
    let _ = proxy.wait();
}

/// Issue 10: a worker keeps a watcher it no longer waits on until it fires
/// (`session::park`) instead of dropping it, which costs a `removeWatches`
/// request. An `ingest worker` process walks 100 jobs with its ZooKeeper
/// session counted by `tools/zk-op-count`: it sent 132 `removeWatches` for
/// them when it dropped such watchers (the wait for the projection at a
/// chain's end found the status already moved), about 20 now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_does_not_remove_the_watches_it_stops_waiting_on() {
    const JOBS: usize = 100;
    let zk_server = shared();
    let hosts = zk_server.hosts();
    let root = unique_root("parked-watches");
    let dir = tempfile::tempdir().expect("tempdir");
    let off: Vec<String> = crate::worker::ALL_DAEMONS
        .split(',')
        .map(|d| format!("{d}=off"))
        .collect();
    let off: Vec<&str> = off.iter().map(String::as_str).collect();
    let s = start(dir.path(), &hosts, &root, Some(&off));
    let out = dir.path().join("ops.json");
    let (mut proxy, through) = op_counter(&hosts, &out);
    let mut worker = std::process::Command::new(crate::util::ingest_bin())
        .args([
            "worker",
            "--engine",
            &s.base,
            "--zk",
            &through,
            "--zk-root",
            &root,
        ])
        .args(["--daemons", crate::worker::ALL_DAEMONS, "--name", "parker"])
        .args(["--provisioning-threshold", "100", "--working-storage"])
        .arg(dir.path().join("work"))
        .env("INGEST_WORKER_TOKEN", WORKER)
        .env_remove("INGEST_DATA_DIR")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start ingest worker");
    let bid = s.submit(JOBS).await;
    eventually("the batch to complete", 90, async || {
        let batch = s.get(&format!("/batches/{bid}")).await;
        (batch["status"] == "Completed").then_some(())
    })
    .await;
    // The proxy writes its counts every second: read the first counts it
    // wrote after the batch completed, while the worker still runs (its exit
    // drops what is parked).
    let completed = std::time::SystemTime::now();
    let counted: Value = eventually("the proxy's counts after completion", 30, async || {
        let written = std::fs::metadata(&out).and_then(|m| m.modified()).ok()?;
        if written <= completed {
            return None;
        }
        serde_json::from_str(&std::fs::read_to_string(&out).ok()?).ok()
    })
    .await;
    let _ = worker.kill();
    let _ = worker.wait();
    stop_op_counter(&mut proxy);
    let sum = |op: &str| -> u64 {
        counted
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c["ops"][op].as_u64())
            .sum()
    };
    assert!(
        sum("getData") > JOBS as u64,
        "the worker's session went through the proxy: {counted}"
    );
    let removed = sum("removeWatches");
    assert!(
        removed < (JOBS / 2) as u64,
        "{removed} removeWatches for {JOBS} jobs: watchers are dropped, not parked: {counted}"
    );
}
