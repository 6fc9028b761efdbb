//! Reads of the status nodes that a listing, a chain and a lock's release
//! wait on.

use std::time::Instant;

use zookeeper_client as zk;

use super::{BoxError, Target, PROJECTION_WAIT};
use ingest_events::Bid;
use ingest_projections::layout;
use ingest_protocol::node::decode;

/// What a listing of `/batches` (or a task's re-check) found out about a
/// batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum BatchSeen {
    /// It has `states` (or a status past Pending and Held): acquired,
    /// never pending again.
    Acquired,
    /// It has a status and no `states` (a listing reads no more than that).
    Pending,
    /// Its status says Held (a task's re-check reads the status): parked by
    /// a collection hold until released.
    Held,
    /// Neither yet (being created, or being removed).
    Unknown,
}

/// What batch `bid` is now, read for a task about to acquire it: Pending
/// only when it has no `states` and its status says Pending.
pub(super) async fn pending_batch(client: &zk::Client, bid: Bid) -> Result<BatchSeen, BoxError> {
    if client
        .check_stat(&layout::batch_states(bid))
        .await?
        .is_some()
    {
        return Ok(BatchSeen::Acquired);
    }
    Ok(
        match read_status(client, &layout::batch_status(bid))
            .await?
            .as_deref()
        {
            None => BatchSeen::Unknown,
            Some("Pending") => BatchSeen::Pending,
            Some("Held") => BatchSeen::Held,
            // Deleted from Held: never pending again.
            Some(_) => BatchSeen::Acquired,
        },
    )
}

/// Whether batch `bid` is one `target` works on now.
pub(super) async fn batch_matches(
    client: &zk::Client,
    target: Target,
    bid: Bid,
) -> Result<bool, BoxError> {
    match target {
        Target::PendingBatches => Ok(pending_batch(client, bid).await? == BatchSeen::Pending),
        Target::ReportingBatches(status) => Ok(read_status(client, &layout::batch_status(bid))
            .await?
            .as_deref()
            == Some(status)),
        Target::Jobs(_) => Ok(false),
    }
}

/// Whether the batch status node at `path` says `wanted`, waiting (bounded
/// by [`PROJECTION_WAIT`]) while it still says `Processing`.
pub(super) async fn reached_status(
    client: &zk::Client,
    path: &str,
    wanted: &str,
) -> Result<bool, BoxError> {
    let deadline = Instant::now() + PROJECTION_WAIT;
    loop {
        let (data, _, watcher) = match client.get_and_watch_data(path).await {
            Ok(r) => r,
            Err(zk::Error::NoNode) => return Ok(false),
            Err(e) => return Err(e.into()),
        };
        let now = decode::<StatusOnly>("status", &data).map(|n| n.status);
        match now.as_deref() {
            Ok(s) if s == wanted => return Ok(true),
            Ok("Processing") if Instant::now() < deadline => {
                let _ = tokio::time::timeout_at(deadline.into(), watcher.changed()).await;
            }
            _ => return Ok(false),
        }
    }
}

/// The `status` key that job and batch status nodes share
/// ([`ingest_protocol::node::JobStatusNode`],
/// [`ingest_protocol::node::BatchStatusNode`]).
#[derive(serde::Deserialize)]
pub(super) struct StatusOnly {
    #[serde(default)]
    pub(super) status: String,
}

/// The `status` field of a status node, `None` when the node is gone.
pub(super) async fn read_status(
    client: &zk::Client,
    path: &str,
) -> Result<Option<String>, BoxError> {
    match client.get_data(path).await {
        // A node that does not read as a status has no status: the item is
        // skipped, not the queue.
        Ok((data, _)) => Ok(decode::<StatusOnly>("status", &data)
            .ok()
            .map(|n| n.status)
            .filter(|s| !s.is_empty())),
        Err(zk::Error::NoNode) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Waits (bounded) until the status node at `path` no longer says `old`.
pub(super) async fn await_status(client: &zk::Client, path: &str, old: &str) {
    let deadline = Instant::now() + PROJECTION_WAIT;
    while Instant::now() < deadline {
        let Ok((data, _, watcher)) = client.get_and_watch_data(path).await else {
            return;
        };
        let now = decode::<StatusOnly>("status", &data).map(|n| n.status);
        if now.as_deref().ok() != Some(old) {
            crate::session::park(watcher);
            return;
        }
        let _ = tokio::time::timeout_at(deadline.into(), watcher.changed()).await;
    }
}

/// Waits (bounded) until `check` holds for the node at `path`.
pub(super) async fn await_projection(
    client: &zk::Client,
    path: &str,
    check: impl Fn(Option<&zk::Stat>) -> bool,
) {
    let deadline = Instant::now() + PROJECTION_WAIT;
    // Read first without a watch: the node is usually there already, and a
    // watch on a node that does not change again (a batch's `states`) would
    // be removed with a request of its own.
    match client.check_stat(path).await {
        Ok(stat) if check(stat.as_ref()) => return,
        Ok(_) => {}
        Err(_) => return,
    }
    while Instant::now() < deadline {
        let Ok((stat, watcher)) = client.check_and_watch_stat(path).await else {
            return;
        };
        if check(stat.as_ref()) {
            return;
        }
        let _ = tokio::time::timeout_at(deadline.into(), watcher.changed()).await;
    }
}
