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
/// job still leaves each state exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_worker_processes_share_a_batch_and_do_every_job_once() {
    let zk_server = shared();
    let hosts = zk_server.hosts();
    let root = unique_root("worker-procs");
    let dir = tempfile::tempdir().expect("tempdir");
    let off: Vec<String> = ALL_DAEMONS.split(',').map(|d| format!("{d}=off")).collect();
    let off: Vec<&str> = off.iter().map(String::as_str).collect();
    let s = start(dir.path(), &hosts, &root, Some(&off));
    let mut workers: Vec<std::process::Child> = (1..=2)
        .map(|n| {
            Command::new(ingest_bin())
                .args([
                    "worker",
                    "--engine",
                    &s.base,
                    "--zk",
                    &hosts,
                    "--zk-root",
                    &root,
                    "--daemons",
                    ALL_DAEMONS,
                ])
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
                .stderr(Stdio::null())
                .spawn()
                .expect("start ingest worker")
        })
        .collect();
    let bid = s.submit(40).await;
    let batch = batch_done(&s, &bid, 60).await;
    let done = batch["successful_jobs"]
        .as_array()
        .expect("successful_jobs");
    assert_eq!(done.len(), 40, "{batch}");
    let actors = s.worker_actors(done).await;
    // Both processes took part (the work was shared, not done by one).
    assert!(
        actors.iter().any(|a| a.contains("proc1")) && actors.iter().any(|a| a.contains("proc2")),
        "{actors:?}"
    );
    for w in &mut workers {
        assert!(Command::new("kill")
            .args(["-TERM", &w.id().to_string()])
            .status()
            .expect("kill")
            .success());
    }
    for w in &mut workers {
        let exit = eventually("ingest worker to exit", 30, async || {
            w.try_wait().expect("wait")
        })
        .await;
        assert!(exit.success(), "{exit:?}");
    }
}
