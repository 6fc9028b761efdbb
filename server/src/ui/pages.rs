//! The pages (GET): each reads through the API's own functions and
//! renders with maud, which escapes every value.

use crate::api::scope::Scope;
use std::collections::BTreeMap;

use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, Uri};
use axum::response::Response;
use axum::Json;
use ingest_events::lifecycle::StateKind;
use ingest_events::{BatchState, Jid, JobState};
use ingest_protocol::history::HistoryRow;
use ingest_protocol::listing::{BatchQuery, JobQuery};
use maud::{html, Markup};
use serde_json::Value;

use super::{allows, csrf_field, cut, enc, error_page, page, respond, Admin, Ui};
use crate::api::{ApiError, ApiPath};
use ingest_events::command::Target;
use ingest_events::{Command, Qid};

/// The longest query string read, in bytes.
const MAX_QUERY_BYTES: usize = 8 * 1024;

/// A listing page's query that is not read.
#[derive(Debug, thiserror::Error)]
enum BadQuery {
    #[error("the query is longer than {MAX_QUERY_BYTES} bytes")]
    TooLong,
    #[error("the query is not URL-encoded name=value pairs")]
    NotPairs,
}

/// The filter parameters a listing page passes on (empty ones dropped).
fn pairs(uri: &Uri) -> Result<Vec<(String, String)>, BadQuery> {
    let raw = uri.query().unwrap_or("");
    if raw.len() > MAX_QUERY_BYTES {
        return Err(BadQuery::TooLong);
    }
    let Query(p) =
        Query::<Vec<(String, String)>>::try_from_uri(uri).map_err(|_| BadQuery::NotPairs)?;
    Ok(p.into_iter()
        .filter(|(_, v)| !v.trim().is_empty())
        .collect())
}

fn query_string(pairs: &[(String, String)]) -> String {
    pairs
        .iter()
        .map(|(k, v)| format!("{}={}", enc(k), enc(v)))
        .collect::<Vec<_>>()
        .join("&")
}

/// The link to the next page: the same filters, the next cursor.
fn next_link(base: &str, pairs: &[(String, String)], cursor: &str) -> String {
    let mut p: Vec<(String, String)> = pairs
        .iter()
        .filter(|(k, _)| k != "cursor")
        .cloned()
        .collect();
    p.push(("cursor".into(), cursor.into()));
    format!("{base}?{}", query_string(&p))
}

fn value_of<'a>(pairs: &'a [(String, String)], key: &str) -> &'a str {
    pairs
        .iter()
        .find(|(k, _)| k == key)
        .map_or("", |(_, v)| v.as_str())
}

pub(crate) fn api_error(admin: &Admin, e: &ApiError) -> Response {
    error_page(e.status(), Some(admin), e.message())
}

fn counts(map: &BTreeMap<String, usize>, link: impl Fn(&str) -> String) -> Markup {
    html! {
        @if map.is_empty() { p.muted { "none" } } @else {
            table.counts { thead { tr { th { "State" } th { "Count" } } } tbody {
                @for (state, n) in map {
                    tr { td.state { a href=(link(state)) { (cut(state)) } } td.num { (n) } }
                }
            } }
        }
    }
}

/// A JSON value as nested tables (every string escaped and cut).
fn value(v: &Value) -> Markup {
    html! {
        @match v {
            Value::Object(map) => {
                table.kv { tbody {
                    @for (k, v) in map {
                        tr { th { (cut(k)) } td { (value(v)) } }
                    }
                } }
            }
            Value::Array(items) if items.iter().all(|i| !i.is_object() && !i.is_array()) => {
                (cut(&items.iter().map(scalar).collect::<Vec<_>>().join(", ")))
            }
            Value::Array(items) => {
                @for i in items.iter().take(100) { (value(i)) }
            }
            other => (cut(&scalar(other))),
        }
    }
}

fn scalar(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

pub(crate) fn history(rows: &[HistoryRow]) -> Markup {
    html! {
        ol.timeline #timeline {
            @for r in rows {
                li {
                    span.time { (cut(&r.time)) }
                    " "
                    span.event { (cut(&r.event)) }
                    " "
                    span.actor { (cut(&r.actor)) }
                    @if !r.detail.is_empty() { " — " span.detail { (cut(&r.detail)) } }
                }
            }
        }
    }
}

pub(crate) fn reason_form(admin: &Admin, action: &str, label: &str, id: &str) -> Markup {
    html! {
        form.action method="post" action=(action) {
            (csrf_field(admin))
            input type="text" name="reason" placeholder="reason (recorded)" required maxlength="4096" id=(format!("reason-{id}"));
            button type="submit" id=(format!("do-{id}")) { (label) }
        }
    }
}

/// `GET /ui`: the queue at a glance.
pub(crate) async fn overview(State(ui): State<Ui>, admin: Admin) -> Response {
    let app = &ui.app;
    let status = app.inner.handle.status_view();
    let collections = match app.views(|v| v.collections()).await {
        Ok(c) => c,
        Err(e) => return api_error(&admin, &e),
    };
    let projector = app.inner.metrics.projector_status();
    let report = ui.last_report();
    let held_jobs = status.jobs_by_state.get("Held").copied().unwrap_or(0);
    let held_batches = status.batches_by_state.get("Held").copied().unwrap_or(0);
    let body = html! {
        section.cards {
            div.card {
                h2 { "Queue" }
                @if status.paused {
                    p.state.bad #queue-state { "paused" }
                    (reason_form(&admin, "/ui/queue/resume", "Resume", "resume"))
                } @else {
                    p.state.good #queue-state { "running" }
                    (reason_form(&admin, "/ui/queue/pause", "Pause", "pause"))
                }
            }
            div.card {
                h2 { "Holds" }
                p { (held_jobs) " jobs held, " (held_batches) " batches held" }
                @if status.held_collections.is_empty() { p.muted { "no collection on hold" } } @else {
                    p { "Collections on hold: "
                        @for c in &status.held_collections { a href=(format!("/ui/jobs?collection={}", enc(c))) { (cut(c)) } " " }
                    }
                }
            }
            div.card {
                h2 { "Projector" }
                @match &projector {
                    Some(p) => p { (p.events_behind) " events behind, " (format!("{:.1}", p.seconds_behind)) " s" },
                    None => p.muted { "no projector in this process" },
                }
                p.muted { "log head " (status.head_position) }
            }
            @if let Some(cell) = &app.inner.replication {
                (replication_card(&cell.get()))
            }
            div.card {
                h2 { "Consistency" }
                @match &report {
                    Some((age, r)) => {
                        p { span class=(format!("status {}", r.status())) { (r.status()) } " "
                            (r.count(ingest_protocol::consistency::Severity::Fail)) " fail, "
                            (r.count(ingest_protocol::consistency::Severity::Warn)) " warn "
                            a href="/ui/consistency" { "report" } }
                        p.muted #report-age { "checked " (age.as_secs()) " s ago" }
                    },
                    None => p.muted #report-age { "being checked in the background; "
                        a href="/ui/consistency" { "run it now" } },
                }
            }
        }
        section.split {
            div {
                h2 { "Jobs by state" }
                (counts(&status.jobs_by_state, |s| format!("/ui/jobs?state={}", enc(s))))
            }
            div {
                h2 { "Batches by state" }
                (counts(&status.batches_by_state, |s| format!("/ui/batches?state={}", enc(s))))
            }
        }
        h2 { "Collections" }
        table.list {
            thead { tr { th { "Collection" } th { "Held" } th { "Batches" } th { "Jobs" } th { "Jobs by state" } } }
            tbody {
                @for c in &collections {
                    tr {
                        td.id { a href=(format!("/ui/jobs?collection={}", enc(&c.profile))) { (cut(&c.profile)) } }
                        td.state { @if c.held { "held" } }
                        td.num { (c.batches_total) }
                        td.num { (c.jobs_total) }
                        td { (cut(&c.jobs_by_state.iter().map(|(s, n)| format!("{s} {n}")).collect::<Vec<_>>().join(", "))) }
                    }
                }
            }
        }
    };
    respond(StatusCode::OK, page("Overview", Some(&admin), body))
}

/// The overview's card for one engine of a replicated group: its role,
/// epoch, leader and lag; on the leader, every replica's applied position.
fn replication_card(s: &ingest_replication::ReplicaStatus) -> Markup {
    use ingest_replication::Role;
    let role = serde_json::to_value(s.role)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default();
    let good = matches!(s.role, Role::Leader | Role::Follower);
    html! {
        div.card #replication {
            h2 { "Replication" }
            p { span class=(if good { "state good" } else { "state bad" }) #replica-role { (role) }
                " " (cut(&s.id))
                @if let Some(e) = s.epoch { ", epoch " (e) }
                ", applied " (s.applied)
                @if let Some(lag) = s.lag { ", " (lag) " behind" }
            }
            @if let Some(r) = &s.reason { p.flash.error { (cut(r)) } }
            @if s.role != Role::Leader {
                @if let Some(url) = &s.leader_url {
                    p { "Commands are taken by the leader: " a href=(format!("{}/ui", url.trim_end_matches('/'))) #leader-link { (cut(url)) } }
                } @else {
                    p.muted { "no leader known" }
                }
            }
            @if !s.replicas.is_empty() {
                table.list #replicas {
                    thead { tr { th { "Replica" } th { "Applied" } th { "Behind" } th { "" } } }
                    tbody {
                        @for r in &s.replicas {
                            tr {
                                td.id { (cut(&r.id)) }
                                td.num { (r.applied) }
                                td.num { (r.lag) }
                                td.state { @if r.dropped { span.state.bad { "dropped" } } }
                            }
                        }
                    }
                }
            }
        }
    }
}

fn select(name: &str, options: &[&str], chosen: &str) -> Markup {
    html! {
        select name=(name) id=(format!("f-{name}")) {
            option value="" { "any" }
            @for o in options {
                option value=(o) selected[*o == chosen] { (o) }
            }
        }
    }
}

fn text_filter(name: &str, label: &str, pairs: &[(String, String)], hint: &str) -> Markup {
    html! {
        label { (label) " "
            input type="text" name=(name) id=(format!("f-{name}")) value=(value_of(pairs, name)) placeholder=(hint) maxlength="256";
        }
    }
}

/// `GET /ui/batches`: the batch listing with its filters.
pub(crate) async fn batches(State(ui): State<Ui>, admin: Admin, uri: Uri) -> Response {
    let pairs = match pairs(&uri) {
        Ok(p) => p,
        Err(e) => return error_page(StatusCode::BAD_REQUEST, Some(&admin), &e.to_string()),
    };
    let listed = BatchQuery::from_pairs(pairs.clone()).and_then(|q| {
        let state = ui.app.inner.handle.state();
        ingest_engine::listing::batches(&state, &q)
    });
    let states: Vec<&str> = BatchState::ALL.iter().map(|s| s.name()).collect();
    let body = html! {
        form.filters method="get" action="/ui/batches" {
            label { "State " (select("state", &states, value_of(&pairs, "state"))) }
            (text_filter("collection", "Collection", &pairs, ""))
            (text_filter("submitter", "Submitter", &pairs, ""))
            (text_filter("created_since", "Created since", &pairs, "2026-11-24 or RFC 3339"))
            (text_filter("created_until", "until", &pairs, ""))
            label { "Failures " (select("has_failures", &["true", "false"], value_of(&pairs, "has_failures"))) }
            button type="submit" #filter { "Filter" }
        }
        @match &listed {
            Err(e) => p.flash.error { (cut(&e.to_string())) },
            Ok(page) => {
                p.muted { (page.matched) " batches match" }
                table.list #batches {
                    thead { tr { th { "Batch" } th { "State" } th { "Collection" } th { "Submitter" } th { "Jobs" } th { "Failed" } th { "Created" } th { "Modified" } } }
                    tbody {
                        @for b in &page.batches {
                            tr {
                                td.id { a href=(format!("/ui/batches/{}", enc(&b.bid))) { (cut(&b.bid)) } }
                                td.state { (cut(&b.status)) }
                                td { (cut(&b.profile)) }
                                td { (cut(&b.submitter)) }
                                td.num { (b.job_count) }
                                td.num { (b.failed_jobs) }
                                td.state { (b.created.format("%Y-%m-%d %H:%M:%S")) }
                                td.state { (b.last_modified.format("%Y-%m-%d %H:%M:%S")) }
                            }
                        }
                    }
                }
                @if let Some(c) = &page.next_cursor { a.next href=(next_link("/ui/batches", &pairs, c)) { "Next page" } }
            }
        }
    };
    respond(StatusCode::OK, page("Batches", Some(&admin), body))
}

/// `GET /ui/jobs`: the job listing with its filters.
pub(crate) async fn jobs(State(ui): State<Ui>, admin: Admin, uri: Uri) -> Response {
    let pairs = match pairs(&uri) {
        Ok(p) => p,
        Err(e) => return error_page(StatusCode::BAD_REQUEST, Some(&admin), &e.to_string()),
    };
    let listed = JobQuery::from_pairs(pairs.clone()).and_then(|q| {
        let state = ui.app.inner.handle.state();
        ingest_engine::listing::jobs(&state, &q)
    });
    let states: Vec<&str> = JobState::ALL.iter().map(|s| s.name()).collect();
    let body = html! {
        form.filters method="get" action="/ui/jobs" {
            label { "State " (select("state", &states, value_of(&pairs, "state"))) }
            (text_filter("collection", "Collection", &pairs, ""))
            (text_filter("submitter", "Submitter", &pairs, ""))
            (text_filter("batch", "Batch", &pairs, "bid0000000001"))
            (text_filter("created_since", "Created since", &pairs, "2026-11-24 or RFC 3339"))
            (text_filter("created_until", "until", &pairs, ""))
            (text_filter("modified_since", "Modified since", &pairs, ""))
            button type="submit" #filter { "Filter" }
        }
        @match &listed {
            Err(e) => p.flash.error { (cut(&e.to_string())) },
            Ok(page) => {
                p.muted #matched { (page.matched) " jobs match" }
                table.list #jobs {
                    thead { tr { th { "Job" } th { "Batch" } th { "State" } th { "Collection" } th { "Submitter" } th { "Local ids" } th { "Failed in" } th { "Retries" } th { "Created" } th { "Message" } } }
                    tbody {
                        @for j in &page.jobs {
                            tr {
                                td.id { a.job href=(format!("/ui/jobs/{}", enc(&j.jid))) { (cut(&j.jid)) } }
                                td.id { a href=(format!("/ui/batches/{}", enc(&j.bid))) { (cut(&j.bid)) } }
                                td.state { (cut(&j.status)) }
                                td { (cut(&j.profile)) }
                                td { (cut(&j.submitter)) }
                                td { (cut(&j.local_ids.join(", "))) }
                                td.state {
                                    (cut(j.failed_in.as_deref().unwrap_or("")))
                                    @if let Some(kind) = &j.failure { " (" (cut(kind)) ")" }
                                }
                                td.num { (j.retry_count) }
                                td.state { (j.created.format("%Y-%m-%d %H:%M:%S")) }
                                td { (ingest_protocol::cut(&j.message, 120)) }
                            }
                        }
                    }
                }
                @if let Some(c) = &page.next_cursor { a.next href=(next_link("/ui/jobs", &pairs, c)) { "Next page" } }
            }
        }
    };
    respond(StatusCode::OK, page("Jobs", Some(&admin), body))
}

pub(crate) fn no_such(admin: &Admin, what: &str, s: &str) -> Response {
    error_page(
        StatusCode::NOT_FOUND,
        Some(admin),
        &format!("{what} {} does not exist", cut(s)),
    )
}

/// `GET /ui/jobs/{jid}`: a job, the actions its state allows, its history.
pub(crate) async fn job(State(ui): State<Ui>, admin: Admin, Path(jid): Path<String>) -> Response {
    let Ok(jid) = jid.parse::<Jid>() else {
        return no_such(&admin, "job", &jid);
    };
    let app = &ui.app;
    let view = match crate::api::depositor::job(State(app.clone()), Scope::All, ApiPath(jid)).await
    {
        Ok(Json(v)) => v,
        Err(e) => return api_error(&admin, &e),
    };
    let hist = crate::api::depositor::job_history(
        State(app.clone()),
        Scope::All,
        ApiPath(jid),
        axum::http::Uri::from_static("/"),
    )
    .await;
    // Each action is offered only when the engine would take it now.
    let allowed = |action: &str| -> bool {
        let reason = "offered by the admin web UI".to_string();
        let cmd = match action {
            "requeue" => Command::RequeueJob { jid, reason },
            "hold" => Command::HoldJob { jid, reason },
            "release" => Command::ReleaseJob { jid, reason },
            "fail" => Command::SetJobStatus {
                jid,
                target: Target::To(JobState::Failed),
                message: reason,
                priority: None,
            },
            "delete" => Command::DeleteJob { jid, reason },
            _ => return false,
        };
        allows(app, &app.inner.handle.state(), &cmd)
    };
    // The fields the lines above show (state, batch, failure) are not
    // repeated in the table.
    let mut summary = serde_json::to_value(&view).unwrap_or(Value::Null);
    if let Value::Object(fields) = &mut summary {
        for shown in ["jid", "bid", "status", "failure", "waiting"] {
            fields.remove(shown);
        }
    }
    let actions = [
        ("requeue", "Requeue"),
        ("hold", "Hold"),
        ("release", "Release"),
        ("fail", "Fail"),
        ("delete", "Delete"),
    ];
    let body = html! {
        p { "State: " strong #job-state { (cut(&view.status)) } " · batch "
            a href=(format!("/ui/batches/{}", enc(&view.bid))) { (cut(&view.bid)) } }
        @if let Some(f) = view.failure.as_ref().filter(|_| view.status == "Failed") {
            p #job-failure { "Failure: " strong { (cut(&f.kind)) } " — " (cut(&f.explanation)) }
        } @else if view.status == "Failed" && !view.message.is_empty() {
            p #job-failure { "Failure: " (cut(&view.message)) }
        }
        @if let Some(why) = &view.waiting {
            p #job-waiting { "Waiting in " (cut(&view.status)) ": " (cut(why)) }
        } @else if view.status == "Provisioning" {
            p #job-waiting {
                "Waiting for working storage: the job needs " (bytes(view.space_needed))
                "; provisioning holds it while the working storage is fuller than the provisioning threshold or has fewer bytes free than that."
            }
        }
        section.actions {
            @for (action, label) in actions {
                @if allowed(action) {
                    (reason_form(&admin, &format!("/ui/jobs/{jid}/{action}"), label, action))
                }
            }
        }
        section.split {
            div { h2 { "Job" } (value(&summary)) }
            div {
                h2 { "History" }
                @match &hist {
                    Ok(Json(h)) => (history(&h.events)),
                    Err(e) => p.muted { (cut(e.message())) },
                }
            }
        }
    };
    respond(
        StatusCode::OK,
        page(&format!("Job {jid}"), Some(&admin), body),
    )
}

/// `GET /ui/collections`: every collection with its hold and actions.
pub(crate) async fn collections(State(ui): State<Ui>, admin: Admin) -> Response {
    let app = &ui.app;
    let mut views = match app.views(|v| v.collections()).await {
        Ok(c) => c,
        Err(e) => return api_error(&admin, &e),
    };
    // Configured profiles nobody submitted to yet.
    for p in app.inner.profiles.iter() {
        if !views.iter().any(|v| v.profile == p.name) {
            views.push(ingest_projections::views::CollectionView {
                profile: p.name.clone(),
                held: false,
                batches_by_state: BTreeMap::new(),
                jobs_by_state: BTreeMap::new(),
                batches: Vec::new(),
                batches_total: 0,
                jobs_total: 0,
            });
        }
    }
    views.sort_by(|a, b| a.profile.cmp(&b.profile));
    let body = html! {
        table.list #collections {
            thead { tr { th { "Collection" } th { "Held" } th { "Jobs by state" } th { "Actions" } } }
            tbody {
                @for c in &views {
                    @let p = enc(&c.profile);
                    tr {
                        td.id { a href=(format!("/ui/jobs?collection={p}")) { (cut(&c.profile)) } }
                        td.state { @if c.held { strong { "held" } } }
                        td { (cut(&c.jobs_by_state.iter().map(|(s, n)| format!("{s} {n}")).collect::<Vec<_>>().join(", "))) }
                        td {
                            @if c.held {
                                (reason_form(&admin, &format!("/ui/collections/{p}/release"), "Release", &format!("release-{p}")))
                            } @else {
                                (reason_form(&admin, &format!("/ui/collections/{p}/hold"), "Hold", &format!("hold-{p}")))
                            }
                            @if c.jobs_by_state.get("Held").is_some_and(|n| *n > 0) {
                                (reason_form(&admin, &format!("/ui/collections/{p}/release-jobs"), "Release held jobs", &format!("release-jobs-{p}")))
                            }
                        }
                    }
                }
            }
        }
    };
    respond(StatusCode::OK, page("Collections", Some(&admin), body))
}

/// `GET /ui/consistency`: the consistency report, a repair per finding.
pub(crate) async fn consistency(State(ui): State<Ui>, admin: Admin) -> Response {
    let report = ui.fresh_report().await;
    let body = html! {
        @match &report {
            Err(e) => p.flash.error { "The report is not available: " (cut(e.message())) },
            Ok(r) => {
                p { span class=(format!("status {}", r.status())) { (r.status()) }
                    " at log position " (r.position) ", " (r.nodes_checked) " nodes checked, " (cut(&r.checked_at)) }
                @if r.findings.is_empty() { p { "No findings." } }
                table.list #findings {
                    thead { tr { th { "Severity" } th { "Rule" } th { "Path" } th { "What" } th { "Repair" } } }
                    tbody {
                        @for f in &r.findings {
                            tr {
                                td.state { span class=(format!("status {}", f.severity.as_str())) { (f.severity.as_str()) } }
                                td.state { (cut(&f.rule)) }
                                td.id { (cut(&f.path)) }
                                td { (cut(&f.detail)) }
                                td {
                                    @if let Some(repair) = &f.repair {
                                        p.muted { (cut(&repair.description)) }
                                        form.action method="post" action="/ui/consistency/repair" {
                                            (csrf_field(&admin))
                                            input type="hidden" name="finding" value=(f.id);
                                            input type="text" name="reason" placeholder="reason (recorded)" required maxlength="4096";
                                            button type="submit" { "Repair" }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    };
    respond(StatusCode::OK, page("Consistency", Some(&admin), body))
}

/// `GET /ui/faults`: armed faults, arming and clearing them.
pub(crate) async fn faults(State(ui): State<Ui>, admin: Admin) -> Response {
    let Json(armed) = crate::api::ops::faults(State(ui.app.clone())).await;
    let states: Vec<&str> = JobState::WITH_STEP.iter().map(|s| s.name()).collect();
    let body = html! {
        p { "An armed fault turns the next successful report of a step into a failure, recorded with your name and reason." }
        h2 { "Armed" }
        @if armed.armed.is_empty() { p.muted #armed { "none" } } @else {
            table.counts #armed { thead { tr { th { "Step" } th { "Reports to fail" } } } tbody { @for (s, n) in &armed.armed { tr { td.state { (cut(s)) } td.num { (n) } } } } }
            form.action method="post" action="/ui/faults/clear" {
                (csrf_field(&admin))
                button type="submit" #clear-faults { "Clear all" }
            }
        }
        h2 { "Arm" }
        form.action method="post" action="/ui/faults" {
            (csrf_field(&admin))
            label { "Step " select name="state" id="fault-state" { @for s in &states { option value=(s) { (s) } } } }
            label { "Count " input type="number" name="count" id="fault-count" value="1" min="1" max="1000"; }
            input type="text" name="reason" id="fault-reason" placeholder="reason (recorded)" required maxlength="4096";
            button type="submit" #arm-fault { "Arm" }
        }
    };
    respond(StatusCode::OK, page("Faults", Some(&admin), body))
}

/// A byte count for people (binary units).
fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["bytes", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    match unit {
        0 => format!("{n} bytes"),
        _ => format!("{v:.1} {}", UNITS[unit]),
    }
}

/// `GET /ui/access/{qid}`: an access (assembly) request.
pub(crate) async fn access(
    State(ui): State<Ui>,
    admin: Admin,
    Path(qid): Path<String>,
) -> Response {
    let Ok(qid) = qid.parse::<Qid>() else {
        return no_such(&admin, "access request", &qid);
    };
    let view = match crate::api::access::show(State(ui.app.clone()), Scope::All, ApiPath(qid)).await
    {
        Ok(Json(v)) => v,
        Err(e) => return api_error(&admin, &e),
    };
    let summary = serde_json::to_value(&view).unwrap_or(Value::Null);
    let body = html! {
        p { "State " strong #access-state { (cut(&view.status)) } " · queue " (cut(&view.queue))
            " · " (bytes(view.size)) " to assemble · " (view.content.name())
            @if view.bag { " · bag" } }
        @if let Some(p) = &view.progress {
            p #access-progress {
                "Assembling: " (bytes(p.bytes)) " of " (bytes(view.size)) " read and checked ("
                (p.files) " files) from " (cut(&p.target)) " by " (cut(&p.worker))
                ", as of " (p.at.format("%Y-%m-%d %H:%M:%S UTC").to_string())
            }
        }
        @if let Some(d) = &view.delivery {
            p #access-delivery {
                @if view.expired {
                    "Delivery expired at " (d.expires.format("%Y-%m-%d %H:%M:%S UTC").to_string())
                    " (" (bytes(d.size)) " from " (cut(&d.target)) "); ask for the object again."
                } @else {
                    a #access-delivery-url href=(d.url) { "Download" }
                    " " (bytes(d.size)) " · version " (d.version) " · from " (cut(&d.target))
                    " · until " (d.expires.format("%Y-%m-%d %H:%M:%S UTC").to_string())
                }
            }
        }
        (value(&summary))
    };
    respond(
        StatusCode::OK,
        page(&format!("Access request {qid}"), Some(&admin), body),
    )
}
