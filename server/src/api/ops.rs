//! Operator routes: the log's `verify`, the projected `tree`, the live
//! tree's `diff`, and fault injection. They let the CLI's commands run
//! against a server (`ingest --engine URL verify`, …) while the server holds
//! the data directory, which sled lets only one process open.

use ingest_protocol::api::*;
use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use ingest_events::command::{Command, MAX_FAULTS};
use ingest_events::JobState;
use ingest_projections::rebuild;

use super::admin::{admin_actor, check_reason};
use super::{ApiError, ApiJson, AppState, CorrelationId};

/// `POST /faults`: the next `count` successful reports of a step are
/// recorded as failures. Armed faults are events (`FaultsArmed`), folded
/// into the engine's state, so a restart keeps them armed; the engine
/// turns a success into the failure when the report arrives (`FaultFired`
/// in the same append).
pub(crate) async fn arm_fault(
    State(app): State<AppState>,
    cid: CorrelationId,
    who: super::auth::AdminName,
    ApiJson(body): ApiJson<FaultBody>,
) -> Result<(StatusCode, Json<FaultsView>), ApiError> {
    let actor = admin_actor(&who, body.actor.as_deref())?;
    let reason = check_reason(&body.reason)?;
    let state = body
        .state
        .parse::<JobState>()
        .map_err(|e| ApiError::invalid_field("state", e.to_string()))?;
    // Only states with a step take faults: `decide` refuses the others.
    let count = body.count.unwrap_or(1);
    if count == 0 || count > MAX_FAULTS {
        return Err(ApiError::invalid_field(
            "count",
            format!("{count} is outside 1-{MAX_FAULTS}"),
        ));
    }
    tracing::warn!(%state, count, %actor, reason = %ingest_protocol::bounded(&reason), "fault armed");
    app.execute(
        actor,
        cid,
        Command::ArmFaults {
            state,
            count,
            reason,
        },
    )
    .await?;
    Ok((StatusCode::CREATED, Json(armed(&app))))
}

/// The faults still armed, from the engine's published state.
fn armed(app: &AppState) -> FaultsView {
    FaultsView {
        armed: app
            .inner
            .handle
            .state()
            .armed_faults()
            .into_iter()
            .map(|(s, n)| (s.to_string(), n as usize))
            .collect(),
    }
}

/// `GET /faults`.
pub(crate) async fn faults(State(app): State<AppState>) -> Json<FaultsView> {
    Json(armed(&app))
}

/// `DELETE /faults`: disarms every fault (`FaultsCleared`; nothing is
/// appended when none is armed).
pub(crate) async fn clear_faults(
    State(app): State<AppState>,
    cid: CorrelationId,
    who: super::auth::AdminName,
) -> Result<Json<BTreeMap<&'static str, usize>>, ApiError> {
    let actor = admin_actor(&who, None)?;
    let n: u32 = app.inner.handle.state().armed_faults().values().sum();
    if n > 0 {
        app.execute(actor, cid, Command::ClearFaults).await?;
    }
    tracing::info!(disarmed = n, "faults cleared");
    Ok(Json(BTreeMap::from([("disarmed", n as usize)])))
}

/// `GET /verify`: re-checks the whole hash chain and the stream index, the
/// signed checkpoints and the snapshots.
pub(crate) async fn verify(State(app): State<AppState>) -> Result<Json<Verified>, ApiError> {
    let log = Arc::clone(app.inner.handle.log());
    let data_dir = app.inner.handle.data_dir().to_path_buf();
    let full = tokio::task::spawn_blocking(move || {
        ingest_engine::audit::verify(&log, &data_dir, None, |_| {})
    })
    .await
    .map_err(|e| ApiError::internal(format!("the verify task failed: {e}")))?
    .map_err(|e| ApiError::internal(format!("cannot verify the log: {e}")))?;
    let verified = ingest_engine::verified::view(&full);
    let data_dir = app.inner.handle.data_dir();
    if let Err(e) = ingest_engine::verified::remember(data_dir, &verified, chrono::Utc::now()) {
        tracing::warn!(error = %e, "cannot keep the verify's result for status");
    }
    Ok(Json(verified))
}

/// `GET /tree`: the tree the log projects (as of `at`), as YAML.
pub(crate) async fn tree(
    State(app): State<AppState>,
    query: Result<Query<TreeQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::bad_request("invalid_query", e.body_text()))?;
    let log = Arc::clone(app.inner.handle.log());
    let at = query.at.clone();
    let tree = tokio::task::spawn_blocking(move || {
        ingest_engine::tree::tree_from_log(&log, at.as_deref())
    })
    .await
    .map_err(|e| ApiError::internal(format!("the tree task failed: {e}")))?
    .map_err(|e| ApiError::invalid_field("at", format!("{e:#}")))?;
    let text = tree.dump_yaml(query.path.as_deref());
    Ok((
        [(header::CONTENT_TYPE, "application/yaml; charset=utf-8")],
        text,
    )
        .into_response())
}

/// `GET /diff`: compares the live ZooKeeper tree with the log at the tree's
/// checkpoint. Read-only: repairing needs the projector role (`ingest diff
/// --repair` with the server stopped).
pub(crate) async fn diff(State(app): State<AppState>) -> Result<Json<Diffed>, ApiError> {
    diffed(&app).await.map(Json)
}

/// The live tree compared with the log, as `GET /diff` answers it.
async fn diffed(app: &AppState) -> Result<Diffed, ApiError> {
    let Some(zk) = app.inner.zookeeper.clone() else {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "no_zookeeper",
            "this server has no ZooKeeper configured, so there is no live tree to compare",
        ));
    };
    let log = Arc::clone(app.inner.handle.log());
    let zk_config = zk.clone();
    // While this server's projector runs, the tree and its checkpoint move
    // under a reader (the diff gave up after five tries: 503 "checkpoint
    // kept moving"). Holding the projector between two transactions for
    // the read gives one position; it resumes when the diff is done.
    let held = match &app.inner.projector_gate {
        Some(gate) => Some(gate.hold().await),
        None => None,
    };
    // The tree is read on the runtime (ZooKeeper I/O); the log is read and
    // folded on a blocking thread.
    let found = match rebuild::read_checkpointed(&zk_config, &mut |_| {}).await {
        Ok(read) => tokio::task::spawn_blocking(move || {
            let found = rebuild::compare(&log, &zk_config, read, &mut |_| {});
            drop(held);
            found
        })
        .await
        .map_err(|e| ApiError::internal(format!("the diff task failed: {e}")))?,
        Err(e) => Err(e),
    };
    let report = found.map_err(|e| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "zookeeper_unavailable",
            format!(
                "cannot compare the tree under {} with the log: {e}",
                zk.root
            ),
        )
    })?;
    Ok(Diffed {
        checkpoint: report.checkpoint.as_ref().map(ToString::to_string),
        position: report.position,
        expected_nodes: report.expected_nodes,
        live_nodes: report.live_nodes,
        locks: report.locks,
        missing: report.diff.missing.clone(),
        unexpected: report.diff.unexpected.clone(),
        differing: report
            .diff
            .differing
            .iter()
            .map(|d| d.path.clone())
            .collect(),
        text: report.diff.to_string(),
        stale_locks: report.stale_locks,
    })
}

/// The most paths a `TreeRepaired` record of an online repair names (the
/// items' own records name each node they changed).
const MAX_RECORDED_PATHS: usize = 1000;

/// `POST /diff/repair`: `ingest diff --repair` while the server runs. The
/// drifted items are converged by the server's own projector between its
/// transactions (fenced, version-checked, each item recorded in its history
/// with the reason), stale locks are removed version-checked, and one
/// `TreeRepaired` records the paths; the tree is then compared again. On a
/// follower the request goes to the leader, whose projector writes the
/// tree. A tree whose checkpoint is not this log's is not drift of items:
/// that is answered 503, and still needs `ingest rebuild`.
pub(crate) async fn diff_repair(
    State(app): State<AppState>,
    cid: CorrelationId,
    who: super::auth::AdminName,
    ApiJson(body): ApiJson<DiffRepairBody>,
) -> Result<Json<DiffRepaired>, ApiError> {
    let actor = admin_actor(&who, body.actor.as_deref())?;
    let reason = check_reason(&body.reason)?;
    let (Some(converger), Some(zk)) = (app.inner.converger.clone(), app.inner.zookeeper.clone())
    else {
        return Err(ApiError::conflict(
            "needs_projector",
            "this server runs no projector, so nothing here can write the tree: stop it and run `ingest diff --repair` on its data directory",
        ));
    };
    let before = diffed(&app).await?;
    let drift: Vec<String> = before
        .missing
        .iter()
        .chain(&before.unexpected)
        .chain(&before.differing)
        .cloned()
        .collect::<std::collections::BTreeSet<String>>()
        .into_iter()
        .collect();
    let found = drift.len() + before.stale_locks.len();
    let stale_locks_removed = if before.stale_locks.is_empty() {
        Vec::new()
    } else {
        ingest_projections::consistency::delete_subtrees(&zk, &before.stale_locks)
            .await
            .map_err(|e| {
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "zookeeper_unavailable",
                    format!("removing the stale locks failed (nothing was recorded): {e}"),
                )
            })?
    };
    let repaired = if drift.is_empty() {
        Vec::new()
    } else {
        let asked = converger.converge(
            ingest_projections::sink::ConvergeScope::Paths(drift.clone()),
            format!("diff repair by {actor}: {reason}"),
        );
        let wait = ingest_engine::consistency::CONVERGE_WAIT;
        tokio::time::timeout(wait, asked)
            .await
            .map_err(|_| {
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "not_converged",
                    format!(
                        "the projector did not converge the {} drifted path(s) within {} s; it goes on once it leads and has caught up: run `ingest diff` again later",
                        drift.len(),
                        wait.as_secs()
                    ),
                )
            })?
            .map_err(|e| {
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "not_converged",
                    format!("the projector stopped before it converged the drift: {e}"),
                )
            })?
            .repaired
    };
    let mut recorded: Vec<String> = drift;
    recorded.extend(stale_locks_removed.iter().cloned());
    let position = if repaired.is_empty() && stale_locks_removed.is_empty() {
        0
    } else {
        recorded.truncate(MAX_RECORDED_PATHS);
        tracing::warn!(%actor, reason = %ingest_protocol::bounded(&reason), items = repaired.len(), stale_locks = stale_locks_removed.len(), "drift repaired by the running projector");
        let outcome = app
            .execute(actor, cid, Command::RecordRepair { paths: recorded })
            .await?;
        outcome.records.last().map_or(0, |r| r.envelope.position)
    };
    let after = diffed(&app).await?;
    Ok(Json(DiffRepaired {
        found,
        repaired,
        stale_locks_removed,
        position,
        after,
    }))
}
