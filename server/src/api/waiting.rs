//! Why a job waits (issue 26, D8): a worker that keeps a job in its state
//! (Provisioning while working storage is too full) says why through `POST
//! /jobs/{jid}/waiting`, and `GET /jobs/{jid}` and `GET /jobs` show it as
//! `waiting` while the job is still in that state. The reasons live in the
//! server's memory, not in the log: they describe a worker's view of now,
//! change without any move of the job, and are said again after a restart
//! at the worker's next look.

use std::collections::HashMap;
use std::sync::Mutex;

use axum::extract::State;
use axum::Json;
use ingest_events::lifecycle::StateKind as _;
use ingest_events::{Jid, JobState};
use ingest_protocol::api::WaitingBody;

use super::{ApiError, ApiJson, ApiPath, AppState};

/// The most waiting jobs remembered; past it, reasons of jobs that moved
/// on are forgotten first, then every reason (workers say them again).
const MAX_WAITING: usize = 10_000;

/// Each waiting job's state and reason, as a worker last said.
#[derive(Debug, Default)]
pub(crate) struct Waits(Mutex<HashMap<Jid, (JobState, String)>>);

impl Waits {
    /// Why `jid`, now in `status`, waits; `None` when no worker said so in
    /// this state.
    pub(crate) fn of(&self, jid: Jid, status: &str) -> Option<String> {
        let waits = self.0.lock().unwrap_or_else(|e| e.into_inner());
        waits
            .get(&jid)
            .filter(|(state, _)| state.name() == status)
            .map(|(_, reason)| reason.clone())
    }
}

/// `POST /jobs/{jid}/waiting` (worker token): why the worker keeps the job
/// waiting in `state`. Refused with 409 `not_in_state` when the job is not
/// in that state (it moved on).
pub(crate) async fn waiting(
    State(app): State<AppState>,
    ApiPath(jid): ApiPath<Jid>,
    ApiJson(body): ApiJson<WaitingBody>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let state: JobState =
        body.state
            .parse()
            .map_err(|e: ingest_events::lifecycle::UnknownState| {
                ApiError::invalid_field("state", e.to_string())
            })?;
    let reason =
        ingest_protocol::cut(body.reason.trim(), ingest_protocol::MAX_MESSAGE_BYTES).into_owned();
    if reason.is_empty() {
        return Err(ApiError::invalid_field("reason", "must not be empty"));
    }
    {
        let engine = app.inner.handle.state();
        let job = engine
            .jobs
            .get(&jid)
            .ok_or_else(|| ApiError::not_found(ingest_events::command::Item::Job(jid)))?;
        if job.status != state {
            return Err(ApiError::conflict(
                "not_in_state",
                format!("job {jid} is {}, not {state}", job.status),
            ));
        }
        let mut waits = app.inner.waits.0.lock().unwrap_or_else(|e| e.into_inner());
        if waits.len() >= MAX_WAITING && !waits.contains_key(&jid) {
            waits.retain(|j, (s, _)| engine.jobs.get(j).is_some_and(|job| job.status == *s));
            if waits.len() >= MAX_WAITING {
                waits.clear();
            }
        }
        waits.insert(jid, (state, reason));
    }
    Ok(Json(
        serde_json::json!({"jid": jid.to_string(), "state": state.name()}),
    ))
}
