//! The worker's ZooKeeper session, shared by its tasks and its janitor.

use ingest_projections::ZkConfig;
use tokio::sync::Mutex;
use zookeeper_client as zk;

/// One ZooKeeper session shared by a worker's tasks, replaced when it
/// expires.
pub struct Session {
    config: ZkConfig,
    client: Mutex<Option<zk::Client>>,
}

impl Session {
    /// A session made on first use. It never creates the root: a root a
    /// worker created would carry the worker's ACL and lock the engine out
    /// (with credentials), so the worker waits until the engine made it.
    pub fn new(config: ZkConfig) -> Session {
        Session {
            config: config.without_creating_root(),
            client: Mutex::new(None),
        }
    }

    /// The live client, or a new session when the last one is gone.
    ///
    /// # Errors
    /// When no session can be established.
    pub async fn client(&self) -> anyhow::Result<zk::Client> {
        let mut guard = self.client.lock().await;
        if let Some(c) = guard.as_ref() {
            if !c.state().is_terminated() {
                return Ok(c.clone());
            }
            tracing::warn!(session = %c.session_id(), state = ?c.state(), "the ZooKeeper session ended; current work is dropped and a new session is made");
        }
        let c = ingest_projections::zk::connect(&self.config).await?;
        tracing::info!(session = %c.session_id(), "worker ZooKeeper session established");
        *guard = Some(c.clone());
        Ok(c)
    }
}

/// How long [`park`] keeps a watcher no one waits on any more.
pub const PARK: std::time::Duration = std::time::Duration::from_secs(30);

/// Keeps a watcher whose answer is no longer needed until it fires (or
/// [`PARK`] passes), instead of dropping it. Dropping an unfired watcher
/// makes the client send a `removeWatches` request; a job's status node
/// changes again at its next step, so a parked watch on it almost always
/// fires first and costs nothing. Waiting for the projection dropped one
/// such watcher per step and lock release: 10 of a worker's 64 ZooKeeper
/// requests per object under `tools/load --mode real`.
pub fn park(watcher: zk::OneshotWatcher) {
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(async move {
            let _ = tokio::time::timeout(PARK, watcher.changed()).await;
        });
    }
}
