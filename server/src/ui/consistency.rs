//! The consistency report as the UI gets it, and its repairs: the ONE
//! place each comes from, to be pointed at the consistency checker (`GET
//! /consistency`, `POST /consistency/repair`) when it lands.
//!
//! For now the report is built from the live tree's drift check (the
//! function behind `GET /diff`): one finding per kind of drift (nodes
//! missing from ZooKeeper, nodes it should not hold, nodes whose data
//! differs, stale locks). The server cannot repair drift while its
//! projector runs (`ingest diff --repair` needs the server stopped), so
//! [`repair`] refuses, saying so; the page shows the repair each finding
//! would get.

use axum::extract::State;
use axum::http::StatusCode;
use ingest_protocol::api::Diffed;
use ingest_protocol::consistency::{ConsistencyReport, Finding, Repair, Severity};

use crate::api::{AdminName, ApiError, AppState};

/// The consistency report the pages show.
pub(crate) async fn consistency_report(app: &AppState) -> Result<ConsistencyReport, ApiError> {
    let axum::Json(diff) = crate::api::ops::diff(State(app.clone())).await?;
    Ok(from_diff(&diff))
}

/// Repairs one finding as `who`, with `reason`: a message saying what was
/// done.
pub(crate) async fn repair(
    app: &AppState,
    who: &AdminName,
    finding: &str,
    reason: &str,
) -> Result<String, ApiError> {
    crate::api::admin::check_reason(reason)?;
    let report = consistency_report(app).await?;
    let Some(found) = report.findings.iter().find(|f| f.id == finding) else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            "that finding is not in the current report (it may have been repaired); reload the page",
        ));
    };
    tracing::info!(admin = %who.0, finding = %found.id, "admin web UI: repair asked for");
    Err(ApiError::conflict(
        "repair_unavailable",
        format!(
            "{} cannot be repaired from a running server yet: stop the server and run `ingest diff --repair`",
            found.rule
        ),
    ))
}

/// One finding per kind of drift in a `GET /diff` answer.
pub(crate) fn from_diff(d: &Diffed) -> ConsistencyReport {
    let repair = |what: &str| {
        Some(Repair {
            action: "reproject".into(),
            description: format!(
                "{what}: re-project the tree from the log (`ingest diff --repair`)"
            ),
        })
    };
    let mut findings = Vec::new();
    let mut add = |rule: &str, severity, paths: &[String], what: &str, fix: Option<Repair>| {
        if paths.is_empty() {
            return;
        }
        let shown: Vec<&str> = paths.iter().take(20).map(String::as_str).collect();
        findings.push(Finding {
            id: format!("diff-{rule}"),
            rule: rule.to_string(),
            severity,
            path: paths[0].clone(),
            subject: None,
            age_secs: None,
            detail: format!(
                "{} node(s) {what}: {}{}",
                paths.len(),
                shown.join(", "),
                if paths.len() > shown.len() {
                    ", …"
                } else {
                    ""
                }
            ),
            repair: fix,
        });
    };
    add(
        "missing-nodes",
        Severity::Fail,
        &d.missing,
        "the log expects but ZooKeeper lacks",
        repair("create them"),
    );
    add(
        "unexpected-nodes",
        Severity::Warn,
        &d.unexpected,
        "ZooKeeper holds but the log does not expect",
        repair("remove them"),
    );
    add(
        "differing-nodes",
        Severity::Fail,
        &d.differing,
        "whose data differs from the log's",
        repair("rewrite them"),
    );
    add(
        "stale-locks",
        Severity::Warn,
        &d.stale_locks,
        "are locks whose owner is gone",
        Some(Repair {
            action: "remove-lock".into(),
            description: "remove the stale locks".into(),
        }),
    );
    ConsistencyReport {
        checked_at: chrono::Utc::now().to_rfc3339(),
        position: d.position,
        nodes_checked: d.live_nodes as u64,
        findings,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_of_drift_is_one_finding() {
        let d = Diffed {
            checkpoint: None,
            position: 7,
            expected_nodes: 3,
            live_nodes: 4,
            locks: Vec::new(),
            missing: vec!["/a".into(), "/b".into()],
            unexpected: Vec::new(),
            differing: vec!["/c".into()],
            text: String::new(),
            stale_locks: vec!["/locks/x".into()],
        };
        let r = from_diff(&d);
        let rules: Vec<&str> = r.findings.iter().map(|f| f.rule.as_str()).collect();
        assert_eq!(rules, ["missing-nodes", "differing-nodes", "stale-locks"]);
        assert_eq!(r.status(), "FAIL");
        assert!(r.findings[0].detail.starts_with("2 node(s)"));
    }
}
