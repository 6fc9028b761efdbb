//! The worker daemons, run in `ingest serve` or as `ingest worker`.
//!
//! Each enabled daemon ([`DaemonKind`]) runs `tasks` tasks. A task lists its
//! queue in ZooKeeper (`/jobs/states/<state>` sorted by `PP-JID`, pending
//! batches FIFO by bid, reporting batches by status), picks an item (job
//! tasks start at a random one among the head so that workers do not all
//! race for the first), takes the item's EPHEMERAL lock node with this
//! worker's session (`NodeExists`: the next item), re-reads the item's
//! status, runs the [`step::Step`] of the state and reports through the API
//! ([`ingest_client::Client`], the worker token, `session_id` = this
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
//! Steps are simulated ([`step::Simulate`]) or real ([`real`]). In
//! `ingest serve` the daemons run only with `--steps simulate` or
//! `--steps real` (see [`InProcess::from_settings`]): a server must not
//! complete jobs with fake work because its configuration enables daemons
//! by default.
//!
//! **Architecture invariant:** this crate reaches the engine only through
//! the HTTP API (`ingest-client`); it depends on neither `ingest-engine` nor
//! `ingest-server`.

pub mod daemon;
pub mod real;
pub mod step;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use ingest_config::{StepsArgs, StepsKind, ZkArgs};
use ingest_projections::ZkConfig;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use daemon::{Session, Shared, Stats};
use ingest_client::Client as EngineClient;
use ingest_config::{DaemonKind, Daemons, Provisioning};
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

/// The in-process daemons of `ingest serve`, from its `--steps` settings:
/// `--steps simulate` or `--steps real` turns them on (`INGEST_WORKER_STEPS`).
#[derive(Debug, Clone)]
pub struct InProcess {
    /// How the simulated steps behave.
    pub sim: SimSettings,
    /// The simulation's seed.
    pub seed: Option<u64>,
    /// The real steps instead of simulated ones.
    pub real: bool,
}

impl InProcess {
    /// `Some` when the settings ask for in-process workers.
    ///
    /// # Errors
    /// A simulation setting out of range.
    pub fn from_settings(steps: &StepsArgs) -> Result<Option<InProcess>> {
        let real = match steps.kind_or(StepsKind::None) {
            StepsKind::None => return Ok(None),
            StepsKind::Simulate => false,
            StepsKind::Real => true,
        };
        steps.check().map_err(anyhow::Error::msg)?;
        Ok(Some(InProcess {
            sim: sim_settings(steps),
            seed: steps.seed,
            real,
        }))
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
        real: (&real::RealArgs, &ingest_config::Profiles),
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

fn sim_settings(steps: &StepsArgs) -> SimSettings {
    SimSettings {
        duration: Duration::from_millis(steps.step_ms.unwrap_or(0)),
        failure_rate: steps.failure_rate.unwrap_or(0.0),
    }
}

/// `ingest worker`: the daemons as a separate process, reporting to a
/// server over HTTP.
#[derive(Debug, Clone, Args)]
pub struct WorkerArgs {
    /// The server's base URL: the global `--engine URL` (or INGEST_ENGINE).
    #[arg(skip)]
    pub engine: String,
    /// Where ZooKeeper is.
    #[command(flatten)]
    pub zookeeper: ZkArgs,
    /// The daemons to run, comma-separated, as `serve --daemons` takes them: NAME, NAME=on, NAME=off or NAME=TASKS; names are job states (downloading, processing, …) or batch_pending, batch_reporting, batch_update_reporting, job_pending.
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
    /// Working-storage use (percent) above which provisioning holds jobs back.
    #[arg(long, default_value_t = ingest_config::DEFAULT_PROVISIONING_THRESHOLD)]
    pub provisioning_threshold: f64,
    /// The working storage measured by provisioning (and, with real steps, where jobs download: DIR/BID/JID).
    #[arg(long, default_value = ".", value_name = "DIR")]
    pub working_storage: PathBuf,
    /// Which steps run (simulate by default).
    #[command(flatten)]
    pub steps: StepsArgs,
    /// The collection profiles directory (callback URLs and report recipients for real steps).
    #[arg(long, env = "INGEST_PROFILES_DIR", value_name = "DIR")]
    pub profiles_dir: Option<PathBuf>,
    /// The real steps' options.
    #[command(flatten)]
    pub real: real::RealArgs,
}

/// Parses `--daemons`: `NAME[=off|on|TASKS]`, the grammar `serve` uses
/// ([`ingest_config::parse_daemon`]); the daemons switched on, with their
/// task counts.
///
/// # Errors
/// An unknown name or a bad task count.
pub fn parse_daemons(names: &[String]) -> Result<Vec<(DaemonKind, u32)>> {
    let mut out = Vec::new();
    for n in names.iter().map(|n| n.trim()).filter(|n| !n.is_empty()) {
        let (kind, settings) = ingest_config::parse_daemon(n).map_err(anyhow::Error::msg)?;
        out.retain(|(k, _)| *k != kind);
        if settings.enabled {
            out.push((kind, settings.tasks));
        }
    }
    Ok(out)
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
    args.steps.check().map_err(anyhow::Error::msg)?;
    let sim = sim_settings(&args.steps);
    let zk = args.zookeeper.require()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let profiles = match &args.profiles_dir {
        Some(dir) => ingest_config::Profiles::load(dir)
            .with_context(|| format!("the profiles directory {}", dir.display()))?,
        None => ingest_config::Profiles::unrestricted(),
    };
    runtime.block_on(async move {
        let steps = if args.steps.kind_or(StepsKind::Simulate) == StepsKind::Real {
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
                args.steps.seed,
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
        ingest_config::shutdown::signal().await;
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
    fn simulation_settings_come_from_the_steps_options() {
        let steps = StepsArgs {
            steps: Some(StepsKind::Simulate),
            step_ms: Some(5),
            failure_rate: Some(0.25),
            seed: None,
        };
        let s = sim_settings(&steps);
        assert_eq!(s.duration, Duration::from_millis(5));
        assert!(InProcess::from_settings(&steps).expect("valid").is_some());
        let bad = StepsArgs {
            failure_rate: Some(2.0),
            ..steps
        };
        assert!(InProcess::from_settings(&bad).is_err());
        assert!(InProcess::from_settings(&StepsArgs::default())
            .expect("valid")
            .is_none());
    }
}
