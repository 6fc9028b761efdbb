//! `ingest rebuild` of a big log into a real ZooKeeper, against a raw
//! `multi` baseline in the same run.
//!
//! Builds (or reuses) a data directory whose log holds about
//! `INGEST_BENCH_ZK_REBUILD_EVENTS` events (jobs in batches of 20, each
//! taken through every step to Completed, its batch reported, no cleanup:
//! every job stays in the tree as Merritt keeps completed jobs until an
//! admin cleans up), with a snapshot of the engine's state at the head as
//! an engine that takes snapshots has. Starts its own ZooKeeper servers
//! (`tools/zk`, a 2 GiB heap; a fresh one for each of the raw run, the
//! library's rebuilds and the CLI's) and measures, in this order:
//!
//! - **projection**: the tree the log says, computed in memory
//!   ([`rebuild::expected_tree`], the first step of a rebuild);
//! - **raw**: the baseline: every node of that tree created with plain
//!   `multi` requests sent one after another (parents first, packed to the
//!   same caps as the rebuild's transactions, open ACL, no checkpoint, no
//!   reads, no projection, one request in flight as the projection bench's
//!   raw run sends them);
//! - **rebuild (empty root)**: [`rebuild::rebuild`], the code `ingest rebuild`
//!   runs: leadership, checkpoint, marker and pause,
//!   projection, reading the live tree, diff, transactions, final read and
//!   checkpoint;
//! - **rebuild (converged)**: the same again over the tree it just built
//!   (nothing to change);
//! - **CLI**: `ingest rebuild --data-dir DIR --zk HOSTS --zk-root ROOT` (the
//!   binary cargo built beside this bench): what an operator waits for,
//!   engine start-up included.
//!
//! Each prints seconds, events/s, nodes/s, and the ZooKeeper requests the
//! server received (`mntr`'s `zk_packets_received`: a `multi` counts once;
//! the sessions' pings are included), and the ratio of its node rate to the
//! raw rate.
//!
//! ```text
//! cargo bench --bench zk_rebuild                                  # ~100,000 events
//! INGEST_BENCH_ZK_REBUILD_EVENTS=1000000 \
//!   INGEST_BENCH_ZK_REBUILD_DIR=/var/tmp/rebuild-1m nice -n 10 cargo bench --bench zk_rebuild
//! ```
//!
//! Environment: `INGEST_BENCH_ZK_REBUILD_EVENTS` (default 100000);
//! `INGEST_BENCH_ZK_REBUILD_DIR` (a data directory kept between runs: built
//! when it has no log, reused as it is otherwise, whatever its size);
//! `INGEST_BENCH_ZK_REBUILD_CLI=0` skips the CLI run;
//! `INGEST_BENCH_ZK_REBUILD_IN_FLIGHT` (the library rebuild's transactions
//! in flight, default [`rebuild::IN_FLIGHT`]; the CLI uses its default);
//! `INGEST_ZK_JVMFLAGS` (default a 1-2 GiB heap: a 1M-event log's tree
//! holds about 936,000 nodes); `INGEST_LOG` (tracing, e.g. `info`).
//!
//! The server runs on the same machine: the rebuild's CPU work competes
//! with the ZooKeeper JVM, which a dedicated ensemble would not.

use std::path::PathBuf;
use std::process::{Command as Process, Stdio};
use std::time::{Duration, Instant};

use ingest_events::log::{Log, LogConfig};
use ingest_projections::ops::TRANSACTION_OVERHEAD;
use ingest_projections::rebuild::{self, AdminConfig, Progress};
use ingest_projections::zk::{connect, open_acl, ZkConfig};
use ingest_projections::{Checkpoint, Op, Tree, TxnLimits};

mod support;
use support::log_builder;
use support::zk_server::{packets_received, Server};

/// Jobs per batch in the log (as `benches/log.rs`'s archive-scale log).
const JOBS_PER_BATCH: u64 = 20;

/// A fresh ZooKeeper for one phase, so that no phase pays for the nodes
/// another left (a server holding two copies of a 1M-event tree paused for
/// garbage collection long enough to drop connections).
fn zk_server() -> Server {
    let server = Server::start("-Xms1g -Xmx2g -XX:+UseSerialGC");
    println!(
        "ZooKeeper on 127.0.0.1:{} (tools/zk: standalone, forceSync=no)",
        server.port
    );
    server
}

/// The library runs' settings: a 30 s session (zookeeper-client drops a
/// connection that answers nothing for 2/5 of it; the default 6 s session
/// gave up on a server pausing for garbage collection on this shared
/// machine, which is not what is measured here). The CLI run keeps its
/// defaults.
fn bench_zk(hosts: &str, root: &str) -> ZkConfig {
    let mut zk = ZkConfig::new(hosts).with_root(root);
    zk.session_timeout = Duration::from_secs(30);
    zk.request_timeout = Duration::from_secs(60);
    zk
}

fn rate(n: u64, d: Duration) -> f64 {
    n as f64 / d.as_secs_f64()
}

/// One measured phase: time, ZooKeeper requests, and what it wrote.
struct Phase {
    name: &'static str,
    time: Duration,
    requests: u64,
    nodes: u64,
    transactions: u64,
}

impl Phase {
    fn print(&self, events: u64, raw_nodes_s: Option<f64>) {
        let nodes_s = rate(self.nodes, self.time);
        let ratio = raw_nodes_s.map_or_else(String::new, |raw| {
            format!("; {:.2}x the raw rate", nodes_s / raw)
        });
        println!(
            "{}: {:.2} s, {:.0} events/s, {} nodes written in {} transactions = {:.0} nodes/s, {} ZooKeeper requests{ratio}",
            self.name,
            self.time.as_secs_f64(),
            rate(events, self.time),
            self.nodes,
            self.transactions,
            nodes_s,
            self.requests,
        );
    }
}

/// Creates every node of `tree` under `root` with plain `multi` requests,
/// one after another, packed to `limits` (parents first: a tree iterates
/// in path order).
async fn raw_create(hosts: &str, root: &str, tree: &Tree, limits: TxnLimits) -> (u64, u64) {
    let client = connect(&bench_zk(hosts, root)).await.expect("connect");
    let acl = open_acl();
    let limits = limits.for_events();
    let (mut nodes, mut txns) = (0u64, 0u64);
    let mut ops: Vec<Op> = Vec::new();
    let mut bytes = TRANSACTION_OVERHEAD;
    let mut iter = tree.iter().peekable();
    while iter.peek().is_some() || !ops.is_empty() {
        if let Some((path, data)) = iter.peek() {
            let op = Op::create(path.to_string(), data.to_vec());
            let b = op.serialized_size();
            if ops.is_empty() || (bytes + b <= limits.max_bytes && ops.len() < limits.max_ops) {
                bytes += b;
                ops.push(op);
                iter.next();
                continue;
            }
        }
        let mut w = client.new_multi_writer();
        for op in &ops {
            if let Op::Create { path, data } = op {
                w.add_create(path, data, &acl).expect("add");
            }
        }
        tokio::time::timeout(Duration::from_secs(60), w.commit())
            .await
            .expect("in time")
            .expect("multi");
        nodes += ops.len() as u64;
        txns += 1;
        ops.clear();
        bytes = TRANSACTION_OVERHEAD;
    }
    (nodes, txns)
}

fn main() {
    // Cargo passes --bench only under `cargo bench`. As a test target
    // (`cargo test --all-targets`, nextest's listing) this binary needs a
    // ZooKeeper server and minutes, so it does nothing there.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    if std::env::var_os("INGEST_LOG").is_some() {
        ingest_config::init_tracing(ingest_config::LogFormat::Human);
    }
    let events: u64 = match std::env::var("INGEST_BENCH_ZK_REBUILD_EVENTS") {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|e| panic!("INGEST_BENCH_ZK_REBUILD_EVENTS={v:?}: {e}")),
        Err(_) => 100_000,
    };
    let (data, _temp): (PathBuf, Option<tempfile::TempDir>) =
        match std::env::var_os("INGEST_BENCH_ZK_REBUILD_DIR") {
            Some(d) => (PathBuf::from(d), None),
            None => {
                let t = tempfile::tempdir().expect("temp dir");
                (t.path().to_path_buf(), Some(t))
            }
        };
    log_builder::data_dir(&data, events, JOBS_PER_BATCH);

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let pid = std::process::id();
    let limits = TxnLimits::default();
    let in_flight = match std::env::var("INGEST_BENCH_ZK_REBUILD_IN_FLIGHT") {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|e| panic!("INGEST_BENCH_ZK_REBUILD_IN_FLIGHT={v:?}: {e}")),
        Err(_) => rebuild::IN_FLIGHT,
    };

    let log = Log::open(
        &ingest_engine::engine::log_dir(&data),
        &LogConfig::default(),
    )
    .expect("open the log");
    let head = log.durable_position();
    let hash = log.read_one(head).expect("read the head").envelope.hash;

    // The tree the log says (the rebuild's first step, timed alone).
    let t = Instant::now();
    let expected =
        rebuild::expected_tree(&log, &Checkpoint::at(head, hash), &mut |_| {}).expect("project");
    let projection = t.elapsed();
    println!(
        "log: {head} events; its tree: {} nodes; projected in memory in {:.2} s ({:.0} events/s)",
        expected.len(),
        projection.as_secs_f64(),
        rate(head, projection)
    );

    // The baseline: the same nodes created raw into a fresh server.
    let server = zk_server();
    let (hosts, port) = (format!("127.0.0.1:{}", server.port), server.port);
    let before = packets_received(port);
    let t = Instant::now();
    let (raw_nodes, raw_txns) = rt.block_on(raw_create(
        &hosts,
        &format!("/bench-raw-{pid}"),
        &expected,
        limits,
    ));
    let raw = Phase {
        name: "raw multi (baseline)",
        time: t.elapsed(),
        requests: packets_received(port) - before,
        nodes: raw_nodes,
        transactions: raw_txns,
    };
    raw.print(head, None);
    let raw_rate = rate(raw.nodes, raw.time);
    drop(server);

    // The rebuild into an empty root of another fresh server, then again
    // over the tree it built.
    let server = zk_server();
    let (hosts, port) = (format!("127.0.0.1:{}", server.port), server.port);
    let cfg = AdminConfig {
        limits,
        in_flight,
        ..AdminConfig::new(bench_zk(&hosts, &format!("/bench-rebuild-{pid}")), "bench")
    };
    for name in ["rebuild (empty root)", "rebuild (converged)"] {
        let marks: std::sync::Mutex<Vec<(&'static str, Duration)>> = Default::default();
        let before = packets_received(port);
        let t = Instant::now();
        let mut last = "";
        let report = rt
            .block_on(rebuild::rebuild(&log, &cfg, &mut |p| {
                let phase = match p {
                    Progress::Projecting { .. } => "projecting",
                    Progress::Reading { .. } => "reading",
                    Progress::Applying { .. } => "applying",
                };
                if phase != last {
                    last = phase;
                    marks.lock().expect("marks").push((phase, t.elapsed()));
                }
            }))
            .expect("rebuild");
        let time = t.elapsed();
        let c = &report.converge;
        Phase {
            name,
            time,
            requests: packets_received(port) - before,
            nodes: (c.created + c.set + c.deleted) as u64,
            transactions: c.transactions as u64,
        }
        .print(head, Some(raw_rate));
        let marks = marks.into_inner().expect("marks");
        let steps: Vec<String> = marks
            .iter()
            .map(|(phase, at)| format!("{phase} from {:.2} s", at.as_secs_f64()))
            .collect();
        println!(
            "  {} rounds; {} nodes expected; {}",
            c.rounds,
            report.expected_nodes,
            steps.join(", ")
        );
    }
    drop(log);
    drop(server);

    // What an operator runs (engine start-up from the snapshot included),
    // into a third fresh server.
    if std::env::var("INGEST_BENCH_ZK_REBUILD_CLI").as_deref() != Ok("0") {
        let server = zk_server();
        let (hosts, port) = (format!("127.0.0.1:{}", server.port), server.port);
        let before = packets_received(port);
        let t = Instant::now();
        let out = Process::new(env!("CARGO_BIN_EXE_ingest"))
            .arg("--data-dir")
            .arg(&data)
            .args(["rebuild", "--zk", &hosts, "--zk-root"])
            .arg(format!("/bench-cli-{pid}"))
            .stdin(Stdio::null())
            .output()
            .expect("run ingest rebuild");
        let time = t.elapsed();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "ingest rebuild failed: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        println!(
            "CLI `ingest rebuild` (start-up, projection, rebuild): {:.2} s, {:.0} events/s, {} ZooKeeper requests; {:.2}x the raw rate",
            time.as_secs_f64(),
            rate(head, time),
            packets_received(port) - before,
            rate(raw.nodes, time) / raw_rate
        );
        for line in stdout.lines().filter(|l| l.starts_with("rebuilt")) {
            println!("  {line}");
        }
    }
}
