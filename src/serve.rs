//! `ingest serve`: the engine, the projector, the HTTP API and metrics in one
//! process.
//!
//! Start-up order: the engine opens the log (sled allows one process per data
//! directory, so this process is the single writer) and starts its writer
//! thread; when ZooKeeper is configured, the live sink follows the log's
//! durable tail and a ZooKeeper client answers the API's fencing questions
//! (who holds `/jobs/JID/lock`); then the API listens. On SIGTERM or Ctrl-C
//! the API stops taking requests and finishes those in flight, the sink
//! finishes its transaction in flight, and the writer answers every queued
//! command before the log is closed.
//!
//! With ZooKeeper configured and `INGEST_WORKER_STEPS=simulate` set, the
//! enabled worker daemons ([`crate::worker`]) also run here, reporting to
//! this server's API over loopback with the worker token like remote
//! workers; on shutdown they stop (releasing their locks) before the API
//! stops taking requests.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use ingest_projections::{RunMode, Sink, SinkConfig, ZkConfig};
use tokio::sync::{watch, Mutex};
use zookeeper_client as zk;

use crate::api::{self, ApiConfig, LockCheckError, LockChecker, LockFuture, NoLocks};
use crate::config::ServeConfig;
use crate::engine::{Engine, EngineConfig};
use crate::metrics::Metrics;
use crate::service::EngineService;

/// Runs the server until SIGTERM or Ctrl-C.
///
/// # Errors
/// When the data directory, the lifecycle, the profiles or the listen
/// address cannot be used; each message names what was wrong.
pub fn run(config: ServeConfig) -> Result<i32> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(serve(config))
}

async fn serve(config: ServeConfig) -> Result<i32> {
    let lifecycle = config.lifecycle()?;
    let profiles = config.profiles()?;
    let profiles_for_workers = profiles.clone();
    let mut engine_config = EngineConfig::new(&config.data_dir);
    engine_config.lifecycle = lifecycle;
    let engine = Engine::open(engine_config)
        .with_context(|| format!("cannot open the engine in {}", config.data_dir.display()))?;
    tracing::info!(
        data_dir = %config.data_dir.display(),
        events = engine.startup.events,
        fold_ms = engine.startup.elapsed.as_millis() as u64,
        "engine opened"
    );
    let service = EngineService::start(engine);
    let (inventory, minter) = objects(&service.handle(), &config)?;
    let handle = service.handle();
    let metrics = Arc::new(Metrics::new(handle.clone()));

    let stopping = Arc::new(AtomicBool::new(false));
    let (stop_tx, stop_rx) = watch::channel(false);
    let stopped = move |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };

    let zk_for_api = config.zookeeper.hosts.as_ref().map(|hosts| {
        let mut zk = ZkConfig::new(hosts.clone()).with_root(config.zookeeper.root.clone());
        zk.session_timeout = config.zookeeper.session_timeout;
        zk
    });
    let (locks, sink_task): (Arc<dyn LockChecker>, _) = match &config.zookeeper.hosts {
        None => {
            tracing::warn!("no ZooKeeper configured: nothing is projected and every fenced worker report is refused");
            (Arc::new(NoLocks), None)
        }
        Some(hosts) => {
            let mut zk_config =
                ZkConfig::new(hosts.clone()).with_root(config.zookeeper.root.clone());
            zk_config.session_timeout = config.zookeeper.session_timeout;
            let identity = format!(
                "ingest serve {} on {}",
                std::process::id(),
                config.data_dir.display()
            );
            let sink = Sink::new(
                Arc::clone(handle.log()),
                SinkConfig::new(zk_config.clone(), identity),
            )?;
            metrics.attach_projector(sink.status());
            let rx = stop_rx.clone();
            let task = tokio::spawn(async move { sink.run(RunMode::Follow, stopped(rx)).await });
            let checker = ZkLocks::new(zk_config, Arc::clone(&metrics));
            (Arc::new(checker) as Arc<dyn LockChecker>, Some(task))
        }
    };

    let router = api::router(ApiConfig {
        handle: handle.clone(),
        tokens: config.tokens.clone(),
        profiles,
        locks,
        metrics: Arc::clone(&metrics),
        max_body_bytes: config.max_body_bytes,
        zookeeper: zk_for_api,
        inventory: Some(inventory),
        minter: Some(minter),
    });
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("cannot listen on {}", config.listen))?;
    let local = listener
        .local_addr()
        .context("cannot read the listening address")?;
    // One line a supervisor or a test can wait for.
    println!("ingest serve listening on http://{local}");
    tracing::info!(%local, "listening");
    // Where a CLI that finds the data directory locked is told to go.
    let server_file = config.data_dir.join(crate::remote::SERVER_FILE);
    let record = crate::remote::ServerFile {
        pid: std::process::id(),
        url: format!("http://{local}"),
    };
    if let Err(e) = serde_json::to_vec(&record)
        .map_err(std::io::Error::other)
        .and_then(|b| std::fs::write(&server_file, b))
    {
        tracing::warn!(path = %server_file.display(), error = %e, "cannot record the server's address");
    }

    let signal = {
        let stopping = Arc::clone(&stopping);
        async move {
            crate::zkcmd::shutdown_signal(stopping).await;
            let _ = stop_tx.send(true);
        }
    };
    tokio::spawn(signal);
    // The in-process worker daemons: stopped before the API's shutdown starts.
    let workers = match (
        crate::worker::InProcess::from_env()?,
        &config.zookeeper.hosts,
    ) {
        (Some(in_process), Some(hosts)) => {
            let mut zk_config =
                ZkConfig::new(hosts.clone()).with_root(config.zookeeper.root.clone());
            zk_config.session_timeout = config.zookeeper.session_timeout;
            let token = config.tokens.worker.expose().to_string();
            Some(in_process.start(
                format!("http://{local}"),
                token,
                zk_config,
                &config.daemons,
                &config.provisioning,
                (&config.real, &profiles_for_workers),
            )?)
        }
        _ => None,
    };
    let api_stop = {
        let rx = stop_rx.clone();
        async move {
            stopped(rx).await;
            if let Some(w) = workers {
                w.shutdown().await;
            }
        }
    };
    api::serve(listener, router, api_stop)
        .await
        .context("the HTTP server failed")?;
    tracing::info!("the API stopped taking requests");
    if let Some(task) = sink_task {
        match task.await {
            Ok(Ok(report)) => tracing::info!(?report, "the projector stopped"),
            Ok(Err(e)) => tracing::error!(error = %e, "the projector had stopped with an error"),
            Err(e) => tracing::error!(error = %e, "the projector task failed"),
        }
    }
    service.shutdown().await;
    if crate::remote::server_file(&config.data_dir).is_some_and(|s| s.pid == std::process::id()) {
        let _ = std::fs::remove_file(&server_file);
    }
    tracing::info!("stopped");
    Ok(0)
}

/// The blade length of minted arks: 29^8 (about 5 * 10^11) names per shoulder.
const MINTED_BLADE_LEN: usize = 8;

/// The inventory and the ark minter, in trees beside the log.
fn objects(
    handle: &crate::service::EngineHandle,
    config: &ServeConfig,
) -> Result<(ingest_steps::inventory::Inventory, crate::ezid::ArkMinter)> {
    let log = handle.log();
    let inventory = ingest_steps::inventory::Inventory::new(
        log.side_tree("inventory")
            .context("cannot open the inventory")?,
    );
    let minter = match &config.ezid {
        Some(settings) => crate::ezid::ArkMinter::Ezid(
            crate::ezid::Ezid::new(settings.clone()).context("the EZID settings")?,
        ),
        None => {
            let (naan, shoulder) = &config.minter;
            crate::ezid::ArkMinter::Noid(
                ingest_steps::noid::Minter::open(
                    log.side_tree("minter").context("cannot open the minter")?,
                    naan,
                    shoulder,
                    MINTED_BLADE_LEN,
                )
                .with_context(|| format!("the ark minter (--naan {naan} --shoulder {shoulder})"))?,
            )
        }
    };
    tracing::info!(source = %minter.describe(), "arks");
    Ok((inventory, minter))
}

/// Answers "who holds this lock node?" from ZooKeeper, for fencing worker
/// reports. The session is made on first use and again after it expires.
struct ZkLocks {
    config: ZkConfig,
    client: Mutex<Option<zk::Client>>,
    metrics: Arc<Metrics>,
}

impl ZkLocks {
    fn new(config: ZkConfig, metrics: Arc<Metrics>) -> ZkLocks {
        ZkLocks {
            config,
            client: Mutex::new(None),
            metrics,
        }
    }

    async fn holder_of(&self, path: &str) -> Result<Option<i64>, LockCheckError> {
        let fail = |message: String| LockCheckError {
            path: path.to_string(),
            message,
        };
        let mut guard = self.client.lock().await;
        if guard.as_ref().is_none_or(|c| c.state().is_terminated()) {
            let client = ingest_projections::zk::connect(&self.config)
                .await
                .map_err(|e| fail(e.to_string()))?;
            self.metrics.set_zookeeper_session(client.state());
            *guard = Some(client);
        }
        let Some(client) = guard.as_ref() else {
            return Err(fail("no ZooKeeper session".into()));
        };
        let checked = tokio::time::timeout(self.deadline(), client.check_stat(path)).await;
        self.metrics.set_zookeeper_session(client.state());
        match checked {
            Ok(Ok(stat)) => Ok(stat.map(|s| s.ephemeral_owner)),
            Ok(Err(e)) => {
                if matches!(e, zk::Error::SessionExpired | zk::Error::ClientClosed) {
                    *guard = None;
                }
                Err(fail(e.to_string()))
            }
            Err(_) => Err(fail(format!("no answer within {:?}", self.deadline()))),
        }
    }

    fn deadline(&self) -> Duration {
        self.config.request_timeout
    }
}

impl LockChecker for ZkLocks {
    fn holder<'a>(&'a self, path: &'a str) -> LockFuture<'a> {
        Box::pin(self.holder_of(path))
    }
}
