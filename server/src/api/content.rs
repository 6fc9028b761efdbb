//! `GET /content/{node}/{ark}/{version}/{*file}`: one file of a stored
//! object version, in Merritt's storage form (mrt-store's `content` route,
//! `…/content/NODE/ARK/VERSION/FILE`, the ark and file percent-encoded as
//! one segment each). The URLs in the storage manifests that `ingest`
//! stores (`system/mrt-manifest.txt`) have this form, so they stay valid
//! after Notify removes the job's working files.
//!
//! The file is read from the OCFL storage target with that node id
//! (`--storage-node-id`), through the version's inventory (so a file that
//! OCFL deduplicated into an earlier version's content is found), and
//! streamed; nothing is written.

use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::Response;
use ingest_engine::consistency::TargetSpec;
use ingest_steps::ocfl::{OcflTarget, StorageError};

use super::{ApiError, AppState};

/// A storage target the content route serves, by its Merritt node id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContentNode {
    /// The node id (`--storage-node-id NAME=NUMBER`, else the target's
    /// position from 1): the `{node}` of the route.
    pub node_id: u32,
    /// The target.
    pub target: TargetSpec,
}

/// The longest path value quoted in an error.
const SHOWN: usize = 200;

fn not_found(message: String) -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not_found", message).with("item", "content")
}

fn invalid(field: &str, value: &str, why: &str) -> ApiError {
    ApiError::bad_request(
        "invalid_id",
        format!("the {field} {:?} {why}", ingest_protocol::cut(value, SHOWN)),
    )
    .with("field", field.to_string())
}

/// The handler.
pub(crate) async fn content(
    State(app): State<AppState>,
    scope: super::scope::Scope,
    path: Result<Path<(String, String, String, String)>, PathRejection>,
) -> Result<Response, ApiError> {
    let Path((node, ark, version, file)) =
        path.map_err(|e| ApiError::bad_request("invalid_id", e.body_text()))?;
    let node: u32 = node
        .parse()
        .map_err(|_| invalid("node", &node, "is not a storage node id"))?;
    let version: u32 = match version.parse() {
        Ok(v) if v >= 1 => v,
        _ => {
            return Err(invalid(
                "version",
                &version,
                "is not a version number from 1",
            ))
        }
    };
    if !ark.starts_with("ark:/") || ark.len() > 256 || ark.chars().any(char::is_control) {
        return Err(invalid("ark", &ark, "is not an ark"));
    }
    let name = match ingest_steps::paths::normalized_name(&file) {
        Ok(name) if name == file => name,
        _ => return Err(invalid("file", &file, "is not a file name of an object")),
    };
    let spec = app
        .inner
        .content_nodes
        .iter()
        .find(|n| n.node_id == node)
        .map(|n| n.target.clone())
        .ok_or_else(|| not_found(format!("this server serves no storage node {node}")))?;
    if !scope.sees_object(&app, &ark).await? {
        // Another depositor's object: answered as one the target lacks.
        return Err(not_found(format!(
            "storage target {} holds no {} v{version}",
            spec.name,
            ingest_protocol::cut(&ark, SHOWN)
        )));
    }
    let file = {
        let ark = ark.clone();
        let name = name.clone();
        tokio::task::spawn_blocking(move || open_content(&spec, &ark, version, &name))
            .await
            .map_err(|e| ApiError::internal(format!("the content task failed: {e}")))??
    };
    let file = tokio::fs::File::from_std(file);
    let size = file
        .metadata()
        .await
        .map_err(|e| ApiError::internal(format!("cannot read {name} of {ark} v{version}: {e}")))?
        .len();
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/octet-stream")
        .header(header::CONTENT_LENGTH, size)
        .body(Body::from_stream(tokio_util::io::ReaderStream::new(file)))
        .map_err(|e| ApiError::internal(format!("cannot answer: {e}")))
}

/// Opens the content of `name` in `version` of `ark`, following no
/// symbolic link below the storage root: a link planted in an object (by
/// whoever can write the storage) could otherwise serve any file the server
/// can read.
fn open_content(
    spec: &TargetSpec,
    ark: &str,
    version: u32,
    name: &str,
) -> Result<std::fs::File, ApiError> {
    let located = locate(spec, ark, version, name)?;
    let what = || {
        format!(
            "{} of {} v{version}",
            ingest_protocol::cut(name, SHOWN),
            ingest_protocol::cut(ark, SHOWN)
        )
    };
    let relative = located.strip_prefix(&spec.root).map_err(|_| {
        ApiError::internal(format!(
            "{} lies outside storage target {}",
            what(),
            spec.name
        ))
    })?;
    ingest_steps::beneath::open_file(&spec.root, relative).map_err(|e| {
        if ingest_steps::beneath::is_link_refused(&e) {
            tracing::warn!(
                target_name = %spec.name,
                path = %ingest_protocol::cut(&relative.display().to_string(), SHOWN),
                "a content request refused: a symbolic link in the storage root"
            );
            ApiError::new(
                StatusCode::FORBIDDEN,
                "refused",
                format!("{} is a symbolic link in storage, refused", what()),
            )
        } else {
            ApiError::internal(format!("cannot read {}: {e}", what()))
        }
    })
}

/// Where the content of `name` in `version` of `ark` lies in the target.
fn locate(
    spec: &TargetSpec,
    ark: &str,
    version: u32,
    name: &str,
) -> Result<std::path::PathBuf, ApiError> {
    let target = OcflTarget::open_existing(&spec.name, &spec.root).map_err(|e| {
        ApiError::internal(format!("storage target {} cannot be read: {e}", spec.name))
    })?;
    let content = target
        .version_content(ark, Some(version))
        .map_err(|e| match e {
            StorageError::NotFound { .. } => not_found(format!(
                "storage target {} holds no {} v{version}",
                spec.name,
                ingest_protocol::cut(ark, SHOWN)
            )),
            other => ApiError::internal(format!(
                "{} v{version} in storage target {} cannot be read: {other}",
                ingest_protocol::cut(ark, SHOWN),
                spec.name
            )),
        })?;
    content
        .files
        .into_iter()
        .find(|f| f.logical_path == name)
        .map(|f| f.path)
        .ok_or_else(|| {
            not_found(format!(
                "{} v{version} holds no file {:?}",
                ingest_protocol::cut(ark, SHOWN),
                ingest_protocol::cut(name, SHOWN)
            ))
        })
}
