//! `ingest-load`: the load driver behind `tools/load`.
//!
//! For each worker count W it starts a fresh `ingest serve` (its own data
//! directory and ZooKeeper root, no in-process daemons: the engine, the
//! projector and the API only) and W `ingest worker` processes running every
//! daemon a job needs on its way to Completed, with simulated steps of zero
//! duration. It submits N batches of M jobs as fast as it can, waits until
//! every job and batch is Completed, and measures from the server's own
//! clock: each job's latency is the time of its `-> Completed` event minus
//! the time of its batch's `BatchSubmitted` event (both from
//! `GET /batches/{bid}/history`), and the throughput is the number of jobs
//! over the span from the first `BatchSubmitted` to the last `-> Completed`.
//!
//! Besides the table it reports, per round, the walk alone (leaving Pending
//! to Completed, without the wait behind the rest of the burst), events per
//! job, ZooKeeper requests per job (`mntr`), the projector's largest lag
//! (`/metrics`), the CPU seconds of the server, the workers and ZooKeeper,
//! refused worker reports and WARN/ERROR lines in the logs.
//!
//! With `--mode real` it measures the real steps instead: for each count F
//! of files per object it serves generated files (and one checkm object
//! manifest per object) from an HTTP server of its own on loopback, fetches
//! them with `curl` as the baseline, then ingests the same objects through a
//! fresh `ingest serve` and ONE `ingest worker --steps real` (download,
//! identifiers, signed storage manifest, OCFL storage with fixity,
//! inventory, notify), and compares objects and bytes per second.
//!
//! Modules: `simulate` (the rounds of the simulated mode), `real` (the
//! corpus, its server, curl and the rounds of the real mode), `procs` (the
//! children: start, watch, kill, CPU time, logs), `history` (times read off
//! a batch's history), `api` (the server's API through `ingest-client`).
//!
//! ZooKeeper is not started here: `tools/load` starts a private one and
//! passes `--zk`. Every child is killed when its round ends, when the run
//! fails, on Ctrl-C and on SIGTERM (the children are `kill_on_drop`); their
//! pids are also written to `WORK_DIR/pids` so that `tools/load` can clean up
//! after a driver that was killed outright.

mod api;
mod history;
mod procs;
mod real;
mod simulate;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::anyhow;
use clap::Parser;
use ingest_events::lifecycle::StateKind;
use ingest_events::JobState;

use crate::real::run_real;
use crate::simulate::run;

/// The daemons each worker runs for jobs (with `--tasks` tasks each): the
/// one that starts jobs, then one per state with a step.
fn job_daemons() -> impl Iterator<Item = String> {
    std::iter::once("job_pending".to_string()).chain(JobState::WITH_STEP.map(JobState::queue_name))
}
/// The batch daemons each worker runs (one task each: a batch is one
/// command, and each task lists every batch on each look).
const BATCH_DAEMONS: [&str; 2] = ["batch_pending", "batch_reporting"];
/// The most submissions in flight at once.
const SUBMIT_CONCURRENCY: usize = 16;
/// How often the driver looks at `GET /status`.
const POLL: Duration = Duration::from_millis(200);
/// How many log lines an error shows.
const TAIL_LINES: usize = 30;
/// The states a job passes on its way to Completed, in order (real mode
/// reports the time spent in each).
fn job_states() -> impl Iterator<Item = &'static str> {
    std::iter::once(JobState::Pending)
        .chain(JobState::WITH_STEP)
        .map(StateKind::name)
}

/// What the load test runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Mode {
    /// Zero-duration simulated steps; a round per worker count.
    Simulate,
    /// Real steps downloading from a local HTTP server, one worker; a round
    /// per files-per-object count, against curl fetching the same files.
    Real,
}

/// Drives `ingest serve` and `ingest worker` processes through a load test.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "ingest-load",
    about = "Submit N batches of M jobs with zero-duration simulated steps and measure jobs/s and submission-to-Completed latency for several worker counts; or, with --mode real, ingest objects of 1, 10 and 100 files through the real steps and compare objects/s and MB/s with curl fetching the same files.",
    after_help = "Usually run through tools/load, which builds the binaries and starts a private ZooKeeper."
)]
struct Args {
    /// simulate: zero-duration steps, a round per worker count (--batches,
    /// --jobs, --workers, --step-ms); real: the real steps with one worker,
    /// a round per files-per-object count (--files, --objects,
    /// --object-bytes), against curl.
    #[arg(long, value_enum, default_value_t = Mode::Simulate)]
    mode: Mode,
    /// ZooKeeper connect string (host:port).
    #[arg(long, value_name = "HOSTS")]
    zk: String,
    /// The ZooKeeper server's pid, to account for its CPU time.
    #[arg(long, value_name = "PID")]
    zk_pid: Option<u32>,
    /// The `ingest` binary [default: `ingest` next to this program].
    #[arg(long, value_name = "PATH")]
    ingest: Option<PathBuf>,
    /// Batches to submit per round.
    #[arg(long, default_value_t = 20, value_name = "N")]
    batches: usize,
    /// Jobs per batch (inline manifest lines).
    #[arg(long, default_value_t = 50, value_name = "M")]
    jobs: usize,
    /// Worker process counts, one round each, comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "1,2,4",
        value_name = "LIST"
    )]
    workers: Vec<usize>,
    /// Tasks per job daemon in each worker (batch daemons: --batch-tasks). With
    /// zero-duration steps a task spends its time on its report's round trip
    /// and on waiting, lock held, for the projection to show the job's new
    /// state, so one task per daemon leaves the engine idle; on 2 cores one
    /// worker got faster up to 4 tasks and no faster beyond, while every
    /// task is one more ZooKeeper watcher re-listing its queue.
    #[arg(long, default_value_t = 4, value_name = "T")]
    tasks: u32,
    /// Duration of each simulated step, in milliseconds.
    #[arg(long, default_value_t = 0, value_name = "MS")]
    step_ms: u64,
    /// Give up on a round after this many seconds.
    #[arg(long, default_value_t = 600, value_name = "SECS")]
    timeout: u64,
    /// Give up on a round when nothing moves for this many seconds.
    #[arg(long, default_value_t = 60, value_name = "SECS")]
    stall: u64,
    /// Where data directories and logs go [default: a new directory under the temp dir].
    #[arg(long, value_name = "DIR")]
    work_dir: Option<PathBuf>,
    /// Also write the results as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Real mode: files per object, one round each, comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "1,10,100",
        value_name = "LIST"
    )]
    files: Vec<usize>,
    /// Real mode: objects per round, each an object-manifest batch of one job.
    /// 200 objects of 4 MiB make every round 800 MiB whatever its file count
    /// (200, 2,000 or 20,000 files), so rounds differ in files and not in
    /// bytes. On 2 cores a round's ingest then spans 11 to 17 s, about 30
    /// times one job's walk (0.4 to 0.7 s), so the pipeline's fill and drain
    /// count little and a shared machine's noise averages out, and the whole
    /// real mode takes about 3 minutes. The driver holds
    /// a round's files in memory (800 MiB).
    #[arg(long, default_value_t = 200, value_name = "N")]
    objects: usize,
    /// Real mode: objects of a warm-up round, run before the measured
    /// rounds and not reported (0: none). Every round starts its own server
    /// and worker, but ZooKeeper is started once: run first, a round paid
    /// for its JVM's warm-up (the mean wait to job creation of the same
    /// 1-file round was 263-318 ms first and 172-176 ms second).
    #[arg(long, default_value_t = 50, value_name = "N")]
    warmup_objects: usize,
    /// Real mode: bytes per object, split evenly over its files (4 MiB: one
    /// 4 MiB file, 10 of 410 KiB or 100 of 41 KiB).
    #[arg(long, default_value_t = 4 * 1024 * 1024, value_name = "BYTES")]
    object_bytes: u64,
    /// Real mode: concurrent transfers per job (the worker's
    /// --transfers-per-job, its --transfers being this times --tasks) and
    /// curl's --parallel-max.
    #[arg(long, default_value_t = 4, value_name = "K")]
    transfers_per_job: usize,
    /// Real mode: how many times curl fetches every file (to /dev/null, then as
    /// many times into files of the round's directory); the median run of each counts.
    #[arg(long, default_value_t = 3, value_name = "N")]
    curl_runs: usize,
    /// Real mode: the seed of the generated files' bytes.
    #[arg(long, default_value_t = 1, value_name = "SEED")]
    seed: u64,
    /// Tasks of batch_pending and batch_reporting in each worker [default:
    /// 4; 16 in real mode, where each object is a batch of its own: N tasks
    /// expand and acquire N batches at once, and with 4 the acquisitions
    /// of a burst of 200 single-object batches, not the steps, set the wait
    /// to job creation (mean 500-640 ms against 140-250 ms with 16)].
    #[arg(long, value_name = "N")]
    batch_tasks: Option<u32>,
    /// Real mode: tasks of the worker's job_pending daemon [default:
    /// --tasks]. They start jobs; each later step runs in a task of its own
    /// daemon (handed off under the job's lock), so these tasks bound how
    /// many jobs are started at once, not the whole pipeline.
    #[arg(long, value_name = "N")]
    pending_tasks: Option<u32>,
    /// Simulate mode: before each round is measured, submit this many
    /// batches of one job and wait until they are Completed, so that the
    /// round runs with that many finished batches in the tree (batch
    /// reporting must not slow down with them; the notes give the time
    /// from a batch's last job Completed to the batch Completed).
    #[arg(long, default_value_t = 0, value_name = "N")]
    prefill_batches: usize,
    /// Real mode: the curl program.
    #[arg(long, default_value = "curl", value_name = "PATH")]
    curl: PathBuf,
    /// Real mode: keep each round's OCFL storage and working storage
    /// (otherwise removed when the round succeeded; logs always stay in
    /// the work directory).
    #[arg(long)]
    keep: bool,
}

impl Args {
    /// `--batch-tasks`, or its default for the mode.
    fn batch_tasks(&self) -> u32 {
        self.batch_tasks.unwrap_or(match self.mode {
            Mode::Simulate => 4,
            Mode::Real => 16,
        })
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("ingest-load: error: cannot watch SIGTERM: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let work = async {
        match args.mode {
            Mode::Simulate => run(args).await,
            Mode::Real => run_real(args).await,
        }
    };
    let result = tokio::select! {
        r = work => r,
        _ = tokio::signal::ctrl_c() => Err(anyhow!("interrupted (Ctrl-C); the servers and workers are killed")),
        _ = term.recv() => Err(anyhow!("terminated (SIGTERM); the servers and workers are killed")),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ingest-load: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::history::*;
    use crate::procs::*;
    use crate::real::*;
    use anyhow::{Context, Result};
    use ingest_protocol::history::HistoryRow;
    use serde_json::json;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(nearest_rank(&v, 50.0), 50.0);
        assert_eq!(nearest_rank(&v, 99.0), 99.0);
        assert_eq!(nearest_rank(&[7.0], 99.0), 7.0);
        assert_eq!(nearest_rank(&[], 50.0), 0.0);
        assert_eq!(nearest_rank(&[1.0, 2.0, 3.0], 50.0), 2.0);
    }

    #[test]
    fn metrics_are_read_from_prometheus_text() {
        let text = "# HELP x\ningest_projector_events_behind 12\ningest_jobs{state=\"Pending\"} 3\ningest_jobs{state=\"Completed\"} 9\n";
        assert_eq!(metric(text, "ingest_projector_events_behind"), 12.0);
        assert_eq!(metric(text, "ingest_jobs"), 9.0);
        assert_eq!(metric(text, "missing"), 0.0);
    }

    #[test]
    fn colour_sequences_are_stripped() {
        assert_eq!(
            strip_ansi("\u{1b}[2mt\u{1b}[0m \u{1b}[33m WARN\u{1b}[0m x"),
            "t  WARN x"
        );
    }

    #[test]
    fn object_bytes_are_split_evenly_over_the_files() {
        assert_eq!(file_sizes(10, 3), vec![4, 3, 3]);
        assert_eq!(file_sizes(4 * 1024 * 1024, 1), vec![4 * 1024 * 1024]);
        let sizes = file_sizes(4 * 1024 * 1024, 100);
        assert_eq!(sizes.len(), 100);
        assert_eq!(sizes.iter().sum::<u64>(), 4 * 1024 * 1024);
    }

    #[tokio::test]
    async fn the_floor_fetches_every_byte_once_and_removes_what_it_wrote() -> Result<()> {
        use clap::Parser;
        let args = crate::Args::try_parse_from([
            "ingest-load",
            "--zk",
            "127.0.0.1:1",
            "--objects",
            "3",
            "--object-bytes",
            "100000",
            "--tasks",
            "2",
        ])?;
        let depot: Depot = std::sync::Arc::default();
        let base = serve_depot(std::sync::Arc::clone(&depot)).await?;
        let corpus = build_corpus(&args, &depot, &base, 4)?;
        let dir = std::env::temp_dir().join(format!("ingest-load-floor-{}", std::process::id()));
        let run = floor_run(&args, &corpus, &dir).await?;
        assert!(run.seconds > 0.0 && run.cpu_seconds >= 0.0);
        assert!(!dir.exists(), "the floor's files are removed");

        // A file the server no longer has fails the run.
        depot.write().expect("depot").clear();
        let err = floor_run(&args, &corpus, &dir)
            .await
            .expect_err("every file is gone");
        assert!(format!("{err:#}").contains("404"), "{err:#}");
        let _ = std::fs::remove_dir_all(&dir);
        Ok(())
    }

    #[test]
    fn repeated_worker_counts_are_averaged_in_first_run_order() {
        use crate::simulate::{by_workers, Group};
        let groups = by_workers([(1, 400.0), (4, 500.0), (4, 420.0), (1, 500.0)]);
        assert_eq!(
            groups,
            vec![
                Group {
                    workers: 1,
                    rounds: 2,
                    mean: 450.0,
                    min: 400.0,
                    max: 500.0
                },
                Group {
                    workers: 4,
                    rounds: 2,
                    mean: 460.0,
                    min: 420.0,
                    max: 500.0
                },
            ]
        );
        assert!(by_workers([]).is_empty());
    }

    #[test]
    fn generated_bytes_are_deterministic() {
        assert_eq!(random_bytes(7, 1000), random_bytes(7, 1000));
        assert_ne!(random_bytes(7, 64), random_bytes(8, 64));
        assert_eq!(random_bytes(7, 13).len(), 13);
        assert_eq!(&random_bytes(7, 1000)[..13], &random_bytes(7, 13)[..]);
    }

    #[test]
    fn the_object_manifest_is_one_object_of_every_file() -> Result<()> {
        use ingest_steps::forms::{objects, Form};
        let lines: Vec<(String, String, u64, String)> = (0..3u64)
            .map(|i| {
                let body = random_bytes(i, 100 + i as usize);
                (
                    format!("http://127.0.0.1:9/files/r3/o0000/f{i:04}.bin"),
                    sha256_hex(&body),
                    100 + i,
                    format!("f{i:04}.bin"),
                )
            })
            .collect();
        let text = object_manifest(&lines);
        let manifest = ingest_steps::checkm::parse(text.as_bytes())?;
        let found = objects(&manifest, Form::ObjectManifest)?;
        assert_eq!(found.len(), 1);
        let files = &found[0].files;
        assert_eq!(files.len(), 3);
        assert_eq!(files[2].name, "f0002.bin");
        assert_eq!(files[2].size, Some(102));
        assert_eq!(files[2].url, lines[2].0);
        assert!(files.iter().all(|f| f.digest.is_some()));
        Ok(())
    }

    /// The rows of a history answer, with the fields these tests leave
    /// out filled in.
    fn rows(history: &serde_json::Value) -> Result<Vec<HistoryRow>> {
        let mut out = Vec::new();
        for (i, e) in history["events"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            let mut e = e.clone();
            if let Some(o) = e.as_object_mut() {
                o.entry("position").or_insert(json!(i + 1));
                o.entry("actor").or_insert(json!("worker:test"));
                o.entry("version").or_insert(json!(1));
                o.entry("correlation_id").or_insert(json!(""));
            }
            out.push(serde_json::from_value(e)?);
        }
        Ok(out)
    }

    #[test]
    fn traces_come_from_the_history() -> Result<()> {
        let history = json!({"events": [
            {"time": "2026-01-01T00:00:00.000000Z", "stream": "bid0000000001", "event": "BatchSubmitted", "detail": "submitted"},
            {"time": "2026-01-01T00:00:00.100000Z", "stream": "bid0000000001", "event": "BatchAcquired", "detail": "Pending -> Processing (1 jobs)"},
            {"time": "2026-01-01T00:00:00.100000Z", "stream": "jid0000000001", "event": "JobCreated", "detail": "created"},
            {"time": "2026-01-01T00:00:00.110000Z", "stream": "jid0000000001", "event": "JobStatusChanged", "detail": "Pending -> Estimating"},
            {"time": "2026-01-01T00:00:00.200000Z", "stream": "jid0000000001", "event": "JobStatusChanged", "detail": "Provisioning -> Downloading: Provisioning done"},
            {"time": "2026-01-01T00:00:00.250000Z", "stream": "jid0000000001", "event": "JobStepRetried", "detail": "Downloading retry 1: busy"},
            {"time": "2026-01-01T00:00:00.300000Z", "stream": "jid0000000001", "event": "JobStatusChanged", "detail": "Downloading -> Processing: downloaded 10 files, 4194304 bytes"},
            {"time": "2026-01-01T00:00:00.900000Z", "stream": "jid0000000001", "event": "JobStatusChanged", "detail": "Notify -> Completed: notified nobody"},
        ]});
        let history = rows(&history)?;
        let (submitted, jobs) = traces("bid0000000001", &history)?;
        assert_eq!(jobs.len(), 1);
        let job = jobs.get("jid0000000001").context("the job")?;
        assert_eq!(
            job.created.map(|c| c - submitted),
            Some(chrono::TimeDelta::milliseconds(100))
        );
        let entered = job.entered.get("Downloading").context("entered")?;
        let left = job.left.get("Downloading").context("left")?;
        assert_eq!((*left - *entered).num_milliseconds(), 100);
        assert_eq!(job.downloaded, Some(4_194_304));
        assert_eq!(job.retries, 1);
        assert_eq!(
            job.completed.map(|c| (c - submitted).num_milliseconds()),
            Some(900)
        );
        assert_eq!(downloaded_bytes("Provisioning done"), None);
        Ok(())
    }

    #[test]
    fn timings_come_from_the_history() -> Result<()> {
        let history = json!({"events": [
            {"time": "2026-01-01T00:00:00.000000Z", "stream": "bid0000000001", "event": "BatchSubmitted", "detail": "submitted"},
            {"time": "2026-01-01T00:00:00.100000Z", "stream": "jid0000000001", "event": "JobStatusChanged", "detail": "Pending -> Estimating"},
            {"time": "2026-01-01T00:00:00.500000Z", "stream": "jid0000000001", "event": "JobStatusChanged", "detail": "Notify -> Completed: simulated"},
            {"time": "2026-01-01T00:00:00.400000Z", "stream": "jid0000000002", "event": "JobStatusChanged", "detail": "Storing -> Recording"},
        ]});
        let history = rows(&history)?;
        let (submitted, jobs) = timings("bid0000000001", &history)?;
        let done: Vec<_> = jobs.values().filter(|j| j.completed.is_some()).collect();
        assert_eq!(done.len(), 1);
        let at = jobs
            .get("jid0000000001")
            .and_then(|j| j.completed)
            .context("jid0000000001 completed")?;
        assert_eq!((at - submitted).num_milliseconds(), 500);
        let started = jobs
            .get("jid0000000001")
            .and_then(|j| j.started)
            .context("jid0000000001 started")?;
        assert_eq!((at - started).num_milliseconds(), 400);
        Ok(())
    }
}
