//! The ZooKeeper projection against a real ZooKeeper: the live sink, its
//! recovery from kills and outages, fencing of a second projector, rebuild,
//! diff and repair, time travel, and oversized events.
//!
//! Every test works under its own root on the shared server (see
//! `zk_server`), so they run in parallel; the outage test has a server of
//! its own. Nothing waits by sleeping: tests wait on the sink's status watch
//! or poll ZooKeeper, always with a deadline.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ingest_engine::engine::{Engine, EngineConfig};
use ingest_events::command::{Command, Target};
use ingest_events::event::Event;
use ingest_events::log::Log;
use ingest_events::{Actor, Bid, Jid};
use ingest_projections::checkpoint::CHECKPOINT_NODE;
use ingest_projections::rebuild;
use ingest_projections::zk::{self as zkio, ReadOptions};
use ingest_projections::{
    materialize, AdminConfig, Checkpoint, RunMode, Sink, SinkConfig, SinkError, SinkReport,
    SinkState, SinkStatus, Tree, TxnLimits, Until, ZkConfig,
};
use tokio::sync::{oneshot, watch};
use zookeeper_client as zk;

use crate::util::Ingest;
use crate::zk_server::{shared, unique_root, ZkServer};

// The scenario files and their command harness, shared with the projection
// tests of `ingest-projections`.
#[path = "../../projections/tests/common/mod.rs"]
#[allow(clippy::all, unused_imports)]
mod scenario;

const DEADLINE: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------
// Helpers

/// An engine in a temporary data directory whose clock is the scenario clock
/// (`time_of(step)`), so dumps carry the scenario files' timestamps.
struct Fixture {
    ingest: Ingest,
    engine: Option<Engine>,
    step: Arc<AtomicU64>,
    actor: Actor,
}

impl Fixture {
    fn new() -> Fixture {
        let ingest = Ingest::new();
        let step = Arc::new(AtomicU64::new(0));
        let mut f = Fixture {
            ingest,
            engine: None,
            step,
            actor: Actor::admin("test"),
        };
        f.open();
        f
    }

    fn open(&mut self) {
        let mut config = EngineConfig::new(self.ingest.data_dir());
        let step = Arc::clone(&self.step);
        config.clock = Arc::new(move || scenario::time_of(step.load(Ordering::SeqCst)));
        self.engine = Some(Engine::open(config).expect("open the engine"));
    }

    /// Closes the engine (so the `ingest` binary can open the data directory).
    fn close(&mut self) {
        self.engine = None;
    }

    fn engine(&mut self) -> &mut Engine {
        self.engine.as_mut().expect("the engine is open")
    }

    fn log(&self) -> Arc<Log> {
        self.engine.as_ref().expect("open").shared_log()
    }

    fn exec(&mut self, cmd: Command) {
        self.step.fetch_add(1, Ordering::SeqCst);
        let actor = self.actor.clone();
        if let Err(e) = self.engine().execute(&actor, &cmd) {
            panic!("{cmd:?} was refused: {e}");
        }
    }

    fn head(&self) -> u64 {
        self.engine.as_ref().expect("open").log().durable_position()
    }

    /// Runs a scenario file's steps through the engine (checks and
    /// rejections are left out); returns the scenario.
    fn run_scenario(&mut self, file: &str) -> scenario::Scenario {
        self.try_scenario(file).unwrap_or_else(|e| panic!("{e}"))
    }

    /// As [`Fixture::run_scenario`]; `Err` when the scenario's own commands
    /// no longer fit the lifecycle rules (the harness refuses one).
    fn try_scenario(&mut self, file: &str) -> Result<scenario::Scenario, String> {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("projections/tests/scenarios")
            .join(file);
        self.try_scenario_at(&path)
    }

    /// As [`Fixture::try_scenario`], for a scenario file anywhere.
    fn try_scenario_at(&mut self, path: &Path) -> Result<scenario::Scenario, String> {
        let file = path.display();
        let text = std::fs::read_to_string(path).expect("scenario file");
        let sc: scenario::Scenario = serde_norway::from_str(&text).expect("scenario");
        let mut h = scenario::Harness::new();
        for step in &sc.steps {
            match step {
                scenario::Step::Check(_) => continue,
                scenario::Step::Reject(inner) => {
                    let cmd = h.command(inner).expect("a command");
                    assert!(h.run(&cmd).is_err(), "{file}: {cmd:?} should be refused");
                    continue;
                }
                _ => {}
            }
            let cmd = h.command(step).expect("a command");
            self.step.store(h.steps, Ordering::SeqCst);
            h.run(&cmd)
                .map_err(|e| format!("{file}: the harness refuses {cmd:?}: {e}"))?;
            let actor = self.actor.clone();
            self.engine()
                .execute(&actor, &cmd)
                .unwrap_or_else(|e| panic!("{file}: the engine refused {cmd:?}: {e}"));
        }
        Ok(sc)
    }

    /// Submits `batches` batches of `jobs` jobs and walks every job to
    /// Completed and every batch through reporting; `cleanup` removes them.
    fn walk_batches(&mut self, batches: usize, jobs: usize, cleanup: bool) -> Vec<Bid> {
        let mut bids = Vec::new();
        for _ in 0..batches {
            let state = self.engine().state();
            let bid = state.next_bid();
            let first = state.next_jid().0;
            let n = state.batches.len() as u128 + 1;
            self.exec(Command::SubmitBatch {
                uuid: scenario::submission_uuid(n),
                submission: scenario::submission("demo_content", &[]),
            });
            let specs = (0..jobs)
                .map(|i| {
                    scenario::spec(&format!(
                        "https://example.org/object-{}.zip",
                        first + i as u64
                    ))
                })
                .collect();
            self.exec(Command::AcquireBatch { bid, jobs: specs });
            for i in 0..jobs as u64 {
                let jid = Jid(first + i);
                self.exec(Command::StartJob { jid });
                for _ in 0..7 {
                    self.exec(Command::SetJobStatus {
                        jid,
                        target: Target::Success,
                        message: String::new(),
                        priority: None,
                    });
                }
            }
            self.exec(Command::ReportBatch {
                bid,
                notification_error: None,
            });
            bids.push(bid);
        }
        if cleanup {
            self.exec(Command::Cleanup { before: None });
        }
        bids
    }
}

fn zk_config(hosts: &str, root: &str) -> ZkConfig {
    let mut c = ZkConfig::new(hosts).with_root(root);
    c.session_timeout = Duration::from_secs(3);
    c.connect_timeout = Duration::from_secs(5);
    c.request_timeout = Duration::from_secs(5);
    c
}

fn sink_config(zk: &ZkConfig, identity: &str) -> SinkConfig {
    let mut c = SinkConfig::new(zk.clone(), identity);
    c.backoff_max = Duration::from_millis(500);
    c.standby_recheck = Duration::from_millis(200);
    c
}

/// The tree the log implies now.
fn log_tree(log: &Log) -> Tree {
    let records: Vec<_> = log
        .read_from(1)
        .collect::<Result<_, _>>()
        .expect("read the log");
    materialize(&records, Until::End).expect("materialize")
}

/// The live tree under the root, without `/ingest-engine` and ephemeral nodes.
async fn live_tree(zk: &ZkConfig) -> Tree {
    let client = zkio::connect(zk).await.expect("connect");
    zkio::read_tree(&client, zk, ReadOptions::default())
        .await
        .expect("read the live tree")
        .without_ephemeral()
}

#[track_caller]
fn assert_same_tree(expected: &Tree, actual: &Tree, what: &str) {
    let d = expected.diff(actual);
    assert!(
        d.is_empty(),
        "{what}: the live tree differs from the log's:\n{d}"
    );
}

/// Waits until the status satisfies `pred`, at most [`DEADLINE`].
async fn wait_status(
    rx: &mut watch::Receiver<SinkStatus>,
    what: &str,
    pred: impl Fn(&SinkStatus) -> bool,
) -> SinkStatus {
    let until = tokio::time::Instant::now() + DEADLINE;
    loop {
        {
            let s = rx.borrow_and_update();
            if pred(&s) {
                return s.clone();
            }
        }
        match tokio::time::timeout_at(until, rx.changed()).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => {
                let s = rx.borrow().clone();
                assert!(pred(&s), "{what}: the sink ended with {s:?}");
                return s;
            }
            Err(_) => panic!(
                "{what}: not reached within {DEADLINE:?}; last status {:?}",
                *rx.borrow()
            ),
        }
    }
}

fn caught_up(s: &SinkStatus) -> bool {
    s.state == SinkState::Connected && s.checkpoint == s.durable && s.events_behind == 0
}

/// Polls `check` until it returns `Some`, at most [`DEADLINE`] (a short
/// pause between tries; the condition, not the pause, is what is waited for).
async fn eventually<T, F: Future<Output = Option<T>>>(
    what: &str,
    mut check: impl FnMut() -> F,
) -> T {
    let until = Instant::now() + DEADLINE;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            Instant::now() < until,
            "{what}: not reached within {DEADLINE:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A sink running in the background until `stop` is sent.
struct Running {
    status: watch::Receiver<SinkStatus>,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<SinkReport, SinkError>>,
}

fn spawn_sink(log: Arc<Log>, config: SinkConfig, mode: RunMode) -> Running {
    let sink = Sink::new(log, config).expect("sink");
    let status = sink.status();
    let (stop, stopped) = oneshot::channel::<()>();
    let token = tokio_util::sync::CancellationToken::new();
    let cancel = token.clone();
    tokio::spawn(async move {
        let _ = stopped.await;
        cancel.cancel();
    });
    let task = tokio::spawn(sink.run(mode, token));
    Running {
        status,
        stop: Some(stop),
        task,
    }
}

impl Running {
    async fn finish(mut self) -> SinkReport {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(DEADLINE, self.task)
            .await
            .expect("the sink stops")
            .expect("the sink task")
            .expect("the sink run")
    }
}

async fn checkpoint_of(zk: &ZkConfig) -> Option<Checkpoint> {
    let client = zkio::connect(zk).await.ok()?;
    let (data, _) = client.get_data(CHECKPOINT_NODE).await.ok()?;
    Checkpoint::from_json(&data).ok()
}

async fn catch_up(log: Arc<Log>, zk: &ZkConfig, identity: &str) -> SinkReport {
    let sink = Sink::new(log, sink_config(zk, identity)).expect("sink");
    tokio::time::timeout(
        DEADLINE,
        sink.run(RunMode::CatchUp, tokio_util::sync::CancellationToken::new()),
    )
    .await
    .expect("catch-up within the deadline")
    .expect("catch-up")
}

// ---------------------------------------------------------------------------
// Tests

/// Every scenario file, projected live while its commands run, gives the
/// tree the log implies and the scenario's expected dumps; the first root
/// starts with base nodes made by Merritt's `initNodes`, which are accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_projection_equals_the_log_in_every_scenario() {
    let server = shared();
    // The transitions-document scenario first: its root gets Merritt's nodes.
    let files = [
        "transitions-document.yaml",
        "job-lifecycle.yaml",
        "priority-change.yaml",
        "requeue.yaml",
        "holds.yaml",
        "pause-resume.yaml",
        "deletes.yaml",
        "reporting.yaml",
        "cleanup.yaml",
    ];
    let mut skipped = Vec::new();
    for (i, file) in files.iter().enumerate() {
        let root = unique_root("scenario");
        let zk = zk_config(&server.hosts(), &root);
        if i == 0 {
            // mrt-zk's initNodes: the job and batch parents and the queues.
            let client = zkio::connect(&zk).await.expect("connect");
            let acl = zkio::open_acl();
            for p in [
                "/batches",
                "/batch-uuids",
                "/jobs",
                "/jobs/states",
                "/jobs/states/pending",
            ] {
                client
                    .create(p, b"", &acl)
                    .await
                    .expect("create like initNodes");
            }
        }
        let mut f = Fixture::new();
        let mut sink = spawn_sink(f.log(), sink_config(&zk, "scenarios"), RunMode::Follow);
        let sc = match f.try_scenario(file) {
            Ok(sc) => sc,
            // A scenario that no longer fits the lifecycle rules fails the
            // projection scenario tests, which own it; here it proves nothing
            // about the sink. The transitions document must always run.
            Err(e) if *file != "transitions-document.yaml" => {
                eprintln!("skipping {file}: {e}");
                skipped.push(*file);
                sink.finish().await;
                continue;
            }
            Err(e) => panic!("{e}"),
        };
        let head = f.head();
        wait_status(&mut sink.status, file, |s| {
            caught_up(s) && s.checkpoint == head
        })
        .await;
        let live = live_tree(&zk).await;
        assert_same_tree(&log_tree(&f.log()), &live, file);
        for (prefix, want) in sc.expect.iter().flatten() {
            let got = live.dump_yaml(Some(prefix));
            assert!(
                &got == want,
                "{file}: the live tree under {prefix} differs from the scenario:\n{}",
                scenario::text_diff(want, &got)
            );
        }
        let report = sink.finish().await;
        assert_eq!(report.checkpoint.position, head, "{file}");
        assert_eq!(report.conflicts, 0, "{file}");
    }
    assert!(
        files.len() - skipped.len() >= 5,
        "too many scenarios skipped: {skipped:?}"
    );
}

/// A projector aborted at arbitrary points (mid-transaction included) and
/// restarted, many times, leaves no node missing or duplicated: the final
/// tree equals the log's. Small caps make many transactions and cut the
/// cleanups of batches between jobs (partial checkpoints).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_projector_resumes_without_gaps_or_duplicates() {
    let server = shared();
    let root = unique_root("abort");
    let zk = zk_config(&server.hosts(), &root);
    let mut f = Fixture::new();
    f.walk_batches(6, 8, true);
    f.walk_batches(2, 3, false);
    let head = f.head();
    let mut config = sink_config(&zk, "abort");
    config.limits = TxnLimits {
        max_bytes: 4096,
        max_ops: 48,
    };
    let mut aborted_at = Vec::new();
    for round in 1..=8u64 {
        let mut sink = spawn_sink(f.log(), config.clone(), RunMode::CatchUp);
        let s = wait_status(&mut sink.status, "progress", |s| {
            s.transactions > round % 4 || matches!(s.state, SinkState::Stopped(_))
        })
        .await;
        sink.task.abort();
        let _ = sink.task.await;
        aborted_at.push(s.checkpoint);
        if s.checkpoint >= head {
            break;
        }
    }
    assert!(
        aborted_at.iter().any(|p| *p > 0 && *p < head),
        "no abort landed mid-way: {aborted_at:?} (head {head})"
    );
    let report = catch_up(f.log(), &zk, "abort-final").await;
    assert_eq!(report.checkpoint.position, head);
    assert_eq!(report.checkpoint.partial, None);
    assert_same_tree(
        &log_tree(&f.log()),
        &live_tree(&zk).await,
        "after the aborts",
    );
}

/// The `ingest project` process killed with SIGKILL between (or during)
/// transactions: a new process resumes from the checkpoint once the dead
/// session's leadership lapses, and the tree equals the log's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_project_process_resumes() {
    let server = shared();
    let root = unique_root("sigkill");
    let zk = zk_config(&server.hosts(), &root);
    let mut f = Fixture::new();
    f.walk_batches(30, 6, false);
    let head = f.head();
    f.close();
    let args = [
        "project",
        "--zk",
        &server.hosts(),
        "--zk-root",
        &root,
        "--max-txn-ops",
        "24",
        "--zk-session-timeout",
        "2",
    ];
    let mut child = std::process::Command::new(crate::util::ingest_bin())
        .arg("--data-dir")
        .arg(f.ingest.data_dir())
        .args(args)
        .env("INGEST_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("start ingest project");
    let at = eventually("the first checkpoint", || async {
        checkpoint_of(&zk)
            .await
            .filter(|c| c.position > 0)
            .map(|c| c.position)
    })
    .await;
    child.kill().expect("SIGKILL");
    let _ = child.wait();
    assert!(
        at < head,
        "the run finished before it could be killed ({at} of {head})"
    );
    let killed_at = checkpoint_of(&zk).await.expect("checkpoint").position;
    let run = f.ingest.run(&args).ok();
    assert!(
        run.stdout.contains(&format!("checkpoint position {head} ")),
        "{}",
        run.stdout
    );
    let applied: u64 = run
        .stdout
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .expect("events applied");
    assert_eq!(applied, head - killed_at, "{}", run.stdout);
    f.open();
    assert_same_tree(&log_tree(&f.log()), &live_tree(&zk).await, "after SIGKILL");
}

/// Two projectors on one root: one leads and writes, the other stands by and
/// writes nothing (no BadVersion storm); when the leader goes, the other takes
/// over and the tree stays right.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_projectors_on_one_root_only_one_writes() {
    let server = shared();
    let root = unique_root("two");
    let zk = zk_config(&server.hosts(), &root);
    let mut f = Fixture::new();
    let mut a = spawn_sink(f.log(), sink_config(&zk, "projector-a"), RunMode::Follow);
    let mut b = spawn_sink(f.log(), sink_config(&zk, "projector-b"), RunMode::Follow);
    f.walk_batches(4, 3, false);
    let head = f.head();
    let done = |s: &SinkStatus| s.checkpoint == head && s.events_behind == 0;
    let sa = wait_status(&mut a.status, "a", |s| {
        done(s) && !matches!(s.state, SinkState::Starting | SinkState::Disconnected)
    })
    .await;
    let sb = wait_status(&mut b.status, "b", |s| {
        done(s) && !matches!(s.state, SinkState::Starting | SinkState::Disconnected)
    })
    .await;
    let (leader, standby) = if sa.state == SinkState::Connected {
        (a, b)
    } else {
        (b, a)
    };
    let (ls, ss) = (
        leader.status.borrow().clone(),
        standby.status.borrow().clone(),
    );
    assert_eq!(ls.state, SinkState::Connected, "{ls:?}");
    assert!(matches!(ss.state, SinkState::Standby { .. }), "{ss:?}");
    assert!(ls.transactions > 0);
    assert_eq!(ss.transactions, 0, "the standby wrote: {ss:?}");
    assert!(ls.conflicts + ss.conflicts <= 1, "{ls:?} {ss:?}");
    assert_same_tree(&log_tree(&f.log()), &live_tree(&zk).await, "two projectors");
    assert!(sa.checkpoint == head && sb.checkpoint == head);

    // The leader stops (its session closes); the other takes over.
    let first = leader.finish().await;
    assert_eq!(first.checkpoint.position, head);
    let mut standby = standby;
    f.walk_batches(2, 2, true);
    let head = f.head();
    let s = wait_status(&mut standby.status, "takeover", |s| {
        caught_up(s) && s.checkpoint == head
    })
    .await;
    assert!(s.transactions > 0);
    assert!(s.conflicts <= 1, "{s:?}");
    assert_same_tree(
        &log_tree(&f.log()),
        &live_tree(&zk).await,
        "after the takeover",
    );
    standby.finish().await;
}

/// ZooKeeper stopped while commands keep coming: the engine keeps accepting
/// them, the sink reports itself disconnected and falling behind, and once
/// ZooKeeper is back the tree converges to the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tree_converges_after_a_zookeeper_outage() {
    let server = ZkServer::dedicated();
    let root = unique_root("outage");
    let zk = zk_config(&server.hosts(), &root);
    let mut f = Fixture::new();
    let mut sink = spawn_sink(f.log(), sink_config(&zk, "outage"), RunMode::Follow);
    f.walk_batches(3, 3, false);
    let head = f.head();
    wait_status(&mut sink.status, "before the outage", |s| {
        caught_up(s) && s.checkpoint == head
    })
    .await;

    server.stop();
    f.walk_batches(3, 4, true);
    let head = f.head();
    let s = wait_status(&mut sink.status, "the outage noticed", |s| {
        s.state == SinkState::Disconnected && s.durable == head
    })
    .await;
    assert!(s.events_behind > 0, "{s:?}");
    assert!(s.oldest_unprojected.is_some(), "{s:?}");

    server.start();
    let s = wait_status(&mut sink.status, "after the outage", |s| {
        caught_up(s) && s.checkpoint == head
    })
    .await;
    assert_eq!(s.seconds_behind, 0.0);
    assert_same_tree(
        &log_tree(&f.log()),
        &live_tree(&zk).await,
        "after the outage",
    );
    sink.finish().await;
}

/// `ingest rebuild` after random nodes were deleted and others changed gives
/// back the tree the log says, leaves a worker's lock alone (same session),
/// and deletes a lock under a job the log does not have along with it. It
/// refuses while a running projector holds leadership.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rebuild_restores_the_tree_and_leaves_locks_alone() {
    let server = shared();
    let root = unique_root("rebuild");
    let zk = zk_config(&server.hosts(), &root);
    let mut f = Fixture::new();
    f.run_scenario("transitions-document.yaml");
    f.walk_batches(3, 4, false);
    let head = f.head();
    let mut sink = spawn_sink(f.log(), sink_config(&zk, "rebuild"), RunMode::Follow);
    wait_status(&mut sink.status, "projected", |s| {
        caught_up(s) && s.checkpoint == head
    })
    .await;

    // Fenced out while the projector leads.
    let mut admin = AdminConfig::new(zk.clone(), "test-rebuild");
    admin.leader_wait = Duration::from_millis(300);
    let refused = rebuild::rebuild(&f.log(), &admin, &mut |_| {}).await;
    assert!(
        matches!(refused, Err(SinkError::NotLeader { .. })),
        "{refused:?}"
    );
    sink.finish().await;

    // Drift: random nodes deleted (children first), data changed, a stray job
    // with a worker's lock, and a live worker's lock on a real job.
    let worker = zkio::connect(&zk).await.expect("worker session");
    let ephemeral = zk::CreateMode::Ephemeral.with_acls(zk::Acls::anyone_all());
    let acl = zkio::open_acl();
    worker
        .create("/jobs/jid0000000001/lock", b"", &ephemeral)
        .await
        .expect("lock a job");
    worker
        .create("/jobs/jid0000009999", b"", &acl)
        .await
        .expect("stray job");
    worker
        .create("/jobs/jid0000009999/lock", b"", &ephemeral)
        .await
        .expect("lock the stray job");
    let expected = log_tree(&f.log());
    let mut rng = fastrand::Rng::with_seed(7);
    let mut deleted = 0;
    let paths: Vec<String> = expected.iter().map(|(p, _)| p.to_string()).collect();
    for p in paths.iter().rev() {
        if rng.u32(0..4) == 0 && !p.ends_with("/lock") {
            match worker.delete(p, None).await {
                Ok(()) => deleted += 1,
                Err(zk::Error::NotEmpty | zk::Error::NoNode) => {}
                Err(e) => panic!("delete {p}: {e}"),
            }
        }
    }
    assert!(deleted > 10, "deleted only {deleted}");
    worker
        .set_data("/jobs/jid0000000002/status", b"{}", None)
        .await
        .ok();
    let (_, lock_before) = worker
        .get_data("/jobs/jid0000000001/lock")
        .await
        .expect("lock");
    // Merritt's object locks belong to their holders (mrt-store holds
    // /locks/storage/<ark> while it writes): a persistent one and another
    // session's ephemeral one. Regression: rebuild deleted both.
    let foreign = [
        "/locks/storage",
        "/locks/storage/ark_99999_fk4x",
        "/locks/inventory",
        "/locks/inventory/ark_99999_fk4x",
    ];
    for (i, p) in foreign.iter().enumerate() {
        let mode = if i == 3 { &ephemeral } else { &acl };
        match worker.create(p, b"", mode).await {
            // The lock parents are projected (mrt-zk's initLocks).
            Ok(_) | Err(zk::Error::NodeExists) => {}
            Err(e) => panic!("a foreign node {p}: {e}"),
        }
    }

    f.close();
    let run = f
        .ingest
        .run(&["rebuild", "--zk", &server.hosts(), "--zk-root", &root])
        .ok();
    for p in foreign {
        assert!(
            worker.check_stat(p).await.expect("stat").is_some(),
            "rebuild removed {p}, which is not the projection's"
        );
    }
    assert!(
        run.stdout.contains("1 deleted with their node"),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout.contains("deleted lock /jobs/jid0000009999/lock"),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout.contains(&format!("checkpoint position {head} ")),
        "{}",
        run.stdout
    );
    let (_, lock_after) = worker
        .get_data("/jobs/jid0000000001/lock")
        .await
        .expect("the lock stays");
    assert_eq!(lock_before.ephemeral_owner, lock_after.ephemeral_owner);
    assert_eq!(lock_after.ephemeral_owner, worker.session_id().0);
    // The projection's own nodes match the log; the foreign ones are left.
    let d = expected.diff_filtered(&live_tree(&zk).await, ingest_projections::layout::is_owned);
    assert!(d.is_empty(), "after the rebuild:\n{d}");
    let cp = checkpoint_of(&zk).await.expect("checkpoint");
    assert_eq!((cp.position, cp.rebuilding), (head, None));
    // The rebuild records nothing; `diff` agrees.
    f.open();
    assert_eq!(f.head(), head);
    f.close();
    f.ingest
        .run(&["diff", "--zk", &server.hosts(), "--zk-root", &root])
        .ok();
}

/// A rebuild keeps several transactions in flight. One refused in the
/// middle (a node someone created after the tree was read) makes those sent
/// behind it fail on the checkpoint's version: not a fence, a round. The
/// rebuild reads the tree again and converges.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_transaction_among_several_in_flight_costs_a_round_not_a_fence() {
    let server = shared();
    let root = unique_root("rebuild-in-flight");
    let zk = zk_config(&server.hosts(), &root);
    let mut f = Fixture::new();
    f.walk_batches(5, 4, false);
    catch_up(f.log(), &zk, "projector").await;
    // Every job's nodes gone: the rebuild has a dozen transactions to send.
    let expected = log_tree(&f.log());
    let client = zkio::connect(&zk).await.expect("connect");
    let jobs: Vec<String> = expected
        .iter()
        .map(|(p, _)| p.to_string())
        .filter(|p| p.starts_with("/jobs/jid"))
        .collect();
    for p in jobs.iter().rev() {
        client.delete(p, None).await.expect("delete a job's node");
    }
    let heads: Vec<&String> = jobs
        .iter()
        .filter(|p| p.matches('/').count() == 2)
        .collect();
    assert_eq!(heads.len(), 20, "{heads:?}");
    // A job in the middle: its transaction has others behind it.
    let intruder = heads[10].clone();

    let mut admin = AdminConfig::new(zk.clone(), "test-rebuild");
    admin.limits = TxnLimits {
        max_bytes: 512 * 1024,
        max_ops: 24,
    };
    admin.in_flight = 4;
    let mut created = false;
    let report = rebuild::rebuild(&f.log(), &admin, &mut |p| {
        if let rebuild::Progress::Applying { done: 0, .. } = p {
            if created {
                return;
            }
            created = true;
            // Written by another session once the tree was read and before
            // the first transaction is sent (this callback runs on the
            // rebuild's task: a thread of its own does the write).
            let (zk, path) = (zk.clone(), intruder.clone());
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("runtime");
                rt.block_on(async {
                    let c = zkio::connect(&zk).await.expect("connect");
                    c.create(&path, b"not the log's", &zkio::open_acl())
                        .await
                        .expect("create the intruder");
                });
            })
            .join()
            .expect("the intruding writer");
        }
    })
    .await
    .expect("the rebuild converges");
    assert!(created);
    let c = &report.converge;
    assert!(
        c.transactions > 4,
        "{} transactions: too few to have several in flight",
        c.transactions
    );
    // Round 1 was cut short by the refusal, round 2 finished (the intruder
    // set to the log's data), round 3 found nothing left.
    assert_eq!(c.rounds, 3, "{c:?}");
    assert_eq!(c.set, 1, "{c:?}");
    let d = expected.diff_filtered(&live_tree(&zk).await, ingest_projections::layout::is_owned);
    assert!(d.is_empty(), "after the rebuild:\n{d}");
    let cp = checkpoint_of(&zk).await.expect("checkpoint");
    assert_eq!((cp.position, cp.rebuilding), (f.head(), None));
}

/// A server that answers nothing for longer than zookeeper-client waits
/// (2/5 of the session timeout) makes the client drop the connection with
/// transactions in flight, their outcome unknown: the rebuild reads the
/// checkpoint to learn which landed and finishes. Regression: a 1M-event
/// rebuild gave up ("no response from connection in 2400ms") while the
/// server paused for garbage collection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuild_outlasts_a_server_that_stops_answering_for_a_while() {
    let server = ZkServer::dedicated();
    let root = unique_root("rebuild-pause");
    let mut zk = zk_config(&server.hosts(), &root);
    zk.session_timeout = Duration::from_secs(6);
    zk.request_timeout = Duration::from_secs(20);
    let mut f = Fixture::new();
    f.walk_batches(5, 4, false);
    let expected = log_tree(&f.log());
    let pid = std::fs::read_to_string(server.dir.join("zookeeper_server.pid"))
        .expect("the server's pid file");
    let pid = pid.trim().to_string();
    let signal = |sig: &str, pid: &str| {
        let status = std::process::Command::new("kill")
            .args([sig, pid])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill {sig} {pid}");
    };
    let mut admin = AdminConfig::new(zk.clone(), "test-rebuild");
    admin.limits = TxnLimits {
        max_bytes: 512 * 1024,
        max_ops: 24,
    };
    admin.in_flight = 4;
    let mut resumer = None;
    let report = rebuild::rebuild(&f.log(), &admin, &mut |p| {
        if let rebuild::Progress::Applying { done: 0, .. } = p {
            if resumer.is_some() {
                return;
            }
            // Frozen before the first transaction goes out, for longer
            // than the client's 2.4 s and well within the session.
            signal("-STOP", &pid);
            let pid = pid.clone();
            resumer = Some(std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(3500));
                signal("-CONT", &pid);
            }));
        }
    })
    .await;
    resumer
        .expect("the server was paused")
        .join()
        .expect("the server resumed");
    let report = report.expect("the rebuild finishes");
    assert!(report.converge.transactions > 4, "{report:?}");
    let d = expected.diff_filtered(&live_tree(&zk).await, ingest_projections::layout::is_owned);
    assert!(d.is_empty(), "after the rebuild:\n{d}");
    let cp = checkpoint_of(&zk).await.expect("checkpoint");
    assert_eq!((cp.position, cp.rebuilding), (f.head(), None));
}

/// `ingest diff` finds a missing, an unexpected and a differing node (exit
/// 1), ignores worker locks; `diff --repair` fixes them and appends a
/// `TreeRepaired` event naming the paths; `diff` is then clean (exit 0).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn diff_finds_each_kind_of_drift_and_repair_records_it() {
    let server = shared();
    let root = unique_root("diff");
    let zk = zk_config(&server.hosts(), &root);
    let mut f = Fixture::new();
    f.run_scenario("transitions-document.yaml");
    catch_up(f.log(), &zk, "diff").await;
    f.close();
    let hosts = server.hosts();
    let diff = |repair: bool| {
        let mut args = vec!["diff", "--zk", &hosts, "--zk-root", &root];
        if repair {
            args.push("--repair");
        }
        f.ingest.run(&args)
    };
    let clean = diff(false);
    assert_eq!(clean.code, 0, "{}{}", clean.stdout, clean.stderr);

    let client = zkio::connect(&zk).await.expect("connect");
    let acl = zkio::open_acl();
    client
        .delete("/jobs/jid0000000002/priority", None)
        .await
        .expect("make one missing");
    client
        .create("/jobs/states/pending/01-jid0000000077", b"", &acl)
        .await
        .expect("make one unexpected");
    client
        .set_data(
            "/batches/bid0000000001/status",
            br#"{"status":"Bogus"}"#,
            None,
        )
        .await
        .expect("make one differ");
    let ephemeral = zk::CreateMode::Ephemeral.with_acls(zk::Acls::anyone_all());
    client
        .create("/jobs/jid0000000001/lock", b"", &ephemeral)
        .await
        .expect("a worker's lock");

    let found = diff(false);
    assert_eq!(found.code, 1, "{}{}", found.stdout, found.stderr);
    for line in [
        "- /jobs/jid0000000002/priority (missing)",
        "+ /jobs/states/pending/01-jid0000000077 (unexpected)",
        "~ /batches/bid0000000001/status",
        "3 difference(s): 1 missing, 1 unexpected, 1 differing",
    ] {
        assert!(
            found.stdout.contains(line),
            "{line:?} not in\n{}",
            found.stdout
        );
    }
    assert!(
        !found.stdout.contains("+ /jobs/jid0000000001/lock"),
        "{}",
        found.stdout
    );

    let repaired = diff(true);
    assert_eq!(repaired.code, 0, "{}{}", repaired.stdout, repaired.stderr);
    let position: u64 = repaired
        .stdout
        .split("recorded as event #")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no event position in\n{}", repaired.stdout));
    let again = diff(false);
    assert_eq!(again.code, 0, "{}{}", again.stdout, again.stderr);
    assert!(client
        .check_stat("/jobs/jid0000000001/lock")
        .await
        .expect("stat")
        .is_some());

    f.open();
    let record = f.log().read_one(position).expect("the repair event");
    match record.event {
        Event::TreeRepaired(e) => {
            let paths: Vec<&str> = e.paths.iter().map(String::as_str).collect();
            assert_eq!(
                paths,
                [
                    "/batches/bid0000000001/status",
                    "/jobs/jid0000000002/priority",
                    "/jobs/states/pending/01-jid0000000077"
                ]
            );
        }
        other => panic!("expected TreeRepaired at {position}, found {other:?}"),
    }
    // The projector applies the TreeRepaired event (no node changes).
    let report = catch_up(f.log(), &zk, "diff-after").await;
    assert_eq!(report.checkpoint.position, position);
    assert_same_tree(
        &log_tree(&f.log()),
        &live_tree(&zk).await,
        "after the repair",
    );
}

/// Issue 15 item 3: a persistent `/jobs/JID/lock` (a crashed Merritt tool or
/// an admin left it; no session owns it) blocks its job for ever. `ingest
/// diff` reports it as drift (exit 1), `diff --repair` removes it and records
/// a `TreeRepaired` event naming it, and so does `rebuild`; Merritt's object
/// locks (`/locks/storage/<ark>`, `/locks/localid/<lid>`) and a live worker's
/// ephemeral lock survive both. Before, diff said "worker locks not
/// compared" and both left it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_job_lock_is_reported_and_removed_by_repair_and_rebuild() {
    let server = shared();
    let root = unique_root("stale-lock");
    let zk = zk_config(&server.hosts(), &root);
    let mut f = Fixture::new();
    f.run_scenario("transitions-document.yaml");
    catch_up(f.log(), &zk, "stale").await;
    f.close();
    let hosts = server.hosts();
    let run = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend(["--zk", &hosts, "--zk-root", &root]);
        f.ingest.run(&all)
    };
    let foreign_client = zkio::connect(&zk).await.expect("a foreign client");
    let acl = zkio::open_acl();
    let ephemeral = zk::CreateMode::Ephemeral.with_acls(zk::Acls::anyone_all());
    for parent in ["/locks/storage", "/locks/localid", "/locks/inventory"] {
        assert!(
            foreign_client
                .check_stat(parent)
                .await
                .expect("stat")
                .is_some(),
            "{parent} is created with the base nodes (mrt-zk initLocks)"
        );
    }
    let kept = [
        "/locks/storage/ark_99999_fk4x",
        "/locks/localid/loc001_ark_99999_owner",
    ];
    for p in kept {
        foreign_client
            .create(p, b"", &acl)
            .await
            .expect("Merritt's object lock");
    }
    foreign_client
        .create("/jobs/jid0000000002/lock", b"", &ephemeral)
        .await
        .expect("a live worker's lock");
    let stale = "/jobs/jid0000000001/lock";
    foreign_client
        .create(stale, b"", &acl)
        .await
        .expect("a persistent lock");

    let found = run(&["diff"]);
    assert_eq!(found.code, 1, "{}{}", found.stdout, found.stderr);
    assert!(
        found.stdout.contains(&format!("stale lock {stale}")),
        "{}",
        found.stdout
    );
    assert!(
        !found.stdout.contains("stale lock /jobs/jid0000000002/lock"),
        "{}",
        found.stdout
    );
    let repaired = run(&["diff", "--repair"]);
    assert_eq!(repaired.code, 0, "{}{}", repaired.stdout, repaired.stderr);
    assert!(
        repaired
            .stdout
            .contains(&format!("removed stale lock {stale}")),
        "{}",
        repaired.stdout
    );
    let recorded = |stdout: &str| -> u64 {
        stdout
            .split("recorded as event #")
            .nth(1)
            .and_then(|s| s.split_whitespace().next())
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("no event position in\n{stdout}"))
    };
    let first = recorded(&repaired.stdout);
    assert!(foreign_client
        .check_stat(stale)
        .await
        .expect("stat")
        .is_none());
    let clean = run(&["diff"]);
    assert_eq!(clean.code, 0, "{}{}", clean.stdout, clean.stderr);

    // Again, removed by a rebuild this time.
    foreign_client
        .create(stale, b"", &acl)
        .await
        .expect("a persistent lock again");
    let rebuilt = run(&["rebuild"]);
    assert_eq!(rebuilt.code, 0, "{}{}", rebuilt.stdout, rebuilt.stderr);
    let second = recorded(&rebuilt.stdout);
    assert!(foreign_client
        .check_stat(stale)
        .await
        .expect("stat")
        .is_none());
    for p in kept.iter().chain(&["/jobs/jid0000000002/lock"]) {
        assert!(
            foreign_client.check_stat(p).await.expect("stat").is_some(),
            "{p} is not the projection's and must survive"
        );
    }
    f.open();
    for position in [first, second] {
        match f.log().read_one(position).expect("the repair event").event {
            Event::TreeRepaired(e) => assert_eq!(e.paths, [stale]),
            other => panic!("expected TreeRepaired at {position}, found {other:?}"),
        }
    }
}

/// `ingest tree --at POSITION` (and `--at TIME`) prints the tree ZooKeeper
/// actually held when the projector stood at that position.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tree_at_an_earlier_position_is_the_tree_of_that_time() {
    let server = shared();
    let root = unique_root("at");
    let zk = zk_config(&server.hosts(), &root);
    let mut f = Fixture::new();
    let mut sink = spawn_sink(f.log(), sink_config(&zk, "at"), RunMode::Follow);
    let mut seen: BTreeMap<u64, String> = BTreeMap::new();
    let bid = f.engine().state().next_bid();
    let commands = vec![
        Command::SubmitBatch {
            uuid: scenario::submission_uuid(1),
            submission: scenario::submission("demo_content", &[]),
        },
        Command::AcquireBatch {
            bid,
            jobs: vec![
                scenario::spec("https://example.org/a.zip"),
                scenario::spec("https://example.org/b.zip"),
            ],
        },
        Command::StartJob { jid: Jid(1) },
        Command::SetJobStatus {
            jid: Jid(1),
            target: Target::Fail,
            message: "boom".into(),
            priority: Some(3),
        },
        Command::HoldCollection {
            profile: "demo_content".into(),
            reason: "migration".into(),
        },
        Command::RequeueJob {
            jid: Jid(1),
            reason: "fixed".into(),
        },
    ];
    for cmd in commands {
        f.exec(cmd);
        let head = f.head();
        wait_status(&mut sink.status, "step", |s| {
            caught_up(s) && s.checkpoint == head
        })
        .await;
        seen.insert(head, live_tree(&zk).await.dump_yaml(None));
    }
    sink.finish().await;
    let times: BTreeMap<u64, String> = f
        .log()
        .read_from(1)
        .map(|r| r.expect("record"))
        .map(|r| (r.envelope.position, r.envelope.timestamp.to_rfc3339()))
        .collect();
    f.close();
    for (position, live) in &seen {
        let at = f.ingest.run(&["tree", "--at", &position.to_string()]).ok();
        assert!(
            &at.stdout == live,
            "tree --at {position} differs from the live tree of that time:\n{}",
            scenario::text_diff(live, &at.stdout)
        );
        let by_time = f.ingest.run(&["tree", "--at", &times[position]]).ok();
        assert_eq!(&by_time.stdout, live, "tree --at {}", times[position]);
    }
    let prefix = f
        .ingest
        .run(&[
            "tree",
            "--at",
            "2",
            "--path",
            "/batches/bid0000000001/status",
        ])
        .ok();
    assert!(
        prefix
            .stdout
            .starts_with("/batches/bid0000000001/status:\n  status: Processing"),
        "{}",
        prefix.stdout
    );
    f.ingest.run(&["tree", "--at", "yesterday"]).failed();
    f.ingest.run(&["tree", "--at", "999"]).failed();
}

/// An event whose operations cannot fit one transaction even when cut
/// stops the projector, naming its position and kind; everything before it
/// is in the tree. The CLI reports it too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_event_is_reported_with_its_position() {
    let server = shared();
    let root = unique_root("oversized");
    let zk = zk_config(&server.hosts(), &root);
    let mut f = Fixture::new();
    f.walk_batches(1, 2, false);
    let before = f.head();
    let manifest: Vec<String> = (0..400)
        .map(|i| format!("https://example.org/manifests/object-{i:04}.checkm local-{i:04}"))
        .collect();
    let lines: Vec<&str> = manifest.iter().map(String::as_str).collect();
    f.exec(Command::SubmitBatch {
        uuid: scenario::submission_uuid(99),
        submission: scenario::submission("demo_content", &lines),
    });
    let position = before + 1;
    let mut config = sink_config(&zk, "oversized");
    config.limits = TxnLimits {
        max_bytes: 16 * 1024,
        max_ops: 100,
    };
    let sink = Sink::new(f.log(), config).expect("sink");
    let mut status = sink.status();
    let err = sink
        .run(RunMode::CatchUp, tokio_util::sync::CancellationToken::new())
        .await
        .expect_err("oversized");
    match &err {
        SinkError::Oversized {
            position: p, kind, ..
        } => {
            assert_eq!((*p, *kind), (position, "BatchSubmitted"), "{err}");
        }
        other => panic!("expected Oversized, got {other}"),
    }
    let s = wait_status(&mut status, "stopped", |s| {
        matches!(s.state, SinkState::Stopped(Some(_)))
    })
    .await;
    let SinkState::Stopped(Some(message)) = &s.state else {
        unreachable!()
    };
    assert!(
        message.contains(&format!("position {position} (BatchSubmitted)")),
        "{message}"
    );
    assert_eq!(
        checkpoint_of(&zk).await.expect("checkpoint").position,
        before
    );

    f.close();
    let run = f
        .ingest
        .run(&[
            "project",
            "--zk",
            &server.hosts(),
            "--zk-root",
            &root,
            "--max-txn-bytes",
            "16384",
        ])
        .failed();
    assert!(
        run.stderr
            .contains(&format!("position {position} (BatchSubmitted)")),
        "{}",
        run.stderr
    );
}

/// Cleanup of a finished batch whose job still has a lock of a dead worker
/// (session not expired): the lock is deleted in the same transaction as the
/// job, and the tree equals the log's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cleanup_deletes_a_dead_workers_lock_with_the_job() {
    let server = shared();
    let root = unique_root("lock");
    let zk = zk_config(&server.hosts(), &root);
    let mut f = Fixture::new();
    f.walk_batches(1, 3, false);
    catch_up(f.log(), &zk, "lock").await;
    let worker = zkio::connect(&zk).await.expect("worker session");
    let ephemeral = zk::CreateMode::Ephemeral.with_acls(zk::Acls::anyone_all());
    worker
        .create("/jobs/jid0000000002/lock", b"", &ephemeral)
        .await
        .expect("lock");
    worker
        .create("/batches/bid0000000001/lock", b"", &ephemeral)
        .await
        .expect("lock");
    f.exec(Command::Cleanup { before: None });
    let report = catch_up(f.log(), &zk, "lock").await;
    assert_eq!(report.checkpoint.position, f.head());
    assert!(worker
        .check_stat("/jobs/jid0000000002")
        .await
        .expect("stat")
        .is_none());
    assert!(worker
        .check_stat("/batches/bid0000000001")
        .await
        .expect("stat")
        .is_none());
    assert_same_tree(&log_tree(&f.log()), &live_tree(&zk).await, "after cleanup");
}

/// A root projected from one log refuses a projector of another log, and a
/// checkpoint past the log's head is refused too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tree_of_another_log_is_refused() {
    let server = shared();
    let root = unique_root("foreign");
    let zk = zk_config(&server.hosts(), &root);
    let mut a = Fixture::new();
    a.walk_batches(1, 1, false);
    catch_up(a.log(), &zk, "log-a").await;
    let mut b = Fixture::new();
    b.actor = Actor::admin("someone-else");
    b.walk_batches(1, 2, false);
    let sink = Sink::new(b.log(), sink_config(&zk, "log-b")).expect("sink");
    let err = sink
        .run(RunMode::CatchUp, tokio_util::sync::CancellationToken::new())
        .await
        .expect_err("foreign");
    assert!(matches!(err, SinkError::ForeignTree { .. }), "{err}");

    let c = Fixture::new();
    let sink = Sink::new(c.log(), sink_config(&zk, "log-c")).expect("sink");
    let err = sink
        .run(RunMode::CatchUp, tokio_util::sync::CancellationToken::new())
        .await
        .expect_err("ahead");
    assert!(matches!(err, SinkError::CheckpointAhead { .. }), "{err}");
}

// The Merritt interoperability tests, which use the fixture above.
#[path = "merritt.rs"]
mod merritt;

/// `ingest check` (issue 13's consistency report, issue 15 item 3's stale
/// locks): a projected tree passes (exit 0); nodes a foreign client writes
/// break Merritt's orphan rules and are reported with Merritt's severities
/// (young orphans WARN, a stale lock and unreadable data FAIL), hostile
/// data (huge, binary, invalid JSON) as a bounded finding; a repair by id
/// deletes the node and appends a `ConsistencyRepaired` event with the
/// reason; the same repair again is refused; `--repair-all --yes` clears
/// the rest and the report passes again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_reports_merritts_rules_and_repairs_them_as_events() {
    let server = shared();
    let root = unique_root("check");
    let zk = zk_config(&server.hosts(), &root);
    let mut f = Fixture::new();
    f.run_scenario("transitions-document.yaml");
    catch_up(f.log(), &zk, "check").await;
    f.close();
    let hosts = server.hosts();
    let run = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend(["--zk", &hosts, "--zk-root", &root]);
        f.ingest.run(&all)
    };
    let report = |args: &[&str]| -> (i32, serde_json::Value) {
        let mut all = vec!["check", "--format", "json"];
        all.extend(args);
        let out = run(&all);
        let v = serde_json::from_str(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}{}", out.stdout, out.stderr));
        (out.code, v)
    };
    let (code, clean) = report(&[]);
    assert_eq!(code, 0, "{clean}");
    assert_eq!(clean["findings"], serde_json::json!([]), "{clean}");
    let table = run(&["check"]);
    assert_eq!(table.code, 0);
    assert!(
        table.stdout.starts_with("PASS: 0 FAIL, 0 WARN"),
        "{}",
        table.stdout
    );

    let foreign = zkio::connect(&zk).await.expect("a foreign client");
    let acl = zkio::open_acl();
    let put = |p: &'static str, d: Vec<u8>| {
        let foreign = &foreign;
        let acl = &acl;
        async move {
            foreign.create(p, &d, acl).await.expect(p);
        }
    };
    put("/batch-uuids/foreign-uuid", b"bid0000000099".to_vec()).await;
    put("/jobs/states/pending/05-jid0000000099", Vec::new()).await;
    put("/batches/bid0000000098", Vec::new()).await;
    put("/batches/bid0000000098/states", Vec::new()).await;
    let stale = "/jobs/jid0000000001/lock";
    put(stale, Vec::new()).await;
    put("/batch-uuids/huge-uuid", vec![b'x'; 300 * 1024]).await;
    put("/batch-uuids/binary-uuid", vec![0xff, 0xfe, 0x00, 0x9c]).await;
    put("/jobs/jid0000000097", Vec::new()).await;
    put("/jobs/jid0000000097/status", b"{\"status\": tru".to_vec()).await;

    let (code, found) = report(&[]);
    assert_eq!(code, 1, "{found}");
    let findings = found["findings"].as_array().expect("findings").clone();
    let find = |rule: &str, path: &str| -> serde_json::Value {
        findings
            .iter()
            .find(|f| f["rule"] == rule && f["path"] == path)
            .unwrap_or_else(|| panic!("no {rule} at {path} in {found:#}"))
            .clone()
    };
    let uuid = find("orphan-batch-uuid", "/batch-uuids/foreign-uuid");
    assert_eq!(uuid["severity"], "WARN", "young: Merritt's WARN");
    assert_eq!(uuid["repair"]["action"], "delete-node");
    assert_eq!(
        find(
            "orphan-queue-entry",
            "/jobs/states/pending/05-jid0000000099"
        )["severity"],
        "WARN"
    );
    assert_eq!(
        find("empty-states", "/batches/bid0000000098/states")["severity"],
        "WARN"
    );
    let lock = find("stale-lock", stale);
    assert_eq!(lock["severity"], "FAIL");
    for p in [
        "/batch-uuids/huge-uuid",
        "/batch-uuids/binary-uuid",
        "/jobs/jid0000000097/status",
    ] {
        let f = find("unreadable-node", p);
        assert_eq!(f["severity"], "FAIL");
        assert!(f["detail"].as_str().expect("detail").len() < 1024, "{f}");
    }
    assert!(!found.to_string().contains("xxxxxxxx"), "node data quoted");
    assert_eq!(found["findings"][0]["severity"], "FAIL", "FAIL first");

    // Repair one finding by id: the node goes, an event records it.
    let id = lock["id"].as_str().expect("id").to_string();
    let without_reason = run(&["check", "--repair", &id]);
    assert_eq!(without_reason.code, 2, "{}", without_reason.stderr);
    let repaired = run(&[
        "check",
        "--repair",
        &id,
        "--reason",
        "left by a crashed tool",
    ]);
    assert_eq!(repaired.code, 0, "{}{}", repaired.stdout, repaired.stderr);
    assert!(foreign.check_stat(stale).await.expect("stat").is_none());
    let position: u64 = repaired
        .stdout
        .split("recorded as event #")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no event position in {}", repaired.stdout));
    let again = run(&["check", "--repair", &id, "--reason", "twice"]);
    assert_eq!(again.code, 1, "{}{}", again.stdout, again.stderr);
    assert!(
        again.stderr.contains("there is no finding"),
        "{}",
        again.stderr
    );

    // --repair-all shows what it would do and does nothing without --yes.
    let preview = run(&["check", "--repair-all", "--reason", "sweep"]);
    assert_eq!(preview.code, 1, "{}{}", preview.stdout, preview.stderr);
    assert!(
        preview.stdout.contains("would repair"),
        "{}",
        preview.stdout
    );
    assert!(foreign
        .check_stat("/batch-uuids/foreign-uuid")
        .await
        .expect("stat")
        .is_some());
    let swept = run(&["check", "--repair-all", "--yes", "--reason", "sweep"]);
    assert_eq!(swept.code, 0, "{}{}", swept.stdout, swept.stderr);
    let (code, after) = report(&[]);
    assert_eq!(code, 0, "{after:#}");

    f.open();
    match f.log().read_one(position).expect("the repair event").event {
        Event::ConsistencyRepaired(e) => {
            assert_eq!(e.paths, [stale]);
            assert_eq!(e.rule, "stale-lock");
            assert_eq!(e.finding, id);
            assert_eq!(e.reason, "left by a crashed tool");
        }
        other => panic!("expected ConsistencyRepaired at {position}, found {other:?}"),
    }
}
// ZooKeeper authentication, ACLs and the rebuild marker, which use the
// fixture above.
#[path = "zk_acl.rs"]
mod acl;

// The rebuild marker, a killed rebuild and `rebuild --force`.
#[path = "zk_rebuild.rs"]
mod rebuild_marker;
