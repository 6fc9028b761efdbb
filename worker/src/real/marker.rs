//! What a storage target holds of a job, as Storing writes it and Recording
//! reads it: the targets' names, the marker `<job>/stored-<target>.json`
//! a target gets once it stored and verified the version, and the URL of the
//! storage manifest as stored. Below both steps, so that neither imports the
//! other.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::bail;
use ingest_steps::ocfl::OcflTarget;
use serde::{Deserialize, Serialize};

use super::process::{file_url, MANIFEST_FILE};
use crate::step::StepError;

/// The names of the `NAME=DIR` specs, in order, skipping malformed ones
/// (which [`super::store::open_targets`] refuses at start-up).
pub fn target_names(specs: &[String]) -> Vec<String> {
    specs
        .iter()
        .filter_map(|s| parse_spec(s).ok())
        .map(|(name, _)| name.to_string())
        .collect()
}

/// What a target holds of this job: written after it stored and verified the
/// version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredMarker {
    /// The target's name.
    pub target: String,
    /// The object's ark.
    pub ark: String,
    /// The version the target holds this job's files as.
    pub version: u32,
    /// The SHA-256 of the storage manifest that was stored.
    pub manifest_sha256: String,
}

/// Where the marker of `target` lives.
pub fn marker_path(job_dir: &Path, target: &str) -> PathBuf {
    job_dir.join(format!("stored-{target}.json"))
}

/// The marker of `target`, if it has one.
///
/// # Errors
/// An unreadable or malformed marker.
pub fn read_marker(job_dir: &Path, target: &str) -> Result<Option<StoredMarker>, StepError> {
    let path = marker_path(job_dir, target);
    match std::fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| {
            StepError::permanent(format!("{} is not a storage marker: {e}", path.display()))
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(StepError::io(format_args!("read {}", path.display()), &e)),
    }
}

/// Splits a `NAME=DIR` storage target spec, checking the name.
///
/// # Errors
/// A spec without `=`, or an empty or unusable name; the message names the
/// spec.
pub fn parse_spec(spec: &str) -> anyhow::Result<(&str, &str)> {
    // An operator's argument, but quoted bounded like any input.
    let shown = ingest_protocol::cut(spec, 200);
    let Some((name, dir)) = spec.split_once('=') else {
        bail!("storage target {shown:?} is not NAME=DIR");
    };
    let (name, dir) = (name.trim(), dir.trim());
    if name.is_empty() {
        bail!("storage target {shown:?} has an empty name");
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        || name.starts_with('.')
    {
        bail!("storage target name {name:?} may only hold letters, digits, '.', '_' and '-' (and not start with '.')");
    }
    if dir.is_empty() {
        bail!("storage target {name} has an empty directory");
    }
    Ok((name, dir))
}

/// The `file://` URL of the storage manifest (`system/mrt-manifest.txt`)
/// as stored in `version` of `ark` (the head when `None`) in the first
/// storage target: the content file the OCFL inventory names for it, so
/// the URL stays valid after Notify removes the working directory (and
/// names the earlier version's file when OCFL deduplicated it).
///
/// # Errors
/// No storage target, an object or version that cannot be read, or a
/// version without the manifest.
pub async fn stored_manifest_url(
    targets: &[Arc<OcflTarget>],
    ark: &str,
    version: Option<u32>,
) -> Result<String, StepError> {
    let target = Arc::clone(
        targets
            .first()
            .ok_or_else(|| "no storage target is configured".to_string())?,
    );
    let ark = ark.to_string();
    tokio::task::spawn_blocking(move || {
        let content = target
            .version_content(&ark, version)
            .map_err(|e| format!("reading the stored version of {ark}: {e}"))?;
        let logical = format!("system/{MANIFEST_FILE}");
        let file = content
            .files
            .iter()
            .find(|f| f.logical_path == logical)
            .ok_or_else(|| format!("{ark} v{} holds no {logical}", content.version))?;
        file_url(&file.path)
    })
    .await
    .map_err(|e| format!("finding the stored manifest failed: {e}"))?
}
