//! Downloading: every file of the object into `<job>/producer/`.
//!
//! The files are those [`estimate::object_files`] lists. Each is streamed
//! to disk with its digests computed on the way (always sha256 and sha512,
//! plus the algorithm of any digest the depositor supplied), with retries of
//! recoverable errors recorded as events; at most `transfers_per_job` run
//! at once for a job and `transfers` for the whole worker. A supplied
//! digest that does not match fails the job at once. A container is
//! downloaded to `<job>/container`, unpacked into `producer/` within the
//! object limits, then removed. The list of files with their sizes and
//! digests is written to `<job>/system/files.json` for the later steps.
//!
//! A requeued job downloads again from scratch: `producer/` is cleared
//! first.
//!
//! A file whose size differs from the size its manifest declares fails the
//! job (so does a body that differs from its `Content-Length`, in
//! [`super::fetch`]). The whole step, manifest reads and retries included,
//! has a deadline (`--download-deadline-secs`); when it passes, the job
//! fails naming the URLs still downloading.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ingest_steps::container::{self, ExtractLimits};
use ingest_steps::digest::{self, Algorithm, Expected};
use ingest_steps::forms::{FileSpec, ObjectKind};
use ingest_steps::paths;
use ingest_steps::stamp::{self, FileStamp};
use serde::{Deserialize, Serialize};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::estimate;
use super::fetch::{Fetcher, RetryPolicy};
use super::RealConfig;
use crate::step::{JobCtx, Outcome, Step, StepError, StepFuture, StepResult};

/// The directory of the object's files, under the job's directory.
pub const PRODUCER_DIR: &str = "producer";

/// The directory of generated files, under the job's directory.
pub const SYSTEM_DIR: &str = "system";

/// The list of downloaded files, under [`SYSTEM_DIR`].
pub const FILES_JSON: &str = "files.json";

/// Where a container is downloaded before it is unpacked, under the job's
/// directory.
pub const CONTAINER_FILE: &str = "container";

/// One file of the object, as downloaded (an entry of `files.json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DownloadedFile {
    /// Its path under `producer/` (`/`-separated, normalized).
    pub name: String,
    /// Where it came from (for a container's files, the container's URL).
    pub url: String,
    /// Its size in bytes, as measured.
    pub size: u64,
    /// Its digests in lower-case hexadecimal by algorithm name (`sha256`
    /// and `sha512` always, plus the algorithm of a supplied digest). The
    /// storing step checks the stored copy against `sha512`.
    pub digests: BTreeMap<String, String>,
    /// The MIME type the depositor's manifest gave (`mrt:mimeType`), when
    /// well-formed; `None` for none (the storage manifest detects one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mime_type: Option<String>,
    /// The file's stamp right after it was hashed, when known: the storing
    /// step reads again only a file whose stamp has moved since.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stamp: Option<FileStamp>,
}

/// What [`download_object`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DownloadReport {
    /// The object's files, in the order given (a container's in archive
    /// order).
    pub files: Vec<DownloadedFile>,
    /// The sum of their sizes.
    pub bytes: u64,
}

/// The step.
pub struct Download {
    fetcher: Arc<Fetcher>,
    config: Arc<RealConfig>,
    /// The worker's transfers, shared by every job this step downloads.
    transfers: Arc<Semaphore>,
}

impl Step for Download {
    fn run<'a>(&'a self, job: &'a JobCtx) -> StepFuture<'a> {
        Box::pin(async move {
            let outcome = match self.run_job(job).await {
                Ok(report) => {
                    tracing::info!(jid = %job.jid, state = %job.state, files = report.files.len(), bytes = report.bytes, "downloaded");
                    Outcome::success(format!(
                        "downloaded {} files, {} bytes",
                        report.files.len(),
                        report.bytes
                    ))
                    .with_space_needed(report.bytes)
                }
                Err(failure) => {
                    tracing::warn!(jid = %job.jid, state = %job.state, message = %ingest_protocol::bounded(failure.message()), kind = ?failure.kind(), "download failed");
                    failure.into()
                }
            };
            StepResult::Report(outcome)
        })
    }
}

impl Download {
    /// The step.
    pub fn new(fetcher: Arc<Fetcher>, config: Arc<RealConfig>) -> Download {
        let transfers = Arc::new(Semaphore::new(config.args.transfers.max(1)));
        Download {
            fetcher,
            config,
            transfers,
        }
    }

    async fn run_job(&self, job: &JobCtx) -> Result<DownloadReport, StepError> {
        let data = job.data().await?;
        let (kind, single_digest) = match data.configuration.payload_type.as_str() {
            "container" => (ObjectKind::Container, estimate::payload_digest(&data)?),
            "file" => (ObjectKind::Files, estimate::payload_digest(&data)?),
            // An object manifest's digest is the manifest's, checked when
            // it is read.
            _ => (ObjectKind::Files, None),
        };
        let deadline = self.deadline();
        let listed = estimate::object_files(&self.fetcher, &self.config, &data, Some(job));
        let files = match deadline {
            Some(at) => tokio::time::timeout_at(at, listed).await.map_err(|_| {
                StepError::from(
                    self.deadline_passed(std::slice::from_ref(&data.configuration.payload_url)),
                )
            })??,
            None => listed.await?,
        };
        let max = self.config.args.max_object_bytes;
        if data.space_needed > max {
            return Err(StepError::permanent(format!(
                "the object is {} bytes (estimated), larger than the limit of {max} bytes",
                data.space_needed
            )));
        }
        let job_dir = self.config.job_dir(&data.bid, job.jid);
        self.download(&files, kind, single_digest, &job_dir, Some(job), deadline)
            .await
    }

    /// When the step must be done (`--download-deadline-secs` from now;
    /// none for 0).
    fn deadline(&self) -> Option<Instant> {
        match self.config.args.download_deadline_secs {
            0 => None,
            secs => Some(Instant::now() + Duration::from_secs(secs)),
        }
    }

    /// The failure of a step past its deadline, naming (cut) the first of
    /// `urls` still downloading and how many others.
    fn deadline_passed(&self, urls: &[String]) -> String {
        let secs = self.config.args.download_deadline_secs;
        let mut message =
            format!("the download did not finish within its deadline of {secs} s (--download-deadline-secs)");
        if let Some(first) = urls.first() {
            message.push_str(&format!(
                "; still downloading {}",
                ingest_protocol::cut(first, 512)
            ));
            if urls.len() > 1 {
                message.push_str(&format!(" and {} more", urls.len() - 1));
            }
        }
        message
    }

    /// [`download_object`] with this step's shared transfer limit.
    async fn download(
        &self,
        files: &[FileSpec],
        kind: ObjectKind,
        single_digest: Option<Expected>,
        job_dir: &Path,
        job: Option<&JobCtx>,
        deadline: Option<Instant>,
    ) -> Result<DownloadReport, StepError> {
        let args = &self.config.args;
        check_limits(files, args.max_object_files, args.max_object_bytes)?;
        if single_digest.is_some() && files.len() != 1 {
            return Err("a payload digest was given for an object of several files".into());
        }
        let dir = job_dir.to_path_buf();
        blocking(move || prepare(&dir)).await?;
        let producer = job_dir.join(PRODUCER_DIR);
        let report = match kind {
            ObjectKind::Container => {
                let [file] = files else {
                    return Err("a container payload must be exactly one file".into());
                };
                let dest = job_dir.join(CONTAINER_FILE);
                let plan = vec![Transfer::new(
                    0,
                    file,
                    dest,
                    Checked::payload(single_digest),
                )];
                let downloaded = self.transfer_all(plan, job, deadline).await?;
                let container = job_dir.join(CONTAINER_FILE);
                let limits = ExtractLimits {
                    max_entries: u64::try_from(args.max_object_files).unwrap_or(u64::MAX),
                    max_total_bytes: args.max_object_bytes,
                    ..ExtractLimits::default()
                };
                let url = file.url.clone();
                tracing::info!(url = %url, bytes = downloaded.bytes, "unpacking the container");
                blocking(move || unpack(&url, &container, &producer, &limits)).await?
            }
            ObjectKind::Files | ObjectKind::ObjectManifest => {
                let mut names = HashSet::new();
                let mut plan = Vec::with_capacity(files.len());
                for (index, file) in files.iter().enumerate() {
                    let dest = paths::join_under(&producer, &file.name).map_err(|e| {
                        format!("unsafe file name {:?} for {}: {e}", file.name, file.url)
                    })?;
                    if !names.insert(dest.clone()) {
                        return Err(StepError::permanent(format!(
                            "the file name {:?} (for {}) is listed twice",
                            file.name, file.url
                        )));
                    }
                    let expected = match &single_digest {
                        Some(d) => Checked::payload(Some(d.clone())),
                        None => Checked::file(supplied_digest(file)?),
                    };
                    plan.push(Transfer::new(index, file, dest, expected));
                }
                self.transfer_all(plan, job, deadline).await?
            }
        };
        let (dir, list) = (job_dir.to_path_buf(), report.files.clone());
        blocking(move || write_files_json(&dir, &list)).await?;
        Ok(report)
    }

    /// Runs the transfers, at most `transfers_per_job` at once and each
    /// holding one of the worker's transfers, and stops at the first that
    /// fails (the others are aborted, their part files removed), or when
    /// `deadline` passes.
    async fn transfer_all(
        &self,
        plan: Vec<Transfer>,
        job: Option<&JobCtx>,
        deadline: Option<Instant>,
    ) -> Result<DownloadReport, StepError> {
        let max = self.config.args.max_object_bytes;
        let total = Arc::new(AtomicU64::new(0));
        let policy = self.config.retry();
        let count = plan.len();
        let mut plan = plan.into_iter();
        let mut running = JoinSet::new();
        // The URL of each running transfer, to name when the deadline passes.
        let mut in_flight: std::collections::HashMap<tokio::task::Id, (usize, String)> =
            std::collections::HashMap::new();
        let mut done: Vec<(usize, DownloadedFile)> = Vec::with_capacity(count);
        loop {
            while running.len() < self.config.args.transfers_per_job.max(1) {
                let Some(transfer) = plan.next() else { break };
                let ctx = TransferCtx {
                    fetcher: Arc::clone(&self.fetcher),
                    transfers: Arc::clone(&self.transfers),
                    policy,
                    job: job.cloned(),
                    total: Arc::clone(&total),
                    max,
                };
                let what = (transfer.index, transfer.url.clone());
                in_flight.insert(running.spawn(transfer.run(ctx)).id(), what);
            }
            let next = match deadline {
                Some(at) => match tokio::time::timeout_at(at, running.join_next_with_id()).await {
                    Ok(next) => next,
                    Err(_) => {
                        // Dropping `running` aborts the transfers (their
                        // part files are removed).
                        let mut urls: Vec<(usize, String)> = in_flight.into_values().collect();
                        urls.sort();
                        let urls: Vec<String> = urls.into_iter().map(|(_, u)| u).collect();
                        return Err(self.deadline_passed(&urls).into());
                    }
                },
                None => running.join_next_with_id().await,
            };
            match next {
                None => break,
                Some(Ok((id, Ok(file)))) => {
                    in_flight.remove(&id);
                    done.push(file);
                }
                Some(Ok((_, Err(failure)))) => return Err(failure),
                Some(Err(e)) => {
                    return Err(StepError::permanent(format!("a download task failed: {e}")))
                }
            }
        }
        done.sort_by_key(|(index, _)| *index);
        let files: Vec<DownloadedFile> = done.into_iter().map(|(_, f)| f).collect();
        let bytes = files.iter().map(|f| f.size).sum();
        Ok(DownloadReport { files, bytes })
    }
}

/// Downloads the object's `files` into `<job_dir>/producer/` (a
/// `Container` is unpacked there), verifying every supplied digest (each
/// file's own, or `single_digest` for a one-file payload), and writes
/// `<job_dir>/system/files.json`. `producer/` is cleared first.
///
/// # Errors
/// A message naming the file's URL (or the limit): too many files or bytes
/// (checked before anything is downloaded when the sizes are declared), an
/// unsafe or repeated file name, a download that failed (after its
/// retries), a digest mismatch (of kind [`FailureKind::DigestMismatch`]
/// when it is `single_digest`'s, the depositor's digest of the payload), a
/// container that cannot be unpacked within the limits or holds no file, a
/// local write that failed. Files already downloaded stay in place.
pub async fn download_object(
    fetcher: &Arc<Fetcher>,
    config: &Arc<RealConfig>,
    files: &[FileSpec],
    kind: ObjectKind,
    single_digest: Option<Expected>,
    job_dir: &Path,
    job: Option<&JobCtx>,
) -> Result<DownloadReport, StepError> {
    let step = Download::new(Arc::clone(fetcher), Arc::clone(config));
    let deadline = step.deadline();
    step.download(files, kind, single_digest, job_dir, job, deadline)
        .await
}

/// The digest a transfer is checked against, and whose it is.
struct Checked {
    expected: Option<Expected>,
    /// The depositor's digest of the whole payload (a `file` or
    /// `container` job's), whose mismatch no requeue recovers; else a
    /// manifest line's digest of one file.
    payload: bool,
}

impl Checked {
    fn payload(expected: Option<Expected>) -> Checked {
        Checked {
            expected,
            payload: true,
        }
    }

    fn file(expected: Option<Expected>) -> Checked {
        Checked {
            expected,
            payload: false,
        }
    }
}

/// Reads `<job_dir>/system/files.json`.
///
/// # Errors
/// A missing or unreadable file; the message names it.
pub fn read_files_json(job_dir: &Path) -> Result<Vec<DownloadedFile>, StepError> {
    let path = job_dir.join(SYSTEM_DIR).join(FILES_JSON);
    let bytes = std::fs::read(&path)
        .map_err(|e| StepError::io(format_args!("read {}", path.display()), &e))?;
    serde_json::from_slice(&bytes)
        .map_err(|e| StepError::permanent(format!("{} is not a file list: {e}", path.display())))
}

/// The limits known before downloading: the number of files and the sum of
/// the declared sizes.
fn check_limits(files: &[FileSpec], max_files: usize, max_bytes: u64) -> Result<(), StepError> {
    if files.is_empty() {
        return Err("the object has no files".into());
    }
    if files.len() > max_files {
        return Err(StepError::permanent(format!(
            "the object has {} files, more than the limit of {max_files} files",
            files.len()
        )));
    }
    let declared = files
        .iter()
        .filter_map(|f| f.size)
        .fold(0u64, u64::saturating_add);
    if declared > max_bytes {
        return Err(StepError::permanent(format!(
            "the object is {declared} bytes (declared), larger than the limit of {max_bytes} bytes"
        )));
    }
    Ok(())
}

/// The digest a manifest line supplies, if any.
fn supplied_digest(file: &FileSpec) -> Result<Option<Expected>, StepError> {
    let Some(d) = &file.digest else {
        return Ok(None);
    };
    let algorithm: Algorithm = d
        .algorithm
        .parse()
        .map_err(|e| format!("the digest of {}: {e}", file.url))?;
    Ok(Some(Expected {
        algorithm,
        value: d.value.to_ascii_lowercase(),
    }))
}

/// One file to download.
struct Transfer {
    index: usize,
    name: String,
    url: String,
    dest: PathBuf,
    declared_size: Option<u64>,
    expected: Option<Expected>,
    /// Whether `expected` is the depositor's digest of the payload.
    payload_digest: bool,
    algorithms: Vec<Algorithm>,
    mime_type: Option<String>,
}

/// What every transfer of a job shares.
struct TransferCtx {
    fetcher: Arc<Fetcher>,
    transfers: Arc<Semaphore>,
    policy: RetryPolicy,
    job: Option<JobCtx>,
    /// Bytes downloaded so far by the job.
    total: Arc<AtomicU64>,
    max: u64,
}

impl Transfer {
    fn new(index: usize, file: &FileSpec, dest: PathBuf, checked: Checked) -> Transfer {
        let Checked {
            expected,
            payload: payload_digest,
        } = checked;
        // SHA-512 is OCFL's digest: the storing step compares it with what
        // OCFL reads, so the bytes are hashed for it once, as they arrive.
        let mut algorithms = vec![Algorithm::Sha256, Algorithm::Sha512];
        if let Some(e) = &expected {
            if !algorithms.contains(&e.algorithm) {
                algorithms.push(e.algorithm);
            }
        }
        Transfer {
            index,
            name: file.name.clone(),
            url: file.url.clone(),
            dest,
            declared_size: file.size,
            expected,
            payload_digest,
            algorithms,
            mime_type: file
                .mime_type
                .as_deref()
                .and_then(ingest_steps::mime::checked)
                .map(str::to_owned),
        }
    }

    async fn run(self, ctx: TransferCtx) -> Result<(usize, DownloadedFile), StepError> {
        let _permit = Arc::clone(&ctx.transfers)
            .acquire_owned()
            .await
            .map_err(|e| format!("{}: {e}", self.url))?;
        // The object limit, less what the job's finished transfers took.
        let budget = ctx.max.saturating_sub(ctx.total.load(Ordering::Relaxed));
        let url = self.url.as_str();
        let jid = ctx
            .job
            .as_ref()
            .map(|j| j.jid.to_string())
            .unwrap_or_default();
        tracing::debug!(%jid, url, dest = %self.dest.display(), "downloading");
        let downloaded = ctx
            .fetcher
            .with_retries(&ctx.policy, ctx.job.as_ref(), url, || {
                ctx.fetcher
                    .download(url, &self.dest, &self.algorithms, budget)
            })
            .await
            .map_err(|e| e.to_string())?;
        let total = ctx.total.fetch_add(downloaded.size, Ordering::Relaxed) + downloaded.size;
        if total > ctx.max {
            return Err(StepError::permanent(format!(
                "the object is larger than the limit of {} bytes (at {url})",
                ctx.max
            )));
        }
        if let Some(declared) = self.declared_size.filter(|&d| d != downloaded.size) {
            return Err(StepError::permanent(format!(
                "{}: {} bytes downloaded, but the manifest declares {declared} bytes",
                ingest_protocol::cut(url, 512),
                downloaded.size
            )));
        }
        let digests: BTreeMap<String, String> = downloaded
            .digests
            .into_iter()
            .map(|(algorithm, hex)| (algorithm.name().to_owned(), hex))
            .collect();
        if let Some(expected) = &self.expected {
            let actual = digests
                .get(expected.algorithm.name())
                .map(String::as_str)
                .unwrap_or_default();
            match expected.check(actual) {
                Ok(()) => {}
                Err(m) if self.payload_digest => {
                    return Err(estimate::payload_digest_mismatch(url, &m));
                }
                Err(m) => return Err(StepError::permanent(format!("{url}: {m}"))),
            }
        }
        Ok((
            self.index,
            DownloadedFile {
                name: self.name,
                url: self.url,
                size: downloaded.size,
                digests,
                mime_type: self.mime_type,
                stamp: downloaded.stamp,
            },
        ))
    }
}

/// Clears what an earlier attempt left and creates `producer/` and
/// `system/`.
fn prepare(job_dir: &Path) -> Result<(), StepError> {
    let producer = job_dir.join(PRODUCER_DIR);
    let system = job_dir.join(SYSTEM_DIR);
    let remove_dir = |dir: &Path| match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(StepError::io(format_args!("clear {}", dir.display()), &e))
        }
        _ => Ok(()),
    };
    let remove_file = |file: &Path| match std::fs::remove_file(file) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(StepError::io(format_args!("remove {}", file.display()), &e))
        }
        _ => Ok(()),
    };
    remove_dir(&producer)?;
    let container = job_dir.join(CONTAINER_FILE);
    remove_file(&container)?;
    remove_file(&super::fetch::part_path(&container))?;
    remove_file(&system.join(FILES_JSON))?;
    for dir in [&producer, &system] {
        std::fs::create_dir_all(dir)
            .map_err(|e| StepError::io(format_args!("create {}", dir.display()), &e))?;
    }
    Ok(())
}

/// Unpacks the container into `producer`, digests what came out, and
/// removes the container.
fn unpack(
    url: &str,
    container: &Path,
    producer: &Path,
    limits: &ExtractLimits,
) -> Result<DownloadReport, StepError> {
    let extracted = container::extract(container, producer, limits)
        .map_err(|e| format!("container {url}: {e}"))?;
    if extracted.is_empty() {
        return Err(StepError::permanent(format!(
            "container {url} holds no files"
        )));
    }
    std::fs::remove_file(container)
        .map_err(|e| StepError::io(format_args!("remove {}", container.display()), &e))?;
    let mut files = Vec::with_capacity(extracted.len());
    for entry in extracted {
        let before = FileStamp::of_path(&entry.path).ok();
        let (size, digests) =
            digest::digest_file(&entry.path, &[Algorithm::Sha256, Algorithm::Sha512])
                .map_err(|e| StepError::io(format_args!("read {}", entry.path.display()), &e))?;
        // Only a file that did not change while it was read has a stamp,
        // and only where every later change is sure to move it.
        let stamp = before
            .filter(|b| b.matches(&entry.path))
            .filter(|_| stamp::changes_always_seen(&entry.path));
        files.push(DownloadedFile {
            name: entry.name,
            url: url.to_owned(),
            size,
            digests: digests
                .into_iter()
                .map(|(a, hex)| (a.name().to_owned(), hex))
                .collect(),
            mime_type: None,
            stamp,
        });
    }
    let bytes = files.iter().map(|f| f.size).sum();
    Ok(DownloadReport { files, bytes })
}

fn write_files_json(job_dir: &Path, files: &[DownloadedFile]) -> Result<(), StepError> {
    let path = job_dir.join(SYSTEM_DIR).join(FILES_JSON);
    let text = serde_json::to_vec_pretty(files)
        .map_err(|e| format!("cannot encode {}: {e}", path.display()))?;
    std::fs::write(&path, text)
        .map_err(|e| StepError::io(format_args!("write {}", path.display()), &e))
}

/// Runs blocking file-system work (unpacking and hashing containers among
/// it) on the bulk threads ([`crate::bulk`]).
async fn blocking<T, F>(f: F) -> Result<T, StepError>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, StepError> + Send + 'static,
{
    crate::bulk::spawn(f)
        .await
        .unwrap_or_else(|e| Err(StepError::permanent(format!("a file task failed: {e}"))))
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use axum::routing::get;
    use axum::Router;
    use ingest_events::event::FailureKind;
    use ingest_steps::digest::MultiHasher;
    use ingest_steps::forms::FileDigest;

    use super::super::fetch::test_server::serve;
    use super::super::RealArgs;
    use super::*;

    const ONE: &[u8] = b"first file\n";
    const TWO: &[u8] = b"second file, a little longer\n";

    fn hex(algorithm: Algorithm, bytes: &[u8]) -> String {
        let mut h = MultiHasher::new(&[algorithm]);
        h.update(bytes);
        h.finish().remove(0).1
    }

    fn config(work: &Path) -> Arc<RealConfig> {
        Arc::new(RealConfig {
            work_dir: work.to_path_buf(),
            args: RealArgs {
                step_retries: 2,
                retry_backoff_ms: 1,
                max_object_bytes: 1 << 20,
                max_object_files: 10,
                transfers_per_job: 2,
                transfers: 4,
                ..RealArgs::default()
            },
            profiles: Default::default(),
        })
    }

    fn spec(url: String, name: &str, digest: Option<(&str, String)>) -> FileSpec {
        FileSpec {
            url,
            name: name.into(),
            size: None,
            digest: digest.map(|(algorithm, value)| FileDigest {
                algorithm: algorithm.into(),
                value,
            }),
            mime_type: None,
        }
    }

    /// A zip of stored entries, written by hand (the root crate does not
    /// depend on the zip crate).
    fn zip(entries: &[(&str, &[u8])]) -> Vec<u8> {
        fn crc32(bytes: &[u8]) -> u32 {
            let mut crc = !0u32;
            for &b in bytes {
                crc ^= u32::from(b);
                for _ in 0..8 {
                    crc = if crc & 1 == 1 {
                        (crc >> 1) ^ 0xEDB8_8320
                    } else {
                        crc >> 1
                    };
                }
            }
            !crc
        }
        let mut out = Vec::new();
        let mut central = Vec::new();
        for (name, data) in entries {
            let offset = out.len() as u32;
            let (crc, len, name_len) = (crc32(data), data.len() as u32, name.len() as u16);
            // Local header: signature, version 2.0, no flags, stored,
            // time 0, date 1980-01-01.
            out.extend_from_slice(&0x0403_4b50u32.to_le_bytes());
            for v in [20u16, 0, 0, 0, 0x21] {
                out.extend_from_slice(&v.to_le_bytes());
            }
            for v in [crc, len, len] {
                out.extend_from_slice(&v.to_le_bytes());
            }
            out.extend_from_slice(&name_len.to_le_bytes());
            out.extend_from_slice(&0u16.to_le_bytes());
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(data);
            central.extend_from_slice(&0x0201_4b50u32.to_le_bytes());
            for v in [20u16, 20, 0, 0, 0, 0x21] {
                central.extend_from_slice(&v.to_le_bytes());
            }
            for v in [crc, len, len] {
                central.extend_from_slice(&v.to_le_bytes());
            }
            for v in [name_len, 0, 0, 0, 0] {
                central.extend_from_slice(&v.to_le_bytes());
            }
            central.extend_from_slice(&0u32.to_le_bytes());
            central.extend_from_slice(&offset.to_le_bytes());
            central.extend_from_slice(name.as_bytes());
        }
        let (cd_offset, cd_len, n) = (out.len() as u32, central.len() as u32, entries.len() as u16);
        out.extend_from_slice(&central);
        out.extend_from_slice(&0x0605_4b50u32.to_le_bytes());
        for v in [0u16, 0, n, n] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&cd_len.to_le_bytes());
        out.extend_from_slice(&cd_offset.to_le_bytes());
        out.extend_from_slice(&0u16.to_le_bytes());
        out
    }

    /// `/one`, `/two`, `/object.zip`, `/evil.zip`; `calls` counts every
    /// request.
    async fn server() -> (String, Arc<AtomicUsize>) {
        let calls = Arc::new(AtomicUsize::new(0));
        let good = zip(&[("data/a.txt", ONE), ("b.txt", TWO)]);
        let evil = zip(&[("ok.txt", ONE), ("../evil", TWO)]);
        let counter = Arc::clone(&calls);
        let router = Router::new()
            .route("/one", get(|| async { ONE }))
            .route("/two", get(|| async { TWO }))
            .route("/object.zip", get(move || async move { good }))
            .route("/evil.zip", get(move || async move { evil }))
            .layer(axum::middleware::from_fn(
                move |req: axum::extract::Request, next: axum::middleware::Next| {
                    counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    next.run(req)
                },
            ));
        (serve(router).await, calls)
    }

    struct Setup {
        base: String,
        calls: Arc<AtomicUsize>,
        fetcher: Arc<Fetcher>,
        config: Arc<RealConfig>,
        work: tempfile::TempDir,
    }

    impl Setup {
        async fn new() -> Setup {
            let (base, calls) = server().await;
            let work = tempfile::tempdir().expect("tempdir");
            Setup {
                base,
                calls,
                fetcher: Arc::new(Fetcher::for_tests(None)),
                config: config(work.path()),
                work,
            }
        }

        fn url(&self, path: &str) -> String {
            format!("{}/{path}", self.base)
        }

        fn job_dir(&self) -> PathBuf {
            self.work.path().join("bid1/jid1")
        }

        async fn download(
            &self,
            files: &[FileSpec],
            kind: ObjectKind,
            single: Option<Expected>,
        ) -> Result<DownloadReport, String> {
            self.download_or_failure(files, kind, single)
                .await
                .map_err(|f| f.to_string())
        }

        async fn download_or_failure(
            &self,
            files: &[FileSpec],
            kind: ObjectKind,
            single: Option<Expected>,
        ) -> Result<DownloadReport, StepError> {
            download_object(
                &self.fetcher,
                &self.config,
                files,
                kind,
                single,
                &self.job_dir(),
                None,
            )
            .await
        }
    }

    #[tokio::test]
    async fn two_files_are_downloaded_and_their_digests_verified() {
        let s = Setup::new().await;
        // A stale file of an earlier attempt must go.
        let stale = s.job_dir().join("producer/stale.txt");
        std::fs::create_dir_all(stale.parent().expect("parent")).expect("mkdir");
        std::fs::write(&stale, b"old").expect("write");
        let files = [
            spec(
                s.url("one"),
                "dir/one.txt",
                Some(("sha256", hex(Algorithm::Sha256, ONE))),
            ),
            spec(
                s.url("two"),
                "two.txt",
                Some(("md5", hex(Algorithm::Md5, TWO).to_uppercase())),
            ),
        ];
        let report = s
            .download(&files, ObjectKind::Files, None)
            .await
            .expect("download");
        assert_eq!(report.bytes, (ONE.len() + TWO.len()) as u64);
        assert_eq!(report.files[0].name, "dir/one.txt");
        assert_eq!(report.files[1].digests["md5"], hex(Algorithm::Md5, TWO));
        assert_eq!(
            report.files[1].digests["sha256"],
            hex(Algorithm::Sha256, TWO)
        );
        // OCFL's digest, computed on the way for the storing step's check.
        assert_eq!(
            report.files[0].digests["sha512"],
            hex(Algorithm::Sha512, ONE)
        );
        let producer = s.job_dir().join("producer");
        assert_eq!(
            std::fs::read(producer.join("dir/one.txt")).expect("one"),
            ONE
        );
        assert_eq!(std::fs::read(producer.join("two.txt")).expect("two"), TWO);
        assert!(!stale.exists());
        // Each file's stamp as it lies, recorded for the storing step where
        // every later change would move it.
        let listed = read_files_json(&s.job_dir()).expect("files.json");
        for (file, path) in listed.iter().zip(["dir/one.txt", "two.txt"]) {
            let path = producer.join(path);
            let now = FileStamp::of_path(&path).expect("stamp");
            let kept = stamp::changes_always_seen(&path).then_some(now);
            assert_eq!(file.stamp, kept, "{}", path.display());
        }
        assert_eq!(read_files_json(&s.job_dir()), Ok(report.files));
    }

    #[tokio::test]
    async fn a_digest_mismatch_fails_naming_the_url() {
        let s = Setup::new().await;
        let wrong = "0".repeat(64);
        let files = [spec(
            s.url("two"),
            "two.txt",
            Some(("sha256", wrong.clone())),
        )];
        let err = s
            .download_or_failure(&files, ObjectKind::Files, None)
            .await
            .expect_err("mismatch");
        // A manifest line's digest: an ordinary failure (the manifest can be
        // corrected at its URL and the job requeued).
        assert_eq!(
            err,
            StepError::from(format!(
                "{}: sha256 mismatch: expected {wrong}, got {}",
                s.url("two"),
                hex(Algorithm::Sha256, TWO)
            ))
        );
        // The depositor's digest of a single-file payload: unrecoverable,
        // whether the file is the object or a container of it.
        let single = Expected {
            algorithm: Algorithm::Sha1,
            value: "1".repeat(40),
        };
        let files = [spec(s.url("one"), "one", None)];
        for kind in [ObjectKind::Files, ObjectKind::Container] {
            let err = s
                .download_or_failure(&files, kind, Some(single.clone()))
                .await
                .expect_err("mismatch");
            assert_eq!(err.kind(), Some(FailureKind::DigestMismatch), "{kind:?}");
            assert!(
                err.message()
                    .starts_with(&format!("{}: sha1 mismatch", s.url("one")))
                    && err.message().ends_with("a new submission is required"),
                "{err}"
            );
        }
        let right = Expected {
            algorithm: Algorithm::Sha1,
            value: hex(Algorithm::Sha1, ONE),
        };
        let ok = s
            .download(&files, ObjectKind::Files, Some(right))
            .await
            .expect("match");
        assert_eq!(ok.files[0].digests.len(), 3, "sha1, sha256 and sha512");
    }

    #[tokio::test]
    async fn a_404_fails_naming_the_url() {
        let s = Setup::new().await;
        let files = [
            spec(s.url("one"), "one", None),
            spec(s.url("nothing-here"), "two", None),
        ];
        let err = s
            .download(&files, ObjectKind::Files, None)
            .await
            .expect_err("404");
        assert_eq!(
            err,
            format!("GET {} returned 404 Not Found", s.url("nothing-here"))
        );
        assert!(!s.job_dir().join("producer/two.part").exists());
    }

    #[tokio::test]
    async fn a_zip_container_is_unpacked() {
        let s = Setup::new().await;
        let files = [spec(s.url("object.zip"), "object.zip", None)];
        let report = s
            .download(&files, ObjectKind::Container, None)
            .await
            .expect("unpack");
        let names: Vec<_> = report.files.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["data/a.txt", "b.txt"]);
        assert_eq!(report.bytes, (ONE.len() + TWO.len()) as u64);
        assert_eq!(
            report.files[0].digests["sha256"],
            hex(Algorithm::Sha256, ONE)
        );
        let producer = s.job_dir().join("producer");
        assert_eq!(std::fs::read(producer.join("data/a.txt")).expect("a"), ONE);
        assert!(!s.job_dir().join(CONTAINER_FILE).exists());
        let listed = read_files_json(&s.job_dir()).expect("files.json");
        assert_eq!(listed.len(), 2);
        let a = producer.join("data/a.txt");
        let now = FileStamp::of_path(&a).expect("stamp");
        let kept = stamp::changes_always_seen(&a).then_some(now);
        assert_eq!(listed[0].stamp, kept, "an unpacked file has its stamp");
    }

    #[tokio::test]
    async fn a_zip_with_a_parent_component_is_refused() {
        let s = Setup::new().await;
        let url = s.url("evil.zip");
        let files = [spec(url.clone(), "evil.zip", None)];
        let err = s
            .download(&files, ObjectKind::Container, None)
            .await
            .expect_err("traversal");
        assert!(err.starts_with(&format!("container {url}:")), "{err}");
        assert!(err.contains("../evil"), "{err}");
        assert!(!s.work.path().join("bid1/evil").exists());
    }

    #[tokio::test]
    async fn an_oversize_object_is_refused_before_downloading() {
        let s = Setup::new().await;
        let mut big = spec(s.url("one"), "one", None);
        big.size = Some(2 << 20);
        let err = s
            .download(&[big], ObjectKind::Files, None)
            .await
            .expect_err("oversize");
        assert_eq!(
            err,
            format!(
                "the object is {} bytes (declared), larger than the limit of {} bytes",
                2 << 20,
                1 << 20
            )
        );
        let many: Vec<_> = (0..11)
            .map(|i| spec(s.url("one"), &format!("f{i}"), None))
            .collect();
        let err = s
            .download(&many, ObjectKind::Files, None)
            .await
            .expect_err("too many");
        assert!(
            err.contains("11 files") && err.contains("limit of 10"),
            "{err}"
        );
        assert_eq!(s.calls.load(std::sync::atomic::Ordering::SeqCst), 0);

        // Undeclared sizes are caught while downloading.
        let small = Arc::new(RealConfig {
            args: RealArgs {
                max_object_bytes: 5,
                ..s.config.args.clone()
            },
            ..(*s.config).clone()
        });
        let files = [spec(s.url("one"), "one", None)];
        let err = download_object(
            &s.fetcher,
            &small,
            &files,
            ObjectKind::Files,
            None,
            &s.job_dir(),
            None,
        )
        .await
        .expect_err("too large");
        assert!(
            err.message().contains("larger than the limit of 5 bytes"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn unsafe_and_repeated_names_are_refused() {
        let s = Setup::new().await;
        let err = s
            .download(&[spec(s.url("one"), "../x", None)], ObjectKind::Files, None)
            .await
            .expect_err("unsafe");
        assert!(
            err.contains("unsafe file name") && err.contains(&s.url("one")),
            "{err}"
        );
        let twice = [
            spec(s.url("one"), "a", None),
            spec(s.url("two"), "./a", None),
        ];
        let err = s
            .download(&twice, ObjectKind::Files, None)
            .await
            .expect_err("twice");
        assert!(err.contains("listed twice"), "{err}");
    }
}
