//! The consistency report: `GET /consistency` and
//! `POST /consistency/repair` (admin). The rules and the repairs are the
//! engine's ([`ingest_engine::consistency`]); this module reads the sources
//! of a running server (its ZooKeeper, inventory and storage targets) and
//! appends the event that records a repair.

use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::Json;
use chrono::Utc;
use ingest_engine::consistency::{self, Applied, CheckError, Checked, RepairContext, Sources};
use ingest_protocol::consistency::{ConsistencyReport, RepairBody, RepairDone};
use ingest_protocol::cut;

use super::admin::{admin_actor, check_reason};
use super::auth::AdminName;
use super::{ApiError, ApiJson, AppState, CorrelationId};

/// How a check or repair error is answered.
fn answer(e: CheckError) -> ApiError {
    let message = cut(&e.to_string(), 2048).into_owned();
    match e {
        CheckError::NoSuchFinding { .. } => {
            ApiError::new(StatusCode::NOT_FOUND, "no_such_finding", message)
        }
        CheckError::NoRepair { .. } => ApiError::conflict("no_repair", message),
        CheckError::NeedsProjector { .. } => ApiError::conflict("needs_projector", message),
        CheckError::Tree { .. } | CheckError::Repair { .. } => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "zookeeper_unavailable",
            message,
        ),
        CheckError::Storage { .. } | CheckError::Inventory(_) => ApiError::internal(message),
    }
}

/// What a check or a repair does with the server's sources, on a blocking
/// thread (the storage reads block; the tree diff's progress callback is
/// not `Send`), holding the projector between two transactions only while
/// it reads the tree, so the tree and its checkpoint stand still: storage
/// is scanned, and a repair made, with the projector running (a drift
/// repair is made by the projector itself, see [`RepairContext`]).
async fn with_sources<T: Send + 'static>(
    app: &AppState,
    stuck_after_secs: u64,
    run: impl for<'a> FnOnce(
            &'a Sources<'a>,
        ) -> std::pin::Pin<
            Box<dyn std::future::Future<Output = Result<T, CheckError>> + 'a>,
        > + Send
        + 'static,
) -> Result<T, ApiError> {
    let handle = app.inner.handle.clone();
    let log = Arc::clone(handle.log());
    let zk = app.inner.zookeeper.clone();
    let inventory = app.inner.inventory.clone();
    let targets = app.inner.storage_targets.clone();
    let runtime = tokio::runtime::Handle::current();
    let held = match &app.inner.projector_gate {
        Some(gate) => Some(gate.hold().await),
        None => None,
    };
    let result = tokio::task::spawn_blocking(move || {
        let held = std::sync::Mutex::new(held);
        let release = || {
            let guard = held.lock().unwrap_or_else(|e| e.into_inner()).take();
            drop(guard);
        };
        let job = |jid| handle.state().jobs.get(&jid).cloned();
        let sources = Sources {
            log: &log,
            job: &job,
            zk: zk.as_ref(),
            targets: &targets,
            inventory: inventory.as_ref(),
            stuck_after_secs,
            tree_read: Some(&release),
        };
        let result = runtime.block_on(run(&sources));
        release();
        result
    })
    .await
    .map_err(|e| ApiError::internal(format!("the consistency task failed: {e}")))?;
    result.map_err(answer)
}

/// `GET /consistency`'s query.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ReportQuery {
    /// Seconds an access request may be Processing without its lock before
    /// it is reported.
    #[serde(default = "default_stuck_after")]
    stuck_after: u64,
}

pub(crate) fn default_stuck_after() -> u64 {
    ingest_projections::consistency::STUCK_AFTER_SECS
}

/// `GET /consistency[?stuck_after=SECS]`: the report.
pub(crate) async fn report(
    State(app): State<AppState>,
    query: Result<Query<ReportQuery>, QueryRejection>,
) -> Result<Json<ConsistencyReport>, ApiError> {
    let Query(q) = query.map_err(|e| {
        ApiError::bad_request("invalid_query", e.body_text()).with("param", "stuck_after")
    })?;
    checked_report(&app, q.stuck_after).await.map(Json)
}

/// The report, with access requests Processing without a lock for
/// `stuck_after` seconds named (the UI's page shows the default).
pub(crate) async fn checked_report(
    app: &AppState,
    stuck_after: u64,
) -> Result<ConsistencyReport, ApiError> {
    let checked: Checked = with_sources(app, stuck_after, |s| {
        let s = *s;
        Box::pin(async move { consistency::check(s, Utc::now()).await })
    })
    .await?;
    Ok(checked.report)
}

/// `POST /consistency/repair`: applies one finding's repair and records it
/// (`ConsistencyRepaired`). A finding that is no longer there is refused
/// (404 `no_such_finding`); drift needs the projector's role (409
/// `needs_projector`).
pub(crate) async fn repair(
    State(app): State<AppState>,
    cid: CorrelationId,
    who: AdminName,
    ApiJson(body): ApiJson<RepairBody>,
) -> Result<Json<RepairDone>, ApiError> {
    let actor = admin_actor(&who, body.actor.as_deref())?;
    let reason = check_reason(&body.reason)?;
    if body.finding.is_empty() || body.finding.len() > 128 {
        return Err(ApiError::invalid_field(
            "finding",
            "give a finding's id from GET /consistency (at most 128 bytes)",
        ));
    }
    let id = body.finding.clone();
    let why = reason.clone();
    let converger = app.inner.converger.clone();
    // The projector runs again once the tree is read: a drift repair is
    // made by the projector itself, and a deleted foreign node is one the
    // log does not know, which the projector never writes.
    let applied: Applied = with_sources(&app, default_stuck_after(), move |s| {
        let s = *s;
        Box::pin(async move {
            let ctx = RepairContext {
                sources: s,
                admin: None,
                converger: converger.as_ref(),
            };
            consistency::apply(&ctx, &id, &why, Utc::now()).await
        })
    })
    .await?;
    tracing::warn!(finding = %applied.finding.id, %actor, reason = %ingest_protocol::bounded(&reason), summary = %applied.summary, "consistency repair applied");
    let outcome = app.execute(actor, cid, applied.command).await?;
    let position = outcome.records.last().map_or(0, |r| r.envelope.position);
    Ok(Json(RepairDone {
        finding: applied.finding,
        summary: applied.summary,
        position,
    }))
}
