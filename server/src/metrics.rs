//! Prometheus metrics of the queue service, served at `GET /metrics` in the
//! OpenMetrics text format.
//!
//! Scraping needs no token unless a metrics token is configured
//! (`tokens.metrics_file`, `INGEST_METRICS_TOKEN`): the usual set-up keeps
//! the port behind a firewall that only Prometheus passes. The page shows
//! counts and positions, never ids, submissions or tokens.
//!
//! | series | type | labels | what |
//! |---|---|---|---|
//! | `ingest_events_appended_total` | counter | `kind` | events appended since this process started (read from the log, so every writer counts) |
//! | `ingest_log_head_position` | gauge | | the last position written |
//! | `ingest_log_durable_position` | gauge | | the last position on disk |
//! | `ingest_log_needs_repair` | gauge | | 1 while the log's tail fails its hash chain |
//! | `ingest_jobs` | gauge | `state` | live jobs by state (every state, 0 included) |
//! | `ingest_batches` | gauge | `state` | live batches by state |
//! | `ingest_queue_paused` | gauge | | 1 while the ingest queue is paused |
//! | `ingest_collections_held` | gauge | | collections on hold |
//! | `ingest_step_duration_seconds` | histogram | `state`, `outcome` | step durations reported by workers ([`Metrics::observe_step`]) |
//! | `ingest_step_failures_total` | counter | `state` | failed steps |
//! | `ingest_http_requests_total` | counter | `method`, `route`, `status` | API requests by route template |
//! | `ingest_http_request_duration_seconds` | histogram | `method`, `route` | API latency |
//! | `ingest_zookeeper_session_state` | gauge | `state` | 1 for the current session state ([`Metrics::set_zookeeper_session`]) |
//! | `ingest_projector_events_behind` | gauge | | durable events not yet in ZooKeeper ([`Metrics::attach_projector`]) |
//! | `ingest_projector_seconds_behind` | gauge | | age of the oldest unprojected event |
//! | `ingest_projector_checkpoint_position` | gauge | | the position the live tree holds |
//! | `ingest_projector_state` | gauge | `state` | 1 for what the projector is doing |
//! | `ingest_projection_foreign_changes_total` | counter | `kind` | nodes another ZooKeeper client had changed (`missing`, `changed`, `extra`) that the projector converged back to the log ([`Metrics::count_foreign_change`]) |
//! | `ingest_consistency_checks_total` | counter | `outcome` | consistency checks a server ran (`GET /consistency`, the UI's reports, repairs' checks) by outcome: `done`, `failed`, or `cancelled` when the client went away during the scan of storage ([`Metrics::count_consistency_check`]) |
//! | `ingest_access_assembling_bytes` | gauge | | bytes of stored files read so far by the assemblies in progress, as their workers last reported ([`Metrics::set_access_assembling`]) |
//! | `ingest_build_info` | gauge | `version` | always 1 |
//! | `ingest_replication_role` | gauge | `role` | with `--replicas`: 1 for this engine's role ([`Metrics::attach_replication`]) |
//! | `ingest_replication_epoch`, `ingest_replication_applied_position`, `ingest_replication_lag_events` | gauge | | the fencing epoch seen, the position applied, events behind the tail |
//! | `ingest_replication_replica_lag_events` | gauge | `replica` | on the leader: each registered replica's lag |
//! | `ingest_replication_tail_bytes` | gauge | | on the leader: bytes of the tail in ZooKeeper |
//! | `ingest_collection_jobs` | gauge | `collection` | live jobs by collection ([`MAX_COLLECTION_LABELS`] largest; the rest summed as `_other`) |
//! | `ingest_collection_jobs_failed` | gauge | `collection` | live jobs in Failed by collection |
//! | `ingest_collection_batches` | gauge | `collection` | live batches by collection |
//! | `ingest_bytes_in_process` | gauge | | sum of `space_needed` of live jobs from Provisioning to Notify (Merritt's `gb_in_process`, in bytes) |
//! | `ingest_jobs_in_process` | gauge | | live jobs from Estimating to Notify (Merritt's `num_jobs_processing`) |
//! | `ingest_batches_in_process` | gauge | | live batches in Processing, Reporting or UpdateReporting (`num_batches_processing`) |
//! | `ingest_oldest_job_age_seconds` | gauge | `state` | how long the longest-waiting live job of each state has been in it (0 when none) |
//! | `ingest_writer_up` | gauge | | 1 while the engine's writer takes commands |
//!
//! The gauges of state and log are computed when scraped; the projector
//! series appear once a projector is attached. The ZooKeeper session gauge
//! follows the session's own state watch ([`Metrics::follow_zookeeper_session`]),
//! read at every scrape, so it says `Disconnected` during an outage even
//! when no request touches ZooKeeper.

use std::sync::atomic::AtomicU64;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use ingest_events::lifecycle::{AccessState, StateKind};
use ingest_events::{BatchState, JobState};
use ingest_projections::{SinkState, SinkStatus};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use tokio::sync::watch;
use zookeeper_client::SessionState;

use ingest_engine::service::EngineHandle;

/// The content type of the page [`Metrics::render`] returns.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The most collections given their own `collection` label; the others are
/// summed under `_other`, so a repository with thousands of collections
/// does not make thousands of series.
pub const MAX_COLLECTION_LABELS: usize = 50;

/// The label of the collections beyond [`MAX_COLLECTION_LABELS`].
pub const OTHER_COLLECTIONS: &str = "_other";

/// The most log records one scrape reads to count events; a scrape after a
/// long pause catches up over the next ones instead of stalling.
const MAX_RECORDS_PER_SCRAPE: u64 = 200_000;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: String,
}

/// The outcomes of a consistency check, as counted.
pub const CHECK_OUTCOMES: [&str; 3] = ["done", "failed", "cancelled"];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CollectionLabel {
    collection: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StepLabels {
    state: String,
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HttpLabels {
    method: String,
    route: String,
    status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabels {
    method: String,
    route: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VersionLabel {
    version: String,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

fn step_histogram() -> Histogram {
    // 50 ms to about 27 minutes.
    Histogram::new(exponential_buckets(0.05, 2.0, 16))
}

fn http_histogram() -> Histogram {
    // 1 ms to about 8 s.
    Histogram::new(exponential_buckets(0.001, 2.0, 14))
}

/// Why a scrape failed.
///
/// ### Handling
/// Answer 500; the next scrape tries again. Nothing was changed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MetricsError {
    /// The log could not be read to count events.
    #[error("cannot read the event log to count events: {0}")]
    Log(#[from] ingest_events::LogError),
    /// The page could not be encoded.
    #[error("cannot encode the metrics: {0}")]
    Encode(#[from] std::fmt::Error),
}

/// The gauges of a replicated engine ([`Metrics::attach_replication`]).
struct Replication {
    cell: ingest_replication::StatusCell,
    role: Family<RoleLabel, Gauge>,
    epoch: Gauge,
    applied: Gauge,
    lag: Gauge,
    replica_lag: Family<ReplicaLabel, Gauge>,
    tail_bytes: Gauge,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RoleLabel {
    role: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReplicaLabel {
    replica: String,
}

/// The roles the role gauge always shows (1 for the current one).
const ROLES: [&str; 7] = [
    "single",
    "starting",
    "follower",
    "leader",
    "bootstrapping",
    "disconnected",
    "divergent",
];

/// The most replicas labelled (a group is 3 or 5 engines).
const MAX_REPLICA_LABELS: usize = 16;

struct Projector {
    status: watch::Receiver<SinkStatus>,
    events_behind: Gauge,
    seconds_behind: Gauge<f64, AtomicU64>,
    checkpoint: Gauge,
    state: Family<StateLabel, Gauge>,
}

/// The service's metrics. Cheap to share (`Arc<Metrics>`); every method
/// takes `&self`.
pub struct Metrics {
    handle: EngineHandle,
    registry: Mutex<Registry>,
    counted_to: Mutex<u64>,
    events_appended: Family<KindLabel, Counter>,
    foreign_changes: Family<KindLabel, Counter>,
    consistency_checks: Family<OutcomeLabel, Counter>,
    log_head: Gauge,
    log_durable: Gauge,
    log_needs_repair: Gauge,
    jobs: Family<StateLabel, Gauge>,
    batches: Family<StateLabel, Gauge>,
    queue_paused: Gauge,
    collections_held: Gauge,
    step_duration: HistogramFamily<StepLabels>,
    step_failures: Family<StateLabel, Counter>,
    http_requests: Family<HttpLabels, Counter>,
    http_duration: HistogramFamily<RouteLabels>,
    zk_session: Family<StateLabel, Gauge>,
    zk_watch: Mutex<Option<zookeeper_client::StateWatcher>>,
    projector: Mutex<Option<Projector>>,
    replication: Mutex<Option<Replication>>,
    collection_jobs: Family<CollectionLabel, Gauge>,
    collection_failed: Family<CollectionLabel, Gauge>,
    collection_batches: Family<CollectionLabel, Gauge>,
    bytes_in_process: Gauge,
    jobs_in_process: Gauge,
    batches_in_process: Gauge,
    oldest_job_age: Family<StateLabel, Gauge<f64, AtomicU64>>,
    writer_up: Gauge,
    access: Family<StateLabel, Gauge>,
    access_assembled_bytes: Gauge,
    access_assembling_bytes: Gauge,
    delivery_bytes: Gauge,
    delivery_files: Gauge,
    /// The delivery area measured at each scrape, when the server serves
    /// one.
    delivery_dir: Mutex<Option<std::path::PathBuf>>,
    /// Held through a scrape, so two scrapes never interleave resets.
    scrape: Mutex<()>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Metrics {
    /// Metrics over an engine. Events are counted from the log's durable
    /// position at this moment on.
    pub fn new(handle: EngineHandle) -> Metrics {
        let mut r = Registry::default();
        let m = Metrics {
            counted_to: Mutex::new(handle.log().durable_position()),
            handle,
            registry: Mutex::new(Registry::default()),
            events_appended: Family::default(),
            foreign_changes: Family::default(),
            consistency_checks: Family::default(),
            log_head: Gauge::default(),
            log_durable: Gauge::default(),
            log_needs_repair: Gauge::default(),
            jobs: Family::default(),
            batches: Family::default(),
            queue_paused: Gauge::default(),
            collections_held: Gauge::default(),
            step_duration: Family::new_with_constructor(step_histogram as fn() -> Histogram),
            step_failures: Family::default(),
            http_requests: Family::default(),
            http_duration: Family::new_with_constructor(http_histogram as fn() -> Histogram),
            zk_session: Family::default(),
            zk_watch: Mutex::new(None),
            projector: Mutex::new(None),
            replication: Mutex::new(None),
            collection_jobs: Family::default(),
            collection_failed: Family::default(),
            collection_batches: Family::default(),
            bytes_in_process: Gauge::default(),
            jobs_in_process: Gauge::default(),
            batches_in_process: Gauge::default(),
            oldest_job_age: Family::default(),
            writer_up: Gauge::default(),
            access: Family::default(),
            access_assembled_bytes: Gauge::default(),
            access_assembling_bytes: Gauge::default(),
            delivery_bytes: Gauge::default(),
            delivery_files: Gauge::default(),
            delivery_dir: Mutex::new(None),
            scrape: Mutex::new(()),
        };
        r.register(
            "ingest_events_appended",
            "Events appended to the log since this process started, by kind",
            m.events_appended.clone(),
        );
        r.register(
            "ingest_projection_foreign_changes",
            "Nodes another ZooKeeper client had changed that the projector converged back to the log, by kind (missing, changed, extra)",
            m.foreign_changes.clone(),
        );
        for kind in ingest_events::event::ForeignChangeKind::ALL {
            m.foreign_changes
                .get_or_create(&KindLabel {
                    kind: kind.name().to_string(),
                })
                .inc_by(0);
        }
        r.register(
            "ingest_consistency_checks",
            "Consistency checks this server ran, by outcome (done, failed, cancelled: the client went away during the scan of storage)",
            m.consistency_checks.clone(),
        );
        for outcome in CHECK_OUTCOMES {
            m.consistency_checks
                .get_or_create(&OutcomeLabel {
                    outcome: outcome.to_string(),
                })
                .inc_by(0);
        }
        r.register(
            "ingest_log_head_position",
            "The last position written to the event log",
            m.log_head.clone(),
        );
        r.register(
            "ingest_log_durable_position",
            "The last position of the event log known to be on disk",
            m.log_durable.clone(),
        );
        r.register(
            "ingest_log_needs_repair",
            "1 while the tail of the event log fails its hash chain (appends refused)",
            m.log_needs_repair.clone(),
        );
        r.register("ingest_jobs", "Live jobs by state", m.jobs.clone());
        r.register("ingest_batches", "Live batches by state", m.batches.clone());
        r.register(
            "ingest_queue_paused",
            "1 while the ingest queue is paused",
            m.queue_paused.clone(),
        );
        r.register(
            "ingest_collections_held",
            "Collections on hold",
            m.collections_held.clone(),
        );
        r.register(
            "ingest_step_duration_seconds",
            "Durations of job steps reported by workers, by state and outcome",
            m.step_duration.clone(),
        );
        r.register(
            "ingest_step_failures",
            "Job steps that failed, by state",
            m.step_failures.clone(),
        );
        r.register(
            "ingest_http_requests",
            "HTTP API requests by method, route template and status",
            m.http_requests.clone(),
        );
        r.register(
            "ingest_http_request_duration_seconds",
            "HTTP API request latency by method and route template",
            m.http_duration.clone(),
        );
        r.register(
            "ingest_zookeeper_session_state",
            "1 for the current ZooKeeper session state",
            m.zk_session.clone(),
        );
        r.register(
            "ingest_collection_jobs",
            "Live jobs by collection (the largest collections; the rest as _other)",
            m.collection_jobs.clone(),
        );
        r.register(
            "ingest_collection_jobs_failed",
            "Live jobs in Failed by collection",
            m.collection_failed.clone(),
        );
        r.register(
            "ingest_collection_batches",
            "Live batches by collection",
            m.collection_batches.clone(),
        );
        r.register(
            "ingest_bytes_in_process",
            "Sum of space_needed of live jobs from Provisioning to Notify, in bytes",
            m.bytes_in_process.clone(),
        );
        r.register(
            "ingest_jobs_in_process",
            "Live jobs from Estimating to Notify",
            m.jobs_in_process.clone(),
        );
        r.register(
            "ingest_batches_in_process",
            "Live batches in Processing, Reporting or UpdateReporting",
            m.batches_in_process.clone(),
        );
        r.register(
            "ingest_oldest_job_age_seconds",
            "Seconds the longest-waiting live job of each state has been in it",
            m.oldest_job_age.clone(),
        );
        r.register(
            "ingest_writer_up",
            "1 while the engine's writer takes commands",
            m.writer_up.clone(),
        );
        r.register(
            "ingest_access_requests",
            "Access (assembly) requests by state",
            m.access.clone(),
        );
        r.register(
            "ingest_access_assembled_bytes",
            "Bytes of the containers assembled for the access requests the log holds (a request assembled again counts its last container)",
            m.access_assembled_bytes.clone(),
        );
        r.register(
            "ingest_access_assembling_bytes",
            "Bytes of stored files read so far by the assemblies in progress, as their workers last reported",
            m.access_assembling_bytes.clone(),
        );
        r.register(
            "ingest_access_delivery_bytes",
            "Bytes of the files in the delivery area, measured at the scrape (up to 100000 files)",
            m.delivery_bytes.clone(),
        );
        r.register(
            "ingest_access_delivery_files",
            "Files in the delivery area, measured at the scrape (up to 100000)",
            m.delivery_files.clone(),
        );
        let build: Family<VersionLabel, Gauge> = Family::default();
        build
            .get_or_create(&VersionLabel {
                version: env!("CARGO_PKG_VERSION").to_string(),
            })
            .set(1);
        r.register("ingest_build_info", "The version of ingest running", build);
        *lock(&m.registry) = r;
        m
    }

    /// Records one job step a worker finished: its state, how long it took,
    /// and whether it succeeded.
    pub fn observe_step(&self, state: JobState, duration: Duration, ok: bool) {
        let outcome = if ok { "success" } else { "failure" };
        self.step_duration
            .get_or_create(&StepLabels {
                state: state.name().to_string(),
                outcome: outcome.to_string(),
            })
            .observe(duration.as_secs_f64());
        if !ok {
            self.step_failures
                .get_or_create(&StateLabel {
                    state: state.name().to_string(),
                })
                .inc();
        }
    }

    /// Records one HTTP request. `route` is the route template
    /// (`/jobs/{jid}`), never the concrete path, so ids do not become labels.
    pub fn observe_http(&self, method: &str, route: &str, status: u16, elapsed: Duration) {
        self.http_requests
            .get_or_create(&HttpLabels {
                method: method.to_string(),
                route: route.to_string(),
                status: status.to_string(),
            })
            .inc();
        self.http_duration
            .get_or_create(&RouteLabels {
                method: method.to_string(),
                route: route.to_string(),
            })
            .observe(elapsed.as_secs_f64());
    }

    /// Follows a ZooKeeper session from now on: every scrape reads its
    /// current state (a session that lost its server says `Disconnected`
    /// even while nothing asks ZooKeeper anything). Replaces the session
    /// followed before.
    pub fn follow_zookeeper_session(&self, watcher: zookeeper_client::StateWatcher) {
        self.set_zookeeper_session(watcher.peek_state());
        *lock(&self.zk_watch) = Some(watcher);
    }

    /// Says no session could be made: stops following the old one and
    /// shows `Disconnected`.
    pub fn zookeeper_unreachable(&self) {
        *lock(&self.zk_watch) = None;
        self.set_zookeeper_session(SessionState::Disconnected);
    }

    /// Sets the ZooKeeper session state: its series is 1, every other 0.
    pub fn set_zookeeper_session(&self, state: SessionState) {
        const ALL: [SessionState; 6] = [
            SessionState::Disconnected,
            SessionState::SyncConnected,
            SessionState::AuthFailed,
            SessionState::ConnectedReadOnly,
            SessionState::Expired,
            SessionState::Closed,
        ];
        for s in ALL {
            self.zk_session
                .get_or_create(&StateLabel {
                    state: s.to_string(),
                })
                .set(i64::from(s == state));
        }
    }

    /// Counts one node another ZooKeeper client had changed and the
    /// projector converged back.
    pub fn count_foreign_change(&self, kind: ingest_events::event::ForeignChangeKind) {
        self.foreign_changes
            .get_or_create(&KindLabel {
                kind: kind.name().to_string(),
            })
            .inc();
    }

    /// The bytes read so far by the assemblies in progress
    /// (`ingest_access_assembling_bytes`).
    pub fn set_access_assembling(&self, bytes: u64) {
        self.access_assembling_bytes.set(to_i64(bytes));
    }

    /// Counts one consistency check by its outcome (one of
    /// [`CHECK_OUTCOMES`]).
    pub fn count_consistency_check(&self, outcome: &'static str) {
        self.consistency_checks
            .get_or_create(&OutcomeLabel {
                outcome: outcome.to_string(),
            })
            .inc();
    }

    /// The projector's latest status, when one is attached.
    pub fn projector_status(&self) -> Option<SinkStatus> {
        lock(&self.projector)
            .as_ref()
            .map(|p| p.status.borrow().clone())
    }

    /// The projector's status watch, when one is attached.
    pub fn projector_status_receiver(&self) -> Option<watch::Receiver<SinkStatus>> {
        lock(&self.projector).as_ref().map(|p| p.status.clone())
    }

    /// Shows the projector's lag (from the sink's status watch) from now on.
    /// A second call replaces the first watch.
    pub fn attach_projector(&self, status: watch::Receiver<SinkStatus>) {
        let mut slot = lock(&self.projector);
        if let Some(p) = slot.as_mut() {
            p.status = status;
            return;
        }
        let p = Projector {
            status,
            events_behind: Gauge::default(),
            seconds_behind: Gauge::default(),
            checkpoint: Gauge::default(),
            state: Family::default(),
        };
        let mut r = lock(&self.registry);
        r.register(
            "ingest_projector_events_behind",
            "Durable events not yet projected into ZooKeeper",
            p.events_behind.clone(),
        );
        r.register(
            "ingest_projector_seconds_behind",
            "Age in seconds of the oldest durable event not yet projected (0 when caught up)",
            p.seconds_behind.clone(),
        );
        r.register(
            "ingest_projector_checkpoint_position",
            "The log position the live ZooKeeper tree holds",
            p.checkpoint.clone(),
        );
        r.register(
            "ingest_projector_state",
            "1 for what the projector is doing",
            p.state.clone(),
        );
        *slot = Some(p);
    }

    /// Shows this engine's place in a replicated group from now on:
    /// `ingest_replication_role{role}` (1 for the current role),
    /// `ingest_replication_epoch`, `ingest_replication_applied_position`,
    /// `ingest_replication_lag_events` (behind the leader's tail), and on
    /// the leader `ingest_replication_replica_lag_events{replica}` and
    /// `ingest_replication_tail_bytes`.
    pub fn attach_replication(&self, cell: ingest_replication::StatusCell) {
        let r = Replication {
            cell,
            role: Family::default(),
            epoch: Gauge::default(),
            applied: Gauge::default(),
            lag: Gauge::default(),
            replica_lag: Family::default(),
            tail_bytes: Gauge::default(),
        };
        let mut reg = lock(&self.registry);
        reg.register(
            "ingest_replication_role",
            "1 for this engine's role in its replicated group",
            r.role.clone(),
        );
        reg.register(
            "ingest_replication_epoch",
            "The fencing epoch this engine last saw",
            r.epoch.clone(),
        );
        reg.register(
            "ingest_replication_applied_position",
            "The log position this engine applied",
            r.applied.clone(),
        );
        reg.register(
            "ingest_replication_lag_events",
            "Events this engine is behind the replicated tail",
            r.lag.clone(),
        );
        reg.register(
            "ingest_replication_replica_lag_events",
            "On the leader: events each registered replica is behind",
            r.replica_lag.clone(),
        );
        reg.register(
            "ingest_replication_tail_bytes",
            "On the leader: bytes of the replicated tail held in ZooKeeper",
            r.tail_bytes.clone(),
        );
        *lock(&self.replication) = Some(r);
    }

    fn refresh_replication(&self) {
        let slot = lock(&self.replication);
        let Some(r) = slot.as_ref() else {
            return;
        };
        let s = r.cell.get();
        let current = serde_json::to_value(s.role)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default();
        for role in ROLES {
            r.role
                .get_or_create(&RoleLabel {
                    role: role.to_string(),
                })
                .set(i64::from(role == current));
        }
        r.epoch.set(to_i64(s.epoch.unwrap_or(0)));
        r.applied.set(to_i64(self.handle.state().position));
        r.lag.set(to_i64(s.lag.unwrap_or(0)));
        r.replica_lag.clear();
        for replica in s.replicas.iter().take(MAX_REPLICA_LABELS) {
            r.replica_lag
                .get_or_create(&ReplicaLabel {
                    replica: replica.id.clone(),
                })
                .set(to_i64(replica.lag));
        }
        r.tail_bytes.set(to_i64(s.tail_bytes));
    }

    /// Computes the gauges, counts the events appended since the last
    /// scrape, and encodes the page. Reads the log: call it from a blocking
    /// context (`spawn_blocking`).
    ///
    /// # Errors
    /// [`MetricsError`] when the log cannot be read.
    pub fn render(&self) -> Result<String, MetricsError> {
        let _one_at_a_time = lock(&self.scrape);
        self.count_events()?;
        self.refresh_state();
        self.refresh_queue(chrono::Utc::now());
        self.refresh_projector();
        self.refresh_replication();
        self.refresh_access();
        let followed = lock(&self.zk_watch).as_ref().map(|w| w.peek_state());
        if let Some(state) = followed {
            self.set_zookeeper_session(state);
        }
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &lock(&self.registry))?;
        Ok(out)
    }

    /// Measures the delivery area `dir` at every scrape
    /// (`ingest_access_delivery_bytes`, `_files`).
    pub fn watch_delivery_area(&self, dir: std::path::PathBuf) {
        *lock(&self.delivery_dir) = Some(dir);
    }

    fn refresh_access(&self) {
        let state = self.handle.state();
        let mut by_state = [0i64; AccessState::ALL.len()];
        let mut assembled: u64 = 0;
        for a in state.access.values() {
            if let Some(i) = AccessState::ALL.iter().position(|s| *s == a.status) {
                by_state[i] += 1;
            }
            if let Some(d) = &a.delivery {
                assembled = assembled.saturating_add(d.size);
            }
        }
        drop(state);
        for (s, n) in AccessState::ALL.iter().zip(by_state) {
            self.access
                .get_or_create(&StateLabel {
                    state: s.name().to_string(),
                })
                .set(n);
        }
        self.access_assembled_bytes.set(to_i64(assembled));
        let dir = lock(&self.delivery_dir).clone();
        if let Some(dir) = dir {
            let (files, bytes) = delivery_area_use(&dir);
            self.delivery_files.set(to_i64(files));
            self.delivery_bytes.set(to_i64(bytes));
        }
    }

    fn count_events(&self) -> Result<(), MetricsError> {
        let log = self.handle.log();
        let mut counted = lock(&self.counted_to);
        let durable = log.durable_position();
        // A repaired (truncated) tail moves the durable position back.
        if durable < *counted {
            *counted = durable;
        }
        let to = durable.min(counted.saturating_add(MAX_RECORDS_PER_SCRAPE));
        for record in log.read_range(*counted + 1, to) {
            let record = record?;
            self.events_appended
                .get_or_create(&KindLabel {
                    kind: record.event.kind().to_string(),
                })
                .inc();
            *counted = record.envelope.position;
        }
        Ok(())
    }

    fn refresh_state(&self) {
        let log = self.handle.log();
        self.log_head.set(to_i64(log.head().0));
        self.log_durable.set(to_i64(log.durable_position()));
        self.log_needs_repair
            .set(i64::from(log.needs_repair().is_some()));
        let state = self.handle.state();
        let mut jobs = [0i64; JobState::ALL.len()];
        for j in state.jobs.values().filter(|j| !j.cleaned_up) {
            if let Some(i) = JobState::ALL.iter().position(|s| *s == j.status) {
                jobs[i] += 1;
            }
        }
        let mut batches = [0i64; BatchState::ALL.len()];
        for b in state.batches.values().filter(|b| !b.cleaned_up) {
            if let Some(i) = BatchState::ALL.iter().position(|s| *s == b.status) {
                batches[i] += 1;
            }
        }
        self.queue_paused.set(i64::from(state.paused));
        self.collections_held
            .set(to_i64(state.held_collections.len() as u64));
        drop(state);
        for (s, n) in JobState::ALL.iter().zip(jobs) {
            self.jobs
                .get_or_create(&StateLabel {
                    state: s.name().to_string(),
                })
                .set(n);
        }
        for (s, n) in BatchState::ALL.iter().zip(batches) {
            self.batches
                .get_or_create(&StateLabel {
                    state: s.name().to_string(),
                })
                .set(n);
        }
    }

    /// The autoscaling and per-collection gauges, from the published state.
    fn refresh_queue(&self, now: chrono::DateTime<chrono::Utc>) {
        use std::collections::BTreeMap;
        #[derive(Default)]
        struct Counts {
            jobs: i64,
            failed: i64,
            batches: i64,
        }
        self.writer_up.set(i64::from(self.handle.is_running()));
        let state = self.handle.state();
        let mut by_collection: BTreeMap<&str, Counts> = BTreeMap::new();
        let mut bytes: u64 = 0;
        let mut in_process = 0i64;
        let mut oldest: BTreeMap<JobState, chrono::DateTime<chrono::Utc>> = BTreeMap::new();
        for j in state.jobs.values().filter(|j| !j.cleaned_up) {
            let c = by_collection
                .entry(j.configuration.profile_name.as_str())
                .or_default();
            c.jobs += 1;
            c.failed += i64::from(j.status == JobState::Failed);
            // Space is reserved from Provisioning on (Estimating measures it).
            if j.status.has_step() && j.status != JobState::Estimating {
                bytes = bytes.saturating_add(j.space_needed);
            }
            if j.status.has_step() {
                in_process += 1;
            }
            let since = oldest.entry(j.status).or_insert(j.last_modified);
            *since = (*since).min(j.last_modified);
        }
        let mut batches_in_process = 0i64;
        for b in state.batches.values().filter(|b| !b.cleaned_up) {
            by_collection
                .entry(b.submission.profile_name.as_str())
                .or_default()
                .batches += 1;
            batches_in_process += i64::from(matches!(
                b.status,
                BatchState::Processing | BatchState::Reporting | BatchState::UpdateReporting
            ));
        }
        // The largest collections by live jobs get labels; the rest are summed.
        let mut ranked: Vec<(&str, Counts)> = by_collection.into_iter().collect();
        ranked.sort_by(|a, b| b.1.jobs.cmp(&a.1.jobs).then(a.0.cmp(b.0)));
        let mut rows: Vec<(String, Counts)> = Vec::new();
        let mut other = Counts::default();
        for (i, (name, c)) in ranked.into_iter().enumerate() {
            if i < MAX_COLLECTION_LABELS {
                rows.push((name.to_string(), c));
            } else {
                other.jobs += c.jobs;
                other.failed += c.failed;
                other.batches += c.batches;
            }
        }
        drop(state);
        if other.jobs + other.batches > 0 {
            rows.push((OTHER_COLLECTIONS.to_string(), other));
        }
        // Collections that went away lose their series.
        self.collection_jobs.clear();
        self.collection_failed.clear();
        self.collection_batches.clear();
        for (collection, c) in rows {
            let label = CollectionLabel { collection };
            self.collection_jobs.get_or_create(&label).set(c.jobs);
            self.collection_failed.get_or_create(&label).set(c.failed);
            self.collection_batches.get_or_create(&label).set(c.batches);
        }
        self.bytes_in_process.set(to_i64(bytes));
        self.jobs_in_process.set(in_process);
        self.batches_in_process.set(batches_in_process);
        for s in JobState::ALL {
            let age = oldest.get(s).map_or(0.0, |t| {
                (now - *t).num_milliseconds().max(0) as f64 / 1000.0
            });
            self.oldest_job_age
                .get_or_create(&StateLabel {
                    state: s.name().to_string(),
                })
                .set(age);
        }
    }

    fn refresh_projector(&self) {
        let slot = lock(&self.projector);
        let Some(p) = slot.as_ref() else {
            return;
        };
        let status = p.status.borrow().clone();
        p.events_behind.set(to_i64(status.events_behind));
        p.seconds_behind
            .set(status.seconds_behind_at(chrono::Utc::now()));
        p.checkpoint.set(to_i64(status.checkpoint));
        let current = sink_state_name(&status.state);
        for s in [
            "starting",
            "connected",
            "disconnected",
            "standby",
            "stopped",
            "failed",
            "rebuilding",
        ] {
            p.state
                .get_or_create(&StateLabel {
                    state: s.to_string(),
                })
                .set(i64::from(s == current));
        }
    }
}

fn sink_state_name(s: &SinkState) -> &'static str {
    match s {
        SinkState::Starting => "starting",
        SinkState::Connected => "connected",
        SinkState::Disconnected => "disconnected",
        SinkState::Standby { .. } => "standby",
        SinkState::Stopped(None) => "stopped",
        SinkState::Stopped(Some(_)) => "failed",
        SinkState::Rebuilding { .. } => "rebuilding",
        _ => "unknown",
    }
}

/// The most delivery-area entries a scrape looks at.
const MAX_DELIVERY_ENTRIES: usize = 100_000;

/// The regular files in `dir` (containers, and containers being built) and
/// their bytes; an unreadable or missing directory is empty.
fn delivery_area_use(dir: &std::path::Path) -> (u64, u64) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return (0, 0);
    };
    let (mut files, mut bytes) = (0u64, 0u64);
    for entry in entries.flatten().take(MAX_DELIVERY_ENTRIES) {
        if let Ok(meta) = entry.metadata() {
            if meta.is_file() {
                files += 1;
                bytes = bytes.saturating_add(meta.len());
            }
        }
    }
    (files, bytes)
}

fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ingest_engine::engine::{Engine, EngineConfig};
    use ingest_engine::service::EngineService;
    use ingest_events::command::Command;
    use ingest_events::Actor;

    fn series<'a>(page: &'a str, name: &str) -> Vec<&'a str> {
        page.lines().filter(|l| l.starts_with(name)).collect()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_scrape_shows_log_state_steps_http_and_sessions() {
        let dir = tempfile::tempdir().expect("tempdir");
        let service =
            EngineService::start(Engine::open(EngineConfig::new(dir.path())).expect("open"));
        let handle = service.handle();
        let metrics = Metrics::new(handle.clone());
        handle
            .execute(
                Actor::admin("t"),
                Command::PauseQueue {
                    reason: "test".into(),
                },
            )
            .await
            .expect("pause");
        metrics.observe_step(JobState::Downloading, Duration::from_millis(1500), false);
        metrics.observe_http("GET", "/jobs/{jid}", 404, Duration::from_millis(2));
        metrics.set_zookeeper_session(SessionState::SyncConnected);
        let (_tx, rx) = watch::channel(SinkStatus {
            state: SinkState::Connected,
            checkpoint: 0,
            durable: 1,
            events_behind: 1,
            seconds_behind: 0.5,
            oldest_unprojected: None,
            transactions: 0,
            events_applied: 0,
            ops_applied: 0,
            conflicts: 0,
            converging: None,
        });
        metrics.attach_projector(rx);
        metrics.set_access_assembling(4096);
        let deliveries = dir.path().join("deliveries");
        std::fs::create_dir_all(&deliveries).expect("mkdir");
        std::fs::write(deliveries.join("a.zip"), [0u8; 1000]).expect("write");
        std::fs::write(deliveries.join(".building-b.tar"), [0u8; 24]).expect("write");
        metrics.watch_delivery_area(deliveries);
        let page = tokio::task::spawn_blocking(move || metrics.render())
            .await
            .expect("join")
            .expect("render");
        for expected in [
            "ingest_events_appended_total{kind=\"QueuePaused\"} 1",
            "ingest_log_head_position 1",
            "ingest_log_durable_position 1",
            "ingest_log_needs_repair 0",
            "ingest_queue_paused 1",
            "ingest_jobs{state=\"Estimating\"} 0",
            "ingest_batches{state=\"UpdateReporting\"} 0",
            "ingest_step_failures_total{state=\"Downloading\"} 1",
            "ingest_step_duration_seconds_count{state=\"Downloading\",outcome=\"failure\"} 1",
            "ingest_http_requests_total{method=\"GET\",route=\"/jobs/{jid}\",status=\"404\"} 1",
            "ingest_zookeeper_session_state{state=\"SyncConnected\"} 1",
            "ingest_zookeeper_session_state{state=\"Expired\"} 0",
            "ingest_projector_events_behind 1",
            "ingest_projector_state{state=\"connected\"} 1",
            "ingest_access_requests{state=\"Processing\"} 0",
            "ingest_access_assembled_bytes 0",
            "ingest_access_assembling_bytes 4096",
            "ingest_access_delivery_bytes 1024",
            "ingest_access_delivery_files 2",
        ] {
            assert!(page.contains(expected), "missing {expected:?} in\n{page}");
        }
        assert_eq!(series(&page, "ingest_jobs{").len(), JobState::ALL.len());
        assert!(page.ends_with("# EOF\n"));
        service.shutdown().await;
    }

    // The autoscaling gauges (before, only counts by state existed) and the
    // per-collection series, with their cardinality bounded.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_scrape_shows_bytes_in_process_and_bounded_collections() {
        use ingest_events::command::Target;
        use ingest_events::{Bid, Jid};
        let dir = tempfile::tempdir().expect("tempdir");
        let service =
            EngineService::start(Engine::open(EngineConfig::new(dir.path())).expect("open"));
        let handle = service.handle();
        let metrics = Metrics::new(handle.clone());
        let admin = Actor::admin("t");
        let run = |c: Command| {
            let h = handle.clone();
            let a = admin.clone();
            async move { h.execute(a, c).await.expect("command") }
        };
        let collections = MAX_COLLECTION_LABELS + 10;
        for i in 0..collections {
            let input = ingest_protocol::submission::SubmissionInput {
                submitter: Some("alice".into()),
                profile: Some(format!("c{i:03}")),
                payload_url: Some("https://example.org/m.checkm".into()),
                // The first collection has two jobs, so it ranks first.
                manifest: (0..if i == 0 { 2 } else { 1 })
                    .map(|n| format!("f{n}.checkm l{n}"))
                    .collect(),
                ..Default::default()
            };
            let submission = input.build().expect("submission");
            let jobs = ingest_protocol::submission::expand_simple(&submission).expect("expand");
            run(Command::SubmitBatch {
                uuid: uuid::Uuid::from_u128(i as u128 + 1),
                submission,
            })
            .await;
            run(Command::AcquireBatch {
                bid: Bid(i as u64 + 1),
                jobs,
            })
            .await;
        }
        let jid = Jid(1);
        run(Command::StartJob { jid }).await;
        run(Command::RecordSpace {
            jid,
            space_needed: 12_345,
            priority: None,
        })
        .await;
        run(Command::SetJobStatus {
            jid,
            target: Target::Success,
            message: String::new(),
            priority: None,
        })
        .await;
        let page = tokio::task::spawn_blocking(move || metrics.render())
            .await
            .expect("join")
            .expect("render");
        for expected in [
            "ingest_bytes_in_process 12345",
            "ingest_jobs_in_process 1",
            &format!("ingest_batches_in_process {collections}"),
            "ingest_writer_up 1",
            "ingest_collection_jobs{collection=\"c000\"} 2",
            "ingest_collection_batches{collection=\"c000\"} 1",
            "ingest_collection_jobs_failed{collection=\"c000\"} 0",
            "ingest_collection_jobs{collection=\"_other\"} 10",
            "ingest_oldest_job_age_seconds{state=\"Completed\"} 0",
        ] {
            assert!(page.contains(expected), "missing {expected:?} in\n{page}");
        }
        assert_eq!(
            series(&page, "ingest_collection_jobs{").len(),
            MAX_COLLECTION_LABELS + 1,
            "bounded"
        );
        assert_eq!(
            series(&page, "ingest_oldest_job_age_seconds{").len(),
            JobState::ALL.len()
        );
        service.shutdown().await;
    }
}
