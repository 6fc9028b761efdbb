//! `GET /deliveries/{name}` (and `HEAD`): a finished assembly's container
//! in the delivery area (issue 24), at the URL the request's token node
//! names. The name is unguessable (128 random bits) and carries its expiry
//! ([`ingest_protocol::delivery`]): after it the route answers 410 Gone
//! whether or not the janitor has removed the file yet. `Range` requests
//! (one or several ranges), `HEAD`, `If-Modified-Since` and the like are
//! answered by tower-http's `ServeFile`. No token is needed: the URL is the
//! capability, as a presigned URL is in mrt-store.

use axum::extract::{Path, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use tower::ServiceExt;

use super::{ApiError, AppState};

fn gone() -> ApiError {
    ApiError::new(
        StatusCode::GONE,
        "gone",
        "this delivery expired; ask for the object again",
    )
    .with("item", "delivery")
}

fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such delivery").with("item", "delivery")
}

/// `GET|HEAD /deliveries/{name}`.
pub(crate) async fn delivery(
    State(app): State<AppState>,
    Path(name): Path<String>,
    request: Request,
) -> Result<Response, ApiError> {
    let Some(dir) = app.inner.delivery_dir.as_ref() else {
        return Err(not_found());
    };
    // Only a well-formed name is ever joined to the directory: no
    // separators, no dots but the extension's.
    let Some(expires) = ingest_protocol::delivery::expiry(&name) else {
        return Err(not_found());
    };
    if expires < chrono::Utc::now().timestamp() {
        return Err(gone());
    }
    let path = dir.join(&name);
    match std::fs::symlink_metadata(&path) {
        Ok(meta) if meta.is_file() => {}
        _ => return Err(not_found()),
    }
    let served = tower_http::services::ServeFile::new(&path)
        .oneshot(request)
        .await
        .map_err(|e| ApiError::internal(format!("reading the delivery: {e}")))?;
    let mut response = served.into_response();
    response.headers_mut().insert(
        axum::http::header::CONTENT_DISPOSITION,
        axum::http::HeaderValue::from_str(&format!("attachment; filename=\"{name}\""))
            .map_err(|_| not_found())?,
    );
    Ok(response)
}
