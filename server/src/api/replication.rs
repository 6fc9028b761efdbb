//! The replication routes and the routing of commands in a replicated
//! group.
//!
//! - `GET /replication`: this engine's role, epoch, applied position, the
//!   leader's URL and (on the leader) every replica's lag.
//! - `GET /replication/frames?from=P[&to=Q]`: this engine's durable records
//!   from `P` (to `Q`) as one frame ([`ingest_events::frame`]): what a new or
//!   lagging engine copies to join, and what `ingest backup` saves. Served by
//!   any engine, leader or follower, while it runs.
//!
//! On an engine that does not lead, every request that changes something
//! (any method but GET and HEAD) is answered `307` to the same path on the
//! leader when one is known (`Location`), and `503` with `not_leader` or
//! `no_quorum` otherwise; nothing is appended. Every answer names the
//! position of the state it read (`Ingest-Position`), and a request that
//! carries `Ingest-Min-Position: P` waits (a few seconds at most) until this
//! engine applied `P`: a client reads its own writes from any engine.

use std::time::Duration;

use axum::body::Body;
use axum::extract::{Query, Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use ingest_replication::{ReplicaStatus, Role};
use serde::Deserialize;

use super::error::ApiError;
use super::AppState;

/// The header every answer carries: the position of the state it read.
pub const POSITION_HEADER: &str = "ingest-position";
/// The header a client sends to read at least its own writes.
pub const MIN_POSITION_HEADER: &str = "ingest-min-position";
/// How long a request waits for `Ingest-Min-Position`.
const MIN_POSITION_WAIT: Duration = Duration::from_secs(5);
/// The size of the frames streamed (a record larger than this is sent whole).
const FRAME_BYTES: usize = 1024 * 1024;

/// `GET /replication`.
pub(crate) async fn status(State(app): State<AppState>) -> Response {
    let mut status = match &app.inner.replication {
        Some(cell) => cell.get(),
        None => ReplicaStatus::single(),
    };
    let state = app.inner.handle.state();
    status.applied = state.position;
    status.head_hash = Some(hex::encode(state.head_hash));
    drop(state);
    axum::Json(status).into_response()
}

/// The query of `GET /replication/frames`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct FramesQuery {
    from: u64,
    to: Option<u64>,
}

/// `GET /replication/frames`.
pub(crate) async fn frames(
    State(app): State<AppState>,
    Query(q): Query<FramesQuery>,
) -> Result<Response, ApiError> {
    if q.from == 0 {
        return Err(ApiError::invalid_field("from", "positions start at 1"));
    }
    let log = std::sync::Arc::clone(app.inner.handle.log());
    // Only what is durable here: a copy never holds a record this engine
    // could still lose.
    let durable = log.durable_position();
    let to = q.to.unwrap_or(durable).min(durable);
    let head_hash = if to == 0 {
        hex::encode(ingest_events::codec::GENESIS_HASH)
    } else {
        log.read_one(to)
            .map(|r| hex::encode(r.envelope.hash))
            .map_err(|e| ApiError::internal(format!("cannot read position {to}: {e}")))?
    };
    let (reader, writer) = tokio::io::duplex(256 * 1024);
    let from = q.from;
    tokio::task::spawn_blocking(move || {
        use std::io::Write;
        let mut out = tokio_util::io::SyncIoBridge::new(writer);
        for frame in log.read_frames(from, to, FRAME_BYTES) {
            match frame {
                Ok((_, bytes)) => {
                    if out.write_all(&bytes).is_err() {
                        // The client went away.
                        return;
                    }
                }
                Err(e) => {
                    // Cut the stream short: the reader sees an incomplete
                    // answer, never a wrong one.
                    tracing::error!(error = %e, "reading the log for a copy failed");
                    return;
                }
            }
        }
        let _ = out.flush();
    });
    let mut response = Body::from_stream(tokio_util::io::ReaderStream::new(reader)).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/vnd.ingest.frames"),
    );
    if let Ok(v) = HeaderValue::from_str(&to.to_string()) {
        headers.insert("ingest-to", v);
    }
    if let Ok(v) = HeaderValue::from_str(&head_hash) {
        headers.insert("ingest-to-hash", v);
    }
    Ok(response)
}

/// Sends commands to the leader when this engine does not lead, waits for
/// `Ingest-Min-Position`, and names the position of every answer.
pub(crate) async fn route(State(app): State<AppState>, req: Request, next: Next) -> Response {
    let handle = &app.inner.handle;
    if let Some(min) = req
        .headers()
        .get(MIN_POSITION_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
    {
        let reached = handle.wait_for_position(min, MIN_POSITION_WAIT).await;
        if reached < min {
            return ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "behind",
                format!("this engine applied position {reached}, not yet {min}; retry, or ask the leader"),
            )
            .with("position", reached)
            .into_response();
        }
    }
    let changes = !matches!(*req.method(), Method::GET | Method::HEAD);
    let ui = req.uri().path().starts_with("/ui");
    if let (true, false, Some(cell)) = (changes, ui, &app.inner.replication) {
        let status = cell.get();
        if !status.takes_commands() {
            if !super::auth::presents_a_command_token(&app.inner.tokens, &req) {
                return ApiError::unauthorized(
                    "a command needs a depositor, worker or admin token: send Authorization: Bearer TOKEN",
                )
                .into_response();
            }
            return not_leader(&status, req.uri());
        }
    }
    let mut response = next.run(req).await;
    let position = handle.state().position;
    if let Ok(v) = HeaderValue::from_str(&position.to_string()) {
        response.headers_mut().insert(POSITION_HEADER, v);
    }
    response
}

fn not_leader(status: &ReplicaStatus, uri: &axum::http::Uri) -> Response {
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    match (&status.leader_url, status.role) {
        (Some(leader), Role::Follower) if leader != &status.url => {
            let location = format!("{}{path}", leader.trim_end_matches('/'));
            let mut response = ApiError::new(
                StatusCode::TEMPORARY_REDIRECT,
                "not_leader",
                "this engine follows; the command goes to the leader (Location); nothing was appended here",
            )
            .with("leader", leader.as_str())
            .into_response();
            if let Ok(v) = HeaderValue::from_str(&location) {
                response.headers_mut().insert(header::LOCATION, v);
            }
            response
        }
        (_, Role::Disconnected) => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "no_quorum",
            "this engine cannot reach a ZooKeeper quorum, so no engine can acknowledge a command; nothing was appended: retry later",
        )
        .into_response(),
        _ => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "not_leader",
            "no engine of the group leads right now (an election is under way); nothing was appended: retry shortly",
        )
        .into_response(),
    }
}
