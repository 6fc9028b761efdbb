//! ZooKeeper plumbing shared by the sink, rebuild and diff: connection
//! settings, sessions under a chroot, deadlines on every call, the error
//! type, and reading the live tree back.
//!
//! Every call to the server goes through [`call`], which puts a deadline
//! ([`tokio::time::timeout`]) on it: the client queues requests while it
//! reconnects, so without one a call could wait for as long as the server is
//! away. A call that times out may still reach the server later (the request
//! stays queued in the session); a caller that timed out on a write must
//! therefore treat the outcome as unknown and resolve it by reading, never by
//! sending the write again (see [`ZkError::is_unknown_outcome`]).
//!
//! Sessions are made with `with_server_version(3, 8, 0)` (Debian's server).
//! The client documents that a `Stat` returned for a create inside a `multi`
//! may be invalid on servers before 3.8.2 (ZOOKEEPER-4026, ZOOKEEPER-4667);
//! nothing here reads such a `Stat`: the checkpoint version after a
//! transaction is computed (one `set_data` bumps it by one), not read from
//! the reply.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::future::Future;
use std::time::Duration;

use zookeeper_client as zk;

use crate::acl::ZkAccess;
use crate::checkpoint::ENGINE_NODE;
use crate::tree::Tree;

/// Where the tree lives and how long to wait for the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZkConfig {
    /// The connect string: `host:port[,host:port…]`, without a chroot suffix.
    pub hosts: String,
    /// The root (chroot) the Merritt layout lives under: `/` or an absolute
    /// path such as `/ingest-test-1`; created when missing.
    pub root: String,
    /// The session timeout asked of the server (which clamps it to its
    /// `minSessionTimeout`..`maxSessionTimeout`). A projector that dies is
    /// replaced once its session expires, so this is also how long a
    /// successor may stand by.
    pub session_timeout: Duration,
    /// The deadline for establishing a session.
    pub connect_timeout: Duration,
    /// The deadline for every other call.
    pub request_timeout: Duration,
    /// Credentials and the ACLs of created nodes (open by default).
    pub access: ZkAccess,
    /// Whether [`connect`] creates the root when it is missing (the
    /// default). Workers do not: a root created by a worker's session
    /// carries the worker's ACL and locks the engine out of its own tree,
    /// so a worker waits for the engine to create it.
    pub create_root: bool,
}

impl ZkConfig {
    /// The defaults for `hosts`: root `/`, a 6 s session, 10 s deadlines.
    pub fn new(hosts: impl Into<String>) -> ZkConfig {
        ZkConfig {
            hosts: hosts.into(),
            root: "/".into(),
            session_timeout: Duration::from_secs(6),
            connect_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(10),
            access: ZkAccess::default(),
            create_root: true,
        }
    }

    /// The same settings, but [`connect`] fails with `NoNode` instead of
    /// creating a missing root.
    pub fn without_creating_root(mut self) -> ZkConfig {
        self.create_root = false;
        self
    }

    /// The same settings with other credentials and ACLs.
    pub fn with_access(mut self, access: ZkAccess) -> ZkConfig {
        self.access = access;
        self
    }

    /// The same settings with another root.
    pub fn with_root(mut self, root: impl Into<String>) -> ZkConfig {
        self.root = root.into();
        self
    }

    /// Checks the connect string and the root.
    ///
    /// # Errors
    /// A [`ZkConfigError`] naming what is wrong.
    pub fn validate(&self) -> Result<(), ZkConfigError> {
        if self.hosts.trim().is_empty() {
            return Err(ZkConfigError::NoHosts);
        }
        if self.hosts.contains('/') {
            return Err(ZkConfigError::Chroot(self.hosts.clone()));
        }
        let root = &self.root;
        let ok = root == "/"
            || (root.starts_with('/')
                && !root.ends_with('/')
                && root[1..]
                    .split('/')
                    .all(|s| !s.is_empty() && s != "." && s != "..")
                && !root.chars().any(char::is_control));
        if !ok {
            return Err(ZkConfigError::Root(root.clone()));
        }
        Ok(())
    }
}

/// What is wrong with a [`ZkConfig`]'s connect string or root.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ZkConfigError {
    /// No hosts.
    #[error("no ZooKeeper hosts given")]
    NoHosts,
    /// A connect string with a chroot.
    #[error("the ZooKeeper connect string {0:?} has a chroot suffix; give the root separately (--zk-root)")]
    Chroot(String),
    /// A root that is not an absolute node path.
    #[error("the ZooKeeper root {0:?} is not an absolute node path such as /ingest")]
    Root(String),
}

/// A ZooKeeper call that failed or did not answer in time.
///
/// ### Handling
/// - [`ZkError::is_unknown_outcome`] (deadline passed, connection lost): a
///   write may or may not have been applied; re-read (the checkpoint) to find
///   out, never repeat the write blindly.
/// - [`ZkError::is_session_lost`]: the session is gone (expired, closed, no
///   host reachable); open a new one, re-acquire leadership, re-read.
/// - [`ZkError::is_conflict`] (`BadVersion`, `NodeExists`, `NoNode`,
///   `NotEmpty`): a definite, logical answer: nothing was applied; re-read the
///   state the write assumed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZkError {
    /// What was being done (`create`, `multi`, `get_data`, …).
    pub op: &'static str,
    /// The path involved (under the root), or a description.
    pub path: String,
    /// What happened.
    pub kind: ZkErrorKind,
}

/// What went wrong with a ZooKeeper call.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ZkErrorKind {
    /// No answer before the deadline.
    Timeout(Duration),
    /// The server or the client library answered with an error.
    Server(zk::Error),
}

impl ZkError {
    /// An error of `op` on `path`.
    pub fn new(op: &'static str, path: impl Into<String>, kind: ZkErrorKind) -> ZkError {
        ZkError {
            op,
            path: path.into(),
            kind,
        }
    }

    /// Whether a failed connect may succeed if tried again soon: no server
    /// took the session (it may be starting) or the connection was lost.
    pub fn is_retryable_connect(&self) -> bool {
        matches!(
            self.kind,
            ZkErrorKind::Server(zk::Error::NoHosts | zk::Error::ConnectionLoss)
        )
    }

    /// The server's error, when it gave one.
    pub fn code(&self) -> Option<&zk::Error> {
        match &self.kind {
            ZkErrorKind::Server(e) => Some(e),
            ZkErrorKind::Timeout(_) => None,
        }
    }

    /// Whether a write may or may not have been applied: the deadline
    /// passed, or the connection broke with the request in flight
    /// (`ConnectionLoss`, or the reason zookeeper-client gives every request
    /// in flight when it drops a connection, a `Custom` error such as "no
    /// response from connection in 2400ms" while a busy server pauses).
    pub fn is_unknown_outcome(&self) -> bool {
        matches!(
            self.kind,
            ZkErrorKind::Timeout(_)
                | ZkErrorKind::Server(zk::Error::ConnectionLoss | zk::Error::Custom(_))
        )
    }

    /// Whether the session cannot be used any more.
    pub fn is_session_lost(&self) -> bool {
        matches!(
            self.kind,
            ZkErrorKind::Server(
                zk::Error::SessionExpired
                    | zk::Error::ClientClosed
                    | zk::Error::NoHosts
                    | zk::Error::AuthFailed
                    | zk::Error::SessionMoved
            )
        )
    }

    /// Whether the server refused the call for a logical reason (nothing applied).
    pub fn is_conflict(&self) -> bool {
        matches!(
            self.kind,
            ZkErrorKind::Server(
                zk::Error::BadVersion
                    | zk::Error::NodeExists
                    | zk::Error::NoNode
                    | zk::Error::NotEmpty
            )
        )
    }
}

impl fmt::Display for ZkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            ZkErrorKind::Timeout(d) => write!(
                f,
                "ZooKeeper {} {}: no answer within {} ms",
                self.op,
                self.path,
                d.as_millis()
            ),
            ZkErrorKind::Server(e) => write!(f, "ZooKeeper {} {}: {e}", self.op, self.path),
        }
    }
}

impl std::error::Error for ZkError {}

/// Runs one ZooKeeper call with a deadline.
///
/// # Errors
/// [`ZkErrorKind::Timeout`] when the deadline passes, else the call's error.
pub async fn call<T, E: Into<zk::Error>>(
    deadline: Duration,
    op: &'static str,
    path: &str,
    fut: impl Future<Output = Result<T, E>>,
) -> Result<T, ZkError> {
    match tokio::time::timeout(deadline, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(ZkError::new(op, path, ZkErrorKind::Server(e.into()))),
        Err(_) => Err(ZkError::new(op, path, ZkErrorKind::Timeout(deadline))),
    }
}

/// The open ACL: `world:anyone` with all permissions, as mrt-zk writes (and
/// as [`crate::Op::serialized_size`] assumes). The engine creates its nodes
/// with [`ZkAccess::acl`], which is this ACL when no credentials are set.
pub fn open_acl() -> zk::CreateOptions<'static> {
    zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all())
}

/// Opens a session and returns a client rooted at `config.root`, creating
/// the root (and its parents) when missing.
///
/// # Errors
/// A [`ZkError`] when the server cannot be reached before the deadline or
/// the root cannot be created.
pub async fn connect(config: &ZkConfig) -> Result<zk::Client, ZkError> {
    if let Err(reason) = config.validate() {
        return Err(ZkError::new(
            "connect",
            reason.to_string(),
            ZkErrorKind::Server(zk::Error::BadArguments(&"invalid connect string or root")),
        ));
    }
    // Each attempt fails eagerly (NoHosts when no server takes the session),
    // and attempts repeat until the connect deadline: a server that is
    // starting (it answers `ruok` before it takes sessions) or restarting is
    // waited for, a wrong address still fails within the deadline.
    let deadline = tokio::time::Instant::now() + config.connect_timeout;
    let mut pause = Duration::from_millis(50);
    let client = loop {
        let mut connector = zk::Client::connector();
        connector = connector
            .with_server_version(3, 8, 0)
            .with_session_timeout(config.session_timeout)
            .with_fail_eagerly();
        if let Some(credentials) = &config.access.credentials {
            connector = connector.with_auth("digest", &credentials.auth_bytes());
        }
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        match call(
            left,
            "connect",
            &config.hosts,
            connector.connect(&config.hosts),
        )
        .await
        {
            Ok(client) => break client,
            Err(e)
                if tokio::time::Instant::now() + pause < deadline && e.is_retryable_connect() =>
            {
                tracing::debug!(hosts = %config.hosts, error = %e, "ZooKeeper refused the session; trying again");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(1));
            }
            Err(e) => return Err(e),
        }
    };
    tracing::debug!(
        hosts = %config.hosts,
        session = %client.session_id(),
        timeout_ms = client.session_timeout().as_millis() as u64,
        "ZooKeeper session established"
    );
    if config.root == "/" {
        return Ok(client);
    }
    let exists = call(
        config.request_timeout,
        "exists",
        &config.root,
        client.check_stat(&config.root),
    )
    .await?;
    if exists.is_none() && !config.create_root {
        return Err(ZkError::new(
            "exists (the engine creates the root)",
            config.root.clone(),
            ZkErrorKind::Server(zk::Error::NoNode),
        ));
    }
    if exists.is_none() {
        call(
            config.request_timeout,
            "mkdir",
            &config.root,
            client.mkdir(&config.root, &config.access.acl("/").persistent()),
        )
        .await?;
        tracing::info!(root = %config.root, "created the ZooKeeper root");
    }
    client.chroot(config.root.as_str()).map_err(|_| {
        ZkError::new(
            "chroot",
            config.root.clone(),
            ZkErrorKind::Server(zk::Error::BadArguments(&"invalid root path")),
        )
    })
}

/// A tree read back from ZooKeeper.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LiveTree {
    /// Every node read, with its data (ephemeral nodes included).
    pub tree: Tree,
    /// The ephemeral nodes read, with the session id owning each.
    pub ephemeral: BTreeMap<String, i64>,
    /// When each node read was created (ZooKeeper's `ctime`, milliseconds
    /// since the Unix epoch), for rules that depend on a node's age.
    pub ctimes: BTreeMap<String, i64>,
}

impl LiveTree {
    /// The tree without ephemeral nodes (workers' locks, the leader node).
    pub fn without_ephemeral(&self) -> Tree {
        let nodes: BTreeMap<String, Vec<u8>> = self
            .tree
            .iter()
            .filter(|(p, _)| !self.ephemeral.contains_key(*p))
            .map(|(p, d)| (p.to_string(), d.to_vec()))
            .collect();
        Tree::from(nodes)
    }
}

/// What [`read_tree`] leaves out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReadOptions {
    /// Read `/ingest-engine` too.
    pub include_engine: bool,
}

/// Paths read per multi-read request (two operations each: data and children).
const READ_BATCH: usize = 256;

/// Multi-read requests in flight at once while reading a tree.
const READ_IN_FLIGHT: usize = 8;

/// A multi-read sent and not yet answered.
type MultiRead<'c> = std::pin::Pin<
    Box<dyn Future<Output = Result<Vec<zk::MultiReadResult>, zk::Error>> + Send + 'c>,
>;

/// Reads every node under the client's root (its own `/zookeeper` node left
/// out when the root is `/`), breadth first, many nodes per multi-read.
///
/// # Cautions
/// Each multi-read is atomic, the whole walk is not: a tree that changes
/// while it is read may be seen half-changed. Callers that need a stable
/// picture compare the checkpoint version before and after.
///
/// # Errors
/// The first failing read; nodes that vanish during the walk are skipped.
pub async fn read_tree(
    client: &zk::Client,
    config: &ZkConfig,
    options: ReadOptions,
) -> Result<LiveTree, ZkError> {
    let mut out = LiveTree::default();
    let mut nodes: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    let mut queue: VecDeque<String> = VecDeque::from(["/".to_string()]);
    // Several multi-reads in flight (one round trip each, one after
    // another, left the server idle most of the time); answers are taken
    // in the order sent.
    let mut pending: VecDeque<(Vec<String>, MultiRead<'_>)> = VecDeque::new();
    loop {
        while pending.len() < READ_IN_FLIGHT && !queue.is_empty() {
            let take = queue.len().min(READ_BATCH);
            let batch: Vec<String> = queue.drain(..take).collect();
            let mut reader = client.new_multi_reader();
            for p in &batch {
                reader
                    .add_get_data(p)
                    .and_then(|()| reader.add_get_children(p))
                    .map_err(|e| ZkError::new("multi-read", p.clone(), ZkErrorKind::Server(e)))?;
            }
            pending.push_back((batch, Box::pin(reader.commit())));
        }
        let Some((batch, commit)) = pending.pop_front() else {
            break;
        };
        let results = call(
            config.request_timeout,
            "multi-read",
            &format!("{} paths from {}", batch.len(), batch[0]),
            commit,
        )
        .await?;
        let mut results = results.into_iter();
        for p in &batch {
            let (data, children) = (results.next(), results.next());
            let (data, stat) = match data {
                Some(zk::MultiReadResult::Data { data, stat }) => (data, stat),
                // Deleted since its parent was listed.
                _ => continue,
            };
            let children = match children {
                Some(zk::MultiReadResult::Children { children }) => children,
                _ => Vec::new(),
            };
            if p != "/" {
                if stat.ephemeral_owner != 0 {
                    out.ephemeral.insert(p.clone(), stat.ephemeral_owner);
                }
                out.ctimes.insert(p.clone(), stat.ctime);
                nodes.insert(p.clone(), data);
            }
            for c in children {
                let child = if p == "/" {
                    format!("/{c}")
                } else {
                    format!("{p}/{c}")
                };
                let skip = (p == "/" && config.root == "/" && c == "zookeeper")
                    || (!options.include_engine && child == ENGINE_NODE);
                if !skip {
                    queue.push_back(child);
                }
            }
        }
    }
    out.tree = Tree::from(nodes);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_are_checked() {
        assert!(ZkConfig::new("127.0.0.1:2181").validate().is_ok());
        assert!(ZkConfig::new("h:1")
            .with_root("/ingest-test-1")
            .validate()
            .is_ok());
        assert!(ZkConfig::new("").validate().is_err());
        assert!(ZkConfig::new("h:1/chroot").validate().is_err());
        for bad in ["relative", "/a/", "/a//b", "/a/../b", ""] {
            assert!(
                ZkConfig::new("h:1").with_root(bad).validate().is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn errors_are_classified() {
        let e = |k| ZkError::new("multi", "/x", ZkErrorKind::Server(k));
        assert!(e(zk::Error::ConnectionLoss).is_unknown_outcome());
        assert!(
            ZkError::new("multi", "/x", ZkErrorKind::Timeout(Duration::from_secs(1)))
                .is_unknown_outcome()
        );
        assert!(e(zk::Error::SessionExpired).is_session_lost());
        assert!(e(zk::Error::BadVersion).is_conflict());
        assert!(!e(zk::Error::BadVersion).is_unknown_outcome());
    }
}
