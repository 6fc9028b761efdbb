//! `ingest-campaign`: the fault campaign behind `tools/campaign` (issue 22).
//!
//! `faults` starts a ZooKeeper ensemble of three on loopback (`tools/zk
//! ensemble`) and three `ingest serve --replicas 3` engines, keeps
//! submitting batches through the typed client (given all three engines),
//! and records every acknowledged one. Meanwhile it injects faults: the
//! leader killed (SIGKILL), the leader killed with its data directory
//! deleted, the leader paused (SIGSTOP) past its session timeout, a
//! follower killed (and wiped), one then two of the three ZooKeeper
//! servers stopped. It measures, for each leader loss, the time from the
//! kill to the next acknowledged submission. At the end every engine must
//! be at the same position with the same head hash and hold every
//! acknowledged batch; the exit code says whether it held (0), not (1).
//!
//! `throughput` submits the same burst to a single engine and to the
//! leader of three, in one run, and prints the ratio, the records per
//! ZooKeeper write of the replicated tail and its bytes per record (stored,
//! and before compression). Each burst is timed until its last
//! acknowledgement and until the projector holds all of it (`GET /readyz`'s
//! `events_behind` at 0), with the CPU used until each (the leader's apart
//! from its followers').
//!
//! `sustained` finds the highest rate each of the same three setups holds
//! with its answers and its projection keeping up (the `sustained` module).
//!
//! Everything runs on loopback and stops by itself: every phase has a
//! deadline, `--max-seconds` bounds the whole run, and every process it
//! started is stopped when it ends (also on failure).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use serde_json::Value;
use tokio::io::AsyncBufReadExt;
use tokio_util::sync::CancellationToken;

mod sustained;

const ADMIN: &str = "campaign-admin-token-0123456789";
/// The ZooKeeper servers' JVM flags unless `INGEST_ZK_JVMFLAGS` is set.
const ZK_JVMFLAGS: &str =
    "-Xms64m -Xmx1g -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -XX:-UsePerfData";
const DEPOSITOR: &str = "campaign-depositor-token-0123456789";
const WORKER: &str = "campaign-worker-token-0123456789";

#[derive(Debug, Parser)]
#[command(about = "Fault campaign and throughput of replicated ingest engines (issue 22)")]
struct Cli {
    /// The `ingest` binary.
    #[arg(long, value_name = "PATH")]
    ingest: PathBuf,
    /// `tools/zk`.
    #[arg(long, value_name = "PATH")]
    zk_tool: PathBuf,
    /// A directory for the engines' data, logs and ZooKeeper (made; emptied first).
    #[arg(long, value_name = "DIR")]
    work: PathBuf,
    /// The engines' ZooKeeper session timeout, in seconds (how long a dead leader holds its place).
    #[arg(long, default_value_t = 2)]
    session_timeout: u64,
    #[command(subcommand)]
    mode: Mode,
}

#[derive(Debug, Subcommand)]
enum Mode {
    /// Faults under load, then checks that nothing acknowledged was lost.
    Faults(FaultArgs),
    /// A single engine against the leader of three, in one run.
    Throughput(ThroughputArgs),
    /// The highest submission rate each setup holds, answers and projection keeping up.
    Sustained(sustained::SustainedArgs),
}

#[derive(Debug, Args)]
struct FaultArgs {
    /// Leader kills (SIGKILL) with the data directory kept.
    #[arg(long, default_value_t = 10)]
    leader_kills: usize,
    /// Leader kills with the data directory deleted (the engine rejoins by copying from a peer).
    #[arg(long, default_value_t = 2)]
    disk_losses: usize,
    /// Leader pauses (SIGSTOP) past the session timeout.
    #[arg(long, default_value_t = 1)]
    pauses: usize,
    /// Followers killed (every other one also wiped).
    #[arg(long, default_value_t = 1)]
    follower_kills: usize,
    /// ZooKeeper outages: one of three servers stopped, then two (no quorum), then both back.
    #[arg(long, default_value_t = 1)]
    zk_outages: usize,
    /// Submissions in flight.
    #[arg(long, default_value_t = 4)]
    submitters: usize,
    /// The order of the faults is shuffled with this seed (printed; 0: from the clock).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// The whole campaign's bound, in seconds.
    #[arg(long, default_value_t = 1800)]
    max_seconds: u64,
}

#[derive(Debug, Args)]
struct ThroughputArgs {
    /// Batches submitted to each.
    #[arg(long, default_value_t = 2000)]
    batches: usize,
    /// Submissions in flight.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// Batches submitted to each before the measured burst (default: a tenth of --batches), so
    /// that the engines' caches and the ZooKeeper servers' JIT are warm when it starts.
    #[arg(long, value_name = "N")]
    warm_up: Option<usize>,
    /// Repeat the three runs this many times, each repetition on new ZooKeepers and engines, and
    /// end with each repetition's ratios and their medians (runs minutes apart differ by 15–20 %).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=20))]
    runs: u32,
}

/// One repetition's figures, for the summary of `--runs`.
struct Ratios {
    replicated: f64,
    acked_standalone: f64,
    acked_ensemble: f64,
    projected_standalone: f64,
    projected_ensemble: f64,
}

/// The median of `values` (the mean of the middle two for an even count).
fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    match n {
        0 => f64::NAN,
        _ if n % 2 == 1 => values[n / 2],
        _ => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

impl ThroughputArgs {
    fn warm_up(&self) -> usize {
        self.warm_up.unwrap_or(self.batches / 10)
    }
}

#[tokio::main]
async fn main() {
    let cli = Cli::parse();
    let code = match run(cli).await {
        Ok(true) => 0,
        Ok(false) => 1,
        Err(e) => {
            eprintln!("ingest-campaign: {e:#}");
            2
        }
    };
    std::process::exit(code);
}

async fn run(cli: Cli) -> Result<bool> {
    let _ = std::fs::remove_dir_all(&cli.work);
    std::fs::create_dir_all(&cli.work)
        .with_context(|| format!("cannot create {}", cli.work.display()))?;
    let ctx = Ctx {
        ingest: cli.ingest.clone(),
        zk_tool: cli.zk_tool.clone(),
        work: cli.work.clone(),
        session_timeout: cli.session_timeout,
    };
    match cli.mode {
        Mode::Faults(args) => faults(&ctx, args).await,
        Mode::Throughput(args) => throughput(&ctx, args).await,
        Mode::Sustained(args) => sustained::sustained(&ctx, args).await,
    }
}

struct Ctx {
    ingest: PathBuf,
    zk_tool: PathBuf,
    work: PathBuf,
    session_timeout: u64,
}

impl Ctx {
    fn zk(&self, args: &[&str]) -> Result<String> {
        let mut command = std::process::Command::new(&self.zk_tool);
        if std::env::var_os("INGEST_ZK_JVMFLAGS").is_none() {
            // The projection of a long campaign (150,000 batches and their
            // jobs) does not fit tools/zk's default 256 MiB heap: a server
            // ran out of memory after 1,774 s and the ensemble stalled.
            command.env("INGEST_ZK_JVMFLAGS", ZK_JVMFLAGS);
        }
        let out = command
            .args(args)
            .current_dir(std::env::temp_dir())
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("cannot run {}", self.zk_tool.display()))?;
        if !out.status.success() {
            bail!(
                "tools/zk {} failed: {}{}",
                args.join(" "),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }
}

/// ZooKeeper servers this run started: stopped when dropped.
struct ZkGuard<'a> {
    ctx: &'a Ctx,
    stop: Vec<String>,
}

impl Drop for ZkGuard<'_> {
    fn drop(&mut self) {
        let args: Vec<&str> = self.stop.iter().map(String::as_str).collect();
        let _ = self.ctx.zk(&args);
    }
}

/// Starts a standalone ZooKeeper in `dir`; its hosts, and the guard that
/// stops it.
fn standalone<'a>(ctx: &'a Ctx, dir: &str) -> Result<(ZkGuard<'a>, String)> {
    let guard = ZkGuard {
        ctx,
        stop: vec!["stop".into(), "--dir".into(), dir.into()],
    };
    let port = ctx.zk(&["free-port"])?;
    ctx.zk(&["start", "--port", &port, "--dir", dir])?;
    Ok((guard, format!("127.0.0.1:{port}")))
}

/// Starts an ensemble of three in `dir`; its hosts, and the guard that
/// stops it.
fn ensemble<'a>(ctx: &'a Ctx, dir: &str) -> Result<(ZkGuard<'a>, String)> {
    let guard = ZkGuard {
        ctx,
        stop: vec!["ensemble".into(), "stop".into(), "--dir".into(), dir.into()],
    };
    ctx.zk(&["ensemble", "start", "--dir", dir])?;
    let hosts = ctx.zk(&["ensemble", "hosts", "--dir", dir])?;
    Ok((guard, hosts))
}

/// One `ingest serve`.
struct Engine {
    name: String,
    dir: PathBuf,
    listen: String,
    base: String,
    child: Option<tokio::process::Child>,
    replicas: u32,
    /// The ZooKeeper root it serves.
    root: String,
}

impl Engine {
    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    async fn start(ctx: &Ctx, name: &str, hosts: &str, replicas: u32) -> Result<Engine> {
        Engine::start_at(ctx, name, hosts, replicas, "/campaign").await
    }

    /// [`Engine::start`] on the ZooKeeper root `root`.
    async fn start_at(
        ctx: &Ctx,
        name: &str,
        hosts: &str,
        replicas: u32,
        root: &str,
    ) -> Result<Engine> {
        let port = ctx.zk(&["free-port"])?;
        let mut e = Engine {
            name: name.to_string(),
            dir: ctx.work.join(name),
            listen: format!("127.0.0.1:{port}"),
            base: String::new(),
            child: None,
            replicas,
            root: root.to_string(),
        };
        e.launch(ctx, hosts).await?;
        Ok(e)
    }

    async fn launch(&mut self, ctx: &Ctx, hosts: &str) -> Result<()> {
        std::fs::create_dir_all(&self.dir)?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("serve.log"))?;
        let mut cmd = tokio::process::Command::new(&ctx.ingest);
        cmd.arg("--data-dir")
            .arg(self.data())
            .args([
                "serve",
                "--listen",
                &self.listen,
                "--zk",
                hosts,
                "--zk-root",
                &self.root,
            ])
            .args(["--zk-session-timeout", &ctx.session_timeout.to_string()])
            // The load is this tool's many connections from one address
            // (`sustained` keeps up to 8,000 open), not what the limits
            // guard against.
            .args(["--max-connections", "9000"])
            .args(["--max-connections-per-client", "9000"])
            .arg("--working-storage")
            .arg(self.dir.join("work"))
            .env("INGEST_ADMIN_TOKEN", ADMIN)
            .env("INGEST_DEPOSITOR_TOKEN", DEPOSITOR)
            .env("INGEST_WORKER_TOKEN", WORKER)
            .env_remove("INGEST_CONFIG")
            .env_remove("INGEST_DATA_DIR")
            .env_remove("INGEST_WORKER_STEPS")
            .stdout(Stdio::piped())
            .stderr(log)
            .kill_on_drop(true);
        if self.replicas > 1 {
            cmd.args([
                "--replicas",
                &self.replicas.to_string(),
                "--engine-id",
                &self.name,
            ]);
        }
        let mut child = cmd.spawn().context("cannot start ingest serve")?;
        let stdout = child.stdout.take().ok_or_else(|| anyhow!("no stdout"))?;
        let mut line = String::new();
        tokio::time::timeout(
            Duration::from_secs(60),
            tokio::io::BufReader::new(stdout).read_line(&mut line),
        )
        .await
        .map_err(|_| anyhow!("{} did not start listening within 60 s", self.name))??;
        self.base = line
            .trim()
            .strip_prefix("ingest serve listening on ")
            .ok_or_else(|| anyhow!("{}: unexpected first line {line:?}", self.name))?
            .to_string();
        self.child = Some(child);
        Ok(())
    }

    async fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.start_kill();
            let _ = c.wait().await;
        }
    }

    fn signal(&self, sig: &str) -> Result<()> {
        let pid = self
            .child
            .as_ref()
            .and_then(tokio::process::Child::id)
            .ok_or_else(|| anyhow!("{} is not running", self.name))?;
        let ok = std::process::Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()?
            .success();
        if !ok {
            bail!("kill {sig} {pid} failed");
        }
        Ok(())
    }
}

fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap_or_default()
}

async fn status(http: &reqwest::Client, base: &str) -> Option<Value> {
    http.get(format!("{base}/replication"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .ok()?
        .json()
        .await
        .ok()
}

async fn wait<T, F, Fut>(what: &str, within: Duration, mut f: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = f().await {
            return Ok(v);
        }
        if Instant::now() > deadline {
            bail!("{what}: not within {} s", within.as_secs());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The index of the one live engine that leads.
async fn leader(http: &reqwest::Client, engines: &[Engine]) -> Result<usize> {
    wait("one leader", Duration::from_secs(60), || async {
        let mut leaders = Vec::new();
        for (i, e) in engines
            .iter()
            .enumerate()
            .filter(|(_, e)| e.child.is_some())
        {
            if status(http, &e.base)
                .await
                .is_some_and(|s| s["role"] == "leader")
            {
                leaders.push(i);
            }
        }
        (leaders.len() == 1).then(|| leaders[0])
    })
    .await
}

/// Waits until every live engine is at the same position and head hash.
/// Set while [`converged`] checks the replicas: the submitters hold their
/// next submission, so the engines can be seen at one position (under
/// steady load a follower is always a round behind the leader's last
/// group, and positions sampled one engine after another rarely agree).
static QUIET: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Clears [`QUIET`] when dropped.
struct Quiet;

impl Quiet {
    fn start() -> Quiet {
        QUIET.store(true, std::sync::atomic::Ordering::Release);
        Quiet
    }
}

impl Drop for Quiet {
    fn drop(&mut self) {
        QUIET.store(false, std::sync::atomic::Ordering::Release);
    }
}

async fn converged(
    http: &reqwest::Client,
    engines: &[Engine],
    within: Duration,
) -> Result<(u64, String)> {
    let _quiet = Quiet::start();
    match wait(
        "every engine at the same position and head hash",
        within,
        || async {
            let mut seen = Vec::new();
            for e in engines.iter().filter(|e| e.child.is_some()) {
                let s = status(http, &e.base).await?;
                let role = s["role"].as_str()?.to_string();
                if role != "leader" && role != "follower" {
                    return None;
                }
                seen.push((s["applied"].as_u64()?, s["head_hash"].as_str()?.to_string()));
            }
            let first = seen.first()?.clone();
            seen.iter().all(|s| *s == first).then_some(first)
        },
    )
    .await
    {
        Ok(v) => Ok(v),
        // Say where each engine is, so a run that did not converge can be
        // understood from its output alone.
        Err(e) => Err(e.context(where_engines_are(http, engines).await)),
    }
}

/// One line per running engine: its name, role, applied position, lag and
/// reason, as its `/replication` says (or that it did not answer).
async fn where_engines_are(http: &reqwest::Client, engines: &[Engine]) -> String {
    let mut lines = Vec::new();
    for e in engines.iter().filter(|e| e.child.is_some()) {
        lines.push(match status(http, &e.base).await {
            Some(s) => format!(
                "{}: role {} applied {} lag {} tail nodes {} reason {}",
                e.name, s["role"], s["applied"], s["lag"], s["tail_nodes"], s["reason"]
            ),
            None => format!("{}: /replication did not answer", e.name),
        });
    }
    lines.join("; ")
}

fn submission(n: u64) -> ingest_protocol::submission::SubmissionInput {
    ingest_protocol::submission::SubmissionInput {
        submitter: Some("campaign".into()),
        profile: Some("demo".into()),
        payload_type: Some("object-manifest".into()),
        payload_url: Some(format!("https://example.org/campaign-{n}.checkm")),
        manifest: vec![format!("https://example.org/object-{n}.checkm loc{n}")],
        erc_what: Some(format!("Campaign object {n}")),
        ..Default::default()
    }
}

/// What the submitters saw.
#[derive(Default)]
struct Acks {
    /// Each acknowledged batch, with when its request was sent and when
    /// its answer came.
    acked: Vec<(String, Instant, Instant)>,
    refused: std::collections::BTreeMap<String, u64>,
}

fn spawn_submitters(
    bases: &str,
    n: usize,
    acks: Arc<Mutex<Acks>>,
    stop: CancellationToken,
) -> Result<Vec<tokio::task::JoinHandle<()>>> {
    let client = ingest_client::Client::with_timeout(bases, DEPOSITOR, Duration::from_secs(10))?;
    let counter = Arc::new(std::sync::atomic::AtomicU64::new(0));
    Ok((0..n)
        .map(|_| {
            let (client, acks, stop, counter) = (
                client.clone(),
                Arc::clone(&acks),
                stop.clone(),
                Arc::clone(&counter),
            );
            tokio::spawn(async move {
                while !stop.is_cancelled() {
                    if QUIET.load(std::sync::atomic::Ordering::Acquire) {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                    let i = counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let sent = Instant::now();
                    match client.submit(&submission(i)).await {
                        Ok(s) => {
                            let mut a = acks.lock().unwrap_or_else(|e| e.into_inner());
                            a.acked.push((s.bid.to_string(), sent, Instant::now()));
                        }
                        Err(e) => {
                            let code = match &e {
                                ingest_client::ClientError::Status { code, status, .. } => {
                                    format!("{status} {code}")
                                }
                                ingest_client::ClientError::Transport { .. } => "transport".into(),
                                _ => "other".into(),
                            };
                            *acks
                                .lock()
                                .unwrap_or_else(|e| e.into_inner())
                                .refused
                                .entry(code)
                                .or_default() += 1;
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                    }
                }
            })
        })
        .collect())
}

/// When the first submission sent after `t` was acknowledged.
fn first_ack_after(acks: &Mutex<Acks>, t: Instant) -> Option<Instant> {
    let a = acks.lock().unwrap_or_else(|e| e.into_inner());
    a.acked
        .iter()
        .rev()
        .take_while(|(_, _, answered)| *answered > t)
        .filter(|(_, sent, _)| *sent > t)
        .map(|(_, _, answered)| *answered)
        .min()
}

#[derive(Debug, Clone, Copy)]
enum Fault {
    LeaderKill { wipe: bool },
    Pause,
    FollowerKill { wipe: bool },
    ZkOutage,
}

async fn faults(ctx: &Ctx, args: FaultArgs) -> Result<bool> {
    let started = Instant::now();
    let bound = Duration::from_secs(args.max_seconds);
    let zk_dir = ctx.work.join("zk").to_string_lossy().into_owned();
    let (_zk, hosts) = ensemble(ctx, &zk_dir)?;
    let mut engines = Vec::new();
    for i in 1..=3 {
        engines.push(Engine::start(ctx, &format!("e{i}"), &hosts, 3).await?);
    }
    let http = http();
    leader(&http, &engines).await?;
    let bases = engines
        .iter()
        .map(|e| e.base.clone())
        .collect::<Vec<_>>()
        .join(",");
    let acks = Arc::new(Mutex::new(Acks::default()));
    let stop = CancellationToken::new();
    let submitters = spawn_submitters(&bases, args.submitters, Arc::clone(&acks), stop.clone())?;

    let seed = if args.seed == 0 {
        fastrand::u64(..)
    } else {
        args.seed
    };
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut plan: Vec<Fault> = Vec::new();
    plan.extend((0..args.leader_kills).map(|_| Fault::LeaderKill { wipe: false }));
    plan.extend((0..args.disk_losses).map(|_| Fault::LeaderKill { wipe: true }));
    plan.extend((0..args.pauses).map(|_| Fault::Pause));
    plan.extend((0..args.follower_kills).map(|i| Fault::FollowerKill { wipe: i % 2 == 1 }));
    plan.extend((0..args.zk_outages).map(|_| Fault::ZkOutage));
    rng.shuffle(&mut plan);
    println!(
        "campaign: {} faults, seed {seed}, session timeout {} s",
        plan.len(),
        ctx.session_timeout
    );

    let mut failovers: Vec<Duration> = Vec::new();
    let mut no_quorum_refusals = 0u64;
    let mut done = 0usize;
    for (k, fault) in plan.iter().enumerate() {
        if started.elapsed() > bound {
            println!("campaign: --max-seconds reached after {done} faults");
            break;
        }
        // Some load between faults.
        tokio::time::sleep(Duration::from_millis(300)).await;
        match *fault {
            Fault::LeaderKill { wipe } => {
                let l = leader(&http, &engines).await?;
                engines[l].kill().await;
                let t0 = Instant::now();
                if wipe {
                    std::fs::remove_dir_all(engines[l].data())?;
                }
                let at = wait(
                    "a write acknowledged after the leader died",
                    Duration::from_secs(60),
                    || async { first_ack_after(&acks, t0) },
                )
                .await?;
                failovers.push(at - t0);
                engines[l].launch(ctx, &hosts).await?;
                converged(&http, &engines, Duration::from_secs(120)).await?;
            }
            Fault::Pause => {
                let l = leader(&http, &engines).await?;
                engines[l].signal("-STOP")?;
                tokio::time::sleep(Duration::from_millis(ctx.session_timeout * 1000 + 1500)).await;
                engines[l].signal("-CONT")?;
                let old = engines[l].base.clone();
                wait(
                    "the paused leader follows",
                    Duration::from_secs(60),
                    || async {
                        status(&http, &old)
                            .await
                            .filter(|s| s["role"] == "follower")
                            .map(|_| ())
                    },
                )
                .await?;
                converged(&http, &engines, Duration::from_secs(120)).await?;
            }
            Fault::FollowerKill { wipe } => {
                let l = leader(&http, &engines).await?;
                let f = (l + 1 + rng.usize(0..2)) % 3;
                engines[f].kill().await;
                tokio::time::sleep(Duration::from_secs(1)).await;
                if wipe {
                    std::fs::remove_dir_all(engines[f].data())?;
                }
                engines[f].launch(ctx, &hosts).await?;
                converged(&http, &engines, Duration::from_secs(120)).await?;
            }
            Fault::ZkOutage => {
                let a = 1 + rng.usize(0..3);
                let b = 1 + (a % 3);
                let member = |m: usize| format!("{zk_dir}/member-{m}");
                ctx.zk(&["stop", "--dir", &member(a), "--grace", "5"])?;
                tokio::time::sleep(Duration::from_secs(2)).await;
                let before = acks
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .refused
                    .get("503 no_quorum")
                    .copied()
                    .unwrap_or(0);
                ctx.zk(&["stop", "--dir", &member(b), "--grace", "5"])?;
                tokio::time::sleep(Duration::from_secs(ctx.session_timeout + 3)).await;
                let after = acks
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .refused
                    .get("503 no_quorum")
                    .copied()
                    .unwrap_or(0);
                no_quorum_refusals += after - before;
                ctx.zk(&["restart", "--dir", &member(a)])?;
                ctx.zk(&["restart", "--dir", &member(b)])?;
                let t0 = Instant::now();
                wait(
                    "writes after the quorum returned",
                    Duration::from_secs(90),
                    || async { first_ack_after(&acks, t0) },
                )
                .await?;
                converged(&http, &engines, Duration::from_secs(120)).await?;
            }
        }
        done += 1;
        let n = acks.lock().unwrap_or_else(|e| e.into_inner()).acked.len();
        println!(
            "campaign: fault {}/{} {fault:?} done; {n} acknowledged so far ({:.0} s)",
            k + 1,
            plan.len(),
            started.elapsed().as_secs_f64()
        );
    }
    stop.cancel();
    for s in submitters {
        let _ = s.await;
    }
    let (position, head) = converged(&http, &engines, Duration::from_secs(120)).await?;
    let acked: Vec<String> = acks
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .acked
        .iter()
        .map(|(b, _, _)| b.clone())
        .collect();
    // Every acknowledged batch on every engine.
    let mut lost = 0usize;
    for e in &engines {
        let missing = check_present(&http, &e.base, &acked).await;
        if missing > 0 {
            println!(
                "campaign: {} is missing {missing} acknowledged batches",
                e.name
            );
        }
        lost += missing;
    }
    let refused = acks
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .refused
        .clone();
    failovers.sort();
    let pct = |p: f64| -> f64 {
        if failovers.is_empty() {
            return 0.0;
        }
        let i = ((failovers.len() as f64 - 1.0) * p).round() as usize;
        failovers[i].as_secs_f64()
    };
    println!();
    println!("| faults done | leader kills (disk lost) | acknowledged | lost | replicas at | identical head | failover s min / p50 / p90 / max | no_quorum refusals | wall s |");
    println!("|---|---|---|---|---|---|---|---|---|");
    println!(
        "| {done} of {} | {} ({}) | {} | {lost} | {position} | {} | {:.2} / {:.2} / {:.2} / {:.2} | {no_quorum_refusals} | {:.0} |",
        plan.len(),
        failovers.len(),
        plan.iter().filter(|f| matches!(f, Fault::LeaderKill { wipe: true })).count(),
        acked.len(),
        &head[..12.min(head.len())],
        pct(0.0),
        pct(0.5),
        pct(0.9),
        pct(1.0),
        started.elapsed().as_secs_f64()
    );
    println!("refusals seen by the submitters (retried): {refused:?}");
    for e in &mut engines {
        e.kill().await;
    }
    Ok(lost == 0 && done == plan.len())
}

async fn check_present(http: &reqwest::Client, base: &str, bids: &[String]) -> usize {
    let mut missing = 0;
    for chunk in bids.chunks(32) {
        let checks = chunk.iter().map(|bid| {
            let url = format!("{base}/batches/{bid}");
            let http = http.clone();
            async move {
                http.get(url)
                    .bearer_auth(ADMIN)
                    .send()
                    .await
                    .map(|r| r.status().as_u16())
                    .unwrap_or(0)
            }
        });
        let mut set = tokio::task::JoinSet::new();
        for c in checks {
            set.spawn(c);
        }
        while let Some(r) = set.join_next().await {
            if r.unwrap_or(0) != 200 {
                missing += 1;
            }
        }
    }
    missing
}

async fn burst(bases: &str, n: usize, concurrency: usize) -> Result<Duration> {
    let client = ingest_client::Client::new(bases, DEPOSITOR)?;
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let t0 = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..concurrency {
        let (client, next) = (client.clone(), Arc::clone(&next));
        set.spawn(async move {
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= n {
                    return Ok::<_, anyhow::Error>(());
                }
                client.submit(&submission(i as u64)).await?;
            }
        });
    }
    while let Some(r) = set.join_next().await {
        r??;
    }
    Ok(t0.elapsed())
}

/// CPU time (user + system) a process used so far, in seconds; `None`
/// when it is gone.
fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the command name (which may hold spaces): state is
    // the first, utime the 12th, stime the 13th.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    Some(ticks / clock_ticks())
}

fn clock_ticks() -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
            .unwrap_or(100.0)
    })
}

/// The pids of the ZooKeeper servers whose command line names a path
/// under `dir` (their configuration).
fn zookeeper_pids(dir: &str) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                let c = String::from_utf8_lossy(&c);
                c.contains("QuorumPeerMain") && c.split('\0').any(|a| a.starts_with(dir))
            })
        })
        .collect()
}

/// The client ports of the ZooKeeper servers under `dir` (a standalone
/// server's `zoo.cfg`, or an ensemble's `member-N/zoo.cfg`).
fn zookeeper_ports(dir: &str) -> Vec<u16> {
    let dir = Path::new(dir);
    let mut configs = vec![dir.join("zoo.cfg")];
    configs.extend((1..=5).map(|m| dir.join(format!("member-{m}")).join("zoo.cfg")));
    configs
        .iter()
        .filter_map(|c| std::fs::read_to_string(c).ok())
        .filter_map(|text| {
            text.lines()
                .find_map(|l| l.strip_prefix("clientPort="))
                .and_then(|p| p.trim().parse().ok())
        })
        .collect()
}

/// Requests (client packets, pings included) the ZooKeeper server on
/// `port` received since it started: `mntr`'s `zk_packets_received`.
fn packets_received(port: u16) -> Option<u64> {
    use std::io::{Read, Write};
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
    s.write_all(b"mntr").ok()?;
    let mut text = String::new();
    s.take(64 * 1024).read_to_string(&mut text).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("zk_packets_received"))
        .and_then(|v| v.trim().parse().ok())
}

/// CPU seconds used by the engines (and, of them, the first: the leader,
/// or the only engine of a single run), the ZooKeeper servers and this
/// tool (the load) between two readings, and the requests the ZooKeeper
/// servers received.
#[derive(Debug, Clone, Copy, Default)]
struct Cpu {
    engines: f64,
    first: f64,
    zookeeper: f64,
    load: f64,
    zk_requests: f64,
}

impl Cpu {
    /// Reads the counters; `engines[0]` is the leader (or the only engine).
    fn read(engines: &[&Engine], zk_dir: &str) -> Cpu {
        let sum = |pids: &mut dyn Iterator<Item = u32>| pids.filter_map(cpu_seconds).sum::<f64>();
        let pids = || engines.iter().filter_map(|e| e.child.as_ref()?.id());
        Cpu {
            engines: sum(&mut pids()),
            first: sum(&mut pids().take(1)),
            zookeeper: sum(&mut zookeeper_pids(zk_dir).into_iter()),
            load: cpu_seconds(std::process::id()).unwrap_or(0.0),
            zk_requests: zookeeper_ports(zk_dir)
                .into_iter()
                .filter_map(packets_received)
                .sum::<u64>() as f64,
        }
    }

    fn since(self, before: Cpu) -> Cpu {
        Cpu {
            engines: self.engines - before.engines,
            first: self.first - before.first,
            zookeeper: self.zookeeper - before.zookeeper,
            load: self.load - before.load,
            zk_requests: self.zk_requests - before.zk_requests,
        }
    }

    fn total(self) -> f64 {
        self.engines + self.zookeeper + self.load
    }

    /// One row of the CPU table.
    fn row(self, run: &str, until: &str, events: u64, elapsed: Duration) -> String {
        let per_event_ms = |s: f64| 1000.0 * s / events.max(1) as f64;
        format!(
            "| {run} | {until} | {events} | {:.1} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.3} |",
            elapsed.as_secs_f64(),
            per_event_ms(self.engines),
            per_event_ms(self.first),
            per_event_ms(self.zookeeper),
            per_event_ms(self.load),
            per_event_ms(self.total()),
            self.total() / elapsed.as_secs_f64().max(1e-9),
            self.zk_requests / events.max(1) as f64,
        )
    }
}

/// Events the projector of the engine at `base` has not yet put into
/// ZooKeeper (`GET /readyz`, which answers with them whether ready or not).
async fn events_behind(http: &reqwest::Client, base: &str) -> Option<u64> {
    let v: Value = http
        .get(format!("{base}/readyz"))
        .send()
        .await
        .ok()?
        .json()
        .await
        .ok()?;
    v["events_behind"].as_u64()
}

/// Waits until the projector of the engine at `base` has put every event
/// into ZooKeeper (`what` names the wait in its error).
async fn projected(http: &reqwest::Client, base: &str, what: &str, limit: Duration) -> Result<()> {
    wait(what, limit, || async {
        (events_behind(http, base).await? == 0).then_some(())
    })
    .await
}

/// One burst, measured twice: until every submission was acknowledged,
/// and until the projector (on `projector`) had put every one of them
/// into ZooKeeper's queue nodes, where workers find them.
struct Measured {
    acked: Duration,
    cpu_acked: Cpu,
    /// Events the projector had still to write when the last
    /// acknowledgement came.
    behind_at_ack: u64,
    projected: Duration,
    cpu_projected: Cpu,
}

async fn measured_burst(
    bases: &str,
    projector: &str,
    engines: &[&Engine],
    zk_dir: &str,
    args: &ThroughputArgs,
) -> Result<Measured> {
    let http = http();
    let cpu0 = Cpu::read(engines, zk_dir);
    let t0 = Instant::now();
    burst(bases, args.batches, args.concurrency).await?;
    let acked = t0.elapsed();
    let cpu_acked = Cpu::read(engines, zk_dir).since(cpu0);
    let behind_at_ack = events_behind(&http, projector).await.unwrap_or(0);
    projected(
        &http,
        projector,
        "the projector holding the whole burst",
        Duration::from_secs(600),
    )
    .await?;
    Ok(Measured {
        acked,
        cpu_acked,
        behind_at_ack,
        projected: t0.elapsed(),
        cpu_projected: Cpu::read(engines, zk_dir).since(cpu0),
    })
}

/// One engine (no replication) taking a burst on `hosts`, under `root`;
/// the CPU is that engine's and the ZooKeeper servers' under `zk_dir`.
async fn single_burst(
    ctx: &Ctx,
    args: &ThroughputArgs,
    (name, root): (&str, &str),
    hosts: &str,
    zk_dir: &str,
) -> Result<(Measured, u64)> {
    let http = http();
    let mut e = Engine::start_at(ctx, name, hosts, 1, root).await?;
    burst(&e.base, args.warm_up(), args.concurrency).await?;
    projected(
        &http,
        &e.base,
        "the projector after the warm-up",
        Duration::from_secs(120),
    )
    .await?;
    let before = status(&http, &e.base)
        .await
        .and_then(|s| s["applied"].as_u64())
        .unwrap_or(0);
    let m = measured_burst(&e.base, &e.base, &[&e], zk_dir, args).await?;
    let events = status(&http, &e.base)
        .await
        .and_then(|s| s["applied"].as_u64())
        .unwrap_or(0)
        - before;
    e.kill().await;
    Ok((m, events))
}

async fn throughput(ctx: &Ctx, args: ThroughputArgs) -> Result<bool> {
    if args.runs == 1 {
        throughput_once(ctx, &args).await?;
        return Ok(true);
    }
    let mut all = Vec::new();
    for k in 1..=args.runs {
        println!("## Repetition {k} of {}", args.runs);
        println!();
        let work = ctx.work.join(format!("run{k}"));
        std::fs::create_dir_all(&work)
            .with_context(|| format!("cannot create {}", work.display()))?;
        let run_ctx = Ctx {
            ingest: ctx.ingest.clone(),
            zk_tool: ctx.zk_tool.clone(),
            work,
            session_timeout: ctx.session_timeout,
        };
        all.push(throughput_once(&run_ctx, &args).await?);
        println!();
    }
    println!("## Every repetition");
    println!();
    println!("| repetition | replicated events/s | acknowledged / single (standalone) | acknowledged / single (ensemble of 3) | projected / single (standalone) | projected / single (ensemble of 3) |");
    println!("|---|---|---|---|---|---|");
    for (k, r) in all.iter().enumerate() {
        println!(
            "| {} | {:.0} | {:.2} | {:.2} | {:.2} | {:.2} |",
            k + 1,
            r.replicated,
            r.acked_standalone,
            r.acked_ensemble,
            r.projected_standalone,
            r.projected_ensemble
        );
    }
    let med = |f: fn(&Ratios) -> f64| median(all.iter().map(f).collect());
    println!(
        "| median | {:.0} | {:.2} | {:.2} | {:.2} | {:.2} |",
        med(|r| r.replicated),
        med(|r| r.acked_standalone),
        med(|r| r.acked_ensemble),
        med(|r| r.projected_standalone),
        med(|r| r.projected_ensemble)
    );
    Ok(true)
}

/// The three runs once: prints their tables and returns the ratios.
async fn throughput_once(ctx: &Ctx, args: &ThroughputArgs) -> Result<Ratios> {
    let http = http();
    // A single engine on a standalone ZooKeeper (which it only projects into).
    let single_dir = ctx.work.join("zk-single").to_string_lossy().into_owned();
    let (single, single_events) = {
        let (_zk, hosts) = standalone(ctx, &single_dir)?;
        single_burst(ctx, args, ("single", "/campaign"), &hosts, &single_dir).await?
    };
    // A single engine on an ensemble of three: what a single-node deployment
    // on Merritt's ensemble pays for its projection, so that the replicated
    // run's ratio to it is replication's own cost. Each run gets a new
    // ZooKeeper of its own: before, the replicated run shared this one and
    // its servers carried (and garbage-collected) this run's tree too.
    let (on_ensemble, on_ensemble_events) = {
        let dir = ctx.work.join("zk-single-ensemble");
        let dir = dir.to_string_lossy().into_owned();
        let (_zk, hosts) = ensemble(ctx, &dir)?;
        single_burst(
            ctx,
            args,
            ("single-ensemble", "/campaign-single"),
            &hosts,
            &dir,
        )
        .await?
    };
    // The leader of three on a new ensemble of three.
    let zk_dir = ctx.work.join("zk").to_string_lossy().into_owned();
    let (_zk, hosts) = ensemble(ctx, &zk_dir)?;
    let mut engines = Vec::new();
    for i in 1..=3 {
        engines.push(Engine::start(ctx, &format!("r{i}"), &hosts, 3).await?);
    }
    let l = leader(&http, &engines).await?;
    let bases = engines
        .iter()
        .map(|e| e.base.clone())
        .collect::<Vec<_>>()
        .join(",");
    burst(&bases, args.warm_up(), args.concurrency).await?;
    converged(&http, &engines, Duration::from_secs(60)).await?;
    projected(
        &http,
        &engines[l].base,
        "the projector after the warm-up",
        Duration::from_secs(120),
    )
    .await?;
    let s0 = status(&http, &engines[l].base).await.unwrap_or(Value::Null);
    // The leader first: the CPU table gives its share apart.
    let leader_first: Vec<&Engine> = std::iter::once(&engines[l])
        .chain(
            engines
                .iter()
                .enumerate()
                .filter(|(i, _)| *i != l)
                .map(|(_, e)| e),
        )
        .collect();
    let replicated = measured_burst(&bases, &engines[l].base, &leader_first, &zk_dir, args).await?;
    let s1 = wait("the leader's counters", Duration::from_secs(10), || async {
        let s = status(&http, &engines[l].base).await?;
        (s["records_replicated"].as_u64()? > s0["records_replicated"].as_u64()?).then_some(s)
    })
    .await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let s1 = status(&http, &engines[l].base).await.unwrap_or(s1);
    let events = s1["applied"].as_u64().unwrap_or(0) - s0["applied"].as_u64().unwrap_or(0);
    let writes = s1["tail_writes"].as_u64().unwrap_or(0) - s0["tail_writes"].as_u64().unwrap_or(0);
    let counted = |key: &str| s1[key].as_u64().unwrap_or(0) - s0[key].as_u64().unwrap_or(0);
    let (frame_bytes, stored_bytes) = (counted("tail_frame_bytes"), counted("tail_stored_bytes"));
    converged(&http, &engines, Duration::from_secs(60)).await?;
    let rate = |events: u64, d: Duration| events as f64 / d.as_secs_f64();
    let single_rate = rate(single_events, single.acked);
    let on_ensemble_rate = rate(on_ensemble_events, on_ensemble.acked);
    let replicated_rate = rate(events, replicated.acked);
    println!("Acknowledged (every submission of the burst answered 201):");
    println!();
    println!("| batches | in flight | single events/s (standalone ZooKeeper) | single events/s (ensemble of 3) | replicated events/s | replicated / single (standalone) | replicated / single (ensemble) | events per ZooKeeper write | tail bytes per event (stored / before compression) |");
    println!("|---|---|---|---|---|---|---|---|---|");
    println!(
        "| {} | {} | {single_rate:.0} | {on_ensemble_rate:.0} | {replicated_rate:.0} | {:.2} | {:.2} | {:.1} | {:.0} / {:.0} |",
        args.batches,
        args.concurrency,
        replicated_rate / single_rate,
        replicated_rate / on_ensemble_rate,
        events as f64 / writes.max(1) as f64,
        stored_bytes as f64 / events.max(1) as f64,
        frame_bytes as f64 / events.max(1) as f64,
    );
    println!();
    println!("Acknowledged and projected (every event of the burst in ZooKeeper's queue nodes, where workers find it; the projector runs behind the acknowledgements, so a burst acknowledged faster than it is projected leaves work queued after its last answer):");
    println!();
    println!("| run | events behind at the last acknowledgement | seconds to projected | events/s | replicated / this |");
    println!("|---|---|---|---|---|");
    let replicated_projected = rate(events, replicated.projected);
    let ratios = Ratios {
        replicated: replicated_rate,
        acked_standalone: replicated_rate / single_rate,
        acked_ensemble: replicated_rate / on_ensemble_rate,
        projected_standalone: replicated_projected / rate(single_events, single.projected),
        projected_ensemble: replicated_projected / rate(on_ensemble_events, on_ensemble.projected),
    };
    for (name, m, n) in [
        ("single (standalone)", &single, single_events),
        ("single (ensemble of 3)", &on_ensemble, on_ensemble_events),
        ("replicated (3 + 3)", &replicated, events),
    ] {
        let r = rate(n, m.projected);
        println!(
            "| {name} | {} | {:.1} | {r:.0} | {:.2} |",
            m.behind_at_ack,
            m.projected.as_secs_f64(),
            replicated_projected / r,
        );
    }
    println!();
    println!("CPU used (the engines' processes, the ZooKeeper servers', this tool's load), per event, until acknowledged and until projected; of the engines', the leader's (a single run's one engine); cores busy = all of it / wall time; ZooKeeper requests = the packets its servers received from clients (mntr's zk_packets_received, pings included):");
    println!();
    println!("| run | until | events | seconds | engines ms/event | leader ms/event | ZooKeeper ms/event | load ms/event | all ms/event | cores busy | ZooKeeper requests/event |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for (name, m, n) in [
        ("single (standalone)", &single, single_events),
        ("single (ensemble of 3)", &on_ensemble, on_ensemble_events),
        ("replicated (3 + 3)", &replicated, events),
    ] {
        println!("{}", m.cpu_acked.row(name, "acknowledged", n, m.acked));
        println!("{}", m.cpu_projected.row(name, "projected", n, m.projected));
    }
    for e in &mut engines {
        e.kill().await;
    }
    Ok(ratios)
}
