//! Bearer-token authentication by role.
//!
//! Each route has an [`Access`]: admin routes take the admin token,
//! depositor routes the depositor token or the admin token, worker routes the
//! worker token. A missing, malformed or wrong token is answered 401 before
//! the handler runs, so nothing is read from the body and nothing is
//! appended. Tokens are compared in constant time and never logged.

use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;
use super::AppState;
use ingest_config::Secret;

/// Who may call a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Access {
    /// Anyone (the OpenAPI description).
    Public,
    /// Anyone, unless a metrics token is configured.
    Metrics,
    /// The depositor token or the admin token.
    Depositor,
    /// The worker token.
    Worker,
    /// Any of the admin, depositor and worker tokens (reads of the
    /// inventory).
    Reader,
    /// The admin token.
    Admin,
}

impl Access {
    /// The name used in the OpenAPI description's `x-access` and in messages.
    pub fn name(self) -> &'static str {
        match self {
            Access::Public => "public",
            Access::Metrics => "metrics",
            Access::Depositor => "depositor",
            Access::Worker => "worker",
            Access::Reader => "reader",
            Access::Admin => "admin",
        }
    }
}

/// The role a request authenticated as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// No token was needed.
    Anonymous,
    /// The admin token.
    Admin,
    /// The depositor token.
    Depositor,
    /// The worker token.
    Worker,
    /// The metrics token.
    Metrics,
}

/// The bearer token of a request, if it has a well-formed one.
fn bearer(req: &Request) -> Option<&[u8]> {
    let value = req.headers().get(header::AUTHORIZATION)?.as_bytes();
    let (scheme, token) = value.split_at(value.iter().position(|b| *b == b' ')?);
    if !scheme.eq_ignore_ascii_case(b"bearer") {
        return None;
    }
    let token = token.trim_ascii();
    (!token.is_empty()).then_some(token)
}

/// Checks `presented` against every candidate, without stopping at the first
/// match, so the time taken does not say which role's token was close.
fn authenticate(presented: &[u8], candidates: &[(Role, &Secret)]) -> Option<Role> {
    let mut found = None;
    for (role, secret) in candidates {
        if secret.matches(presented) && found.is_none() {
            found = Some(*role);
        }
    }
    found
}

/// The middleware of one access level.
pub(crate) async fn require(
    State((app, access)): State<(AppState, Access)>,
    mut req: Request,
    next: Next,
) -> Response {
    let tokens = &app.inner.tokens;
    let candidates: Vec<(Role, &Secret)> = match access {
        Access::Public => Vec::new(),
        Access::Metrics => tokens.metrics.iter().map(|s| (Role::Metrics, s)).collect(),
        Access::Depositor => vec![
            (Role::Depositor, &tokens.depositor),
            (Role::Admin, &tokens.admin),
        ],
        Access::Worker => vec![(Role::Worker, &tokens.worker)],
        Access::Reader => vec![
            (Role::Depositor, &tokens.depositor),
            (Role::Admin, &tokens.admin),
            (Role::Worker, &tokens.worker),
        ],
        Access::Admin => vec![(Role::Admin, &tokens.admin)],
    };
    if candidates.is_empty() {
        req.extensions_mut().insert(Role::Anonymous);
        return next.run(req).await;
    }
    let role = match bearer(&req) {
        None => {
            return ApiError::unauthorized(format!(
                "this route needs the {} token: send Authorization: Bearer TOKEN",
                access.name()
            ))
            .into_response()
        }
        Some(token) => authenticate(token, &candidates),
    };
    match role {
        Some(role) => {
            req.extensions_mut().insert(role);
            next.run(req).await
        }
        None => {
            tracing::info!(
                access = access.name(),
                "refused a request with a wrong token"
            );
            ApiError::unauthorized(format!(
                "the bearer token is not valid for this route (it needs the {} token)",
                access.name()
            ))
            .into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_tokens_are_parsed_strictly() {
        let req = |v: &str| {
            Request::builder()
                .header(header::AUTHORIZATION, v)
                .body(axum::body::Body::empty())
                .unwrap_or_default()
        };
        assert_eq!(bearer(&req("Bearer abc")), Some(&b"abc"[..]));
        assert_eq!(bearer(&req("bearer  abc ")), Some(&b"abc"[..]));
        assert_eq!(bearer(&req("Basic abc")), None);
        assert_eq!(bearer(&req("Bearer")), None);
        assert_eq!(bearer(&req("Bearer ")), None);
    }

    #[test]
    fn the_admin_token_opens_depositor_routes_only_as_admin() {
        let admin = Secret::new("admin-token-0123456789");
        let depositor = Secret::new("depositor-token-012345");
        let c = [(Role::Depositor, &depositor), (Role::Admin, &admin)];
        assert_eq!(
            authenticate(b"admin-token-0123456789", &c),
            Some(Role::Admin)
        );
        assert_eq!(
            authenticate(b"depositor-token-012345", &c),
            Some(Role::Depositor)
        );
        assert_eq!(authenticate(b"worker", &c), None);
    }
}
