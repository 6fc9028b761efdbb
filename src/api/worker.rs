//! Worker routes: acquire a batch, start a job, report a step's outcome or a
//! retry, report a batch. Each is fenced: the worker names its ZooKeeper
//! session, and the report is accepted only while that session holds the
//! item's lock node (409 `lock_not_held` otherwise).

use std::time::Duration;

use axum::extract::State;
use axum::Json;
use ingest_events::command::{Command, Item, JobSpec, DEFAULT_PRIORITY, MAX_PRIORITY};
use ingest_events::event::{Erc, Identifiers, InventoryParams, PayloadType, StoreParams};
use ingest_events::{Actor, Bid, Event, Jid, JobState};
use serde::{Deserialize, Deserializer, Serialize};

use super::locks::{batch_lock_path, job_lock_path};
use super::{check_name, rows, ApiError, ApiJson, ApiPath, AppState, CorrelationId};
use crate::config::{Notification, Profile};
use crate::history::HistoryRow;
use crate::submission::expand_simple;
use axum::http::StatusCode;

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

/// A ZooKeeper session id: a JSON integer, or a string in decimal or
/// `0x` hex (ids above 2^53 do not survive JavaScript numbers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SessionId(pub i64);

impl<'de> Deserialize<'de> for SessionId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Signed(i64),
            Unsigned(u64),
            Text(String),
        }
        let parsed = match Raw::deserialize(d)? {
            Raw::Signed(v) => Some(v),
            // Session ids are 64-bit patterns; ZooKeeper prints them unsigned.
            Raw::Unsigned(v) => Some(v as i64),
            Raw::Text(t) => {
                let t = t.trim();
                match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
                    Some(hex) => u64::from_str_radix(hex, 16).ok().map(|v| v as i64),
                    None => t.parse::<i64>().ok(),
                }
            }
        };
        parsed.map(SessionId).ok_or_else(|| {
            serde::de::Error::custom("a session id is an integer, or a string in decimal or 0x hex")
        })
    }
}

/// Who is reporting: the worker's name and its ZooKeeper session.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct WorkerRef {
    worker: String,
    session_id: SessionId,
}

pub(crate) fn worker_actor(name: &str) -> Result<Actor, ApiError> {
    check_name("worker", name)?;
    Ok(Actor::worker(name.trim()))
}

/// Refuses unless `session` owns the lock node at `path`.
pub(crate) async fn fence(app: &AppState, path: &str, session: SessionId) -> Result<(), ApiError> {
    let holder = app.inner.locks.holder(path).await.map_err(|e| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "lock_check_failed",
            format!("{e}; nothing was appended, retry while still holding the lock"),
        )
        .with("path", path.to_string())
    })?;
    match holder {
        Some(owner) if owner == session.0 => Ok(()),
        Some(owner) => Err(ApiError::conflict(
            "lock_not_held",
            format!(
                "session {:#x} does not hold {path} (session {owner:#x} does); the report is refused and nothing was appended",
                session.0
            ),
        )
        .with("path", path.to_string())
        .with("holder", format!("{owner:#x}"))),
        None => Err(ApiError::conflict(
            "lock_not_held",
            format!(
                "nobody holds {path}, so session {:#x} cannot report on it; nothing was appended",
                session.0
            ),
        )
        .with("path", path.to_string())),
    }
}

#[derive(Debug, Serialize)]
pub(crate) struct Acquired {
    bid: String,
    /// Processing, Held (collection on hold) or Failed (nothing to do).
    status: String,
    /// The jobs created, in order.
    jobs: Vec<String>,
    /// The priority the jobs got.
    priority: u8,
    /// Why the payload expanded into no jobs, when it did not expand.
    expansion_error: Option<String>,
    /// The profile's notification settings (summary at queueing, …).
    notification: Option<Notification>,
    events: Vec<HistoryRow>,
}

/// A job a worker expanded from a batch's payload.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct JobBody {
    payload_url: String,
    payload_type: String,
    #[serde(default)]
    primary_id: Option<String>,
    #[serde(default)]
    local_ids: Vec<String>,
    #[serde(default)]
    erc_who: Option<String>,
    #[serde(default)]
    erc_what: Option<String>,
    #[serde(default)]
    erc_when: Option<String>,
    #[serde(default)]
    erc_where: Option<String>,
    /// `ALGORITHM:HEX`.
    #[serde(default)]
    digest: Option<String>,
}

impl JobBody {
    fn spec(self, i: usize) -> Result<JobSpec, ApiError> {
        let field = |name: &str| format!("jobs[{i}].{name}");
        let payload_type = self
            .payload_type
            .parse::<PayloadType>()
            .map_err(|e| ApiError::invalid_field(field("payload_type"), e.to_string()))?;
        let digest = self
            .digest
            .as_deref()
            .map(crate::submission::parse_digest)
            .transpose()
            .map_err(|e| ApiError::invalid_field(field("digest"), format!("{e:#}")))?;
        Ok(JobSpec {
            payload_url: self.payload_url,
            payload_type,
            identifiers: Identifiers {
                primary_id: self.primary_id.filter(|p| !p.trim().is_empty()),
                local_ids: self.local_ids,
            },
            metadata: Erc {
                who: self.erc_who,
                what: self.erc_what,
                when: self.erc_when,
                r#where: self.erc_where,
            },
            digest,
            priority: None,
        })
    }
}

/// The body of `POST /batches/{bid}/acquire`: the worker, and either the
/// jobs it expanded the payload into or why the payload does not expand
/// (without both, the server expands the simple forms itself).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AcquireBody {
    worker: String,
    session_id: SessionId,
    #[serde(default)]
    jobs: Option<Vec<JobBody>>,
    #[serde(default)]
    expansion_error: Option<String>,
}

/// `POST /batches/{bid}/acquire`: the batch-pending daemon expands a batch.
pub(crate) async fn acquire_batch(
    State(app): State<AppState>,
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
                .map(|(i, j)| j.spec(i))
                .collect::<Result<Vec<_>, _>>()?,
        ),
        None => None,
    };
    fence(&app, &batch_lock_path(bid), body.session_id).await?;
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
        (None, Some(why)) => Err(anyhow::anyhow!(why)),
        (None, None) => expand_simple(&submission),
    };
    let (mut jobs, expansion_error) = match expanded {
        Ok(jobs) => (jobs, None),
        Err(e) => {
            tracing::warn!(%bid, error = %format!("{e:#}"), "the batch's payload does not expand; the batch fails");
            (Vec::new(), Some(format!("{e:#}")))
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
    let status = batch_status(&app, bid);
    Ok(Json(Acquired {
        bid: bid.to_string(),
        status,
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

fn job_status(app: &AppState, jid: Jid) -> (String, String) {
    let state = app.inner.handle.state();
    let job = state.jobs.get(&jid);
    let status = job.map(|j| j.status.to_string()).unwrap_or_default();
    let batch = job
        .and_then(|j| state.batches.get(&j.bid))
        .map(|b| b.status.to_string())
        .unwrap_or_default();
    (status, batch)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ReportBody {
    worker: String,
    session_id: SessionId,
    /// The error of sending the report, if it could not be sent.
    #[serde(default)]
    notification_error: Option<String>,
}

#[derive(Debug, Serialize)]
pub(crate) struct Reported {
    bid: String,
    status: String,
    events: Vec<HistoryRow>,
}

/// `POST /batches/{bid}/report`: the reporting daemon records the report.
pub(crate) async fn report_batch(
    State(app): State<AppState>,
    cid: CorrelationId,
    ApiPath(bid): ApiPath<Bid>,
    ApiJson(body): ApiJson<ReportBody>,
) -> Result<Json<Reported>, ApiError> {
    let actor = worker_actor(&body.worker)?;
    fence(&app, &batch_lock_path(bid), body.session_id).await?;
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

#[derive(Debug, Serialize)]
pub(crate) struct JobMoved {
    jid: String,
    /// The job's state now.
    status: String,
    /// Its batch's state now (Reporting once the last job finished).
    batch_status: String,
    events: Vec<HistoryRow>,
}

/// `POST /jobs/{jid}/start`: the job-pending daemon starts a job (Estimating,
/// or Held when its collection is held; 409 `queue_paused` while paused).
pub(crate) async fn start_job(
    State(app): State<AppState>,
    cid: CorrelationId,
    ApiPath(jid): ApiPath<Jid>,
    ApiJson(body): ApiJson<WorkerRef>,
) -> Result<Json<JobMoved>, ApiError> {
    let actor = worker_actor(&body.worker)?;
    fence(&app, &job_lock_path(jid), body.session_id).await?;
    let outcome = app.execute(actor, cid, Command::StartJob { jid }).await?;
    let (status, batch_status) = job_status(&app, jid);
    Ok(Json(JobMoved {
        jid: jid.to_string(),
        status,
        batch_status,
        events: rows(&outcome.records),
    }))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum OutcomeKind {
    Success,
    Failure,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct IdentifiersBody {
    #[serde(default)]
    primary_id: Option<String>,
    #[serde(default)]
    local_ids: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct StoreBody {
    manifest_url: String,
    #[serde(default = "add")]
    mode: String,
    #[serde(default)]
    delete: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct InventoryBody {
    manifest_url: String,
    #[serde(default = "add")]
    mode: String,
}

fn add() -> String {
    "add".into()
}

/// A step's outcome.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct OutcomeBody {
    worker: String,
    session_id: SessionId,
    /// The state the worker worked on.
    state: String,
    outcome: OutcomeKind,
    #[serde(default)]
    message: String,
    #[serde(default)]
    priority: Option<u8>,
    #[serde(default)]
    space_needed: Option<u64>,
    #[serde(default)]
    identifiers: Option<IdentifiersBody>,
    #[serde(default)]
    store: Option<StoreBody>,
    #[serde(default)]
    inventory: Option<InventoryBody>,
    /// How long the step took, for the step-duration metrics.
    #[serde(default)]
    duration_ms: Option<u64>,
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
    fence(&app, &job_lock_path(jid), body.session_id).await?;
    check_current(&app, jid, worked_on)?;

    // One command: the step's data and the move are appended atomically, and
    // the engine refuses a report on a state the job has left (stale), so a
    // report applied twice cannot move the job on a second step.
    // An armed fault turns the next successful report of this step into a
    // failure that names the admin and the reason.
    let fault = match body.outcome {
        OutcomeKind::Success => app.inner.faults.take(worked_on),
        OutcomeKind::Failure => None,
    };
    let (success, message) = match &fault {
        Some(f) => (false, f.message(worked_on)),
        None => (body.outcome == OutcomeKind::Success, body.message),
    };
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
    };
    let records = match app.execute(actor, cid, command).await {
        Ok(outcome) => outcome.records,
        Err(e) => {
            if let Some(f) = fault {
                app.inner.faults.put_back(worked_on, f);
            }
            return Err(e);
        }
    };
    if let Some(ms) = body.duration_ms {
        app.inner
            .metrics
            .observe_step(worked_on, Duration::from_millis(ms), success);
    }
    let (status, batch_status) = job_status(&app, jid);
    Ok(Json(JobMoved {
        jid: jid.to_string(),
        status,
        batch_status,
        events: rows(&records),
    }))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RetryBody {
    worker: String,
    session_id: SessionId,
    /// The state the step runs in.
    state: String,
    /// The attempt that follows (2 for the first retry).
    attempt: u32,
    /// The recoverable error.
    message: String,
}

/// `POST /jobs/{jid}/retries`: a step hit a recoverable error and tries again.
pub(crate) async fn retry(
    State(app): State<AppState>,
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
    fence(&app, &job_lock_path(jid), body.session_id).await?;
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
    let (status, batch_status) = job_status(&app, jid);
    Ok(Json(JobMoved {
        jid: jid.to_string(),
        status,
        batch_status,
        events: rows(&outcome.records),
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
            notification: Notification::default(),
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
