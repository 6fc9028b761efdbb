//! The batch daemons' work: expanding a pending batch's payload into jobs
//! (the Merritt forms) and sending a finished batch's report (callback and
//! e-mail).
//!
//! Expansion reads the submission (`/batches/BID/submission`):
//!
//! - inline manifest lines (`URL [LOCAL_ID [ARK]]`), a `file` or a
//!   `container`: the server's own simple expansion
//!   ([`ingest_protocol::submission::expand_simple`]), one job per line or one job;
//! - an `object-manifest`: the manifest is fetched and checked now, so that
//!   a corrupt one fails the batch at once; one job, whose payload stays the
//!   manifest URL;
//! - a `single-file-batch-manifest`, `container-batch-manifest` or
//!   `batch-manifest`: the manifest is fetched (with retries) and each line
//!   becomes a job (a `file`, a `container` or an `object-manifest`).
//!
//! Each job is the JSON the acquire route takes: `payload_url`,
//! `payload_type`, `primary_id`?, `local_ids`, `erc_who`?, `erc_what`?,
//! `erc_when`?, `erc_where`?, `digest`? (`ALGORITHM:HEX`).

use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;

use ingest_events::command::JobSpec;
use ingest_events::event::{
    Digest, Erc, FailureKind, Identifiers, PayloadType, Submission, SubmissionMode,
};
use ingest_events::Jid;
use ingest_projections::layout::{self, BatchSet};
use ingest_protocol::api::JobBody;
use ingest_protocol::callback::BatchCallback;
use ingest_protocol::node::{
    decode, BatchStatusNode, IdentifiersNode, JobStatusNode, SubmissionNode,
};
use ingest_steps::checkm;
use ingest_steps::forms::{self, Form, ObjectKind};
use serde_json::Value;

use super::fetch::{Fetcher, RetryPolicy};
use super::mail::Outbox;
use super::notify::{Mail, Teller};
use super::RealConfig;
use crate::step::{BatchCtx, BatchFuture, BatchWork, Expansion};
use ingest_config::Profile;

/// Why a batch's submission did not expand, or its report could not be
/// gathered.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BatchError {
    /// The submission's `type` is not a payload type.
    #[error("the submission's type: {0}")]
    SubmissionType(ingest_events::event::UnknownName),
    /// The submission's `submission_mode` is not a mode.
    #[error("the submission's submission_mode: {0}")]
    SubmissionMode(ingest_events::event::UnknownName),
    /// A payload type without a form.
    #[error("the submission's type {0:?} has no form")]
    NoForm(String),
    /// A manifest form without a payload URL.
    #[error("the {0} submission has no payload_url")]
    NoPayloadUrl(&'static str),
    /// The manifest could not be fetched.
    #[error("cannot fetch the manifest: {0}")]
    Fetch(#[source] super::fetch::FetchError),
    /// The manifest at `url` is not one of its form.
    #[error("manifest {url}: {source}")]
    Manifest {
        /// The manifest's URL.
        url: String,
        /// Why.
        source: Box<BatchError>,
    },
    /// A manifest that does not parse, or is not of its form.
    #[error(transparent)]
    Checkm(#[from] ingest_steps::checkm::ManifestError),
    /// A simple submission that does not expand.
    #[error(transparent)]
    Expand(#[from] ingest_protocol::submission::SubmissionError),
    /// A node could not be read.
    #[error("cannot read {path}: {detail}")]
    Read {
        /// The node.
        path: String,
        /// Why, with the attempts.
        detail: String,
    },
    /// A node's children could not be listed.
    #[error("cannot list {path}: {detail}")]
    List {
        /// The node.
        path: String,
        /// Why, with the attempts.
        detail: String,
    },
    /// A node that must exist does not.
    #[error("{0} does not exist")]
    Missing(String),
    /// A node that does not decode.
    #[error(transparent)]
    Node(#[from] ingest_protocol::node::NodeError),
}

/// The largest manifest fetched (the Checkm parser's own default limit).
pub const MAX_MANIFEST_BYTES: u64 = 64 * 1024 * 1024;
/// The most bytes of a batch's failure message quoted in a report
/// e-mail's subject (the body has it whole).
const SUBJECT_MESSAGE_BYTES: usize = 160;

/// Expansion and reporting of batches.
pub struct Batches {
    fetcher: Arc<Fetcher>,
    config: Arc<RealConfig>,
    teller: Teller,
}

impl Batches {
    /// The batch work: manifests through `fetcher`, mail through the outbox
    /// and SMTP server of `config`.
    ///
    /// # Errors
    /// A bad mail setting (an SMTP URL lettre cannot use, an invalid sender).
    pub fn new(fetcher: Arc<Fetcher>, config: Arc<RealConfig>) -> anyhow::Result<Batches> {
        let teller = Teller::new(Arc::clone(&fetcher), &config).map_err(anyhow::Error::msg)?;
        Ok(Batches {
            fetcher,
            config,
            teller,
        })
    }

    /// The outbox report and summary e-mails go to.
    pub fn outbox(&self) -> &Outbox {
        self.teller.outbox()
    }

    /// Expands the submission of batch `bid` (the JSON of
    /// `/batches/BID/submission`) into jobs, fetching its manifest when it
    /// has one, and e-mails the summary at queueing when the profile asks
    /// for it.
    pub async fn expand_submission(&self, bid: &str, submission: &SubmissionNode) -> Expansion {
        let jobs = match self.jobs_of(submission).await {
            Ok(jobs) => jobs,
            Err(e) => {
                tracing::warn!(%bid, error = %ingest_protocol::bounded(&e), "the batch's payload does not expand");
                return Expansion::Failed(e.to_string());
            }
        };
        if !jobs.is_empty() {
            self.summary_at_queueing(bid, submission, &jobs).await;
        }
        Expansion::Jobs(jobs)
    }

    async fn jobs_of(&self, submission: &SubmissionNode) -> Result<Vec<JobBody>, BatchError> {
        let has_lines = !submission.manifest.is_empty();
        let form = submission_form(submission)?;
        if has_lines || !form.is_manifest() {
            return jobs_from_submission(submission);
        }
        let url = set(&submission.payload_url).ok_or(BatchError::NoPayloadUrl(form.name()))?;
        let bytes = self
            .fetcher
            .with_retries(&self.config.retry(), None, "manifest", || {
                self.fetcher.get_bytes(url, MAX_MANIFEST_BYTES)
            })
            .await
            .map_err(BatchError::Fetch)?;
        jobs_from_manifest(&bytes, form, submission).map_err(|e| BatchError::Manifest {
            url: url.to_string(),
            source: Box::new(e),
        })
    }

    async fn summary_at_queueing(&self, bid: &str, submission: &SubmissionNode, jobs: &[JobBody]) {
        let Some(profile) = self.profile(submission) else {
            return;
        };
        let n = &profile.notification;
        if !n.summary_at_queueing || n.emails.is_empty() {
            return;
        }
        let (subject, body) = summary_text(bid, jobs);
        // Expansion cannot report a mail error (the batch is not at fault):
        // the outbox keeps the message when SMTP fails, and the log says so.
        match self.teller.outbox().send(&n.emails, &subject, &body).await {
            Ok(delivery) => tracing::info!(%bid, ?delivery, "summary at queueing sent"),
            Err(e) => {
                tracing::warn!(%bid, error = %ingest_protocol::bounded(&e), "cannot send the summary at queueing")
            }
        }
    }

    fn profile(&self, submission: &SubmissionNode) -> Option<&Profile> {
        self.config.profiles.get(submission.profile_name.trim())
    }

    /// Sends the report of batch `bid`: a POST of [`report_json`] to the
    /// profile's callback URL (with retries) and an e-mail of
    /// [`report_text`] to the profile's recipients.
    ///
    /// # Errors
    /// `Some` with every failure (a callback that still fails, a message
    /// neither sent nor written to the outbox, or one written to the outbox
    /// because SMTP failed), joined by `; `; `None` when everything was
    /// sent.
    pub async fn send_report(
        &self,
        report: &Report<'_>,
        submission: &SubmissionNode,
    ) -> Option<String> {
        let n = &self.profile(submission)?.notification;
        let body = report_json(report, submission);
        let (subject, text) = report_text(report);
        let mail = Mail {
            what: "the report e-mail",
            subject: &subject,
            text: &text,
        };
        self.teller.tell(n, &body, mail).await
    }

    async fn report_batch(&self, batch: &BatchCtx) -> Option<String> {
        let policy = self.config.retry();
        let bid = batch.bid;
        let gathered = async {
            let status: BatchStatusNode = read_typed(
                &batch.zk,
                &layout::batch_status(bid),
                "/batches/BID/status",
                policy,
            )
            .await?;
            let submission: SubmissionNode = read_typed(
                &batch.zk,
                &layout::batch_submission(bid),
                "/batches/BID/submission",
                policy,
            )
            .await?;
            let mut jobs = Vec::new();
            for (set, status) in [
                (BatchSet::Completed, "Completed"),
                (BatchSet::Failed, "Failed"),
            ] {
                let path = layout::batch_set(bid, set);
                let names = read_children(&batch.zk, &path, policy).await?;
                // Only job ids: the projection writes no other child there.
                let mut jids: Vec<Jid> = names.iter().filter_map(|n| n.parse().ok()).collect();
                jids.sort();
                for jid in jids {
                    jobs.push(read_report_job(&batch.zk, jid, status, policy).await?);
                }
            }
            for job in &mut jobs {
                job.message = without_working_paths(&job.message, &self.config.work_dir);
            }
            let status = set(&status.status).unwrap_or("Reporting").to_string();
            Ok::<_, BatchError>((status, submission, jobs))
        };
        match gathered.await {
            Ok((status, submission, jobs)) => {
                let bid = bid.to_string();
                let report = Report {
                    bid: &bid,
                    status: &status,
                    message: None,
                    jobs: &jobs,
                };
                self.send_report(&report, &submission).await
            }
            Err(e) => Some(format!("cannot gather the report of {bid}: {e}")),
        }
    }

    async fn report_failed(&self, batch: &BatchCtx, message: &str) -> Option<String> {
        let bid = batch.bid;
        let submission: SubmissionNode = match read_typed(
            &batch.zk,
            &layout::batch_submission(bid),
            "/batches/BID/submission",
            self.config.retry(),
        )
        .await
        {
            Ok(s) => s,
            Err(e) => return Some(format!("cannot read the submission of {bid}: {e}")),
        };
        let message = without_working_paths(message, &self.config.work_dir);
        let bid = bid.to_string();
        let report = Report {
            bid: &bid,
            status: "Failed",
            message: Some(&message),
            jobs: &[],
        };
        self.send_report(&report, &submission).await
    }
}

/// One batch report, as e-mailed and POSTed to the callback URL.
#[derive(Debug, Clone, Copy)]
pub struct Report<'a> {
    /// The batch.
    pub bid: &'a str,
    /// Its status: `Reporting`, `UpdateReporting`, or `Failed` for a batch
    /// that failed as it was acquired.
    pub status: &'a str,
    /// Why the batch failed as a whole, when it did without jobs.
    pub message: Option<&'a str>,
    /// Every job.
    pub jobs: &'a [ReportJob],
}

impl BatchWork for Batches {
    fn expand<'a>(&'a self, batch: &'a BatchCtx) -> BatchFuture<'a, Expansion> {
        Box::pin(async move {
            let path = layout::batch_submission(batch.bid);
            let read = read_typed(
                &batch.zk,
                &path,
                "/batches/BID/submission",
                self.config.retry(),
            );
            match read.await {
                Ok(submission) => {
                    self.expand_submission(&batch.bid.to_string(), &submission)
                        .await
                }
                Err(e) => Expansion::Failed(e.to_string()),
            }
        })
    }

    fn report<'a>(&'a self, batch: &'a BatchCtx) -> BatchFuture<'a, Option<String>> {
        Box::pin(self.report_batch(batch))
    }

    fn failed<'a>(
        &'a self,
        batch: &'a BatchCtx,
        message: &'a str,
    ) -> BatchFuture<'a, Option<String>> {
        Box::pin(self.report_failed(batch, message))
    }
}

pub use ingest_protocol::callback::ReportJob;

/// The report e-mail: subject `ingest batch BID: N completed, M failed`
/// and a body listing every job (jid, status, ark, local ids, message).
///
/// The report sent again after a requeue (`batch_status`
/// `UpdateReporting`) says so: subject `ingest batch BID (updated report):
/// …` and a body that starts `Updated report of batch BID`, so a depositor
/// can tell it from the first one.
///
/// A batch that failed as a whole ([`Report::message`]): subject `ingest
/// batch BID failed: MESSAGE` (cut, on one line) and a body that starts
/// with the message.
pub fn report_text(report: &Report<'_>) -> (String, String) {
    let Report {
        bid,
        status: batch_status,
        message,
        jobs,
    } = *report;
    let completed = jobs.iter().filter(|j| j.status == "Completed").count();
    let failed = jobs.len() - completed;
    let update = batch_status == "UpdateReporting";
    let subject = match (message, update) {
        (Some(m), _) => {
            let line: String = m
                .chars()
                .map(|c| if c.is_control() { ' ' } else { c })
                .collect();
            format!(
                "ingest batch {bid} failed: {}",
                ingest_protocol::cut(&line, SUBJECT_MESSAGE_BYTES)
            )
        }
        (None, true) => {
            format!("ingest batch {bid} (updated report): {completed} completed, {failed} failed")
        }
        (None, false) => format!("ingest batch {bid}: {completed} completed, {failed} failed"),
    };
    let mut body = match (message, update) {
        (Some(m), _) => format!(
            "Batch {bid} failed: {m}\n\nNo job was created; a corrected submission is required.\n"
        ),
        (None, true) => format!(
            "Updated report of batch {bid} (jobs were requeued after the first report): \
             {completed} completed, {failed} failed.\n"
        ),
        (None, false) => format!("Batch {bid}: {completed} completed, {failed} failed.\n"),
    };
    for job in jobs {
        let _ = write!(
            body,
            "\n{} {}\n  ark: {}\n",
            job.jid,
            job.status,
            job.ark.as_deref().unwrap_or("(none)")
        );
        if !job.local_ids.is_empty() {
            let _ = writeln!(body, "  local ids: {}", job.local_ids.join("; "));
        }
        if !job.message.is_empty() {
            let _ = writeln!(body, "  message: {}", job.message);
        }
        if let Some(kind) = job.failure.as_deref() {
            let _ = match kind.parse::<FailureKind>() {
                Ok(k) => writeln!(body, "  failure: {k}: {}; {}", k.explanation(), k.remedy()),
                Err(_) => writeln!(body, "  failure: {}", ingest_protocol::cut(kind, 64)),
            };
        }
    }
    (subject, body)
}

/// `message` with every path into working storage `work_dir` (as given,
/// canonical, or as a `file://` URL) taken out: a job's own directory
/// `WORK/BID/JID/producer/NAME` becomes the depositor's file name `NAME`,
/// `WORK/BID/JID/system/NAME` becomes `system/NAME`, the directory itself
/// "the job's working files", and any other path under it "working
/// storage". Reports go to depositors and curators, who know their files by
/// the names they gave; the paths of the ingest host are not theirs to see.
pub fn without_working_paths(message: &str, work_dir: &Path) -> String {
    let mut roots: Vec<String> = Vec::new();
    for dir in [
        Some(work_dir.to_path_buf()),
        std::fs::canonicalize(work_dir).ok(),
    ]
    .into_iter()
    .flatten()
    {
        if let Ok(url) = reqwest::Url::from_directory_path(&dir) {
            roots.push(url.as_str().trim_end_matches('/').to_string());
        }
        let shown = dir.display().to_string();
        let shown = shown.trim_end_matches('/');
        if !shown.is_empty() {
            roots.push(shown.to_string());
        }
    }
    // Longest first, so a URL or a longer path is replaced before a path
    // it contains.
    roots.sort_by_key(|r| std::cmp::Reverse(r.len()));
    roots.dedup();
    let mut out = message.to_string();
    for root in &roots {
        let mut rest = out.as_str();
        let mut scrubbed = String::with_capacity(out.len());
        while let Some(at) = rest.find(root.as_str()) {
            scrubbed.push_str(&rest[..at]);
            let after = &rest[at + root.len()..];
            // WORK/BID/JID[/producer|/system]/…
            let segments: Vec<&str> = after
                .strip_prefix('/')
                .map(|a| a.splitn(4, '/').collect())
                .unwrap_or_default();
            // A path ends at white space, a quote, a bracket, a comma or
            // semicolon, or a colon that ends a clause (`PATH: error`).
            let end = |a: &str| {
                a.char_indices()
                    .find(|&(i, c)| {
                        c.is_whitespace()
                            || "\"'(),;".contains(c)
                            || (c == ':'
                                && a[i + 1..].chars().next().is_none_or(char::is_whitespace))
                    })
                    .map_or(a.len(), |(i, _)| i)
            };
            match segments.as_slice() {
                [_, _, "producer", tail] => {
                    let n = end(tail);
                    scrubbed.push_str(&tail[..n]);
                    rest = &tail[n..];
                }
                [_, _, "system", tail] => {
                    let n = end(tail);
                    scrubbed.push_str("system/");
                    scrubbed.push_str(&tail[..n]);
                    rest = &tail[n..];
                }
                _ => {
                    let n = end(after);
                    scrubbed.push_str(match after[..n].matches('/').count() {
                        2 | 3 => "the job's working files",
                        _ => "working storage",
                    });
                    rest = &after[n..];
                }
            }
        }
        scrubbed.push_str(rest);
        out = scrubbed;
    }
    out
}

/// The report POSTed to the profile's callback URL.
pub fn report_json(report: &Report<'_>, submission: &SubmissionNode) -> BatchCallback {
    let jobs = report.jobs;
    let completed = jobs.iter().filter(|j| j.status == "Completed").count();
    BatchCallback {
        bid: report.bid.to_string(),
        status: report.status.to_string(),
        message: report.message.map(str::to_string),
        profile: set(&submission.profile_name).map(str::to_string),
        submitter: set(&submission.submitter).map(str::to_string),
        completed,
        failed: jobs.len() - completed,
        jobs: jobs.to_vec(),
    }
}

/// The summary e-mail at queueing: subject `ingest batch BID queued: N
/// jobs` and one line per job.
pub fn summary_text(bid: &str, jobs: &[JobBody]) -> (String, String) {
    let subject = format!(
        "ingest batch {bid} queued: {} job{}",
        jobs.len(),
        if jobs.len() == 1 { "" } else { "s" }
    );
    let mut body = format!("Batch {bid} was queued with {} job(s):\n\n", jobs.len());
    for job in jobs {
        let _ = write!(body, "- {} ({})", job.payload_url, job.payload_type);
        if let Some(ark) = job.primary_id.as_deref().and_then(set) {
            let _ = write!(body, " ark {ark}");
        }
        if !job.local_ids.is_empty() {
            let _ = write!(body, " local ids {}", job.local_ids.join("; "));
        }
        body.push('\n');
    }
    (subject, body)
}

/// The form a submission's `type` names.
///
/// # Errors
/// A missing or unknown type.
pub fn submission_form(submission: &SubmissionNode) -> Result<Form, BatchError> {
    let name = submission_type(submission).unwrap_or("file");
    let payload: PayloadType = name.parse().map_err(BatchError::SubmissionType)?;
    Form::ALL
        .into_iter()
        .find(|f| f.name() == payload.name())
        .ok_or_else(|| BatchError::NoForm(name.to_string()))
}

/// The jobs of a manifest of form `form`: one per object. An object manifest
/// gives one job whose payload stays the submission's (the manifest URL),
/// with the submission's identifiers and ERC; each line of a batch manifest
/// gives a job of its own (its file, container or object manifest URL, the
/// line's ark, local ids, digest and ERC, falling back to the submission's
/// ERC who/what/when).
///
/// # Errors
/// The parser's or the form's `line N: …` message: a corrupt manifest, a
/// missing `#%eof`, a wrong field count, a wrong or missing profile, no
/// entries.
pub fn jobs_from_manifest(
    bytes: &[u8],
    form: Form,
    submission: &SubmissionNode,
) -> Result<Vec<JobBody>, BatchError> {
    let manifest = checkm::parse(bytes)?;
    let objects = forms::objects(&manifest, form)?;
    if form == Form::ObjectManifest {
        // The whole manifest is one object, read again by the job's steps.
        return jobs_from_submission(submission);
    }
    let fallback = erc_of(submission);
    let specs = objects.into_iter().map(|object| {
        let file = object.files.into_iter().next();
        let payload_type = match object.kind {
            ObjectKind::Files => PayloadType::File,
            ObjectKind::Container => PayloadType::Container,
            ObjectKind::ObjectManifest => PayloadType::ObjectManifest,
        };
        let r#where = match object.local_ids.is_empty() {
            true => None,
            false => Some(object.local_ids.join(";")),
        };
        JobSpec {
            payload_url: file.as_ref().map(|f| f.url.clone()).unwrap_or_default(),
            payload_type,
            identifiers: Identifiers {
                primary_id: object.primary_id,
                local_ids: object.local_ids,
            },
            metadata: Erc {
                who: object.who.or_else(|| fallback.who.clone()),
                what: object.what.or_else(|| fallback.what.clone()),
                when: object.when.or_else(|| fallback.when.clone()),
                r#where,
            },
            digest: file.and_then(|f| f.digest).map(|d| Digest {
                algorithm: d.algorithm,
                value: d.value,
            }),
            priority: None,
        }
    });
    Ok(specs.map(|s| job_body(&s)).collect())
}

/// The jobs of the simple forms, exactly as the server expands them
/// ([`ingest_protocol::submission::expand_simple`]): one per inline manifest line, or
/// one for the payload URL.
///
/// # Errors
/// A submission that is not what the projection writes, or an inline line
/// with too many fields (named).
pub fn jobs_from_submission(submission: &SubmissionNode) -> Result<Vec<JobBody>, BatchError> {
    let s = submission_of(submission)?;
    let specs = ingest_protocol::submission::expand_simple(&s)?;
    Ok(specs.iter().map(job_body).collect())
}

/// The acquire route's body for one job.
fn job_body(spec: &JobSpec) -> JobBody {
    let nonempty = |v: &Option<String>| v.as_deref().and_then(set).map(str::to_string);
    let erc = &spec.metadata;
    JobBody {
        payload_url: spec.payload_url.clone(),
        payload_type: spec.payload_type.name().to_string(),
        primary_id: nonempty(&spec.identifiers.primary_id),
        local_ids: spec.identifiers.local_ids.clone(),
        erc_who: nonempty(&erc.who),
        erc_what: nonempty(&erc.what),
        erc_when: nonempty(&erc.when),
        erc_where: nonempty(&erc.r#where),
        digest: spec
            .digest
            .as_ref()
            .map(|d| format!("{}:{}", d.algorithm, d.value)),
    }
}

/// The submission the projection wrote, back as the engine's type; absent
/// and empty fields are unset.
fn submission_of(v: &SubmissionNode) -> Result<Submission, BatchError> {
    let payload_type = match submission_type(v) {
        Some(t) => t.parse().map_err(BatchError::SubmissionType)?,
        None => PayloadType::File,
    };
    let submission_mode = match set(&v.submission_mode) {
        Some(m) => m.parse().map_err(BatchError::SubmissionMode)?,
        None => SubmissionMode::Add,
    };
    let digest = match (
        v.digest_type.as_deref().and_then(set),
        v.digest_value.as_deref().and_then(set),
    ) {
        (Some(a), Some(h)) => Some(Digest {
            algorithm: a.to_ascii_lowercase(),
            value: h.to_ascii_lowercase(),
        }),
        _ => None,
    };
    Ok(Submission {
        profile_name: v.profile_name.trim().to_string(),
        submitter: v.submitter.trim().to_string(),
        payload_url: v.payload_url.trim().to_string(),
        payload_type,
        response_type: v.response_type.trim().to_string(),
        submission_mode,
        manifest: v.manifest.clone(),
        erc: erc_of(v),
        digest,
        extra: Default::default(),
    })
}

/// The submission's type: `type`, or `payload_type` as an extra field.
fn submission_type(v: &SubmissionNode) -> Option<&str> {
    set(&v.payload_type).or_else(|| {
        v.extra
            .get("payload_type")
            .and_then(Value::as_str)
            .and_then(set)
    })
}

fn erc_of(v: &SubmissionNode) -> Erc {
    let owned = |s: &str| set(s).map(str::to_string);
    Erc {
        who: owned(&v.erc_who),
        what: owned(&v.erc_what),
        when: owned(&v.erc_when),
        r#where: owned(&v.erc_where),
    }
}

/// A non-empty text (the projection writes unset fields as "").
fn set(s: &str) -> Option<&str> {
    Some(s.trim()).filter(|s| !s.is_empty())
}

/// Reads a node's data, retrying errors other than its absence; `None`
/// when it does not exist.
async fn read_node(
    zk: &zookeeper_client::Client,
    path: &str,
    policy: RetryPolicy,
) -> Result<Option<Vec<u8>>, BatchError> {
    let read = || async {
        match zk.get_data(path).await {
            Ok((data, _)) => Ok(Some(data)),
            Err(zookeeper_client::Error::NoNode) => Ok(None),
            Err(e) => Err(ZkRead(e)),
        }
    };
    crate::retry::retry(&policy, None, path, read)
        .await
        .map_err(|g| BatchError::Read {
            path: path.to_string(),
            detail: g.message(),
        })
}

/// Reads node `path` (of the kind `node`, for messages) as its type.
async fn read_typed<T: serde::de::DeserializeOwned>(
    zk: &zookeeper_client::Client,
    path: &str,
    node: &'static str,
    policy: RetryPolicy,
) -> Result<T, BatchError> {
    let data = read_node(zk, path, policy)
        .await?
        .ok_or_else(|| BatchError::Missing(path.to_string()))?;
    Ok(decode(node, &data)?)
}

async fn read_children(
    zk: &zookeeper_client::Client,
    path: &str,
    policy: RetryPolicy,
) -> Result<Vec<String>, BatchError> {
    let list = || async {
        match zk.get_children(path).await {
            Ok((children, _)) => Ok(children),
            Err(zookeeper_client::Error::NoNode) => Ok(Vec::new()),
            Err(e) => Err(ZkRead(e)),
        }
    };
    crate::retry::retry(&policy, None, path, list)
        .await
        .map_err(|g| BatchError::List {
            path: path.to_string(),
            detail: g.message(),
        })
}

/// A ZooKeeper read that failed (its absence is not a failure): retried,
/// since the session may come back.
#[derive(Debug)]
struct ZkRead(zookeeper_client::Error);

impl std::fmt::Display for ZkRead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl crate::retry::Retryable for ZkRead {
    fn is_retryable(&self) -> bool {
        true
    }
}

async fn read_report_job(
    zk: &zookeeper_client::Client,
    jid: Jid,
    set_status: &str,
    policy: RetryPolicy,
) -> Result<ReportJob, BatchError> {
    let ids_path = layout::job_identifiers(jid);
    let ids: IdentifiersNode = match read_node(zk, &ids_path, policy).await? {
        Some(d) => decode("/jobs/JID/identifiers", &d)?,
        None => IdentifiersNode::default(),
    };
    let status_path = layout::job_status(jid);
    let status: JobStatusNode = match read_node(zk, &status_path, policy).await? {
        Some(d) => decode("/jobs/JID/status", &d)?,
        None => JobStatusNode::default(),
    };
    Ok(ReportJob {
        jid: jid.to_string(),
        ark: set(&ids.primary_id).map(str::to_string),
        local_ids: ids.local_id,
        status: set(&status.status).unwrap_or(set_status).to_string(),
        message: status.message,
        failure: status.failure,
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use std::sync::Mutex;

    use axum::extract::State;
    use axum::http::StatusCode;
    use axum::routing::{get, post};
    use axum::{Json, Router};

    use super::super::RealArgs;
    use super::*;
    use ingest_config::{Notification, Profiles};

    // The Merritt samples the steps crate tests with (no machine path).
    const SAMPLES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../steps/tests/data/manifests");

    fn sample(name: &str) -> Vec<u8> {
        std::fs::read(Path::new(SAMPLES).join(name)).expect("sample manifest")
    }

    /// The submission node as a worker reads it.
    fn sub(v: &Value) -> SubmissionNode {
        serde_json::from_value(v.clone()).expect("a submission node")
    }

    /// Job bodies as JSON, to compare with what the wire carries.
    fn values(jobs: Vec<JobBody>) -> Vec<Value> {
        jobs.iter()
            .map(|j| serde_json::to_value(j).expect("json"))
            .collect()
    }

    fn submission(kind: &str, url: &str) -> Value {
        // As the projection writes it: unset fields are "".
        json!({
            "profile_name": "demo", "submitter": "alice", "payload_url": url,
            "type": kind, "response_type": "json", "submission_mode": "add",
            "erc_what": "", "erc_who": "Batch Author", "erc_when": "2024", "erc_where": "",
            "batchID": "6f1c…",
        })
    }

    #[test]
    fn the_sample_manifests_expand_one_job_per_object() {
        let s = submission("x", "http://example.org/m.checkm");
        let jobs = jobs_from_manifest(
            &sample("digest_batch.checkm"),
            Form::ContainerBatch,
            &sub(&s),
        )
        .map(values)
        .expect("jobs");
        assert_eq!(
            jobs,
            vec![json!({
                "payload_url": "http://mock-merritt-it:4567/static/test_digest.zip",
                "payload_type": "container",
                "local_ids": [],
                "erc_who": "Batch Author",
                "erc_when": "2024",
                "digest": "sha256:80a5b1dd2a8f7a28e817768f8db5ae9098e89d6330b4fd2c2ca3c600d1f97e59",
            })]
        );
        let jobs = jobs_from_manifest(
            &sample("localid2_batch.checkm"),
            Form::SingleFileBatch,
            &sub(&s),
        )
        .map(values)
        .expect("jobs");
        assert_eq!(jobs.len(), 1);
        assert_eq!(jobs[0]["payload_type"], "file");
        assert_eq!(
            jobs[0]["payload_url"],
            "http://mock-merritt-it:4567/static/hello.txt"
        );
        assert_eq!(
            jobs[0]["local_ids"],
            json!(["localidseven", "localideight", "localidnine"])
        );
        assert_eq!(
            jobs[0]["erc_where"],
            "localidseven;localideight;localidnine"
        );
        let jobs = jobs_from_manifest(
            &sample("localid_batch.checkm"),
            Form::ContainerBatch,
            &sub(&s),
        )
        .map(values)
        .expect("jobs");
        assert_eq!(jobs.len(), 1);
        assert_eq!(
            jobs[0]["local_ids"],
            json!(["localidfour", "localidfive", "localidsix"])
        );
        let object = submission("object-manifest", "http://example.org/mock_object.checkm");
        let jobs = jobs_from_manifest(
            &sample("mock_object.checkm"),
            Form::ObjectManifest,
            &sub(&object),
        )
        .map(values)
        .expect("jobs");
        assert_eq!(
            jobs,
            vec![json!({
                "payload_url": "http://example.org/mock_object.checkm",
                "payload_type": "object-manifest",
                "local_ids": [],
                "erc_who": "Batch Author",
                "erc_when": "2024",
            })]
        );
    }

    #[test]
    fn a_batch_manifest_gives_object_manifest_jobs_with_the_lines_fields() {
        let text = b"#%checkm_0.7\n\
            #%profile | http://uc3.cdlib.org/registry/ingest/manifest/mrt-batch-manifest\n\
            #%fields | nfo:fileUrl | mrt:primaryIdentifier | mrt:localIdentifier | mrt:creator | mrt:title | mrt:date\n\
            https://example.org/a.checkm | ark:/99999/fk4a | loc-a | Ann | Title A | 2001\n\
            https://example.org/b.checkm | | loc-b;loc-c | | |\n\
            #%eof\n";
        let s = submission("batch-manifest", "https://example.org/batch.checkm");
        let jobs = jobs_from_manifest(text, Form::BatchManifest, &sub(&s))
            .map(values)
            .expect("jobs");
        assert_eq!(
            jobs,
            vec![
                json!({
                    "payload_url": "https://example.org/a.checkm",
                    "payload_type": "object-manifest",
                    "primary_id": "ark:/99999/fk4a",
                    "local_ids": ["loc-a"],
                    "erc_who": "Ann", "erc_what": "Title A", "erc_when": "2001",
                    "erc_where": "loc-a",
                }),
                json!({
                    "payload_url": "https://example.org/b.checkm",
                    "payload_type": "object-manifest",
                    "local_ids": ["loc-b", "loc-c"],
                    "erc_who": "Batch Author", "erc_when": "2024",
                    "erc_where": "loc-b;loc-c",
                }),
            ]
        );
    }

    #[test]
    fn corrupt_manifests_fail_naming_the_line() {
        let s = submission("x", "u");
        let head = "#%checkm_0.7\n#%profile | http://uc3.cdlib.org/registry/ingest/manifest/mrt-single-file-batch-manifest\n#%fields | nfo:fileUrl | mrt:localIdentifier\n";
        let cases = [
            // No #%eof.
            format!("{head}https://example.org/a.txt | a\n"),
            // Too many fields.
            format!("{head}https://example.org/a.txt | a | b | c\n#%eof\n"),
            // No entries.
            format!("{head}#%eof\n"),
            // Not a URL.
            format!("{head}not a url | a\n#%eof\n"),
        ];
        for case in cases {
            let e = jobs_from_manifest(case.as_bytes(), Form::SingleFileBatch, &sub(&s))
                .map(values)
                .expect_err(&case)
                .to_string();
            assert!(e.starts_with("line "), "{e}");
        }
        // A manifest submitted as another form.
        let e = jobs_from_manifest(
            &sample("mock_object.checkm"),
            Form::ContainerBatch,
            &sub(&s),
        )
        .map(values)
        .expect_err("wrong form")
        .to_string();
        assert!(e.contains("object-manifest"), "{e}");
        assert!(
            jobs_from_manifest(b"\xff\xfe garbage", Form::ObjectManifest, &sub(&s))
                .map(values)
                .is_err()
        );
    }

    #[test]
    fn simple_forms_expand_like_the_server() {
        let mut s = submission("container", "https://example.org/a.zip");
        s["erc_where"] = json!("loc1;loc2");
        s["digest_type"] = json!("SHA256");
        s["digest_value"] = json!("ABCD");
        assert_eq!(
            jobs_from_submission(&sub(&s)).map(values).expect("jobs"),
            vec![json!({
                "payload_url": "https://example.org/a.zip", "payload_type": "container",
                "local_ids": ["loc1", "loc2"], "erc_who": "Batch Author", "erc_when": "2024",
                "erc_where": "loc1;loc2", "digest": "sha256:abcd",
            })]
        );
        let mut s = submission("file", "");
        s["manifest"] = json!([
            "https://example.org/a.txt loc-a ark:/1/a",
            "https://example.org/b.txt"
        ]);
        let jobs = jobs_from_submission(&sub(&s)).map(values).expect("jobs");
        assert_eq!(jobs.len(), 2);
        assert_eq!(jobs[0]["primary_id"], "ark:/1/a");
        assert_eq!(jobs[0]["local_ids"], json!(["loc-a"]));
        assert_eq!(jobs[1]["payload_url"], "https://example.org/b.txt");
        s["manifest"] = json!(["a b c d"]);
        assert!(jobs_from_submission(&sub(&s))
            .map(values)
            .is_err_and(|e| e.to_string().contains("manifest line 1")));
    }

    fn rep<'a>(bid: &'a str, status: &'a str, jobs: &'a [ReportJob]) -> Report<'a> {
        Report {
            bid,
            status,
            message: None,
            jobs,
        }
    }

    #[test]
    fn a_batch_that_failed_whole_is_reported_with_its_reason() {
        let report = Report {
            bid: "bid3",
            status: "Failed",
            message: Some("the payload does not expand: manifest http://x/m: line 4:\nbad"),
            jobs: &[],
        };
        let (subject, body) = report_text(&report);
        assert_eq!(
            subject,
            "ingest batch bid3 failed: the payload does not expand: manifest http://x/m: line 4: bad"
        );
        assert!(
            body.starts_with("Batch bid3 failed: the payload does not expand"),
            "{body}"
        );
        let long = "x".repeat(1000);
        let (subject, _) = report_text(&Report {
            message: Some(&long),
            ..report
        });
        assert!(subject.len() < 300, "{subject}");
    }

    #[test]
    fn the_report_text_lists_every_job() {
        let jobs = [
            ReportJob {
                jid: "jid1".into(),
                ark: Some("ark:/99999/fk4a".into()),
                local_ids: vec!["loc-a".into()],
                status: "Completed".into(),
                message: "notified nobody".into(),
                failure: None,
            },
            ReportJob {
                jid: "jid2".into(),
                ark: None,
                local_ids: vec![],
                status: "Failed".into(),
                message: "GET http://x/b returned 404 Not Found".into(),
                failure: None,
            },
            ReportJob {
                jid: "jid3".into(),
                ark: None,
                local_ids: vec![],
                status: "Failed".into(),
                message: "sha256 mismatch".into(),
                failure: Some("digest_mismatch".into()),
            },
        ];
        let (subject, body) = report_text(&rep("bid7", "Reporting", &jobs));
        assert_eq!(subject, "ingest batch bid7: 1 completed, 2 failed");
        assert_eq!(
            body,
            "Batch bid7: 1 completed, 2 failed.\n\
             \njid1 Completed\n  ark: ark:/99999/fk4a\n  local ids: loc-a\n  message: notified nobody\n\
             \njid2 Failed\n  ark: (none)\n  message: GET http://x/b returned 404 Not Found\n\
             \njid3 Failed\n  ark: (none)\n  message: sha256 mismatch\n  failure: digest_mismatch: \
             the payload's digest does not match the digest the depositor supplied; \
             it cannot be requeued: a new submission is required\n"
        );
        assert_eq!(
            report_text(&rep("bid8", "Reporting", &[])).0,
            "ingest batch bid8: 0 completed, 0 failed"
        );
    }

    #[test]
    fn the_update_report_says_it_is_an_update() {
        let (first_subject, first_body) = report_text(&rep("bid9", "Reporting", &[]));
        let (subject, body) = report_text(&rep("bid9", "UpdateReporting", &[]));
        assert_ne!(subject, first_subject);
        assert_eq!(
            subject,
            "ingest batch bid9 (updated report): 0 completed, 0 failed"
        );
        assert!(body.starts_with("Updated report of batch bid9"), "{body}");
        assert!(!first_body.contains("Updated"), "{first_body}");
    }

    #[test]
    fn report_messages_name_files_not_working_paths() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let work = tmp.path().join("work");
        std::fs::create_dir_all(&work).expect("work");
        let w = work.display().to_string();
        let url = reqwest::Url::from_directory_path(&work).expect("url");
        let u = url.as_str().trim_end_matches('/');
        for (message, want) in [
            (
                format!("producer file {w}/bid1/jid1/producer/sub/a.txt is missing"),
                "producer file sub/a.txt is missing".to_string(),
            ),
            (
                format!("cannot read {w}/bid1/jid1/system/mrt-dc.xml: denied"),
                "cannot read system/mrt-dc.xml: denied".to_string(),
            ),
            (
                format!("no storage manifest {w}/bid1/jid1/system/x (gone)"),
                "no storage manifest system/x (gone)".to_string(),
            ),
            (
                format!("kept the working directory: cannot remove {w}/bid1/jid1: busy"),
                "kept the working directory: cannot remove the job's working files: busy"
                    .to_string(),
            ),
            (
                format!("{u}/bid1/jid1/producer/b.txt and {w}/outbox"),
                "b.txt and working storage".to_string(),
            ),
            (
                "GET http://x/b returned 404".to_string(),
                "GET http://x/b returned 404".to_string(),
            ),
        ] {
            let got = without_working_paths(&message, &work);
            assert_eq!(got, want, "{message}");
            assert!(!got.contains(&w), "{got}");
        }
    }

    /// A local server: `/m` serves `manifest`, `/cb` records callback
    /// bodies and answers `cb_status`.
    #[derive(Clone)]
    struct Server {
        manifest: Arc<Vec<u8>>,
        cb_status: u16,
        bodies: Arc<Mutex<Vec<Value>>>,
    }

    async fn serve(manifest: Vec<u8>, cb_status: u16) -> (String, Server) {
        let server = Server {
            manifest: Arc::new(manifest),
            cb_status,
            bodies: Arc::default(),
        };
        async fn serve_manifest(State(s): State<Server>) -> Vec<u8> {
            s.manifest.as_ref().clone()
        }
        async fn callback(State(s): State<Server>, Json(body): Json<Value>) -> StatusCode {
            s.bodies.lock().expect("lock").push(body);
            StatusCode::from_u16(s.cb_status).unwrap_or(StatusCode::OK)
        }
        let app = Router::new()
            .route("/m", get(serve_manifest))
            .route("/cb", post(callback))
            .with_state(server.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move { axum::serve(listener, app).await });
        (format!("http://{addr}"), server)
    }

    fn batches(outbox: &Path, notification: Notification) -> Batches {
        let config = RealConfig {
            work_dir: outbox.join("work"),
            args: RealArgs {
                outbox: Some(outbox.join("outbox")),
                mail_from: "ingest@example.org".into(),
                step_retries: 2,
                retry_backoff_ms: 1,
                ..RealArgs::default()
            },
            profiles: Profiles::from_profiles([Profile {
                name: "demo".into(),
                priority: None,
                notification,
            }]),
        };
        let fetcher = Arc::new(Fetcher::for_tests(None));
        Batches::new(fetcher, Arc::new(config)).expect("batches")
    }

    fn outbox_messages(dir: &Path) -> Vec<String> {
        let mut files: Vec<_> = match std::fs::read_dir(dir) {
            Ok(rd) => rd.map(|e| e.expect("entry").path()).collect(),
            Err(_) => Vec::new(),
        };
        files.sort();
        files
            .iter()
            .map(|f| std::fs::read_to_string(f).expect("read"))
            .collect()
    }

    #[tokio::test]
    async fn a_fetched_batch_manifest_expands_and_the_summary_is_mailed() {
        let tmp = tempfile::tempdir().expect("tmp");
        let (base, _) = serve(sample("localid2_batch.checkm"), 200).await;
        let b = batches(
            tmp.path(),
            Notification {
                callback_url: None,
                emails: vec!["curator@example.org".into()],
                summary_at_queueing: true,
            },
        );
        let s = submission("single-file-batch-manifest", &format!("{base}/m"));
        let Expansion::Jobs(jobs) = b.expand_submission("bid1", &sub(&s)).await else {
            panic!("not expanded")
        };
        assert_eq!(jobs.len(), 1);
        assert_eq!(jobs[0].payload_type, "file");
        let mail = outbox_messages(&tmp.path().join("outbox"));
        assert_eq!(mail.len(), 1);
        assert!(
            mail[0].contains("\r\nSubject: ingest batch bid1 queued: 1 job\r\n"),
            "{}",
            mail[0]
        );
        assert!(
            mail[0].contains("hello.txt (file) local ids localidseven"),
            "{}",
            mail[0]
        );
    }

    #[tokio::test]
    async fn a_missing_or_corrupt_manifest_fails_the_batch_naming_it() {
        let tmp = tempfile::tempdir().expect("tmp");
        let (base, _) = serve(b"#%checkm_0.7\nnot a manifest".to_vec(), 200).await;
        let b = batches(tmp.path(), Notification::default());
        let url = format!("{base}/m");
        let s = submission("object-manifest", &url);
        let Expansion::Failed(e) = b.expand_submission("bid1", &sub(&s)).await else {
            panic!("expanded")
        };
        assert!(e.starts_with(&format!("manifest {url}: line ")), "{e}");
        let missing = format!("{base}/nothing-here");
        let s = submission("container-batch-manifest", &missing);
        let Expansion::Failed(e) = b.expand_submission("bid1", &sub(&s)).await else {
            panic!("expanded")
        };
        assert!(e.contains(&missing) && e.contains("404"), "{e}");
        // A file or container payload is not fetched.
        let s = submission("file", &missing);
        assert!(
            matches!(b.expand_submission("bid1", &sub(&s)).await, Expansion::Jobs(j) if j.len() == 1)
        );
    }

    #[tokio::test]
    async fn the_report_goes_to_the_callback_and_the_outbox() {
        let tmp = tempfile::tempdir().expect("tmp");
        let (base, server) = serve(Vec::new(), 200).await;
        let b = batches(
            tmp.path(),
            Notification {
                callback_url: Some(format!("{base}/cb")),
                emails: vec!["curator@example.org".into()],
                summary_at_queueing: false,
            },
        );
        let jobs = [ReportJob {
            jid: "jid1".into(),
            ark: Some("ark:/99999/fk4a".into()),
            local_ids: vec!["loc-a".into()],
            status: "Completed".into(),
            message: String::new(),
            failure: None,
        }];
        let s = submission("file", "https://example.org/a.txt");
        assert_eq!(
            b.send_report(&rep("bid1", "Reporting", &jobs), &sub(&s))
                .await,
            None
        );
        let bodies = server.bodies.lock().expect("lock").clone();
        assert_eq!(
            bodies,
            vec![json!({
                "bid": "bid1", "status": "Reporting", "profile": "demo", "submitter": "alice",
                "completed": 1, "failed": 0,
                "jobs": [{"jid": "jid1", "ark": "ark:/99999/fk4a", "local_ids": ["loc-a"],
                          "status": "Completed", "message": ""}],
            })]
        );
        let mail = outbox_messages(&tmp.path().join("outbox"));
        assert_eq!(mail.len(), 1);
        assert!(mail[0].contains("\r\nTo: curator@example.org\r\n"));
        assert!(mail[0].contains("\r\nSubject: ingest batch bid1: 1 completed, 0 failed\r\n"));
        assert!(mail[0].contains("\r\njid1 Completed\r\n  ark: ark:/99999/fk4a\r\n"));
    }

    #[tokio::test]
    async fn a_failing_callback_and_an_unwritable_outbox_are_reported() {
        let tmp = tempfile::tempdir().expect("tmp");
        let (base, server) = serve(Vec::new(), 500).await;
        let b = batches(
            tmp.path(),
            Notification {
                callback_url: Some(format!("{base}/cb")),
                emails: vec!["curator@example.org".into()],
                summary_at_queueing: false,
            },
        );
        // The outbox path is a file: nothing can be written under it.
        std::fs::write(tmp.path().join("outbox"), b"in the way").expect("write");
        let s = submission("file", "https://example.org/a.txt");
        let error = b
            .send_report(&rep("bid1", "Reporting", &[]), &sub(&s))
            .await
            .expect("errors");
        assert!(
            error.contains(&format!(
                "callback URL {base}/cb returned 500 after 3 attempts"
            )),
            "{error}"
        );
        assert!(
            error.contains("the report e-mail: cannot create the outbox"),
            "{error}"
        );
        assert_eq!(server.bodies.lock().expect("lock").len(), 3);
        // No profile settings: nothing to send, nothing failed.
        let mut other = s.clone();
        other["profile_name"] = json!("unknown");
        assert_eq!(
            b.send_report(&rep("bid1", "Reporting", &[]), &sub(&other))
                .await,
            None
        );
    }
}
