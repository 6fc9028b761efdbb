//! Depositor routes: submit a batch, follow it and its jobs.

use ingest_engine::{EngineError, ServiceError};
use ingest_events::command::Rejection;
use ingest_protocol::api::*;
use ingest_protocol::endpoint::GetBatch;
use ingest_protocol::submission::SubmissionError;
use std::collections::BTreeMap;

use axum::body::Bytes;
use axum::extract::{FromRequest, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Form, Json};
use ingest_events::command::{Command, Item};
use ingest_events::event::Submission;
use ingest_events::state::State as QueueState;
use ingest_events::{Actor, Bid, Jid, StreamId};
use serde::Serialize;
use serde_json::Value;
use uuid::Uuid;

use super::error::{form_rejection, is_json, media_type, parse_json};
use super::scope::Scope;
use super::{ApiError, ApiPath, AppState, CorrelationId};
use ingest_engine::history::{self, HistoryQuery};
use ingest_events::command::JobSpec;
use ingest_projections::views::{BatchTimings, BatchView, ReportView, Retries};
use ingest_protocol::outbound::{OutboundPolicy, UrlError};
use ingest_protocol::submission::{expand_simple, quoted, SubmissionInput};
use ingest_protocol::view::JobView;

/// A submission body: JSON (the fields of the transitions document, plus an
/// optional `uuid`) or `application/x-www-form-urlencoded` (the same names;
/// `manifest` repeated or one line per row; `extra.KEY` for extra fields).
pub(crate) struct SubmissionBody {
    input: SubmissionInput,
    uuid: Option<Uuid>,
}

impl FromRequest<AppState> for SubmissionBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, Self::Rejection> {
        let ct = req.headers().get(header::CONTENT_TYPE).cloned();
        if is_json(ct.as_ref()) {
            let bytes = Bytes::from_request(req, state).await.map_err(|r| {
                if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
                    ApiError::payload_too_large(state.inner.max_body_bytes)
                } else {
                    ApiError::bad_request("malformed_json", r.body_text())
                }
            })?;
            return json_submission(&bytes);
        }
        if media_type(ct.as_ref()).as_deref() == Some("application/x-www-form-urlencoded") {
            let Form(pairs) = Form::<Vec<(String, String)>>::from_request(req, state)
                .await
                .map_err(form_rejection)?;
            return form_submission(pairs);
        }
        Err(ApiError::bad_request(
            "unsupported_content_type",
            "send the submission as application/json or application/x-www-form-urlencoded",
        ))
    }
}

fn json_submission(bytes: &[u8]) -> Result<SubmissionBody, ApiError> {
    let mut value: Value = serde_json::from_slice(bytes)
        .map_err(|e| ApiError::bad_request("malformed_json", e.to_string()))?;
    let Some(object) = value.as_object_mut() else {
        return Err(ApiError::invalid_field(
            "body",
            "a submission is a JSON object",
        ));
    };
    if matches!(object.get("uuid"), Some(v) if !v.is_string() && !v.is_null()) {
        return Err(ApiError::invalid_field("uuid", "must be a string"));
    }
    // Parse again into the input so type errors name their field.
    let rest = serde_json::to_vec(&value)
        .map_err(|e| ApiError::internal(format!("re-encoding the body: {e}")))?;
    let mut input: SubmissionInput = parse_json(&rest)?;
    let uuid = input.uuid.take().map(|s| parse_uuid(&s)).transpose()?;
    Ok(SubmissionBody { input, uuid })
}

fn parse_uuid(s: &str) -> Result<Uuid, ApiError> {
    Uuid::parse_str(s.trim())
        .map_err(|e| ApiError::invalid_field("uuid", format!("{s:?} is not a uuid ({e})")))
}

fn form_submission(pairs: Vec<(String, String)>) -> Result<SubmissionBody, ApiError> {
    let mut input = SubmissionInput::default();
    let mut uuid = None;
    for (key, value) in pairs {
        let slot = match key.as_str() {
            "submitter" => &mut input.submitter,
            "profile" | "profile_name" => &mut input.profile,
            "type" | "payload_type" => &mut input.payload_type,
            "payload_url" => &mut input.payload_url,
            "submission_mode" => &mut input.submission_mode,
            "response_type" => &mut input.response_type,
            "erc_who" => &mut input.erc_who,
            "erc_what" => &mut input.erc_what,
            "erc_when" => &mut input.erc_when,
            "erc_where" => &mut input.erc_where,
            "digest" => &mut input.digest,
            "manifest" => {
                input.manifest.extend(
                    value
                        .lines()
                        .map(str::trim)
                        .filter(|l| !l.is_empty())
                        .map(str::to_string),
                );
                continue;
            }
            "uuid" => {
                if uuid.is_some() {
                    return Err(ApiError::invalid_field("uuid", "is given twice"));
                }
                uuid = Some(parse_uuid(&value)?);
                continue;
            }
            other => match other.strip_prefix("extra.") {
                Some(k) if !k.is_empty() => {
                    if input.extra.insert(k.to_string(), value).is_some() {
                        return Err(ApiError::invalid_field(other, "is given twice"));
                    }
                    continue;
                }
                _ => {
                    return Err(ApiError::invalid_field(
                        other,
                        "unknown field (expected submitter, profile, type, payload_url, submission_mode, response_type, manifest, erc_who, erc_what, erc_when, erc_where, digest, uuid or extra.KEY)",
                    ))
                }
            },
        };
        if slot.is_some() {
            return Err(ApiError::invalid_field(key, "is given twice"));
        }
        *slot = Some(value);
    }
    Ok(SubmissionBody { input, uuid })
}

/// A refused submission: 422 naming the field the error names.
fn build_error(e: &SubmissionError) -> ApiError {
    ApiError::invalid_field(e.field(), e.to_string())
}

/// Every payload URL of a submission against the outbound policy: the
/// payload URL and each inline manifest line's URL (scheme, syntax, the
/// `file://` root, literal addresses; host names are not resolved here,
/// the workers check them when they connect). 422 naming the field.
fn check_payload_urls(
    policy: &OutboundPolicy,
    submission: &Submission,
    jobs: &[JobSpec],
) -> Result<(), ApiError> {
    let refuse = |field: String, url: &str, e: UrlError| {
        ApiError::invalid_field(field, format!("{} {e}", quoted(url)))
    };
    // With inline manifest lines the payload URL may be absent.
    if !submission.payload_url.is_empty() || submission.manifest.is_empty() {
        policy
            .check_url(&submission.payload_url)
            .map_err(|e| refuse("payload_url".into(), &submission.payload_url, e))?;
    }
    if submission.manifest.is_empty() {
        return Ok(());
    }
    for (line, job) in jobs.iter().enumerate() {
        policy
            .check_url(&job.payload_url)
            .map_err(|e| refuse(format!("manifest line {}", line + 1), &job.payload_url, e))?;
    }
    Ok(())
}

/// `POST /batches`.
pub(crate) async fn submit(
    State(app): State<AppState>,
    scope: Scope,
    cid: CorrelationId,
    body: SubmissionBody,
) -> Result<Response, ApiError> {
    let submission = body.input.build().map_err(|e| build_error(&e))?;
    scope.may_submit(&submission.profile_name)?;
    app.inner
        .profiles
        .check(&submission.profile_name)
        .map_err(|e| {
            ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "unknown_profile",
                e.to_string(),
            )
            .with("field", "profile")
            .with("profile", e.name.clone())
        })?;
    // A manifest the batch-pending worker could not expand is refused now,
    // while the depositor is still there to hear about it.
    let jobs = expand_simple(&submission).map_err(|e| build_error(&e))?;
    check_payload_urls(&app.inner.outbound, &submission, &jobs)?;
    let uuid = match body.uuid {
        Some(uuid) => {
            if let Some(existing) =
                existing_batch(&app.inner.handle.state(), &scope, uuid, &submission)?
            {
                // The same submission again (a retry): answer as the first time.
                return Ok((StatusCode::OK, Json(existing)).into_response());
            }
            uuid
        }
        None => Uuid::new_v4(),
    };
    // A depositor with a token of its own is recorded by the token's name;
    // the shared token keeps recording the submitter the body names.
    let actor = scope
        .actor()
        .unwrap_or_else(|| Actor::depositor(submission.submitter.clone()));
    let command = Command::SubmitBatch {
        uuid,
        submission: submission.clone(),
    };
    let outcome = match app
        .inner
        .handle
        .execute_correlated(actor, cid.0, command)
        .await
    {
        Ok(outcome) => outcome,
        // Requests with the same uuid that arrive together all pass the
        // check above; the writer serialises them and refuses all but the
        // first. Each later one is then answered as a retry would be (200
        // with the batch), or 409 when its fields differ.
        Err(ServiceError::Engine(EngineError::Rejected(Rejection::NoChange(_))))
            if body.uuid.is_some() =>
        {
            return match existing_batch(&app.inner.handle.state(), &scope, uuid, &submission)? {
                Some(existing) => Ok((StatusCode::OK, Json(existing)).into_response()),
                None => Err(ApiError::internal(
                    "the uuid was refused as taken, but no batch has it",
                )),
            };
        }
        Err(e) => return Err(e.into()),
    };
    let bid = outcome
        .records
        .iter()
        .find_map(|r| match r.envelope.stream {
            StreamId::Batch(b) => Some(b),
            _ => None,
        })
        .ok_or_else(|| ApiError::internal("the submission appended no batch event"))?;
    let body = Submitted {
        bid: bid.to_string(),
        uuid: uuid.to_string(),
        status: "Pending".into(),
    };
    let mut res = (StatusCode::CREATED, Json(body)).into_response();
    // The batch's own route, as the contract names it.
    let location = ingest_protocol::endpoint::Endpoint::path(&GetBatch(bid));
    if let Ok(loc) = HeaderValue::from_str(&location) {
        res.headers_mut().insert(header::LOCATION, loc);
    }
    Ok(res)
}

/// The batch a retried submission (same uuid) created, or 409 when the
/// uuid was used for a different submission.
fn existing_batch(
    state: &QueueState,
    scope: &Scope,
    uuid: Uuid,
    submission: &Submission,
) -> Result<Option<Submitted>, ApiError> {
    let Some(bid) = state.uuids.get(&uuid) else {
        return Ok(None);
    };
    let Some(b) = state.batches.get(bid) else {
        return Ok(None);
    };
    if !scope.sees(&b.submission.profile_name) {
        // Another depositor's batch: neither its id nor its fields are told.
        return Err(ApiError::conflict(
            "duplicate_uuid",
            format!("uuid {uuid} is taken; submit with another"),
        ));
    }
    if &b.submission != submission {
        return Err(ApiError::conflict(
            "duplicate_uuid",
            format!("uuid {uuid} belongs to batch {bid}, submitted with different fields"),
        )
        .with("bid", bid.to_string()));
    }
    Ok(Some(Submitted {
        bid: bid.to_string(),
        uuid: uuid.to_string(),
        status: b.status.to_string(),
    }))
}

/// `GET /batches/{bid}`: the batch's status and jobs (the reporting view).
pub(crate) async fn batch(
    State(app): State<AppState>,
    scope: Scope,
    ApiPath(bid): ApiPath<Bid>,
) -> Result<Json<BatchView>, ApiError> {
    scope.batch(&app.inner.handle.state(), bid)?;
    app.views(move |v| v.batch(bid))
        .await?
        .map(Json)
        .ok_or_else(|| ApiError::not_found(Item::Batch(bid)))
}

#[derive(Debug, Serialize)]
pub(crate) struct BatchReport {
    bid: String,
    status: String,
    /// The latest report recorded by the reporting daemon.
    report: Option<ReportView>,
    /// Completed and failed jobs now (may be ahead of the report).
    successful_jobs: Vec<String>,
    failed_jobs: Vec<String>,
    jobs_by_state: BTreeMap<String, usize>,
    retries: Retries,
    timings: BatchTimings,
}

/// `GET /batches/{bid}/report`.
pub(crate) async fn batch_report(
    State(app): State<AppState>,
    scope: Scope,
    ApiPath(bid): ApiPath<Bid>,
) -> Result<Json<BatchReport>, ApiError> {
    scope.batch(&app.inner.handle.state(), bid)?;
    let view = app
        .views(move |v| v.batch(bid))
        .await?
        .ok_or_else(|| ApiError::not_found(Item::Batch(bid)))?;
    Ok(Json(BatchReport {
        bid: view.bid,
        status: view.status,
        report: view.report,
        successful_jobs: view.successful_jobs,
        failed_jobs: view.failed_jobs,
        jobs_by_state: view.jobs_by_state,
        retries: view.retries,
        timings: view.timings,
    }))
}

/// `GET /batches/{bid}/history`: every event of the batch and its jobs
/// (filtered by `since`, `until`, `actor`, `collection`, `limit` as `GET /history`).
pub(crate) async fn batch_history(
    State(app): State<AppState>,
    scope: Scope,
    ApiPath(bid): ApiPath<Bid>,
    uri: axum::http::Uri,
) -> Result<Json<History>, ApiError> {
    let mut q = path_scoped_query(&uri)?;
    q.batch = Some(bid);
    history_of(&app, &scope, q).await
}

/// `GET /jobs/{jid}/history`: every event of one job (filtered as
/// `GET /history`).
pub(crate) async fn job_history(
    State(app): State<AppState>,
    scope: Scope,
    ApiPath(jid): ApiPath<Jid>,
    uri: axum::http::Uri,
) -> Result<Json<History>, ApiError> {
    let mut q = path_scoped_query(&uri)?;
    q.job = Some(jid);
    history_of(&app, &scope, q).await
}

/// `GET /history?batch=&job=&since=&until=&actor=&collection=&limit=`: the
/// events of a batch, a job or the whole log, answered from the log's
/// indexes ([`history::query`]).
pub(crate) async fn history(
    State(app): State<AppState>,
    scope: Scope,
    uri: axum::http::Uri,
) -> Result<Json<History>, ApiError> {
    let q = HistoryQuery::from_pairs(super::listing::query_pairs(&uri)?)
        .map_err(super::listing::query_error)?;
    history_of(&app, &scope, q).await
}

/// The query of a per-batch or per-job route: the scope is in the path.
fn path_scoped_query(uri: &axum::http::Uri) -> Result<HistoryQuery, ApiError> {
    let q = HistoryQuery::from_pairs(super::listing::query_pairs(uri)?)
        .map_err(super::listing::query_error)?;
    if q.batch.is_some() || q.job.is_some() {
        return Err(super::listing::query_error(
            ingest_protocol::listing::QueryError {
                param: if q.batch.is_some() { "batch" } else { "job" }.into(),
                reason: "is given in the path here; use GET /history to choose".into(),
            },
        ));
    }
    Ok(q)
}

async fn history_of(
    app: &AppState,
    seen: &Scope,
    mut q: HistoryQuery,
) -> Result<Json<History>, ApiError> {
    let (scope, id) = match (q.batch, q.job) {
        (Some(bid), _) => {
            let jobs = seen.batch(&app.inner.handle.state(), bid)?.jobs.clone();
            (history::Scope::Batch(bid, jobs), bid.to_string())
        }
        (None, Some(jid)) => {
            seen.job(&app.inner.handle.state(), jid)?;
            (history::Scope::Job(jid), jid.to_string())
        }
        (None, None) => {
            limit_to_own_collection(seen, &mut q)?;
            (history::Scope::Log, "log".to_string())
        }
    };
    let log = std::sync::Arc::clone(app.inner.handle.log());
    let (events, truncated) = tokio::task::spawn_blocking(move || history::query(&log, &scope, &q))
        .await
        .map_err(|e| ApiError::internal(format!("the history task failed: {e}")))?
        .map_err(|e| ApiError::internal(format!("cannot read the history: {e:#}")))?;
    Ok(Json(History {
        id,
        events,
        truncated,
    }))
}

/// The whole log's history for a depositor with a token of its own: only
/// one of its collections, named by `collection` (or its only one); the
/// other collections' events, and events of no collection, stay unseen.
fn limit_to_own_collection(scope: &Scope, q: &mut HistoryQuery) -> Result<(), ApiError> {
    let Some(own) = scope.within() else {
        return Ok(());
    };
    let refuse = |reason: String| {
        super::listing::query_error(ingest_protocol::listing::QueryError {
            param: "collection".into(),
            reason,
        })
    };
    match &q.collection {
        Some(c) if own.contains(c) => Ok(()),
        Some(_) => Err(refuse(
            "is not one of this depositor's collections".into(),
        )),
        None if own.len() == 1 => {
            q.collection = own.into_iter().next();
            Ok(())
        }
        None => Err(refuse(
            "is required: this depositor's token sees the history of one of its collections at a time".into(),
        )),
    }
}

/// `GET /jobs/{jid}`.
pub(crate) async fn job(
    State(app): State<AppState>,
    scope: Scope,
    ApiPath(jid): ApiPath<Jid>,
) -> Result<Json<JobView>, ApiError> {
    let state = app.inner.handle.state();
    let mut view = JobView::from(scope.job(&state, jid)?);
    view.waiting = app.inner.waits.of(jid, &view.status);
    Ok(Json(view))
}

/// `GET /batch-uuids/{uuid}`.
pub(crate) async fn batch_by_uuid(
    State(app): State<AppState>,
    scope: Scope,
    ApiPath(uuid): ApiPath<Uuid>,
) -> Result<Json<UuidLookup>, ApiError> {
    let state = app.inner.handle.state();
    let found = state
        .uuids
        .get(&uuid)
        .and_then(|bid| state.batches.get(bid))
        .filter(|b| scope.sees(&b.submission.profile_name));
    match found {
        Some(b) => Ok(Json(UuidLookup {
            uuid: uuid.to_string(),
            bid: b.bid.to_string(),
            status: b.status.to_string(),
        })),
        None => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no batch has uuid {uuid}"),
        )
        .with("item", "batch-uuid")
        .with("id", uuid.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(v: &[(&str, &str)]) -> Vec<(String, String)> {
        v.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn form_fields_map_to_the_submission() {
        let body = form_submission(pairs(&[
            ("submitter", "alice"),
            ("profile", "demo"),
            ("manifest", "a.checkm loc1\r\nb.checkm loc2"),
            ("manifest", "c.checkm"),
            ("extra.note", "hi"),
            ("uuid", "00000000-0000-0000-0000-000000000001"),
        ]))
        .unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(body.input.manifest.len(), 3);
        assert_eq!(body.input.extra.get("note").map(String::as_str), Some("hi"));
        assert_eq!(body.uuid, Some(Uuid::from_u128(1)));
        let s = body.input.build().expect("build");
        assert_eq!(s.profile_name, "demo");
    }

    #[test]
    fn form_and_build_errors_name_the_field() {
        let field = |e: ApiError| {
            assert_eq!(e.status(), StatusCode::UNPROCESSABLE_ENTITY);
            let res = e.into_response();
            res.status()
        };
        for bad in [
            pairs(&[("submiter", "x")]),
            pairs(&[("submitter", "x"), ("submitter", "y")]),
            pairs(&[("uuid", "nope")]),
        ] {
            let e = form_submission(bad).err().expect("refused");
            assert_eq!(field(e), StatusCode::UNPROCESSABLE_ENTITY);
        }
        let input = SubmissionInput {
            submitter: Some("a".into()),
            ..SubmissionInput::default()
        };
        let e = build_error(&input.build().expect_err("no profile"));
        assert_eq!(e.code(), "invalid_field");
        assert!(format!("{e:?}").contains("\"profile\""), "{e:?}");
    }
}
