//! Merritt's services writing the projection (issue 23, item 1): a node
//! another ZooKeeper client changed never stops the projector. A real
//! `ingest serve` projects into a real ZooKeeper; an independent client
//! (`tests/interop/merritt_writer.py`, Python kazoo, written from mrt-zk's
//! documented calls) writes the tree as Merritt's services do; the
//! projector converges that item's nodes back to the log, records a
//! `ForeignChangeRepaired` event in its history, counts it in
//! `ingest_projection_foreign_changes_total`, stays ready, and goes on.
//!
//! Before, each of these sequences stopped the projector for the whole queue
//! (`… failed (node not exists) … run ingest diff`, `/readyz`: `projector:
//! stopped`), or (the pause lock) left Merritt's readers seeing a running
//! queue while the engine was paused.

use std::path::{Path, PathBuf};
use std::process::Command as Process;

use reqwest::Method;
use serde_json::{json, Value};

use crate::server::{self, eventually, Server, ADMIN};
use crate::zk_server::{shared, unique_root};

/// A Python with kazoo (the Merritt interop tests' virtual environment).
fn kazoo_python() -> Option<PathBuf> {
    crate::util::venv_python("merritt-interop-venv", "kazoo==2.11.0", "kazoo")
}

/// A server on a fresh root, the writer's Python and a session of the test's own.
struct Rig {
    // Dropped in this order: the server first, then its directory and
    // ZooKeeper.
    s: Server,
    zk: zookeeper_client::Client,
    python: PathBuf,
    root: String,
    _dir: tempfile::TempDir,
    zks: std::sync::Arc<crate::zk_server::ZkServer>,
}

impl Rig {
    /// `None` when kazoo cannot be installed (outside CI; see `venv_python`).
    async fn start(name: &str, daemons: Option<&[&str]>) -> Option<Rig> {
        Rig::start_with(name, daemons, &[]).await
    }

    /// [`Rig::start`] with further `serve` arguments.
    async fn start_with(name: &str, daemons: Option<&[&str]>, args: &[&str]) -> Option<Rig> {
        let python = tokio::task::spawn_blocking(kazoo_python)
            .await
            .expect("the venv task")?;
        let zks = shared();
        let root = unique_root(name);
        let dir = tempfile::tempdir().expect("tempdir");
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        let s = server::start_with(dir.path(), &zks.hosts(), &root, daemons, "simulate", &args);
        let zk = zk_at(&zks.hosts(), &root).await;
        Some(Rig {
            s,
            zk,
            python,
            root,
            _dir: dir,
            zks,
        })
    }
}

impl Rig {
    /// Runs the Merritt-pattern writer on the rig's root; its JSON summary.
    fn write(&self, args: &[&str]) -> Value {
        merritt_write(&self.python, &self.zks.hosts(), &self.root, args)
    }
}

/// Runs the Merritt-pattern writer; its JSON summary.
fn merritt_write(python: &Path, hosts: &str, root: &str, args: &[&str]) -> Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/interop/merritt_writer.py");
    let out = Process::new(python)
        .arg(&script)
        .arg(hosts)
        .arg(root)
        .args(args)
        .output()
        .expect("run the Merritt-pattern writer");
    assert!(
        out.status.success(),
        "the writer failed: {}{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    serde_json::from_slice(&out.stdout).expect("the writer's summary")
}

/// A session on `root` for the test's own reads.
async fn zk_at(hosts: &str, root: &str) -> zookeeper_client::Client {
    zookeeper_client::Client::connect(&format!("{hosts}{root}"))
        .await
        .expect("connect to ZooKeeper")
}

async fn exists(zk: &zookeeper_client::Client, path: &str) -> bool {
    zk.check_stat(path).await.expect("exists").is_some()
}

/// Waits until `/jobs/JID/status` says `status`.
async fn status_node_says(zk: &zookeeper_client::Client, jid: &str, status: &str) {
    let path = format!("/jobs/{jid}/status");
    eventually(&format!("{path} to say {status}"), 30, async || {
        let (data, _) = zk.get_data(&path).await.ok()?;
        let node: Value = serde_json::from_slice(&data).ok()?;
        (node["status"] == status).then_some(())
    })
    .await;
}

/// `/jobs/states/STATE/PP-JID` with the job's projected priority.
async fn queue_ref(zk: &zookeeper_client::Client, state: &str, jid: &str) -> Option<String> {
    let (p, _) = zk.get_data(&format!("/jobs/{jid}/priority")).await.ok()?;
    let p = String::from_utf8_lossy(&p).trim().to_string();
    Some(format!("/jobs/states/{state}/{p:0>2}-{jid}"))
}

/// The jobs of a batch once it is acquired, and each projected.
async fn jobs_of(s: &Server, zk: &zookeeper_client::Client, bid: &str, n: usize) -> Vec<String> {
    let jids: Vec<String> = eventually("the batch's jobs", 30, async || {
        let batch = s.get(&format!("/batches/{bid}")).await;
        let jobs: Vec<String> = batch["jobs"]
            .as_array()?
            .iter()
            .filter_map(|j| j["jid"].as_str().map(str::to_string))
            .collect();
        (jobs.len() == n).then_some(jobs)
    })
    .await;
    for jid in &jids {
        eventually("the job's projection", 30, async || {
            exists(zk, &queue_ref(zk, "pending", jid).await?)
                .await
                .then_some(())
        })
        .await;
    }
    jids
}

async fn admin(s: &Server, method: Method, path: &str, reason: &str) -> Value {
    let (status, body) = s
        .call(method, path, ADMIN, Some(json!({ "reason": reason })))
        .await;
    assert!(status < 300, "{path}: {status} {body}");
    body
}

/// The `ForeignChangeRepaired` rows of a history answer.
fn repairs(history: &Value) -> Vec<Value> {
    history["events"]
        .as_array()
        .map(|rows| {
            rows.iter()
                .filter(|r| r["event"] == "ForeignChangeRepaired")
                .cloned()
                .collect()
        })
        .unwrap_or_default()
}

/// Waits for the item's history to show a repair; its rows.
async fn repaired(s: &Server, history: &str) -> Vec<Value> {
    eventually("the repair in the history", 30, async || {
        let rows = repairs(&s.get(history).await);
        (!rows.is_empty()).then_some(rows)
    })
    .await
}

/// `GET /diff` finds nothing.
async fn assert_converged(s: &Server) {
    let (status, diff) = s.call(Method::GET, "/diff", ADMIN, None).await;
    assert_eq!(status, 200, "{diff}");
    for key in ["missing", "unexpected", "differing"] {
        assert_eq!(diff[key], json!([]), "{diff}");
    }
}

/// `/readyz` says ready, the projector connected.
async fn assert_ready(s: &Server) {
    let (status, body) = s.call(Method::GET, "/readyz", ADMIN, None).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["ready"], true, "{body}");
}

/// The value of `ingest_projection_foreign_changes_total{kind=KIND}`.
async fn foreign_metric(s: &Server, kind: &str) -> u64 {
    let text = reqwest::get(format!("{}/metrics", s.base))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics text");
    let series = format!("ingest_projection_foreign_changes_total{{kind=\"{kind}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&series))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {series} in the metrics:\n{text}"))
}

/// The exact sequence that stopped the projector: mrt-zk's `Job.setStatus`
/// on a pending job (status node rewritten, queue and batch references
/// moved), then an admin hold of that job. The hold's transaction fails on
/// the missing `/jobs/states/pending/05-JID`; the projector converges the
/// job, records it, applies the hold, and a job submitted afterwards is
/// projected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_set_status_then_a_hold_leaves_the_queue_running_and_is_recorded() {
    let Some(r) = Rig::start("foreign-set-status", Some(&["job_pending=off"])).await else {
        return;
    };
    let (s, zk) = (&r.s, &r.zk);
    let bid = s.submit(1).await;
    let jid = jobs_of(s, zk, &bid, 1).await.remove(0);

    let wrote = r.write(&[
        "set-status",
        &jid,
        "Estimating",
        "taken by a Merritt consumer",
    ]);
    assert!(
        wrote["written"]
            .to_string()
            .contains("/jobs/states/estimating/05-"),
        "{wrote}"
    );
    admin(
        s,
        Method::POST,
        &format!("/jobs/{jid}/hold"),
        "check the files",
    )
    .await;

    // The hold reaches the tree, over the converged job.
    status_node_says(zk, &jid, "Held").await;
    assert!(exists(zk, &format!("/jobs/states/held/05-{jid}")).await);
    assert!(!exists(zk, &format!("/jobs/states/estimating/05-{jid}")).await);

    // Recorded in the job's history, naming what was found.
    let rows = repaired(s, &format!("/jobs/{jid}/history")).await;
    let text = Value::Array(rows).to_string();
    for found in [
        format!("missing /jobs/states/pending/05-{jid}"),
        format!("extra /jobs/states/estimating/05-{jid}"),
        format!("changed /jobs/{jid}/status"),
    ] {
        assert!(text.contains(&found), "{found} not in {text}");
    }
    let job = s.get(&format!("/jobs/{jid}")).await;
    assert_eq!(job["status"], "Held", "{job}");

    // The queue keeps running: a batch submitted afterwards is projected.
    let later = s.submit(1).await;
    jobs_of(s, zk, &later, 1).await;
    assert_converged(s).await;
    assert_ready(s).await;
    for kind in ["missing", "changed", "extra"] {
        assert!(foreign_metric(s, kind).await >= 1, "{kind}");
    }
}

/// A batch's state child deleted by another client (as mrt-zk's delete
/// helpers remove them): the admin delete of that job fails on it, the job's
/// nodes are converged and recorded, and the delete goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_batch_state_child_is_restored_recorded_and_the_delete_applied() {
    let Some(r) = Rig::start("foreign-batch-child", Some(&["job_pending=off"])).await else {
        return;
    };
    let (s, zk) = (&r.s, &r.zk);
    let bid = s.submit(2).await;
    let jids = jobs_of(s, zk, &bid, 2).await;
    let jid = &jids[0];
    admin(
        s,
        Method::POST,
        &format!("/jobs/{jid}/hold"),
        "wrong object",
    )
    .await;
    eventually("the hold in the tree", 30, async || {
        exists(zk, &queue_ref(zk, "held", jid).await?)
            .await
            .then_some(())
    })
    .await;

    let child = format!("/batches/{bid}/states/batch-processing/{jid}");
    r.write(&["delete", &child]);
    assert!(!exists(zk, &child).await);
    admin(s, Method::DELETE, &format!("/jobs/{jid}"), "withdrawn").await;

    let deleted = format!("/batches/{bid}/states/batch-deleted/{jid}");
    eventually("the delete in the tree", 30, async || {
        exists(zk, &deleted).await.then_some(())
    })
    .await;
    let rows = repaired(s, &format!("/jobs/{jid}/history")).await;
    let text = Value::Array(rows).to_string();
    assert!(text.contains(&format!("missing {child}")), "{text}");
    assert_converged(s).await;
    assert_ready(s).await;
    assert!(foreign_metric(s, "missing").await >= 1);
}

/// mrt-zk's `unlockIngestQueue` deletes the engine's pause node: Merritt's
/// readers would see a running queue while the engine is paused. The
/// projector watches the pause and hold locks: the node comes back at once
/// and the repair is recorded (on the system stream).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_lock_deleted_by_unlock_ingest_queue_is_projected_again_and_recorded() {
    let Some(r) = Rig::start("foreign-pause", None).await else {
        return;
    };
    let (s, zk) = (&r.s, &r.zk);
    admin(s, Method::POST, "/queue/pause", "storage maintenance").await;
    eventually("the pause lock", 30, async || {
        exists(zk, "/locks/queue/ingest").await.then_some(())
    })
    .await;

    r.write(&["delete", "/locks/queue/ingest"]);
    eventually("the pause lock projected again", 30, async || {
        exists(zk, "/locks/queue/ingest").await.then_some(())
    })
    .await;
    let rows = repaired(s, "/history?actor=engine").await;
    let text = Value::Array(rows).to_string();
    assert!(text.contains("missing /locks/queue/ingest"), "{text}");
    let queue = s.get("/queue").await;
    assert_eq!(queue["paused"], true, "{queue}");
    assert_converged(s).await;
    assert_ready(s).await;
    assert!(foreign_metric(s, "missing").await >= 1);

    // The engine's own resume still applies (the node is the log's again).
    admin(s, Method::POST, "/queue/resume", "done").await;
    eventually("the pause lock removed", 30, async || {
        (!exists(zk, "/locks/queue/ingest").await).then_some(())
    })
    .await;
    assert_converged(s).await;
}

/// Adoption mode (`--foreign-writes adopt`, issue 23 item 2): mrt-zk's
/// `setStatus` of a pending job to Estimating is a legal move, so it becomes
/// the engine's own `JobStatusChanged`, decided like an API call and
/// recorded with the ZooKeeper client as actor; the tree converges to it
/// (queue references completed) without a revert. A skipped state
/// (Estimating → Completed) is refused by the lifecycle: reverted and
/// recorded, the job stays where the log has it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adoption_mode_turns_a_legal_foreign_set_status_into_an_event_and_reverts_an_illegal_one() {
    let Some(r) = Rig::start_with(
        "foreign-adopt",
        Some(&["job_pending=off", "estimating=off"]),
        &["--foreign-writes", "adopt"],
    )
    .await
    else {
        return;
    };
    let (s, zk) = (&r.s, &r.zk);
    let bid = s.submit(1).await;
    let jid = jobs_of(s, zk, &bid, 1).await.remove(0);

    r.write(&[
        "set-status",
        &jid,
        "Estimating",
        "taken by a Merritt consumer",
    ]);
    let history = eventually("the adopted move", 30, async || {
        let job = s.get(&format!("/jobs/{jid}")).await;
        (job["status"] == "Estimating").then_some(())?;
        Some(s.get(&format!("/jobs/{jid}/history")).await)
    })
    .await;
    let moved: Vec<&Value> = history["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter(|r| r["event"] == "JobStatusChanged")
        .collect();
    assert_eq!(moved.len(), 1, "{history}");
    assert!(
        moved[0]["actor"]
            .as_str()
            .is_some_and(|a| a.starts_with("worker:zk-")),
        "the ZooKeeper client is the actor: {history}"
    );
    assert!(
        moved[0]["detail"]
            .as_str()
            .is_some_and(|d| d.contains("taken by a Merritt consumer")),
        "{history}"
    );
    assert!(
        repairs(&history).is_empty(),
        "adopted, not reverted: {history}"
    );
    eventually("the tree converged to the adopted move", 30, async || {
        let (status, diff) = s.call(Method::GET, "/diff", ADMIN, None).await;
        (status == 200
            && ["missing", "unexpected", "differing"]
                .iter()
                .all(|k| diff[*k] == json!([])))
        .then_some(())
    })
    .await;
    assert!(
        exists(
            zk,
            &queue_ref(zk, "estimating", &jid).await.expect("priority")
        )
        .await
    );

    // A skipped state: refused by the lifecycle, reverted and recorded.
    r.write(&["set-status", &jid, "Completed", "done, says Merritt"]);
    let rows = repaired(s, &format!("/jobs/{jid}/history")).await;
    let text = Value::Array(rows).to_string();
    assert!(
        text.contains("adoption refused Estimating -> Completed"),
        "{text}"
    );
    let job = s.get(&format!("/jobs/{jid}")).await;
    assert_eq!(job["status"], "Estimating", "{job}");
    status_node_says(zk, &jid, "Estimating").await;
    assert_converged(s).await;
    assert_ready(s).await;
}
