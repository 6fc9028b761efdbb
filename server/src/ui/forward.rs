//! An admin's command made on a follower's web UI goes to the leader.
//!
//! In a replicated group only the leader appends. The API answers a
//! command sent to a follower with `307` to the leader, which a browser's
//! form cannot follow with its session (sessions are each engine's own).
//! So a follower's UI sends the command itself: the API request the form
//! stands for (its [`Endpoint`]: method, path, JSON body and reply, as the
//! typed client sends it), to the leader's URL from the group's status, with the logged-in
//! admin's own bearer token, so the leader decides it and records the same
//! actor (`admin:NAME`) as if the admin had used the leader's UI. The
//! leader's answer, or its refusal, comes back as the page's outcome. The
//! correlation id goes with it, so the leader's log and the follower's
//! name the same request.
//!
//! Nothing is forwarded when this engine takes commands itself (single or
//! leader), or when no leader is known (the local call then refuses, as
//! the API does, with `not_leader` or `no_quorum`).

use std::sync::OnceLock;
use std::time::Duration;

use axum::http::StatusCode;
use ingest_protocol::endpoint::{Endpoint, Method};
use ingest_replication::Role;

use super::{Admin, Ui};
use crate::api::{ApiError, CorrelationId, CORRELATION_HEADER};

/// How long the leader has to answer a forwarded command.
const TIMEOUT: Duration = Duration::from_secs(30);

/// The most bytes of the leader's answer read.
const MAX_ANSWER: usize = 256 * 1024;

/// The leader's base URL, when this engine follows one it knows.
pub(crate) fn leader(ui: &Ui) -> Option<String> {
    let status = ui.app.inner.replication.as_ref()?.get();
    match (status.role, status.leader_url) {
        (Role::Follower, Some(leader)) if leader != status.url => {
            Some(leader.trim_end_matches('/').to_string())
        }
        _ => None,
    }
}

/// Sends `endpoint` with `body` to `leader` as the logged-in admin, and
/// reads its answer.
pub(crate) async fn to_leader<E: Endpoint>(
    (ui, admin, cid): (&Ui, &Admin, CorrelationId),
    leader: &str,
    endpoint: &E,
    body: &E::Body,
) -> Result<E::Reply, ApiError> {
    let token = admin_token(ui, &admin.session.admin).ok_or_else(|| {
        ApiError::new(
            StatusCode::CONFLICT,
            "no_token",
            "this engine follows, and has no token of this admin to send the command to the leader with: use the leader's UI",
        )
    })?;
    let unreachable = |e: &dyn std::fmt::Display| {
        ApiError::new(
            StatusCode::BAD_GATEWAY,
            "leader_unreachable",
            format!(
                "this engine follows; the leader {} did not answer: {}",
                super::cut(leader),
                ingest_protocol::bounded(e)
            ),
        )
    };
    let method = match E::METHOD {
        Method::Get => reqwest::Method::GET,
        Method::Post => reqwest::Method::POST,
        Method::Delete => reqwest::Method::DELETE,
    };
    let mut request = client()
        .map_err(|e| unreachable(&e))?
        .request(method, format!("{leader}{}", endpoint.path()))
        .bearer_auth(token)
        .header(CORRELATION_HEADER, cid.0.to_string());
    if E::HAS_BODY {
        request = request.json(body);
    }
    let mut answer = request.send().await.map_err(|e| unreachable(&e))?;
    let status = answer.status();
    let mut bytes = Vec::new();
    while let Some(chunk) = answer.chunk().await.map_err(|e| unreachable(&e))? {
        if bytes.len() + chunk.len() > MAX_ANSWER {
            return Err(unreachable(&"its answer is too long"));
        }
        bytes.extend_from_slice(&chunk);
    }
    if status.is_success() {
        let text = String::from_utf8_lossy(&bytes);
        return E::reply(&text).map_err(|e| unreachable(&e));
    }
    let message = serde_json::from_slice::<serde_json::Value>(&bytes)
        .ok()
        .and_then(|v| v["error"]["message"].as_str().map(str::to_string))
        .unwrap_or_else(|| format!("status {}", status.as_u16()));
    let status = StatusCode::from_u16(status.as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    Err(ApiError::new(
        status,
        "leader_refused",
        format!(
            "the leader refused it: {}",
            ingest_protocol::cut(&message, 512)
        ),
    ))
}

/// The bearer token of the admin named `name` (the shared admin token for
/// the shared admin).
fn admin_token<'a>(ui: &'a Ui, name: &str) -> Option<&'a str> {
    let tokens = &ui.app.inner.tokens;
    if name == ingest_config::SHARED_ADMIN_NAME {
        return Some(tokens.admin.expose());
    }
    tokens
        .admins
        .iter()
        .find(|a| a.name == name)
        .map(|a| a.token.expose())
}

/// The one HTTP client of forwarded commands (a handle: clones share it):
/// no redirects followed (a leader that moved on answers 307, which is
/// refused as such).
fn client() -> Result<reqwest::Client, reqwest::Error> {
    static CLIENT: OnceLock<reqwest::Client> = OnceLock::new();
    if let Some(c) = CLIENT.get() {
        return Ok(c.clone());
    }
    let built = reqwest::Client::builder()
        .timeout(TIMEOUT)
        .redirect(reqwest::redirect::Policy::none())
        .build()?;
    Ok(CLIENT.get_or_init(|| built).clone())
}
