//! The actions (POST): each checks the origin and the session's CSRF
//! token, then calls the API's own handler with the logged-in admin as
//! the actor (on a follower, sends the API request to the leader instead:
//! [`super::forward`]), and comes back to the page with the outcome (303).

use std::future::Future;

use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Form, Json};
use ingest_events::Jid;
use ingest_protocol::api::{AdminBody, Appended, FaultBody};
use ingest_protocol::endpoint::{self as ep, Endpoint};
use serde::Deserialize;

use super::session::Flash;
use super::{check_post, cut, error_page, forward, Admin, Ui};
use crate::api::{admin as api, ApiError, ApiJson, ApiPath, CorrelationId};

/// The form of an action: the CSRF token and a reason.
#[derive(Debug, Deserialize)]
pub(crate) struct ActionForm {
    #[serde(default)]
    pub(crate) csrf: Option<String>,
    #[serde(default)]
    reason: String,
    /// `POST /ui/consistency/repair`: the finding.
    #[serde(default)]
    finding: String,
    /// `POST /ui/faults`: the step and how many.
    #[serde(default)]
    state: String,
    #[serde(default)]
    count: Option<String>,
}

impl ActionForm {
    pub(crate) fn body(&self) -> AdminBody {
        AdminBody {
            actor: None,
            reason: self.reason.clone(),
        }
    }
}

/// Back to `to`, with the outcome shown there once.
pub(crate) fn back(
    ui: &Ui,
    admin: &Admin,
    to: &str,
    outcome: Result<String, ApiError>,
) -> Response {
    let flash = match outcome {
        Ok(message) => Flash { ok: true, message },
        Err(e) => Flash {
            ok: false,
            message: format!("Refused: {}", e.message()),
        },
    };
    ui.sessions.flash(&admin.id, flash);
    (StatusCode::SEE_OTHER, [(header::LOCATION, to.to_string())]).into_response()
}

fn done(what: &str, r: Result<Json<Appended>, ApiError>) -> Result<String, ApiError> {
    r.map(|Json(a)| format!("{what}: {} event(s) recorded", a.events.len()))
}

/// An admin command: `here`, the API's own handler, when this engine takes
/// commands; else the same request (`endpoint` with `body`) sent to the
/// leader as the logged-in admin ([`forward`]).
pub(crate) async fn admin_command<E: Endpoint<Body = AdminBody, Reply = Appended>>(
    by: (&Ui, &Admin, CorrelationId),
    endpoint: &E,
    body: &AdminBody,
    here: impl Future<Output = Result<Json<Appended>, ApiError>>,
) -> Result<Json<Appended>, ApiError> {
    match forward::leader(by.0) {
        Some(leader) => forward::to_leader(by, &leader, endpoint, body)
            .await
            .map(Json),
        None => here.await,
    }
}

/// `POST /ui/jobs/{jid}/{action}`: requeue, hold, release, fail, delete.
pub(crate) async fn job(
    State(ui): State<Ui>,
    admin: Admin,
    cid: CorrelationId,
    headers: HeaderMap,
    Path((jid, action)): Path<(String, String)>,
    Form(form): Form<ActionForm>,
) -> Response {
    if let Some(refused) = check_post(&headers, &admin, form.csrf.as_deref()) {
        return refused;
    }
    let Ok(jid) = jid.parse::<Jid>() else {
        return error_page(StatusCode::NOT_FOUND, Some(&admin), "no such job");
    };
    let (app, who, body) = (State(ui.app.clone()), admin.name(), ApiJson(form.body()));
    let (path, by, given) = (ApiPath(jid), (&ui, &admin, cid), &form.body());
    let r = match action.as_str() {
        "requeue" => {
            let here = api::requeue_job(app, cid, who, path, body);
            admin_command(by, &ep::RequeueJob(jid), given, here).await
        }
        "hold" => {
            let here = api::hold_job(app, cid, who, path, body);
            admin_command(by, &ep::HoldJob(jid), given, here).await
        }
        "release" => {
            let here = api::release_job(app, cid, who, path, body);
            admin_command(by, &ep::ReleaseJob(jid), given, here).await
        }
        "fail" => {
            let here = api::fail_job(app, cid, who, path, body);
            admin_command(by, &ep::FailJob(jid), given, here).await
        }
        "delete" => {
            let here = api::delete_job(app, cid, who, path, body);
            admin_command(by, &ep::DeleteJob(jid), given, here).await
        }
        _ => return error_page(StatusCode::NOT_FOUND, Some(&admin), "no such action"),
    };
    let to = format!("/ui/jobs/{jid}");
    back(&ui, &admin, &to, done(&format!("{action} {jid}"), r))
}

/// `POST /ui/collections/{profile}/{action}`: hold, release, release-jobs.
pub(crate) async fn collection(
    State(ui): State<Ui>,
    admin: Admin,
    cid: CorrelationId,
    headers: HeaderMap,
    Path((profile, action)): Path<(String, String)>,
    Form(form): Form<ActionForm>,
) -> Response {
    if let Some(refused) = check_post(&headers, &admin, form.csrf.as_deref()) {
        return refused;
    }
    let Ok(name) = profile.parse::<api::ProfileName>() else {
        return error_page(StatusCode::NOT_FOUND, Some(&admin), "no such collection");
    };
    let (app, who, body) = (State(ui.app.clone()), admin.name(), ApiJson(form.body()));
    let (path, by, given) = (ApiPath(name), (&ui, &admin, cid), &form.body());
    let r = match action.as_str() {
        "hold" => {
            let here = api::hold_collection(app, cid, who, path, body);
            admin_command(by, &ep::HoldCollection(profile.clone()), given, here).await
        }
        "release" => {
            let here = api::release_collection(app, cid, who, path, body);
            admin_command(by, &ep::ReleaseCollection(profile.clone()), given, here).await
        }
        "release-jobs" => {
            let here = api::release_collection_jobs(app, cid, who, path, body);
            admin_command(by, &ep::ReleaseCollectionJobs(profile.clone()), given, here).await
        }
        _ => return error_page(StatusCode::NOT_FOUND, Some(&admin), "no such action"),
    };
    back(
        &ui,
        &admin,
        "/ui/collections",
        done(&format!("{action} {}", cut(&profile)), r),
    )
}

/// `POST /ui/queue/{pause|resume}`.
pub(crate) async fn queue(
    State(ui): State<Ui>,
    admin: Admin,
    cid: CorrelationId,
    headers: HeaderMap,
    Path(action): Path<String>,
    Form(form): Form<ActionForm>,
) -> Response {
    if let Some(refused) = check_post(&headers, &admin, form.csrf.as_deref()) {
        return refused;
    }
    let (app, who, body) = (State(ui.app.clone()), admin.name(), ApiJson(form.body()));
    let (by, given) = ((&ui, &admin, cid), &form.body());
    let r = match action.as_str() {
        "pause" => admin_command(by, &ep::PauseQueue, given, api::pause(app, cid, who, body)).await,
        "resume" => {
            admin_command(
                by,
                &ep::ResumeQueue,
                given,
                api::resume(app, cid, who, body),
            )
            .await
        }
        _ => return error_page(StatusCode::NOT_FOUND, Some(&admin), "no such action"),
    };
    back(&ui, &admin, "/ui", done(&format!("{action} the queue"), r))
}

/// `POST /ui/consistency/repair`.
pub(crate) async fn repair(
    State(ui): State<Ui>,
    admin: Admin,
    cid: CorrelationId,
    headers: HeaderMap,
    Form(form): Form<ActionForm>,
) -> Response {
    if let Some(refused) = check_post(&headers, &admin, form.csrf.as_deref()) {
        return refused;
    }
    let r = match forward::leader(&ui) {
        Some(leader) => {
            let body = super::consistency::repair_body(&form.finding, &form.reason);
            forward::to_leader((&ui, &admin, cid), &leader, &ep::ConsistencyRepair, &body)
                .await
                .map(|done| super::consistency::repaired(&done))
        }
        None => {
            super::consistency::repair(&ui.app, &admin.name(), &form.finding, &form.reason).await
        }
    };
    back(&ui, &admin, "/ui/consistency", r)
}

/// `POST /ui/faults`: arms a fault.
pub(crate) async fn arm_fault(
    State(ui): State<Ui>,
    admin: Admin,
    cid: CorrelationId,
    headers: HeaderMap,
    Form(form): Form<ActionForm>,
) -> Response {
    if let Some(refused) = check_post(&headers, &admin, form.csrf.as_deref()) {
        return refused;
    }
    let count = match form
        .count
        .as_deref()
        .map(str::trim)
        .filter(|c| !c.is_empty())
    {
        None => None,
        Some(c) => match c.parse::<u32>() {
            Ok(n) => Some(n),
            Err(_) => {
                let e = ApiError::invalid_field("count", "is not a whole number");
                return back(&ui, &admin, "/ui/faults", Err(e));
            }
        },
    };
    let body = FaultBody {
        state: form.state.clone(),
        count,
        actor: None,
        reason: form.reason.clone(),
    };
    let r = crate::api::ops::arm_fault(State(ui.app.clone()), cid, admin.name(), ApiJson(body))
        .await
        .map(|(_, Json(v))| {
            format!(
                "armed; now {}",
                v.armed
                    .iter()
                    .map(|(s, n)| format!("{s} {n}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        });
    back(&ui, &admin, "/ui/faults", r)
}

/// `POST /ui/faults/clear`.
pub(crate) async fn clear_faults(
    State(ui): State<Ui>,
    admin: Admin,
    cid: CorrelationId,
    headers: HeaderMap,
    Form(form): Form<ActionForm>,
) -> Response {
    if let Some(refused) = check_post(&headers, &admin, form.csrf.as_deref()) {
        return refused;
    }
    tracing::info!(admin = %admin.session.admin, "admin web UI: faults cleared");
    let r = crate::api::ops::clear_faults(State(ui.app.clone()), cid, admin.name())
        .await
        .map(|Json(n)| {
            let cleared = n.get("disarmed").copied().unwrap_or(0);
            format!("{cleared} fault(s) disarmed")
        });
    back(&ui, &admin, "/ui/faults", r)
}
