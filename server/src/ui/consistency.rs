//! The consistency report as the UI gets it, and its repairs: the API's
//! own handlers (`GET /consistency`, `POST /consistency/repair`), so the
//! page shows exactly what `ingest check` prints and a repair from the
//! page is the same recorded command (`ConsistencyRepaired`).

use axum::extract::State;
use axum::Json;
use ingest_protocol::consistency::{ConsistencyReport, RepairBody, RepairDone};

use crate::api::{consistency as api, AdminName, ApiError, ApiJson, AppState, CorrelationId};

/// The consistency report the pages show.
pub(crate) async fn consistency_report(app: &AppState) -> Result<ConsistencyReport, ApiError> {
    api::checked_report(app, api::default_stuck_after()).await
}

/// Repairs one finding as `who`, with `reason`: a message saying what was
/// done.
pub(crate) async fn repair(
    app: &AppState,
    who: &AdminName,
    finding: &str,
    reason: &str,
) -> Result<String, ApiError> {
    let Json(done) = api::repair(
        State(app.clone()),
        CorrelationId(uuid::Uuid::new_v4()),
        who.clone(),
        ApiJson(repair_body(finding, reason)),
    )
    .await?;
    tracing::info!(admin = %who.0, finding = %done.finding.id, "admin web UI: repair applied");
    Ok(repaired(&done))
}

/// The API's body of a repair of `finding` with `reason`.
pub(crate) fn repair_body(finding: &str, reason: &str) -> RepairBody {
    RepairBody {
        finding: finding.to_string(),
        reason: reason.to_string(),
        actor: None,
    }
}

/// What the page says of a repair done.
pub(crate) fn repaired(done: &RepairDone) -> String {
    format!(
        "repaired {} ({}): {}; recorded at position {}",
        done.finding.id, done.finding.rule, done.summary, done.position
    )
}
