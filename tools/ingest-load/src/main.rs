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
//! inventory, notify), and compares objects and bytes per second. See
//! [`run_real`].
//!
//! ZooKeeper is not started here: `tools/load` starts a private one and
//! passes `--zk`. Every child is killed when its round ends, when the run
//! fails, on Ctrl-C and on SIGTERM (the children are `kill_on_drop`); their
//! pids are also written to `WORK_DIR/pids` so that `tools/load` can clean up
//! after a driver that was killed outright.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, ensure, Context, Result};
use axum::body::Bytes;
use chrono::{DateTime, Utc};
use clap::Parser;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::{json, Value};
use tokio::process::{Child, Command};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

/// The daemons each worker runs for jobs (with `--tasks` tasks each).
const JOB_DAEMONS: [&str; 8] = [
    "job_pending",
    "estimating",
    "provisioning",
    "downloading",
    "processing",
    "storing",
    "recording",
    "notify",
];
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
const JOB_STATES: [&str; 8] = [
    "Pending",
    "Estimating",
    "Provisioning",
    "Downloading",
    "Processing",
    "Storing",
    "Recording",
    "Notify",
];

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
    /// Tasks per job daemon in each worker (batch daemons run one task). With
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
    /// Real mode: bytes per object, split evenly over its files (4 MiB: one
    /// 4 MiB file, 10 of 410 KiB or 100 of 41 KiB).
    #[arg(long, default_value_t = 4 * 1024 * 1024, value_name = "BYTES")]
    object_bytes: u64,
    /// Real mode: concurrent transfers per job (the worker's
    /// --transfers-per-job, its --transfers being this times --tasks) and
    /// curl's --parallel-max.
    #[arg(long, default_value_t = 4, value_name = "K")]
    transfers_per_job: usize,
    /// Real mode: how many times curl fetches every file; the median run counts.
    #[arg(long, default_value_t = 3, value_name = "N")]
    curl_runs: usize,
    /// Real mode: the seed of the generated files' bytes.
    #[arg(long, default_value_t = 1, value_name = "SEED")]
    seed: u64,
    /// Real mode: tasks of batch_pending and batch_reporting in the worker
    /// (one, as in simulate mode; each object is a batch of its own, so one
    /// task expands them one at a time).
    #[arg(long, default_value_t = 1, value_name = "N")]
    batch_tasks: u32,
    /// Real mode: the curl program.
    #[arg(long, default_value = "curl", value_name = "PATH")]
    curl: PathBuf,
    /// Real mode: keep each round's OCFL storage and working storage
    /// (otherwise removed when the round succeeded; logs always stay in
    /// the work directory).
    #[arg(long)]
    keep: bool,
}

/// The tokens of one run (at least 16 characters, distinct).
struct Tokens {
    admin: String,
    depositor: String,
    worker: String,
}

impl Tokens {
    fn new() -> Tokens {
        let salt = format!("{}-{}", std::process::id(), Utc::now().timestamp_micros());
        Tokens {
            admin: format!("load-admin-{salt}"),
            depositor: format!("load-depositor-{salt}"),
            worker: format!("load-worker-{salt}"),
        }
    }
}

/// A child process with its logs; killed (SIGKILL) when dropped.
struct Proc {
    name: String,
    child: Child,
    stdout: PathBuf,
    stderr: PathBuf,
}

impl Proc {
    fn spawn(name: &str, mut cmd: Command, dir: &Path, pids: &Path) -> Result<Proc> {
        let stdout = dir.join(format!("{name}.out"));
        let stderr = dir.join(format!("{name}.log"));
        let out = std::fs::File::create(&stdout)
            .with_context(|| format!("cannot create {}", stdout.display()))?;
        let err = std::fs::File::create(&stderr)
            .with_context(|| format!("cannot create {}", stderr.display()))?;
        cmd.stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .kill_on_drop(true);
        let child = cmd.spawn().with_context(|| {
            format!(
                "cannot start {name} ({})",
                Path::new(cmd.as_std().get_program()).display()
            )
        })?;
        if let Some(pid) = child.id() {
            let mut f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(pids)
                .with_context(|| format!("cannot open {}", pids.display()))?;
            writeln!(f, "{pid}").with_context(|| format!("cannot write {}", pids.display()))?;
        }
        Ok(Proc {
            name: name.to_string(),
            child,
            stdout,
            stderr,
        })
    }

    /// The last lines of its stderr log (and stdout), for error messages.
    fn tail(&self) -> String {
        let mut s = String::new();
        for path in [&self.stderr, &self.stdout] {
            let text = strip_ansi(&std::fs::read_to_string(path).unwrap_or_default());
            let lines: Vec<&str> = text.lines().collect();
            if lines.is_empty() {
                continue;
            }
            let _ = writeln!(s, "---- last lines of {} ----", path.display());
            for l in &lines[lines.len().saturating_sub(TAIL_LINES)..] {
                let _ = writeln!(s, "{l}");
            }
        }
        if s.is_empty() {
            s = format!("({} wrote nothing)\n", self.name);
        }
        s
    }

    /// An error when the process has exited.
    fn check_alive(&mut self) -> Result<()> {
        match self.child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => bail!("{} exited ({status})\n{}", self.name, self.tail()),
            Err(e) => bail!("cannot check on {}: {e}", self.name),
        }
    }

    /// Waits until its stdout has a line starting with `prefix`; gives the line.
    async fn await_line(&mut self, prefix: &str, within: Duration) -> Result<String> {
        let deadline = Instant::now() + within;
        loop {
            let text = std::fs::read_to_string(&self.stdout).unwrap_or_default();
            if let Some(line) = text.lines().find(|l| l.starts_with(prefix)) {
                return Ok(line.to_string());
            }
            self.check_alive()
                .with_context(|| format!("{} did not start", self.name))?;
            if Instant::now() > deadline {
                bail!(
                    "{} did not print {prefix:?} within {within:?}\n{}",
                    self.name,
                    self.tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Sends SIGTERM (a graceful stop) unless it has exited.
    fn terminate(&mut self) {
        if let Ok(Some(_)) = self.child.try_wait() {
            return;
        }
        if let Some(pid) = self.child.id() {
            let _ = std::process::Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .stderr(Stdio::null())
                .status();
        }
    }

    /// Waits for it to exit, then SIGKILL after `grace`.
    async fn reap(&mut self, grace: Duration) {
        if tokio::time::timeout(grace, self.child.wait())
            .await
            .is_err()
        {
            eprintln!("{} did not stop within {grace:?}; killing it", self.name);
            let _ = self.child.kill().await;
        }
    }
}

/// The API of one server.
struct Api {
    base: String,
    http: reqwest::Client,
    tokens: Arc<Tokens>,
}

impl Api {
    async fn get(&self, path: &str) -> Result<Value> {
        let resp = self
            .http
            .get(format!("{}{path}", self.base))
            .bearer_auth(&self.tokens.admin)
            .send()
            .await
            .with_context(|| format!("GET {path}"))?;
        let status = resp.status();
        let body: Value = resp.json().await.unwrap_or(Value::Null);
        if !status.is_success() {
            bail!("GET {path}: {status}: {body}");
        }
        Ok(body)
    }

    async fn metrics(&self) -> Result<String> {
        let resp = self
            .http
            .get(format!("{}/metrics", self.base))
            .send()
            .await
            .context("GET /metrics")?;
        resp.text().await.context("GET /metrics: the body")
    }

    async fn submit(&self, batch: usize, jobs: usize) -> Result<String> {
        let manifest: Vec<String> = (0..jobs)
            .map(|i| format!("https://example.org/load/{batch}/{i}.txt loc{batch}-{i}"))
            .collect();
        let body = json!({
            "submitter": "load",
            "profile": "load",
            "type": "object-manifest",
            "payload_url": format!("https://example.org/load/{batch}.checkm"),
            "manifest": manifest,
        });
        let resp = self
            .http
            .post(format!("{}/batches", self.base))
            .bearer_auth(&self.tokens.depositor)
            .json(&body)
            .send()
            .await
            .with_context(|| format!("POST /batches (batch {batch})"))?;
        let status = resp.status();
        let body: Value = resp.json().await.unwrap_or(Value::Null);
        if status.as_u16() != 201 {
            bail!("POST /batches (batch {batch}): {status}: {body}");
        }
        body["bid"]
            .as_str()
            .map(str::to_string)
            .with_context(|| format!("POST /batches: no bid in {body}"))
    }

    /// Submits a batch of the given JSON (`n` names it in errors); its bid.
    async fn submit_body(&self, n: usize, body: &Value) -> Result<String> {
        let resp = self
            .http
            .post(format!("{}/batches", self.base))
            .bearer_auth(&self.tokens.depositor)
            .json(body)
            .send()
            .await
            .with_context(|| format!("POST /batches (batch {n})"))?;
        let status = resp.status();
        let reply: Value = resp.json().await.unwrap_or(Value::Null);
        if status.as_u16() != 201 {
            bail!("POST /batches (batch {n}): {status}: {reply}");
        }
        reply["bid"]
            .as_str()
            .map(str::to_string)
            .with_context(|| format!("POST /batches: no bid in {reply}"))
    }
}

/// What one round measured.
#[derive(Debug, Clone, serde::Serialize)]
struct Round {
    workers: usize,
    tasks: u32,
    batches: usize,
    jobs_per_batch: usize,
    jobs: usize,
    /// From the first BatchSubmitted to the last -> Completed (server clock).
    seconds: f64,
    jobs_per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
    /// From leaving Pending to Completed: the walk itself, without the
    /// wait in the Pending queue behind the rest of the burst.
    walk_p50_ms: f64,
    walk_p99_ms: f64,
    /// How long the submissions took (client clock).
    submit_seconds: f64,
    /// From the first submission to seeing everything Completed (client clock).
    wall_seconds: f64,
    /// Events in the log at the end.
    events: u64,
    max_projector_events_behind: f64,
    max_projector_seconds_behind: f64,
    /// CPU seconds used from the first submission until everything was
    /// Completed, by the server, all workers together and ZooKeeper.
    cpu_seconds_serve: f64,
    cpu_seconds_workers: f64,
    cpu_seconds_zookeeper: Option<f64>,
    /// Requests ZooKeeper received over the same span (`mntr`'s
    /// zk_packets_received; every client of the server counts).
    zookeeper_requests: Option<u64>,
    /// Worker reports the API refused (409), from the worker logs.
    refused_reports: usize,
    /// WARN and ERROR lines in the server's and workers' logs.
    warn_lines: usize,
    error_lines: usize,
    /// A few distinct WARN/ERROR messages, for the report.
    log_samples: Vec<String>,
    /// Jobs/s against the baseline round of the same run.
    ratio: f64,
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

async fn run(args: Args) -> Result<()> {
    if args.batches == 0 || args.jobs == 0 {
        bail!("--batches and --jobs must be at least 1");
    }
    if args.workers.is_empty() || args.workers.contains(&0) {
        bail!("--workers must list worker counts of at least 1, e.g. 1,2,4");
    }
    if args.tasks == 0 {
        bail!("--tasks must be at least 1");
    }
    let (ingest, work) = binary_and_work_dir(&args)?;
    let tokens = Arc::new(Tokens::new());
    eprintln!(
        "ingest-load: {} batches x {} jobs, workers {:?}, {} tasks per job daemon, steps of {} ms; logs in {}",
        args.batches,
        args.jobs,
        args.workers,
        args.tasks,
        args.step_ms,
        work.display()
    );

    let mut rounds = Vec::new();
    for (i, &w) in args.workers.iter().enumerate() {
        let name = format!("round{}-{w}w", i + 1);
        let round = run_round(&args, &ingest, &work, &name, &tokens, w)
            .await
            .with_context(|| format!("the {w}-worker round failed (logs in {})", work.display()))?;
        eprintln!(
            "round {w} worker(s): {} jobs in {:.2} s = {:.1} jobs/s, p50 {:.0} ms, p99 {:.0} ms",
            round.jobs, round.seconds, round.jobs_per_s, round.p50_ms, round.p99_ms
        );
        rounds.push(round);
    }

    let (base_label, base) = match rounds.iter().find(|r| r.workers == 1) {
        Some(r) => ("1 worker".to_string(), r.jobs_per_s),
        None => (
            format!("{} workers", rounds[0].workers),
            rounds[0].jobs_per_s,
        ),
    };
    for r in &mut rounds {
        r.ratio = if base > 0.0 { r.jobs_per_s / base } else { 0.0 };
    }
    print!("{}", table(&rounds, &base_label));
    print!("{}", notes(&rounds));

    if let Some(path) = &args.json {
        let doc = json!({
            "date": Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
            "batches": args.batches,
            "jobs_per_batch": args.jobs,
            "tasks_per_job_daemon": args.tasks,
            "step_ms": args.step_ms,
            "baseline": base_label,
            "rounds": rounds,
        });
        let text = serde_json::to_string_pretty(&doc).context("cannot encode the results")?;
        std::fs::write(path, text + "\n")
            .with_context(|| format!("cannot write {}", path.display()))?;
        eprintln!("ingest-load: results written to {}", path.display());
    }
    Ok(())
}

/// The `ingest` binary (checked) and the work directory (created).
fn binary_and_work_dir(args: &Args) -> Result<(PathBuf, PathBuf)> {
    let ingest = match &args.ingest {
        Some(p) => p.clone(),
        None => std::env::current_exe()
            .context("cannot find this program's path")?
            .with_file_name("ingest"),
    };
    if !ingest.is_file() {
        bail!(
            "the ingest binary {} does not exist (build it: cargo build --release --bin ingest, or give --ingest PATH)",
            ingest.display()
        );
    }
    let work = match &args.work_dir {
        Some(d) => d.clone(),
        None => std::env::temp_dir().join(format!("ingest-load-{}", std::process::id())),
    };
    std::fs::create_dir_all(&work)
        .with_context(|| format!("cannot create the work directory {}", work.display()))?;
    Ok((ingest, work))
}

fn table(rounds: &[Round], base_label: &str) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "| workers | jobs | seconds | jobs/s | p50 ms | p99 ms | ratio vs {base_label} |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|");
    for r in rounds {
        let _ = writeln!(
            s,
            "| {} | {} | {:.2} | {:.1} | {:.0} | {:.0} | {:.2} |",
            r.workers, r.jobs, r.seconds, r.jobs_per_s, r.p50_ms, r.p99_ms, r.ratio
        );
    }
    s
}

fn notes(rounds: &[Round]) -> String {
    let unknown = || "?".to_string();
    let mut s = String::new();
    for r in rounds {
        let _ = writeln!(
            s,
            "{} worker(s): Pending -> Completed p50 {:.0} ms, p99 {:.0} ms; {} events ({:.1} per job); ZooKeeper requests per job {}; projector at most {:.0} events / {:.2} s behind",
            r.workers,
            r.walk_p50_ms,
            r.walk_p99_ms,
            r.events,
            r.events as f64 / r.jobs as f64,
            r.zookeeper_requests
                .map_or_else(unknown, |n| format!("{:.0}", n as f64 / r.jobs as f64)),
            r.max_projector_events_behind,
            r.max_projector_seconds_behind,
        );
        let _ = writeln!(
            s,
            "    CPU seconds over {:.1} s: serve {:.1}, workers {:.1}, zookeeper {}; submissions took {:.2} s; {} refused reports; {} WARN, {} ERROR log lines",
            r.wall_seconds,
            r.cpu_seconds_serve,
            r.cpu_seconds_workers,
            r.cpu_seconds_zookeeper
                .map_or_else(unknown, |z| format!("{z:.1}")),
            r.submit_seconds,
            r.refused_reports,
            r.warn_lines,
            r.error_lines
        );
        for l in &r.log_samples {
            let _ = writeln!(s, "    e.g. {l}");
        }
    }
    s
}

/// The children of one round; all are killed when this is dropped.
struct RoundProcs {
    server: Proc,
    workers: Vec<Proc>,
}

/// ZooKeeper's `zk_packets_received` (the 4-letter word `mntr`), `None`
/// when the server does not answer it.
async fn zk_packets_received(hosts: &str) -> Option<u64> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let host = hosts.split(',').next()?;
    let ask = async {
        let mut stream = tokio::net::TcpStream::connect(host).await.ok()?;
        stream.write_all(b"mntr").await.ok()?;
        let mut text = String::new();
        stream.read_to_string(&mut text).await.ok()?;
        Some(text)
    };
    let text = tokio::time::timeout(Duration::from_secs(5), ask)
        .await
        .ok()??;
    text.lines().find_map(|l| {
        let (k, v) = l.split_once('\t')?;
        (k == "zk_packets_received").then(|| v.trim().parse().ok())?
    })
}

/// CPU seconds used so far.
#[derive(Debug, Clone, Copy)]
struct Cpu {
    serve: f64,
    workers: f64,
    zookeeper: Option<f64>,
}

/// The user + system CPU seconds of a process, from `/proc/PID/stat`
/// (clock ticks of 1/100 s, Linux's USER_HZ on every common platform).
fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the command name, which is in parentheses.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of stat(5); `rest` starts at field 3.
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / 100.0)
}

impl RoundProcs {
    fn cpu(&self, zk_pid: Option<u32>) -> Cpu {
        let of = |p: &Proc| p.child.id().and_then(cpu_seconds).unwrap_or(0.0);
        Cpu {
            serve: of(&self.server),
            workers: self.workers.iter().map(of).sum(),
            zookeeper: zk_pid.and_then(cpu_seconds),
        }
    }

    fn check_alive(&mut self) -> Result<()> {
        self.server.check_alive()?;
        for w in &mut self.workers {
            w.check_alive()?;
        }
        Ok(())
    }

    async fn stop(&mut self) {
        // Workers first (they release their locks through the server), all at once.
        for w in &mut self.workers {
            w.terminate();
        }
        for w in &mut self.workers {
            w.reap(Duration::from_secs(25)).await;
        }
        self.server.terminate();
        self.server.reap(Duration::from_secs(20)).await;
    }
}

async fn run_round(
    args: &Args,
    ingest: &Path,
    work: &Path,
    name: &str,
    tokens: &Arc<Tokens>,
    workers: usize,
) -> Result<Round> {
    let dir = work.join(name);
    if dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| format!("cannot clear {}", dir.display()))?;
    }
    let storage = dir.join("work");
    std::fs::create_dir_all(&storage)
        .with_context(|| format!("cannot create {}", storage.display()))?;
    let pids = work.join("pids");
    let root = format!("/load-{name}-{}", std::process::id());

    let (server, base) = start_server(args, ingest, &dir, &pids, &root, tokens).await?;

    let mut procs = RoundProcs {
        server,
        workers: Vec::new(),
    };
    let daemons: Vec<String> = JOB_DAEMONS
        .iter()
        .map(|d| format!("{d}={}", args.tasks))
        .chain(BATCH_DAEMONS.iter().map(|d| format!("{d}=1")))
        .collect();
    for i in 1..=workers {
        let name = format!("worker-{i}");
        let mut cmd = Command::new(ingest);
        cmd.args([
            "worker",
            "--engine",
            &base,
            "--zk",
            &args.zk,
            "--zk-root",
            &root,
        ])
        .args(["--daemons", &daemons.join(",")])
        .args(["--step-ms", &args.step_ms.to_string()])
        .args(["--name", &format!("load-{i}")])
        // The disk's fill level must not hold jobs back in Provisioning.
        .args(["--provisioning-threshold", "100", "--working-storage"])
        .arg(&storage);
        clean_env(&mut cmd, tokens);
        let mut p = Proc::spawn(&name, cmd, &dir, &pids)?;
        p.await_line("ingest worker started", Duration::from_secs(30))
            .await?;
        procs.workers.push(p);
    }

    let api = Arc::new(Api {
        base,
        http: reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .context("cannot build the HTTP client")?,
        tokens: Arc::clone(tokens),
    });
    let result = drive(args, &api, &mut procs, workers).await;
    procs.stop().await;
    let mut round = result?;
    scan_logs(&procs, &mut round);
    Ok(round)
}

/// Starts `ingest serve` with its data in `dir/data`: the engine, the
/// projector and the API, no in-process daemons. Gives it and its base URL.
async fn start_server(
    args: &Args,
    ingest: &Path,
    dir: &Path,
    pids: &Path,
    root: &str,
    tokens: &Tokens,
) -> Result<(Proc, String)> {
    let mut cmd = Command::new(ingest);
    cmd.arg("--data-dir").arg(dir.join("data")).args([
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--zk",
        &args.zk,
        "--zk-root",
        root,
    ]);
    clean_env(&mut cmd, tokens);
    let mut server = Proc::spawn("serve", cmd, dir, pids)?;
    let line = server
        .await_line("ingest serve listening on ", Duration::from_secs(60))
        .await?;
    let base = line
        .trim()
        .trim_start_matches("ingest serve listening on ")
        .to_string();
    Ok((server, base))
}

fn clean_env(cmd: &mut Command, tokens: &Tokens) {
    for var in [
        "INGEST_WORKER_STEPS",
        "INGEST_CONFIG",
        "INGEST_DAEMONS",
        "INGEST_DATA_DIR",
        "INGEST_PROFILES_DIR",
        "INGEST_LISTEN",
        "INGEST_ZK",
        "INGEST_ZK_ROOT",
        "INGEST_ENGINE",
        "INGEST_WORKER_DAEMONS",
        "INGEST_ADMIN_TOKEN_FILE",
        "INGEST_DEPOSITOR_TOKEN_FILE",
        "INGEST_WORKER_TOKEN_FILE",
        "INGEST_METRICS_TOKEN_FILE",
        "INGEST_METRICS_TOKEN",
        "INGEST_PROVISIONING_THRESHOLD",
        "INGEST_WORKING_STORAGE",
        // The real steps' options (real mode sets its own).
        "INGEST_FILE_ROOT",
        "INGEST_STORAGE_TARGETS",
        "INGEST_SIGNING_KEY",
        "INGEST_OUTBOX",
        "INGEST_SMTP_URL",
        "INGEST_STEP_RETRIES",
        "INGEST_RETRY_BACKOFF_MS",
        "INGEST_MAX_OBJECT_BYTES",
        "INGEST_MAX_OBJECT_FILES",
        "INGEST_TRANSFERS_PER_JOB",
        "INGEST_TRANSFERS",
    ] {
        cmd.env_remove(var);
    }
    cmd.env("INGEST_ADMIN_TOKEN", &tokens.admin)
        .env("INGEST_DEPOSITOR_TOKEN", &tokens.depositor)
        .env("INGEST_WORKER_TOKEN", &tokens.worker);
}

/// Submits, waits, measures.
async fn drive(
    args: &Args,
    api: &Arc<Api>,
    procs: &mut RoundProcs,
    workers: usize,
) -> Result<Round> {
    let total = args.batches * args.jobs;
    let cpu_before = procs.cpu(args.zk_pid);
    let zk_before = zk_packets_received(&args.zk).await;
    let started = Instant::now();

    // Submit every batch, up to SUBMIT_CONCURRENCY at once.
    let gate = Arc::new(Semaphore::new(SUBMIT_CONCURRENCY));
    let mut set = JoinSet::new();
    for b in 0..args.batches {
        let api = Arc::clone(api);
        let gate = Arc::clone(&gate);
        let jobs = args.jobs;
        set.spawn(async move {
            let _permit = gate.acquire().await.context("the submission gate closed")?;
            api.submit(b, jobs).await.map(|bid| (b, bid))
        });
    }
    let mut bids = vec![String::new(); args.batches];
    while let Some(joined) = set.join_next().await {
        let (b, bid) = joined.context("a submission task failed")??;
        bids[b] = bid;
    }
    let submit_seconds = started.elapsed().as_secs_f64();

    // Wait for every job and batch to be Completed.
    let deadline = started + Duration::from_secs(args.timeout);
    let (status, mut max_behind) = wait_all(
        args,
        api,
        procs,
        &bids,
        total,
        &format!("{workers} worker(s)"),
        ", which zero-duration simulated steps never do",
        deadline,
    )
    .await?;
    let wall_seconds = started.elapsed().as_secs_f64();
    let cpu_after = procs.cpu(args.zk_pid);
    let zk_after = zk_packets_received(&args.zk).await;
    if let Ok(text) = api.metrics().await {
        max_behind.0 = max_behind
            .0
            .max(metric(&text, "ingest_projector_events_behind"));
        max_behind.1 = max_behind
            .1
            .max(metric(&text, "ingest_projector_seconds_behind"));
    }

    // Measure from the log's own timestamps.
    let mut first_submitted: Option<DateTime<Utc>> = None;
    let mut last_completed: Option<DateTime<Utc>> = None;
    let mut walks = Vec::with_capacity(total);
    let mut latencies = Vec::with_capacity(total);
    for bid in &bids {
        let history = api.get(&format!("/batches/{bid}/history")).await?;
        let (submitted, jobs) = timings(bid, &history)?;
        let completed: Vec<(Option<DateTime<Utc>>, DateTime<Utc>)> = jobs
            .values()
            .filter_map(|j| j.completed.map(|c| (j.started, c)))
            .collect();
        if completed.len() != args.jobs {
            bail!(
                "batch {bid}: {} of its {} jobs have a Completed event in its history",
                completed.len(),
                args.jobs
            );
        }
        first_submitted = Some(first_submitted.map_or(submitted, |t| t.min(submitted)));
        for (started, at) in completed {
            last_completed = Some(last_completed.map_or(at, |t| t.max(at)));
            if let Some(started) = started {
                walks.push(ms(at - started));
            }
            latencies.push(ms(at - submitted));
        }
    }
    let (Some(first), Some(last)) = (first_submitted, last_completed) else {
        bail!("no submission or completion times were found");
    };
    let seconds = (last - first).num_microseconds().unwrap_or(0) as f64 / 1e6;
    latencies.sort_by(f64::total_cmp);
    walks.sort_by(f64::total_cmp);
    Ok(Round {
        workers,
        tasks: args.tasks,
        batches: args.batches,
        jobs_per_batch: args.jobs,
        jobs: total,
        seconds,
        jobs_per_s: if seconds > 0.0 {
            total as f64 / seconds
        } else {
            0.0
        },
        p50_ms: nearest_rank(&latencies, 50.0),
        p99_ms: nearest_rank(&latencies, 99.0),
        max_ms: latencies.last().copied().unwrap_or(0.0),
        walk_p50_ms: nearest_rank(&walks, 50.0),
        walk_p99_ms: nearest_rank(&walks, 99.0),
        submit_seconds,
        wall_seconds,
        events: status["head_position"].as_u64().unwrap_or(0),
        max_projector_events_behind: max_behind.0,
        max_projector_seconds_behind: max_behind.1,
        cpu_seconds_serve: cpu_after.serve - cpu_before.serve,
        cpu_seconds_workers: cpu_after.workers - cpu_before.workers,
        zookeeper_requests: zk_after.zip(zk_before).map(|(a, b)| a.saturating_sub(b)),
        cpu_seconds_zookeeper: cpu_after
            .zookeeper
            .zip(cpu_before.zookeeper)
            .map(|(a, b)| a - b),
        refused_reports: 0,
        warn_lines: 0,
        error_lines: 0,
        log_samples: Vec::new(),
        ratio: 0.0,
    })
}

/// Polls `GET /status` until `jobs` jobs and every batch of `bids` are
/// Completed. Fails when a job Failed (`failed_note` completes that
/// message), a process exited, nothing moved for `--stall` seconds or
/// `deadline` passed; each message names what is stuck and the last
/// warnings. Gives the last status and the projector's largest lag seen
/// (events, seconds).
#[allow(clippy::too_many_arguments)]
async fn wait_all(
    args: &Args,
    api: &Api,
    procs: &mut RoundProcs,
    bids: &[String],
    total: usize,
    label: &str,
    failed_note: &str,
    deadline: Instant,
) -> Result<(Value, (f64, f64))> {
    let batches = bids.len();
    let bar = ProgressBar::with_draw_target(Some(total as u64), ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template(&format!(
            "{label} [{{elapsed_precise}}] {{bar:30}} {{pos}}/{{len}} jobs Completed {{msg}}"
        ))
        .context("the progress bar template")?,
    );
    let mut last_progress = (0u64, 0u64, Instant::now());
    let mut max_behind = (0f64, 0f64);
    let mut polls = 0u64;
    let status = loop {
        procs.check_alive()?;
        let status = api.get("/status").await?;
        polls += 1;
        if polls % 5 == 1 {
            if let Ok(text) = api.metrics().await {
                max_behind.0 = max_behind
                    .0
                    .max(metric(&text, "ingest_projector_events_behind"));
                max_behind.1 = max_behind
                    .1
                    .max(metric(&text, "ingest_projector_seconds_behind"));
            }
        }
        let count = |field: &str, state: &str| status[field][state].as_u64().unwrap_or(0);
        let done = count("jobs_by_state", "Completed");
        let failed = count("jobs_by_state", "Failed");
        let batches_done = count("batches_by_state", "Completed");
        let head = status["head_position"].as_u64().unwrap_or(0);
        bar.set_position(done);
        bar.set_message(format!("{batches_done}/{batches} batches, {head} events"));
        if failed > 0 {
            bar.abandon();
            bail!(
                "{failed} job(s) Failed{failed_note}\n{}{}",
                stuck(api, bids, &status).await,
                last_warnings(procs)
            );
        }
        if done as usize >= total && batches_done as usize >= batches {
            bar.finish_and_clear();
            break status;
        }
        if (done, head) != (last_progress.0, last_progress.1) {
            last_progress = (done, head, Instant::now());
        } else if last_progress.2.elapsed() > Duration::from_secs(args.stall) {
            bar.abandon();
            bail!(
                "nothing moved for {} s ({done}/{total} jobs Completed, {batches_done}/{batches} batches)\n{}{}",
                args.stall,
                stuck(api, bids, &status).await,
                last_warnings(procs)
            );
        }
        if Instant::now() > deadline {
            bar.abandon();
            bail!(
                "not done within --timeout {} s ({done}/{total} jobs Completed, {batches_done}/{batches} batches)\n{}{}",
                args.timeout,
                stuck(api, bids, &status).await,
                last_warnings(procs)
            );
        }
        tokio::time::sleep(POLL).await;
    };
    Ok((status, max_behind))
}

/// When a job left Pending and when it reached Completed.
#[derive(Debug, Clone, Copy, Default)]
struct JobTimes {
    started: Option<DateTime<Utc>>,
    completed: Option<DateTime<Utc>>,
}

/// The time of the batch's BatchSubmitted event and each job's time of
/// reaching Completed, from a batch history.
fn timings(bid: &str, history: &Value) -> Result<(DateTime<Utc>, BTreeMap<String, JobTimes>)> {
    let rows = history["events"]
        .as_array()
        .with_context(|| format!("batch {bid}: the history has no events"))?;
    let time = |row: &Value| -> Result<DateTime<Utc>> {
        let t = row["time"].as_str().context("an event without a time")?;
        Ok(DateTime::parse_from_rfc3339(t)
            .with_context(|| format!("batch {bid}: the event time {t:?}"))?
            .with_timezone(&Utc))
    };
    let mut submitted = None;
    let mut jobs: BTreeMap<String, JobTimes> = BTreeMap::new();
    for row in rows {
        match row["event"].as_str() {
            Some("BatchSubmitted") if row["stream"] == bid => submitted = Some(time(row)?),
            Some("JobStatusChanged") => {
                // "Notify -> Completed", possibly followed by ": message".
                let Some((from, to)) = row["detail"].as_str().and_then(|d| d.split_once(" -> "))
                else {
                    continue;
                };
                let to = to.split(|c: char| !c.is_ascii_alphanumeric()).next();
                let jid = row["stream"].as_str().unwrap_or_default().to_string();
                let job = jobs.entry(jid).or_default();
                if from == "Pending" && job.started.is_none() {
                    job.started = Some(time(row)?);
                }
                if to == Some("Completed") {
                    job.completed = Some(time(row)?);
                }
            }
            _ => {}
        }
    }
    let submitted = submitted
        .with_context(|| format!("batch {bid}: no BatchSubmitted event in its history"))?;
    Ok((submitted, jobs))
}

/// A duration in milliseconds.
fn ms(d: chrono::TimeDelta) -> f64 {
    d.num_microseconds().unwrap_or(i64::MAX) as f64 / 1000.0
}

/// The nearest-rank percentile of sorted values.
fn nearest_rank(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// The largest value of a metric (over its label sets) in a Prometheus text page.
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (key, value) = l.rsplit_once(' ')?;
            let bare = key.split('{').next()?;
            (bare == name).then(|| value.parse::<f64>().ok())?
        })
        .fold(0.0, f64::max)
}

/// What is not Completed: counts by state and a few jobs with their state.
async fn stuck(api: &Api, bids: &[String], status: &Value) -> String {
    let mut s = format!(
        "jobs by state: {}\nbatches by state: {}\n",
        status["jobs_by_state"], status["batches_by_state"]
    );
    let mut shown = 0;
    for bid in bids {
        if shown >= 10 {
            break;
        }
        let Ok(batch) = api.get(&format!("/batches/{bid}")).await else {
            let _ = writeln!(s, "  {bid}: cannot read the batch");
            continue;
        };
        if batch["status"] == "Completed" {
            continue;
        }
        let _ = writeln!(s, "  {bid}: {}", batch["status"].as_str().unwrap_or("?"));
        for job in batch["jobs"].as_array().into_iter().flatten() {
            if job["status"] == "Completed" || shown >= 10 {
                continue;
            }
            shown += 1;
            let _ = writeln!(
                s,
                "    {} {} since {}",
                job["jid"].as_str().unwrap_or("?"),
                job["status"].as_str().unwrap_or("?"),
                job["in_state_since"].as_str().unwrap_or("?")
            );
        }
    }
    s
}

/// The last few WARN and ERROR lines of each process, for error messages.
fn last_warnings(procs: &RoundProcs) -> String {
    let mut s = String::new();
    for p in std::iter::once(&procs.server).chain(&procs.workers) {
        let text = strip_ansi(&std::fs::read_to_string(&p.stderr).unwrap_or_default());
        let lines: Vec<&str> = text
            .lines()
            .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
            .collect();
        if lines.is_empty() {
            continue;
        }
        let _ = writeln!(
            s,
            "last warnings of {} ({} in all, log {}):",
            p.name,
            lines.len(),
            p.stderr.display()
        );
        for l in &lines[lines.len().saturating_sub(3)..] {
            let _ = writeln!(s, "  {}", truncate(l, 300));
        }
    }
    s
}

/// Counts refused reports and WARN/ERROR lines in the round's logs.
fn scan_logs(procs: &RoundProcs, round: &mut Round) {
    let scan = scan(procs);
    round.refused_reports = scan.refused;
    round.warn_lines = scan.warn;
    round.error_lines = scan.error;
    round.log_samples = scan.samples;
}

/// What the logs of a round's processes hold.
struct LogScan {
    /// Worker reports the API refused.
    refused: usize,
    warn: usize,
    error: usize,
    /// A few distinct WARN/ERROR messages.
    samples: Vec<String>,
}

/// Counts refused reports and WARN/ERROR lines in the logs of `procs`.
fn scan(procs: &RoundProcs) -> LogScan {
    let mut out = LogScan {
        refused: 0,
        warn: 0,
        error: 0,
        samples: Vec::new(),
    };
    let mut samples: BTreeMap<String, String> = BTreeMap::new();
    for p in std::iter::once(&procs.server).chain(&procs.workers) {
        let text = strip_ansi(&std::fs::read_to_string(&p.stderr).unwrap_or_default());
        for line in text.lines() {
            let warn = line.contains(" WARN ");
            let error = line.contains(" ERROR ");
            if line.contains("was refused") {
                out.refused += 1;
            }
            if warn {
                out.warn += 1;
            }
            if error {
                out.error += 1;
            }
            if (warn || error) && samples.len() < 5 {
                // One sample per message, without the timestamp.
                let msg = line
                    .split_once(if warn { " WARN " } else { " ERROR " })
                    .map_or(line, |(_, m)| m)
                    .trim()
                    .to_string();
                let key: String = msg.chars().take(60).collect();
                samples
                    .entry(key)
                    .or_insert_with(|| format!("{}: {}", p.name, truncate(&msg, 200)));
            }
        }
    }
    out.samples = samples.into_values().collect();
    out
}

/// Removes terminal colour sequences (`ESC [ ... m`), which the human log
/// format writes even to a file.
fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' && chars.peek() == Some(&'[') {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        s.chars().take(n).collect::<String>() + "…"
    }
}

// ---------------------------------------------------------------------------
// Real mode: real steps, real downloads, against curl.

/// The ZooKeeper-free part of a round's corpus: what curl fetches and what
/// the batches submit.
struct Corpus {
    files_per_object: usize,
    /// Every file's URL, per object.
    urls: Vec<Vec<String>>,
    /// Each object's checkm manifest URL.
    manifests: Vec<String>,
    /// All files' bytes together.
    bytes: u64,
    files: usize,
}

/// The files the local HTTP server serves, by path under `/files/`.
type Depot = Arc<std::sync::RwLock<BTreeMap<String, Bytes>>>;

async fn depot_get(
    axum::extract::State(depot): axum::extract::State<Depot>,
    axum::extract::Path(path): axum::extract::Path<String>,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let found = match depot.read() {
        Ok(files) => files.get(&path).cloned(),
        Err(_) => return axum::http::StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    };
    match found {
        Some(body) => (
            [(axum::http::header::CONTENT_TYPE, "application/octet-stream")],
            body,
        )
            .into_response(),
        None => axum::http::StatusCode::NOT_FOUND.into_response(),
    }
}

/// Serves `depot` on `http://127.0.0.1:PORT/files/PATH` (GET and HEAD) in
/// this process; gives the base URL. The server lives until the runtime ends.
async fn serve_depot(depot: Depot) -> Result<String> {
    let app = axum::Router::new()
        .route("/files/{*path}", axum::routing::get(depot_get))
        .with_state(depot);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .context("cannot bind the file server to 127.0.0.1")?;
    let addr = listener.local_addr().context("the file server's address")?;
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            eprintln!("ingest-load: the file server stopped: {e}");
        }
    });
    Ok(format!("http://{addr}"))
}

/// splitmix64: the generated files' bytes (fast, deterministic, and not
/// compressible, so no layer can shortcut them).
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// `len` pseudo-random bytes, the same for the same seed.
fn random_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut state = seed;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        out.extend_from_slice(&splitmix64(&mut state).to_le_bytes());
    }
    out.truncate(len);
    out
}

fn sha256_hex(bytes: &[u8]) -> String {
    use ingest_steps::digest::{Algorithm, MultiHasher};
    let mut h = MultiHasher::new(&[Algorithm::Sha256]);
    h.update(bytes);
    h.finish()
        .into_iter()
        .next()
        .map(|(_, hex)| hex)
        .unwrap_or_default()
}

/// The sizes of an object's `files` files, `object_bytes` in all (the
/// first files take the remainder).
fn file_sizes(object_bytes: u64, files: usize) -> Vec<u64> {
    let n = files as u64;
    (0..n)
        .map(|i| object_bytes / n + u64::from(i < object_bytes % n))
        .collect()
}

/// A checkm 0.7 object manifest (Merritt's mrt-ingest-manifest profile):
/// one line per file with its URL, sha256, size and name.
fn object_manifest(lines: &[(String, String, u64, String)]) -> String {
    let mut m = String::from(
        "#%checkm_0.7\n\
         #%profile | http://uc3.cdlib.org/registry/ingest/manifest/mrt-ingest-manifest\n\
         #%prefix | nfo: | http://www.semanticdesktop.org/ontologies/2007/03/22/nfo#\n\
         #%prefix | mrt: | http://merritt.cdlib.org/terms#\n\
         #%fields | nfo:fileUrl | nfo:hashAlgorithm | nfo:hashValue | nfo:fileSize | nfo:fileLastModified | nfo:fileName | mrt:mimeType\n",
    );
    for (url, sha, size, name) in lines {
        let _ = writeln!(
            m,
            "{url} | sha256 | {sha} | {size} | | {name} | application/octet-stream"
        );
    }
    m.push_str("#%eof\n");
    m
}

/// Generates the round's files and manifests into `depot` (replacing the
/// previous round's) and describes them.
fn build_corpus(args: &Args, depot: &Depot, base: &str, f: usize) -> Result<Corpus> {
    let mut files = BTreeMap::new();
    let mut urls = Vec::with_capacity(args.objects);
    let mut manifests = Vec::with_capacity(args.objects);
    let mut bytes = 0u64;
    let sizes = file_sizes(args.object_bytes, f);
    for o in 0..args.objects {
        let mut lines = Vec::with_capacity(f);
        let mut object_urls = Vec::with_capacity(f);
        for (i, &size) in sizes.iter().enumerate() {
            let seed = args.seed
                ^ (f as u64).wrapping_mul(0x1000_0000_01b3)
                ^ (o as u64).wrapping_mul(0x9e37_79b9)
                ^ ((i as u64) << 1);
            let body = random_bytes(seed, usize::try_from(size).context("a file too large")?);
            let name = format!("f{i:04}.bin");
            let path = format!("r{f}/o{o:04}/{name}");
            let url = format!("{base}/files/{path}");
            lines.push((url.clone(), sha256_hex(&body), size, name));
            object_urls.push(url);
            files.insert(path, Bytes::from(body));
            bytes += size;
        }
        let path = format!("r{f}/o{o:04}.checkm");
        manifests.push(format!("{base}/files/{path}"));
        files.insert(path, Bytes::from(object_manifest(&lines)));
        urls.push(object_urls);
    }
    *depot
        .write()
        .map_err(|_| anyhow!("the file server's lock is poisoned"))? = files;
    Ok(Corpus {
        files_per_object: f,
        files: args.objects * f,
        urls,
        manifests,
        bytes,
    })
}

/// The curl program's version (`curl X.Y.Z ...`) and whether it has
/// `--parallel` (7.66.0 and later).
async fn curl_version(curl: &Path) -> Result<(String, bool)> {
    let out = Command::new(curl)
        .arg("--version")
        .stdin(Stdio::null())
        .output()
        .await
        .with_context(|| {
            format!(
                "cannot run {} (install curl: apt-get install curl)",
                curl.display()
            )
        })?;
    let text = String::from_utf8_lossy(&out.stdout);
    let version = text
        .split_whitespace()
        .nth(1)
        .context("curl --version printed no version")?
        .to_string();
    let parts: Vec<u32> = version.split('.').map(|p| p.parse().unwrap_or(0)).collect();
    let at_least = |a: u32, b: u32| (parts[0], *parts.get(1).unwrap_or(&0)) >= (a, b);
    Ok((version.clone(), !parts.is_empty() && at_least(7, 66)))
}

/// One curl run over every object.
#[derive(Debug, Clone, serde::Serialize)]
struct CurlRun {
    seconds: f64,
    /// User + system CPU seconds of the curl processes.
    cpu_seconds_curl: f64,
    /// Of this process, which serves the files.
    cpu_seconds_file_server: f64,
}

/// The CPU seconds of this process's reaped children (cutime + cstime).
fn children_cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return 0.0;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // cutime and cstime are fields 16 and 17 of stat(5); `rest` starts at field 3.
    let field = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok());
    field(13).unwrap_or(0.0) / 100.0 + field(14).unwrap_or(0.0) / 100.0
}

/// Fetches every object's files with curl, one curl process per object
/// (`--parallel --parallel-max K` when curl has it), `tasks` processes at
/// once, to /dev/null; checks that every file came back whole (200, size).
async fn curl_run(args: &Args, corpus: &Corpus, parallel: bool) -> Result<CurlRun> {
    let gate = Arc::new(Semaphore::new(args.tasks as usize));
    let cpu_children = children_cpu_seconds();
    let cpu_self = cpu_seconds(std::process::id()).unwrap_or(0.0);
    let started = Instant::now();
    let mut set = JoinSet::new();
    for (o, urls) in corpus.urls.iter().enumerate() {
        let mut cmd = Command::new(&args.curl);
        cmd.args(["-s", "-S", "--fail", "--max-time", "300"])
            .args(["-w", "%{http_code} %{size_download}\\n"]);
        if parallel {
            cmd.args([
                "--parallel",
                "--parallel-max",
                &args.transfers_per_job.to_string(),
            ]);
        }
        for url in urls {
            cmd.args(["-o", "/dev/null", url]);
        }
        cmd.stdin(Stdio::null()).kill_on_drop(true);
        let gate = Arc::clone(&gate);
        set.spawn(async move {
            let _permit = gate.acquire().await.context("the curl gate closed")?;
            let out = cmd.output().await.context("cannot run curl")?;
            if !out.status.success() {
                bail!(
                    "curl for object {o} failed ({}): {}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr).trim()
                );
            }
            let mut files = 0usize;
            let mut bytes = 0u64;
            for line in String::from_utf8_lossy(&out.stdout).lines() {
                let (code, size) = line.split_once(' ').unwrap_or((line, "0"));
                if code != "200" {
                    bail!("curl for object {o}: a transfer answered {code}");
                }
                files += 1;
                bytes += size.trim().parse::<u64>().unwrap_or(0);
            }
            Ok((files, bytes))
        });
    }
    let (mut files, mut bytes) = (0usize, 0u64);
    while let Some(joined) = set.join_next().await {
        let (f, b) = joined.context("a curl task failed")??;
        files += f;
        bytes += b;
    }
    let seconds = started.elapsed().as_secs_f64();
    if (files, bytes) != (corpus.files, corpus.bytes) {
        bail!(
            "curl fetched {files} files, {bytes} bytes, not {} files, {} bytes",
            corpus.files,
            corpus.bytes
        );
    }
    Ok(CurlRun {
        seconds,
        cpu_seconds_curl: children_cpu_seconds() - cpu_children,
        cpu_seconds_file_server: cpu_seconds(std::process::id()).unwrap_or(0.0) - cpu_self,
    })
}

/// What one real round measured.
#[derive(Debug, Clone, serde::Serialize)]
struct RealRound {
    files_per_object: usize,
    objects: usize,
    files: usize,
    bytes: u64,
    /// The median curl run (by wall time) and every run's seconds.
    curl_seconds: f64,
    curl_runs_seconds: Vec<f64>,
    curl_objects_per_s: f64,
    curl_mb_per_s: f64,
    curl_cpu_seconds: f64,
    curl_file_server_cpu_seconds: f64,
    /// From the first BatchSubmitted to the last job's -> Completed (server clock).
    ingest_seconds: f64,
    ingest_objects_per_s: f64,
    ingest_mb_per_s: f64,
    /// Ingest objects/s over curl objects/s (the same bytes, so also MB/s).
    ratio: f64,
    /// From the first `-> Downloading` to the last `Downloading ->`.
    download_span_seconds: f64,
    download_mb_per_s: f64,
    /// All bytes over the sum of each job's time in Downloading: one job's
    /// download rate, without the gaps between jobs.
    download_job_mb_per_s: f64,
    /// Mean time a job spent in each state, ms (from entering it to
    /// leaving it: the wait for a task, the step, the report).
    state_mean_ms: BTreeMap<String, f64>,
    /// Mean time from BatchSubmitted to the job's creation (expansion of
    /// the object manifest by batch_pending), ms.
    expansion_mean_ms: f64,
    /// Mean Pending -> Completed, ms.
    walk_mean_ms: f64,
    /// How long the submissions took (client clock).
    submit_seconds: f64,
    /// Events in the log at the end, and step retries among them.
    events: u64,
    retries: usize,
    cpu_seconds_serve: f64,
    cpu_seconds_worker: f64,
    cpu_seconds_zookeeper: Option<f64>,
    /// Requests ZooKeeper received during the ingest (`mntr`).
    zookeeper_requests: Option<u64>,
    /// Of this process (the file server) during the ingest.
    cpu_seconds_file_server: f64,
    refused_reports: usize,
    warn_lines: usize,
    error_lines: usize,
    log_samples: Vec<String>,
}

/// Real mode: a round per files-per-object count F. Each round builds
/// `--objects` objects of F files (`--object-bytes` each, random bytes)
/// served by this process on loopback with one checkm object manifest per
/// object; fetches them with curl `--curl-runs` times (the median run is the
/// baseline); then starts a fresh `ingest serve` and ONE `ingest worker
/// --steps real` (every job daemon with `--tasks` tasks, batch_pending and
/// batch_reporting, an OCFL storage target, a signing key, working storage
/// in the round's directory, `--provisioning-threshold 100`), submits one
/// `object-manifest` batch per object, waits for everything to be
/// Completed and measures from the log's timestamps.
async fn run_real(args: Args) -> Result<()> {
    ensure!(
        !args.files.is_empty() && !args.files.contains(&0),
        "--files must list files-per-object counts of at least 1, e.g. 1,10,100"
    );
    ensure!(args.objects > 0, "--objects must be at least 1");
    ensure!(args.tasks > 0, "--tasks must be at least 1");
    ensure!(
        args.transfers_per_job > 0,
        "--transfers-per-job must be at least 1"
    );
    ensure!(args.curl_runs > 0, "--curl-runs must be at least 1");
    let most = args.files.iter().copied().max().unwrap_or(1) as u64;
    ensure!(
        args.object_bytes >= most,
        "--object-bytes {} is less than one byte per file for {most} files",
        args.object_bytes
    );
    let (ingest, work) = binary_and_work_dir(&args)?;
    let (curl_version, parallel) = curl_version(&args.curl).await?;
    let tokens = Arc::new(Tokens::new());
    let depot: Depot = Arc::default();
    let base = serve_depot(Arc::clone(&depot)).await?;
    eprintln!(
        "ingest-load: real steps, {} objects of {} bytes per round, files per object {:?}; one worker, {} tasks per job daemon, {} transfers per job; curl {curl_version}{}; files served from {base}; logs in {}",
        args.objects,
        args.object_bytes,
        args.files,
        args.tasks,
        args.transfers_per_job,
        if parallel { " --parallel" } else { " (no --parallel: sequential)" },
        work.display()
    );

    let mut rounds = Vec::new();
    for (i, &f) in args.files.iter().enumerate() {
        let name = format!("round{}-{f}f", i + 1);
        let round = real_round(
            &args, &ingest, &work, &name, &tokens, &depot, &base, f, parallel,
        )
        .await
        .with_context(|| {
            format!(
                "the {f}-files-per-object round failed (logs in {})",
                work.join(&name).display()
            )
        })?;
        eprintln!(
            "round {f} file(s)/object: curl {:.1} objects/s, {:.1} MB/s; ingest {:.2} objects/s, {:.1} MB/s (ratio {:.3}); download step {:.1} MB/s",
            round.curl_objects_per_s,
            round.curl_mb_per_s,
            round.ingest_objects_per_s,
            round.ingest_mb_per_s,
            round.ratio,
            round.download_mb_per_s
        );
        rounds.push(round);
    }
    if let Ok(mut files) = depot.write() {
        files.clear();
    }
    print!("{}", real_table(&rounds));
    print!("{}", real_notes(&rounds));

    if let Some(path) = &args.json {
        let doc = json!({
            "mode": "real",
            "date": Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
            "objects": args.objects,
            "object_bytes": args.object_bytes,
            "workers": 1,
            "tasks_per_job_daemon": args.tasks,
            "transfers_per_job": args.transfers_per_job,
            "curl_version": curl_version,
            "curl_parallel": parallel,
            "curl_runs": args.curl_runs,
            "mb": "10^6 bytes",
            "rounds": rounds,
        });
        let text = serde_json::to_string_pretty(&doc).context("cannot encode the results")?;
        std::fs::write(path, text + "\n")
            .with_context(|| format!("cannot write {}", path.display()))?;
        eprintln!("ingest-load: results written to {}", path.display());
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
async fn real_round(
    args: &Args,
    ingest: &Path,
    work: &Path,
    name: &str,
    tokens: &Arc<Tokens>,
    depot: &Depot,
    base: &str,
    f: usize,
    parallel: bool,
) -> Result<RealRound> {
    let dir = work.join(name);
    if dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| format!("cannot clear {}", dir.display()))?;
    }
    let storage = dir.join("work");
    let ocfl = dir.join("ocfl");
    let outbox = dir.join("outbox");
    for d in [&storage, &ocfl, &outbox] {
        std::fs::create_dir_all(d).with_context(|| format!("cannot create {}", d.display()))?;
    }
    let corpus = build_corpus(args, depot, base, f)?;

    // The baseline: curl, the median of --curl-runs runs.
    let mut runs = Vec::with_capacity(args.curl_runs);
    for _ in 0..args.curl_runs {
        runs.push(curl_run(args, &corpus, parallel).await?);
    }
    let mut order: Vec<usize> = (0..runs.len()).collect();
    order.sort_by(|&a, &b| runs[a].seconds.total_cmp(&runs[b].seconds));
    let median = runs[order[order.len() / 2]].clone();

    // The signing key of the storage manifests.
    let key = dir.join("signing-key.pem");
    let out = Command::new(ingest)
        .args(["keys", "generate"])
        .arg(&key)
        .stdin(Stdio::null())
        .output()
        .await
        .context("cannot run ingest keys generate")?;
    if !out.status.success() {
        bail!(
            "ingest keys generate failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }

    let pids = work.join("pids");
    let root = format!("/load-{name}-{}", std::process::id());
    let (server, engine) = start_server(args, ingest, &dir, &pids, &root, tokens).await?;
    let mut procs = RoundProcs {
        server,
        workers: Vec::new(),
    };
    let daemons: Vec<String> = JOB_DAEMONS
        .iter()
        .map(|d| format!("{d}={}", args.tasks))
        .chain(
            BATCH_DAEMONS
                .iter()
                .map(|d| format!("{d}={}", args.batch_tasks)),
        )
        .collect();
    let mut cmd = Command::new(ingest);
    cmd.args([
        "worker",
        "--engine",
        &engine,
        "--zk",
        &args.zk,
        "--zk-root",
        &root,
        "--steps",
        "real",
    ])
    .args(["--daemons", &daemons.join(",")])
    .args(["--name", "load-real"])
    // The disk's fill level must not hold jobs back in Provisioning.
    .args(["--provisioning-threshold", "100", "--working-storage"])
    .arg(&storage)
    .arg("--storage-target")
    .arg(format!("primary={}", ocfl.display()))
    .arg("--signing-key")
    .arg(&key)
    .arg("--outbox")
    .arg(&outbox)
    .args(["--transfers-per-job", &args.transfers_per_job.to_string()])
    .args([
        "--transfers",
        &(args.transfers_per_job * args.tasks as usize).to_string(),
    ])
    .args(["--max-object-files", &f.max(1000).to_string()]);
    clean_env(&mut cmd, tokens);
    let mut worker = Proc::spawn("worker", cmd, &dir, &pids)?;
    let started = worker
        .await_line("ingest worker started", Duration::from_secs(30))
        .await;
    procs.workers.push(worker);
    started?;

    let api = Arc::new(Api {
        base: engine,
        http: reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .context("cannot build the HTTP client")?,
        tokens: Arc::clone(tokens),
    });
    let result = ingest_objects(args, &api, &mut procs, &corpus).await;
    procs.stop().await;
    let mut round = result?;
    let scan = scan(&procs);
    round.refused_reports = scan.refused;
    round.warn_lines = scan.warn;
    round.error_lines = scan.error;
    round.log_samples = scan.samples;

    round.curl_seconds = median.seconds;
    round.curl_runs_seconds = runs.iter().map(|r| r.seconds).collect();
    round.curl_cpu_seconds = median.cpu_seconds_curl;
    round.curl_file_server_cpu_seconds = median.cpu_seconds_file_server;
    let per_s = |n: f64, s: f64| if s > 0.0 { n / s } else { 0.0 };
    let mb = corpus.bytes as f64 / 1e6;
    round.curl_objects_per_s = per_s(corpus.urls.len() as f64, median.seconds);
    round.curl_mb_per_s = per_s(mb, median.seconds);
    round.ratio = per_s(round.ingest_objects_per_s, round.curl_objects_per_s);

    if !args.keep {
        for d in [&storage, &ocfl] {
            if let Err(e) = std::fs::remove_dir_all(d) {
                eprintln!("ingest-load: cannot remove {}: {e}", d.display());
            }
        }
    }
    Ok(round)
}

/// A job's path through the states, from its batch's history.
#[derive(Debug, Clone, Default)]
struct JobTrace {
    /// Its first event (JobCreated).
    created: Option<DateTime<Utc>>,
    /// When it first entered each state.
    entered: BTreeMap<String, DateTime<Utc>>,
    /// When it last left each state.
    left: BTreeMap<String, DateTime<Utc>>,
    completed: Option<DateTime<Utc>>,
    /// The bytes its Downloading step reported ("downloaded N files, B bytes").
    downloaded: Option<u64>,
    retries: usize,
}

/// The time of the batch's BatchSubmitted event and each job's trace.
fn traces(bid: &str, history: &Value) -> Result<(DateTime<Utc>, BTreeMap<String, JobTrace>)> {
    let rows = history["events"]
        .as_array()
        .with_context(|| format!("batch {bid}: the history has no events"))?;
    let mut submitted = None;
    let mut jobs: BTreeMap<String, JobTrace> = BTreeMap::new();
    for row in rows {
        let t = row["time"].as_str().context("an event without a time")?;
        let at = DateTime::parse_from_rfc3339(t)
            .with_context(|| format!("batch {bid}: the event time {t:?}"))?
            .with_timezone(&Utc);
        let stream = row["stream"].as_str().unwrap_or_default();
        if stream == bid {
            if row["event"] == "BatchSubmitted" {
                submitted = Some(at);
            }
            continue;
        }
        let job = jobs.entry(stream.to_string()).or_default();
        job.created.get_or_insert(at);
        match row["event"].as_str() {
            Some("JobStepRetried") => job.retries += 1,
            Some("JobStatusChanged") => {
                // "Downloading -> Processing: downloaded 10 files, 4194304 bytes"
                let detail = row["detail"].as_str().unwrap_or_default();
                let Some((from, rest)) = detail.split_once(" -> ") else {
                    continue;
                };
                let to = rest
                    .split(|c: char| !c.is_ascii_alphanumeric())
                    .next()
                    .unwrap_or_default();
                job.left.insert(from.to_string(), at);
                job.entered.entry(to.to_string()).or_insert(at);
                if to == "Completed" {
                    job.completed = Some(at);
                }
                if from == "Downloading" {
                    if let Some(b) = downloaded_bytes(rest) {
                        job.downloaded = Some(b);
                    }
                }
            }
            _ => {}
        }
    }
    let submitted = submitted
        .with_context(|| format!("batch {bid}: no BatchSubmitted event in its history"))?;
    Ok((submitted, jobs))
}

/// B of "... downloaded N files, B bytes".
fn downloaded_bytes(detail: &str) -> Option<u64> {
    let rest = &detail[detail.find("downloaded ")?..];
    let (_, after) = rest.split_once(", ")?;
    after.split_whitespace().next()?.parse().ok()
}

/// Submits one object-manifest batch per object, waits, measures.
async fn ingest_objects(
    args: &Args,
    api: &Arc<Api>,
    procs: &mut RoundProcs,
    corpus: &Corpus,
) -> Result<RealRound> {
    let total = corpus.manifests.len();
    let cpu_before = procs.cpu(args.zk_pid);
    let zk_before = zk_packets_received(&args.zk).await;
    let self_before = cpu_seconds(std::process::id()).unwrap_or(0.0);
    let started = Instant::now();
    let gate = Arc::new(Semaphore::new(SUBMIT_CONCURRENCY));
    let mut set = JoinSet::new();
    for (o, url) in corpus.manifests.iter().enumerate() {
        let api = Arc::clone(api);
        let gate = Arc::clone(&gate);
        let body = json!({
            "submitter": "load",
            "profile": "load",
            "type": "object-manifest",
            "payload_url": url,
            "erc_who": "ingest-load",
            "erc_what": format!("load object {o} of {} files", corpus.files_per_object),
            "erc_when": "2026",
            "erc_where": format!("load-{}f-{o}", corpus.files_per_object),
        });
        set.spawn(async move {
            let _permit = gate.acquire().await.context("the submission gate closed")?;
            api.submit_body(o, &body).await.map(|bid| (o, bid))
        });
    }
    let mut bids = vec![String::new(); total];
    while let Some(joined) = set.join_next().await {
        let (o, bid) = joined.context("a submission task failed")??;
        bids[o] = bid;
    }
    let submit_seconds = started.elapsed().as_secs_f64();

    let deadline = started + Duration::from_secs(args.timeout);
    let label = format!("{} file(s)/object", corpus.files_per_object);
    let status = match wait_all(args, api, procs, &bids, total, &label, "", deadline).await {
        Ok((status, _)) => status,
        Err(e) => return Err(e.context(failed_jobs(api, &bids).await)),
    };
    let cpu_after = procs.cpu(args.zk_pid);
    let zk_after = zk_packets_received(&args.zk).await;
    let self_after = cpu_seconds(std::process::id()).unwrap_or(0.0);

    let mut first_submitted: Option<DateTime<Utc>> = None;
    let mut last_completed: Option<DateTime<Utc>> = None;
    let mut download_span: Option<(DateTime<Utc>, DateTime<Utc>)> = None;
    let mut in_state: BTreeMap<String, f64> = BTreeMap::new();
    let (mut expansion, mut walk, mut retries) = (0.0, 0.0, 0usize);
    let mut downloaded = 0u64;
    for bid in &bids {
        let history = api.get(&format!("/batches/{bid}/history")).await?;
        let (submitted, jobs) = traces(bid, &history)?;
        first_submitted = Some(first_submitted.map_or(submitted, |t| t.min(submitted)));
        if jobs.len() != 1 {
            bail!("batch {bid} has {} jobs, not one", jobs.len());
        }
        for (jid, job) in &jobs {
            let (Some(created), Some(done)) = (job.created, job.completed) else {
                bail!("job {jid} of batch {bid} has no Completed event in its history");
            };
            last_completed = Some(last_completed.map_or(done, |t| t.max(done)));
            expansion += ms(created - submitted);
            retries += job.retries;
            downloaded += job.downloaded.unwrap_or(0);
            if let Some(left) = job.left.get("Pending") {
                walk += ms(done - *left);
            }
            for state in JOB_STATES {
                let entered = match state {
                    "Pending" => Some(created),
                    _ => job.entered.get(state).copied(),
                };
                if let (Some(a), Some(b)) = (entered, job.left.get(state)) {
                    *in_state.entry(state.to_string()).or_default() += ms(*b - a);
                }
            }
            if let (Some(a), Some(b)) =
                (job.entered.get("Downloading"), job.left.get("Downloading"))
            {
                download_span = Some(match download_span {
                    None => (*a, *b),
                    Some((x, y)) => (x.min(*a), y.max(*b)),
                });
            }
        }
    }
    if downloaded != corpus.bytes {
        bail!(
            "the Downloading steps reported {downloaded} bytes in all, not the {} served",
            corpus.bytes
        );
    }
    let (Some(first), Some(last)) = (first_submitted, last_completed) else {
        bail!("no submission or completion times were found");
    };
    let secs = |d: chrono::TimeDelta| d.num_microseconds().unwrap_or(0) as f64 / 1e6;
    let seconds = secs(last - first);
    let download_seconds = download_span.map_or(0.0, |(a, b)| secs(b - a));
    let per_s = |n: f64, s: f64| if s > 0.0 { n / s } else { 0.0 };
    let mb = corpus.bytes as f64 / 1e6;
    let n = total as f64;
    Ok(RealRound {
        files_per_object: corpus.files_per_object,
        objects: total,
        files: corpus.files,
        bytes: corpus.bytes,
        curl_seconds: 0.0,
        curl_runs_seconds: Vec::new(),
        curl_objects_per_s: 0.0,
        curl_mb_per_s: 0.0,
        curl_cpu_seconds: 0.0,
        curl_file_server_cpu_seconds: 0.0,
        ingest_seconds: seconds,
        ingest_objects_per_s: per_s(n, seconds),
        ingest_mb_per_s: per_s(mb, seconds),
        ratio: 0.0,
        download_span_seconds: download_seconds,
        download_mb_per_s: per_s(mb, download_seconds),
        download_job_mb_per_s: per_s(
            mb,
            in_state.get("Downloading").copied().unwrap_or(0.0) / 1000.0,
        ),
        state_mean_ms: in_state.into_iter().map(|(k, v)| (k, v / n)).collect(),
        expansion_mean_ms: expansion / n,
        walk_mean_ms: walk / n,
        submit_seconds,
        events: status["head_position"].as_u64().unwrap_or(0),
        retries,
        cpu_seconds_serve: cpu_after.serve - cpu_before.serve,
        cpu_seconds_worker: cpu_after.workers - cpu_before.workers,
        cpu_seconds_zookeeper: cpu_after
            .zookeeper
            .zip(cpu_before.zookeeper)
            .map(|(a, b)| a - b),
        zookeeper_requests: zk_after.zip(zk_before).map(|(a, b)| a.saturating_sub(b)),
        cpu_seconds_file_server: self_after - self_before,
        refused_reports: 0,
        warn_lines: 0,
        error_lines: 0,
        log_samples: Vec::new(),
    })
}

/// The messages of failed jobs (their `-> Failed` events), for errors.
async fn failed_jobs(api: &Api, bids: &[String]) -> String {
    let mut s = String::new();
    let mut shown = 0;
    for bid in bids {
        let Ok(history) = api.get(&format!("/batches/{bid}/history")).await else {
            continue;
        };
        for row in history["events"].as_array().into_iter().flatten() {
            let detail = row["detail"].as_str().unwrap_or_default();
            let failed = detail.contains("-> Failed") || row["event"] == "JobStepRetried";
            if failed && shown < 10 {
                shown += 1;
                let _ = writeln!(
                    s,
                    "  {} {}: {}",
                    row["stream"].as_str().unwrap_or("?"),
                    row["event"].as_str().unwrap_or("?"),
                    truncate(detail, 300)
                );
            }
        }
    }
    match s.is_empty() {
        true => "no job failed or retried".to_string(),
        false => format!("failures and retries:\n{s}"),
    }
}

fn real_table(rounds: &[RealRound]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "| files/object | objects | MB | curl objects/s | curl MB/s | ingest objects/s | ingest MB/s | ingest/curl ratio | download-step MB/s |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|");
    for r in rounds {
        let _ = writeln!(
            s,
            "| {} | {} | {:.1} | {:.1} | {:.0} | {:.2} | {:.1} | {:.3} | {:.1} |",
            r.files_per_object,
            r.objects,
            r.bytes as f64 / 1e6,
            r.curl_objects_per_s,
            r.curl_mb_per_s,
            r.ingest_objects_per_s,
            r.ingest_mb_per_s,
            r.ratio,
            r.download_mb_per_s
        );
    }
    s
}

fn real_notes(rounds: &[RealRound]) -> String {
    let mut s = String::new();
    for r in rounds {
        let states: Vec<String> = JOB_STATES
            .iter()
            .map(|st| {
                format!(
                    "{st} {:.0}",
                    r.state_mean_ms.get(*st).copied().unwrap_or(0.0)
                )
            })
            .collect();
        let _ = writeln!(
            s,
            "{} file(s)/object: {} files, {} bytes; ingest {:.2} s (submissions {:.2} s), curl median {:.3} s of {:?}; download steps span {:.2} s, {:.1} MB/s per job in Downloading",
            r.files_per_object,
            r.files,
            r.bytes,
            r.ingest_seconds,
            r.submit_seconds,
            r.curl_seconds,
            r.curl_runs_seconds
                .iter()
                .map(|x| (x * 1000.0).round() / 1000.0)
                .collect::<Vec<_>>(),
            r.download_span_seconds,
            r.download_job_mb_per_s
        );
        let _ = writeln!(
            s,
            "    mean ms per job: expansion {:.0}; {}; Pending -> Completed {:.0}",
            r.expansion_mean_ms,
            states.join(", "),
            r.walk_mean_ms
        );
        let _ = writeln!(
            s,
            "    CPU seconds: ingest: serve {:.1}, worker {:.1}, zookeeper {}, file server {:.1}; curl: curl {:.2}, file server {:.2}; ZooKeeper requests per object {}; {} events ({:.1} per object), {} step retries, {} refused reports, {} WARN, {} ERROR log lines",
            r.cpu_seconds_serve,
            r.cpu_seconds_worker,
            r.cpu_seconds_zookeeper
                .map_or_else(|| "?".to_string(), |z| format!("{z:.1}")),
            r.cpu_seconds_file_server,
            r.curl_cpu_seconds,
            r.curl_file_server_cpu_seconds,
            r.zookeeper_requests.map_or_else(
                || "?".to_string(),
                |n| format!("{:.0}", n as f64 / r.objects as f64)
            ),
            r.events,
            r.events as f64 / r.objects as f64,
            r.retries,
            r.refused_reports,
            r.warn_lines,
            r.error_lines
        );
        for l in &r.log_samples {
            let _ = writeln!(s, "    e.g. {l}");
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

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
