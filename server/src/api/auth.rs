//! Bearer-token authentication by role.
//!
//! Each route has an [`Access`]: admin routes take the admin token,
//! depositor routes the depositor token or the admin token, worker routes the
//! worker token. A missing, malformed or wrong token is answered 401 before
//! the handler runs, so nothing is read from the body and nothing is
//! appended. Tokens are compared in constant time and never logged.
//!
//! Admins may have tokens of their own (`--admins-file`): a request with one
//! is [`Role::Admin`] with the admin's name ([`AdminName`]); the shared admin
//! token is the admin named `admin`. Admin actions are recorded as
//! `admin:NAME` from the token, never from the request body.
//!
//! Depositors may have tokens of their own too (`--depositors-file`): a
//! request with one is [`Role::Depositor`] limited to the depositor's
//! collections (a [`Scope`]); every other token's scope is every
//! collection.

use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;
use super::scope::Scope;
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

/// The name of the admin a request authenticated as (from their token).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AdminName(pub(crate) String);

impl AdminName {
    /// The actor recorded for this admin's actions.
    pub(crate) fn actor(&self) -> ingest_events::Actor {
        ingest_events::Actor::admin(self.0.clone())
    }
}

super::extension::from_extension!(
    AdminName,
    ApiError::unauthorized("this route needs an admin token")
);

/// Whose token a candidate is, beyond its role.
#[derive(Debug, Clone, Copy)]
enum Who<'a> {
    /// A role's shared token (depositor, worker, metrics).
    Role,
    /// An admin, shared or named.
    Admin(&'a str),
    /// A depositor of `--depositors-file`.
    Depositor(&'a ingest_config::NamedDepositor),
}

/// The candidates of one access level: the role, its token, and whose it is.
fn candidates(tokens: &ingest_config::Tokens, access: Access) -> Vec<(Role, &Secret, Who<'_>)> {
    let admins = || {
        std::iter::once((
            Role::Admin,
            &tokens.admin,
            Who::Admin(ingest_config::SHARED_ADMIN_NAME),
        ))
        .chain(
            tokens
                .admins
                .iter()
                .map(|a| (Role::Admin, &a.token, Who::Admin(a.name.as_str()))),
        )
    };
    let depositors = || {
        std::iter::once((Role::Depositor, &tokens.depositor, Who::Role)).chain(
            tokens
                .depositors
                .iter()
                .map(|d| (Role::Depositor, &d.token, Who::Depositor(d))),
        )
    };
    match access {
        Access::Public => Vec::new(),
        Access::Metrics => tokens
            .metrics
            .iter()
            .map(|s| (Role::Metrics, s, Who::Role))
            .collect(),
        Access::Depositor => depositors().chain(admins()).collect(),
        Access::Worker => vec![(Role::Worker, &tokens.worker, Who::Role)],
        Access::Reader => depositors()
            .chain(admins())
            .chain(std::iter::once((Role::Worker, &tokens.worker, Who::Role)))
            .collect(),
        Access::Admin => admins().collect(),
    }
}

/// Checks a presented token against the admin tokens (shared and named):
/// the admin's name, or `None`. Used by the web UI's login.
pub(crate) fn admin_by_token(tokens: &ingest_config::Tokens, presented: &[u8]) -> Option<String> {
    match authenticate_named(presented, &candidates(tokens, Access::Admin)) {
        Some((_, Who::Admin(name))) => Some(name.to_string()),
        _ => None,
    }
}

/// Whether the request presents a token of any role that may change
/// something (depositor, admin or worker), or no tokens are configured. A
/// follower answers a command with the leader's address only to such a
/// request, so that the address is not handed to anyone who asks.
pub(crate) fn presents_a_command_token(tokens: &ingest_config::Tokens, req: &Request) -> bool {
    let candidates = candidates(tokens, Access::Reader);
    if candidates.is_empty() {
        return true;
    }
    bearer(req).is_some_and(|token| authenticate_named(token, &candidates).is_some())
}

/// The bearer token of a request, if it has a well-formed one.
fn bearer(req: &Request) -> Option<&[u8]> {
    bearer_of(req.headers())
}

/// The bearer token of a request's headers.
pub(crate) fn bearer_of(headers: &axum::http::HeaderMap) -> Option<&[u8]> {
    let value = headers.get(header::AUTHORIZATION)?.as_bytes();
    let (scheme, token) = value.split_at(value.iter().position(|b| *b == b' ')?);
    if !scheme.eq_ignore_ascii_case(b"bearer") {
        return None;
    }
    let token = token.trim_ascii();
    (!token.is_empty()).then_some(token)
}

/// Checks `presented` against every candidate, without stopping at the first
/// match, so the time taken does not say which role's token was close.
fn authenticate_named<'a>(
    presented: &[u8],
    candidates: &[(Role, &Secret, Who<'a>)],
) -> Option<(Role, Who<'a>)> {
    let mut found = None;
    for (role, secret, name) in candidates {
        if secret.matches(presented) && found.is_none() {
            found = Some((*role, *name));
        }
    }
    found
}

#[cfg(test)]
fn authenticate(presented: &[u8], candidates: &[(Role, &Secret)]) -> Option<Role> {
    let named: Vec<_> = candidates
        .iter()
        .map(|(r, s)| (*r, *s, Who::Role))
        .collect();
    authenticate_named(presented, &named).map(|(r, _)| r)
}

/// The middleware of one access level.
pub(crate) async fn require(
    State((app, access)): State<(AppState, Access)>,
    mut req: Request,
    next: Next,
) -> Response {
    let candidates = candidates(&app.inner.tokens, access);
    if candidates.is_empty() {
        req.extensions_mut().insert(Role::Anonymous);
        req.extensions_mut().insert(Scope::All);
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
        Some(token) => authenticate_named(token, &candidates),
    };
    match role {
        Some((role, who)) => {
            req.extensions_mut().insert(role);
            let scope = match who {
                Who::Role => Scope::All,
                Who::Admin(name) => {
                    req.extensions_mut().insert(AdminName(name.to_string()));
                    Scope::All
                }
                Who::Depositor(d) => Scope::Depositor {
                    name: d.name.clone(),
                    collections: d.collections.clone(),
                },
            };
            req.extensions_mut().insert(scope);
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
