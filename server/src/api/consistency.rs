//! The consistency report: `GET /consistency` and
//! `POST /consistency/repair` (admin). The rules and the repairs are the
//! engine's ([`ingest_engine::consistency`]); this module reads the sources
//! of a running server (its ZooKeeper, inventory and storage targets) and
//! appends the event that records a repair.

use std::sync::atomic::{AtomicBool, Ordering};
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
        // Nobody reads it: the client went away.
        CheckError::Cancelled => {
            ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "cancelled", message)
        }
    }
}

/// The server's sources of a check, owned, so a blocking thread and a
/// handler can each lend them out as [`Sources`].
struct Owned {
    handle: ingest_engine::service::EngineHandle,
    log: Arc<ingest_events::log::Log>,
    zk: Option<ingest_projections::ZkConfig>,
    inventory: Option<ingest_steps::inventory::Inventory>,
    targets: Vec<consistency::TargetSpec>,
}

impl Owned {
    fn of(app: &AppState) -> Owned {
        let handle = app.inner.handle.clone();
        Owned {
            log: Arc::clone(handle.log()),
            handle,
            zk: app.inner.zookeeper.clone(),
            inventory: app.inner.inventory.clone(),
            targets: app.inner.storage_targets.clone(),
        }
    }

    /// Runs `f` with these sources lent out.
    fn lend<R>(
        &self,
        stuck_after_secs: u64,
        tree_read: Option<&(dyn Fn() + Sync)>,
        cancelled: Option<&AtomicBool>,
        f: impl FnOnce(Sources<'_>) -> R,
    ) -> R {
        let job = |jid| self.handle.state().jobs.get(&jid).cloned();
        f(Sources {
            log: &self.log,
            job: &job,
            zk: self.zk.as_ref(),
            targets: &self.targets,
            inventory: self.inventory.as_ref(),
            stuck_after_secs,
            tree_read,
            cancelled,
        })
    }
}

/// Set when dropped: a handler's future is dropped when its client goes
/// away, and the check it started on a blocking thread then stops.
struct CancelOnDrop(Arc<AtomicBool>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// A check of the server's sources. The tree and its checkpoint are read
/// on the runtime (I/O to ZooKeeper, awaited) holding the projector
/// between two transactions, so they stand still; the comparison with the
/// log (a fold) and the scan of storage run on a blocking thread, and the
/// projector is let go once the tree is compared: storage is scanned with
/// the projector running. A client that goes away cancels the scan
/// ([`CancelOnDrop`]); every check's outcome is counted
/// (`ingest_consistency_checks_total`).
async fn checked(app: &AppState, stuck_after_secs: u64) -> Result<(Owned, Checked), ApiError> {
    let owned = Owned::of(app);
    let cancelled = Arc::new(AtomicBool::new(false));
    let _cancel = CancelOnDrop(Arc::clone(&cancelled));
    let held = match &app.inner.projector_gate {
        Some(gate) => Some(gate.hold().await),
        None => None,
    };
    let tree = consistency::read_tree(owned.zk.as_ref())
        .await
        .map_err(answer)?;
    let metrics = Arc::clone(&app.inner.metrics);
    let result = tokio::task::spawn_blocking(move || {
        let held = std::sync::Mutex::new(held);
        let release = || {
            let guard = held.lock().unwrap_or_else(|e| e.into_inner()).take();
            drop(guard);
        };
        let result = owned.lend(
            stuck_after_secs,
            Some(&release),
            Some(&cancelled),
            |sources| consistency::check_read(sources, tree, Utc::now()),
        );
        release();
        let outcome = match &result {
            Ok(_) => "done",
            Err(CheckError::Cancelled) => {
                tracing::info!(
                    "a consistency check stopped scanning storage: its client went away"
                );
                "cancelled"
            }
            Err(_) => "failed",
        };
        metrics.count_consistency_check(outcome);
        result.map(|checked| (owned, checked))
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
    let (_, checked) = checked(app, stuck_after).await?;
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
    // The projector runs again once the tree is read: a drift repair is
    // made by the projector itself, and a deleted foreign node is one the
    // log does not know, which the projector never writes.
    let (owned, checked) = checked(&app, default_stuck_after()).await?;
    let converger = app.inner.converger.clone();
    let job = |jid| owned.handle.state().jobs.get(&jid).cloned();
    let ctx = RepairContext {
        sources: Sources {
            log: &owned.log,
            job: &job,
            zk: owned.zk.as_ref(),
            targets: &owned.targets,
            inventory: owned.inventory.as_ref(),
            stuck_after_secs: default_stuck_after(),
            tree_read: None,
            cancelled: None,
        },
        admin: None,
        converger: converger.as_ref(),
    };
    let applied: Applied =
        consistency::apply_checked(&ctx, &checked, &body.finding, &reason, Utc::now())
            .await
            .map_err(answer)?;
    tracing::warn!(finding = %applied.finding.id, %actor, reason = %ingest_protocol::bounded(&reason), summary = %applied.summary, "consistency repair applied");
    let outcome = app.execute(actor, cid, applied.command).await?;
    let position = outcome.records.last().map_or(0, |r| r.envelope.position);
    Ok(Json(RepairDone {
        finding: applied.finding,
        summary: applied.summary,
        position,
    }))
}
