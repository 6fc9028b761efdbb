//! Projection throughput into a real ZooKeeper, against a raw baseline.
//!
//! Starts its own ZooKeeper (`tools/zk`), builds a backlog of jobs walked
//! through the whole lifecycle (submit, acquire, start, seven successful
//! steps to Completed, report, cleanup) in a temporary log, through
//! `decide` and the `Log` directly, then measures in the same run:
//!
//! - **sink**: the live sink catching up from an empty root (connect,
//!   leadership, base nodes, projection, version-checked checkpoint in every
//!   transaction);
//! - **raw**: the very same node operations, planned into the very same
//!   transactions (same caps, same cuts) and sent as plain `multi` requests
//!   one after another by zookeeper-client into another fresh root, without
//!   checkpoint and without projector work (projected beforehand, untimed).
//!
//! It prints events/s and node operations/s for both and their ratio, then
//! stops the server.
//!
//! ```text
//! cargo bench --bench projection                      # 10,000 jobs
//! INGEST_BENCH_JOBS=2000 cargo bench --bench projection
//! ```
//!
//! Environment: `INGEST_BENCH_JOBS` (default 10000), `INGEST_BENCH_BATCH`
//! (jobs per batch, default 100), `INGEST_BENCH_TXN_BYTES` and
//! `INGEST_BENCH_TXN_OPS` (transaction caps, default 512 KiB and 4096),
//! `INGEST_BENCH_ZK` (use a running server instead), `INGEST_ZK_JVMFLAGS`
//! (the server's JVM flags; default a 1 GiB heap: tools/zk's 256 MiB test
//! heap runs out with 10,000 live jobs plus the 500 committed transactions
//! ZooKeeper keeps in memory), `INGEST_LOG` (tracing, e.g. `debug`).
//!
//! The server runs on the same machine: the projector's CPU work competes
//! with the ZooKeeper JVM, which a dedicated ensemble would not.

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{TimeZone, Utc};
use ingest_events::command::{decide, Command, JobSpec, Target};
use ingest_events::event::{Actor, Erc, Identifiers, PayloadType, Submission, SubmissionMode};
use ingest_events::log::{AppendRequest, Log, LogConfig};
use ingest_events::{Bid, Jid, Lifecycle, State};
use ingest_projections::txn::{plan_all, TxnLimits};
use ingest_projections::zk::{connect, open_acl, ZkConfig};
use ingest_projections::{EventOps, Op, Projector, RunMode, Sink, SinkConfig};

mod support;
use support::zk_server::Server;

fn env_usize(name: &str, default: usize) -> usize {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{name} must be a whole number, got {v:?}")),
        Err(_) => default,
    }
}

/// Appends commands through `decide`, unflushed (one flush at the end).
struct Writer {
    log: Arc<Log>,
    state: State,
    lifecycle: Lifecycle,
    n: u64,
}

impl Writer {
    fn run(&mut self, command: Command) {
        self.n += 1;
        let decision = decide(&self.state, &self.lifecycle, &command)
            .unwrap_or_else(|e| panic!("{command:?}: {e}"));
        let base = Utc
            .with_ymd_and_hms(2024, 5, 16, 10, 11, 12)
            .single()
            .expect("time");
        let appended = self
            .log
            .append_unflushed(&AppendRequest {
                actor: Actor::admin("bench"),
                correlation_id: uuid::Uuid::from_u128(u128::from(self.n)),
                timestamp: base + chrono::Duration::milliseconds(self.n as i64),
                expectations: decision.expectations,
                events: decision.events,
            })
            .expect("append")
            .expect("no conflict");
        for r in &appended.records {
            self.state.apply(r).expect("fold");
        }
    }
}

fn build_backlog(log: Arc<Log>, jobs: usize, per_batch: usize) -> u64 {
    let mut w = Writer {
        log,
        state: State::new(),
        lifecycle: Lifecycle::builtin(),
        n: 0,
    };
    let mut made = 0;
    while made < jobs {
        let count = per_batch.min(jobs - made);
        let bid: Bid = w.state.next_bid();
        let first: Jid = w.state.next_jid();
        w.run(Command::SubmitBatch {
            uuid: uuid::Uuid::from_u128(0x4000_8000_0000_0000_0000 | bid.0 as u128),
            submission: Submission {
                profile_name: "bench_content".into(),
                submitter: "bench".into(),
                payload_url: format!("https://example.org/batches/{bid}.checkm"),
                payload_type: PayloadType::BatchManifest,
                response_type: "json".into(),
                submission_mode: SubmissionMode::Add,
                manifest: vec![],
                erc: Erc::default(),
                digest: None,
                extra: Default::default(),
            },
        });
        let specs = (0..count as u64)
            .map(|i| JobSpec {
                payload_url: format!("https://example.org/objects/{}.zip", first.0 + i),
                payload_type: PayloadType::Container,
                identifiers: Identifiers::default(),
                metadata: Erc::default(),
                digest: None,
                priority: None,
            })
            .collect();
        w.run(Command::AcquireBatch { bid, jobs: specs });
        for i in 0..count as u64 {
            let jid = Jid(first.0 + i);
            w.run(Command::StartJob { jid });
            for _ in 0..7 {
                w.run(Command::SetJobStatus {
                    jid,
                    target: Target::Success,
                    message: String::new(),
                    priority: None,
                });
            }
        }
        w.run(Command::ReportBatch {
            bid,
            notification_error: None,
        });
        made += count;
    }
    w.run(Command::Cleanup { before: None });
    let head = w.log.head().0;
    w.log.wait_durable(head).expect("flush");
    head
}

fn rate(n: u64, d: Duration) -> f64 {
    n as f64 / d.as_secs_f64()
}

fn main() {
    // Cargo passes --bench only under `cargo bench`. As a test target
    // (`cargo test --all-targets`, nextest's listing) this binary needs a
    // ZooKeeper server and minutes, so it does nothing there.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    // `cargo bench` passes `--bench`; a filter argument is not supported.
    // Logs only when asked (INGEST_LOG=debug shows every transaction).
    if std::env::var_os("INGEST_LOG").is_some() {
        ingest_config::init_tracing(ingest_config::LogFormat::Human);
    }
    let jobs = env_usize("INGEST_BENCH_JOBS", 10_000);
    let per_batch = env_usize("INGEST_BENCH_BATCH", 100).max(1);
    let limits = TxnLimits {
        max_bytes: env_usize("INGEST_BENCH_TXN_BYTES", 512 * 1024),
        max_ops: env_usize("INGEST_BENCH_TXN_OPS", 4096),
    };
    // INGEST_BENCH_ZK=HOST:PORT uses a running server instead (for profiling).
    let (server, hosts) = match std::env::var("INGEST_BENCH_ZK") {
        Ok(hosts) => (None, hosts),
        Err(_) => {
            let server = Server::start("-Xms256m -Xmx1g -XX:+UseSerialGC");
            let hosts = format!("127.0.0.1:{}", server.port);
            (Some(server), hosts)
        }
    };
    println!("ZooKeeper on {hosts} (tools/zk: standalone, forceSync=no)");

    let dir = tempfile::tempdir().expect("temp dir");
    let log = Arc::new(Log::open(dir.path(), &LogConfig::default()).expect("open the log"));
    let t = Instant::now();
    let head = build_backlog(Arc::clone(&log), jobs, per_batch);
    println!(
        "backlog: {jobs} jobs in batches of {per_batch}, {head} events, built in {:.1} s",
        t.elapsed().as_secs_f64()
    );

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let pid = std::process::id();

    // The operations, projected in memory (untimed for the raw runs, timed
    // here for the record), and the transactions the sink's planner cuts.
    let t = Instant::now();
    let mut projector = Projector::new();
    let base = projector.init().expect("init");
    let events: Vec<EventOps> = log
        .read_from(1)
        .map(|r| projector.project(&r.expect("read")).expect("project"))
        .collect();
    let projection_time = t.elapsed();
    let plans = plan_all(&events, limits.for_events()).expect("plan");

    // The same operations in the same transactions, sent raw into `root`.
    let raw = |root: String| {
        let zk = ZkConfig::new(hosts.clone()).with_root(root);
        let (base, events, plans) = (&base, &events, &plans);
        async move {
            let client = connect(&zk).await.expect("connect");
            for op in &base.ops {
                client
                    .create(op.path(), b"", &open_acl())
                    .await
                    .expect("base node");
            }
            let acl = open_acl();
            let t = Instant::now();
            let mut ops = 0u64;
            for plan in plans {
                let mut w = client.new_multi_writer();
                for seg in &plan.segments {
                    for op in &events[seg.event].ops[seg.ops.clone()] {
                        match op {
                            Op::Create { path, data } => w.add_create(path, data, &acl),
                            Op::SetData { path, data } => w.add_set_data(path, data, None),
                            Op::Delete { path } => w.add_delete(path, None),
                        }
                        .expect("add");
                        ops += 1;
                    }
                }
                tokio::time::timeout(Duration::from_secs(30), w.commit())
                    .await
                    .expect("in time")
                    .expect("multi");
            }
            (t.elapsed(), ops)
        }
    };
    // Warm the server up (JIT, caches) so neither measured run pays for it.
    let (warm, _) = rt.block_on(raw(format!("/bench-warmup-{pid}")));
    println!(
        "warm-up (raw, untimed for the ratio): {:.2} s",
        warm.as_secs_f64()
    );

    // (a) The sink, from an empty root.
    let sink_zk = ZkConfig::new(hosts.clone()).with_root(format!("/bench-sink-{pid}"));
    let mut config = SinkConfig::new(sink_zk, "bench");
    config.limits = limits;
    let sink = Sink::new(Arc::clone(&log), config).expect("sink");
    let t = Instant::now();
    // The sink retries forever when ZooKeeper is away; the bench does not.
    let report = rt
        .block_on(async {
            tokio::time::timeout(
                Duration::from_secs(600),
                sink.run(RunMode::CatchUp, tokio_util::sync::CancellationToken::new()),
            )
            .await
        })
        .expect("the sink run within 10 minutes (is ZooKeeper still up?)")
        .expect("the sink run");
    let sink_time = t.elapsed();
    assert_eq!(report.checkpoint.position, head);

    // (b) Raw, into another fresh root.
    let (raw_time, raw_ops) = rt.block_on(raw(format!("/bench-raw-{pid}")));
    assert_eq!(raw_ops, report.ops_applied, "the same operations");
    println!(
        "projection alone (in memory, no ZooKeeper): {head} events in {:.2} s: {:.0} events/s",
        projection_time.as_secs_f64(),
        rate(head, projection_time)
    );

    let sink_ops = rate(report.ops_applied, sink_time);
    let raw_ops_s = rate(raw_ops, raw_time);
    println!(
        "transactions: {} (caps {} bytes / {} ops)",
        plans.len(),
        limits.max_bytes,
        limits.max_ops
    );
    println!(
        "sink: {head} events, {} node ops, {} transactions in {:.2} s: {:.0} events/s, {:.0} node ops/s",
        report.ops_applied,
        report.transactions,
        sink_time.as_secs_f64(),
        rate(head, sink_time),
        sink_ops
    );
    println!(
        "raw multi: {raw_ops} node ops, {} transactions in {:.2} s: {:.0} events/s equivalent, {:.0} node ops/s",
        plans.len(),
        raw_time.as_secs_f64(),
        rate(head, raw_time),
        raw_ops_s
    );
    println!(
        "sink / raw: {:.2} (the sink's cost over raw multi: checkpoint, projection, log reads)",
        sink_ops / raw_ops_s
    );
    drop(server);
}
