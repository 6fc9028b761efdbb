//! Audit evidence from the running server (issue 26, D4): a batch's audit
//! bundle (`GET /audit/bundle?batch=BID`) and the consistency proof between
//! two signed checkpoints (`GET /audit/proof?from=POS&to=POS`), the same
//! files `ingest audit export` and `ingest audit prove` write from a data
//! directory, so an auditor needs neither the server stopped nor its data
//! directory. Both are read from the log in a blocking task, then streamed
//! as JSON while they are serialized; nothing is appended (a server signs
//! its checkpoints by its own policy, `--checkpoint-key`).

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use ingest_engine::audit::{self, ExportError};
use ingest_events::Bid;
use serde::{Deserialize, Serialize};

use super::{ApiError, AppState};

/// The query of `GET /audit/bundle`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct BundleQuery {
    batch: String,
}

/// The query of `GET /audit/proof`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ProofQuery {
    from: u64,
    to: u64,
}

/// `GET /audit/bundle?batch=BID`: the batch's events and its jobs', with
/// inclusion proofs against the newest signed checkpoint.
pub(crate) async fn bundle(
    State(app): State<AppState>,
    q: Result<Query<BundleQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(q) = q.map_err(|e| ApiError::invalid_field("batch", e.body_text()))?;
    let bid: Bid = q
        .batch
        .parse()
        .map_err(|_| ApiError::invalid_field("batch", "not a batch id (bid0000000001)"))?;
    let jobs = {
        let state = app.inner.handle.state();
        let batch = state
            .batches
            .get(&bid)
            .ok_or_else(|| ApiError::not_found(ingest_events::command::Item::Batch(bid)))?;
        batch.jobs.clone()
    };
    let log = Arc::clone(app.inner.handle.log());
    let built = tokio::task::spawn_blocking(move || audit::export_batch_jobs(&log, bid, &jobs))
        .await
        .map_err(|e| ApiError::internal(format!("the export task failed: {e}")))?;
    Ok(stream_json(built.map_err(refused)?))
}

/// `GET /audit/proof?from=POS&to=POS`: the consistency proof between the
/// signed checkpoints at those log positions.
pub(crate) async fn proof(
    State(app): State<AppState>,
    q: Result<Query<ProofQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(q) = q.map_err(|e| ApiError::invalid_field("from", e.body_text()))?;
    let log = Arc::clone(app.inner.handle.log());
    let built = tokio::task::spawn_blocking(move || audit::prove(&log, q.from, q.to))
        .await
        .map_err(|e| ApiError::internal(format!("the proof task failed: {e}")))?;
    Ok(stream_json(built.map_err(refused)?))
}

/// A refusal is 409 `audit_refused` with its reason (no signed checkpoint
/// covers the batch yet, a position that is not a checkpoint); a log error
/// is 500.
fn refused(e: ExportError) -> ApiError {
    match e {
        ExportError::Refused(why) => ApiError::conflict("audit_refused", why),
        ExportError::Log(e) => super::error::read_error(e),
        other => ApiError::internal(other.to_string()),
    }
}

/// `value` as pretty JSON (the same text `ingest audit export` writes),
/// serialized in a blocking task into the response body as it is sent.
fn stream_json<T: Serialize + Send + 'static>(value: T) -> Response {
    let (reader, writer) = tokio::io::duplex(64 * 1024);
    tokio::task::spawn_blocking(move || {
        use std::io::Write;
        let mut out = tokio_util::io::SyncIoBridge::new(writer);
        // A write error is the client gone: the stream just ends.
        if serde_json::to_writer_pretty(&mut out, &value).is_ok() {
            let _ = out.write_all(b"\n");
            let _ = out.flush();
        }
    });
    let mut response = Body::from_stream(tokio_util::io::ReaderStream::new(reader)).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}
