//! Estimating: how much working storage a job needs.
//!
//! The object's files are listed ([`object_files`]: the payload itself, or
//! the files of its object manifest), and the sizes of those whose size the
//! manifest does not declare are asked with concurrent `HEAD` requests
//! ([`estimate`]). `space_needed` is the sum. When any size is unknown (a
//! server without `Content-Length` or without HEAD, an error, a manifest
//! that cannot be read), `space_needed` is 0 and the job's priority drops
//! by 10, as in Merritt. Estimating fails only when an object manifest's
//! digest is not the one the depositor supplied (it reads the manifest, so
//! this is the first step that knows; the failure is of kind
//! `digest_mismatch`, which no requeue recovers): whatever else is wrong
//! with the payload is reported by Downloading, which reads it for real.

use std::sync::Arc;

use ingest_events::event::FailureKind;
use ingest_steps::checkm;
use ingest_steps::digest::{Algorithm, Expected, Mismatch, MultiHasher};
use ingest_steps::forms::{self, FileSpec, Form};
use ingest_steps::paths;
use reqwest::Url;
use tokio::task::JoinSet;

use super::fetch::Fetcher;
use super::RealConfig;
use crate::step::{JobCtx, JobData, Outcome, Step, StepError, StepFuture, StepResult};

/// The largest object manifest read.
pub const MANIFEST_MAX_BYTES: u64 = 64 * 1024 * 1024;

/// How much a job's priority drops when its size is unknown.
pub const UNKNOWN_SIZE_PRIORITY_DROP: u8 = 10;

/// The lowest priority (the largest number).
pub const LOWEST_PRIORITY: u8 = 99;

/// A step that succeeds at once (provisioning's inner step).
#[derive(Debug, Clone, Copy)]
pub struct Pass;

impl Step for Pass {
    fn run<'a>(&'a self, job: &'a JobCtx) -> StepFuture<'a> {
        Box::pin(async move { StepResult::Report(Outcome::success(format!("{} done", job.state))) })
    }
}

/// The estimating step.
pub struct Estimate {
    fetcher: Arc<Fetcher>,
    config: Arc<RealConfig>,
}

impl Estimate {
    /// The step.
    pub fn new(fetcher: Arc<Fetcher>, config: Arc<RealConfig>) -> Estimate {
        Estimate { fetcher, config }
    }
}

impl Step for Estimate {
    fn run<'a>(&'a self, job: &'a JobCtx) -> StepFuture<'a> {
        Box::pin(async move {
            let files = match job.data().await {
                Ok(data) => object_files(&self.fetcher, &self.config, &data, Some(job)).await,
                Err(e) => Err(StepError::from(e.to_string())),
            };
            let sizes = match files {
                Ok(files) => sizes(&self.fetcher, &files, self.config.args.transfers_per_job).await,
                // A failure with a kind (an object manifest whose digest is
                // not the depositor's) is known now and fails the job now.
                Err(failure) if failure.kind().is_some() => {
                    tracing::warn!(jid = %job.jid, state = %job.state, message = %ingest_protocol::bounded(failure.message()), "the payload's digest does not match");
                    return StepResult::Report(failure.into());
                }
                Err(reason) => Sizes {
                    files: 0,
                    bytes: 0,
                    unknown: Some(reason.message().to_string()),
                },
            };
            StepResult::Report(outcome(job, &sizes))
        })
    }
}

/// The priority of a job whose size is unknown. Merritt's rule is that the
/// priority "drops by 10". In this queue priorities run from 0 to 99 and
/// lower numbers run first, so dropping the priority means a larger number:
/// `min(99, priority + 10)`.
pub fn dropped_priority(priority: u8) -> u8 {
    priority
        .saturating_add(UNKNOWN_SIZE_PRIORITY_DROP)
        .min(LOWEST_PRIORITY)
}

/// The files of the job's object: for a `file` or `container` payload, the
/// payload (named after its URL's last path segment); for an
/// `object-manifest`, the manifest's files, the manifest fetched with
/// retries (recorded on `job`) and, when the job has a digest, checked
/// against it.
///
/// # Errors
/// A message naming the URL or the manifest line: no payload URL, a payload
/// type that is not one object's, a URL without a usable file name, a
/// manifest that cannot be fetched or read, or whose digest does not match
/// (of kind [`FailureKind::DigestMismatch`]: the object manifest is the
/// payload the depositor's digest is of).
pub async fn object_files(
    fetcher: &Fetcher,
    config: &RealConfig,
    data: &JobData,
    job: Option<&JobCtx>,
) -> Result<Vec<FileSpec>, StepError> {
    let conf = &data.configuration;
    let url = Some(conf.payload_url.as_str())
        .filter(|u| !u.is_empty())
        .ok_or("the job's configuration has no payload_url")?;
    let kind = Some(conf.payload_type.as_str())
        .filter(|k| !k.is_empty())
        .ok_or("the job's configuration has no payload_type")?;
    match kind {
        "file" | "container" => Ok(vec![payload_file(url)?]),
        "object-manifest" => {
            let what = format!("object manifest {url}");
            let bytes = fetcher
                .with_retries(&config.retry(), job, &what, || {
                    fetcher.get_bytes(url, MANIFEST_MAX_BYTES)
                })
                .await
                .map_err(|e| e.to_string())?;
            if let Some(expected) = payload_digest(data)? {
                let mut hasher = MultiHasher::new(&[expected.algorithm]);
                hasher.update(&bytes);
                let actual = hasher.finish().pop().map(|(_, hex)| hex).unwrap_or_default();
                expected
                    .check(&actual)
                    .map_err(|e| payload_digest_mismatch(&what, &e))?;
            }
            Ok(manifest_files(url, &bytes)?)
        }
        other => Err(StepError::permanent(format!(
            "payload type {other:?} is not one object's payload (file, container or object-manifest)"
        ))),
    }
}

/// The failure of a payload whose digest is not the one the depositor
/// supplied with it: of kind [`FailureKind::DigestMismatch`], which no
/// requeue recovers (the transitions document: "Recovery is not possible
/// under these conditions. A new submission will be required."). `what`
/// names the payload (its URL, cut).
pub fn payload_digest_mismatch(what: &str, mismatch: &Mismatch) -> StepError {
    StepError::of(
        FailureKind::DigestMismatch,
        format!(
            "{}: {mismatch}: the payload is not what the depositor's digest describes; \
             a new submission is required",
            ingest_protocol::cut(what, 512)
        ),
    )
}

/// The depositor's digest of the job's payload (`digest_type`,
/// `digest_value` of its configuration), if any.
///
/// # Errors
/// An unknown algorithm, a value of the wrong length or not hexadecimal,
/// or one given without the other.
pub fn payload_digest(data: &JobData) -> Result<Option<Expected>, StepError> {
    let conf = &data.configuration;
    let field = |v: &Option<String>| {
        v.as_deref()
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
    };
    match (field(&conf.digest_type), field(&conf.digest_value)) {
        (None, None) => Ok(None),
        (Some(kind), Some(value)) => {
            let algorithm: Algorithm =
                kind.parse().map_err(|e| format!("the job's digest: {e}"))?;
            if value.len() != algorithm.hex_len() || !value.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(StepError::permanent(format!(
                    "the job's {algorithm} digest {value:?} is not {} hexadecimal digits",
                    algorithm.hex_len()
                )));
            }
            Ok(Some(Expected {
                algorithm,
                value: value.to_ascii_lowercase(),
            }))
        }
        _ => Err("the job's digest has a type without a value, or a value without a type".into()),
    }
}

/// The one file of a `file` or `container` payload.
fn payload_file(url: &str) -> Result<FileSpec, StepError> {
    let parsed = Url::parse(url).map_err(|e| format!("invalid payload URL {url:?}: {e}"))?;
    let segment = parsed
        .path_segments()
        .and_then(|mut s| s.next_back())
        .filter(|s| !s.is_empty())
        .ok_or_else(|| format!("cannot take a file name from the payload URL {url}"))?;
    let decoded = ingest_steps::paths::percent_decode(segment)
        .ok_or_else(|| format!("the file name of the payload URL {url} is not UTF-8"))?;
    let name =
        paths::normalized_name(&decoded).map_err(|e| format!("the payload URL {url}: {e}"))?;
    Ok(FileSpec {
        url: url.to_owned(),
        name,
        size: None,
        digest: None,
        mime_type: None,
    })
}

/// The files of an object manifest.
fn manifest_files(url: &str, bytes: &[u8]) -> Result<Vec<FileSpec>, StepError> {
    let manifest = checkm::parse(bytes).map_err(|e| format!("object manifest {url}: {e}"))?;
    let mut objects = forms::objects(&manifest, Form::ObjectManifest)
        .map_err(|e| format!("object manifest {url}: {e}"))?;
    match (objects.pop(), objects.is_empty()) {
        (Some(object), true) => Ok(object.files),
        _ => Err(StepError::permanent(format!(
            "object manifest {url} does not describe exactly one object"
        ))),
    }
}

/// The total size of `files` (a manifest-declared size, else HEAD, at most
/// `concurrency` requests at once) and whether every size is known. When
/// one is not, the total is 0 and the remaining requests are abandoned.
pub async fn estimate(
    fetcher: &Arc<Fetcher>,
    files: &[FileSpec],
    concurrency: usize,
) -> (u64, bool) {
    let sizes = sizes(fetcher, files, concurrency).await;
    (sizes.bytes, sizes.unknown.is_none())
}

/// What [`sizes`] found.
struct Sizes {
    files: usize,
    bytes: u64,
    /// Why a size is unknown (the first reason found).
    unknown: Option<String>,
}

async fn sizes(fetcher: &Arc<Fetcher>, files: &[FileSpec], concurrency: usize) -> Sizes {
    let unknown = |reason: String| Sizes {
        files: files.len(),
        bytes: 0,
        unknown: Some(reason),
    };
    let mut bytes = 0u64;
    let mut to_ask = Vec::new();
    for file in files {
        match file.size {
            Some(size) => bytes = bytes.saturating_add(size),
            None => to_ask.push(file.url.clone()),
        }
    }
    let mut to_ask = to_ask.into_iter();
    // Dropping the set (on an unknown size, or when the step is dropped)
    // aborts the requests still running.
    let mut running = JoinSet::new();
    loop {
        while running.len() < concurrency.max(1) {
            let Some(url) = to_ask.next() else { break };
            let fetcher = Arc::clone(fetcher);
            running.spawn(async move {
                let size = fetcher.head_size(&url).await;
                (url, size)
            });
        }
        match running.join_next().await {
            None => break,
            Some(Ok((_, Ok(Some(size))))) => bytes = bytes.saturating_add(size),
            Some(Ok((url, Ok(None)))) => {
                return unknown(format!("HEAD {url} gave no size"));
            }
            Some(Ok((_, Err(e)))) => return unknown(e.to_string()),
            Some(Err(e)) => return unknown(format!("a size request failed: {e}")),
        }
    }
    Sizes {
        files: files.len(),
        bytes,
        unknown: None,
    }
}

fn outcome(job: &JobCtx, sizes: &Sizes) -> Outcome {
    match &sizes.unknown {
        None => {
            tracing::info!(jid = %job.jid, state = %job.state, bytes = sizes.bytes, files = sizes.files, "estimated");
            Outcome::success(format!(
                "estimated {} bytes in {} files",
                sizes.bytes, sizes.files
            ))
            .with_space_needed(sizes.bytes)
        }
        Some(reason) => {
            let priority = dropped_priority(job.priority);
            tracing::warn!(jid = %job.jid, state = %job.state, reason = %ingest_protocol::bounded(&reason), priority, "size unknown");
            Outcome::success(format!(
                "size unknown ({reason}); priority lowered from {} to {priority}",
                job.priority
            ))
            .with_space_needed(0)
            .with_priority(priority)
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    /// A node value as a worker reads it.
    fn node<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
        serde_json::from_value(v).expect("a node")
    }
    use axum::routing::{get, post};
    use axum::Router;
    use ingest_events::JobState;

    use super::super::fetch::test_server::serve;
    use super::super::RealArgs;
    use super::*;

    fn spec(url: String, size: Option<u64>) -> FileSpec {
        FileSpec {
            name: "x".into(),
            url,
            size,
            digest: None,
            mime_type: None,
        }
    }

    fn config() -> RealConfig {
        RealConfig {
            work_dir: std::env::temp_dir(),
            args: RealArgs {
                step_retries: 1,
                retry_backoff_ms: 1,
                ..RealArgs::default()
            },
            profiles: Default::default(),
        }
    }

    fn job_data(url: &str, kind: &str) -> JobData {
        JobData {
            bid: "bid1".into(),
            configuration: node(json!({"payload_url": url, "payload_type": kind})),
            identifiers: node(json!({})),
            metadata: node(json!({})),
            status: node(json!({})),
            space_needed: 0,
        }
    }

    async fn server() -> String {
        serve(
            Router::new()
                .route("/a", get(|| async { "0123456789" }))
                .route("/b%20c.txt", get(|| async { "01234567890123456789" }))
                .route("/nohead", post(|| async { "x" }))
                .route(
                    "/manifest",
                    get(|| async {
                        "#%checkm_0.7\n\
                         #%profile | http://uc3.cdlib.org/registry/ingest/manifest/mrt-ingest-manifest\n\
                         #%fields | nfo:fileUrl | nfo:hashAlgorithm | nfo:hashValue | nfo:fileSize | nfo:fileLastModified | nfo:fileName | mrt:mimeType\n\
                         http://h.invalid/one | | | 1000 | | dir/one.txt |\n\
                         http://h.invalid/two | | | 24 | | two.txt |\n\
                         #%eof\n"
                    }),
                ),
        )
        .await
    }

    #[tokio::test]
    async fn sizes_are_summed() {
        let base = server().await;
        let fetcher = Arc::new(Fetcher::for_tests(None));
        let files = [
            spec(format!("{base}/a"), None),
            spec(format!("{base}/b%20c.txt"), None),
            spec("http://h.invalid/declared".into(), Some(5)),
        ];
        assert_eq!(estimate(&fetcher, &files, 2).await, (35, true));
        assert_eq!(estimate(&fetcher, &[], 2).await, (0, true));
    }

    #[tokio::test]
    async fn one_unknown_size_gives_zero_and_a_lower_priority() {
        let base = server().await;
        let fetcher = Arc::new(Fetcher::for_tests(None));
        for odd in ["nohead", "missing"] {
            let files = [
                spec(format!("{base}/a"), None),
                spec(format!("{base}/{odd}"), None),
            ];
            assert_eq!(estimate(&fetcher, &files, 4).await, (0, false), "{odd}");
            let s = sizes(&fetcher, &files, 4).await;
            let o = outcome(
                &JobCtx::detached(ingest_events::Jid(1), JobState::Estimating, 95),
                &s,
            );
            assert!(o.success);
            assert_eq!(o.space_needed, Some(0));
            assert_eq!(o.priority, Some(99));
            assert!(o.message.contains(odd), "{}", o.message);
        }
        assert_eq!(dropped_priority(5), 15);
        assert_eq!(dropped_priority(90), 99);
        assert_eq!(dropped_priority(255), 99);
    }

    #[tokio::test]
    async fn object_files_of_each_payload_type() {
        let base = server().await;
        let fetcher = Fetcher::for_tests(None);
        let config = config();
        let one = object_files(
            &fetcher,
            &config,
            &job_data(&format!("{base}/b%20c.txt"), "file"),
            None,
        )
        .await
        .expect("file");
        assert_eq!(one.len(), 1);
        assert_eq!(one[0].name, "b c.txt");
        let listed = object_files(
            &fetcher,
            &config,
            &job_data(&format!("{base}/manifest"), "object-manifest"),
            None,
        )
        .await
        .expect("manifest");
        let names: Vec<_> = listed.iter().map(|f| (f.name.as_str(), f.size)).collect();
        assert_eq!(names, [("dir/one.txt", Some(1000)), ("two.txt", Some(24))]);
        let arc = Arc::new(fetcher.clone());
        assert_eq!(estimate(&arc, &listed, 4).await, (1024, true));

        let missing = object_files(
            &fetcher,
            &config,
            &job_data(&format!("{base}/gone"), "object-manifest"),
            None,
        )
        .await
        .expect_err("404");
        assert!(
            missing.message().contains("/gone") && missing.message().contains("404"),
            "{missing}"
        );
        assert_eq!(missing.kind(), None);
        let corrupt = object_files(
            &fetcher,
            &config,
            &job_data(&format!("{base}/a"), "object-manifest"),
            None,
        )
        .await
        .expect_err("not a manifest");
        assert!(
            corrupt.message().contains("/a") && corrupt.message().contains("line"),
            "{corrupt}"
        );
        assert_eq!(corrupt.kind(), None);
        let batch = object_files(
            &fetcher,
            &config,
            &job_data(&format!("{base}/a"), "batch-manifest"),
            None,
        )
        .await
        .expect_err("a batch payload");
        assert!(batch.message().contains("batch-manifest"), "{batch}");
        let bad_digest = JobData {
            configuration: node(json!({
                "payload_url": format!("{base}/manifest"),
                "payload_type": "object-manifest",
                "digest_type": "md5",
                "digest_value": "0".repeat(32),
            })),
            ..job_data("", "")
        };
        let err = object_files(&fetcher, &config, &bad_digest, None)
            .await
            .expect_err("digest mismatch");
        assert!(
            err.message().contains("md5 mismatch")
                && err.message().contains("/manifest")
                && err.message().contains("a new submission is required"),
            "{err}"
        );
        assert_eq!(err.kind(), Some(FailureKind::DigestMismatch));
    }

    #[test]
    fn payload_digests_are_checked() {
        let mut data = job_data("http://h.invalid/x", "file");
        assert_eq!(payload_digest(&data), Ok(None));
        data.configuration.digest_type = Some("SHA-256".into());
        assert!(payload_digest(&data).is_err());
        data.configuration.digest_value = Some("AB".repeat(32));
        assert_eq!(
            payload_digest(&data),
            Ok(Some(Expected {
                algorithm: Algorithm::Sha256,
                value: "ab".repeat(32)
            }))
        );
        data.configuration.digest_value = Some("ab".into());
        assert!(payload_digest(&data).is_err());
        assert!(payload_file("http://h.invalid/").is_err());
        assert!(payload_file("http://h.invalid/%2e%2e").is_err());
    }
}
