//! The worker daemons, run in `ingest serve` or as `ingest worker`.
//!
//! Each enabled daemon ([`DaemonKind`]) runs `tasks` tasks on the listing
//! of its queue, which ONE lister per queue keeps (a ZooKeeper child watch,
//! debounced), so adding tasks or workers does not multiply the listings.
//! A task picks an item no task of this worker holds or backs off from
//! (job tasks among the head at random, so workers do not all race for the
//! first; batches oldest first), takes the item's EPHEMERAL lock node, whose
//! data holds the digest of a fresh random secret
//! ([`ingest_protocol::fence`]), re-reads the item's status, runs the
//! [`step::Step`] of the state and reports through the API
//! ([`ingest_client::Client`], the worker token, `session_id` = this
//! session, the secret in the `ingest-fence` header). The API fences every
//! report on the lock node: a 409 (`lock_not_held`, `stale_report`) discards
//! the result. An item that cannot be taken (locked elsewhere, refused,
//! waiting) is backed off from by itself; the task goes on with the next.
//!
//! A worker that runs the daemon of the job's next state keeps the lock and
//! goes on at once (step chaining); when the chain ends the lock is kept
//! until the projection shows the job's new state (at most a few seconds),
//! so that no worker takes the item again from a projection that lags.
//!
//! While the session is disconnected no new work starts; when it expires
//! the work in hand is dropped and a new session is made.
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

pub mod access;
pub mod bulk;
pub mod daemon;
pub mod metrics;
pub mod real;
pub mod retry;
pub mod session;
pub mod step;

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use ingest_config::{StepsArgs, StepsKind};
use ingest_projections::ZkConfig;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use daemon::{Shared, Stats, Target};
use ingest_client::Client as EngineClient;
use ingest_config::{DaemonKind, Daemons, Provisioning};
use session::Session;
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
    stop: CancellationToken,
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
        Workers::start_observed(options, None)
    }

    /// As [`Workers::start`], counting every call to the API into `metrics`.
    ///
    /// # Errors
    /// When the HTTP client cannot be built.
    pub fn start_observed(
        options: WorkerOptions,
        metrics: Option<Arc<metrics::WorkerMetrics>>,
    ) -> Result<Workers> {
        let mut engine = EngineClient::new(&options.engine, &options.token)?;
        if let Some(m) = &metrics {
            engine = engine.observed(Arc::clone(m) as Arc<dyn ingest_client::Observer>);
        }
        let faults = options.steps.faults.clone();
        let kinds: Vec<(DaemonKind, u32)> = options
            .daemons
            .iter()
            .map(|(k, n)| (*k, (*n).max(1)))
            .collect();
        let shared = Arc::new(Shared::new(
            options.name,
            Arc::new(Session::new(options.zk)),
            engine,
            options.steps,
            &kinds,
            Rng::from_entropy(),
        ));
        let stats = Arc::clone(&shared.stats);
        let stop = CancellationToken::new();
        let mut tasks = Vec::new();
        // One lister per queue, whatever the number of its tasks.
        let mut listings: std::collections::HashMap<Target, daemon::Listing> =
            std::collections::HashMap::new();
        for (kind, n) in options.daemons {
            let Some(target) = Target::of(kind) else {
                // The access queues: one loop per task, each listing its queue.
                let queue = access::queue_of(kind);
                for task in 0..n.max(1) {
                    tasks.push(tokio::spawn(access::run(
                        Arc::clone(&shared),
                        queue,
                        task,
                        stop.child_token(),
                    )));
                }
                continue;
            };
            let listing = match listings.get(&target) {
                Some(l) => l.clone(),
                None => {
                    let (l, lister) =
                        daemon::start_lister(Arc::clone(&shared), target, stop.child_token());
                    tasks.push(lister);
                    listings.insert(target, l.clone());
                    l
                }
            };
            for task in 0..n.max(1) {
                tasks.push(tokio::spawn(daemon::run_task(
                    Arc::clone(&shared),
                    kind,
                    task,
                    listing.clone(),
                    stop.child_token(),
                )));
            }
            if let Target::Jobs(state) = target {
                tasks.push(tokio::spawn(daemon::run_spare(
                    Arc::clone(&shared),
                    state,
                    stop.child_token(),
                )));
            }
        }
        if let Some(janitor) = shared.steps.janitor.clone() {
            tasks.push(tokio::spawn(
                janitor.run(Arc::clone(&shared.session), stop.child_token()),
            ));
        }
        tracing::info!(worker = %shared.name, tasks = tasks.len(), "worker daemons started");
        if let Some(m) = &metrics {
            m.set_tasks(tasks.len());
            m.attach_dispatch(Arc::clone(&stats));
        }
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
        self.stop.cancel();
        let all = futures_join(self.tasks);
        if tokio::time::timeout(SHUTDOWN_GRACE, all).await.is_err() {
            tracing::warn!("worker daemons did not stop in time; their locks go with the session");
        }
        let n = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
        let s = &self.stats;
        tracing::info!(
            accepted = n(&s.accepted),
            refused = n(&s.refused),
            job_locks = n(&s.job_locks),
            chained = n(&s.chained),
            handoffs = n(&s.handoffs),
            lock_busy = n(&s.lock_busy),
            listings = n(&s.listings),
            "worker daemons stopped"
        );
    }
}

async fn futures_join(tasks: Vec<JoinHandle<()>>) {
    for t in tasks {
        if let Err(e) = t.await {
            tracing::error!(error = %ingest_protocol::bounded(&e), "a daemon task failed");
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
                    args: real::with_content_url(real.0, &engine),
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

pub use ingest_config::{WorkerArgs, WorkerConfig};

/// Runs `ingest worker` until SIGTERM or Ctrl-C.
///
/// # Errors
/// A configuration that cannot be used (naming the key), or no runtime.
pub fn run(args: WorkerArgs) -> Result<i32> {
    let config = args.resolve()?;
    ingest_config::zk::warn_if_open(&config.zk.access);
    let sim = sim_settings(&config.steps);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let profiles = match &config.profiles_dir {
        Some(dir) => ingest_config::Profiles::load(dir)
            .with_context(|| format!("the profiles directory {}", dir.display()))?,
        None => ingest_config::Profiles::unrestricted(),
    };
    runtime.block_on(async move {
        let steps = if config.steps.kind_or(StepsKind::Simulate) == StepsKind::Real {
            real::steps(
                real::RealConfig {
                    work_dir: config.working_storage.clone(),
                    args: real::with_content_url(&config.real, &config.engine),
                    profiles,
                },
                Arc::new(DfProbe),
                config.provisioning_threshold,
            )?
        } else {
            Steps::simulated(
                sim,
                config.steps.seed,
                Arc::new(DfProbe),
                config.provisioning_threshold,
                config.working_storage.clone(),
            )
        };
        let metrics = Arc::new(metrics::WorkerMetrics::new(&config.name));
        let metrics_stop = CancellationToken::new();
        if let Some(addr) = config.metrics_listen {
            let bound = Arc::clone(&metrics)
                .serve(addr, metrics_stop.clone())
                .await?;
            tracing::info!(%bound, "serving the worker's metrics at /metrics");
        }
        let workers = Workers::start_observed(
            WorkerOptions {
                engine: config.engine.clone(),
                token: config.token.expose().to_string(),
                zk: config.zk.clone(),
                name: config.name.clone(),
                daemons: config.daemons.clone(),
                steps,
            },
            Some(metrics),
        )?;
        println!("ingest worker started");
        ingest_config::shutdown::signal().await;
        // A store in flight stops before its commit rather than hold the
        // shutdown for its whole run; its job stays for the next worker.
        ingest_steps::ocfl::stop_stores();
        workers.shutdown().await;
        metrics_stop.cancel();
        Ok(0)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
