//! What a request may see: every collection, or only a depositor's own
//! (a token of `--depositors-file`).
//!
//! [`auth::require`](super::auth) puts a [`Scope`] on every authenticated
//! request. A depositor with a token of its own submits only to its
//! collections and sees only their batches, jobs, access requests, objects
//! and history; anything else is answered exactly as if it did not exist
//! (the same 404 and message), so one depositor cannot learn whether
//! another's batch, job, request or object exists. Submitting to another
//! collection is 403: the collection's name is the caller's own input.

use std::collections::BTreeSet;

use axum::http::StatusCode;
use ingest_events::command::Item;
use ingest_events::state::State as QueueState;
use ingest_events::{Actor, Bid, Jid};

use super::{ApiError, AppState};

/// The collections a request may see.
#[derive(Debug, Clone)]
pub(crate) enum Scope {
    /// Every collection: admins, workers, the shared depositor token, and
    /// a server without tokens.
    All,
    /// Only a named depositor's collections.
    Depositor {
        /// The depositor's name (recorded as `depositor:NAME`).
        name: String,
        /// Its collections.
        collections: BTreeSet<String>,
    },
}

impl Scope {
    /// Whether items of `collection` are visible.
    pub(crate) fn sees(&self, collection: &str) -> bool {
        match self {
            Scope::All => true,
            Scope::Depositor { collections, .. } => collections.contains(collection),
        }
    }

    /// The collections a listing is limited to (`None`: every one).
    pub(crate) fn within(&self) -> Option<BTreeSet<String>> {
        match self {
            Scope::All => None,
            Scope::Depositor { collections, .. } => Some(collections.clone()),
        }
    }

    /// The actor recorded for what a named depositor does, bound to its
    /// token; `None` for every other caller (each route keeps its own).
    pub(crate) fn actor(&self) -> Option<Actor> {
        match self {
            Scope::All => None,
            Scope::Depositor { name, .. } => Some(Actor::depositor(name.clone())),
        }
    }

    /// Whether this is a named depositor's scope.
    pub(crate) fn is_limited(&self) -> bool {
        matches!(self, Scope::Depositor { .. })
    }

    /// 403 unless a submission to `collection` is allowed.
    pub(crate) fn may_submit(&self, collection: &str) -> Result<(), ApiError> {
        if self.sees(collection) {
            return Ok(());
        }
        Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden_collection",
            format!(
                "collection {} is not one of this depositor's collections",
                ingest_protocol::submission::quoted(collection)
            ),
        )
        .with("field", "profile"))
    }

    /// The batch, or 404 when it does not exist or is not visible.
    pub(crate) fn batch<'s>(
        &self,
        state: &'s QueueState,
        bid: Bid,
    ) -> Result<&'s ingest_events::state::Batch, ApiError> {
        state
            .batches
            .get(&bid)
            .filter(|b| self.sees(&b.submission.profile_name))
            .ok_or_else(|| ApiError::not_found(Item::Batch(bid)))
    }

    /// The job, or 404 when it does not exist or is not visible.
    pub(crate) fn job<'s>(
        &self,
        state: &'s QueueState,
        jid: Jid,
    ) -> Result<&'s ingest_events::state::Job, ApiError> {
        state
            .jobs
            .get(&jid)
            .filter(|j| self.sees(&j.configuration.profile_name))
            .ok_or_else(|| ApiError::not_found(Item::Job(jid)))
    }

    /// Whether the object `ark` is visible: always for [`Scope::All`]; for
    /// a depositor, when the inventory records it in one of its
    /// collections (an unknown ark, or no inventory, is not visible).
    pub(crate) async fn sees_object(&self, app: &AppState, ark: &str) -> Result<bool, ApiError> {
        Ok(match self {
            Scope::All => true,
            Scope::Depositor { .. } => object_collection(app, ark)
                .await?
                .is_some_and(|c| self.sees(&c)),
        })
    }
}

/// The collection the inventory records for `ark` (its latest version's),
/// or `None` when it knows no such object or the server keeps no inventory.
pub(crate) async fn object_collection(
    app: &AppState,
    ark: &str,
) -> Result<Option<String>, ApiError> {
    let Some(inventory) = app.inner.inventory.clone() else {
        return Ok(None);
    };
    let owned = ark.to_string();
    tokio::task::spawn_blocking(move || inventory.latest(&owned))
        .await
        .map_err(|e| ApiError::internal(format!("the inventory task failed: {e}")))?
        .map(|r| r.map(|r| r.collection))
        .map_err(|e| ApiError::internal(format!("the inventory failed: {e}")))
}

// Every authenticated route has a scope; a missing one is a bug, and
// seeing nothing is the safe answer to it.
super::extension::from_extension!(Scope, ApiError::internal("the request has no scope"));
