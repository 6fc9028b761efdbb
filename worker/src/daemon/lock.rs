//! An item's ephemeral lock: its path, its secret, and its release once the
//! projection shows what it is to show.

use zookeeper_client as zk;

use super::status::{await_projection, await_status};
use super::{BoxError, ItemId};
use ingest_projections::layout;
use ingest_protocol::fence::FenceSecret;

/// The ephemeral lock node of `id`: `/jobs/JID/lock` or `/batches/BID/lock`.
pub(super) fn lock_path(id: ItemId) -> String {
    match id {
        ItemId::Job(jid) => layout::job_lock(jid),
        ItemId::Batch(bid) => layout::batch_lock(bid),
    }
}

/// A fresh secret from the operating system's generator.
pub(crate) fn fresh_secret() -> Result<FenceSecret, BoxError> {
    let mut bytes = [0u8; 32];
    getrandom::getrandom(&mut bytes)
        .map_err(|e| anyhow::anyhow!("cannot draw a lock secret: {e}"))?;
    Ok(FenceSecret::from_bytes(bytes))
}

/// A lock this worker's session holds.
pub(super) struct Held {
    pub(super) path: String,
    pub(super) created: zk::Stat,
    pub(super) fence: FenceSecret,
}

/// What the projection is to show before a lock is released, so that no
/// worker takes the item again from a projection that lags.
pub(super) enum Until {
    /// Nothing: release now.
    Now,
    /// The status node at `path` no longer says `old`.
    Status { path: String, old: String },
    /// The node at this path exists.
    Exists(String),
}

/// Releases `held` when the projection shows what `until` says (bounded by
/// [`PROJECTION_WAIT`]). The wait runs in a task of its own, so the task
/// that did the work goes on with the next item at once.
pub(super) async fn let_go(client: &zk::Client, held: &Held, until: Until) {
    if matches!(until, Until::Now) {
        release(client, &held.path, &held.created).await;
        return;
    }
    let client = client.clone();
    let lock = held.path.clone();
    let created = held.created;
    tokio::spawn(async move {
        match until {
            Until::Now => {}
            Until::Status { path, old } => await_status(&client, &path, &old).await,
            Until::Exists(path) => await_projection(&client, &path, |stat| stat.is_some()).await,
        }
        release(&client, &lock, &created).await;
    });
}

/// Resolves once `client`'s session has ended (expired, closed, refused).
pub(super) async fn session_ended(client: &zk::Client) {
    let mut states = client.state_watcher();
    while !states.state().is_terminated() {
        states.changed().await;
    }
}

/// Deletes the lock node only while it is still the one this session made:
/// a lock removed under this worker may since be another worker's.
pub(crate) async fn release(client: &zk::Client, lock: &str, created: &zk::Stat) {
    // The version alone does not tell two lock nodes apart (both are at
    // version 0): the creation zxid and the owner do.
    match client.check_stat(lock).await {
        Ok(Some(now))
            if now.czxid == created.czxid && now.ephemeral_owner == client.session_id().0 =>
        {
            match client.delete(lock, Some(now.version)).await {
                Ok(()) | Err(zk::Error::NoNode) => {}
                Err(e) => {
                    tracing::debug!(%lock, error = %ingest_protocol::bounded(&e), "cannot release the lock")
                }
            }
        }
        Ok(Some(_)) => tracing::debug!(%lock, "the lock is another worker's now; left alone"),
        Ok(None) => {}
        // The session is gone or unreachable: its ephemeral node goes with it.
        Err(e) => {
            tracing::debug!(%lock, error = %ingest_protocol::bounded(&e), "cannot check the lock")
        }
    }
}
