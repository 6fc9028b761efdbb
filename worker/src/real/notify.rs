//! Notify: the profile's callback (an HTTP POST of the job's outcome,
//! retried with backoff), then the job's working directory is removed and
//! the job goes to Completed.
//!
//! A callback that still fails when its retries run out fails the job (the
//! design's rule): the message names the URL, and an admin requeue resumes
//! here. The working directory is kept until the callback succeeded, so a
//! failed job can still be inspected.

use std::sync::Arc;

use ingest_protocol::callback::JobCallback;

use ingest_protocol::profile::Notification;

use super::fetch::{request_error, Fetcher, RetryPolicy};
use super::mail::{MailError, Outbox};
use super::RealConfig;
use crate::step::{JobCtx, JobData, Outcome, Step, StepError, StepFuture, StepResult};

/// The Notify step.
pub struct Notify {
    fetcher: Arc<Fetcher>,
    config: Arc<RealConfig>,
}

impl Notify {
    /// The step; callbacks go through `fetcher` (its HTTP client, under
    /// the outbound policy).
    pub fn new(fetcher: Arc<Fetcher>, config: Arc<RealConfig>) -> Notify {
        Notify { fetcher, config }
    }
}

impl Step for Notify {
    fn run<'a>(&'a self, job: &'a JobCtx) -> StepFuture<'a> {
        Box::pin(async move {
            let outcome = match job.data().await {
                Ok(data) => self.notify(job, &data).await,
                Err(e) => Outcome::failure(format!("notify: {e}")),
            };
            StepResult::Report(outcome)
        })
    }
}

impl Notify {
    async fn notify(&self, job: &JobCtx, data: &JobData) -> Outcome {
        let profile_name = data.configuration.profile_name.as_str();
        let callback = self
            .config
            .profiles
            .get(profile_name)
            .and_then(|p| p.notification.callback_url.clone())
            .filter(|u| !u.trim().is_empty());
        let notified = match &callback {
            Some(url) => {
                let body = callback_body(&job.jid.to_string(), data);
                if let Err(e) =
                    post_callback(&self.fetcher, url, &body, self.config.retry(), Some(job)).await
                {
                    return Outcome::from(e);
                }
                format!("notified {url}")
            }
            None => format!("notified nobody (profile {profile_name:?} has no callback URL)"),
        };
        let removed = match remove_job_dir(&self.config, &data.bid, &job.jid.to_string()).await {
            Ok(_) => "removed the working directory".to_string(),
            // The depositor has been told; failing now would only call the
            // callback again on requeue. The directory is left for an admin.
            Err(e) => {
                tracing::warn!(jid = %job.jid, error = %ingest_protocol::bounded(&e), "cannot remove the working directory");
                format!("kept the working directory: {e}")
            }
        };
        Outcome::success(format!("{notified}; {removed}"))
    }
}

/// The callback's body for a job that completed.
pub fn callback_body(jid: &str, data: &JobData) -> JobCallback {
    JobCallback {
        jid: jid.to_string(),
        bid: data.bid.clone(),
        status: "Completed".into(),
        ark: Some(data.identifiers.primary_id.clone()).filter(|a| !a.is_empty()),
        local_ids: data.identifiers.local_id.clone(),
        profile: data.configuration.profile_name.clone(),
        submitter: data.configuration.submitter.clone(),
        message: format!("job {jid} of batch {} completed", data.bid),
    }
}

/// Tells a profile's recipients of something that ended (a batch's
/// report, an access request's delivery): one callback client, one outbox.
#[derive(Debug)]
pub struct Teller {
    fetcher: Arc<Fetcher>,
    outbox: Outbox,
    policy: RetryPolicy,
}

impl Teller {
    /// Callbacks through `fetcher` with `config`'s retries; mail through
    /// the outbox and SMTP server of `config`.
    ///
    /// # Errors
    /// A bad mail setting (see [`Outbox::new`]).
    pub fn new(fetcher: Arc<Fetcher>, config: &RealConfig) -> Result<Teller, MailError> {
        Ok(Teller {
            fetcher,
            outbox: Outbox::new(config)?,
            policy: config.retry(),
        })
    }

    /// The outbox e-mails go to.
    pub fn outbox(&self) -> &Outbox {
        &self.outbox
    }

    /// POSTs `body` to the callback URL (with retries) and e-mails `mail`
    /// to the addresses, each when `notification` has it.
    ///
    /// # Errors
    /// `Some` with every failure (a callback that still fails, a message
    /// neither sent nor written to the outbox, or one written to the outbox
    /// because SMTP failed, prefixed with [`Mail::what`]), joined by `; `;
    /// `None` when everything was sent.
    pub async fn tell(
        &self,
        notification: &Notification,
        body: &impl serde::Serialize,
        mail: Mail<'_>,
    ) -> Option<String> {
        let mut errors = Vec::new();
        if let Some(url) = notification
            .callback_url
            .as_deref()
            .filter(|u| !u.trim().is_empty())
        {
            if let Err(e) = post_callback(&self.fetcher, url, body, self.policy, None).await {
                errors.push(e.to_string());
            }
        }
        if !notification.emails.is_empty() {
            match self
                .outbox
                .send(&notification.emails, mail.subject, mail.text)
                .await
            {
                Ok(delivery) => tracing::info!(subject = mail.subject, ?delivery, "e-mailed"),
                Err(e) => errors.push(format!("{}: {e}", mail.what)),
            }
        }
        match errors.is_empty() {
            true => None,
            false => Some(errors.join("; ")),
        }
    }
}

/// An e-mail [`Teller::tell`] sends.
#[derive(Debug, Clone, Copy)]
pub struct Mail<'a> {
    /// What it is, for an error (`the report e-mail`).
    pub what: &'a str,
    /// Its subject.
    pub subject: &'a str,
    /// Its body.
    pub text: &'a str,
}

/// POSTs `body` to `url`, retrying recoverable errors (connection errors,
/// timeouts, HTTP 5xx and 429) per `policy`; each retry is recorded with
/// `job.record_retry` when there is a job (batch reports have none). The
/// URL passes the outbound policy first (and its redirects and resolved
/// addresses in the client).
///
/// # Errors
/// A URL the outbound policy refuses ("refused by outbound policy", not
/// retried), another HTTP status (not retried), or a recoverable error that persists
/// when the retries run out; the message names the URL, the last status or
/// error and the number of attempts.
pub async fn post_callback(
    fetcher: &Fetcher,
    url: &str,
    body: &impl serde::Serialize,
    policy: RetryPolicy,
    job: Option<&JobCtx>,
) -> Result<(), StepError> {
    let checked = fetcher
        .check_http(url)
        .map_err(|e| format!("callback {}", e.message()))?;
    let client = fetcher.client();
    let post = || async {
        // The message completes "callback URL URL …" or, for a request
        // without an answer, is fetch's own message (which names the URL).
        match client.post(checked.clone()).json(body).send().await {
            Ok(resp) if resp.status().is_success() => Ok(()),
            Ok(resp) => {
                let status = resp.status();
                Err(CallbackError {
                    message: format!("callback URL {url} returned {}", status.as_u16()),
                    recoverable: status.is_server_error()
                        || status == reqwest::StatusCode::TOO_MANY_REQUESTS
                        || status == reqwest::StatusCode::REQUEST_TIMEOUT,
                })
            }
            Err(e) => {
                let e = request_error("POST", url, &e);
                Err(CallbackError {
                    message: format!("callback {}", e.message()),
                    recoverable: e.is_recoverable(),
                })
            }
        }
    };
    match crate::retry::retry(&policy, job, "the callback", post).await {
        Ok(()) => {
            tracing::info!(url, "callback delivered");
            Ok(())
        }
        Err(gave_up) if gave_up.error.recoverable => Err(StepError::permanent(format!(
            "{} after {} attempt{}",
            gave_up.error.message,
            gave_up.attempts,
            if gave_up.attempts == 1 { "" } else { "s" }
        ))),
        Err(gave_up) => Err(StepError::permanent(gave_up.error.message)),
    }
}

/// A callback that did not go through, and whether trying again may help.
#[derive(Debug)]
struct CallbackError {
    message: String,
    recoverable: bool,
}

impl std::fmt::Display for CallbackError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl crate::retry::Retryable for CallbackError {
    fn is_retryable(&self) -> bool {
        self.recoverable
    }
}

/// Removes the job's working directory (absent is fine) and says which.
///
/// # Errors
/// A batch or job id that is not a plain name (it could point outside
/// working storage), or a removal that failed.
async fn remove_job_dir(config: &RealConfig, bid: &str, jid: &str) -> Result<String, StepError> {
    let plain = |id: &str| {
        !id.is_empty()
            && id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    };
    if !plain(bid) || !plain(jid) {
        return Err(StepError::permanent(format!(
            "batch {bid:?} / job {jid:?} is not a plain name; nothing removed"
        )));
    }
    let dir = super::job_dir(&config.work_dir, bid, jid);
    let shown = dir.display().to_string();
    let removed = crate::bulk::spawn(move || std::fs::remove_dir_all(&dir))
        .await
        .map_err(|e| format!("the removal of {shown} failed: {e}"))?;
    match removed {
        Ok(()) => Ok(shown),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(format!("{shown} (already gone)")),
        Err(e) => Err(StepError::permanent(format!("cannot remove {shown}: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    /// A node value as a worker reads it.
    fn node<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
        serde_json::from_value(v).expect("a node")
    }
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;
    use std::time::Duration;

    use axum::extract::State;
    use axum::http::StatusCode;
    use axum::routing::post;
    use axum::{Json, Router};
    use ingest_events::JobState;

    use super::*;

    /// A callback server answering `script[i]` to the i-th POST (the last
    /// entry for every later one), recording every body.
    #[derive(Clone, Default)]
    struct Callback {
        script: Arc<Vec<u16>>,
        calls: Arc<AtomicUsize>,
        bodies: Arc<Mutex<Vec<Value>>>,
    }

    async fn answer(State(cb): State<Callback>, Json(body): Json<Value>) -> StatusCode {
        let i = cb.calls.fetch_add(1, Ordering::SeqCst);
        cb.bodies.lock().expect("lock").push(body);
        let code = cb
            .script
            .get(i)
            .or(cb.script.last())
            .copied()
            .unwrap_or(200);
        StatusCode::from_u16(code).unwrap_or(StatusCode::OK)
    }

    async fn serve(script: &[u16]) -> (String, Callback) {
        let cb = Callback {
            script: Arc::new(script.to_vec()),
            ..Callback::default()
        };
        let app = Router::new()
            .route("/cb", post(answer))
            .with_state(cb.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move { axum::serve(listener, app).await });
        (format!("http://{addr}/cb"), cb)
    }

    fn client() -> Fetcher {
        Fetcher::for_tests(None)
    }

    fn policy() -> RetryPolicy {
        RetryPolicy {
            retries: 3,
            first_backoff: Duration::from_millis(1),
            max_backoff: Duration::from_millis(5),
        }
    }

    fn data() -> JobData {
        JobData {
            bid: "bid0000000001".into(),
            configuration: node(json!({"profile_name": "demo", "submitter": "alice"})),
            identifiers: node(
                json!({"primary_id": "ark:/99999/fk4abc", "local_id": ["loc1", "loc2"]}),
            ),
            metadata: node(json!({})),
            status: node(json!({"status": "Notify"})),
            space_needed: 0,
        }
    }

    #[tokio::test]
    async fn one_post_with_the_jobs_json() {
        let (url, cb) = serve(&[200]).await;
        let client = client();
        let body = callback_body("jid0000000001", &data());
        post_callback(&client, &url, &body, policy(), None)
            .await
            .expect("delivered");
        let bodies = cb.bodies.lock().expect("lock").clone();
        assert_eq!(bodies.len(), 1);
        assert_eq!(
            bodies[0],
            json!({
                "jid": "jid0000000001",
                "bid": "bid0000000001",
                "status": "Completed",
                "ark": "ark:/99999/fk4abc",
                "local_ids": ["loc1", "loc2"],
                "profile": "demo",
                "submitter": "alice",
                "message": "job jid0000000001 of batch bid0000000001 completed",
            })
        );
    }

    #[tokio::test]
    async fn a_flaky_callback_succeeds_after_two_retries() {
        let (url, cb) = serve(&[503, 503, 200]).await;
        let client = client();
        let job = JobCtx::detached(ingest_events::Jid(1), JobState::Notify, 5);
        post_callback(&client, &url, &json!({}), policy(), Some(&job))
            .await
            .expect("delivered");
        assert_eq!(cb.calls.load(Ordering::SeqCst), 3, "2 retries");
    }

    #[tokio::test]
    async fn a_failing_callback_fails_naming_the_url() {
        let (url, cb) = serve(&[500]).await;
        let client = client();
        let error = post_callback(&client, &url, &json!({}), policy(), None)
            .await
            .expect_err("fails")
            .to_string();
        assert_eq!(
            error,
            format!("callback URL {url} returned 500 after 4 attempts")
        );
        assert_eq!(cb.calls.load(Ordering::SeqCst), 4);
    }

    #[tokio::test]
    async fn a_client_error_is_not_retried() {
        let (url, cb) = serve(&[404]).await;
        let client = client();
        let error = post_callback(&client, &url, &json!({}), policy(), None)
            .await
            .expect_err("fails")
            .to_string();
        assert_eq!(error, format!("callback URL {url} returned 404"));
        assert_eq!(cb.calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn an_unreachable_callback_names_the_reason() {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            l.local_addr().expect("addr").port()
        };
        let url = format!("http://127.0.0.1:{port}/cb");
        let client = client();
        let error = post_callback(&client, &url, &json!({}), policy(), None)
            .await
            .expect_err("fails")
            .to_string();
        assert!(
            error.starts_with(&format!("callback POST {url}: cannot connect")),
            "{error}"
        );
        assert!(error.ends_with("after 4 attempts"), "{error}");
    }

    #[tokio::test]
    async fn the_working_directory_is_removed_and_odd_ids_refused() {
        let tmp = tempfile::tempdir().expect("tmp");
        let config = RealConfig {
            work_dir: tmp.path().to_path_buf(),
            args: super::super::RealArgs::default(),
            profiles: ingest_config::Profiles::unrestricted(),
        };
        let dir = config.job_dir("bid1", ingest_events::Jid(1));
        std::fs::create_dir_all(dir.join("producer")).expect("mkdir");
        std::fs::write(dir.join("producer/a.txt"), b"a").expect("write");
        assert!(remove_job_dir(&config, "bid1", "jid0000000001")
            .await
            .is_ok());
        assert!(!dir.exists());
        assert!(remove_job_dir(&config, "bid1", "jid0000000001")
            .await
            .is_ok_and(|m| m.contains("already gone")));
        assert!(remove_job_dir(&config, "..", "jid0000000001")
            .await
            .is_err());
        assert!(remove_job_dir(&config, "", "jid0000000001").await.is_err());
    }

    #[tokio::test]
    async fn a_callback_to_a_refused_address_is_not_sent() {
        let (url, cb) = serve(&[200]).await;
        let strict = Fetcher::with_policy(
            ingest_protocol::outbound::OutboundPolicy::default(),
            super::super::fetch::TransferLimits::default(),
        )
        .expect("fetcher");
        let port = url
            .trim_end_matches("/cb")
            .rsplit(':')
            .next()
            .expect("port");
        for url in [url.clone(), format!("http://2130706433:{port}/cb")] {
            let error = post_callback(&strict, &url, &json!({}), policy(), None)
                .await
                .expect_err("refused")
                .to_string();
            assert!(error.contains("refused by outbound policy"), "{error}");
            assert!(error.contains(&url), "{error}");
        }
        assert_eq!(cb.calls.load(Ordering::SeqCst), 0, "the callback was sent");
    }
}
