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

use crate::server::{self, eventually, Server, ADMIN, WALK};
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
        Rig::start_seeded(name, daemons, args, &[]).await
    }

    /// [`Rig::start_with`] on a data directory holding these stored
    /// objects (for access requests; see `server::seed_objects`).
    async fn start_seeded(
        name: &str,
        daemons: Option<&[&str]>,
        args: &[&str],
        objects: &[(&str, u32, &[u64])],
    ) -> Option<Rig> {
        let python = tokio::task::spawn_blocking(kazoo_python)
            .await
            .expect("the venv task")?;
        let zks = shared();
        let root = unique_root(name);
        let dir = tempfile::tempdir().expect("tempdir");
        if !objects.is_empty() {
            server::seed_objects(dir.path(), objects);
        }
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
    /// A rig in adoption mode with no job daemon ([`NO_JOB_DAEMONS`]) and
    /// a batch of `jobs` jobs, acquired and projected: its jobs.
    async fn adopting(name: &str, jobs: usize) -> Option<(Rig, Vec<String>)> {
        let r =
            Rig::start_with(name, Some(&NO_JOB_DAEMONS), &["--foreign-writes", "adopt"]).await?;
        let bid = r.s.submit(jobs).await;
        let jids = jobs_of(&r.s, &r.zk, &bid, jobs).await;
        Some((r, jids))
    }

    /// A rig in adoption mode with no daemon that moves batches or jobs
    /// (not even `batch_pending`): Merritt's consumers do it all.
    async fn adopting_alone(name: &str) -> Option<Rig> {
        let mut daemons = NO_JOB_DAEMONS.to_vec();
        daemons.push("batch_pending=off");
        Rig::start_with(name, Some(&daemons), &["--foreign-writes", "adopt"]).await
    }

    /// Submits a batch through the API and waits until it is in the tree:
    /// the projector is then leading with its adoption watches set (a
    /// write made before them is not seen as it happens).
    /// A rig in adoption mode with no job or access daemon, one object
    /// (`ark:/99999/fk4x`) stored, and a batch projected.
    async fn adopting_access(name: &str) -> Option<Rig> {
        let mut daemons = NO_JOB_DAEMONS.to_vec();
        daemons.extend(["access_small=off", "access_large=off"]);
        let r = Rig::start_seeded(
            name,
            Some(&daemons),
            &["--foreign-writes", "adopt"],
            &[("ark:/99999/fk4x", 1, &[1])],
        )
        .await?;
        r.projected_batch().await;
        Some(r)
    }

    /// An access request for `ark:/99999/fk4x` through `POST /access`,
    /// projected Pending in the small queue: its id.
    async fn access_request(&self) -> String {
        let (code, answer) = self
            .s
            .call(
                Method::POST,
                "/access",
                crate::server::DEPOSITOR,
                Some(json!({"ark": "ark:/99999/fk4x"})),
            )
            .await;
        assert_eq!(code, 201, "{answer}");
        let qid = answer["request"]["qid"].as_str().expect("qid").to_string();
        access_node_says(&self.zk, &qid, "Pending").await;
        qid
    }

    async fn projected_batch(&self) -> String {
        let bid = self.s.submit(1).await;
        let path = format!("/batches/{bid}");
        eventually(&format!("{path} projected"), 30, async || {
            exists(&self.zk, &path).await.then_some(())
        })
        .await;
        bid
    }

    /// Runs the Merritt-pattern writer on the rig's root; its JSON summary.
    fn write(&self, args: &[&str]) -> Value {
        merritt_write(&self.python, &self.zks.hosts(), &self.root, args)
    }

    /// [`Rig::write`] with `MERRITT_DELETE_PAUSE` set (seconds).
    fn write_paced(&self, pause: &str, args: &[&str]) -> Value {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/interop/merritt_writer.py");
        let out = Process::new(&self.python)
            .arg(&script)
            .arg(self.zks.hosts())
            .arg(&self.root)
            .args(args)
            .env("MERRITT_DELETE_PAUSE", pause)
            .output()
            .expect("run the Merritt-pattern writer");
        assert!(out.status.success(), "{out:?}");
        serde_json::from_slice(&out.stdout).expect("the writer's summary")
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

/// Adoption mode (`--foreign-writes adopt`, issue 23 item 2): a Merritt
/// daemon's acquisition of a pending job (its lock, then `setStatus` to
/// Estimating) is a legal move, so it becomes the engine's own
/// acquisition, decided like an API call and recorded with the ZooKeeper
/// session as actor; the tree converges to it (queue references completed)
/// without a revert. A skipped state (Estimating → Completed) under the
/// lock is refused by the lifecycle; a legal move written without the lock
/// is refused too: each is reverted and recorded, the job stays where the
/// log has it, and the other job of the batch does not move.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adoption_mode_turns_a_legal_foreign_set_status_into_an_event_and_reverts_an_illegal_one() {
    let Some((r, jids)) = Rig::adopting("foreign-adopt", 2).await else {
        return;
    };
    let (s, zk) = (&r.s, &r.zk);
    let (jid, other) = (&jids[0], &jids[1]);

    let summary = r.write(&["step", jid, "Estimating", "taken by a Merritt consumer"]);
    let session = summary["session"].as_str().expect("session");
    let history = eventually("the adopted move", 30, async || {
        let job = s.get(&format!("/jobs/{jid}")).await;
        (job["status"] == "Estimating").then_some(())?;
        Some(s.get(&format!("/jobs/{jid}/history")).await)
    })
    .await;
    let moved = moves(s, jid).await;
    assert_eq!(
        moved,
        vec![(
            "Pending -> Estimating".to_string(),
            format!("worker:zk-session-{session}")
        )],
        "{history}"
    );
    assert!(
        repairs(&history).is_empty(),
        "adopted, not reverted: {history}"
    );
    converged(s).await;
    assert!(
        exists(
            zk,
            &queue_ref(zk, "estimating", jid).await.expect("priority")
        )
        .await
    );

    // A skipped state under the lock: refused by the lifecycle, reverted
    // and recorded.
    r.write(&["step", jid, "Completed", "done, says Merritt"]);
    let rows = repaired(s, &format!("/jobs/{jid}/history")).await;
    let text = Value::Array(rows).to_string();
    assert!(
        text.contains("adoption refused Estimating -> Completed"),
        "{text}"
    );
    status_node_says(zk, jid, "Estimating").await;
    converged(s).await;

    // A legal move written without the lock: refused, reverted, recorded.
    r.write(&["set-status", jid, "Provisioning", "no lock taken"]);
    eventually("the unlocked write refused", 30, async || {
        let rows = repairs(&s.get(&format!("/jobs/{jid}/history")).await);
        Value::Array(rows)
            .to_string()
            .contains("adoption refused Estimating -> Provisioning: written while no session held")
            .then_some(())
    })
    .await;
    status_node_says(zk, jid, "Estimating").await;
    converged(s).await;
    let job = s.get(&format!("/jobs/{jid}")).await;
    assert_eq!(job["status"], "Estimating", "{job}");
    // Nothing else moved.
    let job = s.get(&format!("/jobs/{other}")).await;
    assert_eq!(job["status"], "Pending", "{job}");
    assert!(moves(s, other).await.is_empty());
    assert_ready(s).await;
}

/// Adoption mode: a Merritt daemon's acquisition while the queue is paused
/// (mrt-zk's `acquireJob` does not look at `/locks/queue/ingest`) is
/// refused as the engine refuses a start, reverted and recorded; the job
/// is still pending and acquired after the resume.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adoption_mode_reverts_an_acquisition_while_the_queue_is_paused() {
    let Some((r, mut jids)) = Rig::adopting("foreign-adopt-paused", 1).await else {
        return;
    };
    let (s, zk) = (&r.s, &r.zk);
    let jid = jids.remove(0);
    admin(s, Method::POST, "/queue/pause", "storage maintenance").await;
    eventually("the pause lock", 30, async || {
        exists(zk, "/locks/queue/ingest").await.then_some(())
    })
    .await;

    r.write(&["step", &jid, "Estimating", "taken while paused"]);
    let rows = repaired(s, &format!("/jobs/{jid}/history")).await;
    let text = Value::Array(rows).to_string();
    assert!(
        text.contains("adoption refused Pending -> Estimating") && text.contains("paused"),
        "{text}"
    );
    status_node_says(zk, &jid, "Pending").await;
    converged(s).await;
    assert!(moves(s, &jid).await.is_empty());
    assert_eq!(s.get("/queue").await["paused"], true);

    admin(s, Method::POST, "/queue/resume", "done").await;
    converged(s).await;
    let summary = r.write(&["step", &jid, "Estimating", "taken after the resume"]);
    let session = summary["session"].as_str().expect("session");
    eventually("the acquisition after the resume", 30, async || {
        let m = moves(s, &jid).await;
        (m == vec![(
            "Pending -> Estimating".to_string(),
            format!("worker:zk-session-{session}"),
        )])
        .then_some(())
    })
    .await;
    converged(s).await;
}

/// The job daemons of `ingest serve`, all off: only the Merritt-pattern
/// client moves jobs (the batch daemons still acquire and report).
const NO_JOB_DAEMONS: [&str; 8] = [
    "job_pending=off",
    "estimating=off",
    "provisioning=off",
    "downloading=off",
    "processing=off",
    "storing=off",
    "recording=off",
    "notify=off",
];

/// The moves (`FROM -> TO`) and their actors in a job's history.
async fn moves(s: &Server, jid: &str) -> Vec<(String, String)> {
    let history = s.get(&format!("/jobs/{jid}/history")).await;
    history["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter(|r| r["event"] == "JobStatusChanged")
        .map(|r| {
            let detail = r["detail"].as_str().unwrap_or("");
            let mut words = detail.split_whitespace();
            let (from, to) = (words.next(), words.nth(1));
            (
                format!("{} -> {}", from.unwrap_or("?"), to.unwrap_or("?")),
                r["actor"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

/// `GET /diff` finds nothing, once the projector has written what the log
/// holds.
async fn converged(s: &Server) {
    server::until_no_drift(s, "the tree converged to the log", 30).await;
}

/// Issue 23, adoption mode: a job walked Pending → Completed entirely by
/// the Merritt-pattern client, one session per state as Merritt's daemons
/// do (lock, load, `setStatus` with mrt-zk's JSON, unlock), has the same
/// moves in the log as a job walked by `ingest worker` (the server's own
/// daemons, started afterwards on the same log), each move's actor naming
/// the session that made it; the acquisition is the engine's own
/// (`StartJob`); no write is reverted; `ingest diff` is clean after each
/// state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_walked_by_the_merritt_client_in_adoption_mode_has_the_workers_history() {
    let Some((mut r, jids)) = Rig::adopting("foreign-walk", 2).await else {
        return;
    };
    let (merritt, ours) = (&jids[0], &jids[1]);

    let mut sessions = Vec::new();
    for (i, to) in WALK[1..].iter().chain(["Completed"].iter()).enumerate() {
        let summary = r.write(&["step", merritt, to, &format!("step {i} by Merritt")]);
        let session = summary["session"].as_str().expect("session").to_string();
        sessions.push(session);
        eventually(&format!("{merritt} adopted in {to}"), 30, async || {
            let job = r.s.get(&format!("/jobs/{merritt}")).await;
            (job["status"] == *to).then_some(())
        })
        .await;
        converged(&r.s).await;
    }
    let history = r.s.get(&format!("/jobs/{merritt}/history")).await;
    assert!(repairs(&history).is_empty(), "nothing reverted: {history}");
    let walked = moves(&r.s, merritt).await;
    for ((_, actor), session) in walked.iter().zip(&sessions) {
        assert_eq!(actor, &format!("worker:zk-session-{session}"), "{history}");
    }
    assert_eq!(walked.len(), sessions.len(), "{history}");
    r.s.assert_walked_once(merritt).await;

    // The same walk by `ingest worker`: the server's own daemons, on the
    // same log, still in adoption mode.
    r.s.terminate(30).await;
    r.s = server::start_with(
        r._dir.path(),
        &r.zks.hosts(),
        &r.root,
        Some(&[]),
        "simulate",
        &["--foreign-writes".to_string(), "adopt".to_string()],
    );
    eventually(&format!("{ours} walked by the worker"), 60, async || {
        let job = r.s.get(&format!("/jobs/{ours}")).await;
        (job["status"] == "Completed").then_some(())
    })
    .await;
    let by_worker = moves(&r.s, ours).await;
    let transitions = |m: &[(String, String)]| m.iter().map(|(t, _)| t.clone()).collect::<Vec<_>>();
    assert_eq!(transitions(&walked), transitions(&by_worker));
    converged(&r.s).await;
    assert_ready(&r.s).await;
}

/// Adoption mode: a status written to a job whose lock an `ingest worker`
/// holds (the server's own daemon, in a long estimating step) is another
/// client's change to a held job: refused without asking the engine,
/// reverted and recorded; the worker keeps the job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adoption_mode_reverts_a_status_written_to_a_job_an_ingest_worker_holds() {
    let Some(r) = Rig::start_with(
        "foreign-adopt-held",
        Some(&[]),
        &["--foreign-writes", "adopt", "--step-ms", "600000"],
    )
    .await
    else {
        return;
    };
    let (s, zk) = (&r.s, &r.zk);
    let bid = s.submit(1).await;
    let jid: String = eventually("the job in its estimating step", 30, async || {
        let batch = s.get(&format!("/batches/{bid}")).await;
        let jid = batch["jobs"][0]["jid"].as_str()?.to_string();
        let job = s.get(&format!("/jobs/{jid}")).await;
        (job["status"] == "Estimating" && exists(zk, &format!("/jobs/{jid}/lock")).await)
            .then_some(jid)
    })
    .await;
    converged(s).await;

    r.write(&["set-status", &jid, "Provisioning", "not the holder"]);
    let rows = repaired(s, &format!("/jobs/{jid}/history")).await;
    let text = Value::Array(rows).to_string();
    assert!(
        text.contains("adoption refused Estimating -> Provisioning")
            && text.contains("is held by the ingest worker of session"),
        "{text}"
    );
    status_node_says(zk, &jid, "Estimating").await;
    converged(s).await;
    let job = s.get(&format!("/jobs/{jid}")).await;
    assert_eq!(job["status"], "Estimating", "{job}");
    assert!(exists(zk, &format!("/jobs/{jid}/lock")).await);
}

/// Adoption mode: the pause and hold lock nodes Merritt's admin tool makes
/// through mrt-zk (`lockIngestQueue`, `lockCollection`, and their unlocks)
/// become the engine's own pause, resume, hold and release, recorded with
/// the ZooKeeper client as an admin actor, instead of being reverted; a
/// Merritt acquisition under the adopted pause is refused; the tree stays
/// converged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adoption_mode_turns_merritt_pause_and_hold_locks_into_the_engines_own() {
    let Some((r, mut jids)) = Rig::adopting("foreign-adopt-locks", 1).await else {
        return;
    };
    let (s, zk) = (&r.s, &r.zk);
    let jid = jids.remove(0);

    r.write(&["create", "/locks/queue/ingest"]);
    eventually("the queue paused by the lock node", 30, async || {
        (s.get("/queue").await["paused"] == true).then_some(())
    })
    .await;
    let history = s.get("/history").await;
    assert!(
        history.to_string().contains("admin:zk-zxid-0x"),
        "the pause names the ZooKeeper client: {history}"
    );
    converged(s).await;
    assert!(exists(zk, "/locks/queue/ingest").await);

    // The adopted pause holds: a Merritt acquisition is refused.
    r.write(&["step", &jid, "Estimating", "taken while paused"]);
    let rows = repaired(s, &format!("/jobs/{jid}/history")).await;
    assert!(Value::Array(rows).to_string().contains("paused"));

    r.write(&["delete", "/locks/queue/ingest"]);
    eventually(
        "the queue resumed by the lock node's delete",
        30,
        async || (s.get("/queue").await["paused"] == false).then_some(()),
    )
    .await;
    converged(s).await;
    assert!(!exists(zk, "/locks/queue/ingest").await);

    r.write(&["create", "/locks/collections/demo"]);
    eventually("the collection held by the lock node", 30, async || {
        (s.get("/collections/demo").await["held"] == true).then_some(())
    })
    .await;
    converged(s).await;
    r.write(&["delete", "/locks/collections/demo"]);
    eventually(
        "the collection released by the lock node's delete",
        30,
        async || (s.get("/collections/demo").await["held"] == false).then_some(()),
    )
    .await;
    converged(s).await;
    assert!(!exists(zk, "/locks/collections/demo").await);
    let engine = s.get("/history?actor=engine").await;
    assert!(
        repairs(&engine)
            .iter()
            .all(|r| !r.to_string().contains("/locks/")),
        "no lock reverted: {engine}"
    );
    assert_ready(s).await;
}

/// Adoption mode: twenty acquisitions by one Merritt daemon back to back
/// are judged in one round and adopted together; the projector's next
/// transaction then meets twenty jobs whose references mrt-zk moved, and
/// puts each right once (before, the ninth repair in one transaction
/// stopped the projector as if one item kept changing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adoption_mode_adopts_many_acquisitions_in_one_round_without_stopping() {
    let Some((r, jids)) = Rig::adopting("foreign-adopt-many", 20).await else {
        return;
    };
    let s = &r.s;
    let mut args = vec!["steps", "Estimating", "taken in a burst"];
    args.extend(jids.iter().map(String::as_str));
    let summary = r.write(&args);
    let actor = format!(
        "worker:zk-session-{}",
        summary["session"].as_str().expect("session")
    );
    for jid in &jids {
        eventually(&format!("{jid} adopted"), 30, async || {
            (s.get(&format!("/jobs/{jid}")).await["status"] == "Estimating").then_some(())
        })
        .await;
    }
    converged(s).await;
    assert_ready(s).await;
    let named = {
        let mut n = 0;
        for jid in &jids {
            n += usize::from(moves(s, jid).await.iter().any(|(_, a)| *a == actor));
        }
        n
    };
    // A lock released before its holder was read names the write's zxid.
    assert!(named > 0, "no move names the session {actor}");
}

/// Issue 23, adoption mode: one id space with mrt-zk. Two Merritt-pattern
/// clients (mrt-zk's `createBatch`: a sequential `/batches/bid` node, the
/// uuid node, the submission, the status) create 500 batches between them
/// while 500 are submitted through `POST /batches` at the same time: no
/// `createBatch` meets `NodeExistsException`, the 1,000 ids are distinct,
/// every batch the clients created is in the log as a `BatchSubmitted`
/// whose actor names the ZooKeeper client, nothing is reverted, and the
/// tree is converged. Before, the engine took ids from the log, ZooKeeper's
/// counter reached them, and `createBatch` failed (and a batch it did make
/// was removed as another client's write).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adoption_mode_shares_one_id_space_with_mrt_zk_over_1000_creations() {
    let Some(r) = Rig::adopting_alone("foreign-adopt-ids").await else {
        return;
    };
    let s = &r.s;
    // Ingest's own first, so ZooKeeper's counter and the log start level.
    let first = r.projected_batch().await;
    let writers: Vec<_> = (0..2)
        .map(|_| {
            let (python, hosts, root) = (r.python.clone(), r.zks.hosts(), r.root.clone());
            tokio::task::spawn_blocking(move || {
                merritt_write(
                    &python,
                    &hosts,
                    &root,
                    &["create-batches", "250", "demo", "https://example.org/m.txt"],
                )
            })
        })
        .collect();
    let base = s.base.clone();
    let submitters: Vec<_> = (0..5)
        .map(|_| {
            let base = base.clone();
            tokio::spawn(async move {
                let client = ingest_client::Client::new(&base, server::DEPOSITOR).expect("client");
                let mut bids = Vec::new();
                for i in 0..100 {
                    let input = ingest_protocol::submission::SubmissionInput {
                        submitter: Some("alice".into()),
                        profile: Some("demo".into()),
                        payload_url: Some(format!("https://example.org/{i}.txt")),
                        ..Default::default()
                    };
                    bids.push(client.submit(&input).await.expect("submitted").bid);
                }
                bids
            })
        })
        .collect();
    let mut merritt: Vec<String> = Vec::new();
    for w in writers {
        let summary = w.await.expect("the writer task");
        assert_eq!(summary["collisions"], 0, "{summary}");
        assert_eq!(summary["failures"], json!([]), "{summary}");
        let created = summary["created"].as_array().expect("created");
        assert_eq!(created.len(), 250, "{summary}");
        merritt.extend(created.iter().map(|b| b.as_str().expect("bid").to_string()));
    }
    let mut ours: Vec<String> = vec![first];
    for t in submitters {
        ours.extend(t.await.expect("the submitter task"));
    }
    let all: std::collections::BTreeSet<&String> = merritt.iter().chain(&ours).collect();
    assert_eq!(all.len(), 1001, "an id was given twice");
    for bid in &merritt {
        let history = eventually(&format!("{bid} adopted"), 60, async || {
            let (status, h) = s
                .call(Method::GET, &format!("/batches/{bid}/history"), ADMIN, None)
                .await;
            (status == 200).then_some(h)
        })
        .await;
        let rows = history["events"].as_array().expect("events");
        let submitted = rows
            .iter()
            .find(|r| r["event"] == "BatchSubmitted")
            .unwrap_or_else(|| panic!("{bid}: {history}"));
        let actor = submitted["actor"].as_str().unwrap_or("");
        assert!(
            actor.starts_with("depositor:zk-zxid-0x"),
            "{bid}: {history}"
        );
        assert!(repairs(&history).is_empty(), "{bid}: {history}");
        assert_eq!(s.get(&format!("/batches/{bid}")).await["status"], "Pending");
    }
    converged(s).await;
    assert_ready(s).await;
    let system = s.get("/history?actor=engine&limit=1000").await;
    assert!(repairs(&system).is_empty(), "{system}");
}

/// Issue 23, adoption mode: Merritt's batch consumer on a batch mrt-zk
/// created. `acquirePendingBatch` (lock, `states`, `setStatus Processing`)
/// opens the batch in the log, each `createJob` (a sequential `/jobs/jid`
/// node, its data, its references, under the job's lock) is a
/// `JobCreated` with the id ZooKeeper gave it and the creating session as
/// actor, nothing is reverted and the tree is converged. Then a batch move
/// the engine makes itself (Processing → Reporting while its jobs wait) is
/// reverted and recorded. Before, the acquisition and every job were
/// removed as another client's writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adoption_mode_takes_a_batch_acquired_and_filled_by_mrt_zk() {
    let Some(r) = Rig::adopting_alone("foreign-adopt-consumer").await else {
        return;
    };
    let s = &r.s;
    r.projected_batch().await;
    let created = r.write(&["create-batches", "1", "demo", "https://example.org/m.txt"]);
    let bid = created["created"][0].as_str().expect("bid").to_string();
    eventually(&format!("{bid} adopted"), 30, async || {
        let (status, _) = s
            .call(Method::GET, &format!("/batches/{bid}"), ADMIN, None)
            .await;
        (status == 200).then_some(())
    })
    .await;
    let consumed = r.write(&["consume-batch", &bid, "3", "https://example.org/o.txt"]);
    let actor = format!(
        "worker:zk-session-{}",
        consumed["session"].as_str().expect("session")
    );
    let jids: Vec<String> = consumed["jobs"]
        .as_array()
        .expect("jobs")
        .iter()
        .map(|j| j.as_str().expect("jid").to_string())
        .collect();
    assert_eq!(jids.len(), 3, "{consumed}");
    eventually(&format!("{bid} Processing with its jobs"), 30, async || {
        let b = s.get(&format!("/batches/{bid}")).await;
        (b["status"] == "Processing" && b["jobs"].as_array().is_some_and(|j| j.len() == 3))
            .then_some(())
    })
    .await;
    for jid in &jids {
        let job = s.get(&format!("/jobs/{jid}")).await;
        assert_eq!(job["status"], "Pending", "{job}");
        let history = s.get(&format!("/jobs/{jid}/history")).await;
        let created = history["events"]
            .as_array()
            .expect("events")
            .iter()
            .find(|r| r["event"] == "JobCreated")
            .cloned()
            .unwrap_or_else(|| panic!("{jid}: {history}"));
        assert_eq!(created["actor"], actor.as_str(), "{history}");
        assert!(repairs(&history).is_empty(), "{history}");
    }
    let history = s.get(&format!("/batches/{bid}/history")).await;
    assert!(
        history["events"]
            .as_array()
            .expect("events")
            .iter()
            .any(|r| r["event"] == "BatchAcquired"
                && r["actor"]
                    .as_str()
                    .is_some_and(|a| a.starts_with("worker:zk-zxid-0x"))),
        "{history}"
    );
    assert!(repairs(&history).is_empty(), "{history}");
    converged(s).await;
    assert_ready(s).await;

    r.write(&["batch-status", &bid, "Reporting"]);
    let rows = repaired(s, &format!("/batches/{bid}/history")).await;
    let text = Value::Array(rows).to_string();
    assert!(
        text.contains("adoption refused Processing -> Reporting"),
        "{text}"
    );
    assert_eq!(
        s.get(&format!("/batches/{bid}")).await["status"],
        "Processing"
    );
    converged(s).await;
    assert_ready(s).await;
}

/// Issue 23, items 3 and 4: on a tree with ACLs (the engine authenticates,
/// and `--zk-merritt-identity` names Merritt's services), a Merritt-pattern
/// client authenticated as that identity walks a job a step in adoption
/// mode, and the engine adopts it with an actor naming the identity and
/// the session (`worker:merritt@zk-session-0x…`); the same write from an
/// anonymous client is refused by ZooKeeper (`NoAuth`) and nothing moves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_acls_the_merritt_identity_writes_what_adoption_takes_and_anonymous_clients_cannot() {
    let dir = tempfile::tempdir().expect("tempdir");
    let engine_auth = dir.path().join("zk-engine");
    std::fs::write(&engine_auth, "engine:engine-secret\n").expect("write");
    let merritt = ingest_projections::Credentials::parse("merritt:merritt-secret")
        .expect("valid")
        .id();
    let args = [
        "--foreign-writes",
        "adopt",
        "--zk-auth-file",
        &engine_auth.display().to_string(),
        "--zk-merritt-identity",
        merritt.as_str(),
    ];
    let Some(r) = Rig::start_with("foreign-acl", Some(&NO_JOB_DAEMONS), &args).await else {
        return;
    };
    let bid = r.s.submit(1).await;
    let jid = jobs_of(&r.s, &r.zk, &bid, 1).await.remove(0);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/interop/merritt_writer.py");
    let run = |auth: Option<&str>| {
        let mut p = Process::new(&r.python);
        p.arg(&script).arg(r.zks.hosts()).arg(&r.root).args([
            "step",
            &jid,
            "Estimating",
            "by Merritt",
        ]);
        match auth {
            Some(a) => p.env("MERRITT_ZK_AUTH", a),
            None => p.env_remove("MERRITT_ZK_AUTH"),
        };
        p.output().expect("run the Merritt-pattern writer")
    };

    let anonymous = run(None);
    assert!(!anonymous.status.success(), "{anonymous:?}");
    assert!(
        String::from_utf8_lossy(&anonymous.stderr).contains("NoAuth"),
        "{}",
        String::from_utf8_lossy(&anonymous.stderr)
    );
    let job = r.s.get(&format!("/jobs/{jid}")).await;
    assert_eq!(job["status"], "Pending", "{job}");

    let named = run(Some("merritt:merritt-secret"));
    assert!(
        named.status.success(),
        "{}",
        String::from_utf8_lossy(&named.stderr)
    );
    eventually(&format!("{jid} adopted in Estimating"), 30, async || {
        let job = r.s.get(&format!("/jobs/{jid}")).await;
        (job["status"] == "Estimating").then_some(())
    })
    .await;
    converged(&r.s).await;
    let history = r.s.get(&format!("/jobs/{jid}/history")).await;
    assert!(repairs(&history).is_empty(), "nothing reverted: {history}");
    // Item 4: the actor names the identity (only it and the engine can
    // write the queue) and the session.
    let summary: Value = serde_json::from_slice(&named.stdout).expect("the writer's summary");
    let session = summary["session"].as_str().expect("session");
    assert_eq!(
        moves(&r.s, &jid).await,
        vec![(
            "Pending -> Estimating".to_string(),
            format!("worker:merritt@zk-session-{session}")
        )],
        "{history}"
    );
}

/// The rows of an item's history whose event is `kind`.
async fn events_of(s: &Server, history: &str, kind: &str) -> Vec<Value> {
    s.get(history).await["events"]
        .as_array()
        .map(|rows| {
            rows.iter()
                .filter(|r| r["event"] == kind)
                .cloned()
                .collect()
        })
        .unwrap_or_default()
}

/// A batch of `jobs` jobs submitted and walked to Completed by the
/// server's own daemons, projected: its id and its jobs.
async fn completed_batch(s: &Server, jobs: usize) -> (String, Vec<String>) {
    let bid = s.submit(jobs).await;
    let jids: Vec<String> = eventually(&format!("{bid} completed"), 90, async || {
        let b = s.get(&format!("/batches/{bid}")).await;
        (b["status"] == "Completed").then_some(())?;
        b["jobs"].as_array().map(|j| {
            j.iter()
                .filter_map(|j| j["jid"].as_str().map(str::to_string))
                .collect()
        })
    })
    .await;
    assert_eq!(jids.len(), jobs);
    converged(s).await;
    (bid, jids)
}

/// Issue 23, item 2, adoption mode: mrt-zk's delete helpers. `Job.delete`
/// of a Completed job (its references, then its tree) is the admin's
/// `DeleteJob`, with the client as actor: the job is Deleted and stays in
/// the tree as such; the same of a job already Deleted (`deleteDeletedJobs`)
/// is refused, put back and recorded. `Batch.delete` of a Completed batch
/// (`deleteCompletedBatches`: its jobs, its uuid node, its tree) is the
/// engine's cleanup of that batch (`BatchCleanedUp`), nothing put back; a
/// batch still at work removed by a client that skips mrt-zk's check is
/// put back and recorded. `ingest diff` is clean after each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adoption_mode_takes_mrt_zk_deletes_of_finished_items_and_puts_back_the_others() {
    let Some(r) = Rig::start_with(
        "foreign-adopt-delete",
        Some(&[]),
        &["--foreign-writes", "adopt"],
    )
    .await
    else {
        return;
    };
    let (s, zk) = (&r.s, &r.zk);
    let (done, jids) = completed_batch(s, 2).await;

    // Job.delete of a Completed job: DeleteJob.
    let (first, second) = (&jids[0], &jids[1]);
    r.write(&["delete-job", first]);
    eventually(&format!("{first} deleted"), 30, async || {
        let job = s.get(&format!("/jobs/{first}")).await;
        (job["status"] == "Deleted").then_some(())
    })
    .await;
    let deleted = events_of(s, &format!("/jobs/{first}/history"), "JobDeleted").await;
    assert_eq!(deleted.len(), 1, "{deleted:?}");
    assert_eq!(deleted[0]["actor"], "admin:zk-client", "{deleted:?}");
    status_node_says(zk, first, "Deleted").await;
    converged(s).await;
    assert!(repairs(&s.get(&format!("/jobs/{first}/history")).await).is_empty());

    // deleteDeletedJobs: a job already Deleted is refused and put back.
    r.write(&["delete-job", first]);
    let rows = repaired(s, &format!("/jobs/{first}/history")).await;
    let text = Value::Array(rows).to_string();
    assert!(
        text.contains(&format!(
            "adoption refused: /jobs/{first} deleted by another client"
        )),
        "{text}"
    );
    status_node_says(zk, first, "Deleted").await;
    converged(s).await;

    // A batch at work (the queue paused: its job stays Pending).
    admin(s, Method::POST, "/queue/pause", "hold the second batch").await;
    let busy = s.submit(1).await;
    let busy_job = jobs_of(s, zk, &busy, 1).await.remove(0);

    // Batch.delete of the Completed batch: its cleanup.
    r.write(&["delete-batch", &done]);
    let cleaned = eventually(&format!("{done} cleaned up"), 30, async || {
        let rows = events_of(s, &format!("/batches/{done}/history"), "BatchCleanedUp").await;
        (!rows.is_empty()).then_some(rows)
    })
    .await;
    assert_eq!(cleaned[0]["actor"], "admin:zk-client", "{cleaned:?}");
    converged(s).await;
    assert!(!exists(zk, &format!("/batches/{done}")).await);
    for jid in [first, second] {
        assert!(!exists(zk, &format!("/jobs/{jid}")).await, "{jid}");
    }
    let done_history = s.get(&format!("/batches/{done}/history")).await;
    // (The batch's history holds its jobs' too: the refusal above.)
    assert!(
        repairs(&done_history)
            .iter()
            .all(|r| r["stream"] != done.as_str()),
        "{done_history}"
    );
    assert_eq!(repairs(&done_history).len(), 1, "{done_history}");
    let second_history = s.get(&format!("/jobs/{second}/history")).await;
    assert!(repairs(&second_history).is_empty(), "{second_history}");

    // The batch at work, removed whole without mrt-zk's check: put back.
    r.write(&["delete-all", &format!("/batches/{busy}")]);
    let rows = repaired(s, &format!("/batches/{busy}/history")).await;
    let text = Value::Array(rows).to_string();
    assert!(
        text.contains(&format!(
            "adoption refused: /batches/{busy} deleted by another client"
        )),
        "{text}"
    );
    converged(s).await;
    assert!(exists(zk, &format!("/batches/{busy}/status")).await);
    let job = s.get(&format!("/jobs/{busy_job}")).await;
    assert_eq!(job["status"], "Pending", "{job}");
    assert_ready(s).await;
}

/// The rows of the whole log's history on stream `stream` whose event is
/// `kind`.
async fn stream_events(s: &Server, stream: &str, kind: &str) -> Vec<Value> {
    let (status, history) = s
        .call(Method::GET, "/history?limit=1000", ADMIN, None)
        .await;
    assert_eq!(status, 200, "{history}");
    history["events"]
        .as_array()
        .map(|rows| {
            rows.iter()
                .filter(|r| r["stream"] == stream && r["event"] == kind)
                .cloned()
                .collect()
        })
        .unwrap_or_default()
}

/// Waits until `/access/small/QID/status` says `status`.
async fn access_node_says(zk: &zookeeper_client::Client, qid: &str, status: &str) {
    let path = format!("/access/small/{qid}/status");
    eventually(&format!("{path} to say {status}"), 30, async || {
        let (data, _) = zk.get_data(&path).await.ok()?;
        let node: Value = serde_json::from_slice(&data).ok()?;
        (node["status"] == status).then_some(())
    })
    .await;
}

/// Issue 23, item 1, adoption mode: access request statuses written as
/// mrt-zk's `Access.setStatus` writes them. An assembler's step (the lock,
/// the status, the unlock) taking a Pending request and reporting it
/// Completed is the engine's `StartAccess` and `AccessOutcome`, with the
/// lock's session as actor, as for jobs; the admin tool's delete (status
/// Deleted, no lock) is `DeleteAccess`. Refused, put back and recorded: a
/// take written without the lock, a take while the access queue is
/// paused, and Completed -> Pending (no such move).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adoption_mode_turns_merritt_access_statuses_into_the_engines_access_commands() {
    let Some(r) = Rig::adopting_access("foreign-adopt-access").await else {
        return;
    };
    let (s, zk) = (&r.s, &r.zk);
    let qid = r.access_request().await;
    let refusals = async |want: &str| {
        eventually(&format!("a refusal saying {want}"), 30, async || {
            let rows = stream_events(s, &qid, "ForeignChangeRepaired").await;
            Value::Array(rows).to_string().contains(want).then_some(())
        })
        .await
    };

    // Taken without the lock: refused.
    r.write(&["access-set-status", "small", &qid, "Processing", "no lock"]);
    refusals("adoption refused Pending -> Processing: written while no session held").await;
    access_node_says(zk, &qid, "Pending").await;
    converged(s).await;

    // Taken under the lock while the small queue is paused: refused.
    admin(s, Method::POST, "/access-queues/small/pause", "maintenance").await;
    eventually("the small queue's pause lock", 30, async || {
        exists(zk, "/locks/queue/accessSmall").await.then_some(())
    })
    .await;
    r.write(&[
        "access-step",
        "small",
        &qid,
        "Processing",
        "taken while paused",
    ]);
    refusals("paused").await;
    access_node_says(zk, &qid, "Pending").await;
    admin(s, Method::POST, "/access-queues/small/resume", "done").await;
    converged(s).await;

    // An assembler takes it and completes it.
    let taken = r.write(&["access-step", "small", &qid, "Processing", "assembling"]);
    let session = taken["session"].as_str().expect("session").to_string();
    eventually("the take adopted", 30, async || {
        (s.get(&format!("/access/{qid}")).await["status"] == "Processing").then_some(())
    })
    .await;
    converged(s).await;
    let done = r.write(&["access-step", "small", &qid, "Completed", "assembled"]);
    eventually("the outcome adopted", 30, async || {
        (s.get(&format!("/access/{qid}")).await["status"] == "Completed").then_some(())
    })
    .await;
    converged(s).await;
    let moves: Vec<(String, String)> = stream_events(s, &qid, "AccessStatusChanged")
        .await
        .iter()
        .map(|r| {
            let detail = r["detail"].as_str().unwrap_or("");
            let words: Vec<&str> = detail.split_whitespace().take(3).collect();
            (
                words.join(" ").trim_end_matches(':').to_string(),
                r["actor"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    assert_eq!(
        moves,
        vec![
            (
                "Pending -> Processing".to_string(),
                format!("worker:zk-session-{session}")
            ),
            (
                "Processing -> Completed".to_string(),
                format!(
                    "worker:zk-session-{}",
                    done["session"].as_str().expect("session")
                )
            ),
        ]
    );

    // No such move: refused and put back.
    r.write(&["access-set-status", "small", &qid, "Pending", "again?"]);
    refusals("adoption refused Completed -> Pending").await;
    access_node_says(zk, &qid, "Completed").await;
    converged(s).await;

    // The admin tool's delete.
    r.write(&["access-set-status", "small", &qid, "Deleted", "cleaning up"]);
    eventually("the delete adopted", 30, async || {
        (s.get(&format!("/access/{qid}")).await["status"] == "Deleted").then_some(())
    })
    .await;
    let deleted = stream_events(s, &qid, "AccessStatusChanged").await;
    let last = deleted.last().expect("the delete");
    assert!(
        last["actor"]
            .as_str()
            .is_some_and(|a| a.starts_with("admin:zk-zxid-0x")),
        "{last}"
    );
    converged(s).await;
    assert_ready(s).await;
}

/// Issue 23, adoption mode: `Access.delete` (a request's children, then
/// the request). Of a Completed request it is the admin's `DeleteAccess`,
/// with the client as actor: the request is Deleted and stays in the tree
/// as such, nothing put back. The same of a request already Deleted, of a
/// Processing one whose lock another session held, and of a Pending one
/// removed whole by a client that skips mrt-zk's check (the engine deletes
/// no Pending request), is refused, put back and recorded. `ingest diff`
/// is clean after each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adoption_mode_takes_mrt_zk_access_delete_of_a_finished_request_and_puts_back_the_others() {
    let Some(r) = Rig::adopting_access("foreign-adopt-access-delete").await else {
        return;
    };
    let (s, zk) = (&r.s, &r.zk);
    let refused = async |qid: &str| {
        let want = format!("adoption refused: /access/small/{qid} deleted by another client");
        eventually(&format!("a refusal saying {want}"), 30, async || {
            let rows = stream_events(s, qid, "ForeignChangeRepaired").await;
            Value::Array(rows).to_string().contains(&want).then_some(())
        })
        .await
    };

    // A request assembled by the Merritt client, then Access.delete.
    let qid = r.access_request().await;
    for (status, message) in [("Processing", "assembling"), ("Completed", "assembled")] {
        r.write(&["access-step", "small", &qid, status, message]);
        eventually(&format!("{qid} {status}"), 30, async || {
            (s.get(&format!("/access/{qid}")).await["status"] == status).then_some(())
        })
        .await;
        converged(s).await;
    }
    r.write(&["delete-access", "small", &qid]);
    eventually("the delete adopted", 30, async || {
        (s.get(&format!("/access/{qid}")).await["status"] == "Deleted").then_some(())
    })
    .await;
    let moves = stream_events(s, &qid, "AccessStatusChanged").await;
    let last = moves.last().expect("the delete");
    assert_eq!(last["actor"], "admin:zk-client", "{last}");
    access_node_says(zk, &qid, "Deleted").await;
    assert!(exists(zk, &format!("/access/small/{qid}/token")).await);
    converged(s).await;
    let found = stream_events(s, &qid, "ForeignChangeRepaired").await;
    assert!(found.is_empty(), "{found:?}");

    // Again, now that it is Deleted: refused and put back.
    r.write(&["delete-access", "small", &qid]);
    refused(&qid).await;
    access_node_says(zk, &qid, "Deleted").await;
    converged(s).await;

    // A Processing request removed whole while another session holds
    // its lock: refused without asking the engine, and put back.
    let taken = r.access_request().await;
    r.write(&["access-step", "small", &taken, "Processing", "assembling"]);
    eventually(&format!("{taken} Processing"), 30, async || {
        (s.get(&format!("/access/{taken}")).await["status"] == "Processing").then_some(())
    })
    .await;
    converged(s).await;
    r.write(&["create", &format!("/access/small/{taken}/lock")]);
    r.write(&["delete-all", &format!("/access/small/{taken}")]);
    refused(&taken).await;
    let rows = stream_events(s, &taken, "ForeignChangeRepaired").await;
    assert!(
        Value::Array(rows.clone())
            .to_string()
            .contains("while Processing and another session held its lock"),
        "{rows:?}"
    );
    access_node_says(zk, &taken, "Processing").await;
    converged(s).await;

    // A Pending request removed whole: refused and put back.
    let pending = r.access_request().await;
    r.write(&["delete-all", &format!("/access/small/{pending}")]);
    refused(&pending).await;
    access_node_says(zk, &pending, "Pending").await;
    assert!(exists(zk, &format!("/access/small/{pending}/token")).await);
    let a = s.get(&format!("/access/{pending}")).await;
    assert_eq!(a["status"], "Pending", "{a}");
    converged(s).await;
    assert_ready(s).await;
}

/// Issue 23, item 3, adoption mode: a status written with mrt-zk's
/// `setStatusWithRetry` (`retry_count` one more than the node had) is
/// adopted as the move it means, and what was written that the engine's
/// rules do not give (`retry_count` 1; the engine's grows only with a
/// requeue) is recorded in the job's history with the node as written
/// (`ForeignChangeRepaired`, kind changed); the tree gets the engine's
/// JSON and `ingest diff` is clean. A plain `setStatus` (the counters as
/// the engine has them) records nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adoption_mode_records_a_retry_count_written_that_the_engine_does_not_keep() {
    let Some((r, jids)) = Rig::adopting("foreign-adopt-retry", 1).await else {
        return;
    };
    let (s, zk, jid) = (&r.s, &r.zk, &jids[0]);
    r.write(&["step", jid, "Estimating", "taken"]);
    converged(s).await;
    let job = s.get(&format!("/jobs/{jid}")).await;
    assert_eq!(job["status"], "Estimating", "adopted: {job}");
    assert!(repairs(&s.get(&format!("/jobs/{jid}/history")).await).is_empty());

    let summary = r.write(&["step-retry", jid, "Provisioning", "estimated, second try"]);
    let session = summary["session"].as_str().expect("session");
    let rows = repaired(s, &format!("/jobs/{jid}/history")).await;
    let text = Value::Array(rows.clone()).to_string();
    assert!(
        text.contains(
            "adopted Estimating -> Provisioning; written retry_count 1 (the engine's: 0)"
        ),
        "{text}"
    );
    assert_eq!(rows.len(), 1, "{text}");
    let walked = moves(s, jid).await;
    assert_eq!(walked.len(), 2, "{walked:?}");
    assert_eq!(
        walked[1],
        (
            "Estimating -> Provisioning:".to_string(),
            format!("worker:zk-session-{session}")
        ),
        "{walked:?}"
    );
    converged(s).await;
    let (data, _) = zk
        .get_data(&format!("/jobs/{jid}/status"))
        .await
        .expect("the status node");
    let node: Value = serde_json::from_slice(&data).expect("json");
    assert_eq!(node["status"], "Provisioning", "{node}");
    assert_eq!(node["retry_count"], 0, "the engine's: {node}");
    assert_ready(s).await;
}

/// Issue 23, item 2: mrt-zk's `Batch.delete` of a large batch removes its
/// jobs one by one, across several adoption rounds (here 1.2 s per job,
/// more than a round's longest wait) before the batch itself: the jobs
/// removed first are judged with the batch's removal, so the whole is one
/// cleanup, not soft deletes of jobs and a refusal of the Deleted one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adoption_mode_takes_a_slow_batch_delete_as_one_cleanup() {
    let Some(r) = Rig::start_with(
        "foreign-adopt-slow-delete",
        Some(&[]),
        &["--foreign-writes", "adopt"],
    )
    .await
    else {
        return;
    };
    let s = &r.s;
    let (bid, jids) = completed_batch(s, 3).await;
    // One job Deleted first (the admin tool's delete through the API).
    admin(
        s,
        Method::DELETE,
        &format!("/jobs/{}", jids[0]),
        "not wanted",
    )
    .await;
    converged(s).await;

    r.write_paced("1.2", &["delete-batch", &bid]);
    eventually(&format!("{bid} cleaned up"), 30, async || {
        let rows = events_of(s, &format!("/batches/{bid}/history"), "BatchCleanedUp").await;
        (!rows.is_empty()).then_some(())
    })
    .await;
    converged(s).await;
    let history = s.get(&format!("/batches/{bid}/history")).await;
    assert!(repairs(&history).is_empty(), "nothing put back: {history}");
    for jid in &jids[1..] {
        let deleted = events_of(s, &format!("/jobs/{jid}/history"), "JobDeleted").await;
        assert!(deleted.is_empty(), "{jid} not soft-deleted: {deleted:?}");
        assert!(!exists(&r.zk, &format!("/jobs/{jid}")).await, "{jid}");
    }
    assert_ready(s).await;
}
