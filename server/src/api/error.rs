//! The API's error shape and the extractors that produce it.
//!
//! Every error is JSON: `{"error": {"code": "stable_code", "message": "…", …}}`
//! with further fields that depend on the code (`field`, `current`,
//! `allowed`, …). The codes are stable; the messages are for people.
//!
//! | status | codes |
//! |---|---|
//! | 400 | `malformed_json`, `malformed_form`, `unsupported_content_type`, `invalid_id`, `invalid_header`, `invalid_query` |
//! | 401 | `unauthorized` |
//! | 404 | `not_found`, `no_route` |
//! | 405 | `method_not_allowed` |
//! | 409 | `illegal_transition`, `queue_paused`, `no_change`, `active_jobs`, `collection_held`, `cleaned_up`, `conflict`, `lock_not_held`, `stale_report`, `duplicate_uuid`, `rejected` |
//! | 413 | `payload_too_large`, `record_too_large` |
//! | 422 | `invalid_field`, `unknown_profile` |
//! | 500 | `outcome_unknown`, `log_corrupt`, `internal` |
//! | 503 | `engine_stopped`, `log_needs_repair`, `log_locked`, `lock_check_failed` |

use std::str::FromStr;

use axum::body::Bytes;
use axum::extract::rejection::FormRejection;
use axum::extract::{FromRequest, FromRequestParts, Path, Request};
use axum::http::request::Parts;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use ingest_events::command::{Item, Rejection};
use ingest_events::LogError;
use serde::de::DeserializeOwned;
use serde_json::{json, Map, Value};

use ingest_engine::engine::EngineError;
use ingest_engine::service::ServiceError;

/// An error answered to an API client.
#[derive(Debug, Clone)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
    details: Map<String, Value>,
}

impl ApiError {
    /// An error with a status, a stable code and a message.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            code,
            message: message.into(),
            details: Map::new(),
        }
    }

    /// Adds a field to the error object.
    pub fn with(mut self, key: &str, value: impl Into<Value>) -> ApiError {
        self.details.insert(key.to_string(), value.into());
        self
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The stable code.
    pub fn code(&self) -> &'static str {
        self.code
    }

    /// The message (what went wrong, for a person).
    pub fn message(&self) -> &str {
        &self.message
    }

    /// 400 with `code`.
    pub fn bad_request(code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, code, message)
    }

    /// 422 `invalid_field` naming the field.
    pub fn invalid_field(field: impl Into<String>, reason: impl Into<String>) -> ApiError {
        let (field, reason) = (field.into(), reason.into());
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_field",
            format!("invalid {field}: {reason}"),
        )
        .with("field", field)
        .with("reason", reason)
    }

    /// 404 `not_found` for a queue item.
    pub fn not_found(item: Item) -> ApiError {
        let (kind, id) = item_parts(item);
        ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("{item} does not exist"),
        )
        .with("item", kind)
        .with("id", id)
    }

    /// 409 with `code`.
    pub fn conflict(code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::CONFLICT, code, message)
    }

    /// 401 `unauthorized`.
    pub fn unauthorized(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", message)
    }

    /// 413 `payload_too_large`.
    pub fn payload_too_large(limit: usize) -> ApiError {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            format!("the request body is larger than {limit} bytes"),
        )
        .with("limit", limit)
    }

    /// 500 `internal`: a fault of the server, not of the request.
    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
    }
}

fn item_parts(item: Item) -> (&'static str, String) {
    match item {
        Item::Batch(b) => ("batch", b.to_string()),
        Item::Job(j) => ("job", j.to_string()),
        Item::Access(q) => ("access", q.to_string()),
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut error = Map::new();
        error.insert("code".into(), Value::from(self.code));
        error.insert("message".into(), Value::from(self.message));
        for (k, v) in self.details {
            error.insert(k, v);
        }
        let retry_after = (self.status == StatusCode::TOO_MANY_REQUESTS)
            .then(|| error.get("retry_after_secs").and_then(Value::as_u64))
            .flatten();
        let mut res = (self.status, Json(json!({ "error": error }))).into_response();
        if let Some(secs) = retry_after {
            res.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        if self.status == StatusCode::UNAUTHORIZED {
            res.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"ingest\""),
            );
        }
        res
    }
}

impl From<Rejection> for ApiError {
    fn from(r: Rejection) -> ApiError {
        let message = r.to_string();
        match r {
            Rejection::NotFound { item } => ApiError::not_found(item),
            Rejection::IllegalTransition {
                item,
                current,
                requested,
                allowed,
            } => {
                let (kind, id) = item_parts(item);
                ApiError::conflict("illegal_transition", message)
                    .with("item", kind)
                    .with("id", id)
                    .with("current", current)
                    .with("requested", requested)
                    .with("allowed", allowed)
            }
            Rejection::QueuePaused { item } => {
                let (kind, id) = item_parts(item);
                ApiError::conflict("queue_paused", message)
                    .with("item", kind)
                    .with("id", id)
            }
            Rejection::AccessQueuePaused { item, queue } => {
                let (kind, id) = item_parts(item);
                ApiError::conflict("queue_paused", message)
                    .with("item", kind)
                    .with("id", id)
                    .with("queue", queue.name())
            }
            Rejection::NoChange(_) => ApiError::conflict("no_change", message),
            Rejection::ActiveJobs { item, jobs } => {
                let (kind, id) = item_parts(item);
                let jobs: Vec<Value> = jobs
                    .iter()
                    .map(|(j, s)| json!({"jid": j.to_string(), "state": s.to_string()}))
                    .collect();
                ApiError::conflict("active_jobs", message)
                    .with("item", kind)
                    .with("id", id)
                    .with("jobs", jobs)
            }
            Rejection::CollectionStillHeld { profile } => {
                ApiError::conflict("collection_held", message).with("profile", profile)
            }
            Rejection::CleanedUp { item } => {
                let (kind, id) = item_parts(item);
                ApiError::conflict("cleaned_up", message)
                    .with("item", kind)
                    .with("id", id)
            }
            Rejection::Invalid { field, reason } => ApiError::invalid_field(field, reason),
            Rejection::UnrecoverableFailure { item, kind } => {
                let (kind_of_item, id) = item_parts(item);
                ApiError::conflict("unrecoverable_failure", message)
                    .with("item", kind_of_item)
                    .with("id", id)
                    .with("failure", kind.name())
                    .with("new_submission_required", true)
            }
            Rejection::StaleReport {
                item,
                current,
                reported,
            } => {
                let (_, id) = item_parts(item);
                ApiError::conflict("stale_report", message)
                    .with("id", id)
                    .with("current", current)
                    .with("reported", reported)
            }
            _ => ApiError::conflict("rejected", message),
        }
    }
}

impl From<ServiceError> for ApiError {
    fn from(e: ServiceError) -> ApiError {
        match e {
            ServiceError::Engine(EngineError::Rejected(r)) => r.into(),
            ServiceError::Engine(EngineError::Conflict(c)) => ApiError::conflict(
                "conflict",
                format!("{c}; nothing was appended: read the item again and retry"),
            ),
            ServiceError::Engine(EngineError::Log(e)) => log_error(e),
            ServiceError::Engine(EngineError::Fold(e)) => {
                tracing::error!(error = %e, "the log disagrees with the state");
                ApiError::internal(format!(
                    "the event log disagrees with the rules that wrote it ({e}); the command's outcome is unknown and an operator must run `ingest verify`"
                ))
            }
            ServiceError::Engine(EngineError::NotLeader) => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "not_leader",
                "this engine follows and takes no commands; send them to the leader (GET /replication names it); nothing was appended",
            ),
            ServiceError::Engine(EngineError::Replication(e)) => {
                let code = match e {
                    ingest_engine::ReplicationError::NoQuorum(_) => "no_quorum",
                    ingest_engine::ReplicationError::TooLarge { .. } => "record_too_large",
                    _ => "not_leader",
                };
                let status = if code == "record_too_large" {
                    StatusCode::PAYLOAD_TOO_LARGE
                } else {
                    StatusCode::SERVICE_UNAVAILABLE
                };
                ApiError::new(
                    status,
                    code,
                    format!("{e}; this command was not acknowledged: retry it (with the leader, once one leads)"),
                )
            }
            ServiceError::OutcomeUnknown(e) => {
                tracing::error!(error = %e, "a command's write did not become durable");
                ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "outcome_unknown",
                    format!("the event log failed ({e}); the command's outcome is unknown until the engine restarts: read the item again before retrying"),
                )
            }
            ServiceError::NoWriter(e) => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "engine_stopped",
                format!("the engine's writer thread could not be started ({e}); it takes no commands"),
            ),
            ServiceError::Ids(e) => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "no_ids",
                ServiceError::Ids(e).to_string(),
            ),
            ServiceError::Stopped => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "engine_stopped",
                "the engine has stopped and takes no commands; if this command was already sent its outcome is unknown",
            ),
            // Both enums are non-exhaustive: a variant added later is a
            // fault of the server until it is mapped here.
            other => ApiError::internal(format!("the engine failed: {other}")),
        }
    }
}

fn log_error(e: LogError) -> ApiError {
    match e {
        LogError::RecordTooLarge { kind, bytes, limit } => ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "record_too_large",
            format!("event {kind} would be a {bytes}-byte record; the log accepts at most {limit} bytes; nothing was appended"),
        )
        .with("limit", limit),
        LogError::NeedsRepair { position, reason } => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "log_needs_repair",
            format!("the event log fails its hash chain at position {position} ({reason}); appends are refused until an operator runs `ingest repair`; nothing was appended"),
        ),
        LogError::Locked { .. } => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "log_locked",
            "the event log is held by another process; nothing was appended",
        ),
        LogError::Corrupt { position, reason } => {
            tracing::error!(position, reason = %reason, "event log record corrupt");
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "log_corrupt",
                format!("event log record at position {position} is corrupt ({reason}); an operator must run `ingest verify`"),
            )
        }
        other => {
            tracing::error!(error = %other, "event log failure");
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "outcome_unknown",
                format!("the event log failed ({other}); the command's outcome is unknown: read the item again before retrying"),
            )
        }
    }
}

/// Maps an error of reading the log (history, views) to a response.
pub(crate) fn read_error(e: LogError) -> ApiError {
    match e {
        LogError::Corrupt { .. } => log_error(e),
        other => ApiError::internal(format!("cannot read the event log: {other}")),
    }
}

/// A JSON body: `Content-Type: application/json` (400 otherwise), at most
/// the body limit (413), well-formed (400 `malformed_json`) and of the
/// expected shape (422 `invalid_field` naming the field by its path).
pub struct ApiJson<T>(pub T);

impl<S, T> FromRequest<S> for ApiJson<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        if !is_json(req.headers().get(header::CONTENT_TYPE)) {
            return Err(ApiError::bad_request(
                "unsupported_content_type",
                "the body must be JSON: send Content-Type: application/json",
            ));
        }
        let bytes = Bytes::from_request(req, state).await.map_err(|r| {
            if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
                body_too_large()
            } else {
                ApiError::bad_request("malformed_json", r.body_text())
            }
        })?;
        parse_json(&bytes).map(ApiJson)
    }
}

/// Parses a JSON document into `T`: 400 `malformed_json` when it is not
/// JSON, 422 `invalid_field` naming the field (its path, as
/// `serde_path_to_error` tracked it) when it is not of `T`'s shape.
pub(crate) fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut de).map_err(body_error)?;
    de.end()
        .map_err(|e| ApiError::bad_request("malformed_json", e.to_string()))?;
    Ok(value)
}

/// A deserialization error as the API answers it.
fn body_error(e: serde_path_to_error::Error<serde_json::Error>) -> ApiError {
    if e.inner().classify() != serde_json::error::Category::Data {
        // A syntax error or a body cut short.
        return ApiError::bad_request("malformed_json", e.to_string());
    }
    let at_root = e
        .path()
        .iter()
        .all(|s| matches!(s, serde_path_to_error::Segment::Unknown));
    let path = (!at_root).then(|| e.path().to_string());
    let message = e.into_inner().to_string();
    // serde_json's message is the only place that names a missing or
    // unknown field (serde's `missing_field` carries no more than text).
    let named = backticked_field(&message);
    let field = match (path, named) {
        // `missing field` names a field inside the path's object; for an
        // `unknown field` the path already ends with it.
        (Some(p), Some(n)) if message.starts_with("missing field `") => format!("{p}.{n}"),
        (None, Some(n)) if message.contains("field `") => n,
        (Some(p), _) => p,
        (None, _) => "body".to_string(),
    };
    let message = message
        .split(" at line ")
        .next()
        .unwrap_or(&message)
        .to_string();
    ApiError::invalid_field(field, message)
}

fn body_too_large() -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload_too_large",
        "the request body is larger than the server accepts",
    )
}

/// Whether a content type is JSON (`application/json`, `application/*+json`).
pub(crate) fn is_json(ct: Option<&HeaderValue>) -> bool {
    let Some(mime) = media_type(ct) else {
        return false;
    };
    mime == "application/json" || (mime.starts_with("application/") && mime.ends_with("+json"))
}

/// The media type of a Content-Type header, lower case, without parameters.
pub(crate) fn media_type(ct: Option<&HeaderValue>) -> Option<String> {
    let ct = ct?.to_str().ok()?;
    Some(
        ct.split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase(),
    )
}

pub(crate) fn form_rejection(r: FormRejection) -> ApiError {
    if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
        return body_too_large();
    }
    ApiError::bad_request("malformed_form", r.body_text())
}

/// The first `` `name` `` in a message.
fn backticked_field(message: &str) -> Option<String> {
    let start = message.find('`')? + 1;
    let len = message[start..].find('`')?;
    Some(message[start..start + len].to_string())
}

/// A path parameter parsed with `FromStr`; 400 `invalid_id` otherwise.
pub struct ApiPath<T>(pub T);

impl<S, T> FromRequestParts<S> for ApiPath<T>
where
    S: Send + Sync,
    T: FromStr + Send,
    T::Err: std::fmt::Display,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let Path(raw) = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|e| ApiError::bad_request("invalid_id", e.body_text()))?;
        raw.parse::<T>().map(ApiPath).map_err(|e| {
            ApiError::bad_request("invalid_id", format!("{raw:?}: {e}")).with("value", raw)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ingest_events::{Bid, Jid};

    fn body_of(e: ApiError) -> Value {
        let Some(Value::Object(mut o)) = Some(json!({})) else {
            unreachable!()
        };
        o.insert("code".into(), e.code.into());
        o.insert("message".into(), e.message.into());
        o.extend(e.details);
        Value::Object(o)
    }

    #[test]
    fn rejections_map_to_statuses_and_codes() {
        let cases = [
            (
                Rejection::NotFound {
                    item: Item::Job(Jid(7)),
                },
                404,
                "not_found",
            ),
            (
                Rejection::IllegalTransition {
                    item: Item::Batch(Bid(1)),
                    current: "Pending".into(),
                    requested: "Deleted".into(),
                    allowed: vec!["Held".into(), "Processing".into()],
                },
                409,
                "illegal_transition",
            ),
            (
                Rejection::QueuePaused {
                    item: Item::Job(Jid(1)),
                },
                409,
                "queue_paused",
            ),
            (Rejection::NoChange("x".into()), 409, "no_change"),
            (
                Rejection::UnrecoverableFailure {
                    item: Item::Job(Jid(3)),
                    kind: ingest_events::event::FailureKind::DigestMismatch,
                },
                409,
                "unrecoverable_failure",
            ),
            (
                Rejection::CollectionStillHeld {
                    profile: "p".into(),
                },
                409,
                "collection_held",
            ),
            (
                Rejection::Invalid {
                    field: "priority".into(),
                    reason: "too big".into(),
                },
                422,
                "invalid_field",
            ),
        ];
        for (r, status, code) in cases {
            let e = ApiError::from(r);
            assert_eq!(e.status.as_u16(), status);
            assert_eq!(e.code, code);
        }
        let e = body_of(ApiError::from(Rejection::IllegalTransition {
            item: Item::Batch(Bid(1)),
            current: "Pending".into(),
            requested: "Deleted".into(),
            allowed: vec!["Held".into()],
        }));
        assert_eq!(e["current"], "Pending");
        assert_eq!(e["allowed"], json!(["Held"]));
        assert_eq!(e["id"], "bid0000000001");
    }

    #[test]
    fn log_failures_say_what_happened_to_the_command() {
        let too_large = ApiError::from(ServiceError::Engine(EngineError::Log(
            LogError::RecordTooLarge {
                kind: "BatchSubmitted",
                bytes: 10,
                limit: 5,
            },
        )));
        assert_eq!(too_large.status, StatusCode::PAYLOAD_TOO_LARGE);
        let io = ApiError::from(ServiceError::Engine(EngineError::Log(LogError::Storage(
            sled::Error::Io(std::io::Error::other("disk gone")),
        ))));
        assert_eq!(io.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(io.code, "outcome_unknown");
        assert!(io.message.contains("outcome is unknown"), "{}", io.message);
        let stopped = ApiError::from(ServiceError::Stopped);
        assert_eq!(stopped.status, StatusCode::SERVICE_UNAVAILABLE);
        // A write that did not become durable is its own error, not a
        // made-up storage error.
        let unknown = ApiError::from(ServiceError::OutcomeUnknown(std::sync::Arc::new(
            EngineError::Log(LogError::Storage(sled::Error::Io(std::io::Error::other(
                "flush failed",
            )))),
        )));
        assert_eq!(unknown.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(unknown.code, "outcome_unknown");
        assert!(
            unknown.message.contains("until the engine restarts"),
            "{}",
            unknown.message
        );
        let no_writer = ApiError::from(ServiceError::NoWriter(std::sync::Arc::new(
            std::io::Error::other("no threads"),
        )));
        assert_eq!(no_writer.status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(
            no_writer.message.contains("writer thread"),
            "{}",
            no_writer.message
        );
    }

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Body {
        reason: String,
        actor: Option<String>,
        priority: Option<u8>,
        identifiers: Option<Identifiers>,
        store: Option<Store>,
    }

    #[derive(Debug, serde::Deserialize)]
    #[allow(dead_code)]
    struct Identifiers {
        local_ids: Vec<String>,
    }

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Store {
        mode: String,
        manifest_url: Option<String>,
    }

    #[test]
    fn data_errors_name_the_field() {
        let cases = [
            (r#"{}"#, "reason", "missing field `reason`"),
            (r#"{"reasn": "x"}"#, "reasn", "unknown field `reasn`"),
            (
                r#"{"reason": "x", "store": {"mod": 1}}"#,
                "store.mod",
                "unknown field `mod`",
            ),
            (
                r#"{"reason": "x", "priority": 300}"#,
                "priority",
                "invalid value: integer `300`",
            ),
            (
                r#"{"reason": "x", "identifiers": {"local_ids": [5]}}"#,
                "identifiers.local_ids[0]",
                "invalid type: integer `5`",
            ),
            (
                r#"{"reason": "x", "store": {}}"#,
                "store.mode",
                "missing field `mode`",
            ),
            (r#""x""#, "body", "invalid type: string"),
        ];
        for (json, field, message) in cases {
            let e = parse_json::<Body>(json.as_bytes()).expect_err(json);
            assert_eq!(e.status, StatusCode::UNPROCESSABLE_ENTITY, "{json}");
            let e = body_of(e);
            assert_eq!(e["field"], field, "{json}: {e}");
            let said = e["message"].as_str().unwrap_or("");
            assert!(said.contains(message), "{json}: {said}");
            assert!(!said.contains(" at line "), "{json}: {said}");
        }
    }

    #[test]
    fn syntax_errors_are_malformed_json() {
        for json in [
            r#"{"reason": "#,
            r#"{"reason" "x"}"#,
            r#"{"reason": "x"} trailing"#,
        ] {
            let e = parse_json::<Body>(json.as_bytes()).expect_err(json);
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{json}");
            assert_eq!(e.code, "malformed_json", "{json}");
        }
        let ok: Body = parse_json(br#"{"reason": "x"}"#).expect("parsed");
        assert_eq!(ok.reason, "x");
    }
}
