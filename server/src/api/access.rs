//! The access (assembly) queue's routes (issue 12): requests, their
//! listing, the worker's fenced start and outcome, and the admin's requeue,
//! delete and per-queue pause.

use axum::extract::State;
use axum::http::StatusCode;
use axum::{Extension, Json};
use ingest_engine::objects::{requested, RequestedVersion, RequestedVersionError};
use ingest_events::command::MAX_ACCESS_FIELD_BYTES;
use ingest_events::command::{Command, Item};
use ingest_events::event::{AccessQueue, AccessToken};
use ingest_events::lifecycle::AccessState;
use ingest_events::{Actor, Qid, Recorded};
use ingest_protocol::access::{
    AccessContent, AccessList, AccessMoved, AccessOutcomeBody, AccessPackaging, AccessRequestBody,
    AccessView,
};
use ingest_protocol::api::{AdminBody, Appended, OutcomeKind, SessionId, WorkerRef};
use uuid::Uuid;

use super::admin::act;
use super::auth::{AdminName, Role};
use super::scope::Scope;
use super::worker::{fence, worker_actor, Fence};
use super::{rows, ApiError, ApiJson, ApiPath, AppState, CorrelationId};

/// The lock a worker holds on a request while it assembles it (mrt-zk's
/// `Access.lock`: an ephemeral `lock` child of the request).
pub fn access_lock_path(queue: AccessQueue, qid: Qid) -> String {
    ingest_projections::layout::access_lock(queue, qid)
}

fn moved(app: &AppState, qid: Qid, records: &[Recorded]) -> Result<AccessMoved, ApiError> {
    let state = app.inner.handle.state();
    let a = state
        .access
        .get(&qid)
        .ok_or_else(|| ApiError::not_found(Item::Access(qid)))?;
    Ok(AccessMoved {
        request: AccessView::from(a),
        events: rows(records),
    })
}

/// `POST /access`: queue an assembly request (201); the queue is chosen by
/// its size as mrt-store chooses it.
pub(crate) async fn request(
    State(app): State<AppState>,
    Extension(role): Extension<Role>,
    scope: Scope,
    cid: CorrelationId,
    ApiJson(body): ApiJson<AccessRequestBody>,
) -> Result<(StatusCode, Json<AccessMoved>), ApiError> {
    // A depositor with a token of its own may ask only for objects of its
    // collections; another's is answered as an unknown ark is.
    if looks_like_ark(&body.ark)
        && app.inner.inventory.is_some()
        && !scope.sees_object(&app, &body.ark).await?
    {
        return Err(unknown_ark(&body.ark));
    }
    if body.size.is_some() && role != Role::Admin {
        return Err(ApiError::invalid_field(
            "size",
            "is an admin's override: leave it out, the engine sizes the version from the inventory",
        ));
    }
    // A malformed ark is refused by the command (422 naming it), not
    // looked up.
    let (version, size) = if looks_like_ark(&body.ark) {
        let whole = body.content == AccessContent::Object;
        let found = sized(&app, &body.ark, body.version, whole).await?;
        (found.version, body.size.unwrap_or(found.size))
    } else {
        (body.version, body.size.unwrap_or(0))
    };
    let token = AccessToken {
        token: body.token.unwrap_or_else(|| Uuid::new_v4().to_string()),
        ark: body.ark,
        version,
        format: body.format,
        size,
        delivery_node: body.delivery_node,
    };
    let outcome = app
        .execute(
            scope.actor().unwrap_or_else(|| Actor::depositor("access")),
            cid,
            Command::RequestAccess {
                token,
                packaging: AccessPackaging {
                    content: body.content,
                    bag: body.bag,
                },
                size_limit: app.inner.access_size_limit,
            },
        )
        .await?;
    let qid = outcome
        .records
        .iter()
        .find_map(|r| match r.envelope.stream {
            ingest_events::StreamId::Access(q) => Some(q),
            _ => None,
        })
        .ok_or_else(|| ApiError::internal("the request appended no access event"))?;
    Ok((
        StatusCode::CREATED,
        Json(moved(&app, qid, &outcome.records)?),
    ))
}

fn looks_like_ark(ark: &str) -> bool {
    ark.len() > "ark:/".len() && ark.len() <= MAX_ACCESS_FIELD_BYTES && ark.starts_with("ark:/")
}

/// The version of `ark` a request names (0: the latest) and its size, from
/// the inventory; 404 naming an ark or version it does not know.
async fn sized(
    app: &AppState,
    ark: &str,
    version: u32,
    whole: bool,
) -> Result<RequestedVersion, ApiError> {
    let inventory = app
        .inner
        .inventory
        .clone()
        .ok_or_else(|| super::objects::unavailable("inventory"))?;
    let owned = ark.to_string();
    let found = tokio::task::spawn_blocking(move || requested(&inventory, &owned, version, whole))
        .await
        .map_err(|e| ApiError::internal(format!("the inventory task failed: {e}")))?;
    found.map_err(|e| {
        let message = e.to_string();
        match e {
            RequestedVersionError::UnknownArk { ark } => unknown(message, ark),
            RequestedVersionError::UnknownVersion { ark, .. } => {
                ApiError::new(StatusCode::NOT_FOUND, "not_found", message)
                    .with("item", "object version")
                    .with("id", ark)
            }
            RequestedVersionError::VersionOfWholeObject { .. } => {
                ApiError::invalid_field("version", message)
            }
            RequestedVersionError::Inventory(_) => ApiError::internal(message),
        }
    })
}

fn unknown(message: String, ark: String) -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not_found", message)
        .with("item", "object")
        .with("id", ark)
}

/// The answer to an ark the inventory does not know, word for word.
fn unknown_ark(ark: &str) -> ApiError {
    let e = RequestedVersionError::unknown_ark(ark);
    let message = e.to_string();
    match e {
        RequestedVersionError::UnknownArk { ark } => unknown(message, ark),
        _ => ApiError::internal(message),
    }
}

/// `GET /access`: every request, small queue first, each by id (a
/// depositor with a token of its own: those for objects of its
/// collections).
pub(crate) async fn list(
    State(app): State<AppState>,
    scope: Scope,
) -> Result<Json<AccessList>, ApiError> {
    let mut list = AccessList::of(&app.inner.handle.state());
    if scope.is_limited() {
        let mut kept = Vec::with_capacity(list.items.len());
        for item in list.items {
            if scope.sees_object(&app, &item.ark).await? {
                kept.push(item);
            }
        }
        list.items = kept;
    }
    for item in &mut list.items {
        app.inner.assembling.show(item);
    }
    Ok(Json(list))
}

/// `GET /access/{qid}`.
pub(crate) async fn show(
    State(app): State<AppState>,
    scope: Scope,
    ApiPath(qid): ApiPath<Qid>,
) -> Result<Json<AccessView>, ApiError> {
    let mut view = app
        .inner
        .handle
        .state()
        .access
        .get(&qid)
        .map(AccessView::from)
        .ok_or_else(|| ApiError::not_found(Item::Access(qid)))?;
    if !scope.sees_object(&app, &view.ark).await? {
        return Err(ApiError::not_found(Item::Access(qid)));
    }
    app.inner.assembling.show(&mut view);
    Ok(Json(view))
}

pub(crate) fn queue_of(app: &AppState, qid: Qid) -> Result<AccessQueue, ApiError> {
    let state = app.inner.handle.state();
    state
        .access
        .get(&qid)
        .map(|a| a.queue)
        .ok_or_else(|| ApiError::not_found(Item::Access(qid)))
}

/// Runs a worker's `command` on request `qid` once the caller is shown to
/// hold the request's lock (`fence`): the one path of both worker routes.
async fn fenced(
    app: &AppState,
    proof: &Fence,
    cid: CorrelationId,
    qid: Qid,
    (worker, session): (&str, SessionId),
    command: Command,
) -> Result<Json<AccessMoved>, ApiError> {
    let actor = worker_actor(worker)?;
    let queue = queue_of(app, qid)?;
    fence(app, &access_lock_path(queue, qid), session, proof).await?;
    let outcome = app.execute(actor, cid, command).await?;
    // Started again or ended: the last assembly's progress is over.
    app.inner.assembling.forget(qid, &app.inner.metrics);
    Ok(Json(moved(app, qid, &outcome.records)?))
}

/// `POST /access/{qid}/start`: a worker holding the request's lock takes it
/// (Pending → Processing; 409 while its queue is paused).
pub(crate) async fn start(
    State(app): State<AppState>,
    proof: Fence,
    cid: CorrelationId,
    ApiPath(qid): ApiPath<Qid>,
    ApiJson(body): ApiJson<WorkerRef>,
) -> Result<Json<AccessMoved>, ApiError> {
    let who = (body.worker.as_str(), body.session_id);
    fenced(&app, &proof, cid, qid, who, Command::StartAccess { qid }).await
}

/// `POST /access/{qid}/outcome`: the assembly's outcome, fenced.
pub(crate) async fn outcome(
    State(app): State<AppState>,
    proof: Fence,
    cid: CorrelationId,
    ApiPath(qid): ApiPath<Qid>,
    ApiJson(body): ApiJson<AccessOutcomeBody>,
) -> Result<Json<AccessMoved>, ApiError> {
    let command = Command::AccessOutcome {
        qid,
        success: body.outcome == OutcomeKind::Success,
        message: body.message,
        delivery: body.delivery,
    };
    let who = (body.worker.as_str(), body.session_id);
    fenced(&app, &proof, cid, qid, who, command).await
}

/// Refuses an admin's requeue or delete of a request a live worker is
/// assembling: one in Processing whose ephemeral lock is still held. A
/// Processing request without a lock (its worker died) may be requeued or
/// deleted; the engine accepts both.
///
/// The check and the append are two steps (as for fenced reports): a
/// daemon that takes the request again between them has its outcome
/// refused as stale (the request left Processing), and a requeued request
/// is then assembled once more; nothing is lost or stuck.
async fn not_being_assembled(app: &AppState, qid: Qid) -> Result<(), ApiError> {
    let processing = app
        .inner
        .handle
        .state()
        .access
        .get(&qid)
        .is_some_and(|a| a.status == AccessState::Processing);
    if !processing {
        return Ok(());
    }
    let path = access_lock_path(queue_of(app, qid)?, qid);
    let holder = app.inner.locks.holder(&path).await.map_err(|e| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "lock_check_failed",
            format!("{e}; nothing was appended, retry"),
        )
        .with("path", path.clone())
    })?;
    match holder {
        None => Ok(()),
        Some(_) => Err(ApiError::conflict(
            "being_assembled",
            format!("access request {qid} is Processing and a worker holds {path}; nothing was appended"),
        )
        .with("path", path)),
    }
}

/// `POST /access/{qid}/requeue`: a failed request, or a Processing one whose
/// worker died, goes back to Pending.
pub(crate) async fn requeue(
    State(app): State<AppState>,
    cid: CorrelationId,
    who: AdminName,
    ApiPath(qid): ApiPath<Qid>,
    ApiJson(body): ApiJson<AdminBody>,
) -> Result<Json<Appended>, ApiError> {
    not_being_assembled(&app, qid).await?;
    act(app, cid, who, body, |reason| Command::RequeueAccess {
        qid,
        reason,
    })
    .await
}

/// `DELETE /access/{qid}`: a Completed or Failed request, or a Processing
/// one whose worker died, is marked Deleted.
pub(crate) async fn delete(
    State(app): State<AppState>,
    cid: CorrelationId,
    who: AdminName,
    ApiPath(qid): ApiPath<Qid>,
    ApiJson(body): ApiJson<AdminBody>,
) -> Result<Json<Appended>, ApiError> {
    not_being_assembled(&app, qid).await?;
    act(app, cid, who, body, |reason| Command::DeleteAccess {
        qid,
        reason,
    })
    .await
}

/// `POST /access-queues/{queue}/pause`.
pub(crate) async fn pause(
    State(app): State<AppState>,
    cid: CorrelationId,
    who: AdminName,
    ApiPath(queue): ApiPath<AccessQueue>,
    ApiJson(body): ApiJson<AdminBody>,
) -> Result<Json<Appended>, ApiError> {
    act(app, cid, who, body, |reason| Command::PauseAccessQueue {
        queue,
        reason,
    })
    .await
}

/// `POST /access-queues/{queue}/resume`.
pub(crate) async fn resume(
    State(app): State<AppState>,
    cid: CorrelationId,
    who: AdminName,
    ApiPath(queue): ApiPath<AccessQueue>,
    ApiJson(body): ApiJson<AdminBody>,
) -> Result<Json<Appended>, ApiError> {
    act(app, cid, who, body, |reason| Command::ResumeAccessQueue {
        queue,
        reason,
    })
    .await
}
