//! Reads of payloads and manifests: `http(s)://` and `file://` (under the
//! configured root), streamed to disk with digests computed on the way,
//! bounded in size, with bounded retries of recoverable errors.
//!
//! Every error says which URL it is about and whether trying again may help
//! ([`FetchError::Recoverable`]: a connection refused or reset, a timeout, a
//! body cut short, HTTP 5xx or 429) or not ([`FetchError::Permanent`]: HTTP
//! 4xx, a URL that is refused, a payload over its limit, a local write that
//! failed). [`Fetcher::with_retries`] retries the first kind with backoff,
//! recording each retry as an event of the job.
//!
//! **Architecture Invariant:** a `file://` URL is only ever opened once its
//! path, with every symbolic link resolved, lies under the configured file
//! root; without a root, `file://` URLs are refused.
//!
//! **Architecture Invariant:** every HTTP connection goes through the
//! outbound policy ([`super::outbound`]): a literal address is checked
//! before the request, a name's addresses when it is resolved (the client
//! connects only to the allowed ones), and every redirect hop.
//!
//! A transfer slower than the minimum rate, averaged over a window
//! ([`TransferLimits`]), is cut as a recoverable error naming the URL.

use std::fs::File;
use std::future::Future;
use std::io::{self, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use ingest_steps::digest::{Algorithm, HashingWriter};
use ingest_steps::stamp::{self, FileStamp};
use reqwest::header::CONTENT_LENGTH;
use reqwest::{StatusCode, Url};
use tokio::sync::mpsc;

use super::outbound::{self, PolicyResolver};
use super::RealConfig;
use crate::step::JobCtx;
use ingest_protocol::outbound::{OutboundPolicy, UrlError, REFUSED};

/// How long establishing a connection may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a read may wait for the next bytes of an answer. There is no
/// limit on a whole transfer: a large file on a slow link is fine as long as
/// it keeps moving.
pub const READ_TIMEOUT: Duration = Duration::from_secs(60);

/// The most redirects followed for one request.
pub const MAX_REDIRECTS: usize = 10;

/// How long the answer's status and headers may take to arrive, in all
/// (a server that trickles its headers is cut here).
pub const HEADERS_TIMEOUT: Duration = Duration::from_secs(60);

/// The most bytes of a URL quoted in a message of this module's new
/// errors.
const MAX_URL_QUOTED: usize = 512;

/// The slowest a transfer may be: fewer than `min_rate` bytes per second
/// over a whole `window` cuts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransferLimits {
    /// Bytes per second, averaged over `window` (0: no minimum).
    pub min_rate: u64,
    /// The window the rate is averaged over.
    pub window: Duration,
}

impl Default for TransferLimits {
    /// No minimum.
    fn default() -> TransferLimits {
        TransferLimits {
            min_rate: 0,
            window: Duration::from_secs(60),
        }
    }
}

impl TransferLimits {
    /// The limits of the options (`--min-transfer-rate`,
    /// `--transfer-rate-window-secs`, 0 meaning 60 s).
    pub fn of(args: &super::RealArgs) -> TransferLimits {
        TransferLimits {
            min_rate: args.min_transfer_rate,
            window: Duration::from_secs(match args.transfer_rate_window_secs {
                0 => 60,
                secs => secs,
            }),
        }
    }
}

/// The error of a URL the policy refuses: the message names the URL (cut)
/// and the rule, never what answers there.
pub fn refused(url: &str, e: &UrlError) -> FetchError {
    let url = ingest_protocol::cut(url, MAX_URL_QUOTED);
    FetchError::Permanent(match e {
        UrlError::Refused => format!("{url}: {REFUSED}"),
        other => format!("URL {url} {other}"),
    })
}

/// Chunks in flight between the network and the writer thread.
const CHANNEL_CHUNKS: usize = 32;

/// The write buffer and the `file://` copy buffer.
const COPY_BUFFER: usize = 256 * 1024;

pub use crate::retry::RetryPolicy;

impl crate::retry::Retryable for FetchError {
    fn is_retryable(&self) -> bool {
        self.is_recoverable()
    }
}

/// Why a read failed. The message names the URL.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FetchError {
    /// It may work if tried again: a connection refused or reset, a
    /// timeout, a body cut short, HTTP 5xx or 429, a local file that could
    /// not be read for a reason other than its absence.
    ///
    /// ### Handling
    /// Retry with backoff ([`Fetcher::with_retries`]); when the retries run
    /// out, fail the step with the message.
    #[error("{0}")]
    Recoverable(String),
    /// Trying again will not help: HTTP 4xx, a refused URL (scheme,
    /// `file://` outside the root), a payload over its limit, a local file
    /// that does not exist, a local write that failed.
    ///
    /// ### Handling
    /// Fail the step at once with the message.
    #[error("{0}")]
    Permanent(String),
}

impl FetchError {
    /// Whether trying again may help.
    pub fn is_recoverable(&self) -> bool {
        matches!(self, FetchError::Recoverable(_))
    }

    /// The message (it names the URL).
    pub fn message(&self) -> &str {
        match self {
            FetchError::Recoverable(m) | FetchError::Permanent(m) => m,
        }
    }
}

/// The error for an HTTP answer that is not a success: 5xx, 429 and 408
/// are recoverable, everything else permanent. The message reads
/// `GET URL returned 404 Not Found`.
pub fn status_error(method: &str, url: &str, status: StatusCode) -> FetchError {
    let message = format!("{method} {url} returned {status}");
    let recoverable = status.is_server_error()
        || status == StatusCode::TOO_MANY_REQUESTS
        || status == StatusCode::REQUEST_TIMEOUT;
    if recoverable {
        FetchError::Recoverable(message)
    } else {
        FetchError::Permanent(message)
    }
}

/// The error for a request that got no (complete) answer: connecting,
/// timing out, a reset, a body cut short are recoverable; a URL reqwest
/// cannot build a request for and too many redirects are permanent.
pub fn request_error(method: &str, url: &str, err: &reqwest::Error) -> FetchError {
    if outbound::is_refused(err) {
        // Nothing of what answered (or did not): the same words for every
        // refused destination.
        let url = ingest_protocol::cut(url, MAX_URL_QUOTED);
        return FetchError::Permanent(format!("{method} {url}: {REFUSED}"));
    }
    let what = if err.is_timeout() {
        "timed out"
    } else if err.is_connect() {
        "cannot connect"
    } else if err.is_body() || err.is_decode() {
        "the answer's body could not be read"
    } else if err.is_redirect() {
        "too many redirects"
    } else {
        "the request failed"
    };
    let message = format!("{method} {url}: {what} ({})", root_cause(err));
    if err.is_builder() || err.is_redirect() {
        FetchError::Permanent(message)
    } else {
        FetchError::Recoverable(message)
    }
}

/// The innermost error's message (reqwest's own repeats the URL).
fn root_cause(err: &(dyn std::error::Error + 'static)) -> String {
    let mut inner = err;
    while let Some(source) = inner.source() {
        inner = source;
    }
    inner.to_string()
}

/// The error for a payload over its limit.
pub fn too_large(url: &str, max_bytes: u64) -> FetchError {
    FetchError::Permanent(format!(
        "{url} is larger than the limit of {max_bytes} bytes"
    ))
}

/// A file written by [`Fetcher::download`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Downloaded {
    /// The bytes written.
    pub size: u64,
    /// The digests asked for, in lower-case hexadecimal (each algorithm
    /// once, in the order first asked).
    pub digests: Vec<(Algorithm, String)>,
    /// The file's stamp once in place, when it could be read: while the
    /// file keeps it, its bytes are the ones hashed.
    pub stamp: Option<FileStamp>,
}

/// The HTTP client (under the outbound policy), the `file://` root and
/// the transfer limits.
#[derive(Debug, Clone)]
pub struct Fetcher {
    client: reqwest::Client,
    file_root: Option<FileRoot>,
    policy: Arc<OutboundPolicy>,
    limits: TransferLimits,
}

/// The root as configured and as resolved: a URL is checked against the
/// first before the file system is touched (so nothing outside is even
/// probed), and its resolved path against the second.
#[derive(Debug, Clone)]
struct FileRoot {
    configured: PathBuf,
    canonical: PathBuf,
}

/// Where a URL leads, once checked.
enum Target {
    Http(Url),
    File(PathBuf),
}

impl Fetcher {
    /// A fetcher for `config` (its `file_root`).
    ///
    /// # Errors
    /// When the HTTP client cannot be built or the file root cannot be
    /// resolved (it must exist).
    pub fn new(config: &RealConfig) -> anyhow::Result<Fetcher> {
        let policy = config
            .args
            .outbound_policy()
            .context("the outbound policy")?;
        Fetcher::with_policy(policy, TransferLimits::of(&config.args))
    }

    /// A fetcher under `policy` (whose file root `file://` URLs must lie
    /// under; none: refused) and `limits`.
    ///
    /// # Errors
    /// As [`Fetcher::new`].
    pub fn with_policy(policy: OutboundPolicy, limits: TransferLimits) -> anyhow::Result<Fetcher> {
        let policy = Arc::new(policy);
        // No proxy: a proxy would resolve the destination itself, out of
        // the policy's reach.
        let client = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .read_timeout(READ_TIMEOUT)
            .redirect(outbound::redirect_policy(
                Arc::clone(&policy),
                MAX_REDIRECTS,
            ))
            .dns_resolver(Arc::new(PolicyResolver::new(Arc::clone(&policy))))
            .no_proxy()
            .user_agent(concat!("ingest/", env!("CARGO_PKG_VERSION")))
            .build()
            .context("cannot build the HTTP client")?;
        let file_root = match policy.file_root() {
            Some(root) => {
                let canonical = root.canonicalize().with_context(|| {
                    format!("the file root {} cannot be resolved", root.display())
                })?;
                let configured = std::path::absolute(root).unwrap_or_else(|_| canonical.clone());
                Some(FileRoot {
                    configured,
                    canonical,
                })
            }
            None => None,
        };
        Ok(Fetcher {
            client,
            file_root,
            policy,
            limits,
        })
    }

    /// A fetcher for tests: `root` for `file://` URLs, loopback allowed
    /// explicitly (the tests' servers listen on 127.0.0.1), no rate limit.
    #[cfg(test)]
    pub(crate) fn for_tests(root: Option<&Path>) -> Fetcher {
        let policy = OutboundPolicy::new(&[], &["127.0.0.0/8".into()], root).expect("policy");
        Fetcher::with_policy(policy, TransferLimits::default()).expect("fetcher")
    }

    /// The HTTP client (for other requests, such as callbacks): names are
    /// resolved and redirects followed under the policy, but a literal
    /// address is not checked by the client; check the URL with
    /// [`Fetcher::check_http`] first.
    pub fn client(&self) -> &reqwest::Client {
        &self.client
    }

    /// The outbound policy.
    pub fn policy(&self) -> &OutboundPolicy {
        &self.policy
    }

    /// Checks an `http`/`https` URL against the policy before a request
    /// (a callback): syntax, scheme, a literal address's class.
    ///
    /// # Errors
    /// A permanent error naming the URL (cut): "refused by outbound
    /// policy", or what is wrong with it.
    pub fn check_http(&self, url: &str) -> Result<Url, FetchError> {
        let parsed = self.policy.check_url(url).map_err(|e| refused(url, &e))?;
        match parsed.scheme() {
            "http" | "https" => Ok(parsed),
            _ => Err(refused(
                url,
                &UrlError::Scheme {
                    scheme: parsed.scheme().into(),
                    accepted: "http and https",
                },
            )),
        }
    }

    /// The resolved root of `file://` URLs, if one is configured.
    pub fn file_root(&self) -> Option<&Path> {
        self.file_root.as_ref().map(|r| r.canonical.as_path())
    }

    /// The size of the file at `url`: HTTP `HEAD`'s `Content-Length`, or
    /// the length of a `file://` file.
    ///
    /// # Errors
    /// A refused URL, an HTTP error status (except 405 and 501, a server
    /// that does not allow HEAD, which gives `Ok(None)`), a request that
    /// failed, a local file that cannot be read.
    pub async fn head_size(&self, url: &str) -> Result<Option<u64>, FetchError> {
        match self.target(url).await? {
            Target::File(path) => {
                let url = url.to_owned();
                blocking(move || {
                    let metadata = std::fs::metadata(&path).map_err(|e| read_error(&url, &e))?;
                    if metadata.is_file() {
                        Ok(Some(metadata.len()))
                    } else {
                        Err(not_a_file(&url))
                    }
                })
                .await
            }
            Target::Http(u) => {
                let resp = self.send("HEAD", url, self.client.head(u)).await?;
                let status = resp.status();
                if status == StatusCode::METHOD_NOT_ALLOWED || status == StatusCode::NOT_IMPLEMENTED
                {
                    return Ok(None);
                }
                if !status.is_success() {
                    return Err(status_error("HEAD", url, status));
                }
                // The header itself: the response to a HEAD has no body, so
                // the body's size hint says nothing.
                Ok(resp
                    .headers()
                    .get(CONTENT_LENGTH)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.trim().parse().ok()))
            }
        }
    }

    /// The whole content at `url`, at most `max_bytes` (for manifests).
    ///
    /// # Errors
    /// As [`Fetcher::download`]; more than `max_bytes` is a permanent error
    /// naming the limit.
    pub async fn get_bytes(&self, url: &str, max_bytes: u64) -> Result<Vec<u8>, FetchError> {
        match self.target(url).await? {
            Target::File(path) => {
                let url = url.to_owned();
                blocking(move || {
                    let file = open_source(&url, &path, max_bytes)?;
                    let mut bytes = Vec::new();
                    file.take(max_bytes.saturating_add(1))
                        .read_to_end(&mut bytes)
                        .map_err(|e| read_error(&url, &e))?;
                    if bytes.len() as u64 > max_bytes {
                        Err(too_large(&url, max_bytes))
                    } else {
                        Ok(bytes)
                    }
                })
                .await
            }
            Target::Http(u) => {
                let mut resp = self.get(url, u, max_bytes).await?;
                let mut bytes = Vec::new();
                let mut pace = Pace::new(self.limits);
                while let Some(chunk) = pace.next_chunk(&mut resp, url).await? {
                    if (bytes.len() + chunk.len()) as u64 > max_bytes {
                        return Err(too_large(url, max_bytes));
                    }
                    bytes.extend_from_slice(&chunk);
                }
                Ok(bytes)
            }
        }
    }

    /// Streams `url` into `dest`, computing `algorithms` on the way, and
    /// returns the size and digests. The bytes go to `dest` + `.part` first
    /// (parent directories created), which is renamed to `dest` once
    /// complete; on any error, and when the future is dropped, the part
    /// file is removed. An existing `dest` is replaced.
    ///
    /// # Errors
    /// A refused URL, an HTTP error status, a request that failed or was
    /// cut short, more than `max_bytes` ("larger than the limit of N
    /// bytes"), a local file that cannot be read or written.
    pub async fn download(
        &self,
        url: &str,
        dest: &Path,
        algorithms: &[Algorithm],
        max_bytes: u64,
    ) -> Result<Downloaded, FetchError> {
        let target = self.target(url).await?;
        let part = part_path(dest);
        let guard = PartGuard::new(part.clone());
        let downloaded = match target {
            Target::Http(u) => {
                self.download_http(url, u, &part, algorithms, max_bytes, &guard.cancelled)
                    .await?
            }
            Target::File(path) => {
                let (url, part, algorithms) = (url.to_owned(), part.clone(), algorithms.to_vec());
                let cancelled = Arc::clone(&guard.cancelled);
                blocking(move || copy_file(&url, &path, &part, &algorithms, max_bytes, &cancelled))
                    .await?
            }
        };
        let (from, to) = (part.clone(), dest.to_path_buf());
        let stamp = blocking(move || {
            std::fs::rename(&from, &to).map_err(|e| {
                FetchError::Permanent(format!(
                    "cannot move {} to {}: {e}",
                    from.display(),
                    to.display()
                ))
            })?;
            // After the rename, which moves the status-change time; only
            // where every later change is sure to move it.
            Ok(FileStamp::of_path(&to)
                .ok()
                .filter(|_| stamp::changes_always_seen(&to)))
        })
        .await?;
        guard.disarm();
        Ok(Downloaded {
            stamp,
            ..downloaded
        })
    }

    /// Runs `f` until it succeeds, fails permanently, or has failed
    /// recoverably `policy.retries + 1` times. Before each retry it records
    /// the error with `job.record_retry(attempt, "WHAT: ERROR")` (attempt 2
    /// for the first retry) and waits [`RetryPolicy::backoff`].
    ///
    /// # Errors
    /// The permanent error, or the last recoverable one with the number of
    /// attempts added to its message.
    pub async fn with_retries<T, F, Fut>(
        &self,
        policy: &RetryPolicy,
        job: Option<&JobCtx>,
        what: &str,
        f: F,
    ) -> Result<T, FetchError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, FetchError>>,
    {
        crate::retry::retry(policy, job, what, f)
            .await
            .map_err(|gave_up| match gave_up.error {
                FetchError::Recoverable(message) if gave_up.attempts > 1 => {
                    FetchError::Recoverable(format!(
                        "{message} (gave up after {} attempts)",
                        gave_up.attempts
                    ))
                }
                other => other,
            })
    }

    /// Checks `url` against the rules: `http`, `https`, or `file` under the
    /// root.
    async fn target(&self, url: &str) -> Result<Target, FetchError> {
        let parsed = Url::parse(url)
            .map_err(|e| FetchError::Permanent(format!("invalid URL {url:?}: {e}")))?;
        match parsed.scheme() {
            "http" | "https" => Ok(Target::Http(self.check_http(url)?)),
            "file" => {
                let root = self.file_root.clone().ok_or_else(|| {
                    FetchError::Permanent(format!(
                        "file URL {url} refused: no file root is configured (--file-root)"
                    ))
                })?;
                let path = parsed.to_file_path().map_err(|()| {
                    FetchError::Permanent(format!("file URL {url} has no local path"))
                })?;
                let outside = || {
                    FetchError::Permanent(format!(
                        "file URL {url} refused: it is not under the file root {}",
                        root.canonical.display()
                    ))
                };
                // `Url` has already removed `.` and `..` segments; a path
                // that does not even start with the root is refused without
                // looking at the file system.
                if !path.starts_with(&root.configured) && !path.starts_with(&root.canonical) {
                    return Err(outside());
                }
                let url_owned = url.to_owned();
                let resolved = blocking(move || {
                    path.canonicalize().map_err(|e| {
                        let message = format!(
                            "file URL {url_owned}: cannot resolve {}: {e}",
                            path.display()
                        );
                        match e.kind() {
                            io::ErrorKind::NotFound | io::ErrorKind::PermissionDenied => {
                                FetchError::Permanent(message)
                            }
                            _ => FetchError::Recoverable(message),
                        }
                    })
                })
                .await?;
                // A symbolic link under the root may lead anywhere.
                if resolved.starts_with(&root.canonical) {
                    Ok(Target::File(resolved))
                } else {
                    Err(outside())
                }
            }
            other => Err(FetchError::Permanent(format!(
                "URL {url} has the scheme {other:?}; only http, https and file are accepted"
            ))),
        }
    }

    /// Sends `request`; its status and headers must come within
    /// [`HEADERS_TIMEOUT`].
    async fn send(
        &self,
        method: &str,
        url: &str,
        request: reqwest::RequestBuilder,
    ) -> Result<reqwest::Response, FetchError> {
        match tokio::time::timeout(HEADERS_TIMEOUT, request.send()).await {
            // The client follows every redirect to http(s) (under the
            // policy); one still here leads elsewhere (`file:`, `ftp:`, …).
            Ok(Ok(resp))
                if resp.status().is_redirection()
                    && resp.headers().contains_key(reqwest::header::LOCATION) =>
            {
                Err(FetchError::Permanent(format!(
                    "{method} {}: {REFUSED}",
                    ingest_protocol::cut(url, MAX_URL_QUOTED)
                )))
            }
            Ok(sent) => sent.map_err(|e| request_error(method, url, &e)),
            Err(_) => Err(FetchError::Recoverable(format!(
                "{method} {}: no answer within {} s",
                ingest_protocol::cut(url, MAX_URL_QUOTED),
                HEADERS_TIMEOUT.as_secs()
            ))),
        }
    }

    /// A successful GET whose announced length is within `max_bytes`.
    async fn get(
        &self,
        url: &str,
        u: Url,
        max_bytes: u64,
    ) -> Result<reqwest::Response, FetchError> {
        let resp = self.send("GET", url, self.client.get(u)).await?;
        let status = resp.status();
        if !status.is_success() {
            return Err(status_error("GET", url, status));
        }
        match resp.content_length() {
            Some(len) if len > max_bytes => Err(too_large(url, max_bytes)),
            _ => Ok(resp),
        }
    }

    /// The network side of a download: chunks go to a blocking writer
    /// thread that hashes and writes them, so that neither blocks the
    /// runtime and both proceed at once.
    async fn download_http(
        &self,
        url: &str,
        u: Url,
        part: &Path,
        algorithms: &[Algorithm],
        max_bytes: u64,
        cancelled: &Arc<AtomicBool>,
    ) -> Result<Downloaded, FetchError> {
        let mut resp = self.get(url, u, max_bytes).await?;
        let (path, flag) = (part.to_path_buf(), Arc::clone(cancelled));
        let file = blocking(move || create_part(&path, &flag)).await?;
        let (tx, rx) = mpsc::channel(CHANNEL_CHUNKS);
        let algorithms = algorithms.to_vec();
        let writer = crate::bulk::spawn(move || write_chunks(file, rx, &algorithms));
        let mut received = 0u64;
        let announced = resp.content_length();
        let mut pace = Pace::new(self.limits);
        let streamed = async {
            while let Some(chunk) = pace.next_chunk(&mut resp, url).await? {
                received += chunk.len() as u64;
                if received > max_bytes {
                    return Err(too_large(url, max_bytes));
                }
                if tx.send(chunk).await.is_err() {
                    // The writer stopped; its error is reported below.
                    return Ok(());
                }
            }
            // hyper ends a body at its Content-Length and refuses one cut
            // short; this holds whatever the transport does.
            match announced {
                Some(len) if len != received => Err(FetchError::Recoverable(format!(
                    "GET {}: the body has {received} bytes, not the {len} of its Content-Length",
                    ingest_protocol::cut(url, MAX_URL_QUOTED)
                ))),
                _ => Ok(()),
            }
        }
        .await;
        drop(tx);
        // Wait for the writer even after an error, so that the file is
        // closed before the part file is removed.
        let written = writer.await;
        streamed?;
        match written {
            Ok(Ok((size, digests))) => Ok(Downloaded {
                size,
                digests,
                stamp: None,
            }),
            Ok(Err(e)) => Err(write_error(part, &e)),
            Err(e) => Err(FetchError::Permanent(format!(
                "the writer of {} failed: {e}",
                part.display()
            ))),
        }
    }
}

/// A transfer's pace: the bytes of the current window, checked against the
/// minimum rate when the window ends.
struct Pace {
    limits: TransferLimits,
    start: tokio::time::Instant,
    bytes: u64,
}

impl Pace {
    fn new(limits: TransferLimits) -> Pace {
        Pace {
            limits,
            start: tokio::time::Instant::now(),
            bytes: 0,
        }
    }

    /// The next chunk of `resp`, or the error of a transfer that fell
    /// under the minimum rate over a whole window.
    async fn next_chunk(
        &mut self,
        resp: &mut reqwest::Response,
        url: &str,
    ) -> Result<Option<bytes::Bytes>, FetchError> {
        if self.limits.min_rate == 0 {
            return resp
                .chunk()
                .await
                .map_err(|e| request_error("GET", url, &e));
        }
        loop {
            let end = self.start + self.limits.window;
            // `chunk` is cancel-safe: a frame not yet returned stays in the
            // body.
            let next = tokio::time::timeout_at(end, resp.chunk()).await;
            if let Ok(Ok(Some(c))) = &next {
                self.bytes += c.len() as u64;
            }
            if tokio::time::Instant::now() >= end {
                self.window_ended(url)?;
            }
            if let Ok(chunk) = next {
                return chunk.map_err(|e| request_error("GET", url, &e));
            }
        }
    }

    fn window_ended(&mut self, url: &str) -> Result<(), FetchError> {
        let secs = self.limits.window.as_secs().max(1);
        let wanted = self.limits.min_rate.saturating_mul(secs);
        if self.bytes < wanted {
            return Err(FetchError::Recoverable(format!(
                "GET {}: slower than the minimum transfer rate of {} bytes/s ({} bytes in a {secs} s window)",
                ingest_protocol::cut(url, MAX_URL_QUOTED),
                self.limits.min_rate,
                self.bytes
            )));
        }
        self.start = tokio::time::Instant::now();
        self.bytes = 0;
        Ok(())
    }
}

/// Runs blocking file-system work off the runtime.
async fn blocking<T, F>(f: F) -> Result<T, FetchError>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, FetchError> + Send + 'static,
{
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|e| Err(FetchError::Permanent(format!("a file task failed: {e}"))))
}

/// `dest` + `.part`.
pub fn part_path(dest: &Path) -> PathBuf {
    let mut name = dest.as_os_str().to_owned();
    name.push(".part");
    PathBuf::from(name)
}

/// Removes the part file unless disarmed: on an error and when the
/// download's future is dropped (cancellation). It also tells a blocking
/// copy to stop.
struct PartGuard {
    path: PathBuf,
    cancelled: Arc<AtomicBool>,
    armed: bool,
}

impl PartGuard {
    fn new(path: PathBuf) -> PartGuard {
        PartGuard {
            path,
            cancelled: Arc::new(AtomicBool::new(false)),
            armed: true,
        }
    }

    fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for PartGuard {
    fn drop(&mut self) {
        if self.armed {
            self.cancelled.store(true, Ordering::Relaxed);
            // Absent when nothing was written yet.
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

fn create_part(part: &Path, cancelled: &AtomicBool) -> Result<File, FetchError> {
    if cancelled.load(Ordering::Relaxed) {
        return Err(FetchError::Permanent("cancelled".into()));
    }
    if let Some(parent) = part.parent() {
        std::fs::create_dir_all(parent).map_err(|e| write_error(parent, &e))?;
    }
    // A new inode every time: a writer of an earlier attempt still
    // finishing (its transfer dropped) writes into the file it opened, not
    // into this one, whose stamp would then hide its bytes.
    match std::fs::remove_file(part) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(write_error(part, &e)),
        _ => {}
    }
    File::options()
        .write(true)
        .create_new(true)
        .open(part)
        .map_err(|e| write_error(part, &e))
}

fn write_chunks<B: AsRef<[u8]>>(
    file: File,
    mut rx: mpsc::Receiver<B>,
    algorithms: &[Algorithm],
) -> io::Result<(u64, Vec<(Algorithm, String)>)> {
    let mut writer = HashingWriter::new(BufWriter::with_capacity(COPY_BUFFER, file), algorithms);
    while let Some(chunk) = rx.blocking_recv() {
        writer.write_all(chunk.as_ref())?;
    }
    let (buffered, size, digests) = writer.finish();
    buffered
        .into_inner()
        .map_err(io::IntoInnerError::into_error)?;
    Ok((size, digests))
}

/// Opens a local source, refusing what is not a regular file or is over
/// `max_bytes` already.
fn open_source(url: &str, path: &Path, max_bytes: u64) -> Result<File, FetchError> {
    let file = File::open(path).map_err(|e| read_error(url, &e))?;
    let metadata = file.metadata().map_err(|e| read_error(url, &e))?;
    if !metadata.is_file() {
        return Err(not_a_file(url));
    }
    if metadata.len() > max_bytes {
        return Err(too_large(url, max_bytes));
    }
    Ok(file)
}

fn copy_file(
    url: &str,
    src: &Path,
    part: &Path,
    algorithms: &[Algorithm],
    max_bytes: u64,
    cancelled: &AtomicBool,
) -> Result<Downloaded, FetchError> {
    let mut source = open_source(url, src, max_bytes)?;
    let file = create_part(part, cancelled)?;
    let mut writer = HashingWriter::new(BufWriter::with_capacity(COPY_BUFFER, file), algorithms);
    let mut buf = vec![0u8; COPY_BUFFER];
    loop {
        if cancelled.load(Ordering::Relaxed) {
            return Err(FetchError::Permanent(format!(
                "copying {url} was cancelled"
            )));
        }
        let n = match source.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(read_error(url, &e)),
        };
        if writer.bytes_written() + n as u64 > max_bytes {
            return Err(too_large(url, max_bytes));
        }
        let chunk = buf.get(..n).unwrap_or(&buf);
        writer.write_all(chunk).map_err(|e| write_error(part, &e))?;
    }
    let (buffered, size, digests) = writer.finish();
    buffered
        .into_inner()
        .map_err(|e| write_error(part, e.error()))?;
    Ok(Downloaded {
        size,
        digests,
        stamp: None,
    })
}

/// A local source that cannot be read: absent or forbidden is permanent,
/// anything else (an NFS hiccup) may pass.
fn read_error(url: &str, e: &io::Error) -> FetchError {
    let message = format!("cannot read {url}: {e}");
    match e.kind() {
        io::ErrorKind::NotFound | io::ErrorKind::PermissionDenied => FetchError::Permanent(message),
        _ => FetchError::Recoverable(message),
    }
}

fn not_a_file(url: &str) -> FetchError {
    FetchError::Permanent(format!("{url} is not a regular file"))
}

/// Writing to working storage failed (disk full, permissions): not the
/// depositor's fault, but retrying at once will not help either.
fn write_error(path: &Path, e: &io::Error) -> FetchError {
    FetchError::Permanent(format!("cannot write {}: {e}", path.display()))
}

/// A local HTTP server for the tests of the real steps.
#[cfg(test)]
pub(crate) mod test_server {
    use axum::Router;

    /// Serves `router` on 127.0.0.1 and returns its base URL
    /// (`http://127.0.0.1:PORT`); the server lives as long as the runtime.
    pub async fn serve(router: Router) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("address");
        tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        format!("http://{addr}")
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use axum::http::StatusCode as Status;
    use axum::routing::{get, post};
    use axum::Router;
    use ingest_steps::digest::{Algorithm, MultiHasher};

    use super::test_server::serve;
    use super::*;

    const BODY: &[u8] = b"hello, preservation\n";

    fn sha256(bytes: &[u8]) -> String {
        let mut h = MultiHasher::new(&[Algorithm::Sha256]);
        h.update(bytes);
        h.finish().remove(0).1
    }

    fn policy(retries: u32) -> RetryPolicy {
        RetryPolicy {
            retries,
            first_backoff: Duration::from_millis(1),
            max_backoff: Duration::from_millis(5),
        }
    }

    #[test]
    fn a_writer_of_an_earlier_attempt_cannot_write_into_the_next_part_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let part = dir.path().join("x.part");
        let not_cancelled = AtomicBool::new(false);
        let mut abandoned = create_part(&part, &not_cancelled).expect("first");
        let mut next = create_part(&part, &not_cancelled).expect("second");
        next.write_all(b"new").expect("write");
        // The abandoned attempt's writer finishes after the next began.
        abandoned.write_all(b"OLD BYTES").expect("write");
        drop((abandoned, next));
        assert_eq!(std::fs::read(&part).expect("read"), b"new");
    }

    /// `/file` serves BODY, `/flaky` fails twice with 503, `/broken`
    /// always fails with 500, `/nohead` only answers POST; the counters
    /// count the calls of `/flaky` and `/broken`.
    async fn server() -> (String, Arc<AtomicUsize>, Arc<AtomicUsize>) {
        let flaky = Arc::new(AtomicUsize::new(0));
        let broken = Arc::new(AtomicUsize::new(0));
        let (f, b) = (Arc::clone(&flaky), Arc::clone(&broken));
        let router = Router::new()
            .route("/file", get(|| async { BODY }))
            .route(
                "/flaky",
                get(move || {
                    let f = Arc::clone(&f);
                    async move {
                        match f.fetch_add(1, Ordering::SeqCst) {
                            0 | 1 => Err(Status::SERVICE_UNAVAILABLE),
                            _ => Ok(BODY),
                        }
                    }
                }),
            )
            .route(
                "/broken",
                get(move || {
                    let b = Arc::clone(&b);
                    async move {
                        b.fetch_add(1, Ordering::SeqCst);
                        Status::INTERNAL_SERVER_ERROR
                    }
                }),
            )
            .route("/nohead", post(|| async { BODY }));
        (serve(router).await, flaky, broken)
    }

    #[test]
    fn backoff_doubles_with_jitter_and_is_capped() {
        let p = RetryPolicy {
            retries: 5,
            first_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(300),
        };
        for _ in 0..50 {
            let first = p.backoff(1);
            assert!(first >= Duration::from_millis(50) && first <= Duration::from_millis(100));
            let second = p.backoff(2);
            assert!(second >= Duration::from_millis(100) && second <= Duration::from_millis(200));
            assert!(p.backoff(40) <= Duration::from_millis(300));
            assert!(p.backoff(40) >= Duration::from_millis(150));
        }
        let none = RetryPolicy {
            first_backoff: Duration::ZERO,
            ..p
        };
        assert_eq!(none.backoff(3), Duration::ZERO);
    }

    #[tokio::test]
    async fn downloads_with_digest_and_sizes_with_head() {
        let (base, _, _) = server().await;
        let fetcher = Fetcher::for_tests(None);
        let dir = tempfile::tempdir().expect("tempdir");
        let dest = dir.path().join("sub/out.txt");
        let url = format!("{base}/file");
        let got = fetcher
            .download(&url, &dest, &[Algorithm::Sha256, Algorithm::Md5], 1000)
            .await
            .expect("download");
        assert_eq!(got.size, BODY.len() as u64);
        assert_eq!(got.digests[0], (Algorithm::Sha256, sha256(BODY)));
        assert_eq!(got.digests[1].0, Algorithm::Md5);
        assert_eq!(std::fs::read(&dest).expect("read"), BODY);
        assert!(!part_path(&dest).exists());
        assert_eq!(fetcher.head_size(&url).await, Ok(Some(BODY.len() as u64)));
        assert_eq!(fetcher.head_size(&format!("{base}/nohead")).await, Ok(None));
        assert_eq!(fetcher.get_bytes(&url, 1000).await.expect("get"), BODY);
    }

    #[tokio::test]
    async fn a_404_is_permanent_and_names_the_url() {
        let (base, _, _) = server().await;
        let fetcher = Fetcher::for_tests(None);
        let dir = tempfile::tempdir().expect("tempdir");
        let url = format!("{base}/missing");
        let err = fetcher
            .download(&url, &dir.path().join("x"), &[Algorithm::Sha256], 1000)
            .await
            .expect_err("404");
        assert_eq!(
            err,
            FetchError::Permanent(format!("GET {url} returned 404 Not Found"))
        );
        assert!(!part_path(&dir.path().join("x")).exists());
        let head = fetcher.head_size(&url).await.expect_err("404");
        assert!(!head.is_recoverable());
    }

    #[tokio::test]
    async fn a_flaky_server_succeeds_after_exactly_two_retries() {
        let (base, flaky, _) = server().await;
        let fetcher = Fetcher::for_tests(None);
        let dir = tempfile::tempdir().expect("tempdir");
        let url = format!("{base}/flaky");
        let dest = dir.path().join("flaky");
        let got = fetcher
            .with_retries(&policy(3), None, &url, || {
                fetcher.download(&url, &dest, &[Algorithm::Sha256], 1000)
            })
            .await
            .expect("third try succeeds");
        assert_eq!(got.size, BODY.len() as u64);
        assert_eq!(flaky.load(Ordering::SeqCst), 3, "two retries, three calls");
    }

    #[tokio::test]
    async fn an_always_failing_server_gives_up_after_the_retries() {
        let (base, _, broken) = server().await;
        let fetcher = Fetcher::for_tests(None);
        let url = format!("{base}/broken");
        let err = fetcher
            .with_retries(&policy(2), None, &url, || fetcher.get_bytes(&url, 1000))
            .await
            .expect_err("always 500");
        assert_eq!(broken.load(Ordering::SeqCst), 3);
        assert!(err.is_recoverable());
        assert!(err.message().contains(&url), "{err}");
        assert!(err.message().contains("500 Internal Server Error"), "{err}");
        assert!(err.message().contains("3 attempts"), "{err}");
    }

    #[tokio::test]
    async fn a_refused_connection_is_recoverable() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let url = format!("http://{}/x", listener.local_addr().expect("addr"));
        drop(listener);
        let fetcher = Fetcher::for_tests(None);
        let err = fetcher.get_bytes(&url, 10).await.expect_err("refused");
        assert!(err.is_recoverable(), "{err}");
        assert!(err.message().contains(&url), "{err}");
    }

    #[tokio::test]
    async fn a_body_cut_short_is_recoverable_and_leaves_no_part_file() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}/cut", listener.local_addr().expect("addr"));
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let mut request = [0u8; 1024];
                let _ = conn.read(&mut request).await;
                let _ = conn
                    .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly this")
                    .await;
                // Dropping the connection cuts the body short.
            }
        });
        let fetcher = Fetcher::for_tests(None);
        let dir = tempfile::tempdir().expect("tempdir");
        let dest = dir.path().join("cut");
        let err = fetcher
            .download(&url, &dest, &[Algorithm::Sha256], 1000)
            .await
            .expect_err("cut short");
        assert!(err.is_recoverable(), "{err}");
        assert!(err.message().contains(&url), "{err}");
        assert!(!dest.exists() && !part_path(&dest).exists());
    }

    #[tokio::test]
    async fn more_than_max_bytes_is_refused() {
        let (base, _, _) = server().await;
        let fetcher = Fetcher::for_tests(None);
        let dir = tempfile::tempdir().expect("tempdir");
        let url = format!("{base}/file");
        let dest = dir.path().join("big");
        let err = fetcher
            .download(&url, &dest, &[Algorithm::Sha256], 5)
            .await
            .expect_err("too large");
        assert_eq!(err, too_large(&url, 5));
        assert!(err.message().contains("larger than the limit of 5 bytes"));
        assert!(!dest.exists() && !part_path(&dest).exists());
        assert_eq!(fetcher.get_bytes(&url, 5).await, Err(too_large(&url, 5)));
    }

    #[tokio::test]
    async fn file_urls_must_lie_under_the_root() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("root");
        std::fs::create_dir_all(root.join("sub")).expect("mkdir");
        std::fs::write(root.join("sub/a.txt"), BODY).expect("write");
        std::fs::write(dir.path().join("secret"), b"secret").expect("write");
        let fetcher = Fetcher::for_tests(Some(&root));
        let ok = Url::from_file_path(root.join("sub/a.txt"))
            .expect("url")
            .to_string();
        let dest = dir.path().join("out/a.txt");
        let got = fetcher
            .download(&ok, &dest, &[Algorithm::Sha256], 1000)
            .await
            .expect("under the root");
        assert_eq!(got.digests[0].1, sha256(BODY));
        assert_eq!(fetcher.head_size(&ok).await, Ok(Some(BODY.len() as u64)));
        assert_eq!(fetcher.get_bytes(&ok, 1000).await.expect("get"), BODY);

        let refused = |err: FetchError, url: &str| {
            assert!(!err.is_recoverable(), "{err}");
            assert!(err.message().contains(url), "{err}");
        };
        let passwd = "file:///etc/passwd";
        refused(
            fetcher
                .get_bytes(passwd, 1 << 20)
                .await
                .expect_err("outside"),
            passwd,
        );
        let escape = format!("{}/../secret", Url::from_file_path(&root).expect("url"));
        let err = fetcher.get_bytes(&escape, 1000).await.expect_err("escape");
        assert!(err.message().contains("not under the file root"), "{err}");
        refused(err, &escape);
        #[cfg(unix)]
        {
            std::os::unix::fs::symlink(dir.path().join("secret"), root.join("link"))
                .expect("symlink");
            let link = Url::from_file_path(root.join("link"))
                .expect("url")
                .to_string();
            refused(
                fetcher
                    .get_bytes(&link, 1000)
                    .await
                    .expect_err("symlink out"),
                &link,
            );
        }
        let missing = Url::from_file_path(root.join("nope"))
            .expect("url")
            .to_string();
        refused(
            fetcher.head_size(&missing).await.expect_err("missing"),
            &missing,
        );

        let rootless = Fetcher::for_tests(None);
        let err = rootless.get_bytes(&ok, 1000).await.expect_err("no root");
        assert!(err.message().contains("no file root"), "{err}");
        let ftp = "ftp://example.org/x";
        refused(rootless.get_bytes(ftp, 10).await.expect_err("scheme"), ftp);
    }

    /// A listener on `ip` that counts the connections it accepts and
    /// answers each with `answer`.
    async fn counting_server(ip: &str, answer: &'static [u8]) -> (String, Arc<AtomicUsize>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind((ip, 0)).await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let seen = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&seen);
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                let mut request = [0u8; 4096];
                let _ = conn.read(&mut request).await;
                let _ = conn.write_all(answer).await;
            }
        });
        (format!("http://{addr}"), seen)
    }

    const SECRET: &[u8] =
        b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\nConnection: close\r\n\r\nsecret";

    fn default_policy() -> Fetcher {
        Fetcher::with_policy(OutboundPolicy::default(), TransferLimits::default()).expect("fetcher")
    }

    fn assert_refused(err: &FetchError) {
        assert!(!err.is_recoverable(), "{err}");
        assert!(err.message().contains(REFUSED), "{err}");
        for oracle in ["connect", "refused (", "returned", "200", "timed out"] {
            assert!(!err.message().contains(oracle), "{oracle:?} in {err}");
        }
    }

    #[tokio::test]
    async fn loopback_in_every_form_is_refused_and_never_reached_without_an_allow_rule() {
        let (base, seen) = counting_server("127.0.0.1", SECRET).await;
        let port = base.rsplit(':').next().expect("port");
        let fetcher = default_policy();
        let dir = tempfile::tempdir().expect("tempdir");
        for url in [
            format!("{base}/x"),
            format!("http://2130706433:{port}/x"),
            format!("http://0x7f000001:{port}/x"),
            format!("http://127.1:{port}/x"),
            format!("http://[::ffff:127.0.0.1]:{port}/x"),
            format!("http://localhost:{port}/x"),
            format!("http://0.0.0.0:{port}/x"),
        ] {
            assert_refused(&fetcher.get_bytes(&url, 100).await.expect_err(&url));
            assert_refused(&fetcher.head_size(&url).await.expect_err(&url));
            let dest = dir.path().join("x");
            assert_refused(
                &fetcher
                    .download(&url, &dest, &[Algorithm::Sha256], 100)
                    .await
                    .expect_err(&url),
            );
        }
        assert_eq!(seen.load(Ordering::SeqCst), 0, "the server was reached");
        // With the rule, the same server answers.
        let allowed = Fetcher::for_tests(None);
        let port_url = format!("http://2130706433:{port}/x");
        assert_eq!(
            allowed.get_bytes(&port_url, 100).await.expect("allowed"),
            b"secret"
        );
        assert_eq!(seen.load(Ordering::SeqCst), 1);
    }

    // Regression: `--allow-network 127.0.0.1/32` opened every port of the
    // address (ZooKeeper's too); a rule with a port opens that port only,
    // for a literal address and a host name alike (redirect hops: the
    // protocol's test).
    #[tokio::test]
    async fn an_allow_rule_with_a_port_opens_only_that_port() {
        let (open, open_seen) = counting_server("127.0.0.1", SECRET).await;
        let (closed, closed_seen) = counting_server("127.0.0.1", SECRET).await;
        let open_port = open.rsplit(':').next().expect("port").to_owned();
        let closed_port = closed.rsplit(':').next().expect("port").to_owned();
        let policy =
            OutboundPolicy::new(&[], &[format!("127.0.0.1:{open_port}")], None).expect("policy");
        let fetcher = Fetcher::with_policy(policy, TransferLimits::default()).expect("fetcher");
        assert_eq!(
            fetcher
                .get_bytes(&format!("{open}/x"), 100)
                .await
                .expect("allowed"),
            b"secret"
        );
        assert_eq!(open_seen.load(Ordering::SeqCst), 1);
        for url in [
            format!("{closed}/x"),
            format!("http://2130706433:{closed_port}/x"),
            // A name: the resolver does not know the port, so an address
            // only a port-bound rule opens is not handed over.
            format!("http://localhost:{closed_port}/x"),
            format!("http://localhost:{open_port}/x"),
        ] {
            assert_refused(&fetcher.get_bytes(&url, 100).await.expect_err(&url));
        }
        assert_eq!(
            closed_seen.load(Ordering::SeqCst),
            0,
            "the closed port was reached"
        );
        assert_eq!(open_seen.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn the_resolver_hands_over_only_allowed_addresses() {
        use reqwest::dns::Resolve;
        let name = |n: &str| n.parse::<reqwest::dns::Name>().expect("name");
        let strict = PolicyResolver::new(Arc::new(OutboundPolicy::default()));
        let err = match strict.resolve(name("localhost")).await {
            Ok(_) => panic!("localhost resolved under the default policy"),
            Err(e) => e,
        };
        assert!(outbound::is_refused(err.as_ref()), "{err}");
        let open = PolicyResolver::new(Arc::new(
            OutboundPolicy::new(&["localhost".into()], &[], None).expect("policy"),
        ));
        let addrs: Vec<_> = open
            .resolve(name("localhost"))
            .await
            .expect("allowed")
            .collect();
        assert!(addrs.iter().any(|a| a.ip().is_loopback()), "{addrs:?}");
    }

    #[tokio::test]
    async fn a_redirect_to_a_refused_address_is_refused_and_not_followed() {
        let (forbidden, seen) = counting_server("127.0.0.2", SECRET).await;
        let port = forbidden.rsplit(':').next().expect("port").to_owned();
        let targets = [
            format!("{forbidden}/secret"),
            format!("http://2130706434:{port}/secret"),
            format!("http://localhost:{port}/secret"),
            "file:///etc/passwd".to_owned(),
        ];
        let router = Router::new().route(
            "/go/{n}",
            get(move |axum::extract::Path(n): axum::extract::Path<usize>| {
                let to = targets[n].clone();
                async move { axum::response::Redirect::temporary(&to) }
            }),
        );
        let base = serve(router).await;
        // Only the redirecting server (127.0.0.1) is allowed.
        let policy = OutboundPolicy::new(&[], &["127.0.0.1/32".into()], None).expect("policy");
        let fetcher = Fetcher::with_policy(policy, TransferLimits::default()).expect("fetcher");
        for n in 0..4 {
            let url = format!("{base}/go/{n}");
            let err = fetcher.get_bytes(&url, 100).await.expect_err(&url);
            assert_refused(&err);
            assert!(err.message().contains(&url), "{err}");
        }
        assert_eq!(seen.load(Ordering::SeqCst), 0, "the redirect was followed");
        // Allowed, the same redirect is followed.
        let open = Fetcher::for_tests(None);
        let got = open
            .get_bytes(&format!("{base}/go/0"), 100)
            .await
            .expect("followed");
        assert_eq!(got, b"secret");
        assert_eq!(seen.load(Ordering::SeqCst), 1);
    }

    /// Answers every GET with `Content-Length: total` and then one byte
    /// every `every`; HEAD with the headers only.
    async fn trickle_server(total: usize, every: Duration) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut request = [0u8; 4096];
                    let n = conn.read(&mut request).await.unwrap_or(0);
                    let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {total}\r\n\r\n");
                    if conn.write_all(head.as_bytes()).await.is_err()
                        || request[..n].starts_with(b"HEAD")
                    {
                        return;
                    }
                    for _ in 0..total {
                        tokio::time::sleep(every).await;
                        if conn.write_all(b"x").await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        format!("http://{addr}/slow")
    }

    #[tokio::test]
    async fn a_transfer_under_the_minimum_rate_is_cut_naming_the_url() {
        let url = trickle_server(10_000, Duration::from_millis(100)).await;
        let policy = OutboundPolicy::new(&[], &["127.0.0.1/32".into()], None).expect("policy");
        let limits = TransferLimits {
            min_rate: 1000,
            window: Duration::from_secs(1),
        };
        let fetcher = Fetcher::with_policy(policy, limits).expect("fetcher");
        let dir = tempfile::tempdir().expect("tempdir");
        let dest = dir.path().join("slow");
        let err = fetcher
            .download(&url, &dest, &[Algorithm::Sha256], 1 << 20)
            .await
            .expect_err("too slow");
        assert!(err.is_recoverable(), "{err}");
        assert!(err.message().contains(&url), "{err}");
        assert!(
            err.message()
                .contains("minimum transfer rate of 1000 bytes/s"),
            "{err}"
        );
        assert!(!dest.exists() && !part_path(&dest).exists());
        let err = fetcher
            .get_bytes(&url, 1 << 20)
            .await
            .expect_err("too slow");
        assert!(err.message().contains("minimum transfer rate"), "{err}");
    }

    #[tokio::test]
    async fn a_stall_shorter_than_the_window_is_fine() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}/stall", listener.local_addr().expect("addr"));
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let mut request = [0u8; 4096];
                let _ = conn.read(&mut request).await;
                let _ = conn
                    .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2000\r\n\r\n")
                    .await;
                let _ = conn.write_all(&[b'a'; 1000]).await;
                tokio::time::sleep(Duration::from_millis(300)).await;
                let _ = conn.write_all(&[b'b'; 1000]).await;
            }
        });
        let limits = TransferLimits {
            min_rate: 10,
            window: Duration::from_secs(2),
        };
        let policy = OutboundPolicy::new(&[], &["127.0.0.1/32".into()], None).expect("policy");
        let fetcher = Fetcher::with_policy(policy, limits).expect("fetcher");
        assert_eq!(
            fetcher
                .get_bytes(&url, 5000)
                .await
                .expect("stalled briefly")
                .len(),
            2000
        );
    }
}
