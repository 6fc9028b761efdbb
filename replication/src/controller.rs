//! The role machine of one engine: connect, find its place in the tail
//! (copying from a peer when it is behind), register, stand as a candidate,
//! follow; when it is the lowest candidate, fence, apply the whole tail and
//! lead; on any loss, step down and start again with a new session.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ingest_engine::EngineHandle;
use ingest_projections::zk::{call, connect, ZkError, ZkErrorKind};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use zookeeper_client as zk;

use crate::bootstrap;
use crate::follow::{self, Base, Cursor, FollowError};
use crate::paths;
use crate::replicator::{TailEnd, ZkReplicator};
use crate::status::{reason, ReplicaView, Role, StatusCell};
use crate::tail::NodeName;
use crate::ReplicationConfig;

/// What the leader runs besides appending (the projector): called with a
/// token when this engine starts leading; the token is cancelled and the
/// task awaited when it stops.
pub type LeaderDuties = Arc<dyn Fn(CancellationToken) -> tokio::task::JoinHandle<()> + Send + Sync>;

/// A replica's registration node.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Registration {
    applied: u64,
    url: String,
    dropped: bool,
}

/// The leader node's data.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct LeaderNode {
    id: String,
    url: String,
    epoch: u64,
}

/// The election as a follower last read it.
struct Election {
    leader: Option<LeaderNode>,
    /// The candidates, lowest sequence first.
    candidates: Vec<String>,
    read_at: Instant,
}

/// Ends when a watch set with a read fires.
type WatchFired = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// Why a session of the role machine ended.
#[derive(Debug, thiserror::Error)]
enum End {
    #[error(transparent)]
    Zk(#[from] ZkError),
    #[error(transparent)]
    Follow(#[from] FollowError),
    #[error("{0}")]
    StepDown(String),
    #[error(transparent)]
    Copy(#[from] bootstrap::CopyError),
    #[error("the engine stopped")]
    Stopped,
}

/// Runs the role machine until `cancel`: this engine takes commands only
/// while it leads.
pub async fn run(
    engine: EngineHandle,
    config: ReplicationConfig,
    status: StatusCell,
    duties: LeaderDuties,
    cancel: CancellationToken,
) {
    status.update(|s| {
        s.id = config.id.clone();
        s.url = config.url.clone();
        s.role = Role::Starting;
        s.applied = engine.log().head().0;
    });
    let mut pause = Duration::from_millis(100);
    while !cancel.is_cancelled() {
        let mut machine = Machine {
            engine: &engine,
            config: &config,
            status: &status,
            duties: &duties,
            cancel: &cancel,
            registration_version: None,
            last_report: None,
        };
        let ended = machine.session().await;
        // Whatever ended the session, this engine takes no command until it
        // leads again.
        let _ = engine.set_role(None).await;
        match ended {
            Ok(()) => break,
            Err(End::Follow(FollowError::Divergent(why))) => {
                tracing::error!(reason = %why, "this engine's log is not a prefix of the group's history; it stops replicating and serves reads of its own log only (restore it from a peer: wipe its data directory and restart it)");
                status.update(|s| {
                    s.role = Role::Divergent;
                    s.reason = reason(&why);
                });
                cancel.cancelled().await;
                break;
            }
            Err(End::Stopped) => break,
            Err(e) => {
                tracing::warn!(error = %e, pause_ms = pause.as_millis() as u64, "replication session ended; starting a new one");
                // Only a ZooKeeper that cannot be reached is "no quorum";
                // a failed copy or a step-down is this engine's own state.
                let role = match &e {
                    End::Zk(_) | End::Follow(FollowError::Zk(_)) => Role::Disconnected,
                    End::Copy(_) => Role::Bootstrapping,
                    _ => Role::Starting,
                };
                status.update(|s| {
                    s.role = role;
                    s.reason = reason(&e);
                    s.leader_url = None;
                    s.leader_id = None;
                });
                tokio::select! {
                    () = cancel.cancelled() => break,
                    () = tokio::time::sleep(pause) => {}
                }
                pause = (pause * 2).min(Duration::from_secs(2));
            }
        }
    }
    tracing::info!("replication stopped");
}

struct Machine<'a> {
    engine: &'a EngineHandle,
    config: &'a ReplicationConfig,
    status: &'a StatusCell,
    duties: &'a LeaderDuties,
    cancel: &'a CancellationToken,
    registration_version: Option<i32>,
    /// When this follower last read (and maybe wrote) its registration.
    last_report: Option<Instant>,
}

/// The most tail nodes one trimming transaction deletes (a longer backlog
/// is trimmed this many at a time, one transaction per upkeep).
const TRIM_NODES: usize = 1000;

/// A follower publishes its applied position at most this often: each
/// publication is a ZooKeeper write every server of the ensemble logs, and
/// one per replicated group tripled the ensemble's work. The leader only
/// trims the tail and checks lag with it, so a quarter second late is
/// harmless; a quiet follower still publishes at its next poll.
const REPORT_EVERY: Duration = Duration::from_millis(250);

/// A busy follower goes round its loop (list the tail, read the new
/// nodes, read the leader and the election) at most this often, so one
/// round takes the groups of several commits in one multi-read instead of
/// a round per group.
const MIN_ROUND: Duration = Duration::from_millis(20);

fn hex_head(engine: &EngineHandle) -> (u64, String) {
    let (p, h) = engine.log().head();
    (p, hex::encode(h))
}

fn is(e: &ZkError, code: zk::Error) -> bool {
    e.code() == Some(&code)
}

impl Machine<'_> {
    fn deadline(&self) -> Duration {
        self.config.zk.request_timeout
    }

    fn acl(&self, path: &str) -> Vec<zk::Acl> {
        self.config.zk.access.acl(path).entries().to_vec()
    }

    async fn session(&mut self) -> Result<(), End> {
        let client = connect(&self.config.zk).await?;
        self.ensure_nodes(&client).await?;
        if self.was_dropped(&client).await? {
            // Dropped while away (the session may have expired meanwhile,
            // so the running loop never saw the mark): the leader no longer
            // keeps the tail for this engine.
            tracing::error!(id = %self.config.id, applied = self.engine.log().head().0, "this engine fell too far behind the leader and was dropped from the replicated set; it copies the log from a peer and rejoins");
            self.copy(&client).await?;
        }
        let mut cursor = self.place(&client).await?;
        self.register(&client, false).await?;
        let candidate = self.stand(&client).await?;
        self.status.update(|s| {
            s.role = Role::Follower;
            s.reason = None;
        });
        tracing::info!(id = %self.config.id, candidate = %candidate, "following the replicated tail");
        // The election and the leader node, as last read (`None` once a
        // watch said either changed), and a future that ends when one does.
        // Read again only then (or every poll interval): a busy follower
        // goes round many times a second, and reading them each round, with
        // the watch dropped and removed on the server each time, was most
        // of its requests.
        let mut election: Option<Election> = None;
        let mut election_changed: WatchFired = Box::pin(std::future::pending());
        loop {
            let round = Instant::now();
            if self.cancel.is_cancelled() {
                let _ = client.delete(&paths::candidate(&candidate), None).await;
                return Ok(());
            }
            if !matches!(client.state(), zk::SessionState::SyncConnected) {
                // Keep serving reads; the next call fails or succeeds.
                tracing::debug!(state = ?client.state(), "ZooKeeper session not connected");
            }
            let (tail_watch, nodes) = {
                let (children, _, w) = call(
                    self.deadline(),
                    "list",
                    paths::TAIL,
                    client.get_and_watch_children(paths::TAIL),
                )
                .await?;
                (w, crate::tail::sorted(&children))
            };
            if cursor.is_none() {
                cursor = self.place(&client).await?;
            }
            if let Some(c) = cursor.as_mut() {
                match follow::catch_up(&client, self.engine, c, &nodes, self.deadline()).await {
                    Ok(_) => {}
                    Err(FollowError::Behind { .. }) => {
                        cursor = self.place(&client).await?;
                        continue;
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            let applied = self.engine.log().head().0;
            if self.report_applied(&client, applied).await? {
                // Dropped by the leader: copy from a peer, then rejoin.
                tracing::error!(id = %self.config.id, applied, "this engine fell too far behind the leader and was dropped from the replicated set; it copies the log from a peer and rejoins");
                let _ = client.delete(&paths::candidate(&candidate), None).await;
                self.copy(&client).await?;
                self.register(&client, false).await?;
                return Err(End::StepDown("rejoining after being dropped".into()));
            }
            let tail_end = nodes.iter().filter(|n| n.complete).map(|n| n.pos).max();
            let e = match election.take() {
                Some(e) if e.read_at.elapsed() < self.config.poll => election.insert(e),
                _ => {
                    // The new watches are set before the old ones are
                    // dropped, so the client removes nothing on the server.
                    let (read, fired) = self.read_election(&client).await?;
                    election_changed = fired;
                    election.insert(read)
                }
            };
            self.status.update(|s| {
                s.applied = applied;
                s.lag = Some(tail_end.unwrap_or(applied).saturating_sub(applied));
                s.leader_url = e.leader.as_ref().map(|l| l.url.clone());
                s.leader_id = e.leader.as_ref().map(|l| l.id.clone());
                s.epoch = e.leader.as_ref().map(|l| l.epoch).or(s.epoch);
            });
            if !e.candidates.iter().any(|c| c == &candidate) {
                return Err(End::StepDown(
                    "our candidacy is gone (session lost?)".into(),
                ));
            }
            if e.candidates.first() == Some(&candidate) {
                return self.lead(&client, &candidate).await;
            }
            tokio::select! {
                () = self.cancel.cancelled() => {}
                _ = tail_watch.changed() => {}
                () = &mut election_changed => {
                    election = None;
                    election_changed = Box::pin(std::future::pending());
                }
                () = tokio::time::sleep(self.config.poll) => {}
            }
            // Let the groups of a busy leader gather before the next round.
            let rest = MIN_ROUND.saturating_sub(round.elapsed());
            if !rest.is_zero() {
                tokio::select! {
                    () = self.cancel.cancelled() => {}
                    () = tokio::time::sleep(rest) => {}
                }
            }
        }
    }

    /// Creates the replication nodes that are missing.
    async fn ensure_nodes(&self, client: &zk::Client) -> Result<(), End> {
        for path in [
            paths::ROOT,
            paths::TAIL,
            paths::REPLICAS,
            paths::ELECTION,
            paths::EPOCH,
        ] {
            let acl = self.acl(path);
            let options = zk::CreateMode::Persistent.with_acls(zk::Acls::new(&acl));
            match call(
                self.deadline(),
                "create",
                path,
                client.create(path, b"", &options),
            )
            .await
            {
                Ok(_) => {}
                Err(e) if is(&e, zk::Error::NodeExists) => {}
                Err(e) if is(&e, zk::Error::NoNode) => {
                    ingest_projections::leader::ensure_engine_node(
                        client,
                        &self.config.zk.access,
                        self.deadline(),
                    )
                    .await?;
                    call(
                        self.deadline(),
                        "create",
                        path,
                        client.create(path, b"", &options),
                    )
                    .await?;
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Finds where this engine's log resumes in the tail, copying from a
    /// peer while it is behind. `None` before the group's first leader set
    /// the base.
    async fn place(&mut self, client: &zk::Client) -> Result<Option<Cursor>, End> {
        for _ in 0..5 {
            let Some((base, _)) = follow::read_base(client, self.deadline()).await? else {
                return Ok(None);
            };
            let nodes = follow::list_tail(client, self.deadline()).await?;
            let (head, hash) = hex_head(self.engine);
            match follow::locate(&base, &nodes, head, &hash) {
                Ok(c) => return Ok(Some(c)),
                Err(FollowError::Behind { head, base }) => {
                    tracing::warn!(
                        head,
                        base,
                        "this engine's log ends before the replicated tail; copying from a peer"
                    );
                    self.copy(client).await?;
                }
                Err(e) => return Err(e.into()),
            }
        }
        Err(End::StepDown(
            "could not catch up with the tail after 5 copies".into(),
        ))
    }

    /// Copies the log from the leader or another registered replica.
    ///
    /// The role is `bootstrapping` while the copy runs and what it was
    /// before once it succeeded: a follower that copies inside its loop
    /// (its place in the tail was trimmed, or the base appeared after it
    /// stood) is following again, and says so.
    async fn copy(&mut self, client: &zk::Client) -> Result<u64, End> {
        let role = self.status.get().role;
        self.status.update(|s| s.role = Role::Bootstrapping);
        let mut peers = Vec::new();
        if let Some(l) = self.read_leader(client).await? {
            if l.id != self.config.id {
                peers.push(l.url);
            }
        }
        for id in call(
            self.deadline(),
            "list",
            paths::REPLICAS,
            client.list_children(paths::REPLICAS),
        )
        .await?
        {
            if id == self.config.id {
                continue;
            }
            if let Ok((data, _)) = call(
                self.deadline(),
                "get",
                paths::REPLICAS,
                client.get_data(&paths::replica(&id)),
            )
            .await
            {
                if let Ok(r) = serde_json::from_slice::<Registration>(&data) {
                    if !r.dropped && !peers.contains(&r.url) {
                        peers.push(r.url);
                    }
                }
            }
        }
        let started = std::time::Instant::now();
        let before = self.engine.log().head().0;
        let reached =
            bootstrap::from_peers(&peers, self.config.peer_token.as_deref(), self.engine).await?;
        tracing::info!(
            from = before,
            reached,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "copied the log from a peer"
        );
        self.status.update(|s| {
            s.applied = reached;
            s.role = role;
        });
        Ok(reached)
    }

    /// Whether this engine's registration says the leader dropped it.
    async fn was_dropped(&self, client: &zk::Client) -> Result<bool, End> {
        let path = paths::replica(&self.config.id);
        match call(self.deadline(), "get", &path, client.get_data(&path)).await {
            Ok((data, _)) => Ok(serde_json::from_slice::<Registration>(&data)
                .map(|r| r.dropped)
                .unwrap_or(false)),
            Err(e) if is(&e, zk::Error::NoNode) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Registers this engine (creating or updating its node).
    async fn register(&mut self, client: &zk::Client, dropped: bool) -> Result<(), End> {
        let path = paths::replica(&self.config.id);
        let data = serde_json::to_vec(&Registration {
            applied: self.engine.log().head().0,
            url: self.config.url.clone(),
            dropped,
        })
        .unwrap_or_default();
        let acl = self.acl(&path);
        let options = zk::CreateMode::Persistent.with_acls(zk::Acls::new(&acl));
        match call(
            self.deadline(),
            "create",
            &path,
            client.create(&path, &data, &options),
        )
        .await
        {
            Ok((stat, _)) => self.registration_version = Some(stat.version),
            Err(e) if is(&e, zk::Error::NodeExists) => {
                let stat = call(
                    self.deadline(),
                    "set",
                    &path,
                    client.set_data(&path, &data, None),
                )
                .await?;
                self.registration_version = Some(stat.version);
            }
            Err(e) => return Err(e.into()),
        }
        Ok(())
    }

    /// Publishes the applied position; returns true when the leader
    /// dropped this engine (its node says so).
    async fn report_applied(&mut self, client: &zk::Client, applied: u64) -> Result<bool, End> {
        if self.last_report.is_some_and(|t| t.elapsed() < REPORT_EVERY) {
            return Ok(false);
        }
        self.last_report = Some(Instant::now());
        let path = paths::replica(&self.config.id);
        let (data, stat) = call(self.deadline(), "get", &path, client.get_data(&path)).await?;
        let mut r: Registration = serde_json::from_slice(&data).unwrap_or(Registration {
            applied: 0,
            url: self.config.url.clone(),
            dropped: false,
        });
        if r.dropped {
            return Ok(true);
        }
        if r.applied == applied && r.url == self.config.url {
            return Ok(false);
        }
        r.applied = applied;
        r.url = self.config.url.clone();
        let data = serde_json::to_vec(&r).unwrap_or_default();
        match call(
            self.deadline(),
            "set",
            &path,
            client.set_data(&path, &data, Some(stat.version)),
        )
        .await
        {
            Ok(stat) => {
                self.registration_version = Some(stat.version);
                Ok(false)
            }
            // The leader changed the node meanwhile: read it next time.
            Err(e) if is(&e, zk::Error::BadVersion) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Stands as a candidate: an ephemeral sequential node.
    async fn stand(&self, client: &zk::Client) -> Result<String, End> {
        let acl = self.acl(paths::ELECTION);
        let options = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::new(&acl));
        let prefix = paths::candidate("c-");
        let (_, seq) = call(
            self.deadline(),
            "create",
            &prefix,
            client.create(&prefix, self.config.id.as_bytes(), &options),
        )
        .await?;
        Ok(format!("c-{seq}"))
    }

    /// Reads the leader node and the election's candidates (sorted), each
    /// with a watch; the future ends when either changes.
    async fn read_election(&self, client: &zk::Client) -> Result<(Election, WatchFired), End> {
        let (exists, leader_watch) = call(
            self.deadline(),
            "exists",
            paths::LEADER,
            client.check_and_watch_stat(paths::LEADER),
        )
        .await?;
        // The exists watch fires on a change of the node's data too, so a
        // plain read is enough (gone meanwhile: the watch has fired).
        let leader = match exists {
            Some(_) => self.read_leader(client).await?,
            None => None,
        };
        let (mut candidates, _, election_watch) = call(
            self.deadline(),
            "list",
            paths::ELECTION,
            client.get_and_watch_children(paths::ELECTION),
        )
        .await?;
        candidates.sort_by_key(|c| sequence_of(c));
        let fired: WatchFired = Box::pin(async move {
            tokio::select! {
                _ = leader_watch.changed() => {}
                _ = election_watch.changed() => {}
            }
        });
        Ok((
            Election {
                leader,
                candidates,
                read_at: Instant::now(),
            },
            fired,
        ))
    }

    async fn read_leader(&self, client: &zk::Client) -> Result<Option<LeaderNode>, End> {
        match call(
            self.deadline(),
            "get",
            paths::LEADER,
            client.get_data(paths::LEADER),
        )
        .await
        {
            Ok((data, _)) => Ok(serde_json::from_slice(&data).ok()),
            Err(e) if is(&e, zk::Error::NoNode) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Takes leadership and holds it until it is lost or the engine stops.
    async fn lead(&mut self, client: &zk::Client, candidate: &str) -> Result<(), End> {
        // 1. Fence: from here on, anything an earlier leader sends fails its
        //    epoch check.
        let (_, stat) = call(
            self.deadline(),
            "get",
            paths::EPOCH,
            client.get_data(paths::EPOCH),
        )
        .await?;
        let me =
            serde_json::to_vec(&serde_json::json!({"id": self.config.id, "url": self.config.url}))
                .unwrap_or_default();
        let fenced = call(
            self.deadline(),
            "set",
            paths::EPOCH,
            client.set_data(paths::EPOCH, &me, Some(stat.version)),
        )
        .await?;
        let epoch_version = fenced.version;
        let epoch = u64::try_from(epoch_version).unwrap_or(0);
        // 2. Apply the whole tail: nothing acknowledged is missing here.
        let nodes = follow::list_tail(client, self.deadline()).await?;
        let cursor = match follow::read_base(client, self.deadline()).await? {
            Some((base, _)) => {
                let (head, hash) = hex_head(self.engine);
                let mut c = follow::locate(&base, &nodes, head, &hash)?;
                follow::catch_up(client, self.engine, &mut c, &nodes, self.deadline()).await?;
                c
            }
            None => {
                // The group's first leader: the tail starts at its head.
                let (head, hash) = hex_head(self.engine);
                let seq = nodes.iter().map(|n| n.seq).max().unwrap_or(0);
                let base = Base {
                    seq,
                    pos: head,
                    hash,
                };
                let data = serde_json::to_vec(&base).unwrap_or_default();
                let acl = self.acl(paths::BASE);
                let options = zk::CreateMode::Persistent.with_acls(zk::Acls::new(&acl));
                let mut w = client.new_multi_writer();
                w.add_check_version(paths::EPOCH, epoch_version)
                    .and_then(|()| w.add_create(paths::BASE, &data, &options))
                    .map_err(|e| ZkError::new("multi", paths::BASE, ZkErrorKind::Server(e)))?;
                call(self.deadline(), "multi", paths::BASE, w.commit()).await?;
                Cursor { seq, pos: head }
            }
        };
        // 3. A command the old leader only half wrote was never
        //    acknowledged: remove it, so the tail ends at a command boundary.
        let nodes = follow::list_tail(client, self.deadline()).await?;
        let max_seq = nodes.iter().map(|n| n.seq).max().unwrap_or(cursor.seq);
        let trailing: Vec<NodeName> = nodes
            .iter()
            .copied()
            .filter(|n| n.seq > cursor.seq)
            .collect();
        if !trailing.is_empty() {
            if trailing.iter().any(|n| n.complete) {
                return Err(End::StepDown(
                    "the tail grew while this engine took over".into(),
                ));
            }
            let mut w = client.new_multi_writer();
            let mut add = || -> Result<(), zk::Error> {
                w.add_check_version(paths::EPOCH, epoch_version)?;
                for n in &trailing {
                    w.add_delete(&paths::tail_node(&n.to_string()), None)?;
                }
                Ok(())
            };
            add().map_err(|e| ZkError::new("multi", paths::TAIL, ZkErrorKind::Server(e)))?;
            call(self.deadline(), "multi", paths::TAIL, w.commit()).await?;
            tracing::warn!(nodes = trailing.len(), "removed the part of a command the previous leader did not finish (it was never acknowledged)");
        }
        let head = self.engine.log().head().0;
        if head != cursor.pos {
            return Err(End::StepDown(format!(
                "the log is at {head} after applying the tail, which ends at {}",
                cursor.pos
            )));
        }
        // 4. Advertise, then take commands and start the projector.
        let leader = serde_json::to_vec(&LeaderNode {
            id: self.config.id.clone(),
            url: self.config.url.clone(),
            epoch,
        })
        .unwrap_or_default();
        let _ = call(
            self.deadline(),
            "delete",
            paths::LEADER,
            client.delete(paths::LEADER, None),
        )
        .await;
        call(
            self.deadline(),
            "create",
            paths::LEADER,
            client.create(
                paths::LEADER,
                &leader,
                &ingest_projections::acl::lock_options(),
            ),
        )
        .await?;
        let end = Arc::new(TailEnd::default());
        end.next_seq.store(max_seq + 1, Ordering::Release);
        end.head.store(cursor.pos, Ordering::Release);
        let replicator = ZkReplicator {
            runtime: tokio::runtime::Handle::current(),
            client: client.clone(),
            epoch_version,
            acl: self.acl(paths::TAIL),
            deadline: self.deadline(),
            end: Arc::clone(&end),
        };
        let mut leading = self.engine.leading();
        self.engine
            .set_role(Some(Box::new(replicator)))
            .await
            .map_err(|_| End::Stopped)?;
        let duty_token = self.cancel.child_token();
        let duty = (self.duties)(duty_token.clone());
        self.status.update(|s| {
            s.role = Role::Leader;
            s.epoch = Some(epoch);
            s.leader_url = Some(self.config.url.clone());
            s.leader_id = Some(self.config.id.clone());
            s.lag = Some(0);
            s.reason = None;
        });
        tracing::info!(id = %self.config.id, epoch, position = head, candidate, "leading the replicated group");
        let ended = loop {
            tokio::select! {
                () = self.cancel.cancelled() => break Ok(()),
                _ = async { leading.wait_for(|l| !*l).await.is_ok() } => {
                    // The writer dropped its replicator: a tail write failed.
                    break Err(End::StepDown("a replicated write failed; stepping down".into()));
                }
                () = tokio::time::sleep(self.config.poll) => {
                    if matches!(client.state(), zk::SessionState::Expired | zk::SessionState::Closed | zk::SessionState::AuthFailed) {
                        break Err(End::StepDown("the ZooKeeper session ended".into()));
                    }
                    if let Err(e) = self.keep_tail(client, epoch_version, &end).await {
                        if e.is_conflict() {
                            break Err(End::StepDown(format!("another engine took over: {e}")));
                        }
                        tracing::warn!(error = %e, "tail upkeep failed; trying again");
                    }
                }
            }
        };
        let _ = self.engine.set_role(None).await;
        duty_token.cancel();
        let _ = duty.await;
        let _ = client.delete(paths::LEADER, None).await;
        self.status.update(|s| {
            s.replicas.clear();
        });
        match &ended {
            Ok(()) => tracing::info!("stopped leading (shutdown)"),
            Err(e) => tracing::warn!(error = %e, "stopped leading"),
        }
        ended
    }

    /// The leader's upkeep: read every replica, drop the ones too far
    /// behind, trim what all the others applied.
    async fn keep_tail(
        &mut self,
        client: &zk::Client,
        epoch_version: i32,
        end: &TailEnd,
    ) -> Result<(), ZkError> {
        let head = end.head.load(Ordering::Acquire);
        let nodes = follow::list_tail(client, self.deadline()).await?;
        let tail_bytes: u64 = nodes.iter().map(|n| n.len as u64).sum();
        let mut replicas = Vec::new();
        for id in call(
            self.deadline(),
            "list",
            paths::REPLICAS,
            client.list_children(paths::REPLICAS),
        )
        .await?
        {
            let path = paths::replica(&id);
            let Ok((data, stat)) =
                call(self.deadline(), "get", &path, client.get_data(&path)).await
            else {
                continue;
            };
            let Ok(r) = serde_json::from_slice::<Registration>(&data) else {
                continue;
            };
            replicas.push((id, r, stat.version));
        }
        // Keep this engine's own registration current.
        if let Some((_, r, version)) = replicas.iter_mut().find(|(id, _, _)| id == &self.config.id)
        {
            if r.applied != head {
                r.applied = head;
                let data = serde_json::to_vec(r).unwrap_or_default();
                if let Ok(stat) = client
                    .set_data(&paths::replica(&self.config.id), &data, Some(*version))
                    .await
                {
                    *version = stat.version;
                }
            }
        }
        // Drop the replicas too far behind.
        let holding = |replicas: &Vec<(String, Registration, i32)>| -> Option<usize> {
            replicas
                .iter()
                .enumerate()
                .filter(|(_, (id, r, _))| id != &self.config.id && !r.dropped)
                .min_by_key(|(_, (_, r, _))| r.applied)
                .map(|(i, _)| i)
        };
        let over_bytes =
            tail_bytes > self.config.max_lag_bytes || nodes.len() > self.config.max_tail_nodes;
        let mut to_drop: Vec<usize> = replicas
            .iter()
            .enumerate()
            .filter(|(_, (id, r, _))| {
                id != &self.config.id
                    && !r.dropped
                    && head.saturating_sub(r.applied) > self.config.max_lag_events
            })
            .map(|(i, _)| i)
            .collect();
        if over_bytes && to_drop.is_empty() {
            to_drop.extend(holding(&replicas));
        }
        for i in to_drop {
            let (id, r, version) = &mut replicas[i];
            r.dropped = true;
            let data = serde_json::to_vec(r).unwrap_or_default();
            match client
                .set_data(&paths::replica(id), &data, Some(*version))
                .await
            {
                Ok(_) => tracing::error!(
                    replica = %id,
                    applied = r.applied,
                    head,
                    tail_bytes,
                    tail_nodes = nodes.len(),
                    "a replica fell too far behind and was dropped from the set that holds the tail; it rejoins by copying the log from a peer"
                ),
                Err(e) => {
                    tracing::warn!(replica = %id, error = %e, "could not drop a lagging replica")
                }
            }
        }
        // Trim everything every remaining replica applied.
        let min_applied = replicas
            .iter()
            .filter(|(id, r, _)| id != &self.config.id && !r.dropped)
            .map(|(_, r, _)| r.applied)
            .min()
            .unwrap_or(head)
            .min(head);
        if let Some((doomed, cut)) = crate::tail::trim_prefix(&nodes, min_applied, TRIM_NODES) {
            {
                let hash = self
                    .engine
                    .log()
                    .read_one(cut.pos)
                    .map(|r| hex::encode(r.envelope.hash))
                    .map_err(|e| {
                        ZkError::new(
                            "read",
                            "the log",
                            ZkErrorKind::Server(zk::Error::UnexpectedError(e.to_string())),
                        )
                    })?;
                let base = serde_json::to_vec(&Base {
                    seq: cut.seq,
                    pos: cut.pos,
                    hash,
                })
                .unwrap_or_default();
                let mut w = client.new_multi_writer();
                let mut add = || -> Result<(), zk::Error> {
                    w.add_check_version(paths::EPOCH, epoch_version)?;
                    w.add_set_data(paths::BASE, &base, None)?;
                    for n in &doomed {
                        w.add_delete(&paths::tail_node(&n.to_string()), None)?;
                    }
                    Ok(())
                };
                add().map_err(|e| ZkError::new("multi", paths::TAIL, ZkErrorKind::Server(e)))?;
                match call(self.deadline(), "multi", paths::TAIL, w.commit()).await {
                    Ok(_) => {}
                    Err(e) => return Err(e),
                }
            }
        }
        let views: Vec<ReplicaView> = replicas
            .iter()
            .map(|(id, r, _)| ReplicaView {
                id: id.clone(),
                url: r.url.clone(),
                applied: r.applied,
                lag: head.saturating_sub(r.applied),
                dropped: r.dropped,
            })
            .collect();
        let nodes_left = follow::list_tail(client, self.deadline())
            .await
            .map(|n| n.len())
            .unwrap_or(nodes.len());
        self.status.update(|s| {
            s.applied = head;
            s.replicas = views;
            s.tail_nodes = nodes_left as u64;
            s.tail_bytes = tail_bytes;
            s.tail_writes = end.writes.load(Ordering::Relaxed);
            s.records_replicated = end.records.load(Ordering::Relaxed);
            s.tail_frame_bytes = end.frame_bytes.load(Ordering::Relaxed);
            s.tail_stored_bytes = end.stored_bytes.load(Ordering::Relaxed);
        });
        Ok(())
    }
}

/// The sequence number of a candidate's name (`c-0000000042`).
fn sequence_of(name: &str) -> u64 {
    name.rsplit('-')
        .next()
        .and_then(|s| s.parse().ok())
        .unwrap_or(u64::MAX)
}
