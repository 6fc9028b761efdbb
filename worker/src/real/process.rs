//! Processing: the object's identifiers and the files that describe it.
//!
//! 1. The local ids are looked up in the inventory (`POST /jobs/JID/lookup`):
//!    an object with the same local id gets a new version, not a new ark; a
//!    supplied ark that contradicts the inventory fails the job.
//! 2. Without an ark, the server mints one (`POST /jobs/JID/ark`) and records
//!    it on the job at once, so a requeue never mints a second one.
//! 3. Into `<job>/system/`: `mrt-erc.txt`, `mrt-dc.xml`, the storage manifest
//!    `mrt-manifest.txt` (checkm, one line per producer file and per
//!    metadata file, sha256) and, when a key is configured, its signature
//!    `mrt-manifest.txt.sig` and the public key `mrt-signing-key.pub`. The
//!    manifest's URLs are the job's working files (`file://`): Storing
//!    rewrites it with the stored files' URLs ([`ManifestUrls::Stored`])
//!    before it stores it.
//!
//! The helpers shared with [`super::store`] and [`super::record`] live here:
//! the producer file list (`system/files.json`), `file://` URLs, and the
//! retried, fenced API call.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;

use ingest_protocol::api::{ArkBody, IdentifiersBody, LookupBody, WorkerRef};
use ingest_protocol::endpoint::{AssignArk, Fenced, LookupArks};
use ingest_protocol::node::{IdentifiersNode, MetadataNode};
use ingest_steps::digest::{digest_file, Algorithm};
use ingest_steps::erc::{write_dublin_core, write_erc, ErcFields};
use ingest_steps::mime::mime_type;
use ingest_steps::signing::SigningKeyFile;
use ingest_steps::stamp::FileStamp;
use ingest_steps::storage_manifest::{render, render_with_comment, ManifestFile};
use serde::Deserialize;

use super::fetch::RetryPolicy;
use super::{locks, RealConfig};
use crate::retry::Retryable;
use crate::step::{DataError, JobCtx, JobData, Outcome, Step, StepError, StepFuture, StepResult};
use ingest_client::Reply;

/// The ERC file, in `system/`.
pub const ERC_FILE: &str = "mrt-erc.txt";
/// The Dublin Core file, in `system/`.
pub const DC_FILE: &str = "mrt-dc.xml";
/// The storage manifest, in `system/`.
pub const MANIFEST_FILE: &str = "mrt-manifest.txt";
/// The manifest's detached signature, in `system/`.
pub const SIGNATURE_FILE: &str = "mrt-manifest.txt.sig";
/// The public key that verifies the signature, in `system/`.
pub const PUBLIC_KEY_FILE: &str = "mrt-signing-key.pub";
/// The producer file list written by the download step, in `system/`.
pub const FILES_JSON: &str = "files.json";

/// The step.
pub struct Process {
    config: Arc<RealConfig>,
    key: Option<Arc<SigningKeyFile>>,
}

impl Process {
    /// The step; `key` signs storage manifests.
    pub fn new(config: Arc<RealConfig>, key: Option<Arc<SigningKeyFile>>) -> Process {
        Process { config, key }
    }

    /// Takes the job's local-id locks (held on to the end of Recording),
    /// then processes; a failure releases them.
    async fn locked(&self, job: &JobCtx) -> StepResult {
        let policy = self.config.retry();
        let data = match job_data(job, policy).await {
            Ok(d) => d,
            Err(e) => return StepResult::Report(Outcome::from(e)),
        };
        let locks = locks::localid_locks(
            &data.configuration.profile_name,
            &local_ids(&data.identifiers),
        );
        if let Err(wait) = locks::acquire(job, &locks, locks::Holder::AcrossSteps, policy).await {
            return wait;
        }
        let outcome = self.process(job, data).await;
        if !outcome.success {
            locks::release_all(job, &locks).await;
        }
        StepResult::Report(outcome)
    }

    async fn process(&self, job: &JobCtx, data: JobData) -> Outcome {
        let policy = self.config.retry();
        let collection = data.configuration.profile_name.clone();
        let local_ids = local_ids(&data.identifiers);
        let supplied = primary_id(&data.identifiers);
        let (ark, how) =
            match assign_ark(job, policy, &collection, &local_ids, supplied.as_deref()).await {
                Ok(assigned) => assigned,
                Err(e) => return Outcome::from(e),
            };
        let job_dir = self.config.job_dir(&data.bid, job.jid);
        let erc = erc_fields(&data.metadata);
        let key = self.key.clone();
        let written = {
            let (ark, local_ids) = (ark.clone(), local_ids.clone());
            tokio::task::spawn_blocking(move || {
                write_object_files(&job_dir, &ark, &local_ids, &erc, key.as_deref())
            })
            .await
        };
        match written {
            Ok(Ok(files)) => {
                tracing::info!(jid = %job.jid, state = %job.state, %ark, files = files.len(), "processed");
                Outcome::success(format!("ark {ark} ({how})")).with_identifiers(IdentifiersBody {
                    primary_id: Some(ark),
                    local_ids,
                })
            }
            Ok(Err(e)) => Outcome::from(e),
            Err(e) => Outcome::failure(format!("writing the object's files failed: {e}")),
        }
    }
}

impl Step for Process {
    fn run<'a>(&'a self, job: &'a JobCtx) -> StepFuture<'a> {
        Box::pin(self.locked(job))
    }
}

/// The job's ark and how it was found (`supplied`, `found by local id`,
/// `minted`, `already assigned`): the inventory is asked for the local ids
/// (`POST /jobs/JID/lookup`), [`choose_ark`] decides, and when there is no
/// ark the server mints one (`POST /jobs/JID/ark`, which returns the ark
/// already recorded on the job rather than minting twice).
///
/// # Errors
/// A contradiction (see [`choose_ark`]), a refusal, or an API error left
/// when retries run out.
pub async fn assign_ark(
    job: &JobCtx,
    policy: RetryPolicy,
    collection: &str,
    local_ids: &[String],
    supplied: Option<&str>,
) -> Result<(String, &'static str), StepError> {
    let found = if local_ids.is_empty() {
        BTreeMap::new()
    } else {
        let answer = call_api(job, policy, &LookupArks(job.jid), |who: WorkerRef| {
            LookupBody {
                worker: who.worker,
                session_id: who.session_id,
                collection: collection.to_string(),
                local_ids: local_ids.to_vec(),
            }
        })
        .await?;
        answer.arks
    };
    let supplied = supplied.map(str::trim).filter(|s| !s.is_empty());
    let (ark, how) = match choose_ark(supplied, &found)? {
        Some(ark) if supplied == Some(ark.as_str()) => (ark, "supplied"),
        Some(ark) => (ark, "found by local id"),
        None => {
            let answer = call_api(job, policy, &AssignArk(job.jid), |who: WorkerRef| ArkBody {
                worker: who.worker,
                session_id: who.session_id,
            })
            .await?;
            match answer.minted {
                false => (answer.ark, "already assigned"),
                true => (answer.ark, "minted"),
            }
        }
    };
    check_ark(&ark)?;
    Ok((ark, how))
}

/// The ark to use, from the ark the depositor supplied (if any) and what the
/// inventory binds each local id to (`None`: unbound). `Ok(None)` means an
/// ark has to be minted.
///
/// # Errors
/// Two local ids bound to different arks, or a supplied ark that differs
/// from the inventory's; the message names the ids and arks.
pub fn choose_ark(
    supplied: Option<&str>,
    found: &BTreeMap<String, Option<String>>,
) -> Result<Option<String>, StepError> {
    let supplied = supplied.map(str::trim).filter(|s| !s.is_empty());
    let mut bound: Option<(&str, &str)> = None;
    for (local_id, ark) in found {
        let Some(ark) = ark.as_deref().map(str::trim).filter(|a| !a.is_empty()) else {
            continue;
        };
        match bound {
            Some((first_id, first_ark)) if first_ark != ark => {
                return Err(StepError::permanent(format!(
                    "the local ids {first_id:?} and {local_id:?} belong to different objects \
                     ({first_ark} and {ark})"
                )))
            }
            Some(_) => {}
            None => bound = Some((local_id, ark)),
        }
    }
    match (supplied, bound) {
        (Some(s), Some((local_id, ark))) if s != ark => Err(StepError::permanent(format!(
            "the ark {s} supplied for local id {local_id} contradicts the inventory's ark {ark}"
        ))),
        (_, Some((_, ark))) => Ok(Some(ark.to_string())),
        (Some(s), None) => Ok(Some(s.to_string())),
        (None, None) => Ok(None),
    }
}

/// Writes the ERC, Dublin Core, storage manifest and (with `key`) the
/// signature and public key into `<job_dir>/system/`, and returns the
/// manifest's files.
///
/// The ERC's `where` lines are the ark, the local ids and any `where` in
/// `erc.wheres`, without repeats. The producer files come from
/// `system/files.json` (see [`producer_files`]).
///
/// # Errors
/// A missing or unreadable producer file, a name or URL that checkm cannot
/// carry, or a write that fails; the message names the file.
pub fn write_object_files(
    job_dir: &Path,
    ark: &str,
    local_ids: &[String],
    erc: &ErcFields,
    key: Option<&SigningKeyFile>,
) -> Result<Vec<ManifestFile>, StepError> {
    let job_dir = std::fs::canonicalize(job_dir)
        .map_err(|e| format!("the working directory {}: {e}", job_dir.display()))?;
    // Fails early, before anything is written, when there is no file.
    producer_files(&job_dir)?;
    let system = job_dir.join("system");
    std::fs::create_dir_all(&system)
        .map_err(|e| format!("cannot create {}: {e}", system.display()))?;
    let mut wheres: Vec<String> = Vec::new();
    for w in std::iter::once(ark)
        .chain(local_ids.iter().map(String::as_str))
        .chain(erc.wheres.iter().map(String::as_str))
    {
        let w = w.trim();
        if !w.is_empty() && !wheres.iter().any(|x| x == w) {
            wheres.push(w.to_string());
        }
    }
    let fields = ErcFields {
        wheres,
        ..erc.clone()
    };
    write_file(
        &job_dir,
        &system.join(ERC_FILE),
        write_erc(&fields).as_bytes(),
    )?;
    write_file(
        &job_dir,
        &system.join(DC_FILE),
        write_dublin_core(&fields).as_bytes(),
    )?;
    write_manifest(&job_dir, &ManifestUrls::Working, None, key)
}

/// Where the URLs of a storage manifest point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ManifestUrls<'a> {
    /// The job's working files (`file://`): the manifest Processing hands
    /// to Storing. Notify removes them.
    Working,
    /// The stored version, in Merritt's storage form
    /// `BASE/content/NODE/ARK/VERSION/FILE`
    /// ([`ingest_steps::storage_manifest::content_url`]): the manifest
    /// Storing stores, whose URLs stay valid after Notify.
    Stored {
        /// The server's base URL (`--content-url`).
        base: &'a str,
        /// The storage node (`--storage-node-id` of the first target).
        node: u32,
        /// The object.
        ark: &'a str,
        /// The version being stored.
        version: u32,
    },
}

impl ManifestUrls<'_> {
    fn url(&self, job_dir: &Path, name: &str) -> Result<String, StepError> {
        match *self {
            ManifestUrls::Working => file_url(&job_dir.join(name)),
            ManifestUrls::Stored {
                base,
                node,
                ark,
                version,
            } => Ok(ingest_steps::storage_manifest::content_url(
                base, node, ark, version, name,
            )),
        }
    }
}

/// Writes the storage manifest `system/mrt-manifest.txt` of the job's
/// producer files and its ERC and Dublin Core files (written before), with
/// URLs per `urls` and, when given, `comment` as a `# ` line after the
/// header; then (with `key`) its signature and the public key, or (without)
/// removes a signature an earlier run left. Returns the manifest's files.
///
/// # Errors
/// A missing or unreadable file, a name or URL that checkm cannot carry,
/// or a write that fails; the message names the file.
pub fn write_manifest(
    job_dir: &Path,
    urls: &ManifestUrls<'_>,
    comment: Option<&str>,
    key: Option<&SigningKeyFile>,
) -> Result<Vec<ManifestFile>, StepError> {
    let job_dir = std::fs::canonicalize(job_dir)
        .map_err(|e| format!("the working directory {}: {e}", job_dir.display()))?;
    let producer = producer_files(&job_dir)?;
    let system = job_dir.join("system");
    let mut files = Vec::with_capacity(producer.len() + 2);
    for entry in &producer {
        let name = format!("producer/{}", entry.name);
        files.push(ManifestFile {
            url: urls.url(&job_dir, &name)?,
            algorithm: Algorithm::Sha256,
            digest: entry.sha256.clone(),
            size: entry.size,
            last_modified: None,
            name,
            mime_type: Some(mime_type(entry.mime_type.as_deref(), &entry.name)),
        });
    }
    for name in [ERC_FILE, DC_FILE] {
        let path = system.join(name);
        let (size, sha256) = sha256_of(&path)?;
        files.push(ManifestFile {
            url: urls.url(&job_dir, &format!("system/{name}"))?,
            algorithm: Algorithm::Sha256,
            digest: sha256,
            size,
            last_modified: None,
            name: format!("system/{name}"),
            mime_type: Some(mime_type(None, name)),
        });
    }
    let manifest = match comment {
        Some(comment) => render_with_comment(&files, comment),
        None => render(&files),
    }
    .map_err(|e| format!("the storage manifest: {e}"))?;
    write_file(&job_dir, &system.join(MANIFEST_FILE), manifest.as_bytes())?;
    match key {
        Some(key) => {
            let signature = key.sign(manifest.as_bytes()).to_text();
            write_file(&job_dir, &system.join(SIGNATURE_FILE), signature.as_bytes())?;
            write_file(
                &job_dir,
                &system.join(PUBLIC_KEY_FILE),
                key.public_key_pem().as_bytes(),
            )?;
        }
        None => {
            // A signature left by an earlier run with a key would no longer
            // match (or would name a key no longer configured).
            for name in [SIGNATURE_FILE, PUBLIC_KEY_FILE] {
                remove_if_present(&system.join(name))?;
            }
        }
    }
    Ok(files)
}

/// One producer file: its name under `producer/`, size and SHA-256.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProducerFile {
    /// The `/`-separated path under `producer/`.
    pub name: String,
    /// Size in bytes.
    pub size: u64,
    /// SHA-256, lower-case hex.
    pub sha256: String,
    /// Every digest known, by canonical algorithm name (`md5`, `sha256`…).
    pub digests: BTreeMap<String, String>,
    /// The depositor's MIME type, if the list gave one.
    pub mime_type: Option<String>,
    /// The stamp the download step recorded when it hashed the file: while
    /// the file keeps it, its bytes are the ones hashed.
    pub stamp: Option<FileStamp>,
}

/// The producer files of a job, sorted by name: from `system/files.json`
/// (written by the download step: `[{name, url, size, digests: {alg: hex}}]`)
/// when it exists, each checked to be on disk with that size and given a
/// SHA-256 when the list has none; otherwise every regular file under
/// `producer/`, hashed.
///
/// # Errors
/// An unreadable or malformed list, an unsafe name, a listed file that is
/// missing or has another size, a file that cannot be read, or no file at
/// all.
pub fn producer_files(job_dir: &Path) -> Result<Vec<ProducerFile>, StepError> {
    let producer = job_dir.join("producer");
    let list_path = job_dir.join("system").join(FILES_JSON);
    let mut files = match std::fs::read(&list_path) {
        Ok(bytes) => from_list(&producer, &list_path, &bytes)?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => from_disk(&producer)?,
        Err(e) => {
            return Err(StepError::io(
                format_args!("read {}", list_path.display()),
                &e,
            ))
        }
    };
    if files.is_empty() {
        return Err(StepError::permanent(format!(
            "{} holds no file: Downloading did not produce any",
            producer.display()
        )));
    }
    files.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(files)
}

/// A `file://` URL for an absolute path, percent-encoded (including `|`,
/// which checkm cannot carry).
///
/// # Errors
/// A relative path.
pub fn file_url(path: &Path) -> Result<String, StepError> {
    reqwest::Url::from_file_path(path)
        .map(|u| u.as_str().replace('|', "%7C"))
        .map_err(|()| StepError::permanent(format!("{} is not an absolute path", path.display())))
}

/// The size and SHA-256 of a file.
///
/// # Errors
/// An unreadable file; the message names it.
pub fn sha256_of(path: &Path) -> Result<(u64, String), StepError> {
    let (size, digests) = digest_file(path, &[Algorithm::Sha256])
        .map_err(|e| StepError::io(format_args!("read {}", path.display()), &e))?;
    let sha256 = digests
        .into_iter()
        .find(|(a, _)| *a == Algorithm::Sha256)
        .map(|(_, d)| d)
        .ok_or_else(|| format!("no sha256 computed for {}", path.display()))?;
    Ok((size, sha256))
}

/// The local ids of a job's `identifiers` node (`local_id`: a list, or a
/// `;`-separated string), trimmed, without empty ones or repeats.
pub fn local_ids(identifiers: &IdentifiersNode) -> Vec<String> {
    let raw: Vec<String> = identifiers
        .local_id
        .iter()
        .flat_map(|s| s.split(';'))
        .map(str::to_string)
        .collect();
    let mut seen = BTreeSet::new();
    raw.into_iter()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty() && seen.insert(s.clone()))
        .collect()
}

/// The job's ark (`primary_id`), if it has a non-empty one.
pub fn primary_id(identifiers: &IdentifiersNode) -> Option<String> {
    Some(identifiers.primary_id.trim())
        .filter(|s| !s.is_empty())
        .map(str::to_string)
}

/// The ERC fields of a job's `metadata` node (`erc_who`, `erc_what`,
/// `erc_when`, `erc_where`).
pub fn erc_fields(metadata: &MetadataNode) -> ErcFields {
    let field = |v: &str| Some(v.trim()).filter(|s| !s.is_empty()).map(str::to_string);
    ErcFields {
        who: field(&metadata.erc_who),
        what: field(&metadata.erc_what),
        when: field(&metadata.erc_when),
        wheres: field(&metadata.erc_where).into_iter().collect(),
    }
}

/// Reads the job's nodes, retrying a failure other than a missing session
/// or malformed data.
///
/// # Errors
/// The last error, prefixed with what was being read.
pub(crate) async fn job_data(job: &JobCtx, policy: RetryPolicy) -> Result<JobData, StepError> {
    crate::retry::retry(&policy, Some(job), "reading the job", || job.data())
        .await
        .map_err(|g| {
            let message = format!("cannot read the job: {}", g.error);
            match g.error {
                DataError::Read(_) => StepError::Recoverable(message),
                _ => StepError::permanent(message),
            }
        })
}

/// A fenced API call, retried (each retry recorded) while the error is
/// recoverable: no answer, HTTP 5xx or 429.
///
/// # Errors
/// A refusal (409: the server's code and message), another HTTP error, or
/// the last recoverable one when retries run out; the message names the path.
pub(crate) async fn call_api<E: Fenced>(
    job: &JobCtx,
    policy: RetryPolicy,
    endpoint: &E,
    body: impl Fn(WorkerRef) -> E::Body,
) -> Result<E::Reply, StepError> {
    let what = format!("{} {}", E::METHOD, endpoint.path());
    match crate::retry::retry(&policy, Some(job), &what, || job.call(endpoint, &body)).await {
        Ok(Reply::Done(answer)) => Ok(answer),
        Ok(Reply::Refused { code, message }) => Err(StepError::Refused {
            message: format!("{what} was refused ({code}): {message}"),
            code,
        }),
        Err(gave_up) => {
            let message = format!("{what} failed: {}", gave_up.message());
            Err(match gave_up.error.is_retryable() {
                true => StepError::Recoverable(message),
                false => StepError::permanent(message),
            })
        }
    }
}

/// An ark must be an OCFL id, a checkm value and an ERC line: `ark:/…`
/// without whitespace, `|` or control characters.
pub(crate) fn check_ark(ark: &str) -> Result<(), StepError> {
    let bad = ark
        .chars()
        .any(|c| c.is_whitespace() || c.is_control() || c == '|');
    if !ark.starts_with("ark:/") || ark.len() <= 5 || bad {
        return Err(StepError::permanent(format!("{ark:?} is not a usable ark")));
    }
    Ok(())
}

#[derive(Deserialize)]
#[serde(untagged)]
enum FileList {
    Bare(Vec<ListedFile>),
    Wrapped { files: Vec<ListedFile> },
}

#[derive(Deserialize)]
struct ListedFile {
    name: String,
    #[serde(default)]
    size: Option<u64>,
    #[serde(default)]
    digests: BTreeMap<String, String>,
    #[serde(default)]
    mime_type: Option<String>,
    #[serde(default)]
    stamp: Option<FileStamp>,
}

fn from_list(
    producer: &Path,
    list_path: &Path,
    bytes: &[u8],
) -> Result<Vec<ProducerFile>, StepError> {
    let list: FileList = serde_json::from_slice(bytes)
        .map_err(|e| format!("{} is not a file list: {e}", list_path.display()))?;
    let listed = match list {
        FileList::Bare(l) | FileList::Wrapped { files: l } => l,
    };
    let mut out = Vec::with_capacity(listed.len());
    for file in listed {
        let name = ingest_steps::paths::normalized_name(&file.name)
            .map_err(|e| format!("{}: file {:?}: {e}", list_path.display(), file.name))?;
        let path: PathBuf = producer.join(&name);
        let meta = std::fs::symlink_metadata(&path).map_err(|e| {
            StepError::io(format_args!("find producer file {}", path.display()), &e)
        })?;
        if !meta.is_file() {
            return Err(StepError::permanent(format!(
                "producer file {} is not a regular file",
                path.display()
            )));
        }
        if let Some(size) = file.size {
            if size != meta.len() {
                return Err(StepError::permanent(format!(
                    "producer file {} is {} bytes, but {size} were downloaded",
                    path.display(),
                    meta.len()
                )));
            }
        }
        let mut digests = BTreeMap::new();
        for (alg, hex) in file.digests {
            if let Ok(a) = Algorithm::from_str(&alg) {
                digests.insert(a.name().to_string(), hex.to_ascii_lowercase());
            }
        }
        let sha256 = match digests.get("sha256") {
            Some(d) => d.clone(),
            None => {
                let (_, d) = sha256_of(&path)?;
                digests.insert("sha256".into(), d.clone());
                d
            }
        };
        out.push(ProducerFile {
            name,
            size: meta.len(),
            sha256,
            digests,
            mime_type: file
                .mime_type
                .as_deref()
                .and_then(ingest_steps::mime::checked)
                .map(str::to_owned),
            stamp: file.stamp,
        });
    }
    Ok(out)
}

fn from_disk(producer: &Path) -> Result<Vec<ProducerFile>, StepError> {
    let mut out = Vec::new();
    for (name, path) in walk(producer)? {
        let (size, sha256) = sha256_of(&path)?;
        out.push(ProducerFile {
            name,
            size,
            digests: BTreeMap::from([("sha256".to_string(), sha256.clone())]),
            sha256,
            mime_type: None,
            stamp: None,
        });
    }
    Ok(out)
}

/// Every regular file under `dir` as (`/`-separated relative name, path).
///
/// # Errors
/// A missing directory, an unreadable entry, or an entry that is neither a
/// regular file nor a directory (a symbolic link is refused, not followed).
pub(crate) fn walk(dir: &Path) -> Result<Vec<(String, PathBuf)>, StepError> {
    if !dir.is_dir() {
        return Err(StepError::permanent(format!(
            "{} is missing or not a directory",
            dir.display()
        )));
    }
    let mut out = Vec::new();
    let mut pending = vec![(dir.to_path_buf(), String::new())];
    while let Some((path, prefix)) = pending.pop() {
        let list = |e: std::io::Error| StepError::io(format_args!("list {}", path.display()), &e);
        let entries = std::fs::read_dir(&path).map_err(list)?;
        for entry in entries {
            let entry = entry.map_err(list)?;
            let p = entry.path();
            let name = entry
                .file_name()
                .into_string()
                .map_err(|_| format!("{} has a name that is not UTF-8", p.display()))?;
            let kind = entry
                .file_type()
                .map_err(|e| StepError::io(format_args!("read {}", p.display()), &e))?;
            if kind.is_dir() {
                pending.push((p, format!("{prefix}{name}/")));
            } else if kind.is_file() {
                out.push((format!("{prefix}{name}"), p));
            } else {
                return Err(StepError::permanent(format!(
                    "{} is not a regular file or directory",
                    p.display()
                )));
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Writes `bytes` to `path` through a temporary file in `tmp_dir` (outside
/// `system/`, so a crash never leaves a partial file among the files that
/// are stored). A full disk is recoverable, a bad path is not.
pub(crate) fn write_file(tmp_dir: &Path, path: &Path, bytes: &[u8]) -> Result<(), StepError> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = tmp_dir.join(format!(".{name}.tmp"));
    super::atomic::write_atomically(&tmp, path, bytes)
        .map_err(|e| StepError::io(format_args!("write {}", path.display()), &e))
}

fn remove_if_present(path: &Path) -> Result<(), StepError> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(StepError::io(format_args!("remove {}", path.display()), &e)),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};
    use std::time::Duration;

    /// A node value as a worker reads it.
    fn node<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
        serde_json::from_value(v).expect("a node")
    }
    use super::*;
    use ingest_steps::signing::verify;

    fn found(pairs: &[(&str, Option<&str>)]) -> BTreeMap<String, Option<String>> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.map(str::to_string)))
            .collect()
    }

    #[test]
    fn choose_ark_cases() {
        let none = found(&[]);
        assert_eq!(choose_ark(None, &none), Ok(None));
        assert_eq!(choose_ark(Some("  "), &none), Ok(None));
        assert_eq!(
            choose_ark(Some("ark:/1/a"), &none),
            Ok(Some("ark:/1/a".into()))
        );
        let unbound = found(&[("L1", None), ("L2", None)]);
        assert_eq!(choose_ark(None, &unbound), Ok(None));
        let bound = found(&[("L1", Some("ark:/1/x")), ("L2", None)]);
        assert_eq!(choose_ark(None, &bound), Ok(Some("ark:/1/x".into())));
        assert_eq!(
            choose_ark(Some("ark:/1/x"), &bound),
            Ok(Some("ark:/1/x".into()))
        );
        let err = choose_ark(Some("ark:/1/y"), &bound)
            .expect_err("contradiction")
            .to_string();
        assert_eq!(
            err,
            "the ark ark:/1/y supplied for local id L1 contradicts the inventory's ark ark:/1/x"
        );
        let same = found(&[("L1", Some("ark:/1/x")), ("L2", Some("ark:/1/x"))]);
        assert_eq!(choose_ark(None, &same), Ok(Some("ark:/1/x".into())));
        let split = found(&[("L1", Some("ark:/1/x")), ("L2", Some("ark:/1/z"))]);
        let err = choose_ark(None, &split)
            .expect_err("two objects")
            .to_string();
        assert!(
            err.contains("L1") && err.contains("L2") && err.contains("ark:/1/z"),
            "{err}"
        );
    }

    #[test]
    fn identifiers_and_metadata_are_read() {
        let ids = node(json!({"primary_id": " ark:/1/a ", "local_id": ["a;b", " c ", "a", ""]}));
        assert_eq!(local_ids(&ids), vec!["a", "b", "c"]);
        assert_eq!(primary_id(&ids).as_deref(), Some("ark:/1/a"));
        assert_eq!(
            local_ids(&node(json!({"local_id": "x; y"}))),
            vec!["x", "y"]
        );
        assert!(local_ids(&node(json!({}))).is_empty());
        assert_eq!(primary_id(&node(json!({"primary_id": ""}))), None);
        let erc = erc_fields(&node(
            json!({"erc_who": "Me", "erc_what": "", "erc_where": "w"}),
        ));
        assert_eq!(erc.who.as_deref(), Some("Me"));
        assert_eq!(erc.what, None);
        assert_eq!(erc.wheres, vec!["w"]);
    }

    #[test]
    fn api_errors_are_classified() {
        assert!(check_ark("ark:/99999/fk4abc").is_ok());
        assert!(check_ark("ark:/9 9").is_err());
        assert!(check_ark("doi:10.1/x").is_err());
    }

    fn job_dir_with_files() -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("tempdir");
        let producer = dir.path().join("producer");
        std::fs::create_dir_all(producer.join("sub dir")).expect("mkdir");
        std::fs::write(producer.join("a.txt"), b"abc").expect("write");
        std::fs::write(producer.join("sub dir/b#c.bin"), b"hello").expect("write");
        dir
    }

    #[test]
    fn object_files_are_written_and_signed() {
        let dir = job_dir_with_files();
        let key_dir = tempfile::tempdir().expect("tempdir");
        let key = SigningKeyFile::generate(&key_dir.path().join("k.pem")).expect("key");
        let erc = ErcFields {
            who: Some("Doe, J.".into()),
            what: Some("A <title>".into()),
            when: Some("2024".into()),
            wheres: vec!["L1".into()],
        };
        let files = write_object_files(
            dir.path(),
            "ark:/99999/fk4test",
            &["L1".into(), "L2".into()],
            &erc,
            Some(&key),
        )
        .expect("written");
        let names: Vec<&str> = files.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(
            names,
            vec![
                "producer/a.txt",
                "producer/sub dir/b#c.bin",
                "system/mrt-erc.txt",
                "system/mrt-dc.xml"
            ]
        );
        assert_eq!(
            files[0].digest,
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert!(files[1].url.starts_with("file:///"), "{}", files[1].url);
        assert!(
            files[1].url.ends_with("/producer/sub%20dir/b%23c.bin"),
            "{}",
            files[1].url
        );
        let system = dir.path().join("system");
        let erc_text = std::fs::read_to_string(system.join(ERC_FILE)).expect("erc");
        assert!(erc_text.contains("who: Doe, J.\n"), "{erc_text}");
        assert_eq!(erc_text.matches("where: ").count(), 3, "{erc_text}");
        assert!(
            erc_text.contains("where: ark:/99999/fk4test\n"),
            "{erc_text}"
        );
        let dc = std::fs::read_to_string(system.join(DC_FILE)).expect("dc");
        assert!(dc.contains("A &lt;title&gt;"), "{dc}");
        let manifest = std::fs::read(system.join(MANIFEST_FILE)).expect("manifest");
        let text = String::from_utf8_lossy(&manifest).into_owned();
        assert!(text.contains("| producer/a.txt |"), "{text}");
        let sig = std::fs::read_to_string(system.join(SIGNATURE_FILE)).expect("sig");
        let public = std::fs::read_to_string(system.join(PUBLIC_KEY_FILE)).expect("pub");
        verify(&public, &manifest, &sig).expect("the signature verifies");
        let mut tampered = manifest.clone();
        let i = tampered.len() / 2;
        tampered[i] ^= 1;
        assert!(verify(&public, &tampered, &sig).is_err());

        // Without a key, a rerun leaves no stale signature behind.
        write_object_files(dir.path(), "ark:/99999/fk4test", &[], &erc, None).expect("rerun");
        assert!(!system.join(SIGNATURE_FILE).exists());
        assert!(!system.join(PUBLIC_KEY_FILE).exists());
        let leftovers: Vec<_> = std::fs::read_dir(dir.path())
            .expect("ls")
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
            .collect();
        assert!(leftovers.is_empty());
    }

    #[test]
    fn the_download_list_is_used_and_checked() {
        let dir = job_dir_with_files();
        let system = dir.path().join("system");
        std::fs::create_dir_all(&system).expect("mkdir");
        let fake = "0".repeat(64);
        let list = json!([
            {"name": "a.txt", "url": "http://x/a", "size": 3, "digests": {"SHA-256": fake, "md5": "900150983cd24fb0d6963f7d28e17f72"}},
            {"name": "sub dir/b#c.bin", "url": "http://x/b", "size": 5, "digests": {}}
        ]);
        std::fs::write(system.join(FILES_JSON), list.to_string()).expect("list");
        let files = producer_files(dir.path()).expect("files");
        assert_eq!(files[0].sha256, fake, "the downloaded digest is trusted");
        assert_eq!(files[0].digests.len(), 2);
        assert_eq!(
            files[1].sha256,
            "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"
        );
        let wrong = json!([{"name": "a.txt", "size": 4}]);
        std::fs::write(system.join(FILES_JSON), wrong.to_string()).expect("list");
        let err = producer_files(dir.path()).expect_err("size").to_string();
        assert!(err.contains("a.txt") && err.contains("4"), "{err}");
        let missing = json!([{"name": "nope.txt"}]);
        std::fs::write(system.join(FILES_JSON), missing.to_string()).expect("list");
        assert!(producer_files(dir.path())
            .expect_err("missing")
            .to_string()
            .contains("nope.txt"));
        let escape = json!([{"name": "../x"}]);
        std::fs::write(system.join(FILES_JSON), escape.to_string()).expect("list");
        assert!(producer_files(dir.path()).is_err());
    }

    /// A local API: `lookup` answers `bound` for every local id asked,
    /// `ark` mints `ark:/99999/fk4new`; mints are counted.
    async fn api(bound: BTreeMap<String, String>) -> (String, Arc<std::sync::atomic::AtomicU32>) {
        use axum::routing::post;
        use std::sync::atomic::{AtomicU32, Ordering};
        let mints = Arc::new(AtomicU32::new(0));
        let m = Arc::clone(&mints);
        let app = axum::Router::new()
            .route(
                "/jobs/{jid}/lookup",
                post(move |axum::Json(req): axum::Json<Value>| {
                    let bound = bound.clone();
                    async move {
                        assert_eq!(req["collection"], "demo");
                        let arks: serde_json::Map<String, Value> = req["local_ids"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .filter_map(Value::as_str)
                            .map(|id| (id.to_string(), json!(bound.get(id))))
                            .collect();
                        axum::Json(json!({ "arks": arks }))
                    }
                }),
            )
            .route(
                "/jobs/{jid}/ark",
                post(move || {
                    let m = Arc::clone(&m);
                    async move {
                        m.fetch_add(1, Ordering::SeqCst);
                        axum::Json(json!({"ark": "ark:/99999/fk4new", "minted": true}))
                    }
                }),
            );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        (format!("http://{addr}"), mints)
    }

    #[tokio::test]
    async fn arks_are_found_supplied_or_minted() {
        use crate::step::ApiCtx;
        use ingest_client::Client as EngineClient;
        use std::sync::atomic::Ordering;
        let bound = BTreeMap::from([("L1".to_string(), "ark:/99999/fk4old".to_string())]);
        let (base, mints) = api(bound).await;
        let mut job = JobCtx::detached(
            ingest_events::Jid(1),
            ingest_events::JobState::Processing,
            5,
        );
        job.api = Some(ApiCtx {
            engine: EngineClient::new(&base, "token").expect("client"),
            worker: "w1".into(),
            session_id: 1,
            fence: ingest_protocol::fence::FenceSecret::from_bytes([1; 32]),
        });
        let policy = RetryPolicy {
            retries: 1,
            first_backoff: Duration::from_millis(1),
            max_backoff: Duration::from_millis(1),
        };
        let ids = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let found = assign_ark(&job, policy, "demo", &ids(&["L1", "L2"]), None).await;
        assert_eq!(
            found,
            Ok(("ark:/99999/fk4old".to_string(), "found by local id"))
        );
        let err = assign_ark(
            &job,
            policy,
            "demo",
            &ids(&["L1"]),
            Some("ark:/99999/fk4other"),
        )
        .await
        .expect_err("contradiction")
        .to_string();
        assert!(
            err.contains("contradicts the inventory's ark ark:/99999/fk4old"),
            "{err}"
        );
        let supplied =
            assign_ark(&job, policy, "demo", &ids(&["L2"]), Some("ark:/99999/fk4s")).await;
        assert_eq!(supplied, Ok(("ark:/99999/fk4s".to_string(), "supplied")));
        assert_eq!(mints.load(Ordering::SeqCst), 0);
        let minted = assign_ark(&job, policy, "demo", &[], None).await;
        assert_eq!(minted, Ok(("ark:/99999/fk4new".to_string(), "minted")));
        assert_eq!(mints.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn no_producer_file_fails() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(dir.path().join("producer")).expect("mkdir");
        let err = write_object_files(dir.path(), "ark:/1/a", &[], &ErcFields::default(), None)
            .expect_err("empty")
            .to_string();
        assert!(err.contains("no file"), "{err}");
    }
}
