//! The worker daemons, run in `ingest serve` or as `ingest worker`.
//!
//! Each enabled daemon ([`DaemonKind`]) runs `tasks` tasks. A task lists its
//! queue in ZooKeeper (`/jobs/states/<state>` sorted by `PP-JID`, pending
//! batches FIFO by bid, reporting batches by status), picks an item (job
//! tasks start at a random one among the head so that workers do not all
//! race for the first), takes the item's EPHEMERAL lock node with this
//! worker's session (`NodeExists`: the next item), re-reads the item's
//! status, runs the [`step::Step`] of the state and reports through the API
//! ([`client::EngineClient`], the worker token, `session_id` = this
//! session), then deletes the lock. The API fences every report on the lock
//! node: a 409 (`lock_not_held`, `stale_report`) discards the result.
//!
//! After an accepted report the lock is kept until the projection shows the
//! item's new state (at most a few seconds), so that no worker takes the
//! item again from a projection that lags the log.
//!
//! Idle queues are not polled in a tight loop: a task waits on a ZooKeeper
//! watch of the queue, bounded by a capped exponential back-off with
//! jitter. While the session is disconnected no new work starts; when it
//! expires the work in hand is dropped and a new session is made.
//!
//! Only simulated steps exist so far ([`step::Simulate`]). In `ingest serve`
//! the daemons therefore run only when `INGEST_WORKER_STEPS=simulate` is set
//! (see [`InProcess::from_env`]): a server must not complete jobs with fake
//! work because its configuration enables daemons by default.

pub mod client;
pub mod daemon;
pub mod real;
pub mod step;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use ingest_events::JobState;
use ingest_projections::ZkConfig;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::config::{DaemonKind, Daemons, Provisioning};
use client::EngineClient;
use daemon::{Session, Shared, Stats};
use step::{DfProbe, Rng, SimSettings, Steps, StorageProbe};

/// How long [`Workers::shutdown`] waits for steps in flight.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(20);

/// Everything a set of daemons needs.
pub struct WorkerOptions {
    /// The API's base URL (`http://127.0.0.1:7878`).
    pub engine: String,
    /// The worker bearer token.
    pub token: String,
    /// Where ZooKeeper is.
    pub zk: ZkConfig,
    /// The worker's name in reports.
    pub name: String,
    /// The daemons to run and their task counts.
    pub daemons: Vec<(DaemonKind, u32)>,
    /// The steps.
    pub steps: Steps,
}

/// Running daemons; stop them with [`Workers::shutdown`].
pub struct Workers {
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    faults: step::Faults,
    stats: Arc<Stats>,
}

impl Workers {
    /// Starts the daemons on the current tokio runtime.
    ///
    /// # Errors
    /// When the HTTP client cannot be built.
    pub fn start(options: WorkerOptions) -> Result<Workers> {
        let engine = EngineClient::new(&options.engine, &options.token)?;
        let faults = options.steps.faults.clone();
        let stats = Arc::new(Stats::default());
        let shared = Arc::new(Shared {
            stats: Arc::clone(&stats),
            name: options.name,
            session: Session::new(options.zk),
            engine,
            steps: options.steps,
            rng: Rng::from_entropy(),
            acquired: Default::default(),
        });
        let (stop, rx) = watch::channel(false);
        let mut tasks = Vec::new();
        for (kind, n) in options.daemons {
            for task in 0..n.max(1) {
                tasks.push(tokio::spawn(daemon::run_task(
                    Arc::clone(&shared),
                    kind,
                    task,
                    rx.clone(),
                )));
            }
        }
        if let Some(janitor) = shared.steps.janitor.clone() {
            tasks.push(tokio::spawn(janitor.run(Arc::clone(&shared), rx.clone())));
        }
        tracing::info!(worker = %shared.name, tasks = tasks.len(), "worker daemons started");
        Ok(Workers {
            stop,
            tasks,
            faults,
            stats,
        })
    }

    /// The fault-injection handle ("force the next job of step S to fail").
    pub fn faults(&self) -> step::Faults {
        self.faults.clone()
    }

    /// Counts of this worker's reports.
    pub fn stats(&self) -> Arc<Stats> {
        Arc::clone(&self.stats)
    }

    /// Stops taking work, lets steps in flight finish and release their
    /// locks (abandoning them after [`SHUTDOWN_GRACE`]).
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        let all = futures_join(self.tasks);
        if tokio::time::timeout(SHUTDOWN_GRACE, all).await.is_err() {
            tracing::warn!("worker daemons did not stop in time; their locks go with the session");
        }
        tracing::info!("worker daemons stopped");
    }
}

async fn futures_join(tasks: Vec<JoinHandle<()>>) {
    for t in tasks {
        if let Err(e) = t.await {
            tracing::error!(error = %e, "a daemon task failed");
        }
    }
}

/// The in-process daemons of `ingest serve`, configured from the
/// environment: `INGEST_WORKER_STEPS=simulate` turns them on;
/// `INGEST_SIMULATE_DURATION_MS`, `INGEST_SIMULATE_FAILURE_RATE` and
/// `INGEST_SIMULATE_SEED` tune the simulation.
#[derive(Debug, Clone)]
pub struct InProcess {
    /// How the simulated steps behave.
    pub sim: SimSettings,
    /// The simulation's seed.
    pub seed: Option<u64>,
    /// `INGEST_WORKER_STEPS=real`: the real steps instead of simulated ones.
    pub real: bool,
}

impl InProcess {
    /// `Some` when `INGEST_WORKER_STEPS=simulate`.
    ///
    /// # Errors
    /// When a variable holds something unusable.
    pub fn from_env() -> Result<Option<InProcess>> {
        match std::env::var("INGEST_WORKER_STEPS").ok().as_deref() {
            None | Some("" | "none" | "off") => return Ok(None),
            Some("simulate" | "real") => {}
            Some(other) => {
                bail!("INGEST_WORKER_STEPS={other:?}: the steps are \"real\" or \"simulate\"")
            }
        }
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let sim = sim_settings(
            var("INGEST_SIMULATE_DURATION_MS").as_deref(),
            var("INGEST_SIMULATE_FAILURE_RATE").as_deref(),
        )?;
        let seed = var("INGEST_SIMULATE_SEED")
            .map(|s| s.parse().context("INGEST_SIMULATE_SEED"))
            .transpose()?;
        let real = std::env::var("INGEST_WORKER_STEPS").ok().as_deref() == Some("real");
        Ok(Some(InProcess { sim, seed, real }))
    }

    /// Starts the enabled daemons against the API at `engine`.
    ///
    /// # Errors
    /// When the HTTP client cannot be built.
    pub fn start(
        &self,
        engine: String,
        token: String,
        zk: ZkConfig,
        daemons: &Daemons,
        provisioning: &Provisioning,
        real: (&real::RealArgs, &crate::config::Profiles),
    ) -> Result<Workers> {
        let steps = if self.real {
            real::steps(
                real::RealConfig {
                    work_dir: provisioning.working_storage.clone(),
                    args: real.0.clone(),
                    profiles: real.1.clone(),
                },
                Arc::new(DfProbe),
                provisioning.threshold_percent,
            )?
        } else {
            Steps::simulated(
                self.sim,
                self.seed,
                Arc::new(DfProbe) as Arc<dyn StorageProbe>,
                provisioning.threshold_percent,
                provisioning.working_storage.clone(),
            )
        };
        Workers::start(WorkerOptions {
            engine,
            token,
            zk,
            name: format!("serve-{}", std::process::id()),
            daemons: daemons
                .iter()
                .filter(|(_, s)| s.enabled)
                .map(|(k, s)| (k, s.tasks))
                .collect(),
            steps,
        })
    }
}

fn sim_settings(duration_ms: Option<&str>, failure_rate: Option<&str>) -> Result<SimSettings> {
    let duration = match duration_ms {
        Some(d) => Duration::from_millis(d.parse().context("the step duration in ms")?),
        None => Duration::ZERO,
    };
    let failure_rate: f64 = match failure_rate {
        Some(r) => r.parse().context("the failure rate")?,
        None => 0.0,
    };
    if !(0.0..=1.0).contains(&failure_rate) {
        bail!("the failure rate {failure_rate} is outside 0-1");
    }
    Ok(SimSettings {
        duration,
        failure_rate,
    })
}

/// `ingest worker`: the daemons as a separate process, reporting to a
/// server over HTTP.
#[derive(Debug, Clone, Args)]
pub struct WorkerArgs {
    /// The server's base URL: the global `--engine URL` (or INGEST_ENGINE).
    #[arg(skip)]
    pub engine: String,
    /// The ZooKeeper connect string.
    #[arg(long, env = "INGEST_ZK", value_name = "HOSTS")]
    pub zk: String,
    /// The ZooKeeper root the queue lives under.
    #[arg(long, env = "INGEST_ZK_ROOT", default_value = "/", value_name = "ROOT")]
    pub zk_root: String,
    /// The ZooKeeper session timeout, in seconds.
    #[arg(long, env = "INGEST_ZK_SESSION_TIMEOUT", default_value_t = 6.0)]
    pub zk_session_timeout: f64,
    /// The daemons to run, comma-separated: job states (downloading, processing, …) or batch_pending, batch_reporting, batch_update_reporting, job_pending; NAME=TASKS sets a task count.
    /// (`--states` is the CLI's global lifecycle-file option, hence `--daemons`.)
    #[arg(
        long,
        env = "INGEST_WORKER_DAEMONS",
        value_delimiter = ',',
        required = true,
        value_name = "NAMES"
    )]
    pub daemons: Vec<String>,
    /// A file holding the worker bearer token (or set INGEST_WORKER_TOKEN).
    #[arg(long, env = "INGEST_WORKER_TOKEN_FILE", value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// This worker's name in reports [default: worker-PID].
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,
    /// How long each simulated step takes, in milliseconds.
    #[arg(long, default_value_t = 0)]
    pub step_ms: u64,
    /// The probability (0-1) that a simulated step fails.
    #[arg(long, default_value_t = 0.0)]
    pub failure_rate: f64,
    /// The simulation's seed.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Working-storage use (percent) above which provisioning holds jobs back.
    #[arg(long, default_value_t = crate::config::DEFAULT_PROVISIONING_THRESHOLD)]
    pub provisioning_threshold: f64,
    /// The working storage measured by provisioning (and, with real steps, where jobs download: DIR/BID/JID).
    #[arg(long, default_value = ".", value_name = "DIR")]
    pub working_storage: PathBuf,
    /// simulate (zero-work steps for load tests and demos) or real (download, identify, store, record, notify).
    #[arg(long, env = "INGEST_WORKER_STEPS", default_value = "simulate", value_parser = ["simulate", "real"])]
    pub steps: String,
    /// The collection profiles directory (callback URLs and report recipients for real steps).
    #[arg(long, env = "INGEST_PROFILES_DIR", value_name = "DIR")]
    pub profiles_dir: Option<PathBuf>,
    /// The real steps' options.
    #[command(flatten)]
    pub real: real::RealArgs,
}

/// Parses `--daemons`: names, each optionally `=TASKS`.
///
/// # Errors
/// An unknown name or a bad task count.
pub fn parse_daemons(names: &[String]) -> Result<Vec<(DaemonKind, u32)>> {
    names
        .iter()
        .map(|n| n.trim())
        .filter(|n| !n.is_empty())
        .map(|n| {
            let (name, tasks) = match n.split_once('=') {
                Some((name, t)) => (
                    name,
                    t.parse::<u32>()
                        .with_context(|| format!("{n}: the task count"))?,
                ),
                None => (n, 1),
            };
            let lower = name.to_ascii_lowercase();
            let kind = DaemonKind::from_name(&lower)
                .or_else(|| {
                    lower
                        .parse::<JobState>()
                        .ok()
                        .and_then(DaemonKind::for_job_state)
                })
                .with_context(|| {
                    format!(
                        "{name}: not a daemon; use one of {}",
                        DaemonKind::ALL.map(DaemonKind::name).join(", ")
                    )
                })?;
            if tasks == 0 || tasks > crate::config::MAX_DAEMON_TASKS {
                bail!(
                    "{n}: the task count is outside 1-{}",
                    crate::config::MAX_DAEMON_TASKS
                );
            }
            Ok((kind, tasks))
        })
        .collect()
}

/// Runs `ingest worker` until SIGTERM or Ctrl-C.
///
/// # Errors
/// Bad arguments, a missing token, or no runtime.
pub fn run(args: WorkerArgs) -> Result<i32> {
    let daemons = parse_daemons(&args.daemons)?;
    if daemons.is_empty() {
        bail!("--daemons names no daemon");
    }
    let token = match &args.token_file {
        Some(f) => std::fs::read_to_string(f)
            .with_context(|| format!("cannot read the worker token file {}", f.display()))?
            .trim()
            .to_string(),
        None => std::env::var("INGEST_WORKER_TOKEN")
            .context("set --token-file, INGEST_WORKER_TOKEN_FILE or INGEST_WORKER_TOKEN")?,
    };
    let sim = SimSettings {
        duration: Duration::from_millis(args.step_ms),
        failure_rate: args.failure_rate,
    };
    if !(0.0..=1.0).contains(&args.failure_rate) {
        bail!("--failure-rate {} is outside 0-1", args.failure_rate);
    }
    let mut zk = ZkConfig::new(args.zk.clone()).with_root(args.zk_root.clone());
    zk.session_timeout = Duration::from_secs_f64(args.zk_session_timeout.max(0.1));
    zk.validate().map_err(anyhow::Error::msg)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let profiles = match &args.profiles_dir {
        Some(dir) => crate::config::Profiles::load(dir)
            .with_context(|| format!("the profiles directory {}", dir.display()))?,
        None => crate::config::Profiles::unrestricted(),
    };
    runtime.block_on(async move {
        let steps = if args.steps == "real" {
            real::steps(
                real::RealConfig {
                    work_dir: args.working_storage.clone(),
                    args: args.real.clone(),
                    profiles,
                },
                Arc::new(DfProbe),
                args.provisioning_threshold,
            )?
        } else {
            Steps::simulated(
                sim,
                args.seed,
                Arc::new(DfProbe),
                args.provisioning_threshold,
                args.working_storage.clone(),
            )
        };
        let workers = Workers::start(WorkerOptions {
            engine: args.engine.clone(),
            token,
            zk,
            name: args
                .name
                .clone()
                .unwrap_or_else(|| format!("worker-{}", std::process::id())),
            daemons,
            steps,
        })?;
        println!("ingest worker started");
        let stopping = Arc::new(std::sync::atomic::AtomicBool::new(false));
        crate::zkcmd::shutdown_signal(stopping).await;
        workers.shutdown().await;
        Ok(0)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn daemon_names_parse() {
        let parsed = parse_daemons(&[
            "downloading".into(),
            "Processing=3".into(),
            "batch_pending".into(),
        ])
        .expect("parse");
        assert_eq!(
            parsed,
            [
                (DaemonKind::Downloading, 1),
                (DaemonKind::Processing, 3),
                (DaemonKind::BatchPending, 1)
            ]
        );
        assert!(parse_daemons(&["nope".into()]).is_err());
        assert!(parse_daemons(&["notify=0".into()]).is_err());
    }

    #[test]
    fn simulation_settings_parse() {
        let s = sim_settings(Some("5"), Some("0.25")).expect("parse");
        assert_eq!(s.duration, Duration::from_millis(5));
        assert!(sim_settings(None, Some("2")).is_err());
    }
}
