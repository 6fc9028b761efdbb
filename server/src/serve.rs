//! `ingest serve`: the engine, the projector, the HTTP API and metrics in one
//! process.
//!
//! Start-up order: the engine opens the log (sled allows one process per data
//! directory, so this process is the single writer) and starts its writer
//! thread; when ZooKeeper is configured, the live sink follows the log's
//! durable tail and a ZooKeeper client answers the API's fencing questions
//! (who holds `/jobs/JID/lock`); then the API listens. On SIGTERM or Ctrl-C
//! the in-process workers stop (releasing their locks), the API stops taking
//! requests and finishes those in flight, the projector is given time to
//! reach the log's head (so that the tree holds every event a stopping
//! worker reported) and stops, and the writer answers every queued command
//! before the log is closed.
//!
//! With ZooKeeper configured and `--steps simulate|real` (or
//! `INGEST_WORKER_STEPS`), the enabled worker daemons (`ingest_worker`) also run here, reporting to
//! this server's API over loopback with the worker token like remote
//! workers; on shutdown they stop (releasing their locks) before the API
//! stops taking requests.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use ingest_projections::{RunMode, Sink, SinkConfig, ZkConfig};
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;
use zookeeper_client as zk;

use crate::api::{self, ApiConfig, LockCheckError, LockChecker, LockFuture, LockHolder, NoLocks};
use crate::metrics::Metrics;
use ingest_config::ServeConfig;
use ingest_engine::engine::{Engine, EngineConfig};
use ingest_engine::service::EngineService;

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
    // Provisioning measures the working storage: a directory that does not
    // exist would hold every job in Provisioning for ever, silently.
    let work = &config.provisioning.working_storage;
    std::fs::create_dir_all(work)
        .with_context(|| format!("cannot create the working storage {}", work.display()))?;
    let profiles_for_workers = profiles.clone();
    let mut engine_config = EngineConfig::new(&config.data_dir);
    engine_config.lifecycle = lifecycle;
    let every = |secs: u64| (secs > 0).then(|| std::time::Duration::from_secs(secs));
    engine_config.snapshots = ingest_engine::snapshot::SnapshotPolicy {
        every_events: config.archive.snapshot_every_events,
        every: every(config.archive.snapshot_every_secs),
        keep: config.archive.snapshots_keep,
    };
    engine_config.log.compression =
        (config.archive.log_compression > 0).then(|| i32::from(config.archive.log_compression));
    engine_config.checkpoints = ingest_engine::engine::CheckpointPolicy {
        key: config.archive.checkpoint_key.clone(),
        every_events: config.archive.checkpoint_every_events,
        every: every(config.archive.checkpoint_every_secs),
    };
    let engine = Engine::open(engine_config)
        .with_context(|| format!("cannot open the engine in {}", config.data_dir.display()))?;
    tracing::info!(
        data_dir = %config.data_dir.display(),
        events = engine.startup.events,
        snapshot = engine.startup.snapshot,
        fold_ms = engine.startup.elapsed.as_millis() as u64,
        log_open_ms = engine.startup.log_open.as_millis() as u64,
        snapshot_decode_ms = engine.startup.snapshot_load.decode.as_millis() as u64,
        startup_ms = engine.startup.total.as_millis() as u64,
        "engine opened"
    );
    let replicated = config.replication.is_replicated();
    if replicated && config.zookeeper.zk_config().is_none() {
        anyhow::bail!(
            "--replicas {} needs ZooKeeper (--zk-hosts): the group elects its leader and replicates its log through it",
            config.replication.replicas
        );
    }
    let service = if replicated {
        EngineService::start_replicated(engine)
    } else {
        EngineService::start(engine)
    };
    let (inventory, minter) = ingest_engine::objects::open(
        service.handle().log(),
        &ingest_engine::objects::MinterSettings {
            naan: config.minter.0.clone(),
            shoulder: config.minter.1.clone(),
            ezid: config.ezid.clone(),
        },
    )?;
    let handle = service.handle();
    let metrics = Arc::new(Metrics::new(handle.clone()));

    // One shutdown: SIGTERM or Ctrl-C cancels the root token; the API, the
    // in-process workers and the projector each watch a child of it.
    let shutdown = ingest_config::shutdown::on_signal();
    let zk_config = config.zookeeper.zk_config();
    let gate = ingest_projections::ProjectorGate::new();
    // Drift repairs asked of the API, made by whichever projector leads.
    let converger = ingest_projections::sink::Converger::new();
    let mut replication_duties: Option<ingest_replication::LeaderDuties> = None;
    let (locks, sink_task): (Arc<dyn LockChecker>, _) = match &zk_config {
        None => {
            tracing::warn!("no ZooKeeper configured: nothing is projected and every fenced worker report is refused");
            (Arc::new(NoLocks), None)
        }
        Some(zk_config) => {
            ingest_config::zk::warn_if_open(&zk_config.access);
            let identity = format!(
                "ingest serve {} on {}",
                std::process::id(),
                config.data_dir.display()
            );
            // A rebuild that died half-way is finished by this projector
            // once it leads, before it projects.
            let resume = Arc::new(ingest_projections::Resume::new(
                Arc::clone(handle.log()),
                ingest_projections::AdminConfig::new(zk_config.clone(), identity.clone()),
            ));
            let start_sink = {
                let handle = handle.clone();
                let foreign_writes = config.foreign_writes;
                let profiles = profiles.clone();
                let (log, zk_config, gate, metrics, converger) = (
                    Arc::clone(handle.log()),
                    zk_config.clone(),
                    gate.clone(),
                    Arc::clone(&metrics),
                    converger.clone(),
                );
                move |stop: CancellationToken| -> Result<tokio::task::JoinHandle<()>> {
                    let mut sink_config = SinkConfig::new(zk_config.clone(), identity.clone());
                    sink_config.gate = gate.clone();
                    sink_config.resume = Some(ingest_projections::Resumer(resume.clone()));
                    let recorder = Arc::new(EngineRecorder {
                        handle: handle.clone(),
                        metrics: Arc::clone(&metrics),
                        profiles: profiles.clone(),
                    });
                    if foreign_writes == ingest_config::ForeignWrites::Adopt {
                        sink_config.adopt =
                            Some(ingest_projections::ForeignAdopter(recorder.clone()));
                    }
                    sink_config.foreign = Some(ingest_projections::ForeignRecorder(recorder));
                    sink_config.converge = Some(converger.clone());
                    let sink = Sink::new(Arc::clone(&log), sink_config)
                        .context("cannot start the projector")?;
                    metrics.attach_projector(sink.status());
                    Ok(tokio::spawn(async move {
                        match sink.run(RunMode::Follow, stop).await {
                            Ok(report) => tracing::info!(?report, "the projector stopped"),
                            Err(e) => {
                                tracing::error!(error = %e, "the projector had stopped with an error")
                            }
                        }
                    }))
                }
            };
            let sink_task = if replicated {
                // Only the leader projects: the replication controller starts
                // the projector when this engine takes over and stops it when
                // it steps down.
                replication_duties = Some(
                    Arc::new(move |stop: CancellationToken| match start_sink(stop) {
                        Ok(task) => task,
                        Err(e) => {
                            tracing::error!(error = %format!("{e:#}"), "cannot start the projector");
                            tokio::spawn(async {})
                        }
                    }) as ingest_replication::LeaderDuties,
                );
                None
            } else {
                // Not a child of the shutdown token: the projector stops last,
                // once what the stopping workers reported is in the tree.
                let stop = CancellationToken::new();
                let task = start_sink(stop.clone())?;
                let status = metrics
                    .projector_status_receiver()
                    .context("the projector's status")?;
                Some((task, stop, status))
            };
            let checker = Arc::new(ZkLocks::new(zk_config.clone(), Arc::clone(&metrics)));
            if config.foreign_writes == ingest_config::ForeignWrites::Adopt {
                handle.share_ids_with(Arc::new(ZkIds(Arc::clone(&checker))));
            }
            (checker as Arc<dyn LockChecker>, sink_task)
        }
    };

    let replication_cell = replicated.then(|| {
        ingest_replication::StatusCell::new(ingest_replication::ReplicaStatus {
            role: ingest_replication::Role::Starting,
            ..ingest_replication::ReplicaStatus::single()
        })
    });
    if let Some(cell) = &replication_cell {
        metrics.attach_replication(cell.clone());
    }
    let deliveries = ingest_worker::real::delivery_dir(&config.real, work);
    metrics.watch_delivery_area(deliveries.clone());
    let router = api::router(ApiConfig {
        handle: handle.clone(),
        tokens: config.tokens.clone(),
        profiles,
        locks,
        metrics: Arc::clone(&metrics),
        max_body_bytes: config.max_body_bytes,
        max_record_bytes: config.max_record_bytes,
        zookeeper: zk_config.clone(),
        projector_gate: zk_config.as_ref().map(|_| gate.clone()),
        inventory: Some(inventory),
        minter: Some(minter),
        outbound: config
            .real
            .outbound_policy()
            .context("the outbound policy (--allow-host, --allow-network)")?,
        pages: Some(crate::ui::pages(config.ui.clone())),
        storage_targets: target_specs(&config.real.storage_targets)?,
        content_nodes: content_nodes(&config.real)?,
        delivery_dir: Some(deliveries),
        replication: replication_cell.clone(),
        listing_items_per_second: config.listing_items_per_second,
        converger: zk_config.as_ref().map(|_| converger.clone()),
    });
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("cannot listen on {}", config.listen))?;
    let local = listener
        .local_addr()
        .context("cannot read the listening address")?;
    let replication_task = match (&replication_cell, replication_duties.take(), &zk_config) {
        (Some(cell), Some(duties), Some(zk_config)) => {
            let id = match &config.replication.engine_id {
                Some(id) => id.clone(),
                None => ingest_replication::engine_id(&config.data_dir)?,
            };
            let url = config
                .replication
                .advertise_url
                .clone()
                .unwrap_or_else(|| format!("http://{local}"));
            let mut rc = ingest_replication::ReplicationConfig::new(zk_config.clone(), id, url);
            rc.max_lag_events = config.replication.max_lag_events;
            rc.max_lag_bytes = config.replication.max_lag_bytes;
            rc.peer_token = Some(config.tokens.admin.expose().to_string());
            let stop = CancellationToken::new();
            let task = tokio::spawn(ingest_replication::run(
                handle.clone(),
                rc,
                cell.clone(),
                duties,
                stop.clone(),
            ));
            Some((task, stop))
        }
        _ => None,
    };
    // One line a supervisor or a test can wait for.
    println!("ingest serve listening on http://{local}");
    tracing::info!(%local, "listening");
    // Where a CLI that finds the data directory locked is told to go.
    let server_file = config
        .data_dir
        .join(ingest_config::server_file::SERVER_FILE);
    let record = ingest_config::server_file::ServerFile {
        pid: std::process::id(),
        url: format!("http://{local}"),
    };
    if let Err(e) = serde_json::to_vec(&record)
        .map_err(std::io::Error::other)
        .and_then(|b| std::fs::write(&server_file, b))
    {
        tracing::warn!(path = %server_file.display(), error = %e, "cannot record the server's address");
    }

    // The in-process worker daemons: stopped before the API's shutdown starts.
    let workers = match (
        ingest_worker::InProcess::from_settings(&config.steps)?,
        &zk_config,
    ) {
        (Some(in_process), Some(zk_config)) => {
            let token = config.tokens.worker.expose().to_string();
            Some(in_process.start(
                format!("http://{local}"),
                token,
                zk_config.clone(),
                &config.daemons,
                &config.provisioning,
                (&config.real, &profiles_for_workers),
            )?)
        }
        _ => None,
    };
    let api_stop = {
        let stop = shutdown.clone();
        async move {
            stop.cancelled().await;
            if let Some(w) = workers {
                // As `ingest worker` does: a store in flight stops before
                // its commit; its job stays for the next worker.
                ingest_steps::ocfl::stop_stores();
                w.shutdown().await;
            }
        }
    };
    let limits = api::Limits {
        header_read_timeout: config.header_read_timeout,
        max_connections: config.max_connections,
        max_connections_per_client: config.max_connections_per_client,
    };
    // A writer stopped by a storage error (a full disk) cannot go on in this
    // process: sled keeps its first I/O error for the life of the database.
    // Once the data directory takes writes again, the server starts itself
    // anew (the same process, re-executed), which reopens the log at its
    // durable head; until then it serves reads and refuses commands.
    tokio::spawn(restart_when_writable(
        handle.clone(),
        config.data_dir.clone(),
        shutdown.clone(),
    ));
    api::serve(listener, router, limits, api_stop)
        .await
        .context("the HTTP server failed")?;
    tracing::info!("the API stopped taking requests");
    if let Some((task, stop)) = replication_task {
        // A leader steps down (stopping its projector); the next leader
        // projects what this one did not.
        stop.cancel();
        let _ = task.await;
    }
    if let Some((task, stop, status)) = sink_task {
        drain_projector(handle.log().head().0, status).await;
        stop.cancel();
        if let Err(e) = task.await {
            tracing::error!(error = %e, "the projector task failed");
        }
    }
    service.shutdown().await;
    if ingest_config::server_file::server_file(&config.data_dir)
        .is_some_and(|s| s.pid == std::process::id())
    {
        let _ = std::fs::remove_file(&server_file);
    }
    tracing::info!("stopped");
    Ok(0)
}

/// Answers "who holds this lock node?" from ZooKeeper, for fencing worker
/// reports. The session is made on first use and again after it expires.
struct ZkLocks {
    config: ZkConfig,
    client: Mutex<Option<zk::Client>>,
    metrics: Arc<Metrics>,
}

/// The longest a stopping server waits for its projector to reach the
/// log's head.
const PROJECTOR_DRAIN: Duration = Duration::from_secs(15);

/// Waits (at most [`PROJECTOR_DRAIN`]) until the projector's checkpoint
/// reaches `head`, the log's head once nothing writes any more, so that a
/// graceful stop leaves a tree that holds every event; says how it went.
async fn drain_projector(
    head: u64,
    mut status: tokio::sync::watch::Receiver<ingest_projections::SinkStatus>,
) {
    let caught_up = tokio::time::timeout(
        PROJECTOR_DRAIN,
        status.wait_for(|s| {
            s.checkpoint >= head || matches!(s.state, ingest_projections::SinkState::Stopped(_))
        }),
    )
    .await
    .map(|r| r.map(|s| s.checkpoint));
    let at = status.borrow().checkpoint;
    match caught_up {
        Ok(Ok(_)) if at >= head => tracing::info!(head, "the projector reached the log's head"),
        _ => tracing::warn!(
            head,
            checkpoint = at,
            behind = head.saturating_sub(at),
            "stopping with the projector behind the log's head; the next start projects the rest"
        ),
    }
}

impl ZkLocks {
    fn new(config: ZkConfig, metrics: Arc<Metrics>) -> ZkLocks {
        ZkLocks {
            config,
            client: Mutex::new(None),
            metrics,
        }
    }

    /// The shared session, made on first use and again once it ended.
    async fn session(&self) -> Result<zk::Client, ingest_projections::zk::ZkError> {
        // Held only to find or make the session, never across a read:
        // every fenced report checks a lock here, and one read at a
        // time made the checks a queue (13 ms of each report's 18 ms
        // under `tools/load --mode real`).
        let mut guard = self.client.lock().await;
        match guard.as_ref() {
            Some(c) if !c.state().is_terminated() => Ok(c.clone()),
            _ => {
                let client = match ingest_projections::zk::connect(&self.config).await {
                    Ok(client) => client,
                    Err(e) => {
                        self.metrics.zookeeper_unreachable();
                        return Err(e);
                    }
                };
                // Every scrape reads the session's state from now on:
                // before, the gauge changed only when a lock check ran,
                // so it said SyncConnected for as long as an outage
                // kept workers idle.
                self.metrics
                    .follow_zookeeper_session(client.state_watcher());
                *guard = Some(client.clone());
                Ok(client)
            }
        }
    }

    async fn holder_of(&self, path: &str) -> Result<Option<LockHolder>, LockCheckError> {
        let fail = |message: String| LockCheckError {
            path: path.to_string(),
            message,
        };
        let client = self.session().await.map_err(|e| fail(e.to_string()))?;
        let checked = tokio::time::timeout(self.deadline(), client.get_data(path)).await;
        self.metrics.set_zookeeper_session(client.state());
        match checked {
            Ok(Ok((data, stat))) => Ok(Some(LockHolder {
                session: stat.ephemeral_owner,
                data,
            })),
            Ok(Err(zk::Error::NoNode)) => Ok(None),
            Ok(Err(e)) => {
                if matches!(e, zk::Error::SessionExpired | zk::Error::ClientClosed) {
                    let mut guard = self.client.lock().await;
                    // Forget this session, not one another check made since.
                    if guard
                        .as_ref()
                        .is_some_and(|c| c.session_id() == client.session_id())
                    {
                        *guard = None;
                    }
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

/// Adoption mode: the ids of new batches and jobs, reserved from
/// ZooKeeper's sequential counters (`ingest_projections::ids`) through the
/// lock checker's session, so that mrt-zk's `createBatch` and `createJob`
/// and the engine never take each other's ids.
struct ZkIds(Arc<ZkLocks>);

impl ingest_engine::service::IdSource for ZkIds {
    fn reserve(
        &self,
        kind: ingest_projections::ids::IdKind,
        n: usize,
        floor: u64,
    ) -> std::pin::Pin<
        Box<
            dyn std::future::Future<Output = Result<Vec<u64>, ingest_projections::ids::IdError>>
                + Send
                + '_,
        >,
    > {
        Box::pin(async move {
            use ingest_projections::ids::IdError;
            let client = self.0.session().await.map_err(IdError::Zk)?;
            let config = &self.0.config;
            ingest_projections::ids::reserve(
                &client,
                &config.access,
                config.request_timeout,
                kind,
                n,
                floor,
            )
            .await
        })
    }
}

/// The storage targets of `--storage-target` with their node ids
/// (`--storage-node-id`), which `GET /content/{node}/…` serves.
///
/// # Errors
/// A malformed target or node id spec, naming it.
pub fn content_nodes(real: &ingest_config::RealArgs) -> Result<Vec<api::ContentNode>> {
    let ids =
        ingest_worker::real::store::target_node_ids(&real.storage_targets, &real.storage_node_ids)?;
    Ok(target_specs(&real.storage_targets)?
        .into_iter()
        .zip(ids)
        .map(|(target, (_, node_id))| api::ContentNode { node_id, target })
        .collect())
}

/// The `NAME=DIR` storage targets, as the consistency report reads them.
///
/// # Errors
/// A spec that does not parse, naming it.
pub fn target_specs(specs: &[String]) -> Result<Vec<ingest_engine::consistency::TargetSpec>> {
    specs
        .iter()
        .map(|spec| {
            let (name, dir) = ingest_worker::real::marker::parse_spec(spec)?;
            Ok(ingest_engine::consistency::TargetSpec {
                name: name.to_string(),
                root: std::path::PathBuf::from(dir),
            })
        })
        .collect()
}

/// How often a stopped writer's data directory is tried for writes.
const WRITABLE_PROBE_EVERY: Duration = Duration::from_secs(2);
/// The probe's size: a directory that takes it has room for a group.
const WRITABLE_PROBE_BYTES: usize = 4 * 1024 * 1024;

/// Waits for the writer to stop on its own (not at shutdown); then tries,
/// every [`WRITABLE_PROBE_EVERY`], to write and sync a probe file in the
/// data directory, and once that works re-executes this process with the
/// same arguments (see the call site).
async fn restart_when_writable(
    handle: ingest_engine::service::EngineHandle,
    data_dir: std::path::PathBuf,
    shutdown: CancellationToken,
) {
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(Duration::from_millis(500)) => {}
        }
        if !handle.is_running() {
            break;
        }
    }
    if shutdown.is_cancelled() {
        return;
    }
    tracing::error!(
        data_dir = %data_dir.display(),
        "the engine's writer stopped on a storage error: commands are refused (503) and reads go on; the server starts itself again once the data directory takes writes (checked every {} s)",
        WRITABLE_PROBE_EVERY.as_secs()
    );
    let probe = data_dir.join(".writable-probe");
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(WRITABLE_PROBE_EVERY) => {}
        }
        let path = probe.clone();
        let writable = tokio::task::spawn_blocking(move || {
            use std::io::Write;
            let result = std::fs::File::create(&path).and_then(|mut f| {
                f.write_all(&vec![0u8; WRITABLE_PROBE_BYTES])?;
                f.sync_all()
            });
            let _ = std::fs::remove_file(&path);
            result
        })
        .await;
        match writable {
            Ok(Ok(())) => break,
            Ok(Err(e)) => tracing::debug!(error = %e, "the data directory still refuses writes"),
            Err(e) => tracing::debug!(error = %e, "the write probe failed"),
        }
    }
    tracing::warn!("the data directory takes writes again: the server starts itself anew to reopen the log at its durable head");
    let error = reexec();
    tracing::error!(error = %error, "cannot start the server anew; restart it by hand");
}

/// Replaces this process with a new run of the same program and arguments
/// (open files and sockets close on exec, so the new run reopens the log);
/// returns only on failure.
fn reexec() -> std::io::Error {
    use std::os::unix::process::CommandExt;
    match std::env::current_exe() {
        Ok(exe) => std::process::Command::new(exe)
            .args(std::env::args_os().skip(1))
            .exec(),
        Err(e) => e,
    }
}

/// Records the projector's repairs of nodes another ZooKeeper client
/// changed: counts them and appends a `ForeignChangeRepaired` through the
/// engine, as the engine's own record, without holding up the projector.
struct EngineRecorder {
    handle: ingest_engine::service::EngineHandle,
    metrics: Arc<Metrics>,
    /// The collection profiles a submission must name (as `POST /batches`).
    profiles: ingest_config::Profiles,
}

impl ingest_projections::RecordForeign for EngineRecorder {
    fn record(
        &self,
        stream: ingest_events::StreamId,
        repaired: ingest_events::event::ForeignChangeRepaired,
    ) {
        for n in &repaired.nodes {
            self.metrics.count_foreign_change(n.kind);
        }
        let handle = self.handle.clone();
        tokio::spawn(async move {
            let item = repaired.item.clone();
            let command = ingest_events::command::Command::RecordForeignChange { stream, repaired };
            if let Err(e) = handle
                .execute(ingest_events::Actor::engine(), command)
                .await
            {
                tracing::warn!(item = %item, error = %e, "cannot record the repair of a foreign change");
            }
        });
    }
}

impl EngineRecorder {
    /// Decides and appends an adopted `command` as `actor`: accepted at
    /// the position of its last record, or refused with the engine's reason.
    async fn decided(
        &self,
        actor: ingest_events::Actor,
        command: ingest_events::command::Command,
    ) -> ingest_projections::Adoption {
        match self.handle.execute(actor, command).await {
            Ok(outcome) => ingest_projections::Adoption::Accepted(
                outcome.records.last().map_or(0, |r| r.envelope.position),
            ),
            Err(e) => ingest_projections::Adoption::Refused(e.to_string()),
        }
    }
}

impl ingest_projections::AdoptForeign for EngineRecorder {
    /// Adoption mode: the status another client wrote is decided as the
    /// command an `ingest worker` would send, with the ZooKeeper client as
    /// a worker actor: Pending → Estimating (mrt-zk's acquisition: the lock,
    /// then the status) as the engine's own acquisition (`StartJob`:
    /// refused while the queue is paused or the collection held), any
    /// other move as an explicit status change (`SetJobStatus` to that
    /// state, which the lifecycle judges); any refusal reverts it.
    fn adopt(
        &self,
        change: ingest_projections::ForeignStatus,
    ) -> ingest_projections::AdoptionFuture<'_> {
        Box::pin(async move {
            use ingest_events::command::{Command, Target};
            use ingest_events::JobState;
            let (jid, from, to) = (change.jid, change.from, change.to);
            let command = match (from, to) {
                (JobState::Pending, JobState::Estimating) => Command::StartJob { jid },
                _ => Command::SetJobStatus {
                    jid,
                    target: Target::To(to),
                    message: change.message,
                    priority: None,
                },
            };
            let adoption = self
                .decided(ingest_events::Actor::worker(change.actor), command)
                .await;
            if let ingest_projections::Adoption::Accepted(_) = adoption {
                self.record_counters(jid, from, to, change.written);
            }
            adoption
        })
    }

    /// Adoption mode: a pause or hold lock node another client created or
    /// deleted (mrt-zk's `MerrittLocks`, as Merritt's admin tool uses it)
    /// is the admin command it means, with the ZooKeeper client as an
    /// admin actor; any refusal reverts it.
    fn adopt_lock(
        &self,
        change: ingest_projections::ForeignLock,
    ) -> ingest_projections::AdoptionFuture<'_> {
        Box::pin(async move {
            use ingest_events::command::Command;
            use ingest_projections::LockChange;
            let reason = "a lock node written by a ZooKeeper client (adoption mode)".to_string();
            let command = match change.change {
                LockChange::Queue(true) => Command::PauseQueue { reason },
                LockChange::Queue(false) => Command::ResumeQueue { reason },
                LockChange::AccessQueue(queue, true) => Command::PauseAccessQueue { queue, reason },
                LockChange::AccessQueue(queue, false) => {
                    Command::ResumeAccessQueue { queue, reason }
                }
                LockChange::Collection(profile, true) => {
                    Command::HoldCollection { profile, reason }
                }
                LockChange::Collection(profile, false) => {
                    Command::ReleaseCollection { profile, reason }
                }
            };
            self.decided(ingest_events::Actor::admin(change.actor), command)
                .await
        })
    }

    /// Adoption mode: a batch mrt-zk's `createBatch` made is the submission
    /// it holds, with the id ZooKeeper gave it and the ZooKeeper client as
    /// a depositor actor: read as `POST /batches` reads a body (the same
    /// required fields, a known profile, a manifest that expands), with
    /// the `batchID` uuid (one is made when there is none); any refusal
    /// removes it.
    fn adopt_batch(
        &self,
        batch: ingest_projections::ForeignBatch,
    ) -> ingest_projections::AdoptionFuture<'_> {
        Box::pin(async move {
            use ingest_projections::Adoption;
            match self.foreign_submission(&batch) {
                Ok((uuid, submission)) => {
                    let command = ingest_events::command::Command::WithIds {
                        ids: vec![batch.bid.0],
                        command: Box::new(ingest_events::command::Command::SubmitBatch {
                            uuid,
                            submission,
                        }),
                    };
                    self.decided(ingest_events::Actor::depositor(batch.actor), command)
                        .await
                }
                Err(why) => Adoption::Refused(why.0),
            }
        })
    }

    /// Adoption mode: a batch status another client wrote, as the command
    /// it means ([`EngineRecorder::batch_status_command`]); any refusal
    /// reverts it.
    fn adopt_batch_status(
        &self,
        change: ingest_projections::ForeignBatchStatus,
    ) -> ingest_projections::AdoptionFuture<'_> {
        Box::pin(async move {
            match self.batch_status_command(&change) {
                Ok((actor, command)) => self.decided(actor, command).await,
                Err(why) => ingest_projections::Adoption::Refused(why.0),
            }
        })
    }

    /// Adoption mode: a job mrt-zk's `createJob` made is `CreateJob` with
    /// the id ZooKeeper gave it and the creating session as a worker
    /// actor; any refusal removes it.
    fn adopt_job(
        &self,
        job: ingest_projections::ForeignJob,
    ) -> ingest_projections::AdoptionFuture<'_> {
        Box::pin(async move {
            use ingest_events::command::Command;
            match self.job_spec(&job) {
                Ok(spec) => {
                    let command = Command::WithIds {
                        ids: vec![job.jid.0],
                        command: Box::new(Command::CreateJob { bid: job.bid, spec }),
                    };
                    self.decided(ingest_events::Actor::worker(job.actor), command)
                        .await
                }
                Err(why) => ingest_projections::Adoption::Refused(why.0),
            }
        })
    }

    /// Adoption mode: an access request status another client wrote
    /// (mrt-zk's `Access.setStatus`) is the command it means, decided as
    /// from the API: taking a Pending request (`StartAccess`, refused while
    /// its queue is paused) and reporting its outcome (`AccessOutcome`,
    /// without a delivery) with the client as a worker actor; Failed →
    /// Pending (`RequeueAccess`) and any move to Deleted (`DeleteAccess`)
    /// with the client as an admin actor; any other move, and any refusal,
    /// reverts it.
    fn adopt_access_status(
        &self,
        change: ingest_projections::ForeignAccessStatus,
    ) -> ingest_projections::AdoptionFuture<'_> {
        Box::pin(async move {
            use ingest_events::command::Command;
            use ingest_events::lifecycle::AccessState::*;
            use ingest_events::Actor;
            let qid = change.qid;
            let reason =
                "an access status written by a ZooKeeper client (adoption mode)".to_string();
            let (actor, command) = match (change.from, change.to) {
                (Pending, Processing) => (Actor::worker(change.actor), Command::StartAccess { qid }),
                (Processing, to @ (Completed | Failed)) => (
                    Actor::worker(change.actor),
                    Command::AccessOutcome {
                        qid,
                        success: to == Completed,
                        message: change.message,
                        delivery: None,
                    },
                ),
                (Failed, Pending) => (Actor::admin(change.actor), Command::RequeueAccess { qid, reason }),
                (_, Deleted) => (Actor::admin(change.actor), Command::DeleteAccess { qid, reason }),
                (from, to) => {
                    return ingest_projections::Adoption::Refused(format!(
                        "{from} -> {to} is not an access move the engine takes (taking a request, its outcome, a requeue of a failed one and a delete are)"
                    ))
                }
            };
            self.decided(actor, command).await
        })
    }

    /// Adoption mode: a batch another client removed (mrt-zk's
    /// `Batch.delete`, `deleteCompletedBatches`: its jobs, its uuid node,
    /// then the batch) is the engine's cleanup of that batch
    /// (`CleanupBatch`: only a Completed or Deleted batch, as mrt-zk's
    /// `isDeletable`); a job removed alone (`Job.delete`,
    /// `deleteDeletedJobs`) is the admin's `DeleteJob` (soft: the job stays
    /// in the tree as Deleted until its batch is cleaned up); an access
    /// request removed (`Access.delete`) is the admin's `DeleteAccess`
    /// (soft: it stays in the tree as Deleted); each with the ZooKeeper
    /// client as an admin actor; any refusal puts it back.
    fn adopt_delete(
        &self,
        deleted: ingest_projections::ForeignDelete,
    ) -> ingest_projections::AdoptionFuture<'_> {
        Box::pin(async move {
            use ingest_events::command::Command;
            let command = match deleted.item {
                ingest_projections::Deleted::Batch(bid) => Command::CleanupBatch { bid },
                ingest_projections::Deleted::Job(jid) => Command::DeleteJob {
                    jid,
                    reason: "its nodes deleted by a ZooKeeper client (adoption mode)".to_string(),
                },
                ingest_projections::Deleted::Access(_, qid) => Command::DeleteAccess {
                    qid,
                    reason: "its nodes deleted by a ZooKeeper client (adoption mode)".to_string(),
                },
            };
            self.decided(ingest_events::Actor::admin(deleted.actor), command)
                .await
        })
    }
}

impl EngineRecorder {
    /// After an adopted job status change: when the `retry_count` or
    /// `last_successful_status` written differ from the engine's own (its
    /// rules: `retry_count` grows only with a requeue; a move out of Failed
    /// keeps `last_successful_status`, where mrt-zk writes `Failed`), the
    /// status node as written is recorded (`ForeignChangeRepaired`, kind
    /// changed, the node's data found), since the projector writes the
    /// engine's over it: the log keeps what was written, the state and the
    /// tree the engine's.
    fn record_counters(
        &self,
        jid: ingest_events::Jid,
        from: ingest_events::JobState,
        to: ingest_events::JobState,
        written: ingest_projections::WrittenStatus,
    ) {
        use ingest_events::event::{ForeignChangeKind, ForeignChangeRepaired, ForeignNode};
        let state = self.handle.state();
        let Some(j) = state.jobs.get(&jid) else {
            return;
        };
        let ours = j.last_successful_status.map(|s| s.to_string());
        let mut differs = Vec::new();
        if let Some(n) = written
            .retry_count
            .filter(|n| *n != u64::from(j.retry_count))
        {
            differs.push(format!("retry_count {n} (the engine's: {})", j.retry_count));
        }
        if let Some(l) = written.last_successful_status.filter(|l| *l != ours) {
            let name = |s: &Option<String>| s.clone().unwrap_or_else(|| "null".to_string());
            differs.push(format!(
                "last_successful_status {} (the engine's: {})",
                ingest_protocol::submission::quoted(&name(&l)),
                name(&ours)
            ));
        }
        if differs.is_empty() {
            return;
        }
        let path = ingest_projections::layout::job_status(jid);
        let repaired = ForeignChangeRepaired {
            item: format!("job {jid}"),
            nodes: vec![ForeignNode {
                kind: ForeignChangeKind::Changed,
                path,
                found: written.found,
                zxid: written.zxid,
                mtime: written.mtime,
                session: 0,
            }],
            reason: format!(
                "adopted {from} -> {to}; written {}: recorded here, the engine's own are kept and projected",
                differs.join(", ")
            ),
        };
        ingest_projections::RecordForeign::record(
            self,
            ingest_events::StreamId::Job(jid),
            repaired,
        );
    }
}

/// Why a write another ZooKeeper client made is not taken in adoption
/// mode, in words: the reason the revert records.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Refusal(String);

impl From<String> for Refusal {
    fn from(reason: String) -> Refusal {
        Refusal(reason)
    }
}

impl EngineRecorder {
    /// Adoption mode: the command a batch status another client wrote
    /// means, with its actor, or why it is refused: mrt-zk's
    /// `acquirePendingBatch` (Pending → Processing, or Held under a
    /// collection hold) opens the batch for the jobs its consumer creates;
    /// the reporting consumer's Reporting/UpdateReporting → Completed or
    /// Failed is the engine's report, taken only when the batch's jobs make
    /// it that; the admin tool's release (Held → Pending), update reporting
    /// (Failed → UpdateReporting) and delete are the admin commands.
    /// Processing → Reporting is the engine's own move when the last job
    /// finishes, so another client's is refused.
    fn batch_status_command(
        &self,
        change: &ingest_projections::ForeignBatchStatus,
    ) -> Result<(ingest_events::Actor, ingest_events::command::Command), Refusal> {
        use ingest_events::command::Command;
        use ingest_events::lifecycle::BatchState::*;
        use ingest_events::{Actor, JobState};
        let (bid, actor) = (change.bid, change.actor.clone());
        let reason = "a batch status written by a ZooKeeper client (adoption mode)".to_string();
        let state = self.handle.state();
        let b = state
            .batches
            .get(&bid)
            .ok_or_else(|| format!("{bid} is not in the log"))?;
        Ok(match (change.from, change.to) {
            (Pending, Processing) => (Actor::worker(actor), Command::OpenBatch { bid }),
            (Pending, Held) if state.held_collections.contains(&b.submission.profile_name) => {
                (Actor::worker(actor), Command::OpenBatch { bid })
            }
            (Pending, Held) => {
                return Err(Refusal(format!(
                    "collection {} is not held; a batch is Held only when it is acquired under a collection hold",
                    b.submission.profile_name
                )))
            }
            (Held, Pending) => (Actor::admin(actor), Command::ReleaseBatch { bid, reason }),
            (Reporting | UpdateReporting, to @ (Completed | Failed)) => {
                let all_completed = state
                    .batch_jobs(b)
                    .all(|j| matches!(j.status, JobState::Completed | JobState::Deleted));
                let made = if all_completed { Completed } else { Failed };
                if made != to {
                    return Err(Refusal(format!(
                        "the batch's jobs make its report {made}, not {to}"
                    )));
                }
                (
                    Actor::worker(actor),
                    Command::ReportBatch {
                        bid,
                        notification_error: None,
                    },
                )
            }
            (Failed, UpdateReporting) => {
                (Actor::admin(actor), Command::UpdateReporting { bid, reason })
            }
            (_, Deleted) => (Actor::admin(actor), Command::DeleteBatch { bid, reason }),
            (Processing, Reporting) => {
                return Err(Refusal(
                    "the engine moves a batch to Reporting itself when its last job finishes"
                        .to_string(),
                ))
            }
            (from, to) => {
                return Err(Refusal(format!(
                    "{from} -> {to} is not a batch move the engine takes (mrt-zk's acquisition, report, release, update reporting and delete are)"
                )))
            }
        })
    }

    /// Adoption mode: the new job mrt-zk's `createJob` wrote, as the
    /// `CreateJob` it means (the batch must be Processing, the spec valid
    /// as any job's).
    fn job_spec(
        &self,
        job: &ingest_projections::ForeignJob,
    ) -> Result<ingest_events::command::JobSpec, Refusal> {
        use ingest_events::event::{Digest, Erc, Identifiers, PayloadType};
        use ingest_protocol::node::{decode, ConfigurationNode, IdentifiersNode, MetadataNode};
        if job.status != "Pending" {
            return Err(Refusal(format!(
                "a new job is Pending, not {}",
                ingest_protocol::submission::quoted(&job.status)
            )));
        }
        let c: ConfigurationNode =
            decode("/jobs/JID/configuration", &job.configuration).map_err(|e| e.to_string())?;
        let ids: IdentifiersNode = match job.identifiers.is_empty() {
            true => IdentifiersNode::default(),
            false => {
                decode("/jobs/JID/identifiers", &job.identifiers).map_err(|e| e.to_string())?
            }
        };
        let m: MetadataNode = match job.metadata.is_empty() {
            true => MetadataNode::default(),
            false => decode("/jobs/JID/metadata", &job.metadata).map_err(|e| e.to_string())?,
        };
        let payload_type = match c.payload_type.as_str() {
            "" => PayloadType::File,
            t => t.parse::<PayloadType>().map_err(|e| e.to_string())?,
        };
        let priority = job.priority.trim().parse::<u8>().map_err(|_| {
            format!(
                "priority {} is not a number from 0 to 99",
                ingest_protocol::submission::quoted(&job.priority)
            )
        })?;
        let text = |s: String| (!s.is_empty()).then_some(s);
        Ok(ingest_events::command::JobSpec {
            payload_url: c.payload_url,
            payload_type,
            identifiers: Identifiers {
                primary_id: text(ids.primary_id),
                local_ids: ids.local_id,
            },
            metadata: Erc {
                who: text(m.erc_who),
                what: text(m.erc_what),
                when: text(m.erc_when),
                r#where: text(m.erc_where),
            },
            digest: match (c.digest_type, c.digest_value) {
                (Some(algorithm), Some(value)) => Some(Digest { algorithm, value }),
                _ => None,
            },
            priority: Some(priority),
        })
    }

    /// The uuid and submission of a batch another client created, checked
    /// as `POST /batches` checks a body; why not, in words.
    fn foreign_submission(
        &self,
        batch: &ingest_projections::ForeignBatch,
    ) -> Result<(uuid::Uuid, ingest_events::event::Submission), Refusal> {
        use ingest_protocol::node::{decode, SubmissionNode};
        use ingest_protocol::submission::{expand_simple, SubmissionInput};
        if batch.status != "Pending" {
            return Err(Refusal(format!(
                "a new batch is Pending, not {}",
                ingest_protocol::submission::quoted(&batch.status)
            )));
        }
        let node: SubmissionNode =
            decode("/batches/BID/submission", &batch.submission).map_err(|e| e.to_string())?;
        let text = |s: &str| (!s.is_empty()).then(|| s.to_string());
        let uuid = match node.batch_id.as_str() {
            "" => uuid::Uuid::new_v4(),
            u => u.parse().map_err(|_| {
                format!(
                    "batchID {} is not a uuid",
                    ingest_protocol::submission::quoted(u)
                )
            })?,
        };
        let digest = match (&node.digest_type, &node.digest_value) {
            (Some(t), Some(v)) => Some(format!("{t}:{v}")),
            _ => None,
        };
        let input = SubmissionInput {
            submitter: text(&node.submitter),
            profile: text(&node.profile_name),
            payload_type: text(&node.payload_type),
            payload_url: text(&node.payload_url),
            submission_mode: text(&node.submission_mode),
            response_type: text(&node.response_type),
            manifest: node.manifest.clone(),
            erc_who: text(&node.erc_who),
            erc_what: text(&node.erc_what),
            erc_when: text(&node.erc_when),
            erc_where: text(&node.erc_where),
            digest,
            uuid: None,
            extra: Default::default(),
        };
        let submission = input.build().map_err(|e| e.to_string())?;
        self.profiles
            .check(&submission.profile_name)
            .map_err(|e| e.to_string())?;
        expand_simple(&submission).map_err(|e| e.to_string())?;
        Ok((uuid, submission))
    }
}
