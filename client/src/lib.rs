//! `ingest-client`: one typed HTTP client of the `ingest` API.
//!
//! The workers, the remote CLI (`ingest --engine URL …`), the load driver
//! and the tests all talk to a server through [`Client`]; request and
//! response bodies are `ingest_protocol`'s types, so nobody writes a
//! `json!` body or reads `v["…"]` to learn what the server said. Every
//! call names an [`Endpoint`] of `ingest_protocol::endpoint`
//! ([`Client::call`], [`Client::report`] for a worker's fenced reports):
//! its path, body and reply come from one type, so they cannot disagree.
//!
//! Errors keep what a caller decides on: a [`ClientError::Status`] keeps
//! the HTTP status and the server's stable error code, so a retry decision
//! reads [`ClientError::is_retryable`], never the wording of a message.
//!
//! ```no_run
//! # async fn demo() -> Result<(), ingest_client::ClientError> {
//! use ingest_client::Client;
//!
//! let client = Client::new("http://127.0.0.1:7878", "admin-token-of-16+chars")?;
//! let status = client.status().await?;
//! println!("{} live jobs", status.live_jobs);
//! # Ok(()) }
//! ```
//!
//! An endpoint's body and reply are its own: the report of a job's step
//! outcome takes an `OutcomeBody` and answers a `JobMoved`,
//!
//! ```no_run
//! # async fn demo(client: ingest_client::Client, fence: ingest_protocol::fence::FenceSecret, body: ingest_protocol::api::OutcomeBody) -> Result<(), ingest_client::ClientError> {
//! use ingest_protocol::endpoint::JobOutcome;
//! let reply: ingest_client::Reply<ingest_protocol::api::JobMoved> =
//!     client.report(&JobOutcome(ingest_events::Jid(7)), &fence, &body).await?;
//! # Ok(()) }
//! ```
//!
//! and another body does not compile:
//!
//! ```compile_fail
//! # async fn demo(client: ingest_client::Client, fence: ingest_protocol::fence::FenceSecret, body: ingest_protocol::api::RetryBody) -> Result<(), ingest_client::ClientError> {
//! use ingest_protocol::endpoint::JobOutcome;
//! let reply: ingest_client::Reply<ingest_protocol::api::JobMoved> =
//!     client.report(&JobOutcome(ingest_events::Jid(7)), &fence, &body).await?;
//! # Ok(()) }
//! ```
#![deny(missing_docs)]

use std::time::Duration;

use ingest_events::{Bid, Jid};
use ingest_protocol::api::{
    AdminBody, Appended, CleanedUp, CleanupBody, DiffRepairBody, DiffRepaired, Diffed, ErrorBody,
    History, Submitted, Verified,
};
use ingest_protocol::endpoint::{self, AdminAction, Endpoint, Fenced, NoBody};
use ingest_protocol::fence::{FenceSecret, FENCE_HEADER};
use ingest_protocol::report::BatchView;
use ingest_protocol::submission::SubmissionInput;
use ingest_protocol::view::{JobView, StatusView};
pub use reqwest::Method;
use serde::Serialize;

/// The longest piece of a server's answer kept in an error message.
const MAX_ERROR_TEXT: usize = 1024;

/// What a fenced worker report got: accepted, or refused with 409.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply<T> {
    /// 2xx: the decoded body.
    Done(T),
    /// 409: the report was refused (`lock_not_held`, `stale_report`,
    /// `queue_paused`, …); nothing was appended and the result is discarded.
    Refused {
        /// The stable error code.
        code: String,
        /// The server's message.
        message: String,
    },
}

/// Why a call did not give an answer the caller can use.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The base URL is not an `http://` or `https://` URL.
    ///
    /// ### Handling
    /// A configuration error: fix `--engine`.
    #[error("{base:?} is not a server URL like http://127.0.0.1:7878: {reason}")]
    InvalidBase {
        /// The base given.
        base: String,
        /// What is wrong with it.
        reason: String,
    },
    /// No answer: connection refused, reset, timed out.
    ///
    /// ### Handling
    /// Retry later; the request may or may not have been carried out (a
    /// command with a uuid is idempotent, others must be re-read).
    #[error("{method} {url}: no answer: {message}")]
    Transport {
        /// The method.
        method: String,
        /// The URL called.
        url: String,
        /// Whether no connection was made (nothing was sent).
        connect: bool,
        /// What the transport said.
        message: String,
    },
    /// The server answered with a status other than 2xx (and other than
    /// 409 for [`Client::report`]).
    ///
    /// ### Handling
    /// 4xx: the request is wrong and a retry gives the same answer (but 408
    /// and 429); 5xx (notably 503): retry later.
    #[error("{method} {url}: {status} {code}: {message}")]
    Status {
        /// The method.
        method: String,
        /// The URL called.
        url: String,
        /// The HTTP status.
        status: u16,
        /// The server's stable error code (`invalid_field`, `not_found`, …).
        code: String,
        /// The server's message (bounded).
        message: String,
    },
    /// A 2xx answer whose body is not the expected type.
    ///
    /// ### Handling
    /// A client and server of different versions: not retryable.
    #[error("{method} {url}: the answer is not what this client expects: {message}")]
    Decode {
        /// The method.
        method: String,
        /// The URL called.
        url: String,
        /// The decoder's message.
        message: String,
    },
}

impl ClientError {
    /// The HTTP status, when the server answered.
    pub fn status(&self) -> Option<u16> {
        match self {
            ClientError::Status { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// The server's error code, when it answered with one.
    pub fn code(&self) -> Option<&str> {
        match self {
            ClientError::Status { code, .. } => Some(code),
            _ => None,
        }
    }

    /// Whether the same call may succeed later: no answer, 408, 429 or 5xx.
    pub fn is_retryable(&self) -> bool {
        match self {
            ClientError::Transport { .. } => true,
            ClientError::Status { status, .. } => {
                matches!(status, 408 | 429) || (500..600).contains(status)
            }
            _ => false,
        }
    }
}

/// A client of one server with one bearer token. Cheap to clone.
#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    /// The engines of a group, in the order given (one for a single engine).
    bases: std::sync::Arc<Vec<String>>,
    /// The one calls go to: the leader, once one answered or redirected.
    current: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    token: String,
    observer: Option<std::sync::Arc<dyn Observer>>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("base", &self.base())
            .field("observed", &self.observer.is_some())
            .finish_non_exhaustive()
    }
}

/// One call a [`Client`] made, as its [`Observer`] sees it.
#[derive(Debug)]
pub struct Call<'a> {
    /// The method.
    pub method: &'a Method,
    /// The path and query (`/jobs/jid0000000001/outcome`).
    pub path: &'a str,
    /// The request body, as JSON.
    pub body: Option<&'a serde_json::Value>,
    /// The answer's status; `None` when no answer came.
    pub status: Option<u16>,
    /// The server's error code, for an error answer.
    pub code: Option<&'a str>,
    /// How long the call took.
    pub elapsed: Duration,
}

/// Sees every call a client makes, after it is answered (a worker's
/// metrics count its reports, retries and refusals this way).
pub trait Observer: Send + Sync {
    /// One call, answered or not.
    fn observe(&self, call: &Call<'_>);
}

/// The most engines one client is given.
pub const MAX_ENGINES: usize = 16;

/// The default timeout of one call.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

impl Client {
    /// A client of the API at `base` (`http://host:port`) using `token`,
    /// with [`DEFAULT_TIMEOUT`]. `base` may name several engines of a
    /// replicated group, separated by commas: calls go to the one that
    /// leads (a follower's `307` to another of them is followed, and an
    /// engine that cannot be reached or that answers `not_leader` is left for
    /// the next).
    ///
    /// # Errors
    /// [`ClientError::InvalidBase`] when `base` is not an http(s) URL.
    pub fn new(base: &str, token: &str) -> Result<Client, ClientError> {
        Client::with_timeout(base, token, DEFAULT_TIMEOUT)
    }

    /// As [`Client::new`], with a timeout per call.
    ///
    /// # Errors
    /// See [`Client::new`].
    pub fn with_timeout(base: &str, token: &str, timeout: Duration) -> Result<Client, ClientError> {
        let invalid = |reason: String| ClientError::InvalidBase {
            base: ingest_protocol::cut(base, 200).into_owned(),
            reason,
        };
        let mut bases = Vec::new();
        for one in base.split(',').map(str::trim).filter(|b| !b.is_empty()) {
            let url = reqwest::Url::parse(one).map_err(|e| invalid(e.to_string()))?;
            if !matches!(url.scheme(), "http" | "https") {
                return Err(invalid("the URL must be http:// or https://".into()));
            }
            bases.push(one.trim_end_matches('/').to_string());
        }
        if bases.is_empty() {
            return Err(invalid("no URL given".into()));
        }
        if bases.len() > MAX_ENGINES {
            return Err(invalid(format!("at most {MAX_ENGINES} engines")));
        }
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(Duration::from_secs(10).min(timeout))
            // A follower's redirect is followed by the client itself, and
            // only to an engine it was given (never with the token to a
            // host a follower names).
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| invalid(e.to_string()))?;
        Ok(Client {
            http,
            bases: std::sync::Arc::new(bases),
            current: std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0)),
            token: token.to_string(),
            observer: None,
        })
    }

    /// This client, with every call shown to `observer`.
    pub fn observed(mut self, observer: std::sync::Arc<dyn Observer>) -> Client {
        self.observer = Some(observer);
        self
    }

    /// The base URL calls go to now (of the engines given, the one that
    /// last answered as the leader).
    pub fn base(&self) -> &str {
        let i = self.current.load(std::sync::atomic::Ordering::Relaxed);
        &self.bases[i.min(self.bases.len() - 1)]
    }

    /// Every engine this client was given.
    pub fn bases(&self) -> &[String] {
        &self.bases
    }

    /// Makes `base` (one of [`Client::bases`]) the one calls go to;
    /// false when it is not one of them.
    fn switch_to(&self, base: &str) -> bool {
        match self.bases.iter().position(|b| b == base) {
            Some(i) => {
                self.current.store(i, std::sync::atomic::Ordering::Relaxed);
                true
            }
            None => false,
        }
    }

    /// Moves on to the next engine given (after one that cannot be reached
    /// or does not lead).
    fn rotate(&self, from: usize) {
        let next = (from + 1) % self.bases.len();
        let _ = self.current.compare_exchange(
            from,
            next,
            std::sync::atomic::Ordering::Relaxed,
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    async fn raw<B: Serialize + ?Sized>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
    ) -> Result<(reqwest::StatusCode, String, String), ClientError> {
        self.raw_with(method, path, body, None).await
    }

    /// As [`Client::raw`], with the lock holder's secret in the
    /// [`FENCE_HEADER`] when there is one.
    async fn raw_with<B: Serialize + ?Sized>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
        fence: Option<&FenceSecret>,
    ) -> Result<(reqwest::StatusCode, String, String), ClientError> {
        // With several engines: at most one try per engine, plus one for
        // the redirect of a follower to the leader.
        let tries = if self.bases.len() > 1 {
            self.bases.len() + 1
        } else {
            1
        };
        let mut attempt = 0;
        loop {
            attempt += 1;
            let at = self.current.load(std::sync::atomic::Ordering::Relaxed) % self.bases.len();
            let result = self
                .raw_once(&method, path, body, fence, &self.bases[at])
                .await;
            if attempt >= tries {
                return result;
            }
            match &result {
                // Not even connected: nothing was sent; the next engine.
                Err(ClientError::Transport { connect: true, .. }) => self.rotate(at),
                Ok((status, _, text)) if status.as_u16() == 307 => {
                    let leader = serde_json::from_str::<ErrorBody>(text)
                        .ok()
                        .and_then(|b| b.error.leader);
                    match leader {
                        Some(l) if self.switch_to(l.trim_end_matches('/')) => {}
                        _ => self.rotate(at),
                    }
                }
                // This engine does not lead, or cannot reach ZooKeeper: another
                // may (the last one's answer is returned when none does).
                Ok((status, _, text))
                    if status.as_u16() == 503
                        && serde_json::from_str::<ErrorBody>(text).is_ok_and(|b| {
                            matches!(b.error.code.as_str(), "not_leader" | "no_quorum")
                        }) =>
                {
                    self.rotate(at)
                }
                _ => return result,
            }
        }
    }

    /// One call to the engine at `base`.
    async fn raw_once<B: Serialize + ?Sized>(
        &self,
        method: &Method,
        path: &str,
        body: Option<&B>,
        fence: Option<&FenceSecret>,
        base: &str,
    ) -> Result<(reqwest::StatusCode, String, String), ClientError> {
        let method = method.clone();
        let url = format!("{base}{path}");
        let mut req = self
            .http
            .request(method.clone(), &url)
            .bearer_auth(&self.token);
        if let Some(fence) = fence {
            req = req.header(FENCE_HEADER, fence.to_header());
        }
        if let Some(b) = body {
            req = req.json(b);
        }
        let transport = |e: reqwest::Error| ClientError::Transport {
            method: method.to_string(),
            url: url.clone(),
            connect: e.is_connect(),
            message: e.to_string(),
        };
        let started = std::time::Instant::now();
        let answer = async {
            let resp = req.send().await.map_err(transport)?;
            let status = resp.status();
            let text = resp.text().await.map_err(transport)?;
            Ok((status, text))
        }
        .await;
        if let Some(observer) = &self.observer {
            let json = body.and_then(|b| serde_json::to_value(b).ok());
            let (status, error) = match &answer {
                Ok((status, text)) if !status.is_success() => (
                    Some(status.as_u16()),
                    serde_json::from_str::<ErrorBody>(text).ok(),
                ),
                Ok((status, _)) => (Some(status.as_u16()), None),
                Err(_) => (None, None),
            };
            observer.observe(&Call {
                method: &method,
                path,
                body: json.as_ref(),
                status,
                code: error.as_ref().map(|e| e.error.code.as_str()),
                elapsed: started.elapsed(),
            });
        }
        let (status, text) = answer?;
        Ok((status, url, text))
    }

    fn status_error(method: &Method, url: String, status: u16, text: &str) -> ClientError {
        let body: ErrorBody = serde_json::from_str(text).unwrap_or_default();
        let message = if body.error.message.is_empty() {
            ingest_protocol::cut(text.trim(), MAX_ERROR_TEXT).into_owned()
        } else {
            ingest_protocol::cut(&body.error.message, MAX_ERROR_TEXT).into_owned()
        };
        ClientError::Status {
            method: method.to_string(),
            url,
            status,
            code: body.error.code,
            message,
        }
    }

    fn decode<E: Endpoint>(
        method: &Method,
        url: String,
        text: &str,
    ) -> Result<E::Reply, ClientError> {
        E::reply(text).map_err(|e| ClientError::Decode {
            method: method.to_string(),
            url,
            message: e.to_string(),
        })
    }

    /// The method of `E` as `reqwest` names it.
    fn method_of<E: Endpoint>() -> Method {
        match E::METHOD {
            endpoint::Method::Get => Method::GET,
            endpoint::Method::Post => Method::POST,
            endpoint::Method::Delete => Method::DELETE,
        }
    }

    /// Calls `endpoint` with `body` (sent when the endpoint takes one) and
    /// reads a 2xx answer as its reply: the path, the body and the reply
    /// come from one [`Endpoint`], so they cannot disagree.
    ///
    /// # Errors
    /// [`ClientError::Status`] for any other status, or no answer, or an
    /// answer of another shape.
    pub async fn call<E: Endpoint>(
        &self,
        endpoint: &E,
        body: &E::Body,
    ) -> Result<E::Reply, ClientError> {
        let method = Client::method_of::<E>();
        let path = endpoint.path();
        let body = E::HAS_BODY.then_some(body);
        let (status, url, text) = self.raw(method.clone(), &path, body).await?;
        if !status.is_success() {
            return Err(Client::status_error(&method, url, status.as_u16(), &text));
        }
        Client::decode::<E>(&method, url, &text)
    }

    /// [`Client::call`] of an endpoint that sends no body.
    ///
    /// # Errors
    /// As [`Client::call`].
    pub async fn get<E: Endpoint<Body = NoBody>>(
        &self,
        endpoint: &E,
    ) -> Result<E::Reply, ClientError> {
        self.call(endpoint, &NoBody).await
    }

    /// Sends a fenced worker report to `endpoint`, with the lock's secret:
    /// 2xx is [`Reply::Done`], 409 [`Reply::Refused`].
    ///
    /// # Errors
    /// As [`Client::call`], for answers other than 2xx and 409.
    pub async fn report<E: Fenced>(
        &self,
        endpoint: &E,
        fence: &FenceSecret,
        body: &E::Body,
    ) -> Result<Reply<E::Reply>, ClientError> {
        let method = Client::method_of::<E>();
        let path = endpoint.path();
        let body = E::HAS_BODY.then_some(body);
        let (status, url, text) = self
            .raw_with(method.clone(), &path, body, Some(fence))
            .await?;
        if status.is_success() {
            return Client::decode::<E>(&method, url, &text).map(Reply::Done);
        }
        if status == reqwest::StatusCode::CONFLICT {
            let body: ErrorBody = serde_json::from_str(&text).unwrap_or_default();
            return Ok(Reply::Refused {
                code: body.error.code,
                message: ingest_protocol::cut(&body.error.message, MAX_ERROR_TEXT).into_owned(),
            });
        }
        Err(Client::status_error(&method, url, status.as_u16(), &text))
    }

    /// `POST /batches`.
    ///
    /// # Errors
    /// As [`Client::call`]; 422 names the field.
    pub async fn submit(&self, body: &SubmissionInput) -> Result<Submitted, ClientError> {
        self.call(&endpoint::Submit, body).await
    }

    /// `GET /batches/{bid}`.
    ///
    /// # Errors
    /// As [`Client::call`].
    pub async fn batch(&self, bid: Bid) -> Result<BatchView, ClientError> {
        self.get(&endpoint::GetBatch(bid)).await
    }

    /// `GET /reporting-batches?status=…`: the batches the engine has in
    /// `status` (`Reporting` or `UpdateReporting`), oldest first (worker
    /// token).
    ///
    /// # Errors
    /// As [`Client::call`]; 400 `invalid_query` names the parameter.
    pub async fn reporting_batches(
        &self,
        status: &str,
    ) -> Result<ingest_protocol::api::ReportingBatches, ClientError> {
        self.get(&endpoint::ListReporting(status.to_string())).await
    }

    /// `GET /batches?…`: one page of the batches `query` asks for.
    ///
    /// # Errors
    /// As [`Client::call`]; 400 `invalid_query` names the parameter.
    pub async fn list_batches(
        &self,
        query: &ingest_protocol::listing::BatchQuery,
    ) -> Result<ingest_protocol::listing::BatchPage, ClientError> {
        self.get(&endpoint::ListBatches(query.clone())).await
    }

    /// `GET /jobs?…`: one page of the jobs `query` asks for.
    ///
    /// # Errors
    /// As [`Client::call`]; 400 `invalid_query` names the parameter.
    pub async fn list_jobs(
        &self,
        query: &ingest_protocol::listing::JobQuery,
    ) -> Result<ingest_protocol::listing::JobPage, ClientError> {
        self.get(&endpoint::ListJobs(query.clone())).await
    }

    /// `GET /jobs/{jid}`.
    ///
    /// # Errors
    /// As [`Client::call`].
    pub async fn job(&self, jid: Jid) -> Result<JobView, ClientError> {
        self.get(&endpoint::GetJob(jid)).await
    }

    /// `GET /batches/{bid}/history`.
    ///
    /// # Errors
    /// As [`Client::call`].
    pub async fn batch_history(&self, bid: Bid) -> Result<History, ClientError> {
        self.get(&endpoint::BatchHistory(bid)).await
    }

    /// `GET /jobs/{jid}/history`.
    ///
    /// # Errors
    /// As [`Client::call`].
    pub async fn job_history(&self, jid: Jid) -> Result<History, ClientError> {
        self.get(&endpoint::JobHistory(jid)).await
    }

    /// `GET /history?…`: the events `query` asks for (a batch, a job or the
    /// whole log, by time, actor and collection).
    ///
    /// # Errors
    /// As [`Client::call`]; 400 `invalid_query` names the parameter.
    pub async fn history(
        &self,
        query: &ingest_protocol::history::HistoryQuery,
    ) -> Result<History, ClientError> {
        self.get(&endpoint::SearchHistory(query.clone())).await
    }

    /// `GET /status`.
    ///
    /// # Errors
    /// As [`Client::call`].
    pub async fn status(&self) -> Result<StatusView, ClientError> {
        self.get(&endpoint::GetStatus).await
    }

    /// `GET /verify`.
    ///
    /// # Errors
    /// As [`Client::call`].
    pub async fn verify(&self) -> Result<Verified, ClientError> {
        self.get(&endpoint::Verify).await
    }

    /// `GET /audit/bundle?batch=BID`: the batch's audit bundle, as the JSON
    /// text `ingest audit export` writes.
    ///
    /// # Errors
    /// As [`Client::call`]; 409 `audit_refused` when no signed
    /// checkpoint covers the batch yet.
    pub async fn audit_bundle(&self, bid: &str) -> Result<String, ClientError> {
        self.get(&endpoint::AuditBundle(bid.to_string())).await
    }

    /// `GET /audit/proof?from=POS&to=POS`: the consistency proof between
    /// two signed checkpoints, as the JSON text `ingest audit prove` writes.
    ///
    /// # Errors
    /// As [`Client::call`]; 409 `audit_refused` when a position is not
    /// a signed checkpoint.
    pub async fn audit_proof(&self, from: u64, to: u64) -> Result<String, ClientError> {
        self.get(&endpoint::AuditProof { from, to }).await
    }

    /// `POST /jobs/{jid}/waiting`: why this worker keeps the job waiting in
    /// `state` (shown with the job until it moves on).
    ///
    /// # Errors
    /// As [`Client::call`]; 409 `not_in_state` when the job moved on.
    pub async fn job_waiting(
        &self,
        jid: Jid,
        state: &str,
        reason: &str,
    ) -> Result<(), ClientError> {
        let body = ingest_protocol::api::WaitingBody {
            state: state.to_string(),
            reason: reason.to_string(),
        };
        self.call(&endpoint::JobWaiting(jid), &body)
            .await
            .map(|_| ())
    }

    /// `GET /diff`.
    ///
    /// # Errors
    /// As [`Client::call`].
    pub async fn diff(&self) -> Result<Diffed, ClientError> {
        self.get(&endpoint::Diff).await
    }

    /// `POST /diff/repair`: the running projector converges every drifted
    /// item to the log and records it.
    ///
    /// # Errors
    /// As [`Client::call`]; 409 `needs_projector` from a server without a
    /// projector.
    pub async fn diff_repair(&self, body: &DiffRepairBody) -> Result<DiffRepaired, ClientError> {
        self.call(&endpoint::DiffRepair, body).await
    }

    /// An admin action (`POST /jobs/{jid}/requeue`, `DELETE /batches/{bid}`,
    /// …) with its actor and reason.
    ///
    /// # Errors
    /// As [`Client::call`].
    pub async fn admin(
        &self,
        action: &AdminAction,
        body: &AdminBody,
    ) -> Result<Appended, ClientError> {
        use AdminAction as A;
        match action {
            A::HoldJob(e) => self.call(e, body).await,
            A::ReleaseJob(e) => self.call(e, body).await,
            A::RequeueJob(e) => self.call(e, body).await,
            A::FailJob(e) => self.call(e, body).await,
            A::DeleteJob(e) => self.call(e, body).await,
            A::ReleaseBatch(e) => self.call(e, body).await,
            A::UpdateReporting(e) => self.call(e, body).await,
            A::DeleteBatch(e) => self.call(e, body).await,
            A::HoldCollection(e) => self.call(e, body).await,
            A::ReleaseCollection(e) => self.call(e, body).await,
            A::ReleaseCollectionJobs(e) => self.call(e, body).await,
            A::PauseQueue(e) => self.call(e, body).await,
            A::ResumeQueue(e) => self.call(e, body).await,
            A::RequeueAccess(e) => self.call(e, body).await,
            A::DeleteAccess(e) => self.call(e, body).await,
            A::PauseAccessQueue(e) => self.call(e, body).await,
            A::ResumeAccessQueue(e) => self.call(e, body).await,
        }
    }

    /// `POST /cleanup`.
    ///
    /// # Errors
    /// As [`Client::call`].
    pub async fn cleanup(&self, body: &CleanupBody) -> Result<CleanedUp, ClientError> {
        self.call(&endpoint::Cleanup, body).await
    }

    /// `POST /access`: queues an assembly request.
    ///
    /// # Errors
    /// As [`Client::call`]; 422 names the field.
    pub async fn request_access(
        &self,
        body: &ingest_protocol::access::AccessRequestBody,
    ) -> Result<ingest_protocol::access::AccessMoved, ClientError> {
        self.call(&endpoint::RequestAccess, body).await
    }

    /// `GET /access`.
    ///
    /// # Errors
    /// As [`Client::call`].
    pub async fn access_list(&self) -> Result<ingest_protocol::access::AccessList, ClientError> {
        self.get(&endpoint::ListAccess).await
    }

    /// `GET /access/{qid}`.
    ///
    /// # Errors
    /// As [`Client::call`].
    pub async fn access(
        &self,
        qid: ingest_events::Qid,
    ) -> Result<ingest_protocol::access::AccessView, ClientError> {
        self.get(&endpoint::GetAccess(qid)).await
    }
}
