//! Objects: the inventory of stored object versions (kept beside the log in
//! the data directory) and the ark minter. Workers mint an ark, look up
//! local ids and record a stored version, each fenced on the job's lock;
//! anyone with a token reads an object by ark or by local id.

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::Json;
use ingest_events::command::{Command, Item};
use ingest_events::event::Identifiers;
use ingest_events::Jid;
use ingest_protocol::api::*;
use ingest_steps::inventory::InventoryError;
use std::collections::BTreeMap;

use super::locks::job_lock_path;
use super::scope::Scope;
use super::worker::{fence, worker_actor, Fence};
use super::{ApiError, ApiJson, ApiPath, AppState, CorrelationId};

/// The most local ids one lookup may ask about.
const MAX_LOOKUP: usize = 1000;

pub(crate) fn unavailable(what: &str) -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "no_inventory",
        format!("this server keeps no {what} (it runs without a data directory inventory)"),
    )
}

fn inventory_error(e: InventoryError) -> ApiError {
    match e {
        InventoryError::Storage(_) | InventoryError::Corrupt { .. } => {
            ApiError::internal(format!("the inventory failed: {e}"))
        }
        other => ApiError::conflict("inventory_conflict", other.to_string()),
    }
}

/// `POST /jobs/{jid}/ark`: the job's ark, minted and recorded on the job at
/// once when it has none (so a retried or requeued Processing never mints a
/// second one).
pub(crate) async fn ark(
    State(app): State<AppState>,
    fenced: Fence,
    cid: CorrelationId,
    ApiPath(jid): ApiPath<Jid>,
    ApiJson(body): ApiJson<ArkBody>,
) -> Result<Json<ArkAssigned>, ApiError> {
    let actor = worker_actor(&body.worker)?;
    fence(&app, &job_lock_path(jid), body.session_id, &fenced).await?;
    let (identifiers, erc) = app
        .inner
        .handle
        .state()
        .jobs
        .get(&jid)
        .map(|j| (j.identifiers.clone(), j.metadata.clone()))
        .ok_or_else(|| ApiError::not_found(Item::Job(jid)))?;
    if let Some(ark) = identifiers.primary_id.filter(|a| !a.is_empty()) {
        return Ok(Json(ArkAssigned { ark, minted: false }));
    }
    let minter = app
        .inner
        .minter
        .as_ref()
        .ok_or_else(|| unavailable("ark minter"))?;
    let ark = minter.mint(&erc).await.map_err(|e| match e {
        ingest_engine::ezid::MintError::Unavailable(m) => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "minter_unavailable",
            format!("cannot mint an ark now: {m}; nothing was appended, retry"),
        ),
        other => ApiError::internal(format!("cannot mint an ark: {other}")),
    })?;
    app.execute(
        actor,
        cid,
        Command::RecordIdentifiers {
            jid,
            identifiers: Identifiers {
                primary_id: Some(ark.clone()),
                local_ids: identifiers.local_ids,
            },
        },
    )
    .await?;
    tracing::info!(%jid, %ark, "minted");
    Ok(Json(ArkAssigned { ark, minted: true }))
}

/// `POST /jobs/{jid}/lookup`: the arks the inventory binds to local ids of a
/// collection (`null` for an unknown one).
pub(crate) async fn lookup(
    State(app): State<AppState>,
    fenced: Fence,
    ApiPath(jid): ApiPath<Jid>,
    ApiJson(body): ApiJson<LookupBody>,
) -> Result<Json<LookedUp>, ApiError> {
    worker_actor(&body.worker)?;
    if body.local_ids.len() > MAX_LOOKUP {
        return Err(ApiError::invalid_field(
            "local_ids",
            format!("{} ids; at most {MAX_LOOKUP}", body.local_ids.len()),
        ));
    }
    fence(&app, &job_lock_path(jid), body.session_id, &fenced).await?;
    let inventory = app
        .inner
        .inventory
        .clone()
        .ok_or_else(|| unavailable("inventory"))?;
    let mut arks = BTreeMap::new();
    for id in &body.local_ids {
        let ark = inventory
            .by_local_id(&body.collection, id)
            .map_err(inventory_error)?;
        arks.insert(id.clone(), ark);
    }
    Ok(Json(LookedUp { arks }))
}

/// `POST /jobs/{jid}/object`: the recording step records a stored version.
pub(crate) async fn record(
    State(app): State<AppState>,
    fenced: Fence,
    ApiPath(jid): ApiPath<Jid>,
    ApiJson(body): ApiJson<ObjectBody>,
) -> Result<Json<ObjectRecorded>, ApiError> {
    worker_actor(&body.worker)?;
    fence(&app, &job_lock_path(jid), body.session_id, &fenced).await?;
    if body.record.jid != jid.to_string() {
        return Err(ApiError::invalid_field(
            "record.jid",
            format!("is {}, not the job {jid} of the path", body.record.jid),
        ));
    }
    let inventory = app
        .inner
        .inventory
        .clone()
        .ok_or_else(|| unavailable("inventory"))?;
    let record = body.record;
    let outcome = tokio::task::spawn_blocking(move || inventory.record(&record))
        .await
        .map_err(|e| ApiError::internal(format!("the inventory task failed: {e}")))?
        .map_err(inventory_error)?;
    Ok(Json(ObjectRecorded { new: outcome.new }))
}

/// `GET /objects/{ark}` (the ark percent-encoded or with its slashes).
pub(crate) async fn object(
    State(app): State<AppState>,
    scope: Scope,
    axum::extract::Path(ark): axum::extract::Path<String>,
) -> Result<Json<ObjectView>, ApiError> {
    let inventory = app
        .inner
        .inventory
        .clone()
        .ok_or_else(|| unavailable("inventory"))?;
    let versions = inventory.versions(&ark).map_err(inventory_error)?;
    // Another depositor's object is answered as an unknown one.
    let visible = versions.last().is_some_and(|v| scope.sees(&v.collection));
    if !visible {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no object {ark} in the inventory"),
        )
        .with("item", "object")
        .with("id", ark));
    }
    Ok(Json(ObjectView { ark, versions }))
}

/// `GET /objects?collection=C&local_id=L`: the object a local id names.
pub(crate) async fn by_local_id(
    State(app): State<AppState>,
    scope: Scope,
    query: Result<Query<ObjectQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<ObjectView>, ApiError> {
    let Query(q) = query.map_err(|e| ApiError::bad_request("invalid_query", e.body_text()))?;
    // Local ids are per collection: another depositor's collection is
    // answered as a local id it does not have.
    let visible = scope.sees(&q.collection);
    let inventory = app
        .inner
        .inventory
        .clone()
        .ok_or_else(|| unavailable("inventory"))?;
    let found = match visible {
        true => inventory
            .by_local_id(&q.collection, &q.local_id)
            .map_err(inventory_error)?,
        false => None,
    };
    let Some(ark) = found else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!(
                "no object with local id {:?} in collection {}",
                q.local_id, q.collection
            ),
        )
        .with("item", "object"));
    };
    let versions = inventory.versions(&ark).map_err(inventory_error)?;
    Ok(Json(ObjectView { ark, versions }))
}
