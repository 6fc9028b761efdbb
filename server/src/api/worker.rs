//! Worker routes: acquire a batch, start a job, report a step's outcome or a
//! retry, report a batch. Each is fenced: the worker names its ZooKeeper
//! session, and the report is accepted only while that session holds the
//! item's lock node (409 `lock_not_held` otherwise).

use ingest_protocol::api::*;
use std::time::Duration;

use axum::extract::State;
use axum::Json;
use ingest_events::command::{Command, Item, JobSpec, DEFAULT_PRIORITY, MAX_PRIORITY};
use ingest_events::event::{Erc, Identifiers, InventoryParams, PayloadType, StoreParams};
use ingest_events::lifecycle::BatchState;
use ingest_events::{Actor, Bid, Event, Jid, JobState};

use super::locks::{batch_lock_path, job_lock_path};
use super::{check_name, rows, ApiError, ApiJson, ApiPath, AppState, CorrelationId};
use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::StatusCode;
use ingest_config::Profile;
use ingest_events::Recorded;
use ingest_protocol::fence::{FenceSecret, LockNode, FENCE_HEADER};
use ingest_protocol::submission::expand_simple;

/// The priority of a batch's jobs: the profile's, when it sets one, else
/// Merritt's `ln(jobs) * 10 + 5` (rounded down, clamped to 0–99), so large
/// batches yield to small ones.
pub fn batch_priority(jobs: usize, profile: Option<&Profile>) -> u8 {
    if let Some(p) = profile.and_then(|p| p.priority) {
        return p.min(MAX_PRIORITY);
    }
    if jobs <= 1 {
        return DEFAULT_PRIORITY;
    }
    let p = (jobs as f64).ln() * 10.0 + 5.0;
    p.floor().clamp(0.0, f64::from(MAX_PRIORITY)) as u8
}

pub(crate) fn worker_actor(name: &str) -> Result<Actor, ApiError> {
    check_name("worker", name)?;
    Ok(Actor::worker(name.trim()))
}

/// The lock holder's secret a fenced report carries in the
/// [`FENCE_HEADER`]: absent, unreadable, or a secret.
pub(crate) struct Fence(Result<FenceSecret, &'static str>);

impl<S: Send + Sync> FromRequestParts<S> for Fence {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        let secret = match parts.headers.get(FENCE_HEADER) {
            None => Err("the report carries no ingest-fence header"),
            Some(v) => v
                .to_str()
                .ok()
                .and_then(|v| FenceSecret::parse(v).ok())
                .ok_or("the ingest-fence header is not 64 hexadecimal digits"),
        };
        Ok(Fence(secret))
    }
}

/// Refuses unless `session` owns the lock node at `path` and the report's
/// secret opens it. The refusal says why but never names the holder: a
/// caller who could learn the holder's session from a wrong try could
/// forge the holder's reports.
pub(crate) async fn fence(
    app: &AppState,
    path: &str,
    session: SessionId,
    fence: &Fence,
) -> Result<(), ApiError> {
    let refuse = |why: &str| {
        ApiError::conflict(
            "lock_not_held",
            format!(
                "session {:#x} cannot report on {path}: {why}; the report is refused and nothing was appended",
                session.0
            ),
        )
        .with("path", path.to_string())
    };
    let secret = fence.0.as_ref().map_err(|why| refuse(why))?;
    let holder = app.inner.locks.holder(path).await.map_err(|e| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "lock_check_failed",
            format!("{e}; nothing was appended, retry while still holding the lock"),
        )
        .with("path", path.to_string())
    })?;
    let Some(holder) = holder else {
        return Err(refuse("nobody holds the lock"));
    };
    let opened = LockNode::read(&holder.data).is_some_and(|node| secret.opens(&node));
    if holder.session == session.0 && opened {
        Ok(())
    } else {
        // One answer for a wrong session and a wrong secret.
        Err(refuse(
            "the lock is not held by this session with this secret",
        ))
    }
}

/// The job a worker expanded, checked.
fn job_spec(body: JobBody, i: usize) -> Result<JobSpec, ApiError> {
    let field = |name: &str| format!("jobs[{i}].{name}");
    let payload_type = body
        .payload_type
        .parse::<PayloadType>()
        .map_err(|e| ApiError::invalid_field(field("payload_type"), e.to_string()))?;
    let digest = body
        .digest
        .as_deref()
        .map(ingest_protocol::submission::parse_digest)
        .transpose()
        .map_err(|e| ApiError::invalid_field(field("digest"), e.to_string()))?;
    Ok(JobSpec {
        payload_url: body.payload_url,
        payload_type,
        identifiers: Identifiers {
            primary_id: body.primary_id.filter(|p| !p.trim().is_empty()),
            local_ids: body.local_ids,
        },
        metadata: Erc {
            who: body.erc_who,
            what: body.erc_what,
            when: body.erc_when,
            r#where: body.erc_where,
        },
        digest,
        priority: None,
    })
}

/// `POST /batches/{bid}/acquire`: the batch-pending daemon expands a batch.
pub(crate) async fn acquire_batch(
    State(app): State<AppState>,
    fenced: Fence,
    cid: CorrelationId,
    ApiPath(bid): ApiPath<Bid>,
    ApiJson(body): ApiJson<AcquireBody>,
) -> Result<Json<Acquired>, ApiError> {
    let actor = worker_actor(&body.worker)?;
    if body.jobs.is_some() && body.expansion_error.is_some() {
        return Err(ApiError::invalid_field(
            "expansion_error",
            "give either jobs or expansion_error, not both",
        ));
    }
    let given = match body.jobs {
        Some(jobs) => Some(
            jobs.into_iter()
                .enumerate()
                .map(|(i, j)| job_spec(j, i))
                .collect::<Result<Vec<_>, _>>()?,
        ),
        None => None,
    };
    fence(&app, &batch_lock_path(bid), body.session_id, &fenced).await?;
    let submission = app
        .inner
        .handle
        .state()
        .batches
        .get(&bid)
        .map(|b| b.submission.clone())
        .ok_or_else(|| ApiError::not_found(Item::Batch(bid)))?;
    let profile = app.inner.profiles.get(&submission.profile_name).cloned();
    // A payload that does not expand fails the batch (the engine does that
    // for an empty expansion) rather than leaving it Pending for ever.
    let expanded = match (given, body.expansion_error) {
        (Some(jobs), _) => Ok(jobs),
        (None, Some(why)) => Err(why),
        (None, None) => expand_simple(&submission).map_err(|e| e.to_string()),
    };
    // A job the engine would refuse to create (an oversized field from a
    // manifest) fails the batch with the reason, rather than making every
    // acquire of it fail for ever.
    let expanded = expanded.and_then(|jobs| {
        for (i, spec) in jobs.iter().enumerate() {
            if let Err(r) = ingest_events::command::validate_spec(spec) {
                return Err(format!("job {} of the expansion: {r}", i + 1));
            }
        }
        Ok(jobs)
    });
    let (mut jobs, expansion_error) = match expanded {
        Ok(jobs) => (jobs, None),
        Err(why) => {
            // The reason is the depositor's input quoted by a worker: bounded
            // before it is logged or recorded.
            let why = ingest_protocol::cut(&why, ingest_protocol::MAX_MESSAGE_BYTES).into_owned();
            tracing::warn!(%bid, error = %why, "the batch's payload does not expand; the batch fails");
            (Vec::new(), Some(why))
        }
    };
    let priority = batch_priority(jobs.len(), profile.as_ref());
    for j in &mut jobs {
        j.priority = j.priority.or(Some(priority));
    }
    let command = match &expansion_error {
        Some(message) => Command::RejectBatch {
            bid,
            message: message.clone(),
        },
        None => Command::AcquireBatch { bid, jobs },
    };
    let outcome = app.execute(actor, cid, command).await?;
    let created = outcome
        .records
        .iter()
        .filter(|r| matches!(r.event, Event::JobCreated(_)))
        .map(|r| r.envelope.stream.to_string())
        .collect();
    let (status, message) = app
        .inner
        .handle
        .state()
        .batches
        .get(&bid)
        .map(|b| (b.status.to_string(), b.message.clone()))
        .unwrap_or_default();
    Ok(Json(Acquired {
        bid: bid.to_string(),
        status,
        message,
        jobs: created,
        priority,
        expansion_error,
        notification: profile.map(|p| p.notification),
        events: rows(&outcome.records),
    }))
}

fn batch_status(app: &AppState, bid: Bid) -> String {
    app.inner
        .handle
        .state()
        .batches
        .get(&bid)
        .map(|b| b.status.to_string())
        .unwrap_or_default()
}

/// The answer to a job report: the job's state and its batch's, read after
/// the report's events were applied.
fn job_moved(app: &AppState, jid: Jid, records: &[Recorded]) -> JobMoved {
    let state = app.inner.handle.state();
    let job = state.jobs.get(&jid);
    let status = job.map(|j| j.status.to_string()).unwrap_or_default();
    let batch = job.and_then(|j| state.batches.get(&j.bid));
    JobMoved {
        jid: jid.to_string(),
        status,
        batch_status: batch.map(|b| b.status.to_string()).unwrap_or_default(),
        bid: job.map(|j| j.bid.to_string()).unwrap_or_default(),
        events: rows(records),
    }
}

/// `POST /batches/{bid}/report`: the reporting daemon records the report.
pub(crate) async fn report_batch(
    State(app): State<AppState>,
    fenced: Fence,
    cid: CorrelationId,
    ApiPath(bid): ApiPath<Bid>,
    ApiJson(body): ApiJson<ReportBody>,
) -> Result<Json<Reported>, ApiError> {
    let actor = worker_actor(&body.worker)?;
    fence(&app, &batch_lock_path(bid), body.session_id, &fenced).await?;
    let outcome = app
        .execute(
            actor,
            cid,
            Command::ReportBatch {
                bid,
                notification_error: body.notification_error,
            },
        )
        .await?;
    Ok(Json(Reported {
        bid: bid.to_string(),
        status: batch_status(&app, bid),
        events: rows(&outcome.records),
    }))
}

/// `POST /jobs/{jid}/start`: the job-pending daemon starts a job (Estimating,
/// or Held when its collection is held; 409 `queue_paused` while paused).
pub(crate) async fn start_job(
    State(app): State<AppState>,
    fenced: Fence,
    cid: CorrelationId,
    ApiPath(jid): ApiPath<Jid>,
    ApiJson(body): ApiJson<WorkerRef>,
) -> Result<Json<JobMoved>, ApiError> {
    let actor = worker_actor(&body.worker)?;
    fence(&app, &job_lock_path(jid), body.session_id, &fenced).await?;
    let outcome = app.execute(actor, cid, Command::StartJob { jid }).await?;
    Ok(Json(job_moved(&app, jid, &outcome.records)))
}

fn parse_state(text: &str) -> Result<JobState, ApiError> {
    text.parse::<JobState>()
        .map_err(|e| ApiError::invalid_field("state", e.to_string()))
}

/// Refuses a report about a state the job has left (a stale worker).
fn check_current(app: &AppState, jid: Jid, reported: JobState) -> Result<(), ApiError> {
    let state = app.inner.handle.state();
    let job = state
        .jobs
        .get(&jid)
        .ok_or_else(|| ApiError::not_found(Item::Job(jid)))?;
    if job.status != reported {
        return Err(ApiError::conflict(
            "stale_report",
            format!(
                "job {jid} is {}, not {reported}: the report is stale and nothing was appended",
                job.status
            ),
        )
        .with("id", jid.to_string())
        .with("current", job.status.to_string())
        .with("reported", reported.to_string()));
    }
    Ok(())
}

/// `POST /jobs/{jid}/outcome`: records the step's data (space, identifiers,
/// store, inventory) and moves the job to the state's success or fail
/// successor.
pub(crate) async fn outcome(
    State(app): State<AppState>,
    fenced: Fence,
    cid: CorrelationId,
    ApiPath(jid): ApiPath<Jid>,
    ApiJson(body): ApiJson<OutcomeBody>,
) -> Result<Json<JobMoved>, ApiError> {
    let actor = worker_actor(&body.worker)?;
    let worked_on = parse_state(&body.state)?;
    if let Some(p) = body.priority {
        if p > MAX_PRIORITY {
            return Err(ApiError::invalid_field(
                "priority",
                format!("{p} is outside 0-{MAX_PRIORITY}"),
            ));
        }
    }
    fence(&app, &job_lock_path(jid), body.session_id, &fenced).await?;
    check_current(&app, jid, worked_on)?;

    // One command: the step's data and the move are appended atomically, and
    // the engine refuses a report on a state the job has left (stale), so a
    // report applied twice cannot move the job on a second step.
    // An armed fault turns the next successful report of this step into a
    // failure that names the admin and the reason: the engine decides it
    // from its state (faults are events), in the same append.
    let success = body.outcome == OutcomeKind::Success;
    let message = body.message;
    let command = Command::StepOutcome {
        jid,
        state: worked_on,
        success,
        message,
        priority: body.priority,
        space_needed: body.space_needed,
        identifiers: body.identifiers.map(|ids| Identifiers {
            primary_id: ids.primary_id,
            local_ids: ids.local_ids,
        }),
        store: body.store.map(|s| StoreParams {
            manifest_url: s.manifest_url,
            mode: s.mode,
            delete: s.delete,
        }),
        inventory: body.inventory.map(|i| InventoryParams {
            manifest_url: i.manifest_url,
            mode: i.mode,
        }),
        failure: body.failure,
    };
    let records = match app.execute(actor, cid, command).await {
        Ok(outcome) => outcome.records,
        Err(e) => return Err(e),
    };
    if let Some(ms) = body.duration_ms {
        app.inner
            .metrics
            .observe_step(worked_on, Duration::from_millis(ms), success);
    }
    Ok(Json(job_moved(&app, jid, &records)))
}

/// `POST /jobs/{jid}/retries`: a step hit a recoverable error and tries again.
pub(crate) async fn retry(
    State(app): State<AppState>,
    fenced: Fence,
    cid: CorrelationId,
    ApiPath(jid): ApiPath<Jid>,
    ApiJson(body): ApiJson<RetryBody>,
) -> Result<Json<JobMoved>, ApiError> {
    let actor = worker_actor(&body.worker)?;
    let worked_on = parse_state(&body.state)?;
    if body.attempt < 2 {
        return Err(ApiError::invalid_field(
            "attempt",
            "is the attempt that follows the error: 2 for the first retry",
        ));
    }
    fence(&app, &job_lock_path(jid), body.session_id, &fenced).await?;
    check_current(&app, jid, worked_on)?;
    let outcome = app
        .execute(
            actor,
            cid,
            Command::RecordStepRetry {
                jid,
                attempt: body.attempt,
                message: body.message,
            },
        )
        .await?;
    Ok(Json(job_moved(&app, jid, &outcome.records)))
}

/// `GET /reporting-batches?status=Reporting|UpdateReporting`: the batches
/// the engine has in that status, oldest first, at most
/// [`MAX_REPORTING_LISTED`], from the index of them the engine keeps with
/// its published state (never ZooKeeper, and not a scan of every batch).
/// The workers' reporting sweep reads this instead of every batch's status
/// node. Any other parameter, or another status, is 400 `invalid_query`
/// naming it.
pub(crate) async fn reporting_batches(
    State(app): State<AppState>,
    uri: axum::http::Uri,
) -> Result<Json<ReportingBatches>, ApiError> {
    let invalid = |param: &str, message: String| {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_query", message)
            .with("param", ingest_protocol::cut(param, 64).into_owned())
    };
    let mut status = None;
    for (name, value) in super::listing::query_pairs(&uri)? {
        if name != "status" {
            return Err(invalid(
                &name,
                format!(
                    "unknown parameter {:?}: the only one is status",
                    ingest_protocol::cut(&name, 64)
                ),
            ));
        }
        let wanted = match value.parse::<ingest_events::lifecycle::BatchState>() {
            Ok(s @ (BatchState::Reporting | BatchState::UpdateReporting)) => s,
            _ => {
                return Err(invalid(
                    "status",
                    format!(
                        "status {:?} is not Reporting or UpdateReporting",
                        ingest_protocol::cut(&value, 64)
                    ),
                ))
            }
        };
        status = Some(wanted);
    }
    let Some(status) = status else {
        return Err(invalid(
            "status",
            "status is missing: Reporting or UpdateReporting".to_string(),
        ));
    };
    let (bids, more) = app
        .inner
        .handle
        .reporting_batches(status, MAX_REPORTING_LISTED)
        .unwrap_or_default();
    Ok(Json(ReportingBatches {
        status: status.to_string(),
        bids: bids.iter().map(ToString::to_string).collect(),
        more,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn priority_grows_with_batch_size_and_the_profile_overrides_it() {
        assert_eq!(batch_priority(0, None), DEFAULT_PRIORITY);
        assert_eq!(batch_priority(1, None), 5);
        assert_eq!(batch_priority(10, None), 28);
        assert_eq!(batch_priority(100, None), 51);
        assert_eq!(batch_priority(10_000, None), 97);
        assert_eq!(batch_priority(1_000_000, None), 99);
        let p = Profile {
            name: "p".into(),
            priority: Some(3),
            notification: ingest_config::Notification::default(),
        };
        assert_eq!(batch_priority(10_000, Some(&p)), 3);
    }

    #[test]
    fn session_ids_parse_from_numbers_and_hex() {
        let parse = |v: serde_json::Value| serde_json::from_value::<SessionId>(v).map(|s| s.0);
        assert_eq!(parse(serde_json::json!(42)).ok(), Some(42));
        assert_eq!(parse(serde_json::json!("0x2a")).ok(), Some(42));
        assert_eq!(parse(serde_json::json!("-5")).ok(), Some(-5));
        assert_eq!(
            parse(serde_json::json!(u64::MAX)).ok(),
            Some(-1),
            "unsigned ids keep their bits"
        );
        assert!(parse(serde_json::json!("zz")).is_err());
        assert!(parse(serde_json::json!(1.5)).is_err());
    }
}
