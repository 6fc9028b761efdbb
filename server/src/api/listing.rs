//! `GET /batches` and `GET /jobs`: pages of batches and jobs by filters,
//! served from the engine's published state (never by reading ZooKeeper).
//!
//! The depositor and admin tokens may list (they may read every batch and
//! job one by one too); worker and metrics tokens may not. A depositor with
//! a token of its own lists only its collections' items ([`Scope`]). The query is
//! parsed by [`ingest_protocol::listing`]; a refused parameter is 400
//! `invalid_query` naming it.

use std::time::Instant;

use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::Json;
use ingest_protocol::listing::{BatchPage, BatchQuery, JobPage, JobQuery, QueryError};

use super::budget::Admitted;
use super::scope::Scope;
use super::{ApiError, AppState};

/// The longest query string read, in bytes.
const MAX_QUERY_BYTES: usize = 8 * 1024;

/// A refused query parameter as 400 `invalid_query` naming it.
pub(crate) fn query_error(e: QueryError) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, "invalid_query", e.to_string()).with("param", e.param)
}

/// The URL query pairs of a request, bounded in size.
pub(crate) fn query_pairs(uri: &Uri) -> Result<Vec<(String, String)>, ApiError> {
    let raw = uri.query().unwrap_or("");
    if raw.len() > MAX_QUERY_BYTES {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_query",
            format!("the query string is longer than {MAX_QUERY_BYTES} bytes"),
        ));
    }
    Query::<Vec<(String, String)>>::try_from_uri(uri)
        .map(|Query(p)| p)
        .map_err(|_| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_query",
                "the query string is not URL-encoded name=value pairs",
            )
        })
}

/// Lets a page of the request's token in, or refuses it with 429
/// `listing_budget` and `Retry-After` while the token is over its budget
/// (see [`super::budget`]).
fn admit(app: &AppState, headers: &HeaderMap) -> Result<Admitted, ApiError> {
    let token = super::auth::bearer_of(headers).unwrap_or_default();
    app.inner
        .listing_budget
        .admit(token, Instant::now())
        .map_err(|wait| {
            let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
            ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "listing_budget",
                format!(
                    "this token's listings walked more of the state than --listing-items-per-second allows; retry in {secs} s (a page with the last page's next_cursor walks only its own length)"
                ),
            )
            .with("retry_after_secs", secs)
        })
}

/// `GET /batches`.
pub(crate) async fn batches(
    State(app): State<AppState>,
    scope: Scope,
    headers: HeaderMap,
    uri: Uri,
) -> Result<Json<BatchPage>, ApiError> {
    let mut q = BatchQuery::from_pairs(query_pairs(&uri)?).map_err(query_error)?;
    q.filters.within = scope.within();
    let admitted = admit(&app, &headers)?;
    let (page, walked) = {
        let state = app.inner.handle.state();
        ingest_engine::listing::batches_walked(&state, &q).map_err(query_error)?
    };
    app.inner
        .listing_budget
        .charge(admitted, walked, Instant::now());
    Ok(Json(page))
}

/// `GET /jobs`.
pub(crate) async fn jobs(
    State(app): State<AppState>,
    scope: Scope,
    headers: HeaderMap,
    uri: Uri,
) -> Result<Json<JobPage>, ApiError> {
    let mut q = JobQuery::from_pairs(query_pairs(&uri)?).map_err(query_error)?;
    q.filters.within = scope.within();
    let admitted = admit(&app, &headers)?;
    let (mut page, walked) = {
        let state = app.inner.handle.state();
        ingest_engine::listing::jobs_walked(&state, &q).map_err(query_error)?
    };
    app.inner
        .listing_budget
        .charge(admitted, walked, Instant::now());
    for j in &mut page.jobs {
        if let Ok(jid) = j.jid.parse() {
            j.waiting = app.inner.waits.of(jid, &j.status);
        }
    }
    Ok(Json(page))
}
