//! [`EngineClient`]: the worker routes of the API, over HTTP with the
//! worker token.

use std::time::Duration;

use serde_json::Value;

/// What the API answered.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// 2xx: the JSON body.
    Done(Value),
    /// 409: the report was refused (`lock_not_held`, `stale_report`,
    /// `queue_paused`, …); the result is discarded.
    Refused {
        /// The error code.
        code: String,
        /// The message.
        message: String,
    },
}

/// A failure to get an answer, or an answer other than 2xx and 409.
#[derive(Debug, thiserror::Error)]
#[error("{url}: {message}")]
pub struct ClientError {
    /// The URL called.
    pub url: String,
    /// What went wrong.
    pub message: String,
}

/// An HTTP client of the worker routes.
#[derive(Debug, Clone)]
pub struct EngineClient {
    http: reqwest::Client,
    base: String,
    token: String,
}

impl EngineClient {
    /// A client of the API at `base` (`http://host:port`) using `token`.
    ///
    /// # Errors
    /// When the HTTP client cannot be built.
    pub fn new(base: &str, token: &str) -> Result<EngineClient, ClientError> {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .map_err(|e| ClientError {
                url: base.to_string(),
                message: e.to_string(),
            })?;
        Ok(EngineClient {
            http,
            base: base.trim_end_matches('/').to_string(),
            token: token.to_string(),
        })
    }

    /// POSTs `body` to `path` (`/jobs/JID/outcome`, …).
    ///
    /// # Errors
    /// When there is no answer or it is neither 2xx nor 409.
    pub async fn post(&self, path: &str, body: &Value) -> Result<Reply, ClientError> {
        let url = format!("{}{path}", self.base);
        let fail = |message: String| ClientError {
            url: url.clone(),
            message,
        };
        let resp = self
            .http
            .post(&url)
            .bearer_auth(&self.token)
            .json(body)
            .send()
            .await
            .map_err(|e| fail(e.to_string()))?;
        let status = resp.status();
        let body: Value = resp.json().await.unwrap_or(Value::Null);
        if status.is_success() {
            return Ok(Reply::Done(body));
        }
        let code = body["error"]["code"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let message = body["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        if status == reqwest::StatusCode::CONFLICT {
            return Ok(Reply::Refused { code, message });
        }
        Err(fail(format!("HTTP {status}: {code}: {message}")))
    }
}
