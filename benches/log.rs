//! Benchmarks of the event log: durable appends against a raw sled baseline,
//! and the fold that rebuilds [`State`] at start-up.
//!
//! - `append/*`: [`Log::append`] with group commit, one event per command from
//!   1 and from 8 threads, and 100 events per command from 1 thread.
//! - `raw_sled/*`: the baseline. The same keys and value sizes (the encoded
//!   records the log writes, plus one 8-byte stream-index entry per event) in
//!   one `sled::Batch` per command, then one `Db::flush` per command. The
//!   8-thread case gives every thread its own batches and its own flush per
//!   batch; it does not coordinate flushes, sled's own flush decides how much
//!   concurrent flushes share.
//! - `fold/*`: [`State::apply`] over a log of 10,000 jobs taken through the
//!   full lifecycle (135k events): read + decode + apply, read + decode
//!   alone, the raw sled scan alone, and apply alone over records decoded in
//!   advance.
//!
//! Every group reports throughput in events per second.
//!
//! `INGEST_BENCH_REBUILD_EVENTS=1000000` adds one-shot timings on a log of
//! about that many events (built through [`Log::append_unflushed`], one
//! command per append as the engine writes them, one flush at the end):
//! bytes on disk per event; a start-up rebuild (open + fold); the engine's
//! start-up without a snapshot (the baseline) and from a snapshot at the
//! head (the ratio is the figure); one batch's history through the stream
//! index against a scan of the whole log; `ingest verify`'s pass (chain,
//! index, signed checkpoints, snapshots) against the chain-only pass.
//! `cargo bench --bench log -- rebuild` runs only these (criterion's filter
//! matches no group).
//!
//! `INGEST_BENCH_REBUILD_DIR=DIR` keeps the built log in `DIR/log` and
//! reuses it in later runs of the same size; `INGEST_BENCH_STARTUP_ONLY=1`
//! stops after the start-up figures (without a snapshot, from a snapshot
//! of format 3 and of format 2, with the time of each part);
//! `INGEST_BENCH_COLD=1` drops the data directory's page cache before each
//! open.
//!
//! ```text
//! cargo bench --bench log -- --noplot
//! INGEST_BENCH_REBUILD_EVENTS=1000000 cargo bench --bench log -- rebuild
//! ```

use std::hint::black_box;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use chrono::Utc;
use criterion::{BenchmarkId, Criterion, Throughput};
use ingest_events::event::{
    Actor, Erc, Event, Identifiers, JobConfiguration, JobCreated, JobStatusChanged, PayloadType,
    SubmissionMode,
};
use ingest_events::ids::{Bid, Jid};
use ingest_events::lifecycle::JobState;
use ingest_events::log::{AppendRequest, Log, LogConfig, Proposed};
use ingest_events::{Recorded, State, StreamId};
use uuid::Uuid;

mod support;
use support::log_builder;

const THREADS: u64 = 8;
const BIG_COMMAND: u64 = 100;
/// Jobs in the fold benchmark's log, in batches of [`JOBS_PER_BATCH`].
const FOLD_JOBS: u64 = 10_000;
/// Jobs in the fold log when the binary runs as a test (`cargo test
/// --all-targets`, nextest listing), where only a smoke run is wanted.
const FOLD_JOBS_SMOKE: u64 = 50;

/// Whether this run measures (`cargo bench` passes `--bench`) rather than
/// smoke-tests or lists the benchmarks.
fn measuring() -> bool {
    std::env::args().any(|a| a == "--bench")
}
const JOBS_PER_BATCH: u64 = 10;
/// Jobs per batch in the archive-scale log (the issue's "one batch's full
/// history (20 jobs)").
const REBUILD_JOBS_PER_BATCH: u64 = 20;

fn fold_jobs() -> u64 {
    if measuring() {
        FOLD_JOBS
    } else {
        FOLD_JOBS_SMOKE
    }
}

fn main() {
    let mut c = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5))
        .configure_from_args();
    append(&mut c);
    raw_sled(&mut c);
    fold(&mut c);
    c.final_summary();
    if let Ok(n) = std::env::var("INGEST_BENCH_REBUILD_EVENTS") {
        let n = n
            .parse()
            .unwrap_or_else(|e| panic!("INGEST_BENCH_REBUILD_EVENTS={n:?}: {e}"));
        rebuild(n);
    }
}

// ---------------------------------------------------------------------------
// Events and logs
// ---------------------------------------------------------------------------

/// The log's configuration: the default, or sled's storage settings from
/// `INGEST_BENCH_LOG_SEGMENT` (bytes) and `INGEST_BENCH_LOG_ZSTD` (a level,
/// or `off`) to compare them.
fn log_config() -> LogConfig {
    let mut config = LogConfig::default();
    if let Ok(v) = std::env::var("INGEST_BENCH_LOG_SEGMENT") {
        config.segment_size = v
            .parse()
            .unwrap_or_else(|e| panic!("INGEST_BENCH_LOG_SEGMENT={v:?}: {e}"));
    }
    if let Ok(v) = std::env::var("INGEST_BENCH_LOG_ZSTD") {
        config.compression = match v.as_str() {
            "off" => None,
            level => Some(
                level
                    .parse()
                    .unwrap_or_else(|e| panic!("INGEST_BENCH_LOG_ZSTD={v:?}: {e}")),
            ),
        };
    }
    config
}

fn open(dir: &Path) -> Log {
    Log::open(dir, &log_config()).unwrap_or_else(|e| panic!("open log at {}: {e}", dir.display()))
}

fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir().expect("create a temporary directory")
}

/// The typical one-event command: a step reports success.
fn status_changed() -> Event {
    Event::JobStatusChanged(JobStatusChanged {
        from: JobState::Downloading,
        to: JobState::Processing,
        message: String::new(),
        retry: false,
        priority: None,
    })
}

/// The typical event of a big command: a job created by a batch's expansion.
fn job_created(bid: Bid, n: u64) -> Event {
    Event::JobCreated(JobCreated {
        bid,
        priority: 5,
        configuration: JobConfiguration {
            profile_name: "demo_content".into(),
            submitter: "alice".into(),
            payload_url: format!("https://example.org/objects/{bid}/{n}.zip"),
            payload_type: PayloadType::Container,
            response_type: "json".into(),
            submission_mode: SubmissionMode::Add,
            digest: None,
        },
        identifiers: Identifiers {
            primary_id: None,
            local_ids: vec![format!("local-{n}")],
        },
        metadata: Erc {
            who: Some("Doe, Jane".into()),
            what: Some(format!("Object {n}")),
            when: Some("2024".into()),
            r#where: None,
        },
    })
}

fn request(events: Vec<Proposed>) -> AppendRequest {
    AppendRequest {
        actor: Actor::worker("bench"),
        correlation_id: Uuid::new_v4(),
        timestamp: Utc::now(),
        expectations: vec![],
        events,
    }
}

/// One event on the job stream `jid`.
fn one_event(jid: u64) -> AppendRequest {
    request(vec![Proposed {
        stream: StreamId::Job(Jid(jid)),
        event: status_changed(),
    }])
}

/// [`BIG_COMMAND`] job creations, each on its own job stream.
fn big_command(first_jid: u64) -> AppendRequest {
    request(
        (0..BIG_COMMAND)
            .map(|i| Proposed {
                stream: StreamId::Job(Jid(first_jid + i)),
                event: job_created(Bid(1), first_jid + i),
            })
            .collect(),
    )
}

fn must_append(log: &Log, req: &AppendRequest) -> u64 {
    match log.append(req) {
        Ok(Ok(a)) => *a.positions.end(),
        Ok(Err(c)) => panic!("conflict: {c}"),
        Err(e) => panic!("append: {e}"),
    }
}

// ---------------------------------------------------------------------------
// (a), (b) Durable appends
// ---------------------------------------------------------------------------

fn append(c: &mut Criterion) {
    let mut g = c.benchmark_group("append");

    let dir = tempdir();
    let log = open(dir.path());
    let mut n = 0u64;
    g.throughput(Throughput::Elements(1));
    g.bench_function(BenchmarkId::new("1_event_per_command", "1_thread"), |b| {
        b.iter(|| {
            n += 1;
            must_append(&log, &one_event(n % 1000 + 1))
        })
    });

    g.throughput(Throughput::Elements(THREADS));
    g.bench_function(
        BenchmarkId::new("1_event_per_command", format!("{THREADS}_threads")),
        |b| {
            b.iter_custom(|iters| {
                let start = Instant::now();
                thread::scope(|s| {
                    for t in 0..THREADS {
                        let log = &log;
                        s.spawn(move || {
                            for i in 0..iters {
                                must_append(log, &one_event(t * 1000 + i % 1000 + 1));
                            }
                        });
                    }
                });
                start.elapsed()
            })
        },
    );
    drop(log);

    let dir = tempdir();
    let log = open(dir.path());
    let mut next_jid = 1u64;
    g.throughput(Throughput::Elements(BIG_COMMAND));
    g.bench_function(
        BenchmarkId::new(format!("{BIG_COMMAND}_events_per_command"), "1_thread"),
        |b| {
            b.iter_batched(
                || {
                    let req = big_command(next_jid);
                    next_jid += BIG_COMMAND;
                    req
                },
                |req| must_append(&log, &req),
                criterion::BatchSize::SmallInput,
            )
        },
    );
    g.finish();
}

// ---------------------------------------------------------------------------
// (c) The raw sled baseline
// ---------------------------------------------------------------------------

/// The bytes one command writes: (event key, encoded record, index key) per
/// event, taken from a real append so the sizes match the log's.
struct RawCommand {
    records: Vec<Vec<u8>>,
}

impl RawCommand {
    fn sample(req: &AppendRequest) -> RawCommand {
        let dir = tempdir();
        let log = open(dir.path());
        let last = must_append(&log, req);
        let records = (1..=last)
            .map(|pos| {
                log.raw_tree()
                    .get(Log::raw_event_key(pos))
                    .expect("raw read")
                    .expect("record present")
                    .to_vec()
            })
            .collect();
        RawCommand { records }
    }

    fn bytes(&self) -> usize {
        self.records.iter().map(Vec::len).sum()
    }

    /// The batch for positions from `first` on: each record and an index
    /// entry of the log's shapes (9-byte key + record, 18-byte key + 8 bytes).
    fn batch(&self, first: u64) -> sled::Batch {
        let mut batch = sled::Batch::default();
        for (i, record) in self.records.iter().enumerate() {
            let pos = first + i as u64;
            batch.insert(&Log::raw_event_key(pos), record.as_slice());
            let mut index = [0u8; 18];
            index[0] = b'i';
            index[1] = b'j';
            index[2..10].copy_from_slice(&pos.to_be_bytes());
            index[10..].copy_from_slice(&1u64.to_be_bytes());
            batch.insert(&index, &pos.to_be_bytes());
        }
        batch
    }
}

fn raw_db(dir: &Path) -> (sled::Db, sled::Tree) {
    // The log's own settings: default-sized cache, no background flusher.
    let db = sled::Config::new()
        .path(dir)
        .cache_capacity(LogConfig::default().cache_capacity)
        .flush_every_ms(None)
        .open()
        .expect("open sled");
    let tree = db.open_tree("log").expect("open tree");
    (db, tree)
}

fn raw_command(db: &sled::Db, tree: &sled::Tree, cmd: &RawCommand, first: u64) {
    tree.apply_batch(cmd.batch(first)).expect("apply batch");
    db.flush().expect("flush");
}

fn raw_sled(c: &mut Criterion) {
    let mut g = c.benchmark_group("raw_sled");
    let one = RawCommand::sample(&one_event(1));
    let big = RawCommand::sample(&big_command(1));
    eprintln!(
        "raw_sled: records of {} bytes (1 event) and {} bytes ({BIG_COMMAND} events), plus 26 bytes of index per event",
        one.bytes(),
        big.bytes()
    );

    let dir = tempdir();
    let (db, tree) = raw_db(dir.path());
    let next = AtomicU64::new(1);
    g.throughput(Throughput::Elements(1));
    g.bench_function(BenchmarkId::new("1_event_per_command", "1_thread"), |b| {
        b.iter(|| raw_command(&db, &tree, &one, next.fetch_add(1, Ordering::Relaxed)))
    });

    g.throughput(Throughput::Elements(THREADS));
    g.bench_function(
        BenchmarkId::new("1_event_per_command", format!("{THREADS}_threads")),
        |b| {
            b.iter_custom(|iters| {
                let start = Instant::now();
                thread::scope(|s| {
                    for _ in 0..THREADS {
                        let (db, tree, one, next) = (&db, &tree, &one, &next);
                        s.spawn(move || {
                            for _ in 0..iters {
                                raw_command(db, tree, one, next.fetch_add(1, Ordering::Relaxed));
                            }
                        });
                    }
                });
                start.elapsed()
            })
        },
    );
    drop((tree, db));

    let dir = tempdir();
    let (db, tree) = raw_db(dir.path());
    let next = AtomicU64::new(1);
    g.throughput(Throughput::Elements(BIG_COMMAND));
    g.bench_function(
        BenchmarkId::new(format!("{BIG_COMMAND}_events_per_command"), "1_thread"),
        |b| {
            b.iter(|| {
                raw_command(
                    &db,
                    &tree,
                    &big,
                    next.fetch_add(BIG_COMMAND, Ordering::Relaxed),
                )
            })
        },
    );
    g.finish();
}

// ---------------------------------------------------------------------------
// (d) The fold
// ---------------------------------------------------------------------------

/// Builds a log of `jobs` jobs (rounded up to whole batches) in `dir`;
/// returns the state the builder folded along the way.
fn build_log(dir: &Path, jobs: u64) -> State {
    build_log_in(dir, jobs, JOBS_PER_BATCH)
}

/// As [`build_log`], `per_batch` jobs in each batch.
fn build_log_in(dir: &Path, jobs: u64, per_batch: u64) -> State {
    log_builder::build(open(dir), jobs, per_batch)
}

fn fold_log(log: &Log) -> State {
    let mut state = State::new();
    for r in log.read_range(1, u64::MAX) {
        state.apply(&r.expect("read")).expect("fold");
    }
    state
}

fn fold(c: &mut Criterion) {
    let dir = tempdir();
    let started = Instant::now();
    let built = build_log(dir.path(), fold_jobs());
    let log = open(dir.path());
    let events = log.head().0;
    let record_bytes: usize = log
        .raw_tree()
        .scan_prefix([Log::raw_event_key(1)[0]])
        .map(|kv| kv.expect("read").1.len())
        .sum();
    eprintln!(
        "fold: built a log of {} jobs, {events} events ({} bytes per record on average) in {:.1} s",
        built.jobs.len(),
        record_bytes as u64 / events,
        started.elapsed().as_secs_f64()
    );
    let records: Vec<Recorded> = log
        .read_range(1, u64::MAX)
        .collect::<Result<_, _>>()
        .expect("read the log");
    assert_eq!(fold_log(&log), built);

    let mut g = c.benchmark_group("fold");
    g.throughput(Throughput::Elements(events));
    g.bench_function(BenchmarkId::new("read_decode_apply", events), |b| {
        b.iter_with_large_drop(|| fold_log(&log))
    });
    g.bench_function(BenchmarkId::new("read_raw", events), |b| {
        b.iter(|| {
            log.raw_tree()
                .scan_prefix([Log::raw_event_key(1)[0]])
                .map(|kv| black_box(kv.expect("read")).1.len())
                .sum::<usize>()
        })
    });
    g.bench_function(BenchmarkId::new("read_decode", events), |b| {
        b.iter(|| {
            log.read_range(1, u64::MAX)
                .map(|r| black_box(r.expect("read")).envelope.position)
                .sum::<u64>()
        })
    });
    g.bench_function(BenchmarkId::new("apply", events), |b| {
        b.iter_with_large_drop(|| {
            let mut state = State::new();
            for r in &records {
                state.apply(r).expect("fold");
            }
            state
        })
    });
    g.finish();
}

// ---------------------------------------------------------------------------
// Start-up rebuild of a large log
// ---------------------------------------------------------------------------

fn dir_size(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|e| match e.metadata() {
                    Ok(m) if m.is_dir() => dir_size(&e.path()),
                    Ok(m) => m.len(),
                    Err(_) => 0,
                })
                .sum()
        })
        .unwrap_or(0)
}

/// Where the archive-scale log lives: a temporary data directory, or the
/// one `INGEST_BENCH_REBUILD_DIR` names, kept so that later runs reuse it.
enum DataDir {
    Temporary(tempfile::TempDir),
    Kept(std::path::PathBuf),
}

impl DataDir {
    fn path(&self) -> &Path {
        match self {
            DataDir::Temporary(t) => t.path(),
            DataDir::Kept(p) => p,
        }
    }
}

/// The marker a finished build leaves in a kept data directory: the jobs it
/// was built with (a build cut short leaves none and is built again).
const BUILT_MARKER: &str = "bench-built-jobs";

/// Drops the OS page cache of every file under `dir` (`dd iflag=nocache`,
/// which asks the kernel to discard the file's cached pages), so that the
/// next open reads from the disk: a cold start without root.
fn evict_page_cache(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.filter_map(Result::ok) {
        let path = e.path();
        if path.is_dir() {
            evict_page_cache(&path);
        } else {
            let status = std::process::Command::new("dd")
                .arg(format!("if={}", path.display()))
                .args(["iflag=nocache", "count=0", "status=none"])
                .status();
            if !status.is_ok_and(|s| s.success()) {
                eprintln!("cannot drop the page cache of {}", path.display());
            }
        }
    }
}

/// Whether `INGEST_BENCH_COLD=1` asks for start-ups with the page cache of
/// the data directory dropped first.
fn cold() -> bool {
    std::env::var("INGEST_BENCH_COLD").is_ok_and(|v| v == "1")
}

/// Times what the engine does at start-up: open the log and fold all of it.
///
/// `INGEST_BENCH_REBUILD_DIR=DIR` keeps the built log in `DIR/log` and
/// reuses it on later runs with the same size (building 10M events takes a
/// quarter of an hour); `INGEST_BENCH_STARTUP_ONLY=1` stops after the
/// start-up figures.
fn rebuild(events: u64) {
    let per_batch = REBUILD_JOBS_PER_BATCH;
    let jobs = log_builder::jobs_for_events(events, per_batch);
    let data = match std::env::var_os("INGEST_BENCH_REBUILD_DIR") {
        Some(d) => DataDir::Kept(d.into()),
        None => DataDir::Temporary(tempdir()),
    };
    let log_dir = ingest_engine::engine::log_dir(data.path());
    let marker = data.path().join(BUILT_MARKER);
    let reuse = matches!(data, DataDir::Kept(_))
        && std::fs::read_to_string(&marker).is_ok_and(|m| m.trim() == jobs.to_string());
    let built = if reuse {
        eprintln!(
            "rebuild: reusing the log of {jobs} jobs in {}",
            log_dir.display()
        );
        None
    } else {
        // A kept directory that holds anything else is built afresh.
        let _ = std::fs::remove_dir_all(&log_dir);
        let _ = std::fs::remove_dir_all(ingest_engine::snapshot::snapshot_dir(data.path()));
        std::fs::create_dir_all(&log_dir).expect("create the log directory");
        let started = Instant::now();
        let built = build_log_in(&log_dir, jobs, per_batch);
        let build_time = started.elapsed();
        eprintln!(
            "rebuild: built {} events ({} jobs) in {:.1} s; {:.0} MiB on disk",
            built.position,
            built.jobs.len(),
            build_time.as_secs_f64(),
            dir_size(&log_dir) as f64 / (1024.0 * 1024.0),
        );
        if matches!(data, DataDir::Kept(_)) {
            std::fs::write(&marker, jobs.to_string()).expect("write the build marker");
        }
        Some(built)
    };
    let startup_only = std::env::var("INGEST_BENCH_STARTUP_ONLY").is_ok_and(|v| v == "1");
    let mut folded = None;
    // Reusing a log for start-up alone: the engine's start-up without a
    // snapshot below is the full fold (and gives the state to compare with).
    let attempts = if built.is_none() && startup_only {
        0
    } else {
        2
    };
    for attempt in 1..=attempts {
        if cold() {
            evict_page_cache(&log_dir);
        }
        let started = Instant::now();
        let log = open(&log_dir);
        let opened = started.elapsed();
        let state = fold_log(&log);
        let total = started.elapsed();
        if let Some(built) = &built {
            assert_eq!(&state, built);
        }
        eprintln!(
            "rebuild {attempt}: open {:.2} s, fold {:.2} s, total {:.2} s = {:.0} events/s ({})",
            opened.as_secs_f64(),
            (total - opened).as_secs_f64(),
            total.as_secs_f64(),
            state.position as f64 / total.as_secs_f64(),
            if cold() {
                "page cache dropped first"
            } else {
                "OS page cache warm"
            },
        );
        folded = Some(state);
    }
    archive_figures(data.path(), built.or(folded));
}

/// Bytes per event, start-up with and without a snapshot, one batch's
/// history, and the verify pass, each against its baseline in this run.
fn archive_figures(data_dir: &Path, built: Option<State>) {
    use ingest_engine::engine::{Engine, EngineConfig};
    let log_dir = &ingest_engine::engine::log_dir(data_dir);
    let startup_only = std::env::var("INGEST_BENCH_STARTUP_ONLY").is_ok_and(|v| v == "1");
    // The engine's layout: the log in DATA_DIR/log, snapshots beside it
    // (none left from an earlier run: the baseline folds the whole log).
    let snapshots = ingest_engine::snapshot::snapshot_dir(data_dir);
    let _ = std::fs::remove_dir_all(&snapshots);
    let open_engine = || {
        if cold() {
            evict_page_cache(data_dir);
        }
        let started = Instant::now();
        let engine = Engine::open(EngineConfig::new(data_dir)).expect("open the engine");
        (engine, started.elapsed())
    };
    let (mut engine, without) = open_engine();
    let built = &built.unwrap_or_else(|| engine.state().clone());
    assert_eq!(engine.state(), built);
    let events = built.position;
    eprintln!("start-up parts without a snapshot: {:?}", engine.startup);
    if !startup_only {
        space_figures(log_dir, events);
    }
    let started = Instant::now();
    let path = engine.snapshot_now().expect("write a snapshot");
    let write = started.elapsed();
    let snapshot_bytes = std::fs::metadata(&path).map_or(0, |m| m.len());
    drop(engine);
    // Twice from the snapshot: the first open after the snapshot was written
    // (and after the baseline ran) is the figure; the second shows the spread.
    let mut with = Duration::MAX;
    let mut engine = None;
    for attempt in 1..=2 {
        drop(engine.take());
        let (opened, took) = open_engine();
        assert_eq!(opened.state(), built);
        assert_eq!(opened.startup.snapshot, Some(events));
        eprintln!(
            "start-up {attempt} from the snapshot: {:.3} s; parts: {:?}",
            took.as_secs_f64(),
            opened.startup
        );
        if attempt == 1 {
            with = took;
        }
        engine = Some(opened);
    }
    let engine = engine.expect("opened");
    let v1 = format_1_bytes(&engine);
    drop(engine);
    let with_v1 = startup_from_format_1(data_dir, &v1, built, &path, &open_engine);
    let (engine, _) = open_engine();
    eprintln!(
        "start-up: {:.2} s without a snapshot (baseline, {:.0} events/s), {:.3} s from a snapshot at the head = {:.1}x faster (snapshot {:.0} MiB, written in {:.2} s{})",
        without.as_secs_f64(),
        events as f64 / without.as_secs_f64(),
        with.as_secs_f64(),
        without.as_secs_f64() / with.as_secs_f64(),
        snapshot_bytes as f64 / (1024.0 * 1024.0),
        write.as_secs_f64(),
        if cold() { "; page cache dropped before each open" } else { "" },
    );
    eprintln!(
        "start-up from the snapshot: {:.3} s in format 3, {:.3} s in format 2 (the format before, same state) = {:.2}x",
        with.as_secs_f64(),
        with_v1.as_secs_f64(),
        with_v1.as_secs_f64() / with.as_secs_f64()
    );
    if startup_only {
        return;
    }
    // One batch in the middle of the log: through the stream index, and by
    // scanning every record (the baseline).
    let bid = *built
        .batches
        .keys()
        .nth(built.batches.len() / 2)
        .expect("a batch");
    let started = Instant::now();
    let rows =
        ingest_engine::history::batch_history(engine.log(), engine.state(), bid).expect("history");
    let indexed = started.elapsed();
    let jobs: std::collections::BTreeSet<StreamId> = built.batches[&bid]
        .jobs
        .iter()
        .map(|j| StreamId::Job(*j))
        .chain([StreamId::Batch(bid)])
        .collect();
    let started = Instant::now();
    let scanned = engine
        .log()
        .read_range(1, u64::MAX)
        .filter(|r| {
            r.as_ref()
                .map_or(true, |r| jobs.contains(&r.envelope.stream))
        })
        .count();
    let scan = started.elapsed();
    assert_eq!(rows.len(), scanned);
    eprintln!(
        "history of {bid} ({} events): {:.2} ms through the stream index, {:.2} s scanning the log (baseline) = {:.0}x",
        rows.len(),
        indexed.as_secs_f64() * 1e3,
        scan.as_secs_f64(),
        scan.as_secs_f64() / indexed.as_secs_f64()
    );
    audit_queries(engine.log());
    let started = Instant::now();
    let chain = engine.log().verify(|_| {}).expect("verify");
    let chain_time = started.elapsed();
    assert!(chain.problems.is_empty());
    let started = Instant::now();
    let full = ingest_engine::audit::verify(engine.log(), data_dir, None, |_| {}).expect("verify");
    let full_time = started.elapsed();
    assert!(full.log.problems.is_empty(), "{:?}", full.log.problems);
    eprintln!(
        "verify: {:.2} s = {:.0} events/s (chain, index, checkpoints, {} snapshot checked against a full fold); chain and index alone (baseline) {:.2} s = {:.0} events/s",
        full_time.as_secs_f64(),
        events as f64 / full_time.as_secs_f64(),
        full.snapshots_checked,
        chain_time.as_secs_f64(),
        events as f64 / chain_time.as_secs_f64()
    );
}

/// The engine's state and Merkle tree as a snapshot file of format 2 (one
/// bincode body, as written before format 3).
fn format_1_bytes(engine: &ingest_engine::engine::Engine) -> Vec<u8> {
    let state = engine.state();
    let body =
        bincode::serde::encode_to_vec((state, engine.frontier()), bincode::config::standard())
            .expect("encode format 2");
    let mut bytes = Vec::with_capacity(100 + body.len());
    bytes.extend_from_slice(b"ingest-snapshot\n");
    bytes.extend_from_slice(&2u32.to_le_bytes());
    bytes.extend_from_slice(&state.position.to_le_bytes());
    bytes.extend_from_slice(&state.head_hash);
    bytes.extend_from_slice(&(body.len() as u64).to_le_bytes());
    bytes.extend_from_slice(blake3::hash(&body).as_bytes());
    bytes.extend_from_slice(&body);
    bytes
}

/// Start-up from the same state as a snapshot of format 2 (`bytes`) in
/// place of the format-3 file at `path`, which is put back afterwards; the
/// time of the first of two opens (as for format 3).
fn startup_from_format_1(
    data_dir: &Path,
    bytes: &[u8],
    state: &State,
    path: &Path,
    open_engine: &dyn Fn() -> (ingest_engine::engine::Engine, Duration),
) -> Duration {
    let aside = data_dir.join("format-3.snap.aside");
    std::fs::rename(path, &aside).expect("set the format-3 snapshot aside");
    std::fs::write(path, bytes).expect("write the format-2 snapshot");
    let mut first = None;
    for attempt in 1..=2 {
        let (opened, took) = open_engine();
        assert_eq!(opened.state(), state);
        assert_eq!(opened.startup.snapshot, Some(state.position));
        eprintln!(
            "start-up {attempt} from the snapshot in format 2 ({:.0} MiB): {:.3} s; parts: {:?}",
            bytes.len() as f64 / (1024.0 * 1024.0),
            took.as_secs_f64(),
            opened.startup
        );
        first.get_or_insert(took);
    }
    std::fs::rename(&aside, path).expect("put the format-2 snapshot back");
    first.expect("opened")
}

/// Bytes per event on disk and where they go, by key kind.
fn space_figures(log_dir: &Path, events: u64) {
    let record_bytes: u64 = {
        let log = open(log_dir);
        log.raw_tree()
            .scan_prefix([Log::raw_event_key(1)[0]])
            .map(|kv| kv.expect("read").1.len() as u64)
            .sum()
    };
    {
        // Where the bytes go: the log's keys and values by kind.
        let log = open(log_dir);
        let mut kinds: std::collections::BTreeMap<char, (u64, u64)> = Default::default();
        for kv in log.raw_tree().iter() {
            let (k, v) = kv.expect("read");
            let e = kinds.entry(k[0] as char).or_default();
            e.0 += 1;
            e.1 += (k.len() + v.len()) as u64;
        }
        for (kind, (n, bytes)) in kinds {
            eprintln!(
                "space: key kind {kind:?}: {n} entries, {:.1} bytes/event of keys and values",
                bytes as f64 / events as f64
            );
        }
    }
    let disk = dir_size(log_dir);
    eprintln!(
        "space: {disk} bytes on disk for {events} events = {:.0} bytes/event ({:.0} bytes/event of encoded records)",
        disk as f64 / events as f64,
        record_bytes as f64 / events as f64
    );
}

/// History by actor, collection and time window through the indexes,
/// against one scan of the log filtering the same (the baseline).
fn audit_queries(log: &Log) {
    use ingest_engine::history::{query, HistoryQuery, Scope};
    let head = log.durable_position();
    let at = |p: u64| log.read_one(p).expect("read").envelope.timestamp;
    // A window of about 1,000 events in the middle of the log.
    let since = at(head / 2);
    let until = at((head / 2 + 1_000).min(head));
    let queries = [
        (
            "--by worker:w1 in a ~1,000-event window",
            HistoryQuery {
                since: Some(since),
                until: Some(until),
                actor: Some(Actor::worker("w1")),
                ..HistoryQuery::default()
            },
        ),
        (
            "--collection ucb_lib in a ~1,000-event window",
            HistoryQuery {
                since: Some(since),
                until: Some(until),
                collection: Some("ucb_lib".into()),
                ..HistoryQuery::default()
            },
        ),
        (
            "--by depositor:alice (every submission, whole log)",
            HistoryQuery {
                actor: Some(Actor::depositor("alice")),
                limit: Some(1_000_000),
                ..HistoryQuery::default()
            },
        ),
    ];
    for (name, q) in queries {
        let started = Instant::now();
        let (rows, _) = query(log, &Scope::Log, &q).expect("query");
        let indexed = started.elapsed();
        let started = Instant::now();
        let mut collections: std::collections::HashMap<StreamId, String> = Default::default();
        let scanned = log
            .read_range(1, head)
            .map(|r| r.expect("read"))
            .filter(|r| {
                match &r.event {
                    Event::BatchSubmitted(e) => {
                        collections.insert(r.envelope.stream, e.submission.profile_name.clone());
                    }
                    Event::JobCreated(e) => {
                        collections.insert(r.envelope.stream, e.configuration.profile_name.clone());
                    }
                    _ => {}
                }
                let e = &r.envelope;
                q.since.is_none_or(|t| e.timestamp >= t)
                    && q.until.is_none_or(|t| e.timestamp < t)
                    && q.actor.as_ref().is_none_or(|a| *a == e.actor)
                    && q.collection
                        .as_ref()
                        .is_none_or(|c| collections.get(&e.stream) == Some(c))
            })
            .count();
        let scan = started.elapsed();
        assert_eq!(rows.len(), scanned, "{name}");
        eprintln!(
            "history {name}: {} events in {:.2} ms through the indexes, {:.2} s scanning the log (baseline) = {:.0}x",
            rows.len(),
            indexed.as_secs_f64() * 1e3,
            scan.as_secs_f64(),
            scan.as_secs_f64() / indexed.as_secs_f64()
        );
    }
}
