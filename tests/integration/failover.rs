//! Fail-over of worker processes against the shared real ZooKeeper and a real
//! `ingest serve` that runs no daemons of its own:
//!
//! - a worker killed (SIGKILL) in the middle of a step: its lock goes with
//!   its session, another worker takes the job and finishes it, and the dead
//!   worker's late report is refused without touching the log;
//! - a worker whose session expires while it is stopped (SIGSTOP for longer
//!   than its session timeout, then SIGCONT): it drops the step in hand,
//!   makes a new session and carries on taking work.
//!
//! Every worker here is a separate `ingest worker` process: a "helper" runs
//! every daemon but `downloading` (no step time), and the workers under test
//! run only `downloading`, so the job's Downloading step is where they fail.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use zookeeper_client as zk;

use crate::server::{eventually, start, Server, WORKER};
use crate::util::ingest_bin;
use crate::zk_server::{shared, unique_root};

/// Every daemon but `downloading`, without step time.
const HELPER_DAEMONS: &str = "batch_pending,batch_reporting,batch_update_reporting,job_pending,estimating,provisioning,processing,storing,recording,notify";

/// The session timeout the workers under test ask for, in seconds (the test
/// ZooKeeper's minimum, `tools/zk`'s `minSessionTimeout`).
const SESSION_TIMEOUT_SECS: &str = "2";

/// An `ingest worker` child: killed when dropped (also when stopped: SIGKILL
/// ends a stopped process), printing the tail of its log when a test fails.
struct WorkerProc {
    name: String,
    child: Child,
    log: PathBuf,
}

impl WorkerProc {
    fn pid(&self) -> String {
        self.child.id().to_string()
    }

    /// Sends `signal` (`STOP`, `CONT`, `TERM`) with kill(1).
    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &self.pid()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{signal} {}: {status}", self.pid());
    }

    /// SIGKILL, then reaps the process.
    fn kill(&mut self) {
        self.child.kill().expect("SIGKILL the worker");
        self.child.wait().expect("reap the worker");
    }

    /// SIGTERM (the worker stops, releasing its locks) and waits for the exit.
    async fn terminate(&mut self) {
        self.signal("TERM");
        let exit = eventually(&format!("{} to exit", self.name), 25, async || {
            self.child.try_wait().expect("wait")
        })
        .await;
        assert!(exit.success(), "{}: {exit:?}", self.name);
    }
}

impl Drop for WorkerProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            let text = std::fs::read_to_string(&self.log).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(30).collect();
            eprintln!("--- ingest worker {} log (last lines) ---", self.name);
            for l in tail.iter().rev() {
                eprintln!("{l}");
            }
        }
    }
}

/// Starts `ingest worker NAME` running `daemons`, each step taking `step_ms`.
fn spawn_worker(
    s: &Server,
    hosts: &str,
    root: &str,
    dir: &Path,
    name: &str,
    daemons: &str,
    step_ms: u64,
) -> WorkerProc {
    let log = dir.join(format!("{name}.log"));
    let child = Command::new(ingest_bin())
        .args([
            "worker",
            "--engine",
            &s.base,
            "--zk",
            hosts,
            "--zk-root",
            root,
            "--zk-session-timeout",
            SESSION_TIMEOUT_SECS,
            "--daemons",
            daemons,
            "--name",
            name,
            "--step-ms",
            &step_ms.to_string(),
            "--provisioning-threshold",
            "100",
        ])
        .arg("--working-storage")
        .arg(dir)
        .env("INGEST_WORKER_TOKEN", WORKER)
        .env("INGEST_LOG", "info")
        .env_remove("INGEST_DATA_DIR")
        .env_remove("INGEST_WORKER_TOKEN_FILE")
        .env_remove("INGEST_WORKER_DAEMONS")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("worker log file"))
        .spawn()
        .expect("start ingest worker");
    WorkerProc {
        name: name.to_string(),
        child,
        log,
    }
}

/// A job in the Downloading queue whose lock `name` holds (the lock node's
/// data names the worker), with the lock's owning session.
async fn held_by(client: &zk::Client, name: &str) -> Option<(String, i64)> {
    let queue = client
        .list_children("/jobs/states/downloading")
        .await
        .ok()?;
    for entry in queue {
        let Some((_, jid)) = entry.split_once('-') else {
            continue;
        };
        if let Ok((data, stat)) = client.get_data(&format!("/jobs/{jid}/lock")).await {
            let holder = ingest_protocol::fence::LockNode::read(&data);
            if holder.is_some_and(|h| h.worker == name) {
                return Some((jid.to_string(), stat.ephemeral_owner));
            }
        }
    }
    None
}

async fn wait_held_by(client: &zk::Client, name: &str, secs: u64) -> (String, i64) {
    eventually(
        &format!("{name} to hold a Downloading job's lock"),
        secs,
        async || held_by(client, name).await,
    )
    .await
}

async fn job_status(s: &Server, jid: &str) -> String {
    let job = s.get(&format!("/jobs/{jid}")).await;
    job["status"].as_str().expect("status").to_string()
}

async fn head(s: &Server) -> u64 {
    s.get("/status").await["head_position"]
        .as_u64()
        .expect("head_position")
}

async fn batch_done(s: &Server, bid: &str, secs: u64) {
    eventually("the batch to complete", secs, async || {
        let batch = s.get(&format!("/batches/{bid}")).await;
        (batch["status"] == "Completed").then_some(())
    })
    .await;
}

/// The actors of the job's moves out of `state`.
async fn moved_out_of_by(s: &Server, jid: &str, state: &str) -> Vec<String> {
    let history = s.get(&format!("/jobs/{jid}/history")).await;
    let prefix = format!("{state} -> ");
    history["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter(|r| r["event"] == "JobStatusChanged")
        .filter(|r| r["detail"].as_str().is_some_and(|d| d.starts_with(&prefix)))
        .map(|r| r["actor"].as_str().expect("actor").to_string())
        .collect()
}

/// Every actor in the job's history.
async fn actors(s: &Server, jid: &str) -> Vec<String> {
    let history = s.get(&format!("/jobs/{jid}/history")).await;
    history["events"]
        .as_array()
        .expect("events")
        .iter()
        .map(|r| r["actor"].as_str().expect("actor").to_string())
        .collect()
}

/// Posts the Downloading outcome a worker of `session` would send late, and
/// asserts it is refused (409) without appending anything.
async fn assert_late_report_refused(s: &Server, jid: &str, worker: &str, session: i64) -> Value {
    let before = head(s).await;
    let status_before = job_status(s, jid).await;
    let report = json!({
        "worker": worker,
        "session_id": session,
        "state": "Downloading",
        "outcome": "success",
        "message": "finished after all",
        "duration_ms": 60_000,
    });
    let (status, body) = s
        .call(
            reqwest::Method::POST,
            &format!("/jobs/{jid}/outcome"),
            WORKER,
            Some(report),
        )
        .await;
    assert_eq!(status, 409, "the late report: {body}");
    let code = body["error"]["code"].as_str().unwrap_or_default();
    assert!(
        code == "lock_not_held" || code == "stale_report",
        "the late report's code: {body}"
    );
    assert_eq!(head(s).await, before, "the refused report appended nothing");
    assert_eq!(job_status(s, jid).await, status_before);
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_killed_mid_step_loses_its_lock_and_another_worker_finishes_the_job() {
    let zk_server = shared();
    let hosts = zk_server.hosts();
    let root = unique_root("failover-kill");
    let dir = tempfile::tempdir().expect("tempdir");
    let s = start(dir.path(), &hosts, &root, None);
    let _helper = spawn_worker(&s, &hosts, &root, dir.path(), "helper", HELPER_DAEMONS, 0);
    // A's Downloading step takes a minute: it is killed in the middle.
    let mut a = spawn_worker(
        &s,
        &hosts,
        &root,
        dir.path(),
        "kill-a",
        "downloading",
        60_000,
    );
    let bid = s.submit(1).await;
    let client = zk::Client::connect(&format!("{hosts}{root}"))
        .await
        .expect("zookeeper");
    let (jid, a_session) = wait_held_by(&client, "kill-a", 20).await;
    assert_ne!(a_session, 0, "the lock is ephemeral");
    assert_ne!(a_session, client.session_id().0);
    assert_eq!(job_status(&s, &jid).await, "Downloading");

    // SIGKILL: nothing is released; the lock goes when ZooKeeper expires
    // the dead session.
    a.kill();
    let killed = Instant::now();
    let lock = format!("/jobs/{jid}/lock");
    eventually(
        "the dead worker's lock to disappear",
        15,
        async || match client.check_stat(&lock).await.expect("stat the lock") {
            None => Some(()),
            Some(stat) => {
                assert_eq!(stat.ephemeral_owner, a_session, "nobody else may take it");
                None
            }
        },
    )
    .await;
    let lock_gone = killed.elapsed();
    assert_eq!(
        job_status(&s, &jid).await,
        "Downloading",
        "the dead worker reported nothing"
    );

    // B takes the job over and the job completes.
    let _b = spawn_worker(&s, &hosts, &root, dir.path(), "kill-b", "downloading", 0);
    batch_done(&s, &bid, 20).await;
    let completed = killed.elapsed();
    eprintln!("lock gone {lock_gone:?} after SIGKILL; job completed {completed:?} after SIGKILL");

    // The dead worker's late report is refused and changes nothing.
    assert_late_report_refused(&s, &jid, "kill-a", a_session).await;

    s.assert_walked_once(&jid).await;
    assert_eq!(
        moved_out_of_by(&s, &jid, "Downloading").await,
        ["worker:kill-b"],
        "the Downloading step was reported once, by B"
    );
    assert!(
        !actors(&s, &jid).await.iter().any(|a| a == "worker:kill-a"),
        "the dead worker is nowhere in the history"
    );
}

/// The regression test of dropping the step in hand when the session
/// expires: the worker's only Downloading task must be free again at once,
/// not after its (long) step would have ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_whose_session_expires_drops_its_step_and_carries_on_with_a_new_session() {
    // W's step time: long enough that W, had it kept running the step of the
    // job it lost, could not take the next job before the deadline below.
    const STEP: Duration = Duration::from_secs(12);
    let zk_server = shared();
    let hosts = zk_server.hosts();
    let root = unique_root("failover-expire");
    let dir = tempfile::tempdir().expect("tempdir");
    let s = start(dir.path(), &hosts, &root, None);
    let _helper = spawn_worker(&s, &hosts, &root, dir.path(), "helper", HELPER_DAEMONS, 0);
    let w = spawn_worker(
        &s,
        &hosts,
        &root,
        dir.path(),
        "expire-w",
        "downloading",
        STEP.as_millis() as u64,
    );
    let first_bid = s.submit(1).await;
    let client = zk::Client::connect(&format!("{hosts}{root}"))
        .await
        .expect("zookeeper");
    let (first, w_session) = wait_held_by(&client, "expire-w", 20).await;
    // W's step began at most this late (it starts once the lock is taken).
    let step_began = Instant::now();

    // Stop W for longer than its session timeout: ZooKeeper expires the
    // session and its lock goes.
    w.signal("STOP");
    let stopped = Instant::now();
    let lock = format!("/jobs/{first}/lock");
    eventually(
        "the stopped worker's lock to disappear",
        15,
        async || match client.check_stat(&lock).await.expect("stat the lock") {
            None => Some(()),
            Some(stat) => {
                assert_eq!(stat.ephemeral_owner, w_session, "nobody else may take it");
                None
            }
        },
    )
    .await;
    let expired_after = stopped.elapsed();

    // B finishes the job W lost, and stops (releasing its locks).
    let mut b = spawn_worker(&s, &hosts, &root, dir.path(), "expire-b", "downloading", 0);
    eventually(
        "B to finish the lost job's Downloading step",
        15,
        async || (job_status(&s, &first).await != "Downloading").then_some(()),
    )
    .await;
    b.terminate().await;

    // W resumes: its session has expired. It must drop the step in hand
    // (nothing it reports on the lost job), make a new session and take
    // the next job before its old step would have ended.
    w.signal("CONT");
    let resumed = Instant::now();
    let second_bid = s.submit(1).await;
    let old_step_ends = step_began + STEP;
    let (second, new_session) =
        eventually("the resumed worker to take the next job", 20, async || {
            held_by(&client, "expire-w").await
        })
        .await;
    let took_next = resumed.elapsed();
    eprintln!(
        "session expired {expired_after:?} after SIGSTOP; the resumed worker took the next job {took_next:?} after SIGCONT, its dropped step would have ended {:?} after SIGCONT",
        old_step_ends.saturating_duration_since(resumed)
    );
    assert_ne!(second, first);
    assert_ne!(new_session, w_session, "a new session");
    // W dropped the step of the job it had lost rather than running it to
    // its end (before the fix it sat in that step, then discarded the
    // result). Read from its log, not from timings, which a loaded machine
    // stretches.
    let dropped = "the session ended during the step; the step is dropped";
    eventually("W to drop the step of the job it lost", 10, async || {
        let log = std::fs::read_to_string(&w.log).unwrap_or_default();
        log.contains(dropped).then_some(())
    })
    .await;

    // W completes its step on the new job; both batches complete.
    batch_done(&s, &second_bid, STEP.as_secs() + 15).await;
    batch_done(&s, &first_bid, 5).await;

    // The late report of W's old session is refused and changes nothing
    // (checked once the queue is quiet, so that no other work moves the
    // log's head meanwhile).
    assert_late_report_refused(&s, &first, "expire-w", w_session).await;
    s.assert_walked_once(&first).await;
    s.assert_walked_once(&second).await;
    assert_eq!(
        moved_out_of_by(&s, &first, "Downloading").await,
        ["worker:expire-b"],
        "the lost job's Downloading step was reported once, by B"
    );
    assert!(
        !actors(&s, &first)
            .await
            .iter()
            .any(|a| a == "worker:expire-w"),
        "W reported nothing on the job it lost"
    );
    assert_eq!(
        moved_out_of_by(&s, &second, "Downloading").await,
        ["worker:expire-w"],
        "W carried on with its new session"
    );
}
