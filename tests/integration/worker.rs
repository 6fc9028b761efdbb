//! The worker daemons against the shared real ZooKeeper and a real
//! `ingest serve`: a batch walks through every state with the in-process
//! daemons, and a report from a worker that lost its lock is refused while
//! another worker completes the job.

use std::path::Path;
use std::process::{Command, Stdio};

use std::sync::atomic::Ordering;
use std::sync::Arc;

use ingest_config::DaemonKind;
use ingest_events::JobState;
use ingest_projections::ZkConfig;
use ingest_worker::step::{
    FixedProbe, JobCtx, Outcome, SimSettings, Step, StepFuture, StepResult, Steps,
};
use ingest_worker::{WorkerOptions, Workers};
use serde_json::{json, Value};
use zookeeper_client as zk;

use crate::server::{eventually, start, Server, WORKER};
use crate::util::ingest_bin;
use crate::zk_server::{shared, unique_root};

async fn batch_done(s: &Server, bid: &str, secs: u64) -> Value {
    eventually("the batch to complete", secs, async || {
        let batch = s.get(&format!("/batches/{bid}")).await;
        (batch["status"] == "Completed").then_some(batch)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_batch_of_100_jobs_walks_to_completed_with_in_process_daemons() {
    let zk_server = shared();
    let root = unique_root("worker-walk");
    let dir = tempfile::tempdir().expect("tempdir");
    let s = start(
        dir.path(),
        &zk_server.hosts(),
        &root,
        Some(&[
            "recording=on",
            "downloading=4",
            "processing=2",
            "estimating=2",
        ]),
    );
    let bid = s.submit(100).await;
    let batch = batch_done(&s, &bid, 45).await;
    let done = batch["successful_jobs"]
        .as_array()
        .expect("successful_jobs");
    assert_eq!(done.len(), 100, "{batch}");
    assert_eq!(
        batch["failed_jobs"].as_array().map(Vec::len),
        Some(0),
        "{batch}"
    );
    for jid in done {
        s.assert_walked_once(jid.as_str().expect("jid")).await;
    }

    // SIGTERM: the daemons stop before the API, and the server exits 0.
    let mut s = s;
    s.terminate(30).await;
}

/// How many requests ZooKeeper received from session `sid` (`0x…`), from
/// its `cons` four-letter word.
async fn requests_of_session(hosts: &str, sid: &str) -> Option<u64> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(hosts).await.ok()?;
    stream.write_all(b"cons").await.ok()?;
    let mut text = String::new();
    stream.read_to_string(&mut text).await.ok()?;
    let needle = format!("sid={sid},");
    let line = text.lines().find(|l| l.contains(&needle))?;
    let (_, rest) = line.split_once("recved=")?;
    rest.split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

/// Issue 10: the reporting sweep of a fresh worker process costs no
/// ZooKeeper read per finished batch. It asks the engine which batches are
/// in a reporting status; before, it read every batch's status node (and
/// every sixth sweep, finished ones again), so with 150 finished batches a
/// new worker's first sweep sent 150 reads, and with 2,000 in the load
/// tool 4 workers ran at 0.69 of one worker's jobs/s.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fresh_workers_reporting_sweep_reads_no_finished_batch_from_zookeeper() {
    const FINISHED: usize = 150;
    let zk_server = shared();
    let hosts = zk_server.hosts();
    let root = unique_root("sweep-cost");
    let dir = tempfile::tempdir().expect("tempdir");
    let s = start(dir.path(), &hosts, &root, Some(&["recording=on"]));
    let mut bids = Vec::new();
    for _ in 0..FINISHED {
        bids.push(s.submit(1).await);
    }
    for bid in &bids {
        batch_done(&s, bid, 120).await;
    }
    let log = dir.path().join("sweeper.log");
    let mut sweeper = Command::new(ingest_bin())
        .args([
            "worker",
            "--engine",
            &s.base,
            "--zk",
            &hosts,
            "--zk-root",
            &root,
        ])
        .args([
            "--daemons",
            "batch_reporting,batch_update_reporting",
            "--name",
            "sweeper",
        ])
        .arg("--working-storage")
        .arg(dir.path().join("sweeper"))
        .env("INGEST_WORKER_TOKEN", WORKER)
        .env("INGEST_LOG", "info,ingest_worker::daemon=debug")
        .env_remove("INGEST_DATA_DIR")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log"))
        .spawn()
        .expect("start ingest worker");
    let sid = eventually("the worker's ZooKeeper session", 30, async || {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let line = text
            .lines()
            .find(|l| l.contains("worker ZooKeeper session established"))?;
        let (_, rest) = line.split_once("session=")?;
        Some(rest.split_whitespace().next()?.to_string())
    })
    .await;
    // Its first sweep runs at once, the second 10 s later: wait until each
    // of its two daemons logged two sweeps.
    eventually("two sweeps of each reporting daemon", 60, async || {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let sweeps = |status: &str| {
            text.lines()
                .filter(|l| {
                    l.contains("reporting sweep") && l.contains(&format!("status={status}"))
                })
                .count()
        };
        (sweeps("Reporting") >= 2 && sweeps("UpdateReporting") >= 2).then_some(())
    })
    .await;
    let sent = requests_of_session(&hosts, &sid)
        .await
        .expect("ZooKeeper's cons names the worker's session");
    let _ = sweeper.kill();
    let _ = sweeper.wait();
    assert!(
        sent < (FINISHED / 2) as u64,
        "a fresh worker sent {sent} ZooKeeper requests with {FINISHED} finished batches: its sweep reads them"
    );
    let mut s = s;
    s.terminate(30).await;
}

/// A batch an admin sends back to reporting (update-reporting) enters
/// UpdateReporting without any worker's report naming it: the workers'
/// reporting sweep, which asks the engine (`GET /reporting-batches`) which
/// batches are in that status, finds it and reports it again. (The sweep
/// before read every batch's status node and skipped those it had seen
/// finished but on every sixth sweep: a batch sent back after a sweep saw
/// it Failed waited up to a minute. This test passes with either sweep; the
/// one after it is the one the old sweep fails.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_batch_sent_back_to_reporting_by_an_admin_is_reported_again_by_the_sweep() {
    let zk_server = shared();
    let root = unique_root("worker-update-reporting");
    let dir = tempfile::tempdir().expect("tempdir");
    let s = start(
        dir.path(),
        &zk_server.hosts(),
        &root,
        Some(&["recording=on"]),
    );
    // One job fails (an armed fault), so the batch ends Failed, from which
    // an admin may send it back to reporting.
    let (status, body) = s
        .call(
            reqwest::Method::POST,
            "/faults",
            crate::server::ADMIN,
            Some(json!({"state": "Storing", "reason": "one job fails"})),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let bid = s.submit(3).await;
    eventually("the batch to fail", 45, async || {
        let batch = s.get(&format!("/batches/{bid}")).await;
        (batch["status"] == "Failed").then_some(batch)
    })
    .await;
    let (status, body) = s
        .call(
            reqwest::Method::POST,
            &format!("/batches/{bid}/update-reporting"),
            crate::server::ADMIN,
            Some(json!({"reason": "the depositor asked for the report again"})),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let reports = |history: &Value| {
        history["events"]
            .as_array()
            .map(|rows| {
                rows.iter()
                    .filter(|r| r["event"] == "BatchReported")
                    .filter(|r| {
                        r["actor"]
                            .as_str()
                            .is_some_and(|a| a.starts_with("worker:"))
                    })
                    .count()
            })
            .unwrap_or(0)
    };
    let history = eventually("the batch to be reported again", 60, async || {
        let history = s.get(&format!("/batches/{bid}/history")).await;
        (reports(&history) >= 2).then_some(history)
    })
    .await;
    assert_eq!(reports(&history), 2, "{history}");
    let batch = s.get(&format!("/batches/{bid}")).await;
    assert_eq!(batch["status"], "Failed", "{batch}");
    let mut s = s;
    s.terminate(30).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_report_without_the_lock_is_refused_and_another_worker_completes_the_job() {
    let zk_server = shared();
    let hosts = zk_server.hosts();
    let root = unique_root("worker-fence");
    let dir = tempfile::tempdir().expect("tempdir");
    // The server runs every daemon but Estimating: the test is the first
    // estimating worker, a separate worker process the second.
    let s = start(
        dir.path(),
        &hosts,
        &root,
        Some(&["recording=on", "estimating=off"]),
    );
    let bid = s.submit(1).await;
    let client = zk::Client::connect(&format!("{hosts}{root}"))
        .await
        .expect("zookeeper");
    let name = eventually("the job in the estimating queue", 30, async || {
        let names = client.list_children("/jobs/states/estimating").await.ok()?;
        names.into_iter().next()
    })
    .await;
    let jid = name.split_once('-').expect("PP-JID").1.to_string();

    // The first worker locks the job, its lock is removed under it, and its
    // late report is refused.
    let lock = format!("/jobs/{jid}/lock");
    let ephemeral = zk::CreateMode::Ephemeral.with_acls(zk::Acls::anyone_all());
    // The job-pending daemon holds the lock until ZooKeeper shows the job's
    // new state, so the job can appear in the queue a moment before its lock
    // is free: take it as a worker would, once it is.
    eventually("the job's lock to be free", 30, async || {
        match client.create(&lock, b"w1", &ephemeral).await {
            Ok(_) => Some(()),
            Err(zk::Error::NodeExists) => None,
            Err(e) => panic!("lock: {e}"),
        }
    })
    .await;
    client.delete(&lock, None).await.expect("remove the lock");
    let report = json!({
        "worker": "w1",
        "session_id": client.session_id().0,
        "state": "Estimating",
        "outcome": "success",
    });
    let (status, body) = s
        .call(
            reqwest::Method::POST,
            &format!("/jobs/{jid}/outcome"),
            WORKER,
            Some(report),
        )
        .await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"]["code"], "lock_not_held", "{body}");
    let job = s.get(&format!("/jobs/{jid}")).await;
    assert_eq!(
        job["status"], "Estimating",
        "the refused report changed nothing"
    );

    // Another worker (the library `ingest worker` runs) completes the job.
    let steps = Steps::simulated(
        SimSettings::default(),
        Some(3),
        Arc::new(FixedProbe::new(0.0)),
        70.0,
        dir.path().to_path_buf(),
    );
    let workers = Workers::start(WorkerOptions {
        engine: s.base.clone(),
        token: WORKER.into(),
        zk: ZkConfig::new(hosts.clone()).with_root(root.clone()),
        name: "w2".into(),
        daemons: vec![(DaemonKind::Estimating, 2)],
        steps,
    })
    .expect("start the worker");
    batch_done(&s, &bid, 30).await;
    workers.shutdown().await;
    s.assert_walked_once(&jid).await;
    let history = s.get(&format!("/jobs/{jid}/history")).await;
    let by_w2 = history["events"]
        .as_array()
        .expect("events")
        .iter()
        .any(|r| {
            r["detail"]
                .as_str()
                .is_some_and(|d| d.starts_with("Estimating -> "))
                && r["actor"].as_str().is_some_and(|a| a.contains("w2"))
        });
    assert!(by_w2, "w2 moved the job out of Estimating: {history}");
}

/// A step that holds its first job until the gate opens, then succeeds;
/// later jobs wait (no report), so this worker takes nothing else.
struct Gate {
    open: tokio::sync::Semaphore,
    started: std::sync::atomic::AtomicBool,
}

impl Step for Gate {
    fn run<'a>(&'a self, _: &'a JobCtx) -> StepFuture<'a> {
        Box::pin(async move {
            if self.started.swap(true, Ordering::SeqCst) {
                return StepResult::Wait("the gate ran once".into());
            }
            let _permit = self.open.acquire().await;
            StepResult::Report(Outcome::success("gated"))
        })
    }
}

fn worker(s: &Server, hosts: &str, root: &str, name: &str, steps: Steps) -> Workers {
    Workers::start(WorkerOptions {
        engine: s.base.clone(),
        token: WORKER.into(),
        zk: ZkConfig::new(hosts).with_root(root),
        name: name.into(),
        daemons: vec![(DaemonKind::Estimating, 1)],
        steps,
    })
    .expect("start the worker")
}

fn simulated(dir: &Path) -> Steps {
    Steps::simulated(
        SimSettings::default(),
        Some(11),
        Arc::new(FixedProbe::new(0.0)),
        70.0,
        dir.to_path_buf(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_whose_lock_is_removed_mid_step_is_refused_and_another_completes() {
    let zk_server = shared();
    let hosts = zk_server.hosts();
    let root = unique_root("worker-steal");
    let dir = tempfile::tempdir().expect("tempdir");
    let s = start(
        dir.path(),
        &hosts,
        &root,
        Some(&["recording=on", "estimating=off"]),
    );
    let bid = s.submit(1).await;

    // Worker w1 takes the job and is held inside its step.
    let gate = Arc::new(Gate {
        open: tokio::sync::Semaphore::new(0),
        started: std::sync::atomic::AtomicBool::new(false),
    });
    let mut steps = simulated(dir.path());
    steps.set(JobState::Estimating, Arc::clone(&gate) as Arc<dyn Step>);
    let w1 = worker(&s, &hosts, &root, "w1", steps);
    let client = zk::Client::connect(&format!("{hosts}{root}"))
        .await
        .expect("zookeeper");
    let name = eventually("the job in the estimating queue", 30, async || {
        let names = client.list_children("/jobs/states/estimating").await.ok()?;
        names.into_iter().next()
    })
    .await;
    let jid = name.split_once('-').expect("PP-JID").1.to_string();
    let lock = format!("/jobs/{jid}/lock");
    eventually("w1 in its step", 30, async || {
        gate.started.load(Ordering::SeqCst).then_some(())
    })
    .await;
    assert!(
        client.check_stat(&lock).await.expect("stat").is_some(),
        "w1 holds the lock while in its step"
    );

    // Its lock is removed under it; w2 takes the job and moves it on.
    client.delete(&lock, None).await.expect("remove the lock");
    let w2 = worker(&s, &hosts, &root, "w2", simulated(dir.path()));
    eventually("w2 to finish estimating", 30, async || {
        let job = s.get(&format!("/jobs/{jid}")).await;
        (job["status"] != "Estimating").then_some(())
    })
    .await;

    // w1's late report is refused and changes nothing.
    gate.open.add_permits(1);
    let stats = w1.stats();
    eventually("w1's refused report", 30, async || {
        (stats.refused.load(Ordering::SeqCst) == 1).then_some(())
    })
    .await;
    assert_eq!(stats.accepted.load(Ordering::SeqCst), 0);
    batch_done(&s, &bid, 30).await;
    w1.shutdown().await;
    w2.shutdown().await;
    s.assert_walked_once(&jid).await;
    let history = s.get(&format!("/jobs/{jid}/history")).await;
    let estimated_by: Vec<&str> = history["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter(|r| {
            r["detail"]
                .as_str()
                .is_some_and(|d| d.starts_with("Estimating -> "))
        })
        .filter_map(|r| r["actor"].as_str())
        .collect();
    assert_eq!(estimated_by.len(), 1, "{history}");
    assert!(estimated_by[0].contains("w2"), "{history}");
}

/// Every daemon, for a worker process that does all the work.
pub(crate) const ALL_DAEMONS: &str =
    "batch_pending,batch_reporting,batch_update_reporting,job_pending,estimating,provisioning,downloading,processing,storing,recording,notify,access_small,access_large";

/// The second walk: the server runs no daemons; two separate
/// `ingest worker` processes share the work over ZooKeeper locks, and every
/// job still leaves each state exactly once; one runs without `--daemons`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_worker_processes_share_a_batch_and_do_every_job_once() {
    let zk_server = shared();
    let hosts = zk_server.hosts();
    let root = unique_root("worker-procs");
    let dir = tempfile::tempdir().expect("tempdir");
    let off: Vec<String> = ALL_DAEMONS.split(',').map(|d| format!("{d}=off")).collect();
    let off: Vec<&str> = off.iter().map(String::as_str).collect();
    let s = start(dir.path(), &hosts, &root, Some(&off));
    // Killed when the test ends, also when an assertion fails first.
    let mut workers = crate::ingest::WorkerProcs(
        (1..=2)
            .map(|n| {
                // D12: the second runs without --daemons: every daemon by
                // default (it refused to start).
                let daemons: &[&str] = match n {
                    1 => &["--daemons", ALL_DAEMONS],
                    _ => &[],
                };
                Command::new(ingest_bin())
                    .args([
                        "worker",
                        "--engine",
                        &s.base,
                        "--zk",
                        &hosts,
                        "--zk-root",
                        &root,
                    ])
                    .args(daemons)
                    .args([
                        "--name",
                        &format!("proc{n}"),
                        "--seed",
                        &n.to_string(),
                        "--provisioning-threshold",
                        "100",
                    ])
                    .arg("--working-storage")
                    .arg(dir.path())
                    .env("INGEST_WORKER_TOKEN", WORKER)
                    .env_remove("INGEST_DATA_DIR")
                    .stdout(Stdio::null())
                    .stderr(
                        std::fs::File::create(dir.path().join(format!("proc{n}.log")))
                            .expect("log"),
                    )
                    .spawn()
                    .expect("start ingest worker")
            })
            .collect(),
        (1..=2)
            .map(|n| dir.path().join(format!("proc{n}.log")))
            .collect(),
    );
    // Both processes take part (the work is shared, not done by one).
    // Which process locks a job first is a race, and a worker chains a
    // job's steps itself, so one batch can fall to one process alone (1
    // run in 7 did): up to five batches are submitted until both have
    // worked, each done whole.
    let mut actors = std::collections::BTreeSet::new();
    for _ in 0..5 {
        let bid = s.submit(40).await;
        let batch = batch_done(&s, &bid, 60).await;
        let done = batch["successful_jobs"]
            .as_array()
            .expect("successful_jobs");
        assert_eq!(done.len(), 40, "{batch}");
        actors.extend(s.worker_actors(done).await);
        if actors.iter().any(|a| a.contains("proc1")) && actors.iter().any(|a| a.contains("proc2"))
        {
            break;
        }
    }
    assert!(
        actors.iter().any(|a| a.contains("proc1")) && actors.iter().any(|a| a.contains("proc2")),
        "{actors:?}"
    );
    for w in &mut workers.0 {
        assert!(Command::new("kill")
            .args(["-TERM", &w.id().to_string()])
            .status()
            .expect("kill")
            .success());
    }
    for w in &mut workers.0 {
        let exit = eventually("ingest worker to exit", 30, async || {
            w.try_wait().expect("wait")
        })
        .await;
        assert!(exit.success(), "{exit:?}");
    }
}
