//! Admin routes: every admin action, each with `{actor?, reason}` recorded,
//! and the queue-wide views.
//!
//! The actor recorded is the admin the token names (`admin:NAME` for a
//! token of `--admins-file`, `admin:admin` for the shared admin token). An
//! `actor` in the body is still checked for form (an admin name, or
//! `admin:NAME`) so a malformed one is refused, and is otherwise ignored:
//! a client cannot record an action under another admin's name.

use ingest_protocol::api::*;
use ingest_protocol::view::StatusView;
use std::collections::BTreeMap;

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use ingest_events::command::{Command, Target};
use ingest_events::{Actor, Bid, Jid, JobState};
use ingest_projections::views::{CollectionView, QueueView};
use serde::Serialize;

use super::auth::AdminName;
use super::{check_name, rows, ApiError, ApiJson, ApiPath, AppState, CorrelationId};
use ingest_config::Profile;

/// The longest reason recorded.
const MAX_REASON_BYTES: usize = 4096;

/// The actor of an admin action: the token's admin; `claimed` (a body's
/// `actor`) is checked for form and ignored.
pub(crate) fn admin_actor(who: &AdminName, claimed: Option<&str>) -> Result<Actor, ApiError> {
    claimed_actor(claimed)?;
    Ok(who.actor())
}

/// Checks the form of an `actor` a client sent.
fn claimed_actor(actor: Option<&str>) -> Result<Option<Actor>, ApiError> {
    let Some(name) = actor else {
        return Ok(None);
    };
    let name = name.trim();
    let name = match name.split_once(':') {
        Some(("admin", rest)) => rest,
        Some(_) => {
            return Err(ApiError::invalid_field(
                "actor",
                format!("{name:?}: give the admin's name (recorded as admin:NAME)"),
            ))
        }
        None => name,
    };
    check_name("actor", name)?;
    Ok(Some(Actor::admin(name)))
}

pub(crate) fn check_reason(reason: &str) -> Result<String, ApiError> {
    if reason.trim().is_empty() {
        return Err(ApiError::invalid_field(
            "reason",
            "is required: say why, it is recorded with the event",
        ));
    }
    if reason.len() > MAX_REASON_BYTES {
        return Err(ApiError::invalid_field(
            "reason",
            format!("is longer than {MAX_REASON_BYTES} bytes"),
        ));
    }
    if reason
        .chars()
        .any(|c| c.is_control() && c != '\n' && c != '\t')
    {
        return Err(ApiError::invalid_field(
            "reason",
            "contains control characters",
        ));
    }
    Ok(reason.to_string())
}

/// Runs the command `make` builds from the checked reason.
pub(crate) async fn act(
    app: AppState,
    cid: CorrelationId,
    who: AdminName,
    body: AdminBody,
    make: impl FnOnce(String) -> Command,
) -> Result<Json<Appended>, ApiError> {
    let actor = admin_actor(&who, body.actor.as_deref())?;
    let reason = check_reason(&body.reason)?;
    let outcome = app.execute(actor, cid, make(reason)).await?;
    Ok(Json(super::appended(&outcome)))
}

/// `POST /jobs/{jid}/hold`.
pub(crate) async fn hold_job(
    State(app): State<AppState>,
    cid: CorrelationId,
    who: AdminName,
    ApiPath(jid): ApiPath<Jid>,
    ApiJson(body): ApiJson<AdminBody>,
) -> Result<Json<Appended>, ApiError> {
    act(app, cid, who, body, |reason| Command::HoldJob {
        jid,
        reason,
    })
    .await
}

/// `POST /jobs/{jid}/release`.
pub(crate) async fn release_job(
    State(app): State<AppState>,
    cid: CorrelationId,
    who: AdminName,
    ApiPath(jid): ApiPath<Jid>,
    ApiJson(body): ApiJson<AdminBody>,
) -> Result<Json<Appended>, ApiError> {
    act(app, cid, who, body, |reason| Command::ReleaseJob {
        jid,
        reason,
    })
    .await
}

/// `POST /jobs/{jid}/requeue`.
pub(crate) async fn requeue_job(
    State(app): State<AppState>,
    cid: CorrelationId,
    who: AdminName,
    ApiPath(jid): ApiPath<Jid>,
    ApiJson(body): ApiJson<AdminBody>,
) -> Result<Json<Appended>, ApiError> {
    act(app, cid, who, body, |reason| Command::RequeueJob {
        jid,
        reason,
    })
    .await
}

/// `POST /jobs/{jid}/fail`: an admin's force-fail.
pub(crate) async fn fail_job(
    State(app): State<AppState>,
    cid: CorrelationId,
    who: AdminName,
    ApiPath(jid): ApiPath<Jid>,
    ApiJson(body): ApiJson<AdminBody>,
) -> Result<Json<Appended>, ApiError> {
    act(app, cid, who, body, |reason| Command::SetJobStatus {
        jid,
        target: Target::To(JobState::Failed),
        message: reason,
        priority: None,
    })
    .await
}

/// `DELETE /jobs/{jid}`.
pub(crate) async fn delete_job(
    State(app): State<AppState>,
    cid: CorrelationId,
    who: AdminName,
    ApiPath(jid): ApiPath<Jid>,
    ApiJson(body): ApiJson<AdminBody>,
) -> Result<Json<Appended>, ApiError> {
    act(app, cid, who, body, |reason| Command::DeleteJob {
        jid,
        reason,
    })
    .await
}

/// `POST /batches/{bid}/release`.
pub(crate) async fn release_batch(
    State(app): State<AppState>,
    cid: CorrelationId,
    who: AdminName,
    ApiPath(bid): ApiPath<Bid>,
    ApiJson(body): ApiJson<AdminBody>,
) -> Result<Json<Appended>, ApiError> {
    act(app, cid, who, body, |reason| Command::ReleaseBatch {
        bid,
        reason,
    })
    .await
}

/// `POST /batches/{bid}/update-reporting`.
pub(crate) async fn update_reporting(
    State(app): State<AppState>,
    cid: CorrelationId,
    who: AdminName,
    ApiPath(bid): ApiPath<Bid>,
    ApiJson(body): ApiJson<AdminBody>,
) -> Result<Json<Appended>, ApiError> {
    act(app, cid, who, body, |reason| Command::UpdateReporting {
        bid,
        reason,
    })
    .await
}

/// `DELETE /batches/{bid}`.
pub(crate) async fn delete_batch(
    State(app): State<AppState>,
    cid: CorrelationId,
    who: AdminName,
    ApiPath(bid): ApiPath<Bid>,
    ApiJson(body): ApiJson<AdminBody>,
) -> Result<Json<Appended>, ApiError> {
    act(app, cid, who, body, |reason| Command::DeleteBatch {
        bid,
        reason,
    })
    .await
}

/// A profile in a path: the engine checks it is a valid ZooKeeper segment.
pub(crate) struct ProfileName(String);

impl std::str::FromStr for ProfileName {
    type Err = &'static str;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.is_empty() {
            Err("empty profile name")
        } else {
            Ok(ProfileName(s.to_string()))
        }
    }
}

/// `POST /collections/{profile}/hold`.
pub(crate) async fn hold_collection(
    State(app): State<AppState>,
    cid: CorrelationId,
    who: AdminName,
    ApiPath(ProfileName(profile)): ApiPath<ProfileName>,
    ApiJson(body): ApiJson<AdminBody>,
) -> Result<Json<Appended>, ApiError> {
    act(app, cid, who, body, |reason| Command::HoldCollection {
        profile,
        reason,
    })
    .await
}

/// `POST /collections/{profile}/release`: the hold, and every held job and
/// batch of the collection.
pub(crate) async fn release_collection(
    State(app): State<AppState>,
    cid: CorrelationId,
    who: AdminName,
    ApiPath(ProfileName(profile)): ApiPath<ProfileName>,
    ApiJson(body): ApiJson<AdminBody>,
) -> Result<Json<Appended>, ApiError> {
    act(app, cid, who, body, |reason| Command::ReleaseCollection {
        profile,
        reason,
    })
    .await
}

/// `POST /collections/{profile}/release-jobs`: every held job of the
/// collection; the hold itself stays.
pub(crate) async fn release_collection_jobs(
    State(app): State<AppState>,
    cid: CorrelationId,
    who: AdminName,
    ApiPath(ProfileName(profile)): ApiPath<ProfileName>,
    ApiJson(body): ApiJson<AdminBody>,
) -> Result<Json<Appended>, ApiError> {
    act(app, cid, who, body, |reason| Command::ReleaseHeldJobs {
        profile,
        reason,
    })
    .await
}

/// `POST /queue/pause`.
pub(crate) async fn pause(
    State(app): State<AppState>,
    cid: CorrelationId,
    who: AdminName,
    ApiJson(body): ApiJson<AdminBody>,
) -> Result<Json<Appended>, ApiError> {
    act(app, cid, who, body, |reason| Command::PauseQueue { reason }).await
}

/// `POST /queue/resume`.
pub(crate) async fn resume(
    State(app): State<AppState>,
    cid: CorrelationId,
    who: AdminName,
    ApiJson(body): ApiJson<AdminBody>,
) -> Result<Json<Appended>, ApiError> {
    act(app, cid, who, body, |reason| Command::ResumeQueue {
        reason,
    })
    .await
}

/// `POST /cleanup`: removes finished batches from the live tree.
///
/// The engine's cleanup event has no reason field: the reason is logged
/// with the request's correlation id, which the events carry.
pub(crate) async fn cleanup(
    State(app): State<AppState>,
    cid: CorrelationId,
    who: AdminName,
    ApiJson(body): ApiJson<CleanupBody>,
) -> Result<Json<CleanedUp>, ApiError> {
    let actor = admin_actor(&who, body.actor.as_deref())?;
    let reason = check_reason(&body.reason)?;
    tracing::info!(actor = %actor, reason = %ingest_protocol::bounded(&reason), correlation_id = %cid.0, "cleanup");
    let outcome = app
        .execute(
            actor,
            cid,
            Command::Cleanup {
                before: body.before,
            },
        )
        .await?;
    Ok(Json(CleanedUp {
        batches: outcome
            .records
            .iter()
            .map(|r| r.envelope.stream.to_string())
            .collect(),
        events: rows(&outcome.records),
    }))
}

/// `GET /status`: counts by state, holds, pause, log head.
pub(crate) async fn status(State(app): State<AppState>) -> Json<StatusView> {
    let mut view = app.inner.handle.status_view();
    view.replication = app.inner.replication.as_ref().map(|cell| {
        let s = cell.get();
        ingest_protocol::view::ReplicationSummary {
            id: s.id,
            role: serde_json::to_value(s.role)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default(),
            epoch: s.epoch,
            leader: s.leader_url,
            lag: s.lag,
            reason: s.reason,
            replicas: s
                .replicas
                .into_iter()
                .map(|r| ingest_protocol::view::ReplicaLag {
                    id: r.id,
                    url: r.url,
                    applied: r.applied,
                    lag: r.lag,
                    dropped: r.dropped,
                })
                .collect(),
        }
    });
    Json(view)
}

/// `GET /queue`: live jobs by state and priority.
pub(crate) async fn queue(State(app): State<AppState>) -> Result<Json<QueueView>, ApiError> {
    Ok(Json(app.views(|v| v.queue()).await?))
}

#[derive(Debug, Serialize)]
pub(crate) struct Collection {
    #[serde(flatten)]
    view: CollectionView,
    /// The profile's settings, when the profiles directory has it.
    settings: Option<Profile>,
}

/// `GET /collections/{profile}`.
pub(crate) async fn collection(
    State(app): State<AppState>,
    ApiPath(ProfileName(profile)): ApiPath<ProfileName>,
) -> Result<Json<Collection>, ApiError> {
    let name = profile.clone();
    let view = app.views(move |v| v.collection(&name)).await?;
    let settings = app.inner.profiles.get(&profile).cloned();
    let view = match (view, &settings) {
        (Some(v), _) => v,
        // A configured profile nobody has submitted to yet.
        (None, Some(_)) => CollectionView {
            profile: profile.clone(),
            held: false,
            batches_by_state: BTreeMap::new(),
            jobs_by_state: BTreeMap::new(),
            batches: Vec::new(),
            batches_total: 0,
            jobs_total: 0,
        },
        (None, None) => {
            return Err(ApiError::new(
                StatusCode::NOT_FOUND,
                "not_found",
                format!("collection {profile} has no batches, no hold and no profile file"),
            )
            .with("item", "collection")
            .with("id", profile))
        }
    };
    Ok(Json(Collection { view, settings }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admin_actors_and_reasons_are_checked() {
        let alice = AdminName("alice".into());
        for claimed in [None, Some("admin:someone-else"), Some("bob")] {
            assert_eq!(
                admin_actor(&alice, claimed).map(|a| a.to_string()).ok(),
                Some("admin:alice".into()),
                "{claimed:?}"
            );
        }
        assert!(admin_actor(&alice, Some("worker:w")).is_err());
        assert!(admin_actor(&alice, Some("  ")).is_err());
        assert!(check_reason("").is_err());
        assert!(check_reason("bell\u{7}").is_err());
        assert!(check_reason("storage migration\nticket 42").is_ok());
    }
}
