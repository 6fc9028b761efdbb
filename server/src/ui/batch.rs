//! The batch page (`GET /ui/batches/{bid}`) and its actions
//! (`POST /ui/batches/{bid}/{action}`), laid out for what an operator comes
//! with: the state and counts, why it failed (first), what can be done
//! now, the jobs, then the timeline. Each value is shown once.

use crate::api::scope::Scope;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::Json;
use ingest_events::{Bid, Command, Jid, JobState};
use ingest_protocol::endpoint as ep;
use ingest_protocol::report::BatchView;
use maud::{html, Markup};

use super::actions::{admin_command, back, ActionForm};
use super::pages::{api_error, history, no_such, reason_form};
use super::{allows, check_post, cut, enc, error_page, page, respond, Admin, Ui};
use crate::api::{admin as api, ApiError, ApiJson, ApiPath, CorrelationId};

/// The actions of a batch, in the order they are offered: the form's
/// path segment and its button.
const ACTIONS: [(&str, &str); 5] = [
    ("release", "Release"),
    ("release-collection", "Release the collection"),
    ("requeue-failed", "Requeue failed jobs"),
    ("update-reporting", "Update report"),
    ("delete", "Delete"),
];

/// The reason a dry run of a command carries (never recorded).
const DRY_RUN: &str = "offered by the admin web UI";

fn command(action: &str, bid: Bid, profile: &str) -> Option<Command> {
    let reason = DRY_RUN.to_string();
    match action {
        "release" => Some(Command::ReleaseBatch { bid, reason }),
        "release-collection" => Some(Command::ReleaseCollection {
            profile: profile.to_string(),
            reason,
        }),
        "update-reporting" => Some(Command::UpdateReporting { bid, reason }),
        "delete" => Some(Command::DeleteBatch { bid, reason }),
        _ => None,
    }
}

/// `f` of each job of `bid` (at most 1000, in creation order) with the
/// engine's state at hand; the jobs for which it gives `Some`.
fn over_jobs<T>(
    ui: &Ui,
    bid: Bid,
    mut f: impl FnMut(&ingest_events::State, &ingest_events::state::Job) -> Option<T>,
) -> Vec<T> {
    let state = ui.app.inner.handle.state();
    let Some(b) = state.batches.get(&bid) else {
        return Vec::new();
    };
    b.jobs
        .iter()
        .take(1000)
        .filter_map(|jid| state.jobs.get(jid))
        .filter_map(|j| f(&state, j))
        .collect()
}

/// The failed jobs of `bid` that the engine would requeue now.
fn requeueable(ui: &Ui, bid: Bid) -> Vec<Jid> {
    over_jobs(ui, bid, |state, j| {
        let cmd = Command::RequeueJob {
            jid: j.jid,
            reason: DRY_RUN.to_string(),
        };
        (j.status == JobState::Failed && allows(&ui.app, state, &cmd)).then_some(j.jid)
    })
}

/// The actions the engine would take on `bid` now: each is asked of the
/// engine's own decision function against its current state, so the page
/// offers exactly what the API would accept.
///
/// A Held batch of a held collection cannot be released by itself (the
/// engine refuses while the collection is held); its page offers the
/// collection's release instead, which releases the collection's held
/// batches and jobs.
fn offered(ui: &Ui, bid: Bid) -> Vec<(&'static str, &'static str)> {
    let any_requeue = !requeueable(ui, bid).is_empty();
    let state = ui.app.inner.handle.state();
    let Some(b) = state.batches.get(&bid) else {
        return Vec::new();
    };
    let held = b.status == ingest_events::BatchState::Held;
    let profile = b.submission.profile_name.as_str();
    ACTIONS
        .into_iter()
        .filter(|(action, _)| match command(action, bid, profile) {
            Some(_) if *action == "release-collection" && !held => false,
            Some(cmd) => allows(&ui.app, &state, &cmd),
            None => any_requeue,
        })
        .collect()
}

/// The collection whose hold holds `bid`, if any.
fn holding_collection(ui: &Ui, bid: Bid) -> Option<String> {
    let state = ui.app.inner.handle.state();
    let b = state.batches.get(&bid)?;
    let profile = &b.submission.profile_name;
    (b.status == ingest_events::BatchState::Held && state.held_collections.contains(profile))
        .then(|| profile.clone())
}

fn when(t: &chrono::DateTime<chrono::Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S").to_string()
}

fn ms(n: Option<i64>) -> String {
    match n {
        Some(ms) if ms >= 10_000 => format!("{:.1} s", ms as f64 / 1000.0),
        Some(ms) => format!("{ms} ms"),
        None => "—".into(),
    }
}

/// A failed job as the failure section shows it.
struct FailedJob {
    jid: Jid,
    failed_in: String,
    kind: String,
    message: String,
}

/// The failed jobs of `bid`, from the engine's state.
fn failed_jobs(ui: &Ui, bid: Bid) -> Vec<FailedJob> {
    over_jobs(ui, bid, |_, j| {
        (j.status == JobState::Failed).then(|| FailedJob {
            jid: j.jid,
            failed_in: j.failed_in.map_or_else(|| "—".into(), |s| s.to_string()),
            kind: j
                .failure
                .map_or_else(|| "—".into(), |k| k.name().to_string()),
            message: j.message.clone(),
        })
    })
}

/// Each job of `bid` with its local ids (joined) and ark, from the
/// engine's state (the batch view does not carry them).
fn identifiers(ui: &Ui, bid: Bid) -> std::collections::BTreeMap<String, (String, String)> {
    over_jobs(ui, bid, |_, j| {
        let ids = &j.identifiers;
        let ark = ids.primary_id.clone().unwrap_or_default();
        Some((j.jid.to_string(), (ids.local_ids.join(", "), ark)))
    })
    .into_iter()
    .collect()
}

/// Why the batch failed: its own message and each failed job's.
fn failure(view: &BatchView, failed: &[FailedJob]) -> Markup {
    let batch_failed = view.status == "Failed";
    html! {
        @if batch_failed || !failed.is_empty() {
            section.failure #batch-failure {
                h2 { "Failure" }
                @if batch_failed && !view.message.is_empty() {
                    p #batch-message { (cut(&view.message)) }
                }
                @if !failed.is_empty() {
                    table.list #failed-jobs {
                        thead { tr { th { "Failed job" } th { "Failed in" } th { "Kind" } th { "Why" } } }
                        tbody {
                            @for j in failed {
                                tr {
                                    td.id { a href=(format!("/ui/jobs/{}", j.jid)) { (j.jid) } }
                                    td.state { (j.failed_in) }
                                    td.state { (j.kind) }
                                    td { (cut(&j.message)) }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// `GET /ui/batches/{bid}`.
pub(crate) async fn batch(State(ui): State<Ui>, admin: Admin, Path(bid): Path<String>) -> Response {
    let Ok(bid) = bid.parse::<Bid>() else {
        return no_such(&admin, "batch", &bid);
    };
    let app = &ui.app;
    let view =
        match crate::api::depositor::batch(State(app.clone()), Scope::All, ApiPath(bid)).await {
            Ok(Json(v)) => v,
            Err(e) => return api_error(&admin, &e),
        };
    let hist = crate::api::depositor::batch_history(
        State(app.clone()),
        Scope::All,
        ApiPath(bid),
        axum::http::Uri::from_static("/"),
    )
    .await;
    let actions = offered(&ui, bid);
    let failed = failed_jobs(&ui, bid);
    let ids = identifiers(&ui, bid);
    let t = &view.timings;
    let body = html! {
        p.summary {
            "State " strong #batch-state class=(format!("badge {}", view.status)) { (cut(&view.status)) }
            " · collection " a href=(format!("/ui/batches?collection={}", enc(&view.profile))) { (cut(&view.profile)) }
            " · submitter " (cut(&view.submitter))
            " · " (cut(&view.payload_type)) " " span.url { (cut(&view.payload_url)) }
        }
        @if let Some(c) = holding_collection(&ui, bid) {
            p #held-by { "Held because collection " strong { (cut(&c)) } " is on hold: releasing the collection releases its held batches and jobs." }
        }
        (failure(&view, &failed))
        section.actions #batch-actions {
            @for (action, label) in &actions {
                (reason_form(&admin, &format!("/ui/batches/{bid}/{action}"), label, action))
            }
            @if actions.is_empty() { p.muted #no-actions { "No action is possible in this state." } }
        }
        section.split {
            div {
                h2 { "Jobs by state" }
                table.counts #batch-counts {
                    thead { tr { th { "State" } th { "Jobs" } } }
                    tbody {
                        @for (state, n) in &view.jobs_by_state {
                            tr { td.state { (cut(state)) } td.num { (n) } }
                        }
                        tr.total { th { "All" } td.num { (view.job_count) } }
                    }
                }
                p.muted { (view.retries.requeues) " requeues, " (view.retries.step_retries) " step retries" }
            }
            div {
                h2 { "Progress" }
                table.counts #batch-timings {
                    thead { tr { th { "Stage" } th { "At" } th { "After the previous" } } }
                    tbody {
                        tr { td.state { "Submitted" } td { (when(&t.submitted)) } td { "" } }
                        @if let Some(a) = &t.acquired { tr { td.state { "Acquired" } td { (when(a)) } td { (ms(t.submitted_to_acquired_ms)) } } }
                        @if let Some(a) = &t.reporting { tr { td.state { "Reporting" } td { (when(a)) } td { (ms(t.acquired_to_reporting_ms)) } } }
                        @if let Some(a) = &t.completed { tr { td.state { "Completed" } td { (when(a)) } td { (ms(t.reporting_to_completed_ms)) } } }
                        @if let Some(a) = &t.failed { tr { td.state { "Failed" } td { (when(a)) } td { "" } } }
                        @if let Some(a) = &t.deleted { tr { td.state { "Deleted" } td { (when(a)) } td { "" } } }
                        @if let Some(a) = &t.cleaned_up { tr { td.state { "Cleaned up" } td { (when(a)) } td { "" } } }
                    }
                }
                @match &view.report {
                    Some(r) => p #batch-report {
                        @if r.update { "Update report " } @else { "Report " }
                        "sent " (when(&r.at)) ": " (r.successful_jobs.len()) " completed, " (r.failed_jobs.len()) " failed"
                    },
                    None => p.muted #batch-report { "Not reported yet." },
                }
            }
        }
        h2 { "Jobs" }
        table.list #batch-jobs {
            thead { tr { th { "Job" } th { "State" } th { "Local ids" } th { "Ark" } th { "Priority" } th { "Requeues" } th { "In state since" } th { "Payload" } } }
            tbody {
                @for j in view.jobs.iter().take(1000) {
                    @let (local_ids, ark) = ids.get(&j.jid).cloned().unwrap_or_default();
                    tr {
                        td.id { a href=(format!("/ui/jobs/{}", enc(&j.jid))) { (cut(&j.jid)) } }
                        td.state { (cut(&j.status)) }
                        td { (cut(&local_ids)) }
                        td.id { (cut(&ark)) }
                        td.num { (j.priority) }
                        td.num { (j.retry_count) }
                        td.state { (when(&j.in_state_since)) }
                        td { span.url { (cut(&j.payload_url)) } }
                    }
                }
            }
        }
        @if view.jobs.len() > 1000 {
            p.muted { "The first 1000 of " (view.jobs.len()) " jobs; "
                a href=(format!("/ui/jobs?batch={bid}")) { "all of them in the job listing" } }
        }
        h2 { "Timeline" }
        @match &hist {
            Ok(Json(h)) => (history(&h.events)),
            Err(e) => p.muted { (cut(e.message())) },
        }
    };
    respond(
        StatusCode::OK,
        page(&format!("Batch {bid}"), Some(&admin), body),
    )
}

/// `POST /ui/batches/{bid}/{action}`: release, release-collection (the
/// batch's collection), update-reporting, delete, requeue-failed (each
/// failed job the engine would requeue, one request per job, with the
/// same reason).
pub(crate) async fn act(
    State(ui): State<Ui>,
    admin: Admin,
    cid: CorrelationId,
    headers: HeaderMap,
    Path((bid, action)): Path<(String, String)>,
    axum::Form(form): axum::Form<ActionForm>,
) -> Response {
    if let Some(refused) = check_post(&headers, &admin, form.csrf.as_deref()) {
        return refused;
    }
    let Ok(bid) = bid.parse::<Bid>() else {
        return error_page(StatusCode::NOT_FOUND, Some(&admin), "no such batch");
    };
    let (app, who, body) = (State(ui.app.clone()), admin.name(), ApiJson(form.body()));
    let path = ApiPath(bid);
    let by = (&ui, &admin, cid);
    let outcome: Result<String, ApiError> = match action.as_str() {
        "release" => {
            let here = api::release_batch(app, cid, who, path, body);
            admin_command(by, &ep::ReleaseBatch(bid), &form.body(), here)
                .await
                .map(|Json(a)| format!("release {bid}: {} event(s) recorded", a.events.len()))
        }
        "update-reporting" => {
            let here = api::update_reporting(app, cid, who, path, body);
            admin_command(by, &ep::UpdateReporting(bid), &form.body(), here)
                .await
                .map(|Json(a)| {
                    format!(
                        "update report of {bid}: {} event(s) recorded",
                        a.events.len()
                    )
                })
        }
        "delete" => {
            let here = api::delete_batch(app, cid, who, path, body);
            admin_command(by, &ep::DeleteBatch(bid), &form.body(), here)
                .await
                .map(|Json(a)| format!("delete {bid}: {} event(s) recorded", a.events.len()))
        }
        "requeue-failed" => requeue_failed(&ui, &admin, cid, bid, &form).await,
        "release-collection" => {
            let profile = {
                let state = ui.app.inner.handle.state();
                state
                    .batches
                    .get(&bid)
                    .map(|b| b.submission.profile_name.clone())
            };
            let Some((profile, name)) =
                profile.and_then(|p| p.parse::<api::ProfileName>().ok().map(|n| (p, n)))
            else {
                return error_page(StatusCode::NOT_FOUND, Some(&admin), "no such batch");
            };
            let here = api::release_collection(app, cid, who, ApiPath(name), body);
            admin_command(by, &ep::ReleaseCollection(profile), &form.body(), here)
                .await
                .map(|Json(a)| {
                    format!(
                        "release the collection of {bid}: {} event(s) recorded",
                        a.events.len()
                    )
                })
        }
        _ => return error_page(StatusCode::NOT_FOUND, Some(&admin), "no such action"),
    };
    back(&ui, &admin, &format!("/ui/batches/{bid}"), outcome)
}

/// Requeues every failed job of `bid` the engine would requeue; stops at
/// the first refusal, saying how many were requeued before it.
async fn requeue_failed(
    ui: &Ui,
    admin: &Admin,
    cid: CorrelationId,
    bid: Bid,
    form: &ActionForm,
) -> Result<String, ApiError> {
    let jids = requeueable(ui, bid);
    if jids.is_empty() {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "nothing_to_requeue",
            format!("batch {bid} has no failed job that can be requeued"),
        ));
    }
    for (done, jid) in jids.iter().enumerate() {
        let here = api::requeue_job(
            State(ui.app.clone()),
            cid,
            admin.name(),
            ApiPath(*jid),
            ApiJson(form.body()),
        );
        let r = admin_command((ui, admin, cid), &ep::RequeueJob(*jid), &form.body(), here).await;
        if let Err(e) = r {
            return Err(ApiError::new(
                e.status(),
                "requeue_stopped",
                format!(
                    "requeued {done} of {} failed jobs; {jid}: {}",
                    jids.len(),
                    e.message()
                ),
            ));
        }
    }
    Ok(format!("requeued {} failed job(s) of {bid}", jids.len()))
}
