//! Storing: the object version (`producer/` and `system/` of the job's
//! working directory) goes into every configured OCFL storage target, in
//! parallel, each target a task with its own retries; the object's fixity is
//! verified after writing.
//!
//! The version's files are staged in `<job>/object-<target>/` (hard links,
//! or copies where linking fails) so that nothing else in the working
//! directory, such as a downloaded container, ends up in the object.
//!
//! For the first target the staged links are *moved* into the object
//! ([`OcflTarget::move_version`]), so no byte is copied when the working
//! storage and that target share a file system (the stored file is then
//! the downloaded file itself until the job's directory is removed); the
//! other targets get copies, so that no two targets share a file. rocfl
//! reads each file once for its inventory's SHA-512, which is compared with
//! the SHA-512 the download step computed from the bytes as they arrived
//! (`system/files.json`). When every one matches, a moved version's
//! structure is validated without reading its content again (the rename
//! wrote nothing); a copied version, or one adopted from an earlier run,
//! gets the full fixity check, which reads it back.
//!
//! A new object moved into an OCFL 1.1 root skips rocfl: its inventory
//! takes the download's SHA-512, and only the files whose stamp
//! ([`FileStamp`], recorded in `files.json` as the download hashed them)
//! moved before [`stage`] linked them are read again, for their SHA-256.
//! The other targets' copies skip rocfl too: each file is hashed as it is
//! copied and must have the download's SHA-512 before the commit.
//!
//! A requeued job never stores its version twice. After a target has stored
//! and verified the version, a marker `<job>/stored-<target>.json` records
//! the ark, the version number and the SHA-256 of the storage manifest; a
//! target whose marker matches the current manifest is skipped. A version
//! committed by a run that ended before writing its marker is recognised by
//! its `system/mrt-manifest.txt` and adopted: in the first target by the
//! manifest's comment naming the job and its file lines without their URLs
//! ([`settle_manifest`]), which copies that manifest back into the job's
//! `system/`; in the others by those bytes.
//!
//! The manifest stored is not Processing's (whose URLs are the job's
//! working files, removed by Notify): [`settle_manifest`] rewrites it, under
//! the object's storage lock, with Merritt's storage content URLs of the
//! version being stored (`BASE/content/NODE/ARK/VERSION/FILE`, served by
//! `ingest serve`'s `GET /content/…`), names the job in a comment and signs
//! it again; after the store, [`check_stored_manifest`] checks every URL
//! against the version's files.
//!
//! `submission_mode` `update` and `add` both store a version whose state is
//! exactly this job's files: an `add` is not merged with the previous
//! version's files.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context};
use chrono::Utc;
use ingest_protocol::api::StoreBody;
use ingest_steps::digest::{digest_file, Algorithm};
use ingest_steps::ocfl::{Checks, OcflTarget, StorageError, VersionMeta};
use ingest_steps::signing::SigningKeyFile;
use ingest_steps::stamp::FileStamp;

use super::fetch::RetryPolicy;
use super::marker::{
    marker_path, parse_spec, read_marker, stored_manifest_url, target_names, StoredMarker,
};
use super::process::{self, job_data, primary_id, MANIFEST_FILE};
use super::{locks, RealConfig};
use crate::step::{JobCtx, JobData, Outcome, Step, StepError, StepFuture, StepResult};

/// The step.
pub struct Store {
    targets: Vec<Arc<OcflTarget>>,
    config: Arc<RealConfig>,
    manifest: Arc<ManifestSettings>,
}

/// How the storing step names the stored files in the manifest it stores.
pub struct ManifestSettings {
    /// The Merritt storage node of the first storage target (see
    /// [`primary_node_id`]): the `NODE` of the manifest's URLs and of the
    /// store hand-off's mode.
    pub node_id: u32,
    /// The base URL of the manifest's URLs (see [`content_base`]).
    pub content_url: String,
    /// The key that signs the manifest, if one is configured.
    pub key: Option<Arc<SigningKeyFile>>,
}

impl Store {
    /// The step over `targets`, writing the stored manifest per `manifest`.
    pub fn new(
        targets: Vec<Arc<OcflTarget>>,
        config: Arc<RealConfig>,
        manifest: ManifestSettings,
    ) -> Store {
        Store {
            targets,
            config,
            manifest: Arc::new(manifest),
        }
    }

    /// Takes the job's local-id locks (again, when Processing's session
    /// has gone) and the object's storage lock, then stores; the storage
    /// lock is released at the end, the local-id locks on failure.
    async fn locked(&self, job: &JobCtx) -> StepResult {
        let policy = self.config.retry();
        let data = match job_data(job, policy).await {
            Ok(d) => d,
            Err(e) => return StepResult::Report(Outcome::from(e)),
        };
        let Some(ark) = primary_id(&data.identifiers) else {
            return StepResult::Report(Outcome::failure("no ark: Processing did not assign one"));
        };
        let lid_locks = locks::localid_locks(
            &data.configuration.profile_name,
            &process::local_ids(&data.identifiers),
        );
        if let Err(wait) = locks::acquire(job, &lid_locks, locks::Holder::AcrossSteps, policy).await
        {
            return wait;
        }
        let storage = [ingest_projections::layout::storage_lock(&ark)];
        if let Err(wait) = locks::acquire(job, &storage, locks::Holder::WithinStep, policy).await {
            return wait;
        }
        let outcome = self.store(job, data, ark.clone()).await;
        locks::release_all(job, &storage).await;
        if !outcome.success && ingest_steps::ocfl::stores_stopped() {
            // The worker is stopping and the store stopped before its
            // commit (issue 25): nothing is reported, the job stays in
            // Storing for the next worker, and the local-id locks go with
            // the session.
            tracing::info!(jid = %job.jid, %ark, "the store was stopped before its commit: the worker is stopping; the job stays in Storing");
            return StepResult::Wait("the worker storing it is stopping".into());
        }
        if !outcome.success {
            locks::release_all(job, &lid_locks).await;
        }
        StepResult::Report(outcome)
    }

    async fn store(&self, job: &JobCtx, data: JobData, ark: String) -> Outcome {
        let policy = self.config.retry();
        let mode = match data.configuration.submission_mode.as_str() {
            "update" => "update",
            _ => "add",
        };
        let job_dir = self.config.job_dir(&data.bid, job.jid);
        if let Err(e) = std::fs::metadata(job_dir.join("system").join(MANIFEST_FILE)) {
            return Outcome::failure(format!(
                "no storage manifest system/{MANIFEST_FILE} in the job's working files ({e}): Processing did not write it"
            ));
        }
        // The manifest stored names the files as stored (the version this
        // store makes, or the one an earlier run of the job made).
        let version = {
            let Some(first) = self.targets.first().cloned() else {
                return Outcome::failure("no storage target is configured");
            };
            let (ark, dir, jid, bid) = (
                ark.clone(),
                job_dir.clone(),
                job.jid.to_string(),
                data.bid.clone(),
            );
            let settings = Arc::clone(&self.manifest);
            let settled = tokio::task::spawn_blocking(move || {
                settle_manifest(&first, &ark, &dir, &jid, &bid, &settings)
            })
            .await;
            match settled {
                Ok(Ok(version)) => version,
                Ok(Err(e)) => return Outcome::from(e),
                Err(e) => {
                    return Outcome::failure(format!("writing the stored manifest failed: {e}"))
                }
            }
        };
        if let Err(refused) = self.check_record_size(job, &data, &ark, &job_dir).await {
            return Outcome::from(refused);
        }
        let meta = VersionMeta {
            user_name: Some(data.configuration.submitter.as_str())
                .filter(|s| !s.trim().is_empty())
                .unwrap_or("ingest")
                .to_string(),
            user_address: Some(version_user_address(
                &self.config,
                data.configuration.profile_name.trim(),
            )),
            message: format!("{mode}: batch {} job {}", data.bid, job.jid),
            created: Utc::now(),
        };
        match store_object(&self.targets, &ark, &job_dir, &meta, policy, Some(job)).await {
            Ok(stored) => {
                tracing::info!(jid = %job.jid, state = %job.state, %ark, ?stored, "stored");
                if let Err(e) = self.check_stored(&ark, version, &stored).await {
                    return Outcome::from(e);
                }
                let manifest_url =
                    match stored_manifest_url(&self.targets, &ark, Some(version)).await {
                        Ok(url) => url,
                        Err(e) => return Outcome::from(e),
                    };
                Outcome::success(stored_message(&ark, &stored)).with_store(StoreBody {
                    manifest_url,
                    mode: ingest_projections::layout::store_mode(mode, self.manifest.node_id, &ark),
                    delete: false,
                })
            }
            Err(e) => Outcome::from(e),
        }
    }
}

impl Store {
    /// Checks, after the store, that the first target holds the version as
    /// `version`, the number its manifest's URLs name, and that every URL
    /// of its stored manifest names a file of that version with the size
    /// the manifest gives.
    async fn check_stored(
        &self,
        ark: &str,
        version: u32,
        stored: &[(String, u32)],
    ) -> Result<(), StepError> {
        if let Some((name, v)) = stored.first().filter(|(_, v)| *v != version) {
            return Err(StepError::permanent(format!(
                "target {name} holds {ark} as v{v}, but the manifest stored with it names v{version}: another writer committed a version of {ark} meanwhile; requeue the job to store it again"
            )));
        }
        let first = Arc::clone(
            self.targets
                .first()
                .ok_or_else(|| "no storage target is configured".to_string())?,
        );
        let (ark, settings) = (ark.to_string(), Arc::clone(&self.manifest));
        tokio::task::spawn_blocking(move || {
            check_stored_manifest(&first, &ark, version, settings.node_id)
        })
        .await
        .map_err(|e| format!("checking the stored manifest failed: {e}"))?
    }

    /// Refuses, before anything is stored, an object whose inventory record
    /// the server would refuse at Recording (larger than its
    /// `--max-record-bytes`): stored but never recorded, it would be a
    /// version the inventory does not know.
    async fn check_record_size(
        &self,
        job: &JobCtx,
        data: &JobData,
        ark: &str,
        job_dir: &Path,
    ) -> Result<(), StepError> {
        let Some(limit) = self.config.args.max_record_bytes else {
            return Ok(());
        };
        let input = super::record::RecordInput {
            ark: ark.to_string(),
            collection: data.configuration.profile_name.clone(),
            local_ids: process::local_ids(&data.identifiers),
            targets: target_names(&self.config.args.storage_targets),
            jid: job.jid.to_string(),
            bid: data.bid.clone(),
            erc: process::erc_fields(&data.metadata),
        };
        let dir = job_dir.to_path_buf();
        let bytes =
            tokio::task::spawn_blocking(move || super::record::record_body_bytes(&dir, &input))
                .await
                .map_err(|e| format!("measuring the inventory record failed: {e}"))??;
        if bytes > limit {
            return Err(StepError::permanent(format!(
                "the inventory record of {ark} would be {bytes} bytes, more than the {limit} bytes the server accepts (--max-record-bytes): nothing was stored; raise --max-record-bytes on the server and its workers, or submit the object in smaller parts"
            )));
        }
        Ok(())
    }
}

impl Step for Store {
    fn run<'a>(&'a self, job: &'a JobCtx) -> StepFuture<'a> {
        Box::pin(self.locked(job))
    }
}

/// Opens every `NAME=DIR` storage target (creating an OCFL root in an
/// absent or empty directory). Names are letters, digits, `.`, `_` and `-`.
///
/// # Errors
/// A spec without `=`, an empty or unusable name, a name or directory given
/// twice, or a directory that is not an OCFL repository; the message names
/// the spec.
pub fn open_targets(specs: &[String]) -> anyhow::Result<Vec<Arc<OcflTarget>>> {
    let mut names = BTreeSet::new();
    let mut dirs = BTreeSet::new();
    let mut targets = Vec::with_capacity(specs.len());
    for spec in specs {
        let (name, dir) = parse_spec(spec)?;
        if !names.insert(name.to_string()) {
            bail!("storage target {name:?} is configured twice");
        }
        let target = OcflTarget::open_or_init(name, Path::new(dir))
            .with_context(|| format!("storage target {name} ({dir})"))?;
        let root = std::fs::canonicalize(dir).unwrap_or_else(|_| PathBuf::from(dir));
        if !dirs.insert(root.clone()) {
            bail!(
                "storage target {name}: the directory {} is already another target's",
                root.display()
            );
        }
        targets.push(Arc::new(target));
    }
    Ok(targets)
}

/// The Merritt storage node id of the first storage target (the one the
/// store hand-off names, `add/NODE/ark`), from `NAME=NUMBER` specs; a target
/// without one has its position, from 1.
///
/// # Errors
/// A spec without `=`, a number that is not a positive integer below 2^31
/// (mrt-store reads it as a Java `int`), a name that is no storage target,
/// or a name given twice; the message names the spec.
pub fn primary_node_id(targets: &[String], node_ids: &[String]) -> anyhow::Result<u32> {
    Ok(target_node_ids(targets, node_ids)?
        .first()
        .map_or(1, |(_, id)| *id))
}

/// The Merritt storage node id of every storage target, in order, from
/// `NAME=NUMBER` specs; a target without one has its position, from 1.
/// The content route (`GET /content/NODE/…`) finds a target by it.
///
/// # Errors
/// As [`primary_node_id`], and two targets with one node id.
pub fn target_node_ids(
    targets: &[String],
    node_ids: &[String],
) -> anyhow::Result<Vec<(String, u32)>> {
    let names = target_names(targets);
    let mut given: std::collections::BTreeMap<&str, u32> = std::collections::BTreeMap::new();
    for spec in node_ids {
        let shown = ingest_protocol::cut(spec, 80);
        let Some((name, id)) = spec.split_once('=') else {
            bail!("storage node id {shown:?} is not NAME=NUMBER");
        };
        let name = name.trim();
        let id: u32 = match id.trim().parse() {
            Ok(n) if (1..=i32::MAX as u32).contains(&n) => n,
            _ => bail!(
                "storage node id {shown:?}: the number must be a whole number from 1 to {}",
                i32::MAX
            ),
        };
        if !names.iter().any(|n| n == name) {
            bail!(
                "storage node id {shown:?} names no storage target (targets: {})",
                names.join(", ")
            );
        }
        if given.insert(name, id).is_some() {
            bail!("storage node id of {name:?} is given twice");
        }
    }
    let mut out: Vec<(String, u32)> = Vec::with_capacity(names.len());
    for (position, name) in names.iter().enumerate() {
        let id = given
            .get(name.as_str())
            .copied()
            .unwrap_or(u32::try_from(position + 1).unwrap_or(u32::MAX));
        if let Some((other, _)) = out.iter().find(|(_, i)| *i == id) {
            bail!("storage targets {other:?} and {name:?} have the same node id {id}; give each its own with --storage-node-id NAME=NUMBER");
        }
        out.push((name.clone(), id));
    }
    Ok(out)
}

/// The base URL of stored manifests' URLs, from `--content-url`: an
/// `http` or `https` URL without query or fragment, returned without a
/// trailing `/`.
///
/// # Errors
/// No URL, or one that does not parse or has another scheme, a query or a
/// fragment; the message names the option.
pub fn content_base(url: Option<&str>) -> anyhow::Result<String> {
    let Some(given) = url.map(str::trim).filter(|u| !u.is_empty()) else {
        bail!("no --content-url: the base URL of the stored manifest's URLs is not set");
    };
    let shown = ingest_protocol::cut(given, 200);
    let parsed = reqwest::Url::parse(given)
        .with_context(|| format!("--content-url {shown:?} is not a URL"))?;
    if !matches!(parsed.scheme(), "http" | "https")
        || parsed.query().is_some()
        || parsed.fragment().is_some()
        || parsed.host_str().is_none()
    {
        bail!("--content-url {shown:?} must be an http or https URL without a query or fragment");
    }
    Ok(given.trim_end_matches('/').to_string())
}

/// Writes the manifest this job's version is stored with into the job's
/// `system/` (and signs it), and returns the version number it names, in
/// the first storage target `first` (whose node the URLs name):
///
/// - a version of the object whose stored manifest is this job's (its
///   comment names the job and it lists the same files, digests and
///   sizes, whatever its URLs): stored by an earlier run of the job, it is
///   adopted, its manifest (and signature) copied back into `system/` so
///   the storing step recognises it;
/// - otherwise the next version, the manifest's URLs naming it.
///
/// Runs under the object's storage lock, so no other job of `ingest`
/// commits a version of the ark in between.
///
/// # Errors
/// An object that cannot be read, or a manifest that cannot be written.
pub fn settle_manifest(
    first: &OcflTarget,
    ark: &str,
    job_dir: &Path,
    jid: &str,
    bid: &str,
    settings: &ManifestSettings,
) -> Result<u32, StepError> {
    let versions = match first.versions(ark) {
        Ok(v) => v,
        Err(StorageError::NotFound { .. }) => Vec::new(),
        Err(e) => {
            return Err(StepError::permanent(format!(
                "reading {ark} in target {}: {e}",
                first.name()
            )))
        }
    };
    let next = versions.last().map_or(1, |v| v + 1);
    let comment = job_comment(jid, bid);
    let urls = process::ManifestUrls::Stored {
        base: &settings.content_url,
        node: settings.node_id,
        ark,
        version: next,
    };
    process::write_manifest(job_dir, &urls, Some(&comment), settings.key.as_deref())?;
    let system = job_dir.join("system");
    let written = std::fs::read(system.join(MANIFEST_FILE))
        .map_err(|e| format!("cannot read the manifest just written: {e}"))?;
    let wanted = manifest_identity(&written);
    let logical = format!("system/{MANIFEST_FILE}");
    for v in versions.into_iter().rev() {
        let stored = match first.read_file(ark, Some(v), &logical) {
            Ok(bytes) => bytes,
            Err(StorageError::NotFound { .. }) => continue,
            Err(e) => {
                return Err(StepError::permanent(format!(
                    "reading {ark} v{v} in target {}: {e}",
                    first.name()
                )))
            }
        };
        if wanted.is_none() || manifest_identity(&stored) != wanted {
            continue;
        }
        tracing::info!(%ark, version = v, jid, "the version stored by an earlier run of the job is kept");
        process::write_file(job_dir, &system.join(MANIFEST_FILE), &stored)?;
        for name in [process::SIGNATURE_FILE, process::PUBLIC_KEY_FILE] {
            match first.read_file(ark, Some(v), &format!("system/{name}")) {
                Ok(bytes) => process::write_file(job_dir, &system.join(name), &bytes)?,
                Err(StorageError::NotFound { .. }) => match std::fs::remove_file(system.join(name))
                {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => {
                        return Err(StepError::permanent(format!(
                            "cannot remove system/{name}: {e}"
                        )))
                    }
                },
                Err(e) => {
                    return Err(StepError::permanent(format!(
                        "reading {ark} v{v} in target {}: {e}",
                        first.name()
                    )))
                }
            }
        }
        return Ok(v);
    }
    Ok(next)
}

/// The comment line of the manifest a job stores: it names the job, so a
/// version committed by an earlier run of the job is recognised (no other
/// job's version has the same one).
pub fn job_comment(jid: &str, bid: &str) -> String {
    format!("ingest job {jid} of batch {bid}")
}

/// What identifies the version a manifest describes, whatever its URLs:
/// its comment (the job) and every file line without its URL. `None` for a
/// manifest without a comment (written before manifests named their job).
fn manifest_identity(manifest: &[u8]) -> Option<(String, Vec<String>)> {
    let text = std::str::from_utf8(manifest).ok()?;
    let comment = ingest_steps::storage_manifest::comment_of(text)?.to_string();
    let lines = file_lines(text).map(|(_, rest)| rest.to_string()).collect();
    Some((comment, lines))
}

/// The file lines of a manifest this step wrote, each as (URL, the rest).
fn file_lines(text: &str) -> impl Iterator<Item = (&str, &str)> {
    text.lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .map(|l| l.split_once(" | ").unwrap_or((l, "")))
}

/// Checks that every URL of the manifest stored in `version` of `ark` in
/// `target` is the content URL of a file of that version on `node`
/// (`…/content/NODE/ARK/VERSION/FILE`) with the manifest's size.
///
/// # Errors
/// The first URL that does not, named (bounded), or an unreadable version.
pub fn check_stored_manifest(
    target: &OcflTarget,
    ark: &str,
    version: u32,
    node: u32,
) -> Result<(), StepError> {
    let read =
        |e: StorageError| format!("reading {ark} v{version} in target {}: {e}", target.name());
    let manifest = target
        .read_file(ark, Some(version), &format!("system/{MANIFEST_FILE}"))
        .map_err(read)?;
    let info = target.version_info(ark, version).map_err(read)?;
    let sizes: BTreeMap<&str, u64> = info
        .files
        .iter()
        .map(|f| (f.logical_path.as_str(), f.size))
        .collect();
    let text = String::from_utf8_lossy(&manifest);
    let mut count = 0usize;
    for (url, rest) in file_lines(&text) {
        count += 1;
        let fields: Vec<&str> = rest.split(" | ").collect();
        let (size, name) = match fields.as_slice() {
            [_, _, size, _, name, ..] => (size.parse::<u64>().ok(), *name),
            _ => (None, ""),
        };
        let shown = ingest_protocol::cut(url, 300);
        // The base is not compared: a changed --content-url leaves the
        // URLs of versions stored before it as they were.
        let path = ingest_steps::storage_manifest::content_url("", node, ark, version, name);
        if name.is_empty() || !url.ends_with(&path) || !url.starts_with("http") {
            return Err(StepError::permanent(format!(
                "the manifest stored in {ark} v{version} names {shown}, not the stored file's URL: nothing will find the file there"
            )));
        }
        match (sizes.get(name), size) {
            (Some(stored), Some(listed)) if *stored == listed => {}
            (Some(stored), _) => {
                return Err(StepError::permanent(format!(
                    "the manifest stored in {ark} v{version} gives {shown} another size than the stored file's {stored} bytes"
                )))
            }
            (None, _) => {
                return Err(StepError::permanent(format!(
                    "the manifest stored in {ark} v{version} names {shown}, which that version does not hold"
                )))
            }
        }
    }
    if count == 0 {
        return Err(StepError::permanent(format!(
            "the manifest stored in {ark} v{version} lists no file"
        )));
    }
    Ok(())
}

/// Stores `producer/` and `system/` of `job_dir` as a version of `ark` in
/// every target in parallel, verifies each, and returns each target's name
/// and version, in the order of `targets`. Recoverable storage errors are
/// retried per `policy`, each retry recorded on `job` (when given).
///
/// # Errors
/// No target, no storage manifest, a staging failure, or a target that
/// fails (retries exhausted, a permanent error, a fixity problem); every
/// failing target is named.
pub async fn store_object(
    targets: &[Arc<OcflTarget>],
    ark: &str,
    job_dir: &Path,
    meta: &VersionMeta,
    policy: RetryPolicy,
    job: Option<&JobCtx>,
) -> Result<Vec<(String, u32)>, StepError> {
    if targets.is_empty() {
        return Err("no storage target is configured".into());
    }
    process::check_ark(ark)?;
    let dir = job_dir.to_path_buf();
    let prepared = crate::bulk::spawn(move || prepare(&dir))
        .await
        .map_err(|e| format!("staging the object failed: {e}"))??;
    let prepared = Arc::new(prepared);
    let mut tasks = tokio::task::JoinSet::new();
    for (index, target) in targets.iter().enumerate() {
        let work = TargetWork {
            target: Arc::clone(target),
            ark: ark.to_string(),
            job_dir: job_dir.to_path_buf(),
            prepared: Arc::clone(&prepared),
            meta: meta.clone(),
            moving: index == 0,
        };
        let job = job.cloned();
        tasks.spawn(async move { (index, work.run(policy, job.as_ref()).await) });
    }
    let mut results: Vec<Option<Result<u32, StepError>>> = vec![None; targets.len()];
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok((index, result)) => {
                if let Some(slot) = results.get_mut(index) {
                    *slot = Some(result);
                }
            }
            Err(e) => return Err(StepError::permanent(format!("a storage task failed: {e}"))),
        }
    }
    let mut stored = Vec::with_capacity(targets.len());
    let mut failures = Vec::new();
    for (target, result) in targets.iter().zip(results) {
        match result {
            Some(Ok(version)) => stored.push((target.name().to_string(), version)),
            Some(Err(e)) => failures.push(e.to_string()),
            None => failures.push(format!("target {}: no result", target.name())),
        }
    }
    if failures.is_empty() {
        Ok(stored)
    } else {
        Err(StepError::permanent(failures.join("; ")))
    }
}

/// `stored ARK vN in a, b`, or each target's version when they differ.
fn stored_message(ark: &str, stored: &[(String, u32)]) -> String {
    let versions: BTreeSet<u32> = stored.iter().map(|(_, v)| *v).collect();
    if versions.len() == 1 {
        let names: Vec<&str> = stored.iter().map(|(n, _)| n.as_str()).collect();
        let v = versions.first().copied().unwrap_or_default();
        format!("stored {ark} v{v} in {}", names.join(", "))
    } else {
        let each: Vec<String> = stored.iter().map(|(n, v)| format!("v{v} in {n}")).collect();
        format!("stored {ark} {}", each.join(", "))
    }
}

/// The manifest, and the SHA-512 every stored file must have.
struct Prepared {
    manifest: Vec<u8>,
    manifest_sha256: String,
    /// SHA-512 by logical path (`producer/…`, `system/…`): the download
    /// step's for producer files (computed here when it has none), computed
    /// here for the small generated files.
    sha512: BTreeMap<String, String>,
    /// SHA-256 by logical path, from the same sources: what a new object's
    /// files are checked against on disk before they move into it
    /// ([`OcflTarget::store_checked_with`]).
    sha256: BTreeMap<String, String>,
    /// The stamps the download step recorded as it hashed the producer
    /// files, by logical path: a file that still has its stamp when it is
    /// staged is not read again.
    stamps: BTreeMap<String, FileStamp>,
}

/// Reads the manifest and the digests the stored files must have.
fn prepare(job_dir: &Path) -> Result<Prepared, StepError> {
    let manifest_path = job_dir.join("system").join(MANIFEST_FILE);
    let manifest = std::fs::read(&manifest_path).map_err(|e| {
        format!(
            "no storage manifest {} ({e}): Processing did not write it",
            manifest_path.display()
        )
    })?;
    let (_, manifest_sha256) = process::sha256_of(&manifest_path)?;
    let mut stamps = BTreeMap::new();
    let downloaded: BTreeMap<String, (String, String)> = process::producer_files(job_dir)?
        .into_iter()
        .filter_map(|f| {
            let logical = format!("producer/{}", f.name);
            let digests = (
                f.digests.get("sha512")?.clone(),
                f.digests.get("sha256")?.clone(),
            );
            if let Some(stamp) = f.stamp {
                stamps.insert(logical.clone(), stamp);
            }
            Some((logical, digests))
        })
        .collect();
    let (mut sha512, mut sha256) = (BTreeMap::new(), BTreeMap::new());
    for part in ["producer", "system"] {
        for (name, path) in process::walk(&job_dir.join(part))? {
            let logical = format!("{part}/{name}");
            let (d512, d256) = match downloaded.get(&logical) {
                Some(d) => d.clone(),
                None => both_digests(&path)?,
            };
            sha512.insert(logical.clone(), d512);
            sha256.insert(logical, d256);
        }
    }
    Ok(Prepared {
        manifest,
        manifest_sha256,
        sha512,
        sha256,
        stamps,
    })
}

/// Stages `producer/` and `system/` of `job_dir` as hard links (copies
/// where linking fails) in `source`, cleared first. Returns the logical
/// paths whose file still had its stamp in `stamps` when it was linked: the
/// staged file is then the very file hashed at download, unchanged since
/// (a copy, or a file whose stamp moved, is read again by the store).
fn stage(
    job_dir: &Path,
    source: &Path,
    stamps: &BTreeMap<String, FileStamp>,
) -> Result<BTreeSet<String>, StepError> {
    remove_staged(source)?;
    let mut unchanged = BTreeSet::new();
    for part in ["producer", "system"] {
        for (name, path) in process::walk(&job_dir.join(part))? {
            let logical = format!("{part}/{name}");
            let to = source.join(part).join(&name);
            if let Some(parent) = to.parent() {
                std::fs::create_dir_all(parent)
                    .map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
            }
            // Read before the link, which moves the status-change time.
            let kept = stamps.get(&logical).is_some_and(|s| s.matches(&path));
            if std::fs::hard_link(&path, &to).is_ok() {
                if kept {
                    unchanged.insert(logical);
                }
            } else {
                std::fs::copy(&path, &to).map_err(|e| {
                    format!("cannot stage {} as {}: {e}", path.display(), to.display())
                })?;
            }
        }
    }
    Ok(unchanged)
}

/// Removes a staging directory, if present.
fn remove_staged(source: &Path) -> Result<(), StepError> {
    match std::fs::remove_dir_all(source) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(StepError::permanent(format!(
            "cannot clear {}: {e}",
            source.display()
        ))),
    }
}

/// The SHA-512 and SHA-256 of a file, lower-case hex, in one read.
fn both_digests(path: &Path) -> Result<(String, String), StepError> {
    let (_, digests) = digest_file(path, &[Algorithm::Sha512, Algorithm::Sha256])
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let get = |wanted: Algorithm| {
        digests
            .iter()
            .find(|(a, _)| *a == wanted)
            .map(|(_, hex)| hex.clone())
            .ok_or_else(|| format!("no {} of {}", wanted.name(), path.display()))
    };
    Ok((get(Algorithm::Sha512)?, get(Algorithm::Sha256)?))
}

/// Where a target's share of the object is staged, under the job's
/// directory.
fn staging_dir(job_dir: &Path, target: &str) -> PathBuf {
    job_dir.join(format!("object-{target}"))
}

/// One target's share of a store.
struct TargetWork {
    target: Arc<OcflTarget>,
    ark: String,
    job_dir: PathBuf,
    prepared: Arc<Prepared>,
    meta: VersionMeta,
    /// Whether the staged files are moved (else copied) into the target.
    moving: bool,
}

impl From<StorageError> for StepError {
    fn from(e: StorageError) -> StepError {
        if e.is_recoverable() {
            StepError::Recoverable(e.to_string())
        } else {
            StepError::permanent(e.to_string())
        }
    }
}

impl TargetWork {
    async fn run(self, policy: RetryPolicy, job: Option<&JobCtx>) -> Result<u32, StepError> {
        let name = self.target.name().to_string();
        let work = Arc::new(self);
        let what = format!("target {name}");
        let attempt = || {
            let w = Arc::clone(&work);
            async move {
                crate::bulk::spawn(move || w.store_blocking())
                    .await
                    .unwrap_or_else(|e| {
                        Err(StepError::permanent(format!("the store task failed: {e}")))
                    })
            }
        };
        crate::retry::retry(&policy, job, &what, attempt)
            .await
            .map_err(|gave_up| match gave_up.error {
                StepError::Recoverable(m) => StepError::Recoverable(format!(
                    "target {name}: {m} (after {} attempts)",
                    gave_up.attempts
                )),
                other => other.context(format_args!("target {name}")),
            })
    }

    fn store_blocking(&self) -> Result<u32, StepError> {
        let name = self.target.name();
        let marker = read_marker(&self.job_dir, name)?;
        if let Some(m) = marker {
            if m.ark == self.ark && m.manifest_sha256 == self.prepared.manifest_sha256 {
                tracing::info!(target_name = name, ark = %self.ark, version = m.version, "already stored");
                return Ok(m.version);
            }
        }
        let (version, report) = match self.earlier_version()? {
            Some(v) => {
                tracing::info!(target_name = name, ark = %self.ark, version = v, "adopting a version stored by an earlier run");
                (v, self.target.verify(&self.ark)?)
            }
            None => {
                let source = staging_dir(&self.job_dir, name);
                // Staging is retried whatever stopped it, as before.
                let unchanged = stage(&self.job_dir, &source, &self.prepared.stamps)
                    .map_err(|e| StepError::Recoverable(e.to_string()))?;
                // Nothing is committed unless every file on disk is the
                // one hashed at download: for a new object moved into the
                // first target, by its stamp or its SHA-256 re-read (the
                // inventory takes the download's SHA-512); otherwise by the
                // SHA-512 rocfl reads.
                let stored = self.target.store_checked_with(
                    &self.ark,
                    &source,
                    &self.meta,
                    self.moving,
                    &Checks {
                        sha512: &self.prepared.sha512,
                        sha256: &self.prepared.sha256,
                        unchanged: &unchanged,
                    },
                );
                // What a failed move left is rebuilt by the next attempt.
                if let Err(e) = remove_staged(&source) {
                    tracing::warn!(error = %ingest_protocol::bounded(&e), "cannot remove the staged object");
                }
                let stored = stored?;
                let report = if self.moving {
                    // Every content digest was just read from disk and
                    // matched, and the rename wrote nothing.
                    self.target.verify_structure(&self.ark)?
                } else {
                    self.target.verify(&self.ark)?
                };
                (stored.version, report)
            }
        };
        if !report.ok {
            return Err(StepError::permanent(format!(
                "the fixity check of {} v{version} failed: {}",
                self.ark,
                report.problems.join("; ")
            )));
        }
        let marker = StoredMarker {
            target: name.to_string(),
            ark: self.ark.clone(),
            version,
            manifest_sha256: self.prepared.manifest_sha256.clone(),
        };
        let bytes = serde_json::to_vec_pretty(&marker)
            .map_err(|e| StepError::permanent(format!("cannot encode the marker: {e}")))?;
        process::write_file(&self.job_dir, &marker_path(&self.job_dir, name), &bytes)?;
        Ok(version)
    }

    /// The version of the object, newest first, whose storage manifest is
    /// this job's: stored by a run that ended before writing its marker.
    fn earlier_version(&self) -> Result<Option<u32>, StepError> {
        let versions = match self.target.versions(&self.ark) {
            Ok(v) => v,
            Err(StorageError::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let logical = format!("system/{MANIFEST_FILE}");
        for v in versions.into_iter().rev() {
            match self.target.read_file(&self.ark, Some(v), &logical) {
                Ok(bytes) if bytes == self.prepared.manifest => return Ok(Some(v)),
                Ok(_) | Err(StorageError::NotFound { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(None)
    }
}

/// The OCFL `user.address` of a version stored for `profile`: `mailto:` the
/// profile's first report recipient, else `--ocfl-user-address`, else
/// `mailto:` the `--mail-from` sender (OCFL validators warn, W008, about a
/// user without an address).
pub fn version_user_address(config: &RealConfig, profile: &str) -> String {
    let recipient = config.profiles.get(profile).and_then(|p| {
        p.notification
            .emails
            .iter()
            .map(|e| e.trim())
            .find(|e| !e.is_empty())
    });
    if let Some(email) = recipient {
        return format!("mailto:{email}");
    }
    match config.args.ocfl_user_address.as_deref().map(str::trim) {
        Some(address) if !address.is_empty() => address.to_string(),
        _ => format!("mailto:{}", config.args.mail_from.trim()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn policy() -> RetryPolicy {
        RetryPolicy {
            retries: 2,
            first_backoff: Duration::from_millis(1),
            max_backoff: Duration::from_millis(5),
        }
    }

    fn meta() -> VersionMeta {
        VersionMeta {
            user_name: "tester".into(),
            user_address: None,
            message: "test".into(),
            created: Utc::now(),
        }
    }

    fn job_dir(root: &Path) -> PathBuf {
        let dir = root.join("bid1").join("jid1");
        std::fs::create_dir_all(dir.join("producer/sub")).expect("mkdir");
        std::fs::write(dir.join("producer/a.txt"), b"abc").expect("write");
        std::fs::write(dir.join("producer/sub/b.txt"), b"bee").expect("write");
        // A leftover of the download that must not be stored.
        std::fs::write(dir.join("container.zip"), b"zip").expect("write");
        process::write_object_files(
            &dir,
            "ark:/99999/fk4store",
            &["L1".into()],
            &ingest_steps::erc::ErcFields::default(),
            None,
        )
        .expect("object files");
        dir
    }

    fn targets(root: &Path) -> Vec<Arc<OcflTarget>> {
        open_targets(&[
            format!("one={}", root.join("ocfl1").display()),
            format!("two={}", root.join("ocfl2").display()),
        ])
        .expect("targets")
    }

    /// A job's directory whose object is stored in both targets.
    async fn stored_once() -> (tempfile::TempDir, PathBuf, Vec<Arc<OcflTarget>>) {
        let root = tempfile::tempdir().expect("tempdir");
        let dir = job_dir(root.path());
        let targets = targets(root.path());
        store_object(
            &targets,
            "ark:/99999/fk4store",
            &dir,
            &meta(),
            policy(),
            None,
        )
        .await
        .expect("stored");
        (root, dir, targets)
    }

    /// The content file of `logical` (the only version) in an OCFL root.
    fn content_file(ocfl: &Path, logical: &str) -> PathBuf {
        process::walk(ocfl)
            .expect("walk")
            .into_iter()
            .find(|(name, _)| name.ends_with(&format!("/content/{logical}")))
            .map(|(_, path)| path)
            .expect("content file")
    }

    #[tokio::test]
    async fn every_target_gets_the_object_once() {
        let root = tempfile::tempdir().expect("tempdir");
        let dir = job_dir(root.path());
        let targets = targets(root.path());
        let ark = "ark:/99999/fk4store";
        let stored = store_object(&targets, ark, &dir, &meta(), policy(), None)
            .await
            .expect("stored");
        assert_eq!(stored, vec![("one".to_string(), 1), ("two".to_string(), 1)]);
        assert_eq!(
            stored_message(ark, &stored),
            "stored ark:/99999/fk4store v1 in one, two"
        );
        for t in &targets {
            assert!(t.verify(ark).expect("verify").ok);
            assert_eq!(
                t.read_file(ark, None, "producer/sub/b.txt").expect("read"),
                b"bee"
            );
            assert!(t.read_file(ark, None, "system/mrt-erc.txt").is_ok());
            assert!(t.read_file(ark, None, "container.zip").is_err());
            assert!(t.read_file(ark, None, "stored-one.json").is_err());
        }
        let marker = read_marker(&dir, "two").expect("read").expect("marker");
        assert_eq!(marker.version, 1);
        for t in ["one", "two"] {
            assert!(!staging_dir(&dir, t).exists(), "the staging is removed");
        }

        // A second run with the same content is skipped by the marker.
        let again = store_object(&targets, ark, &dir, &meta(), policy(), None)
            .await
            .expect("again");
        assert_eq!(again, stored);
        for t in &targets {
            assert_eq!(t.versions(ark).expect("versions"), vec![1]);
        }

        // A run that committed but lost its marker adopts its version.
        std::fs::remove_file(marker_path(&dir, "one")).expect("rm");
        let adopted = store_object(&targets, ark, &dir, &meta(), policy(), None)
            .await
            .expect("adopted");
        assert_eq!(adopted, stored);
        assert_eq!(targets[0].versions(ark).expect("versions"), vec![1]);

        // New content (a changed manifest) is a new version.
        std::fs::write(dir.join("producer/c.txt"), b"sea").expect("write");
        process::write_object_files(&dir, ark, &[], &Default::default(), None).expect("rewrite");
        let v2 = store_object(&targets, ark, &dir, &meta(), policy(), None)
            .await
            .expect("v2");
        assert_eq!(v2, vec![("one".to_string(), 2), ("two".to_string(), 2)]);
        assert!(targets[1].verify(ark).expect("verify").ok);
    }

    #[tokio::test]
    async fn failures_name_the_problem() {
        let root = tempfile::tempdir().expect("tempdir");
        let dir = job_dir(root.path());
        let err = store_object(&[], "ark:/1/a", &dir, &meta(), policy(), None)
            .await
            .expect_err("no target")
            .to_string();
        assert_eq!(err, "no storage target is configured");
        let targets = targets(root.path());
        let err = store_object(&targets, "not an ark", &dir, &meta(), policy(), None)
            .await
            .expect_err("bad ark")
            .to_string();
        assert!(err.contains("not a usable ark"), "{err}");
        let empty = root.path().join("empty");
        std::fs::create_dir_all(&empty).expect("mkdir");
        let err = store_object(&targets, "ark:/1/a", &empty, &meta(), policy(), None)
            .await
            .expect_err("no manifest")
            .to_string();
        assert!(err.contains("Processing did not write it"), "{err}");
    }

    #[tokio::test]
    async fn a_fixity_problem_names_the_target() {
        let (root, dir, targets) = stored_once().await;
        let ark = "ark:/99999/fk4store";
        let content = content_file(&root.path().join("ocfl1"), "producer/a.txt");
        std::fs::write(&content, b"abd").expect("corrupt");
        std::fs::remove_file(marker_path(&dir, "one")).expect("rm");
        let err = store_object(&targets, ark, &dir, &meta(), policy(), None)
            .await
            .expect_err("fixity")
            .to_string();
        assert!(
            err.starts_with("target one: the fixity check of ark:/99999/fk4store v1 failed"),
            "{err}"
        );
        assert!(!err.contains("target two"), "{err}");
    }

    #[tokio::test]
    async fn the_first_target_gets_the_downloaded_file_itself_the_others_a_copy() {
        use std::os::unix::fs::MetadataExt;
        let (root, dir, _targets) = stored_once().await;
        let inode = |p: &Path| std::fs::metadata(p).expect("metadata").ino();
        let downloaded = inode(&dir.join("producer/sub/b.txt"));
        let stored =
            |ocfl: &str| inode(&content_file(&root.path().join(ocfl), "producer/sub/b.txt"));
        assert_eq!(stored("ocfl1"), downloaded, "moved, not copied");
        assert_ne!(
            stored("ocfl2"),
            downloaded,
            "the second target has its own copy"
        );
        assert_eq!(
            std::fs::read(dir.join("producer/sub/b.txt")).expect("read"),
            b"bee",
            "the working files stay for the later steps"
        );
    }

    /// Writes `system/files.json` as the download step would have: each
    /// producer file's digests, with `sha256` replaced where `sha256` names
    /// the file, and its stamp when `stamped`.
    fn record_download(dir: &Path, stamped: bool, sha256: &[(&str, &str)]) {
        let mut listed = Vec::new();
        for name in ["a.txt", "sub/b.txt"] {
            let path = dir.join("producer").join(name);
            let (size, actual) = process::sha256_of(&path).expect("sha256");
            let (sha512, _) = both_digests(&path).expect("sha512");
            let given = sha256.iter().find(|(n, _)| *n == name).map(|(_, d)| *d);
            let mut entry = serde_json::json!({
                "name": name, "url": "http://x/", "size": size,
                "digests": {"sha256": given.unwrap_or(&actual), "sha512": sha512},
            });
            if stamped {
                entry["stamp"] =
                    serde_json::to_value(FileStamp::of_path(&path).expect("stamp")).expect("json");
            }
            listed.push(entry);
        }
        std::fs::write(
            dir.join("system/files.json"),
            serde_json::to_vec(&listed).expect("json"),
        )
        .expect("files.json");
    }

    #[tokio::test]
    async fn a_file_that_changed_after_its_download_fails_the_store_naming_it() {
        let root = tempfile::tempdir().expect("tempdir");
        let dir = job_dir(root.path());
        // What the download step recorded of the bytes it received.
        record_download(&dir, false, &[]);
        // The bytes on disk change afterwards (same size).
        std::fs::write(dir.join("producer/a.txt"), b"abd").expect("corrupt");
        let targets = targets(root.path());
        let ark = "ark:/99999/fk4store";
        let err = store_object(&targets, ark, &dir, &meta(), policy(), None)
            .await
            .expect_err("the digests differ")
            .to_string();
        for target in ["one", "two"] {
            assert!(
                err.contains(&format!(
                    "target {target}: the fixity check of {ark} failed before commit"
                )),
                "{err}"
            );
        }
        assert!(err.contains("producer/a.txt has SHA-512"), "{err}");
        assert!(!err.contains("sub/b.txt"), "{err}");
        assert!(read_marker(&dir, "one").expect("marker").is_none());
        for t in &targets {
            assert!(t.versions(ark).is_err(), "nothing was committed");
        }
    }

    /// A store into one target only (which moves the files).
    async fn store_into_one(root: &Path, dir: &Path) -> Result<Vec<(String, u32)>, String> {
        let target =
            open_targets(&[format!("one={}", root.join("ocfl1").display())]).expect("target");
        store_object(&target, "ark:/99999/fk4store", dir, &meta(), policy(), None)
            .await
            .map_err(|e| e.to_string())
    }

    #[tokio::test]
    async fn a_file_rewritten_under_its_old_modification_time_is_still_read_again() {
        let root = tempfile::tempdir().expect("tempdir");
        let dir = job_dir(root.path());
        record_download(&dir, true, &[]);
        // Other bytes of the same size, and the old modification time put
        // back: only the status-change time tells.
        let path = dir.join("producer/a.txt");
        let before = FileStamp::of_path(&path).expect("stamp");
        let mtime = std::fs::metadata(&path)
            .and_then(|m| m.modified())
            .expect("mtime");
        std::thread::sleep(Duration::from_millis(20));
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .expect("open");
        std::io::Write::write_all(&mut &file, b"abd").expect("rewrite");
        file.set_modified(mtime).expect("set mtime");
        drop(file);
        let after = FileStamp::of_path(&path).expect("stamp");
        assert_eq!((after.ino, after.size), (before.ino, before.size));
        assert_eq!(after.mtime_ns, before.mtime_ns, "the old mtime is back");

        let err = store_into_one(root.path(), &dir)
            .await
            .expect_err("the bytes on disk are not those hashed")
            .to_string();
        assert!(err.contains("producer/a.txt has SHA-256"), "{err}");
        assert!(!err.contains("sub/b.txt"), "{err}");
    }

    #[tokio::test]
    async fn a_file_that_kept_its_stamp_is_not_read_again() {
        // files.json gives b.txt a SHA-256 that is not its content's: a
        // store that read it again would fail, so a success shows it was
        // taken on its stamp.
        let mut hasher = ingest_steps::digest::MultiHasher::new(&[Algorithm::Sha256]);
        hasher.update(b"not bee");
        let wrong = hasher.finish().remove(0).1;
        let root = tempfile::tempdir().expect("tempdir");
        let dir = job_dir(root.path());
        record_download(&dir, true, &[("sub/b.txt", &wrong)]);
        let stored = store_into_one(root.path(), &dir)
            .await
            .expect("b.txt is not read again");
        assert_eq!(stored, vec![("one".to_string(), 1)]);

        // Without a stamp (a list an older worker wrote), or once the
        // stamp moved (a change of mode moves the status-change time), the
        // file is read again and the wrong value fails the store.
        let root = tempfile::tempdir().expect("tempdir");
        let dir = job_dir(root.path());
        record_download(&dir, false, &[("sub/b.txt", &wrong)]);
        let err = store_into_one(root.path(), &dir)
            .await
            .expect_err("read")
            .to_string();
        assert!(err.contains("producer/sub/b.txt has SHA-256"), "{err}");

        let root = tempfile::tempdir().expect("tempdir");
        let dir = job_dir(root.path());
        record_download(&dir, true, &[("sub/b.txt", &wrong)]);
        std::thread::sleep(Duration::from_millis(20));
        let path = dir.join("producer/sub/b.txt");
        let mode = std::fs::metadata(&path).expect("meta").permissions();
        std::fs::set_permissions(&path, mode).expect("chmod");
        let err = store_into_one(root.path(), &dir)
            .await
            .expect_err("read")
            .to_string();
        assert!(err.contains("producer/sub/b.txt has SHA-256"), "{err}");
    }

    fn settings(base: &str) -> ManifestSettings {
        ManifestSettings {
            node_id: 9501,
            content_url: base.to_string(),
            key: None,
        }
    }

    /// The manifest in the job's `system/`.
    fn working_manifest(dir: &Path) -> String {
        std::fs::read_to_string(dir.join("system").join(MANIFEST_FILE)).expect("manifest")
    }

    #[tokio::test]
    async fn the_stored_manifest_names_the_stored_files_and_its_job() {
        let root = tempfile::tempdir().expect("tempdir");
        let dir = job_dir(root.path());
        let targets = targets(root.path());
        let ark = "ark:/99999/fk4store";
        let base = "https://ingest.example.org/";
        let version = settle_manifest(&targets[0], ark, &dir, "jid1", "bid1", &settings(base))
            .expect("settled");
        assert_eq!(version, 1);
        let text = working_manifest(&dir);
        assert!(
            text.contains("\n# ingest job jid1 of batch bid1\n"),
            "{text}"
        );
        assert!(!text.contains("file://"), "{text}");
        assert!(
            text.contains(
                "\nhttps://ingest.example.org/content/9501/ark%3A%2F99999%2Ffk4store/1/producer%2Fsub%2Fb.txt | sha256 | "
            ),
            "{text}"
        );
        let stored = store_object(&targets, ark, &dir, &meta(), policy(), None)
            .await
            .expect("stored");
        assert_eq!(stored[0].1, 1);
        check_stored_manifest(&targets[0], ark, 1, 9501).expect("every URL names a stored file");
        let err = check_stored_manifest(&targets[0], ark, 1, 7)
            .expect_err("another node")
            .to_string();
        assert!(err.contains("not the stored file's URL"), "{err}");
    }

    #[tokio::test]
    async fn a_version_stored_by_an_earlier_run_of_the_job_is_recognised_by_its_comment() {
        let root = tempfile::tempdir().expect("tempdir");
        let dir = job_dir(root.path());
        let targets = targets(root.path());
        let ark = "ark:/99999/fk4store";
        let first = settings("http://one.example");
        assert_eq!(
            settle_manifest(&targets[0], ark, &dir, "jid1", "bid1", &first).expect("v1"),
            1
        );
        store_object(&targets, ark, &dir, &meta(), policy(), None)
            .await
            .expect("stored");
        let stored = working_manifest(&dir);

        // The run ended before writing its markers, and the content URL
        // changed before the next run: the version is still this job's.
        for t in ["one", "two"] {
            std::fs::remove_file(marker_path(&dir, t)).expect("rm marker");
        }
        let moved = settings("http://two.example");
        assert_eq!(
            settle_manifest(&targets[0], ark, &dir, "jid1", "bid1", &moved).expect("again"),
            1,
            "adopted, not a second version"
        );
        assert_eq!(working_manifest(&dir), stored, "the stored bytes are kept");
        let again = store_object(&targets, ark, &dir, &meta(), policy(), None)
            .await
            .expect("adopted");
        assert_eq!(again, vec![("one".to_string(), 1), ("two".to_string(), 1)]);
        for t in &targets {
            assert_eq!(t.versions(ark).expect("versions"), vec![1]);
        }

        // Another job with the same files makes a version of its own.
        assert_eq!(
            settle_manifest(&targets[0], ark, &dir, "jid2", "bid1", &moved).expect("other job"),
            2
        );
        assert!(working_manifest(&dir).contains("http://two.example/content/9501/"));
        let v2 = store_object(&targets, ark, &dir, &meta(), policy(), None)
            .await
            .expect("v2");
        assert_eq!(v2[0].1, 2);
        check_stored_manifest(&targets[0], ark, 2, 9501).expect("v2's URLs");
        check_stored_manifest(&targets[0], ark, 1, 9501).expect("v1's URLs");
    }

    #[tokio::test]
    async fn a_manifest_naming_working_files_fails_the_check() {
        // What Storing stored before: Processing's manifest, whose URLs are
        // the job's working files (removed by Notify).
        let (_root, _dir, targets) = stored_once().await;
        let err = check_stored_manifest(&targets[0], "ark:/99999/fk4store", 1, 1)
            .expect_err("file:// URLs")
            .to_string();
        assert!(err.contains("file:///"), "{err}");
        assert!(err.contains("not the stored file's URL"), "{err}");
    }

    #[test]
    fn the_content_url_is_checked() {
        assert_eq!(
            content_base(Some(" https://ingest.example.org/base/ ")).expect("ok"),
            "https://ingest.example.org/base"
        );
        for bad in [
            None,
            Some(""),
            Some("ftp://x/"),
            Some("not a url"),
            Some("http://x/?q=1"),
            Some("http://x/#f"),
        ] {
            assert!(content_base(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn every_target_has_a_node_id_of_its_own() {
        let targets = ["a=/a".to_string(), "b=/b".to_string(), "c=/c".to_string()];
        let ids = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let got = target_node_ids(&targets, &ids(&["c=9501"])).expect("ids");
        assert_eq!(
            got,
            vec![("a".into(), 1), ("b".into(), 2), ("c".into(), 9501)]
        );
        let err = target_node_ids(&targets, &ids(&["a=2"]))
            .expect_err("twice")
            .to_string();
        assert!(err.to_string().contains("the same node id 2"), "{err}");
    }

    #[test]
    fn the_store_hand_off_names_the_first_targets_node() {
        let targets = ["primary=/a".to_string(), "mirror=/b".to_string()];
        let ids = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(primary_node_id(&targets, &[]).expect("default"), 1);
        assert_eq!(
            primary_node_id(&targets, &ids(&["mirror=7", "primary=9501"])).expect("given"),
            9501
        );
        assert_eq!(
            primary_node_id(&targets, &ids(&["mirror=7"])).expect("one"),
            1
        );
        for (bad, says) in [
            ("primary", "is not NAME=NUMBER"),
            ("primary=x", "whole number"),
            ("primary=0", "whole number"),
            ("primary=2147483648", "whole number"),
            ("other=3", "names no storage target"),
        ] {
            let e = format!(
                "{:#}",
                primary_node_id(&targets, &ids(&[bad])).expect_err(bad)
            );
            assert!(e.contains(says), "{bad}: {e}");
        }
        let e = primary_node_id(&targets, &ids(&["primary=1", "primary=2"]))
            .expect_err("twice")
            .to_string();
        assert!(e.to_string().contains("twice"), "{e}");
    }

    #[test]
    fn target_specs_are_checked() {
        let root = tempfile::tempdir().expect("tempdir");
        let d = |n: &str| root.path().join(n).display().to_string();
        let err = |specs: Vec<String>| match open_targets(&specs) {
            Ok(_) => panic!("accepted {specs:?}"),
            Err(e) => format!("{e:#}"),
        };
        assert!(err(vec![d("x")]).contains("is not NAME=DIR"));
        assert!(err(vec![format!("={}", d("x"))]).contains("empty name"));
        assert!(err(vec![format!("a/b={}", d("x"))]).contains("may only hold"));
        assert!(err(vec![format!("a={}", d("x")), format!("a={}", d("y"))])
            .contains("configured twice"));
        assert!(err(vec![format!("a={}", d("x")), format!("b={}", d("x"))])
            .contains("already another target's"));
        let file = root.path().join("file");
        std::fs::write(&file, b"x").expect("write");
        assert!(err(vec![format!("f={}", file.display())]).contains("storage target f"));
        assert!(open_targets(&[]).expect("none").is_empty());
        assert_eq!(
            target_names(&["a=/x".into(), "bad".into(), " b = /y".into()]),
            vec!["a", "b"]
        );
    }
}
