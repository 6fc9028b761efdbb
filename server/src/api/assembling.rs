//! How far an assembly got (issue 24): the access daemon that holds a
//! request's lock says so through `POST /access/{qid}/progress` (fenced on
//! the lock like its start and outcome), and `GET /access/{qid}` and
//! `GET /access` show it as `progress` while the request is Processing.
//! Like a job's waiting reason ([`super::waiting`]), progress lives in the
//! server's memory, not in the log: it changes without any move of the
//! request and the worker says it again at its next report.

use std::collections::HashMap;
use std::sync::Mutex;

use axum::extract::State;
use axum::Json;
use chrono::Utc;
use ingest_events::command::Item;
use ingest_events::lifecycle::AccessState;
use ingest_events::Qid;
use ingest_protocol::access::{
    AccessProgress, AccessProgressBody, AccessView, MAX_PROGRESS_TARGET_BYTES,
};

use super::access::{access_lock_path, queue_of};
use super::worker::{fence, worker_actor, Fence};
use super::{ApiError, ApiJson, ApiPath, AppState};
use crate::metrics::Metrics;

/// The most requests whose progress is remembered; past it, the progress
/// of requests no longer Processing is forgotten first, then all of it
/// (workers say it again).
const MAX_ASSEMBLING: usize = 10_000;

/// The last progress of each request being assembled.
#[derive(Debug, Default)]
pub(crate) struct Assembling(Mutex<HashMap<Qid, AccessProgress>>);

impl Assembling {
    /// Fills in `view.progress` when the request is Processing and its
    /// worker said how far it got.
    pub(crate) fn show(&self, view: &mut AccessView) {
        if view.status != AccessState::Processing.to_string() {
            return;
        }
        let Ok(qid) = view.qid.parse::<Qid>() else {
            return;
        };
        let known = self.0.lock().unwrap_or_else(|e| e.into_inner());
        view.progress = known.get(&qid).cloned();
    }

    /// Forgets `qid`'s progress (its assembly ended or was taken again).
    pub(crate) fn forget(&self, qid: Qid, metrics: &Metrics) {
        let mut known = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if known.remove(&qid).is_some() {
            metrics.set_access_assembling(total(&known));
        }
    }
}

fn total(known: &HashMap<Qid, AccessProgress>) -> u64 {
    known.values().map(|p| p.bytes).fold(0, u64::saturating_add)
}

/// `POST /access/{qid}/progress` (worker token, fenced): how far the
/// caller's assembly of `qid` got. Refused with 409 `not_processing` when
/// the request is not Processing, and `lock_not_held` when the caller does
/// not hold its lock.
pub(crate) async fn progress(
    State(app): State<AppState>,
    proof: Fence,
    ApiPath(qid): ApiPath<Qid>,
    ApiJson(body): ApiJson<AccessProgressBody>,
) -> Result<Json<AccessProgress>, ApiError> {
    worker_actor(&body.worker)?;
    let target = body.target.trim();
    if target.is_empty() || target.len() > MAX_PROGRESS_TARGET_BYTES {
        return Err(ApiError::invalid_field(
            "target",
            format!("must be 1 to {MAX_PROGRESS_TARGET_BYTES} bytes"),
        ));
    }
    let queue = queue_of(&app, qid)?;
    processing(&app, qid)?;
    fence(&app, &access_lock_path(queue, qid), body.session_id, &proof).await?;
    let progress = AccessProgress {
        worker: body.worker.trim().to_string(),
        target: target.to_string(),
        files: body.files,
        bytes: body.bytes,
        at: Utc::now(),
    };
    {
        // Checked again under the map's lock: an outcome recorded while
        // the fence was checked must not leave this behind.
        let state = app.inner.handle.state();
        let mut known = app
            .inner
            .assembling
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if state
            .access
            .get(&qid)
            .is_none_or(|a| a.status != AccessState::Processing)
        {
            return Err(not_processing(qid));
        }
        if known.len() >= MAX_ASSEMBLING && !known.contains_key(&qid) {
            known.retain(|q, _| {
                state
                    .access
                    .get(q)
                    .is_some_and(|a| a.status == AccessState::Processing)
            });
            if known.len() >= MAX_ASSEMBLING {
                known.clear();
            }
        }
        known.insert(qid, progress.clone());
        app.inner.metrics.set_access_assembling(total(&known));
    }
    Ok(Json(progress))
}

fn processing(app: &AppState, qid: Qid) -> Result<(), ApiError> {
    let state = app.inner.handle.state();
    let a = state
        .access
        .get(&qid)
        .ok_or_else(|| ApiError::not_found(Item::Access(qid)))?;
    if a.status == AccessState::Processing {
        Ok(())
    } else {
        Err(not_processing(qid))
    }
}

fn not_processing(qid: Qid) -> ApiError {
    ApiError::conflict(
        "not_processing",
        format!("access request {qid} is not Processing; its progress is not kept"),
    )
}
