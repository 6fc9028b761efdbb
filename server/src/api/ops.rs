//! Operator routes: the log's `verify`, the projected `tree`, the live
//! tree's `diff`, and fault injection. They let the CLI's commands run
//! against a server (`ingest --engine URL verify`, …) while the server holds
//! the data directory, which sled lets only one process open.

use ingest_protocol::api::*;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use axum::extract::{Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use ingest_events::JobState;
use ingest_projections::rebuild;

use super::admin::{admin_actor, check_reason};
use super::{ApiError, ApiJson, AppState};

/// The most faults one call may arm.
const MAX_FAULTS: u32 = 1000;

/// Faults armed by admins: "the next `count` reports of step S fail". A
/// worker's successful outcome for S is recorded as a failure with the
/// admin's name and reason, so the fault works for in-process and remote
/// workers alike and shows in the history.
#[derive(Debug, Default)]
pub(crate) struct ArmedFaults(Mutex<HashMap<JobState, Vec<Fault>>>);

/// One armed fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Fault {
    /// The admin who armed it (`admin:NAME`).
    pub(crate) actor: String,
    /// Why.
    pub(crate) reason: String,
}

impl Fault {
    /// The failure message recorded in place of the step's success.
    pub(crate) fn message(&self, state: JobState) -> String {
        format!(
            "fault injected into {state} by {}: {}",
            self.actor, self.reason
        )
    }
}

impl ArmedFaults {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<JobState, Vec<Fault>>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn arm(&self, state: JobState, fault: Fault, count: u32) {
        let mut map = self.lock();
        let armed = map.entry(state).or_default();
        armed.extend(std::iter::repeat_n(fault, count as usize));
    }

    /// Takes the oldest fault armed for `state`.
    pub(crate) fn take(&self, state: JobState) -> Option<Fault> {
        let mut map = self.lock();
        let armed = map.get_mut(&state)?;
        let fault = (!armed.is_empty()).then(|| armed.remove(0));
        if armed.is_empty() {
            map.remove(&state);
        }
        fault
    }

    /// Puts back a fault whose report was refused (it did not fire).
    pub(crate) fn put_back(&self, state: JobState, fault: Fault) {
        self.lock().entry(state).or_default().insert(0, fault);
    }

    fn counts(&self) -> BTreeMap<String, usize> {
        self.lock()
            .iter()
            .map(|(s, f)| (s.to_string(), f.len()))
            .collect()
    }

    fn clear(&self) -> usize {
        let mut map = self.lock();
        let n = map.values().map(Vec::len).sum();
        map.clear();
        n
    }
}

/// `POST /faults`: the next `count` successful reports of a step are
/// recorded as failures.
pub(crate) async fn arm_fault(
    State(app): State<AppState>,
    who: super::auth::AdminName,
    ApiJson(body): ApiJson<FaultBody>,
) -> Result<(StatusCode, Json<FaultsView>), ApiError> {
    let actor = admin_actor(&who, body.actor.as_deref())?;
    let reason = check_reason(&body.reason)?;
    let state = body
        .state
        .parse::<JobState>()
        .map_err(|e| ApiError::invalid_field("state", e.to_string()))?;
    if !ingest_worker::step::STEP_STATES.contains(&state) {
        return Err(ApiError::invalid_field(
            "state",
            format!("{state} has no step a worker runs; faults go to Estimating, Provisioning, Downloading, Processing, Storing, Recording or Notify"),
        ));
    }
    let count = body.count.unwrap_or(1);
    if count == 0 || count > MAX_FAULTS {
        return Err(ApiError::invalid_field(
            "count",
            format!("{count} is outside 1-{MAX_FAULTS}"),
        ));
    }
    tracing::warn!(%state, count, %actor, %reason, "fault armed");
    app.inner.faults.arm(
        state,
        Fault {
            actor: actor.to_string(),
            reason,
        },
        count,
    );
    Ok((
        StatusCode::CREATED,
        Json(FaultsView {
            armed: app.inner.faults.counts(),
        }),
    ))
}

/// `GET /faults`.
pub(crate) async fn faults(State(app): State<AppState>) -> Json<FaultsView> {
    Json(FaultsView {
        armed: app.inner.faults.counts(),
    })
}

/// `DELETE /faults`: disarms every fault.
pub(crate) async fn clear_faults(
    State(app): State<AppState>,
) -> Json<BTreeMap<&'static str, usize>> {
    let n = app.inner.faults.clear();
    tracing::info!(disarmed = n, "faults cleared");
    Json(BTreeMap::from([("disarmed", n)]))
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
    let report = full.log;
    Ok(Json(Verified {
        checkpoints_checked: full.checkpoints_checked,
        snapshots_checked: full.snapshots_checked,
        events_checked: report.events_checked,
        index_entries_checked: report.index_entries_checked,
        head_position: report.head_position,
        head_hash: hex::encode(report.head_hash),
        problems: report
            .problems
            .into_iter()
            .map(|p| ProblemView {
                position: p.position,
                message: p.message,
            })
            .collect(),
    }))
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
    let Some(zk) = app.inner.zookeeper.clone() else {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "no_zookeeper",
            "this server has no ZooKeeper configured, so there is no live tree to compare",
        ));
    };
    let log = Arc::clone(app.inner.handle.log());
    // `rebuild::diff` takes a progress callback that is not `Send`, so it
    // runs on a blocking thread that drives it on this runtime.
    let runtime = tokio::runtime::Handle::current();
    let zk_config = zk.clone();
    // While this server's projector runs, the tree and its checkpoint move
    // under a reader (the diff gave up after five tries: 503 "checkpoint
    // kept moving"). Holding the projector between two transactions for
    // the read gives one position; it resumes when the diff is done.
    let held = match &app.inner.projector_gate {
        Some(gate) => Some(gate.hold().await),
        None => None,
    };
    let found = tokio::task::spawn_blocking(move || {
        let found = runtime.block_on(rebuild::diff(&log, &zk_config, &mut |_| {}));
        drop(held);
        found
    })
    .await
    .map_err(|e| ApiError::internal(format!("the diff task failed: {e}")))?;
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
    Ok(Json(Diffed {
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
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_fire_in_order_and_a_refused_report_puts_one_back() {
        let faults = ArmedFaults::default();
        let fault = |r: &str| Fault {
            actor: "admin:a".into(),
            reason: r.into(),
        };
        faults.arm(JobState::Storing, fault("one"), 1);
        faults.arm(JobState::Storing, fault("two"), 1);
        assert_eq!(faults.take(JobState::Downloading), None);
        let first = faults.take(JobState::Storing);
        assert_eq!(first, Some(fault("one")));
        faults.put_back(JobState::Storing, fault("one"));
        assert_eq!(faults.counts().get("Storing"), Some(&2));
        assert_eq!(faults.take(JobState::Storing), Some(fault("one")));
        assert_eq!(faults.take(JobState::Storing), Some(fault("two")));
        assert_eq!(faults.take(JobState::Storing), None);
        assert!(faults.counts().is_empty());
        assert_eq!(
            fault("disk").message(JobState::Storing),
            "fault injected into Storing by admin:a: disk"
        );
    }
}
