//! The HTTP API of the queue service (`ingest serve`): an axum [`Router`]
//! over an [`EngineHandle`].
//!
//! Depositors submit batches and follow them; workers acquire batches,
//! start jobs and report each step's outcome (fenced on their ZooKeeper
//! lock, see [`locks`]); admins hold, release, requeue, fail, delete, pause
//! and clean up, each with a reason that is recorded with the event. Every
//! change goes through [`EngineHandle::execute_correlated`], so the log
//! stays the single source of truth and a refused command appends nothing.
//!
//! [`routes`] is the route table the router is built from (method, path,
//! [`Access`]); `api/openapi.yaml` describes the same routes and a test
//! keeps the two in step. Errors have one JSON shape ([`ApiError`]).
//!
//! Cross-cutting, for every request: an `X-Correlation-Id` (a uuid taken
//! from the request or generated, recorded with the events and returned in
//! the response), a tracing span with method, path, status and latency,
//! request metrics by route template, and a body limit (413 beyond it).
//!
//! ```no_run
//! # async fn run(handle: ingest_engine::service::EngineHandle, tokens: ingest_config::Tokens) -> std::io::Result<()> {
//! use std::sync::Arc;
//! use ingest_server::api::{self, ApiConfig, NoLocks};
//! use ingest_config::Profiles;
//! use ingest_server::metrics::Metrics;
//!
//! let router = api::router(ApiConfig {
//!     metrics: Arc::new(Metrics::new(handle.clone())),
//!     handle,
//!     tokens,
//!     profiles: Profiles::unrestricted(),
//!     locks: Arc::new(NoLocks),
//!     max_body_bytes: 1024 * 1024,
//!     max_record_bytes: 256 * 1024 * 1024,
//!     zookeeper: None,
//!     projector_gate: None,
//!     inventory: None,
//!     minter: None,
//!     outbound: ingest_protocol::outbound::OutboundPolicy::default(),
//!     pages: None,
//!     storage_targets: Vec::new(),
//!     content_nodes: Vec::new(),
//!     delivery_dir: None,
//!     replication: None,
//!     listing_items_per_second: ingest_config::DEFAULT_LISTING_ITEMS_PER_SECOND,
//!     converger: None,
//! });
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:7878").await?;
//! api::serve(listener, router, api::Limits::default(), async { let _ = tokio::signal::ctrl_c().await; }).await
//! # }
//! ```

pub(crate) mod access;
pub(crate) mod admin;
mod assembling;
mod audit;
mod auth;
mod budget;
pub(crate) mod consistency;
mod content;
mod deliveries;
pub(crate) mod depositor;
mod error;
mod extension;
mod listen;
mod listing;
pub mod locks;
mod objects;
pub(crate) mod ops;
mod replication;
pub(crate) mod scope;
mod waiting;
mod worker;

use ingest_protocol::api::*;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{DefaultBodyLimit, FromRequestParts, MatchedPath, Request, State};
use axum::handler::Handler;
use axum::http::request::Parts;
use axum::http::{header, HeaderName, HeaderValue, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{on, MethodFilter, MethodRouter};
use axum::Router;
use ingest_events::command::Command;
use ingest_events::{Actor, Recorded};
use ingest_projections::Views;

use tower_http::trace::TraceLayer;
use tracing::Span;
use uuid::Uuid;

pub(crate) use auth::{admin_by_token, AdminName};
pub use auth::{Access, Role};
pub use content::ContentNode;
pub use error::{ApiError, ApiJson, ApiPath};
pub use listen::{client_key, serve, Limits};
pub use locks::{LockCheckError, LockChecker, LockFuture, LockHolder, NoLocks};
pub use worker::batch_priority;

use crate::metrics::Metrics;
use ingest_config::{Profiles, Tokens};
use ingest_engine::engine::Outcome;
use ingest_engine::service::EngineHandle;
use ingest_protocol::history::HistoryRow;

/// The header carrying a request's correlation id.
pub const CORRELATION_HEADER: &str = "x-correlation-id";

/// The OpenAPI description of every route, served at `GET /openapi.yaml`.
pub const OPENAPI_YAML: &str = include_str!("../../api/openapi.yaml");

/// What the router needs.
pub struct ApiConfig {
    /// The engine.
    pub handle: EngineHandle,
    /// The bearer tokens of each role.
    pub tokens: Tokens,
    /// The collection profiles submissions may name.
    pub profiles: Profiles,
    /// Who holds a worker's lock (fencing).
    pub locks: Arc<dyn LockChecker>,
    /// The metrics the API records into and serves.
    pub metrics: Arc<Metrics>,
    /// The largest request body read, in bytes.
    pub max_body_bytes: usize,
    /// The largest body of [`RECORD_ROUTE`] (an object version's inventory
    /// record, which grows with its files), in bytes; at least
    /// `max_body_bytes`.
    pub max_record_bytes: usize,
    /// The ZooKeeper the server projects into (for `GET /diff`).
    pub zookeeper: Option<ingest_projections::ZkConfig>,
    /// The gate of this server's projector, held while `GET /diff` reads
    /// the tree (`None`: no projector runs in this process).
    pub projector_gate: Option<ingest_projections::ProjectorGate>,
    /// The object inventory (`None`: the object routes answer 503).
    pub inventory: Option<ingest_steps::inventory::Inventory>,
    /// Where arks come from (`None`: minting answers 503).
    pub minter: Option<ingest_engine::ezid::ArkMinter>,
    /// The outbound policy every payload URL of a submission is checked
    /// against at the door (scheme, syntax, `file://` root, literal
    /// addresses; names are not resolved here).
    pub outbound: ingest_protocol::outbound::OutboundPolicy,
    /// Pages mounted beside the API's routes: the admin web UI
    /// (`crate::ui::pages`), or `None`.
    pub pages: Option<Pages>,
    /// The OCFL storage targets the consistency report compares with the
    /// inventory (empty: that rule is skipped).
    pub storage_targets: Vec<ingest_engine::consistency::TargetSpec>,
    /// The storage targets `GET /content/{node}/…` serves files from, by
    /// Merritt node id (empty: every content request is 404).
    pub content_nodes: Vec<ContentNode>,
    /// The delivery area `GET /deliveries/{name}` serves finished
    /// assemblies from (`None`: every delivery request is 404).
    pub delivery_dir: Option<std::path::PathBuf>,
    /// This engine's place in a replicated group (`None`: a single engine).
    pub replication: Option<ingest_replication::StatusCell>,
    /// How many items of the state one token's listing pages may walk per
    /// second (`--listing-items-per-second`).
    pub listing_items_per_second: u64,
    /// The running projector's convergence requests (drift repair while
    /// serving); `None` without ZooKeeper.
    pub converger: Option<ingest_projections::sink::Converger>,
}

/// Routes mounted beside the API's own, made from the router's state (the
/// admin web UI under `/ui`: not API routes, not in the OpenAPI file).
pub struct Pages(pub(crate) Box<dyn FnOnce(AppState) -> Router<AppState> + Send>);

/// The state every handler shares.
#[derive(Clone)]
pub(crate) struct AppState {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) handle: EngineHandle,
    pub(crate) tokens: Tokens,
    pub(crate) profiles: Profiles,
    pub(crate) locks: Arc<dyn LockChecker>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) max_body_bytes: usize,
    pub(crate) max_record_bytes: usize,
    pub(crate) zookeeper: Option<ingest_projections::ZkConfig>,
    pub(crate) projector_gate: Option<ingest_projections::ProjectorGate>,
    pub(crate) inventory: Option<ingest_steps::inventory::Inventory>,
    pub(crate) storage_targets: Vec<ingest_engine::consistency::TargetSpec>,
    pub(crate) content_nodes: Vec<ContentNode>,
    pub(crate) delivery_dir: Option<std::path::PathBuf>,
    pub(crate) replication: Option<ingest_replication::StatusCell>,
    pub(crate) minter: Option<ingest_engine::ezid::ArkMinter>,
    pub(crate) outbound: ingest_protocol::outbound::OutboundPolicy,
    /// Bytes above which an assembly request goes to the large access
    /// queue (Merritt's default `QueueSizeLimit`).
    pub(crate) access_size_limit: u64,
    /// What each token's listing pages may walk of the state.
    pub(crate) listing_budget: budget::ListingBudget,
    /// The running projector's convergence requests.
    pub(crate) converger: Option<ingest_projections::sink::Converger>,
    /// The reporting views, folded up to the durable position on demand.
    views: Arc<Mutex<Views>>,
    /// What `/readyz` last logged (its readiness and the kinds of its
    /// reasons), so a change is logged once and not every probe.
    readiness_logged: Mutex<Option<String>>,
    /// Why workers keep jobs waiting ([`waiting`]).
    pub(crate) waits: waiting::Waits,
    /// How far the assemblies in progress got ([`assembling`]).
    pub(crate) assembling: assembling::Assembling,
}

/// One route of the API.
#[derive(Debug, Clone)]
pub struct RouteInfo {
    /// The HTTP method.
    pub method: Method,
    /// The path template (`/jobs/{jid}`), as in the OpenAPI file.
    pub path: &'static str,
    /// Who may call it.
    pub access: Access,
}

type Entry = (RouteInfo, MethodRouter<AppState>);

fn entry<H, T>(method: Method, path: &'static str, access: Access, handler: H) -> Entry
where
    H: Handler<T, AppState>,
    T: 'static,
{
    let filter = MethodFilter::try_from(method.clone()).unwrap_or(MethodFilter::GET);
    (
        RouteInfo {
            method,
            path,
            access,
        },
        on(filter, handler),
    )
}

/// The entry of the endpoint `E`: its method and route pattern come from
/// its definition in `ingest_protocol::endpoint`, which the client and the
/// workers call it through.
fn route<E, H, T>(access: Access, handler: H) -> Entry
where
    E: ingest_protocol::endpoint::Endpoint,
    H: Handler<T, AppState>,
    T: 'static,
{
    let method = match E::METHOD {
        ingest_protocol::endpoint::Method::Get => Method::GET,
        ingest_protocol::endpoint::Method::Post => Method::POST,
        ingest_protocol::endpoint::Method::Delete => Method::DELETE,
    };
    entry(method, E::ROUTE, access, handler)
}

fn table() -> Vec<Entry> {
    use ingest_protocol::endpoint as e;
    use Access::{Admin, Depositor, Metrics, Public, Reader, Worker};
    use Method as M;
    vec![
        // Depositors (the admin token works too).
        route::<e::Submit, _, _>(Depositor, depositor::submit),
        route::<e::GetBatch, _, _>(Depositor, depositor::batch),
        route::<e::BatchHistory, _, _>(Depositor, depositor::batch_history),
        entry(
            M::GET,
            "/batches/{bid}/report",
            Depositor,
            depositor::batch_report,
        ),
        entry(
            M::GET,
            "/batch-uuids/{uuid}",
            Depositor,
            depositor::batch_by_uuid,
        ),
        route::<e::GetJob, _, _>(Depositor, depositor::job),
        route::<e::ListBatches, _, _>(Depositor, listing::batches),
        route::<e::ListJobs, _, _>(Depositor, listing::jobs),
        route::<e::JobHistory, _, _>(Depositor, depositor::job_history),
        route::<e::SearchHistory, _, _>(Depositor, depositor::history),
        // Workers.
        route::<e::AcquireBatch, _, _>(Worker, worker::acquire_batch),
        route::<e::ReportBatch, _, _>(Worker, worker::report_batch),
        route::<e::ListReporting, _, _>(Worker, worker::reporting_batches),
        route::<e::StartJob, _, _>(Worker, worker::start_job),
        route::<e::JobWaiting, _, _>(Worker, waiting::waiting),
        route::<e::JobOutcome, _, _>(Worker, worker::outcome),
        route::<e::JobRetry, _, _>(Worker, worker::retry),
        route::<e::AssignArk, _, _>(Worker, objects::ark),
        route::<e::LookupArks, _, _>(Worker, objects::lookup),
        route::<e::RecordObject, _, _>(Worker, objects::record),
        // Objects (any token).
        route::<e::FindObject, _, _>(Reader, objects::by_local_id),
        route::<e::GetObject, _, _>(Reader, objects::object),
        entry(
            M::GET,
            "/content/{node}/{ark}/{version}/{*file}",
            Reader,
            content::content,
        ),
        entry(M::GET, "/deliveries/{name}", Public, deliveries::delivery),
        // Admins.
        route::<e::HoldJob, _, _>(Admin, admin::hold_job),
        route::<e::ReleaseJob, _, _>(Admin, admin::release_job),
        route::<e::RequeueJob, _, _>(Admin, admin::requeue_job),
        route::<e::FailJob, _, _>(Admin, admin::fail_job),
        route::<e::DeleteJob, _, _>(Admin, admin::delete_job),
        route::<e::ReleaseBatch, _, _>(Admin, admin::release_batch),
        route::<e::UpdateReporting, _, _>(Admin, admin::update_reporting),
        route::<e::DeleteBatch, _, _>(Admin, admin::delete_batch),
        entry(M::GET, "/collections/{profile}", Admin, admin::collection),
        route::<e::HoldCollection, _, _>(Admin, admin::hold_collection),
        route::<e::ReleaseCollection, _, _>(Admin, admin::release_collection),
        route::<e::ReleaseCollectionJobs, _, _>(Admin, admin::release_collection_jobs),
        entry(M::GET, "/queue", Admin, admin::queue),
        route::<e::PauseQueue, _, _>(Admin, admin::pause),
        route::<e::ResumeQueue, _, _>(Admin, admin::resume),
        route::<e::Cleanup, _, _>(Admin, admin::cleanup),
        route::<e::GetStatus, _, _>(Admin, admin::status),
        route::<e::Verify, _, _>(Admin, ops::verify),
        route::<e::AuditBundle, _, _>(Admin, audit::bundle),
        route::<e::AuditProof, _, _>(Admin, audit::proof),
        route::<e::GetTree, _, _>(Admin, ops::tree),
        route::<e::Diff, _, _>(Admin, ops::diff),
        route::<e::DiffRepair, _, _>(Admin, ops::diff_repair),
        route::<e::Consistency, _, _>(Admin, consistency::report),
        route::<e::ConsistencyRepair, _, _>(Admin, consistency::repair),
        entry(M::GET, "/faults", Admin, ops::faults),
        entry(M::POST, "/faults", Admin, ops::arm_fault),
        entry(M::DELETE, "/faults", Admin, ops::clear_faults),
        // The access (assembly) queue.
        route::<e::RequestAccess, _, _>(Depositor, access::request),
        route::<e::ListAccess, _, _>(Depositor, access::list),
        route::<e::GetAccess, _, _>(Depositor, access::show),
        route::<e::StartAccess, _, _>(Worker, access::start),
        route::<e::AccessOutcome, _, _>(Worker, access::outcome),
        route::<e::ReportProgress, _, _>(Worker, assembling::progress),
        route::<e::RequeueAccess, _, _>(Admin, access::requeue),
        route::<e::DeleteAccess, _, _>(Admin, access::delete),
        route::<e::PauseAccessQueue, _, _>(Admin, access::pause),
        route::<e::ResumeAccessQueue, _, _>(Admin, access::resume),
        // Operations.
        route::<e::Metrics, _, _>(Metrics, metrics),
        entry(M::GET, "/openapi.yaml", Public, openapi),
        entry(M::GET, "/healthz", Public, healthz),
        entry(M::GET, "/readyz", Public, readyz),
        // Replication.
        entry(M::GET, "/replication", Reader, replication::status),
        entry(M::GET, "/replication/frames", Admin, replication::frames),
    ]
}

/// Every route the router serves, in the order of the table.
pub fn routes() -> Vec<RouteInfo> {
    table().into_iter().map(|(info, _)| info).collect()
}

/// Builds the router.
pub fn router(config: ApiConfig) -> Router {
    let views = Views::new();
    let max_body = config.max_body_bytes;
    let state = AppState {
        inner: Arc::new(Inner {
            handle: config.handle,
            tokens: config.tokens,
            profiles: config.profiles,
            locks: config.locks,
            metrics: config.metrics,
            max_body_bytes: max_body,
            max_record_bytes: config.max_record_bytes.max(max_body),
            zookeeper: config.zookeeper,
            projector_gate: config.projector_gate,
            inventory: config.inventory,
            storage_targets: config.storage_targets,
            content_nodes: config.content_nodes,
            delivery_dir: config.delivery_dir,
            replication: config.replication,
            minter: config.minter,
            outbound: config.outbound,
            access_size_limit: ingest_events::event::AccessQueue::DEFAULT_SIZE_LIMIT,
            listing_budget: budget::ListingBudget::new(config.listing_items_per_second),
            converger: config.converger,
            views: Arc::new(Mutex::new(views)),
            readiness_logged: Mutex::new(None),
            waits: waiting::Waits::default(),
            assembling: assembling::Assembling::default(),
        }),
    };
    let mut by_path: BTreeMap<&'static str, MethodRouter<AppState>> = BTreeMap::new();
    let max_record = config.max_record_bytes.max(max_body);
    for (info, method_router) in table() {
        // The inventory record of a version grows with its files: its route
        // reads up to its own limit (before, a 15,000-file object was stored
        // and then could not be recorded: 413).
        let method_router = if info.path == RECORD_ROUTE {
            method_router.layer(DefaultBodyLimit::max(max_record))
        } else {
            method_router
        };
        let guarded = method_router.route_layer(middleware::from_fn_with_state(
            (state.clone(), info.access),
            auth::require,
        ));
        let merged = match by_path.remove(info.path) {
            Some(existing) => existing.merge(guarded),
            None => guarded,
        };
        by_path.insert(info.path, merged);
    }
    let mut router = Router::new();
    for (path, method_router) in by_path {
        router = router.route(path, method_router);
    }
    if let Some(Pages(pages)) = config.pages {
        router = router.merge(pages(state.clone()));
    }
    router
        .fallback(no_route)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(state.clone(), limit_body))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            replication::route,
        ))
        .layer(DefaultBodyLimit::max(max_body))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            record_metrics,
        ))
        .layer(
            TraceLayer::new_for_http()
                .make_span_with(|req: &Request| {
                    let correlation_id = req
                        .extensions()
                        .get::<CorrelationId>()
                        .map(|c| c.0.to_string())
                        .unwrap_or_default();
                    tracing::info_span!(
                        "http",
                        method = %req.method(),
                        path = %req.uri().path(),
                        correlation_id = %correlation_id,
                        status = tracing::field::Empty,
                        latency_ms = tracing::field::Empty,
                    )
                })
                .on_request(())
                .on_response(|res: &Response, latency: Duration, span: &Span| {
                    span.record("status", res.status().as_u16());
                    span.record("latency_ms", latency.as_millis() as u64);
                    tracing::info!(
                        status = res.status().as_u16(),
                        latency_ms = latency.as_millis() as u64,
                        "answered"
                    );
                })
                .on_failure(()),
        )
        .layer(middleware::from_fn(correlation))
        .with_state(state)
}

/// A request's correlation id (recorded with its events).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CorrelationId(pub Uuid);

impl<S: Send + Sync> FromRequestParts<S> for CorrelationId {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(parts
            .extensions
            .get::<CorrelationId>()
            .copied()
            .unwrap_or_else(|| CorrelationId(Uuid::new_v4())))
    }
}

async fn correlation(mut req: Request, next: Next) -> Response {
    let given = req
        .headers()
        .get(CORRELATION_HEADER)
        .map(|v| v.to_str().ok().and_then(|s| Uuid::parse_str(s.trim()).ok()));
    let (id, bad) = match given {
        None => (Uuid::new_v4(), false),
        Some(Some(id)) => (id, false),
        Some(None) => (Uuid::new_v4(), true),
    };
    let mut res = if bad {
        ApiError::bad_request(
            "invalid_header",
            format!("{CORRELATION_HEADER} must be a uuid; leave it out to get one generated"),
        )
        .with("header", CORRELATION_HEADER)
        .into_response()
    } else {
        req.extensions_mut().insert(CorrelationId(id));
        next.run(req).await
    };
    if let Ok(v) = HeaderValue::from_str(&id.to_string()) {
        res.headers_mut()
            .insert(HeaderName::from_static(CORRELATION_HEADER), v);
    }
    res
}

async fn record_metrics(State(app): State<AppState>, req: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = req.method().to_string();
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_string(), |p| p.as_str().to_string());
    let res = next.run(req).await;
    app.inner
        .metrics
        .observe_http(&method, &route, res.status().as_u16(), started.elapsed());
    res
}

/// The route whose body limit is `max_record_bytes`.
pub const RECORD_ROUTE: &str =
    <ingest_protocol::endpoint::RecordObject as ingest_protocol::endpoint::Endpoint>::ROUTE;

/// Refuses a declared body over the route's limit before reading it; bodies
/// without a length are cut by `DefaultBodyLimit` while reading.
async fn limit_body(State(app): State<AppState>, req: Request, next: Next) -> Response {
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    let limit = match req.extensions().get::<MatchedPath>() {
        Some(p) if p.as_str() == RECORD_ROUTE => app.inner.max_record_bytes,
        _ => app.inner.max_body_bytes,
    };
    match declared {
        Some(n) if n > limit as u64 => ApiError::payload_too_large(limit).into_response(),
        _ => next.run(req).await,
    }
}

async fn no_route(req: Request) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "no_route",
        format!(
            "no route {} {} (see GET /openapi.yaml)",
            req.method(),
            req.uri().path()
        ),
    )
}

async fn method_not_allowed(req: Request) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!("{} is not allowed on {}", req.method(), req.uri().path()),
    )
}

async fn metrics(State(app): State<AppState>) -> Result<Response, ApiError> {
    let metrics = Arc::clone(&app.inner.metrics);
    let page = tokio::task::spawn_blocking(move || metrics.render())
        .await
        .map_err(|e| ApiError::internal(format!("the metrics task failed: {e}")))?
        .map_err(|e| ApiError::internal(e.to_string()))?;
    Ok(([(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)], page).into_response())
}

/// The most events a follower may be behind the leader and be ready.
pub const READY_MAX_REPLICA_LAG: u64 = 10_000;

/// The largest projector lag, in seconds, at which the server is ready.
pub const READY_MAX_SECONDS_BEHIND: f64 = 60.0;

/// How long a check or a diff may hold the projector (while it reads the
/// tree) before `/readyz` says not ready.
pub const READY_MAX_HELD: std::time::Duration = std::time::Duration::from_secs(30);

/// `GET /healthz`: the process answers (no token, no checks).
async fn healthz() -> Response {
    (StatusCode::OK, "ok\n").into_response()
}

/// `GET /readyz`: 200 when the writer takes commands and, with ZooKeeper,
/// the projector is connected (or standing by) and at most
/// [`READY_MAX_SECONDS_BEHIND`] behind; 503 with the reasons otherwise.
async fn readyz(State(app): State<AppState>) -> Response {
    let writer = app.inner.handle.is_running();
    let mut reasons = Vec::new();
    // The kinds of the reasons, without their figures: what a log line is
    // written for when it changes.
    let mut kinds: Vec<String> = Vec::new();
    if !writer {
        reasons.push("the engine's writer has stopped and takes no commands".to_string());
        kinds.push("writer".into());
    }
    let replica = app.inner.replication.as_ref().map(|c| c.get());
    if let Some(r) = &replica {
        use ingest_replication::Role;
        match r.role {
            Role::Leader | Role::Single => {}
            Role::Follower => {
                if r.lag.unwrap_or(0) > READY_MAX_REPLICA_LAG {
                    reasons.push(format!(
                        "this follower is {} events behind the leader (at most {READY_MAX_REPLICA_LAG})",
                        r.lag.unwrap_or(0)
                    ));
                }
            }
            other => reasons.push(format!(
                "this engine is {}{}",
                serde_json::to_value(other)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default(),
                r.reason
                    .as_deref()
                    .map(|why| format!(": {why}"))
                    .unwrap_or_default()
            )),
        }
    }
    // Only the leader projects: a follower's last projector status (from
    // when it led) says nothing now.
    let projects = replica
        .as_ref()
        .is_none_or(|r| matches!(r.role, ingest_replication::Role::Leader));
    let status = app.inner.metrics.projector_status().filter(|_| projects);
    let projector = status.as_ref().map(|s| {
        use ingest_projections::SinkState;
        match &s.state {
            SinkState::Starting => "starting",
            SinkState::Connected => "connected",
            SinkState::Disconnected => "disconnected",
            SinkState::Standby { .. } => "standby",
            SinkState::Stopped(_) => "stopped",
            SinkState::Rebuilding { .. } => "rebuilding",
            _ => "unknown",
        }
        .to_string()
    });
    if let Some(s) = &status {
        match projector.as_deref() {
            Some("connected" | "standby") => {}
            Some(state) => {
                kinds.push(state.to_string());
                reasons.push(match &s.state {
                ingest_projections::SinkState::Rebuilding { marker } => format!(
                    "the ZooKeeper tree is incomplete: {marker} did not finish; the projector is finishing it (the queue is paused meanwhile)"
                ),
                ingest_projections::SinkState::Stopped(Some(error)) => format!(
                    "the projector stopped: {}",
                    ingest_protocol::cut(error, 1000)
                ),
                ingest_projections::SinkState::Disconnected => {
                    "ZooKeeper is unreachable: the projector lost its session and is retrying"
                        .to_string()
                }
                ingest_projections::SinkState::Starting => {
                    "the projector has not reached ZooKeeper yet".to_string()
                }
                _ => format!("the projector is {state}"),
            })
            }
            None => {}
        }
        if let Some(held) = app
            .inner
            .projector_gate
            .as_ref()
            .and_then(ingest_projections::ProjectorGate::held_for)
            .filter(|held| *held > READY_MAX_HELD)
        {
            kinds.push("held".into());
            reasons.push(format!(
                "a consistency check or a diff has held the projector for {} s while it reads the tree (at most {} s)",
                held.as_secs(),
                READY_MAX_HELD.as_secs()
            ));
        }
        if s.seconds_behind > READY_MAX_SECONDS_BEHIND {
            kinds.push("behind".into());
            reasons.push(format!(
                "the projector is {:.0} s behind (at most {READY_MAX_SECONDS_BEHIND:.0} s)",
                s.seconds_behind
            ));
        }
    }
    let body = ingest_protocol::view::Readiness {
        ready: reasons.is_empty(),
        writer,
        projector,
        events_behind: status.as_ref().map(|s| s.events_behind),
        seconds_behind: status.as_ref().map(|s| s.seconds_behind),
        reasons,
        role: replica.as_ref().map(|r| {
            serde_json::to_value(r.role)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default()
        }),
        epoch: replica.as_ref().and_then(|r| r.epoch),
        applied: Some(app.inner.handle.state().position),
        leader: replica.as_ref().and_then(|r| r.leader_url.clone()),
        converging: status
            .as_ref()
            .and_then(|s| s.converging)
            .map(|(done, items)| ingest_protocol::view::Converging { done, items }),
    };
    log_readiness_change(&app, body.ready, &kinds, &body.reasons);
    let code = match body.ready {
        true => StatusCode::OK,
        false => StatusCode::SERVICE_UNAVAILABLE,
    };
    (code, axum::Json(body)).into_response()
}

/// Logs `/readyz`'s answer when it changed since the last one logged
/// (ready or not, and the kinds of the reasons): a probe every second
/// during an outage wrote an ERROR line every second.
fn log_readiness_change(app: &AppState, ready: bool, kinds: &[String], reasons: &[String]) {
    let key = format!("{ready}:{}", kinds.join(","));
    let mut last = app
        .inner
        .readiness_logged
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if last.as_deref() == Some(key.as_str()) {
        return;
    }
    let first = last.is_none();
    *last = Some(key);
    match ready {
        false => tracing::error!(?reasons, "not ready"),
        // The first answer of a healthy process is no news.
        true if !first => tracing::info!("ready again"),
        true => {}
    }
}

async fn openapi() -> Response {
    (
        [(header::CONTENT_TYPE, "application/yaml; charset=utf-8")],
        OPENAPI_YAML,
    )
        .into_response()
}

/// The answer of an action: the events it appended.
pub(crate) fn appended(o: &Outcome) -> Appended {
    Appended {
        events: rows(&o.records),
    }
}

pub(crate) fn rows(records: &[Recorded]) -> Vec<HistoryRow> {
    records.iter().map(HistoryRow::from).collect()
}

impl AppState {
    /// Executes one command with the request's correlation id.
    pub(crate) async fn execute(
        &self,
        actor: Actor,
        cid: CorrelationId,
        command: Command,
    ) -> Result<Outcome, ApiError> {
        Ok(self
            .inner
            .handle
            .execute_correlated(actor, cid.0, command)
            .await?)
    }

    /// Runs `f` on the reporting views, folded up to the durable position
    /// first (so a client reads its own acknowledged writes).
    pub(crate) async fn views<R, F>(&self, f: F) -> Result<R, ApiError>
    where
        R: Send + 'static,
        F: FnOnce(&Views) -> R + Send + 'static,
    {
        let views = Arc::clone(&self.inner.views);
        let log = Arc::clone(self.inner.handle.log());
        tokio::task::spawn_blocking(move || {
            let mut v = views.lock().unwrap_or_else(|e| e.into_inner());
            let durable = log.durable_position();
            let from = v.state().position + 1;
            if from <= durable {
                for record in log.read_range(from, durable) {
                    let record = record.map_err(error::read_error)?;
                    v.apply(&record).map_err(|e| {
                        ApiError::internal(format!("the reporting views cannot fold the log: {e}"))
                    })?;
                }
            }
            Ok(f(&v))
        })
        .await
        .map_err(|e| ApiError::internal(format!("the views task failed: {e}")))?
    }
}

/// Checks a free-text name (worker, admin) given in a request.
pub(crate) fn check_name(field: &str, value: &str) -> Result<(), ApiError> {
    if value.trim().is_empty() {
        return Err(ApiError::invalid_field(field, "is required"));
    }
    if value.len() > 200 {
        return Err(ApiError::invalid_field(field, "is longer than 200 bytes"));
    }
    if value.chars().any(|c| c.is_control()) {
        return Err(ApiError::invalid_field(
            field,
            "contains control characters",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ingest_config::Secret;
    use ingest_engine::engine::{Engine, EngineConfig};
    use ingest_engine::service::EngineService;

    #[test]
    fn every_route_is_unique_and_every_path_param_is_braced() {
        let mut seen = std::collections::BTreeSet::new();
        for r in routes() {
            assert!(
                seen.insert((r.method.to_string(), r.path)),
                "{} {} twice",
                r.method,
                r.path
            );
            assert!(
                !r.path.contains(':'),
                "{}: axum 0.8 paths use {{param}}",
                r.path
            );
        }
    }

    /// Every endpoint the client and the workers call is served, with its
    /// method on its route pattern (the table takes both from it).
    #[test]
    fn every_endpoint_of_the_contract_is_served() {
        let served: std::collections::BTreeSet<(String, &str)> = routes()
            .into_iter()
            .map(|r| (r.method.to_string(), r.path))
            .collect();
        for e in ingest_protocol::endpoint::every() {
            assert!(
                served.contains(&(e.method.to_string(), e.route)),
                "{} {} is not served",
                e.method,
                e.route
            );
        }
    }

    // A worker whose session holds the lock gets its outcome recorded.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_fenced_outcome_is_accepted_for_the_lock_holder() {
        let dir = tempfile::tempdir().expect("tempdir");
        let service =
            EngineService::start(Engine::open(EngineConfig::new(dir.path())).expect("open"));
        let handle = service.handle();
        let tokens = Tokens {
            admin: Secret::new("admin-token-0123456789"),
            depositor: Secret::new("depositor-token-0123456789"),
            worker: Secret::new("worker-token-0123456789"),
            metrics: None,
            admins: Vec::new(),
            depositors: Vec::new(),
        };
        let app = router(ApiConfig {
            metrics: Arc::new(Metrics::new(handle.clone())),
            handle: handle.clone(),
            tokens,
            profiles: Profiles::unrestricted(),
            locks: Arc::new(locks::AcceptAll(42)),
            max_body_bytes: 64 * 1024,
            max_record_bytes: 64 * 1024,
            zookeeper: None,
            projector_gate: None,
            inventory: None,
            minter: None,
            outbound: ingest_protocol::outbound::OutboundPolicy::default(),
            pages: None,
            storage_targets: Vec::new(),
            content_nodes: Vec::new(),
            delivery_dir: None,
            replication: None,
            listing_items_per_second: ingest_config::DEFAULT_LISTING_ITEMS_PER_SECOND,
            converger: None,
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let base = format!("http://{}", listener.local_addr().expect("addr"));
        let server = tokio::spawn(serve(
            listener,
            app,
            Limits::default(),
            std::future::pending(),
        ));
        let client = reqwest::Client::new();
        let secret = locks::AcceptAll::secret().to_header();
        let post = |path: &str, token: &str, body: serde_json::Value| {
            client
                .post(format!("{base}{path}"))
                .bearer_auth(token)
                .header(ingest_protocol::fence::FENCE_HEADER, &secret)
                .json(&body)
                .send()
        };
        let res = post(
            "/batches",
            "depositor-token-0123456789",
            serde_json::json!({"submitter": "a", "profile": "p", "payload_url": "https://example.org/x"}),
        )
        .await
        .expect("submit");
        assert_eq!(res.status(), 201);
        let worker = serde_json::json!({"worker": "w", "session_id": 42});
        for path in [
            "/batches/bid0000000001/acquire",
            "/jobs/jid0000000001/start",
        ] {
            let res = post(path, "worker-token-0123456789", worker.clone())
                .await
                .expect("post");
            assert_eq!(res.status(), 200, "{path}: {:?}", res.text().await);
        }
        let res = post(
            "/jobs/jid0000000001/outcome",
            "worker-token-0123456789",
            serde_json::json!({"worker": "w", "session_id": "0x2a", "state": "estimating", "outcome": "success", "space_needed": 10}),
        )
        .await
        .expect("outcome");
        assert_eq!(res.status(), 200, "{:?}", res.text().await);
        {
            let state = handle.state();
            let job = &state.jobs[&ingest_events::Jid(1)];
            assert_eq!(job.status, ingest_events::JobState::Provisioning);
            assert_eq!(job.space_needed, 10);
        }
        // Faults go only to states with a step; the domain refuses the
        // others and the answer names the field.
        let arm = |state: &str| {
            post(
                "/faults",
                "admin-token-0123456789",
                serde_json::json!({"state": state, "reason": "test", "actor": "carol"}),
            )
        };
        let res = arm("Held").await.expect("arm");
        assert_eq!(res.status(), 422);
        let body: serde_json::Value = res.json().await.expect("json");
        assert_eq!(body["error"]["field"], "state", "{body}");
        let res = arm("Storing").await.expect("arm");
        assert_eq!(res.status(), 201, "{:?}", res.text().await);
        server.abort();
        service.shutdown().await;
    }
}
