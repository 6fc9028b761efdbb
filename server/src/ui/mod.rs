//! The admin web UI: server-rendered pages under `/ui`, served by
//! `ingest serve` next to the API (see docs/ui.md); `serve`
//! mounts them through [`crate::api::ApiConfig::pages`] with [`pages`].
//!
//! - Login with an admin token (the shared one or an admin's own, see
//!   `--admins-file`) opens a server-side [`session`]; every page needs
//!   one, every form carries the session's CSRF token, and every POST is
//!   checked for it and for an `Origin` (or `Referer`) of this server.
//! - Reads come from the engine's published state and the reporting views
//!   (the listing pages use `protocol::listing` and the engine's listing,
//!   never ZooKeeper); every action calls the API's own handler with the
//!   logged-in admin as actor, so the UI is no second path to the engine.
//! - Every page has a strict Content-Security-Policy (no script at all),
//!   `frame-ancestors 'none'`, `nosniff` and `Cache-Control: no-store`;
//!   maud escapes every value shown, and long values are cut.
//!
//! The consistency report comes through [`consistency::consistency_report`]
//! and its repairs through [`consistency::repair`], the two places to
//! point at the consistency checker.

mod actions;
mod batch;
pub(crate) mod consistency;
mod forward;
mod pages;
mod search;
pub mod session;

use std::borrow::Cow;
use std::sync::Arc;

use axum::extract::{FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Form, Router};
use ingest_config::UiSettings;
use maud::{html, Markup, DOCTYPE};
use serde::Deserialize;

use crate::api::AppState;
use ingest_protocol::consistency::ConsistencyReport;
use session::{Flash, Session, Sessions};

/// The Content-Security-Policy of every page: nothing but this server's
/// stylesheet and forms posting back to it; no script, no frames.
pub const CSP: &str = "default-src 'none'; style-src 'self'; img-src 'self'; \
form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// The longest value shown in a table cell before it is cut.
const CELL: usize = 200;

/// The UI's state: the API's, and the sessions.
#[derive(Clone)]
pub(crate) struct Ui {
    app: AppState,
    sessions: Arc<Sessions>,
    /// The last consistency report and when it was made: the overview
    /// shows it while it is younger than [`SUMMARY_MAX_AGE`] (a report
    /// reads the whole live tree; the consistency page always makes one).
    last_report: Arc<std::sync::Mutex<Option<Dated>>>,
    /// Set while a report for the overview is being made in the
    /// background (one at a time).
    refreshing: Arc<std::sync::atomic::AtomicBool>,
}

/// A consistency report and when it was made.
type Dated = (std::time::Instant, Arc<ConsistencyReport>);

/// How old a consistency report the overview may show.
pub(crate) const SUMMARY_MAX_AGE: std::time::Duration = std::time::Duration::from_secs(60);

impl Ui {
    /// A fresh consistency report (remembered for the overview).
    pub(crate) async fn fresh_report(
        &self,
    ) -> Result<Arc<ConsistencyReport>, crate::api::ApiError> {
        let report = Arc::new(consistency::consistency_report(&self.app).await?);
        *self
            .last_report
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) =
            Some((std::time::Instant::now(), Arc::clone(&report)));
        Ok(report)
    }

    /// The last report and its age, without waiting: the overview never
    /// runs a check on its page load. When there is none, or it is older
    /// than [`SUMMARY_MAX_AGE`], a new one is started in the background
    /// (one at a time) for the next load.
    pub(crate) fn last_report(&self) -> Option<(std::time::Duration, Arc<ConsistencyReport>)> {
        let cached = self
            .last_report
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        let stale = cached
            .as_ref()
            .is_none_or(|(at, _)| at.elapsed() >= SUMMARY_MAX_AGE);
        if stale
            && !self
                .refreshing
                .swap(true, std::sync::atomic::Ordering::AcqRel)
        {
            let ui = self.clone();
            tokio::spawn(async move {
                if let Err(e) = ui.fresh_report().await {
                    tracing::warn!(error = %e.message(), "the overview's consistency report could not be made");
                }
                ui.refreshing
                    .store(false, std::sync::atomic::Ordering::Release);
            });
        }
        cached.map(|(at, r)| (at.elapsed(), r))
    }
}

/// The admin web UI, to mount with [`crate::api::ApiConfig::pages`].
pub fn pages(settings: UiSettings) -> crate::api::Pages {
    crate::api::Pages(Box::new(move |app| router(app, settings)))
}

/// The routes under `/ui`.
fn router(app: AppState, settings: UiSettings) -> Router<AppState> {
    let ui = Ui {
        app,
        sessions: Arc::new(Sessions::new(settings)),
        last_report: Arc::default(),
        refreshing: Arc::default(),
    };
    Router::new()
        .route("/ui", get(pages::overview))
        .route("/ui/", get(|| async { Redirect::to("/ui") }))
        .route("/ui/login", get(login_page).post(login))
        .route("/ui/logout", post(logout))
        .route("/ui/static/style.css", get(style))
        .route("/ui/batches", get(pages::batches))
        .route("/ui/batches/{bid}", get(batch::batch))
        .route("/ui/batches/{bid}/{action}", post(batch::act))
        .route("/ui/search", get(search::search))
        .route("/ui/access/{qid}", get(pages::access))
        .route("/ui/jobs", get(pages::jobs))
        .route("/ui/jobs/{jid}", get(pages::job))
        .route("/ui/jobs/{jid}/{action}", post(actions::job))
        .route("/ui/collections", get(pages::collections))
        .route(
            "/ui/collections/{profile}/{action}",
            post(actions::collection),
        )
        .route("/ui/queue/{action}", post(actions::queue))
        .route("/ui/consistency", get(pages::consistency))
        .route("/ui/consistency/repair", post(actions::repair))
        .route("/ui/faults", get(pages::faults).post(actions::arm_fault))
        .route("/ui/faults/clear", post(actions::clear_faults))
        .layer(middleware::from_fn(security_headers))
        .with_state(ui)
}

/// The security headers of every `/ui` response.
async fn security_headers(req: Request, next: Next) -> Response {
    let mut res = next.run(req).await;
    let is_css = res
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"text/css"));
    let h = res.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    h.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static(if is_css {
            "private, max-age=300"
        } else {
            "no-store"
        }),
    );
    res
}

async fn style() -> Response {
    (
        [(header::CONTENT_TYPE, "text/css; charset=utf-8")],
        include_str!("style.css"),
    )
        .into_response()
}

/// A logged-in admin: the session's id and the session.
pub(crate) struct Admin {
    id: String,
    session: Session,
}

impl Admin {
    /// The API's admin identity of this session.
    fn name(&self) -> crate::api::AdminName {
        crate::api::AdminName(self.session.admin.clone())
    }
}

impl FromRequestParts<Ui> for Admin {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, ui: &Ui) -> Result<Self, Self::Rejection> {
        let id = parts
            .headers
            .get_all(header::COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .find_map(|v| session::cookie_value(v, session::COOKIE))
            .map(str::to_string);
        let found = id.and_then(|id| ui.sessions.touch(&id).map(|s| (id, s)));
        match found {
            Some((id, session)) => Ok(Admin { id, session }),
            None => Err(Redirect::to("/ui/login").into_response()),
        }
    }
}

/// Whether the engine would take `cmd` now: the engine's own decision
/// function run against its current state, nothing appended. Pages offer
/// an action only when this says yes, so they offer exactly what the API
/// accepts.
pub(crate) fn allows(
    app: &AppState,
    state: &ingest_events::State,
    cmd: &ingest_events::Command,
) -> bool {
    ingest_events::decide(state, app.inner.handle.lifecycle(), cmd).is_ok()
}

/// Cuts a value for display.
pub(crate) fn cut(s: &str) -> Cow<'_, str> {
    ingest_protocol::cut(s, CELL)
}

/// Percent-encodes a path segment or query value.
pub(crate) use ingest_protocol::encode_segment as enc;

/// The page around `body`.
pub(crate) fn page(title: &str, admin: Option<&Admin>, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · ingest" }
                link rel="stylesheet" href="/ui/static/style.css";
            }
            body {
                header {
                    span.brand { "ingest" }
                    @if let Some(a) = admin {
                        nav {
                            a href="/ui" { "Overview" }
                            a href="/ui/batches" { "Batches" }
                            a href="/ui/jobs" { "Jobs" }
                            a href="/ui/collections" { "Collections" }
                            a href="/ui/consistency" { "Consistency" }
                            a href="/ui/faults" { "Faults" }
                        }
                        form.search method="get" action="/ui/search" role="search" {
                            input #search type="search" name="q" aria-label="Find a batch, job or access request id, an ark or a local id"
                                placeholder="bid, jid, qid, ark or local id" maxlength=(search::MAX_SEARCH_BYTES) required;
                            button #search-go type="submit" { "Find" }
                        }
                        form.logout method="post" action="/ui/logout" {
                            (csrf_field(a))
                            span.who { "admin:" (cut(&a.session.admin)) }
                            button type="submit" { "Log out" }
                        }
                    }
                }
                main {
                    h1 { (title) }
                    @if let Some(Flash { ok, message }) = admin.and_then(|a| a.session.flash.as_ref()) {
                        p class=(if *ok { "flash ok" } else { "flash error" }) role="status" { (cut(message)) }
                    }
                    (body)
                }
            }
        }
    }
}

/// The hidden CSRF field of a form.
pub(crate) fn csrf_field(a: &Admin) -> Markup {
    html! { input type="hidden" name="csrf" value=(a.session.csrf); }
}

/// An HTML response with a status.
pub(crate) fn respond(status: StatusCode, markup: Markup) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        markup.into_string(),
    )
        .into_response()
}

/// An error page.
pub(crate) fn error_page(status: StatusCode, admin: Option<&Admin>, message: &str) -> Response {
    respond(
        status,
        page(
            status.canonical_reason().unwrap_or("Error"),
            admin,
            html! { p.error { (cut(message)) } },
        ),
    )
}

/// Whether a POST comes from a page of this server: its `Origin` (or, when
/// a browser sends none, its `Referer`) names the host the request was
/// sent to.
pub(crate) fn same_origin(headers: &HeaderMap) -> bool {
    let Some(host) = headers.get(header::HOST).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let origin = headers
        .get(header::ORIGIN)
        .or_else(|| headers.get(header::REFERER))
        .and_then(|v| v.to_str().ok());
    let Some(origin) = origin else {
        return false;
    };
    let rest = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"));
    rest.map(|r| r.split('/').next().unwrap_or(""))
        .is_some_and(|h| h.eq_ignore_ascii_case(host))
}

/// Checks a POST of a logged-in admin: same origin, and the form's CSRF
/// token is the session's. `Some(refusal)` when it fails.
pub(crate) fn check_post(
    headers: &HeaderMap,
    admin: &Admin,
    csrf: Option<&str>,
) -> Option<Response> {
    if !same_origin(headers) {
        return Some(error_page(
            StatusCode::FORBIDDEN,
            Some(admin),
            "refused: the form was not sent from this server's pages (Origin/Referer)",
        ));
    }
    let ok = csrf.is_some_and(|c| {
        ingest_config::constant_time_eq(admin.session.csrf.as_bytes(), c.as_bytes())
    });
    if !ok {
        return Some(error_page(
            StatusCode::FORBIDDEN,
            Some(admin),
            "refused: the form's CSRF token is missing or not this session's; reload the page and try again",
        ));
    }
    None
}

#[derive(Debug, Deserialize)]
pub(crate) struct LoginForm {
    #[serde(default)]
    token: String,
}

#[derive(Debug, Deserialize)]
pub(crate) struct CsrfForm {
    #[serde(default)]
    csrf: Option<String>,
}

fn login_form(message: Option<&str>) -> Markup {
    page(
        "Log in",
        None,
        html! {
            @if let Some(m) = message { p.flash.error role="alert" { (m) } }
            form.login method="post" action="/ui/login" {
                label for="token" { "Admin token" }
                input #token type="password" name="token" autocomplete="current-password" required;
                button #login type="submit" { "Log in" }
            }
        },
    )
}

async fn login_page() -> Response {
    respond(StatusCode::OK, login_form(None))
}

async fn login(
    State(ui): State<Ui>,
    peer: Option<axum::Extension<axum::extract::ConnectInfo<std::net::SocketAddr>>>,
    headers: HeaderMap,
    Form(form): Form<LoginForm>,
) -> Response {
    if !same_origin(&headers) {
        return error_page(
            StatusCode::FORBIDDEN,
            None,
            "refused: the form was not sent from this server's pages (Origin/Referer)",
        );
    }
    // The connection's peer (the accept loop puts it on every request); a
    // router served otherwise counts every login as one client.
    let client = peer.map_or(std::net::IpAddr::from([0, 0, 0, 0]), |p| {
        crate::api::client_key(p.0 .0.ip())
    });
    let token = form.token.trim().as_bytes();
    if let Err(why) = ui.sessions.login_allowed(client, token) {
        let by = match why {
            session::Throttled::Client => "this client",
            session::Throttled::Token => "this token",
        };
        tracing::warn!(%client, by, "admin web UI: login refused, too many failed logins");
        return respond(
            StatusCode::TOO_MANY_REQUESTS,
            login_form(Some("Too many failed logins: wait a minute and try again.")),
        );
    }
    let name = crate::api::admin_by_token(&ui.app.inner.tokens, token);
    let Some(name) = name else {
        ui.sessions.login_failed(client, token);
        tracing::info!(%client, "admin web UI: a login failed");
        return respond(StatusCode::UNAUTHORIZED, login_form(Some("Login failed.")));
    };
    let id = match ui.sessions.create(&name) {
        Ok(id) => id,
        Err(e) => return error_page(StatusCode::INTERNAL_SERVER_ERROR, None, &e.to_string()),
    };
    tracing::info!(admin = %name, %client, "admin web UI: logged in");
    let cookie = session::set_cookie(&id, ui.sessions.settings());
    (
        StatusCode::SEE_OTHER,
        [
            (header::SET_COOKIE, cookie),
            (header::LOCATION, "/ui".into()),
        ],
    )
        .into_response()
}

async fn logout(
    State(ui): State<Ui>,
    admin: Admin,
    headers: HeaderMap,
    Form(form): Form<CsrfForm>,
) -> Response {
    if let Some(refused) = check_post(&headers, &admin, form.csrf.as_deref()) {
        return refused;
    }
    ui.sessions.remove(&admin.id);
    tracing::info!(admin = %admin.session.admin, "admin web UI: logged out");
    let cookie = session::clear_cookie(ui.sessions.settings());
    (
        StatusCode::SEE_OTHER,
        [
            (header::SET_COOKIE, cookie),
            (header::LOCATION, "/ui/login".into()),
        ],
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_are_compared_with_the_host() {
        let h = |pairs: &[(&'static str, &'static str)]| {
            let mut m = HeaderMap::new();
            for (k, v) in pairs {
                m.insert(*k, HeaderValue::from_static(v));
            }
            m
        };
        assert!(same_origin(&h(&[
            ("host", "a:1"),
            ("origin", "http://a:1")
        ])));
        assert!(same_origin(&h(&[
            ("host", "a:1"),
            ("referer", "https://a:1/ui/jobs")
        ])));
        assert!(!same_origin(&h(&[
            ("host", "a:1"),
            ("origin", "http://evil:1")
        ])));
        assert!(!same_origin(&h(&[
            ("host", "a:1"),
            ("origin", "http://a:1.evil")
        ])));
        assert!(!same_origin(&h(&[("host", "a:1")])));
        assert!(!same_origin(&h(&[("origin", "http://a:1")])));
    }

    #[test]
    fn values_are_escaped_and_encoded() {
        let m = html! { td { (cut("<script>alert(1)</script>")) } }.into_string();
        assert!(!m.contains("<script>"), "{m}");
        assert_eq!(enc("a b/<c>"), "a%20b%2F%3Cc%3E");
    }
}
