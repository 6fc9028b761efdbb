//! The search box of every page (`GET /ui/search?q=`): a batch, job or
//! access request id, a submission uuid, an ark or a local id leads to the
//! item's page; several items to a list of them; nothing to a page that
//! says what was searched.

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use ingest_events::state::State as Folded;
use ingest_events::{Bid, Jid, Qid};
use maud::html;
use serde::Deserialize;

use super::{cut, page, respond, Admin, Ui};

/// The longest search read, in bytes (ids are 13 bytes; arks and local ids
/// are bounded by the submission's field limits, far below this).
pub(crate) const MAX_SEARCH_BYTES: usize = 256;

/// At most this many items are listed for one search.
pub(crate) const MAX_HITS: usize = 50;

/// The query of `GET /ui/search`.
#[derive(Debug, Deserialize)]
pub(crate) struct SearchQuery {
    #[serde(default)]
    q: String,
}

/// One item a search found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Hit {
    /// `batch`, `job` or `access request`.
    pub kind: &'static str,
    /// Its id.
    pub id: String,
    /// Its page.
    pub href: String,
    /// Its state.
    pub status: String,
    /// What matched (`ark`, `local id`, `id`, `uuid`).
    pub matched: &'static str,
    /// A job's batch.
    pub batch: Option<String>,
    /// The collection of a batch or a job.
    pub collection: Option<String>,
}

/// What a search found: the items (at most [`MAX_HITS`]) and whether more
/// matched.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Found {
    pub hits: Vec<Hit>,
    pub more: bool,
}

fn batch_hit(state: &Folded, bid: Bid, matched: &'static str) -> Option<Hit> {
    let b = state.batches.get(&bid)?;
    Some(Hit {
        kind: "batch",
        id: bid.to_string(),
        href: format!("/ui/batches/{bid}"),
        status: b.status.to_string(),
        matched,
        batch: None,
        collection: Some(b.submission.profile_name.clone()),
    })
}

/// Finds what `q` names in the engine's state. An id (batch, job, access
/// request) or a submission uuid names one item; anything else is looked
/// for as an ark or a local id among the jobs and access requests.
pub(crate) fn find(state: &Folded, q: &str) -> Found {
    let q = q.trim();
    let lower = q.to_ascii_lowercase();
    if let Ok(bid) = lower.parse::<Bid>() {
        return Found {
            hits: batch_hit(state, bid, "id").into_iter().collect(),
            more: false,
        };
    }
    if let Ok(jid) = lower.parse::<Jid>() {
        let hits = state.jobs.get(&jid).map(|j| Hit {
            kind: "job",
            id: jid.to_string(),
            href: format!("/ui/jobs/{jid}"),
            status: j.status.to_string(),
            matched: "id",
            batch: Some(j.bid.to_string()),
            collection: Some(j.configuration.profile_name.clone()),
        });
        return Found {
            hits: hits.into_iter().collect(),
            more: false,
        };
    }
    if let Ok(qid) = lower.parse::<Qid>() {
        let hits = state.access.get(&qid).map(|a| Hit {
            kind: "access request",
            id: qid.to_string(),
            href: format!("/ui/access/{qid}"),
            status: a.status.to_string(),
            matched: "id",
            batch: None,
            collection: None,
        });
        return Found {
            hits: hits.into_iter().collect(),
            more: false,
        };
    }
    if let Some(bid) = lower
        .parse::<uuid::Uuid>()
        .ok()
        .and_then(|u| state.uuids.get(&u))
    {
        return Found {
            hits: batch_hit(state, *bid, "uuid").into_iter().collect(),
            more: false,
        };
    }
    // Arks and local ids have no index of their own: a scan of the jobs
    // and access requests under the published state's read lock, as the
    // listing's filters do, bounded in what it keeps, not in what it reads.
    let mut found = Found::default();
    let mut add = |hit: Hit| {
        if found.hits.len() < MAX_HITS {
            found.hits.push(hit);
        } else {
            found.more = true;
        }
    };
    for j in state.jobs.values() {
        let matched = if j.identifiers.primary_id.as_deref() == Some(q) {
            "ark"
        } else if j.identifiers.local_ids.iter().any(|l| l == q) {
            "local id"
        } else {
            continue;
        };
        add(Hit {
            kind: "job",
            id: j.jid.to_string(),
            href: format!("/ui/jobs/{}", j.jid),
            status: j.status.to_string(),
            matched,
            batch: Some(j.bid.to_string()),
            collection: Some(j.configuration.profile_name.clone()),
        });
    }
    for a in state.access.values().filter(|a| a.token.ark == q) {
        add(Hit {
            kind: "access request",
            id: a.qid.to_string(),
            href: format!("/ui/access/{}", a.qid),
            status: a.status.to_string(),
            matched: "ark",
            batch: None,
            collection: None,
        });
    }
    found
}

/// `GET /ui/search?q=`: one item found goes to its page (303); several
/// are listed; none, or a search that is empty or too long, says so.
pub(crate) async fn search(
    State(ui): State<Ui>,
    admin: Admin,
    Query(query): Query<SearchQuery>,
) -> Response {
    let q = query.q.trim();
    let refusal = if q.is_empty() {
        Some(
            "Type a batch, job or access request id, a submission uuid, an ark or a local id."
                .to_string(),
        )
    } else if q.len() > MAX_SEARCH_BYTES {
        Some(format!(
            "The search is longer than {MAX_SEARCH_BYTES} bytes: no id, ark or local id is that long."
        ))
    } else if q.chars().any(char::is_control) {
        Some("The search contains control characters.".to_string())
    } else {
        None
    };
    if let Some(message) = refusal {
        let body = html! { p.flash.error #search-none { (message) } };
        return respond(StatusCode::BAD_REQUEST, page("Search", Some(&admin), body));
    }
    let found = {
        let state = ui.app.inner.handle.state();
        find(&state, q)
    };
    if let [one] = found.hits.as_slice() {
        return Redirect::to(&one.href).into_response();
    }
    let shown = ingest_protocol::cut(q, 100);
    let body = html! {
        @if found.hits.is_empty() {
            p.flash.error #search-none {
                "Nothing found for “" (shown) "”: no batch, job or access request has that id, no batch that submission uuid, and no job or access request that ark or local id."
            }
        } @else {
            p.muted #search-count {
                (found.hits.len()) @if found.more { " of more than " (found.hits.len()) } " items match “" (shown) "”"
                @if found.more { "; the first " (MAX_HITS) " are shown" }
            }
            table.list #search-hits {
                thead { tr { th { "Item" } th { "Id" } th { "State" } th { "Matched" } th { "Batch" } th { "Collection" } } }
                tbody {
                    @for h in &found.hits {
                        tr {
                            td.state { (h.kind) }
                            td.id { a href=(h.href) { (h.id) } }
                            td.state { (cut(&h.status)) }
                            td.state { (h.matched) }
                            td.id { @if let Some(b) = &h.batch { a href=(format!("/ui/batches/{b}")) { (b) } } }
                            td.id { @if let Some(c) = &h.collection { (cut(c)) } }
                        }
                    }
                }
            }
        }
    };
    respond(StatusCode::OK, page("Search", Some(&admin), body))
}
