//! Adoption mode (`ingest serve --foreign-writes adopt`): the projector
//! watches `/jobs`, `/batches` and `/access`; what another client writes
//! (a status, a pause or hold, a batch or job created; access statuses in
//! `adopt_access.rs`, deletions in `adopt_delete.rs`) is offered to the
//! engine ([`AdoptForeign`], `adoption.rs`), which decides it as the
//! command it means; anything else another client writes, and a write the
//! engine refuses, is converged back and recorded as in `foreign.rs`.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use ingest_events::lifecycle::StateKind;
use ingest_events::{Jid, JobState};
use zookeeper_client as zk;

use super::adoption::*;
use super::item::{found_text, Item};
use super::runner::{Exit, Runner};
use crate::layout;
use crate::zk::{call, ZkError, ZkErrorKind};

/// What became of a pause or hold lock another client changed.
pub(super) enum LockAdoption {
    /// The engine took it; its event will be projected.
    Adopted,
    /// Refused: revert it and record this.
    Refused(String),
}

/// How long the tree must be quiet before the events of an adoption watch
/// are handled: mrt-zk's `setStatus` is several writes (the status node,
/// then each reference), and they are judged together.
pub(super) const QUIET: std::time::Duration = std::time::Duration::from_millis(200);

/// The longest the events of a round wait for [`QUIET`]: under a steady
/// stream of other clients' writes the tree is never quiet, and without a
/// bound nothing would be adopted until the stream stops.
pub(super) const MAX_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// The persistent recursive watches of adoption mode and the events they
/// gave that are not handled yet.
pub(super) struct TreeWatch {
    /// On `/jobs`, `/batches` and `/access`; `None` once their session
    /// ended.
    watchers: Option<(
        zk::PersistentWatcher,
        zk::PersistentWatcher,
        zk::PersistentWatcher,
    )>,
    events: Vec<(zk::EventType, String)>,
    last: Option<tokio::time::Instant>,
    /// When the first event of the round came.
    first: Option<tokio::time::Instant>,
    /// Job lock nodes created since the last read of their holders.
    unread_locks: Vec<String>,
    /// The holder of each job lock node seen created, read as soon as its
    /// creation was seen (mrt-zk releases a lock right after its status
    /// write, often before the round is handled).
    pub(super) holders: HashMap<String, Holder>,
}

/// The holder of a job's lock node, as read when it was created.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Holder {
    /// Its ephemeral owner: the session.
    session: i64,
    /// Whether it is an `ingest worker`'s lock (it holds a fence secret):
    /// such a worker reports through the API and never writes the status.
    ingest_worker: bool,
}

impl Holder {
    /// Reads a lock node's holder from its data and stat.
    fn of(data: &[u8], stat: &zk::Stat) -> Holder {
        Holder {
            session: stat.ephemeral_owner,
            ingest_worker: ingest_protocol::fence::LockNode::read(data).is_some(),
        }
    }
}

/// A job's lock as a status write saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum LockSeen {
    /// Held; by this holder when it could be read.
    Held(Option<Holder>),
    /// Nobody held it.
    Free,
}

/// The job whose lock node `path` is (`/jobs/JID/lock`).
fn job_of_lock(path: &str) -> Option<Jid> {
    match path
        .trim_start_matches('/')
        .split('/')
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["jobs", id, "lock"] => id.parse().ok(),
        _ => None,
    }
}

/// The access request whose lock node `path` is
/// (`/access/<queue>/QID/lock`).
fn access_of_lock(path: &str) -> Option<ingest_events::Qid> {
    match path.strip_suffix("/lock").map(|p| Item::of(p, |_| None)) {
        Some(Some(Item::Access(_, qid))) => Some(qid),
        _ => None,
    }
}

impl TreeWatch {
    /// No watch (revert mode).
    pub(super) fn none() -> TreeWatch {
        TreeWatch {
            watchers: None,
            events: Vec::new(),
            last: None,
            first: None,
            unread_locks: Vec::new(),
            holders: HashMap::new(),
        }
    }

    /// Waits for the next event (never, without watchers).
    pub(super) async fn next(&mut self) -> zk::WatchedEvent {
        match &mut self.watchers {
            Some((jobs, batches, access)) => tokio::select! {
                e = jobs.changed() => e,
                e = batches.changed() => e,
                e = access.changed() => e,
            },
            None => std::future::pending().await,
        }
    }

    /// Keeps `event`: a node event for later, the end of the session as
    /// the end of the watchers.
    pub(super) fn push(&mut self, event: zk::WatchedEvent) {
        if event.event_type == zk::EventType::Session {
            if event.session_state.is_terminated() {
                self.watchers = None;
            }
            return;
        }
        self.keep(event.event_type, event.path, tokio::time::Instant::now());
    }

    /// Keeps a node event that came at `now`.
    fn keep(&mut self, kind: zk::EventType, path: String, now: tokio::time::Instant) {
        // The engine's own id reservations (never seen outside their multi).
        if crate::ids::is_scratch(&path) {
            return;
        }
        // Bounded: past this many, one more round is read from the tree anyway.
        if self.events.len() < 65_536 {
            if kind == zk::EventType::NodeCreated
                && (job_of_lock(&path).is_some() || access_of_lock(&path).is_some())
                && self.unread_locks.len() < 4_096
            {
                self.unread_locks.push(path.clone());
            }
            self.events.push((kind, path));
        }
        self.last = Some(now);
        self.first.get_or_insert(now);
    }

    /// Keeps again an event whose judgement waits (a job removed while its
    /// finished batch stays): it is handled with the next round.
    pub(super) fn again(&mut self, kind: zk::EventType, path: String) {
        self.keep(kind, path, tokio::time::Instant::now());
    }

    /// Takes every event already delivered, without waiting.
    pub(super) async fn drain(&mut self) {
        loop {
            let ready = tokio::select! {
                biased;
                e = self.next() => Some(e),
                _ = std::future::ready(()) => None,
            };
            match ready {
                Some(e) => self.push(e),
                None => return,
            }
        }
    }

    /// When the events kept are due: [`QUIET`] after the last one, or
    /// [`MAX_WAIT`] after the first, whichever comes first.
    pub(super) fn due(&self) -> Option<tokio::time::Instant> {
        let (first, last) = (self.first?, self.last?);
        (!self.events.is_empty()).then(|| (last + QUIET).min(first + MAX_WAIT))
    }

    /// The events kept, once due.
    pub(super) fn take_due(&mut self) -> Option<Vec<(zk::EventType, String)>> {
        self.take_due_at(tokio::time::Instant::now())
    }

    /// The events kept, if due at `now`.
    fn take_due_at(&mut self, now: tokio::time::Instant) -> Option<Vec<(zk::EventType, String)>> {
        let due = self.due()?;
        if now < due {
            return None;
        }
        self.last = None;
        self.first = None;
        Some(std::mem::take(&mut self.events))
    }
}

impl Runner {
    /// Sets the persistent recursive watches on `/jobs` and `/batches`
    /// (adoption mode).
    pub(super) async fn watch_tree(&self, client: &zk::Client) -> Result<TreeWatch, Exit> {
        let watch = |path: &'static str| async move {
            call(
                self.deadline(),
                "add-watch",
                path,
                client.watch(path, zk::AddWatchMode::PersistentRecursive),
            )
            .await
        };
        let jobs = watch(layout::JOBS).await?;
        let batches = watch(layout::BATCHES).await?;
        let access = watch(layout::ACCESS).await?;
        // ZooKeeper's counters past every id the log holds (and past 0,
        // which is no id), so mrt-zk's next `createBatch`/`createJob` takes
        // a new one: a fresh or rebuilt tree starts them at 0.
        let state = self.model.projector.state();
        let floors = [
            (crate::ids::IdKind::Batch, state.next_bid().0),
            (crate::ids::IdKind::Job, state.next_jid().0),
        ];
        for (kind, floor) in floors {
            crate::ids::reserve(client, &self.cfg.zk.access, self.deadline(), kind, 1, floor)
                .await
                .map_err(|e| match e {
                    crate::ids::IdError::Zk(z) => Exit::Io(z),
                    // Other clients creating all the while: again, with a pause.
                    crate::ids::IdError::Contended { .. } => Exit::Conflict,
                    other => Exit::Fatal(super::SinkError::Config(other.to_string())),
                })?;
        }
        Ok(TreeWatch {
            watchers: Some((jobs, batches, access)),
            ..TreeWatch::none()
        })
    }

    /// The name of the ZooKeeper client that made a foreign write, from
    /// `who` (`zk-session-0x…`, `zk-zxid-0x…`, `zk-client`): with a Merritt
    /// identity configured (`--zk-merritt-identity`, ACLs), the identity's
    /// user too (`USER@zk-session-0x…`), since only that identity and the
    /// engine can write the queue's nodes then. Bounded: the user is cut
    /// to 64 bytes, so the name stays well under an actor's 200.
    pub(super) fn foreign_actor(&self, who: &str) -> String {
        match &self.cfg.zk.access.merritt {
            Some(id) => {
                let user = id.as_str().rsplit_once(':').map_or("", |(u, _)| u);
                format!("{}@{who}", ingest_protocol::cut(user, 64))
            }
            None => who.to_string(),
        }
    }

    /// Reads the holder of each job lock node seen created since the last
    /// call, at once: a status write is judged later, when the lock may be
    /// gone. A lock already gone stays unread (its holder unknown).
    pub(super) async fn read_new_locks(&self, client: &zk::Client, tree: &mut TreeWatch) {
        for path in std::mem::take(&mut tree.unread_locks) {
            // Best effort: an error leaves the holder unknown.
            let read = tokio::time::timeout(self.deadline(), client.get_data(&path)).await;
            if let Ok(Ok((data, stat))) = read {
                if tree.holders.len() < 65_536 {
                    tree.holders.insert(path, Holder::of(&data, &stat));
                }
            }
        }
    }

    /// Handles the events a [`TreeWatch`] collected: job status changes are
    /// offered to the engine ([`Runner::adopt_statuses`]); any other node
    /// that is not what the applied checkpoint says (created, deleted,
    /// changed) has its item converged and recorded. Returns the checkpoint
    /// version after the repairs.
    pub(super) async fn handle_tree_events(
        &mut self,
        client: &zk::Client,
        mut version: i32,
        events: Vec<(zk::EventType, String)>,
        holders: &mut HashMap<String, Holder>,
    ) -> Result<i32, Exit> {
        // Between transactions, as every write of the sink (see `ProjectorGate`).
        let gate = std::sync::Arc::clone(&self.cfg.gate.lock);
        let _turn = tokio::select! {
            turn = gate.read_owned() => turn,
            _ = self.shutdown.cancelled() => return Ok(version),
        };
        // Each job's lock as the events tell it, in their order, and the
        // lock as each job's last status write saw it (`None`: no lock
        // event this round; the lock is read with the status).
        let mut locks: HashMap<Jid, LockSeen> = HashMap::new();
        let mut statuses: BTreeMap<Jid, Option<LockSeen>> = BTreeMap::new();
        let mut items: Vec<(Item, String)> = Vec::new();
        let mut created: BTreeSet<ingest_events::Bid> = BTreeSet::new();
        let mut batch_statuses: BTreeSet<ingest_events::Bid> = BTreeSet::new();
        let mut created_jobs: BTreeSet<Jid> = BTreeSet::new();
        let mut creators: HashMap<Jid, Holder> = HashMap::new();
        let mut deleted_batches: BTreeSet<ingest_events::Bid> = BTreeSet::new();
        let mut deleted_jobs: BTreeSet<Jid> = BTreeSet::new();
        let mut access_locks: HashMap<ingest_events::Qid, LockSeen> = HashMap::new();
        let mut access_statuses: BTreeMap<ingest_events::Qid, Option<LockSeen>> = BTreeMap::new();
        let mut deleted_access: BTreeSet<(ingest_events::event::AccessQueue, ingest_events::Qid)> =
            BTreeSet::new();
        // Access requests whose lock another session held when it was
        // removed (a delete of a request being assembled).
        let mut unlocked_access: BTreeSet<ingest_events::Qid> = BTreeSet::new();
        let state = self.model.projector.state();
        for (kind, path) in events {
            if let Some(jid) = job_of_lock(&path) {
                match kind {
                    zk::EventType::NodeCreated => {
                        let holder = holders.get(&path).copied();
                        // The creator of a job the log does not have yet
                        // (mrt-zk's `createJob` locks it while it writes).
                        if let (false, Some(h)) = (state.jobs.contains_key(&jid), holder) {
                            creators.insert(jid, h);
                        }
                        locks.insert(jid, LockSeen::Held(holder));
                    }
                    zk::EventType::NodeDeleted => {
                        holders.remove(&path);
                        locks.insert(jid, LockSeen::Free);
                    }
                    _ => {}
                }
                continue;
            }
            if let Some(qid) = access_of_lock(&path) {
                match kind {
                    zk::EventType::NodeCreated => {
                        access_locks.insert(qid, LockSeen::Held(holders.get(&path).copied()));
                    }
                    zk::EventType::NodeDeleted => {
                        if holders.remove(&path).is_some() {
                            unlocked_access.insert(qid);
                        }
                        access_locks.insert(qid, LockSeen::Free);
                    }
                    _ => {}
                }
                continue;
            }
            if layout::is_ephemeral_lock(&path) {
                continue;
            }
            let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
            // An item's root removed (mrt-zk's delete helpers end with it).
            if kind == zk::EventType::NodeDeleted {
                match parts.as_slice() {
                    ["batches", id] => {
                        if let Some(b) = id.parse().ok().and_then(|b| state.batches.get(&b)) {
                            if !b.cleaned_up {
                                deleted_batches.insert(b.bid);
                            }
                        }
                    }
                    ["jobs", id] => {
                        if let Some(j) = id.parse().ok().and_then(|j| state.jobs.get(&j)) {
                            if !j.cleaned_up {
                                deleted_jobs.insert(j.jid);
                            }
                        }
                    }
                    ["access", _, _] => {
                        if let Some(Item::Access(q, qid)) = Item::of(&path, |_| None) {
                            if state.access.contains_key(&qid)
                                && self.model.applied_data(&path).is_some()
                            {
                                deleted_access.insert((q, qid));
                            }
                        }
                    }
                    _ => {}
                }
            }
            if let (zk::EventType::NodeDataChanged, ["jobs", id, "status"]) =
                (kind, parts.as_slice())
            {
                if let Ok(jid) = id.parse::<Jid>() {
                    if state.jobs.contains_key(&jid) {
                        statuses.insert(jid, locks.get(&jid).copied());
                        continue;
                    }
                }
            }
            if let (zk::EventType::NodeDataChanged, ["access", _, _, "status"]) =
                (kind, parts.as_slice())
            {
                if let Some(Item::Access(_, qid)) = Item::of(&path, |_| None) {
                    if state.access.contains_key(&qid) {
                        access_statuses.insert(qid, access_locks.get(&qid).copied());
                        continue;
                    }
                }
            }
            if let (zk::EventType::NodeDataChanged, ["batches", id, "status"]) =
                (kind, parts.as_slice())
            {
                if let Ok(bid) = id.parse::<ingest_events::Bid>() {
                    if state.batches.contains_key(&bid) {
                        batch_statuses.insert(bid);
                        continue;
                    }
                }
            }
            let suspect = match kind {
                zk::EventType::NodeCreated => self.model.applied_data(&path).is_none(),
                zk::EventType::NodeDeleted => self.model.applied_data(&path).is_some(),
                zk::EventType::NodeDataChanged => true,
                _ => false,
            };
            let item = Item::of(&path, |uuid| {
                uuid.parse().ok().and_then(|u| state.uuids.get(&u).copied())
            });
            // A node of a batch the log does not have: another client
            // created it (mrt-zk's `createBatch`), unless it is adopted
            // already and waits for its event.
            if let Some(Item::Batch(bid)) = &item {
                if !state.batches.contains_key(bid) {
                    if !self.adopted_batches.contains_key(bid) {
                        created.insert(*bid);
                    }
                    continue;
                }
            }
            // The same for a job (mrt-zk's `createJob`).
            if let Some(Item::Job(jid)) = &item {
                if !state.jobs.contains_key(jid) {
                    if !self.adopted.contains_key(jid) {
                        created_jobs.insert(*jid);
                    }
                    continue;
                }
            }
            if let (true, Some(item)) = (suspect, item) {
                if !items.iter().any(|(i, _)| *i == item) {
                    items.push((item, path));
                }
            }
        }
        let offered: BTreeSet<Jid> = statuses.keys().copied().collect();
        // In the order mrt-zk makes them: a batch, its acquisition, its
        // jobs, their statuses.
        version = self.adopt_batches(client, version, created).await?;
        version = self
            .adopt_batch_statuses(client, version, &batch_statuses)
            .await?;
        version = self
            .adopt_jobs(client, version, created_jobs, &creators)
            .await?;
        version = self.adopt_statuses(client, version, statuses).await?;
        let offered_access: BTreeSet<ingest_events::Qid> =
            access_statuses.keys().copied().collect();
        version = self
            .adopt_access_statuses(client, version, access_statuses)
            .await?;
        let deleted = self
            .adopt_deletes(
                client,
                version,
                &deleted_batches,
                &deleted_jobs,
                (&deleted_access, &unlocked_access),
            )
            .await?;
        version = deleted.0;
        for (item, path) in items {
            // Judged with its removal (adopted, or put back and recorded).
            if deleted.1.contains(&item) {
                continue;
            }
            // A job just offered was read whole; an adopted one waits for
            // its event (its nodes are put back silently then).
            if let Item::Job(j) = item {
                if offered.contains(&j) || self.adopted.contains_key(&j) {
                    continue;
                }
            }
            if let Item::Batch(b) = item {
                if batch_statuses.contains(&b) || self.adopted_batches.contains_key(&b) {
                    continue;
                }
            }
            if let Item::Access(_, q) = item {
                if offered_access.contains(&q) || self.adopted_access.contains_key(&q) {
                    continue;
                }
            }
            if self
                .repair_item(
                    client,
                    version,
                    &item,
                    Some(&path),
                    "a watch on the tree saw another client's write",
                )
                .await?
            {
                version += 1;
            }
        }
        Ok(version)
    }

    /// In adoption mode, offers the pause or hold lock at `path` to the
    /// engine when the node's existence differs from what the applied
    /// checkpoint says (the caller holds the gate). `None`: nothing to
    /// adopt (revert mode, or no difference).
    pub(super) async fn adopt_lock(
        &mut self,
        client: &zk::Client,
        path: &str,
    ) -> Result<Option<LockAdoption>, Exit> {
        let Some(adopter) = self.cfg.adopt.clone() else {
            return Ok(None);
        };
        // Adopted, its event not projected yet: left as it is until then.
        if self.adopted_locks.contains_key(path) {
            return Ok(Some(LockAdoption::Adopted));
        }
        let stat = call(self.deadline(), "exists", path, client.check_stat(path)).await?;
        let applied = self.model.applied_data(path).is_some();
        if stat.is_some() == applied {
            return Ok(None);
        }
        let Some(change) = LockChange::of(path, stat.is_some()) else {
            return Ok(None);
        };
        let actor = match stat {
            Some(s) => self.foreign_actor(&format!("zk-zxid-0x{:x}", s.czxid)),
            None => self.foreign_actor("zk-client"),
        };
        let what = if stat.is_some() { "created" } else { "deleted" };
        let offered = ForeignLock { change, actor };
        Ok(Some(
            match tokio::time::timeout(self.deadline(), adopter.0.adopt_lock(offered)).await {
                Ok(Adoption::Accepted(position)) => {
                    tracing::info!(root = %self.cfg.zk.root, %path, what, position, "adopted a foreign pause or hold");
                    self.adopted_locks
                        .insert(path.to_string(), (position, stat.is_some()));
                    LockAdoption::Adopted
                }
                Ok(Adoption::Refused(why)) => LockAdoption::Refused(format!(
                    "adoption refused: {path} {what}: {}",
                    ingest_protocol::cut(&why, 300)
                )),
                Err(_) => LockAdoption::Refused(format!(
                    "adoption of {path} {what}: the engine did not answer"
                )),
            },
        ))
    }

    /// Offers each batch another client created to the engine (the caller
    /// holds the gate). A creation still under way (no `submission` or
    /// `status` yet) waits for the watch to report the rest. Adopted, the
    /// nodes found are left in place and the projector writes the engine's
    /// event over them (a create of a node found is a set); refused, the
    /// batch's nodes and its `/batch-uuids` node are removed and recorded.
    /// Returns the checkpoint version after the repairs.
    pub(super) async fn adopt_batches(
        &mut self,
        client: &zk::Client,
        mut version: i32,
        created: BTreeSet<ingest_events::Bid>,
    ) -> Result<i32, Exit> {
        let Some(adopter) = self.cfg.adopt.clone() else {
            return Ok(version);
        };
        for bid in created {
            let root = layout::batch(bid);
            let (submission, status) = (layout::batch_submission(bid), layout::batch_status(bid));
            let mut reader = client.new_multi_reader();
            for p in [&root, &submission, &status] {
                reader
                    .add_get_data(p)
                    .map_err(|e| ZkError::new("multi-read", p.clone(), ZkErrorKind::Server(e)))?;
            }
            let read = call(self.deadline(), "multi-read", &root, reader.commit()).await?;
            let data = |i: usize| match read.get(i) {
                Some(zk::MultiReadResult::Data { data, stat }) => Some((data.clone(), *stat)),
                _ => None,
            };
            let (Some((_, root_stat)), Some((submitted, _)), Some((status_data, _))) =
                (data(0), data(1), data(2))
            else {
                // Gone again, or not finished: the watch brings the rest.
                continue;
            };
            let uuid = serde_json::from_slice::<serde_json::Value>(&submitted)
                .ok()
                .and_then(|v| v["batchID"].as_str().map(str::to_string))
                .filter(|u| !u.is_empty() && !u.contains('/'))
                .map(|u| format!("{}/{u}", layout::BATCH_UUIDS));
            let uuid_found = match &uuid {
                Some(p) => call(self.deadline(), "exists", p, client.check_stat(p))
                    .await?
                    .is_some(),
                None => false,
            };
            let offered = ForeignBatch {
                bid,
                submission: submitted,
                status: serde_json::from_slice::<serde_json::Value>(&status_data)
                    .ok()
                    .and_then(|v| {
                        v["status"]
                            .as_str()
                            .map(|s| ingest_protocol::cut(s, 64).into_owned())
                    })
                    .unwrap_or_default(),
                actor: self.foreign_actor(&format!("zk-zxid-0x{:x}", root_stat.czxid)),
            };
            let reason = match tokio::time::timeout(self.deadline(), adopter.0.adopt_batch(offered))
                .await
            {
                Ok(Adoption::Accepted(position)) => {
                    tracing::info!(root = %self.cfg.zk.root, %bid, position, "adopted a batch another client created");
                    self.adopted_batches.insert(bid, position);
                    let mut found = vec![root.clone(), submission.clone(), status.clone()];
                    found.extend(uuid.clone().filter(|_| uuid_found));
                    for p in found {
                        self.adopted_locks.insert(p, (position, true));
                    }
                    continue;
                }
                Ok(Adoption::Refused(why)) => format!(
                    "adoption refused: batch {bid} created by another client: {}",
                    ingest_protocol::cut(&why, 300)
                ),
                Err(_) => format!("adoption of batch {bid}: the engine did not answer"),
            };
            if self
                .repair_item(client, version, &Item::Batch(bid), None, &reason)
                .await?
            {
                version += 1;
            }
            if let Some(p) = uuid.filter(|p| uuid_found && self.model.applied_data(p).is_none()) {
                if self
                    .repair_item(client, version, &Item::Node(p), None, &reason)
                    .await?
                {
                    version += 1;
                }
            }
        }
        Ok(version)
    }

    /// Offers each batch's foreign status change to the engine (the caller
    /// holds the gate). Adopted, the projector writes the engine's event
    /// over what mrt-zk left (its `states` node, made by
    /// `acquirePendingBatch`, is kept: the projector's create of it is a
    /// set); refused, the batch is reverted and recorded. Returns the
    /// checkpoint version after the repairs.
    pub(super) async fn adopt_batch_statuses(
        &mut self,
        client: &zk::Client,
        mut version: i32,
        batches: &BTreeSet<ingest_events::Bid>,
    ) -> Result<i32, Exit> {
        use ingest_events::lifecycle::BatchState;
        let Some(adopter) = self.cfg.adopt.clone() else {
            return Ok(version);
        };
        let state_of = |data: &[u8]| {
            serde_json::from_slice::<serde_json::Value>(data)
                .ok()
                .and_then(|v| v["status"].as_str().and_then(BatchState::from_name))
        };
        for bid in batches.iter().copied() {
            let status = layout::batch_status(bid);
            let states = layout::batch_states(bid);
            let Some((data, stat)) = self.read_node(client, &status).await? else {
                continue;
            };
            let applied = self.model.applied_data(&status);
            if applied.as_deref() == Some(data.as_slice()) {
                continue;
            }
            let reason = match (applied.as_deref().and_then(state_of), state_of(&data)) {
                (Some(from), Some(to)) if from != to => {
                    let change = ForeignBatchStatus {
                        bid,
                        from,
                        to,
                        actor: self.foreign_actor(&format!("zk-zxid-0x{:x}", stat.mzxid)),
                    };
                    match tokio::time::timeout(
                        self.deadline(),
                        adopter.0.adopt_batch_status(change),
                    )
                    .await
                    {
                        Ok(Adoption::Accepted(position)) => {
                            tracing::info!(root = %self.cfg.zk.root, %bid, %from, %to, position, "adopted a foreign batch status change");
                            self.adopted_batches.insert(bid, position);
                            if self.read_node(client, &states).await?.is_some() {
                                self.adopted_locks.insert(states, (position, true));
                            }
                            continue;
                        }
                        Ok(Adoption::Refused(why)) => format!(
                            "adoption refused {from} -> {to}: {}",
                            ingest_protocol::cut(&why, 300)
                        ),
                        Err(_) => format!("adoption of {from} -> {to}: the engine did not answer"),
                    }
                }
                _ => "adoption: not a batch status change the engine can adopt".to_string(),
            };
            if self
                .repair_item(client, version, &Item::Batch(bid), None, &reason)
                .await?
            {
                version += 1;
            }
        }
        Ok(version)
    }

    /// Offers each job another client created to the engine (the caller
    /// holds the gate), once its `status` exists. Adopted, the nodes found
    /// are left in place and the projector writes the engine's event over
    /// them; refused, the job's nodes are removed and recorded. Returns
    /// the checkpoint version after the repairs.
    pub(super) async fn adopt_jobs(
        &mut self,
        client: &zk::Client,
        mut version: i32,
        created: BTreeSet<Jid>,
        creators: &HashMap<Jid, Holder>,
    ) -> Result<i32, Exit> {
        let Some(adopter) = self.cfg.adopt.clone() else {
            return Ok(version);
        };
        for jid in created {
            let root = layout::job(jid);
            let names = [
                "bid",
                "priority",
                "configuration",
                "identifiers",
                "metadata",
                "status",
            ];
            let paths: Vec<String> = std::iter::once(root.clone())
                .chain(names.iter().map(|n| format!("{root}/{n}")))
                .collect();
            let mut reader = client.new_multi_reader();
            for p in &paths {
                reader
                    .add_get_data(p)
                    .map_err(|e| ZkError::new("multi-read", p.clone(), ZkErrorKind::Server(e)))?;
            }
            let read = call(self.deadline(), "multi-read", &root, reader.commit()).await?;
            let found: Vec<Option<(Vec<u8>, zk::Stat)>> = read
                .into_iter()
                .map(|r| match r {
                    zk::MultiReadResult::Data { data, stat } => Some((data, stat)),
                    _ => None,
                })
                .collect();
            let text = |i: usize| {
                found
                    .get(i)
                    .and_then(|f| f.as_ref())
                    .map(|(d, _)| d.clone())
            };
            let root_stat = found.first().and_then(|f| f.as_ref()).map(|(_, s)| *s);
            let (Some(root_stat), Some(bid), Some(status)) = (root_stat, text(1), text(6)) else {
                // Gone again, or not finished: the watch brings the rest.
                continue;
            };
            let Ok(bid) = String::from_utf8_lossy(&bid)
                .trim()
                .parse::<ingest_events::Bid>()
            else {
                let reason = "adoption refused: a job created by another client names no batch";
                if self
                    .repair_item(client, version, &Item::Job(jid), None, reason)
                    .await?
                {
                    version += 1;
                }
                continue;
            };
            let actor = match creators.get(&jid) {
                Some(h) => self.foreign_actor(&format!("zk-session-0x{:x}", h.session)),
                None => self.foreign_actor(&format!("zk-zxid-0x{:x}", root_stat.czxid)),
            };
            let offered = ForeignJob {
                jid,
                bid,
                priority: String::from_utf8_lossy(&text(2).unwrap_or_default())
                    .chars()
                    .take(16)
                    .collect(),
                configuration: text(3).unwrap_or_default(),
                identifiers: text(4).unwrap_or_default(),
                metadata: text(5).unwrap_or_default(),
                status: serde_json::from_slice::<serde_json::Value>(&status)
                    .ok()
                    .and_then(|v| {
                        v["status"]
                            .as_str()
                            .map(|s| ingest_protocol::cut(s, 64).into_owned())
                    })
                    .unwrap_or_default(),
                actor,
            };
            let reason = match tokio::time::timeout(self.deadline(), adopter.0.adopt_job(offered))
                .await
            {
                Ok(Adoption::Accepted(position)) => {
                    tracing::info!(root = %self.cfg.zk.root, %jid, %bid, position, "adopted a job another client created");
                    self.adopted.insert(jid, position);
                    let mut nodes: Vec<String> = paths
                        .iter()
                        .zip(&found)
                        .filter(|(_, f)| f.is_some())
                        .map(|(p, _)| p.clone())
                        .collect();
                    // The references mrt-zk made.
                    nodes.extend(self.live_refs(client, jid, bid).await?);
                    for p in nodes {
                        self.adopted_locks.insert(p, (position, true));
                    }
                    continue;
                }
                Ok(Adoption::Refused(why)) => format!(
                    "adoption refused: job {jid} created by another client: {}",
                    ingest_protocol::cut(&why, 300)
                ),
                Err(_) => format!("adoption of job {jid}: the engine did not answer"),
            };
            if self
                .repair_item(client, version, &Item::Job(jid), None, &reason)
                .await?
            {
                version += 1;
            }
        }
        Ok(version)
    }

    /// The references of a new job that exist where mrt-zk's `createJob`
    /// puts them: its Pending queue reference under the priority its node
    /// names, and its `batch-processing` child (with that set's node).
    async fn live_refs(
        &self,
        client: &zk::Client,
        jid: Jid,
        bid: ingest_events::Bid,
    ) -> Result<Vec<String>, Exit> {
        let priority = self
            .read_node(client, &layout::job_priority(jid))
            .await?
            .and_then(|(d, _)| String::from_utf8_lossy(&d).trim().parse::<u8>().ok());
        let mut candidates = vec![
            layout::batch_set(bid, layout::BatchSet::Processing),
            layout::batch_child(bid, layout::BatchSet::Processing, jid),
        ];
        candidates.extend(priority.map(|p| layout::queue_ref(JobState::Pending, p, jid)));
        let mut out = Vec::new();
        for p in candidates {
            if self.read_node(client, &p).await?.is_some() {
                out.push(p);
            }
        }
        Ok(out)
    }

    /// One node's data and stat, `None` when it does not exist.
    pub(super) async fn read_node(
        &self,
        client: &zk::Client,
        path: &str,
    ) -> Result<Option<(Vec<u8>, zk::Stat)>, Exit> {
        match call(self.deadline(), "get_data", path, client.get_data(path)).await {
            Ok(found) => Ok(Some(found)),
            Err(e) if e.code() == Some(&zk::Error::NoNode) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Offers each job's foreign status change to the engine (the caller
    /// holds the gate), with the job's lock as the status write saw it
    /// (`None`: read with the status). Adopted, it flows back as the
    /// engine's event; refused (or not a status change, or written without
    /// the lock, or under an `ingest worker`'s lock), the job's nodes are
    /// reverted and recorded. Returns the checkpoint version after the
    /// repairs.
    pub(super) async fn adopt_statuses(
        &mut self,
        client: &zk::Client,
        mut version: i32,
        jobs: BTreeMap<Jid, Option<LockSeen>>,
    ) -> Result<i32, Exit> {
        let Some(adopter) = self.cfg.adopt.clone() else {
            return Ok(version);
        };
        for (jid, seen) in jobs {
            let status = layout::job_status(jid);
            let lock = format!("{}/lock", layout::job(jid));
            let Some((data, stat, seen, applied)) =
                self.read_with_lock(client, &status, &lock, seen).await?
            else {
                continue;
            };
            let reason = match (
                status_of::<JobState>(&applied),
                status_of::<JobState>(&data),
            ) {
                (Some((from, _)), Some((to, message))) if from != to => {
                    let change = ForeignStatus {
                        jid,
                        from,
                        to,
                        message,
                        actor: self.writer(seen, &stat),
                        written: WrittenStatus::of(&data, &stat),
                    };
                    let refused = lock_refusal(seen, true, &lock, &from, &to, "the job's");
                    match refused {
                        Some(why) => why,
                        None => {
                            let answer =
                                tokio::time::timeout(self.deadline(), adopter.0.adopt(change))
                                    .await;
                            match answered(answer, &from, &to) {
                                Ok(position) => {
                                    tracing::info!(root = %self.cfg.zk.root, %jid, %from, %to, position, "adopted a foreign status change");
                                    self.adopted.insert(jid, position);
                                    continue;
                                }
                                Err(why) => why.to_string(),
                            }
                        }
                    }
                }
                _ => "adoption: not a status change the engine can adopt".to_string(),
            };
            if self
                .repair_item(client, version, &Item::Job(jid), None, &reason)
                .await?
            {
                version += 1;
            }
        }
        Ok(version)
    }
}

impl Runner {
    /// An item's status node and its lock node, read together: the
    /// status's data and stat, the lock as the write saw it (`seen`, else
    /// as read now), and the status the applied checkpoint has (empty when
    /// none). `None`: the status node is gone, or is what the log says.
    pub(super) async fn read_with_lock(
        &self,
        client: &zk::Client,
        status: &str,
        lock: &str,
        seen: Option<LockSeen>,
    ) -> Result<Option<(Vec<u8>, zk::Stat, LockSeen, Vec<u8>)>, Exit> {
        let mut reader = client.new_multi_reader();
        for p in [status, lock] {
            reader
                .add_get_data(p)
                .map_err(|e| ZkError::new("multi-read", p, ZkErrorKind::Server(e)))?;
        }
        let mut read = call(self.deadline(), "multi-read", status, reader.commit())
            .await?
            .into_iter();
        let Some(zk::MultiReadResult::Data { data, stat }) = read.next() else {
            return Ok(None);
        };
        let seen = seen.unwrap_or_else(|| match read.next() {
            Some(zk::MultiReadResult::Data { data, stat }) => {
                LockSeen::Held(Some(Holder::of(&data, &stat)))
            }
            _ => LockSeen::Free,
        });
        let applied = self.model.applied_data(status);
        if applied.as_deref() == Some(data.as_slice()) {
            return Ok(None);
        }
        Ok(Some((data, stat, seen, applied.unwrap_or_default())))
    }

    /// Who wrote a status node, as far as ZooKeeper tells: the session
    /// holding the item's lock, else the zxid of the write
    /// ([`Runner::foreign_actor`]).
    pub(super) fn writer(&self, seen: LockSeen, stat: &zk::Stat) -> String {
        match seen {
            LockSeen::Held(Some(h)) => self.foreign_actor(&format!("zk-session-0x{:x}", h.session)),
            _ => self.foreign_actor(&format!("zk-zxid-0x{:x}", stat.mzxid)),
        }
    }
}

/// Why a status write is refused before the engine is asked, if it is:
/// written while nobody held `lock` (when the move is made under it,
/// `needs_lock`), or under an `ingest worker`'s lock (that worker reports
/// through the API). `whose` names the item for the message.
pub(super) fn lock_refusal(
    seen: LockSeen,
    needs_lock: bool,
    lock: &str,
    from: &dyn std::fmt::Display,
    to: &dyn std::fmt::Display,
    whose: &str,
) -> Option<String> {
    match seen {
        LockSeen::Free if needs_lock => Some(format!(
            "adoption refused {from} -> {to}: written while no session held {lock} (a status change is made under {whose} lock)"
        )),
        LockSeen::Held(Some(h)) if h.ingest_worker => Some(format!(
            "adoption refused {from} -> {to}: {lock} is held by the ingest worker of session 0x{:x}, which reports through the API; the write is another client's",
            h.session
        )),
        _ => None,
    }
}

/// Why an offered status move was not adopted; its text is the reason
/// recorded with the revert.
#[derive(Debug, thiserror::Error)]
pub(super) enum NotAdopted {
    /// The engine refused the move (its reason, cut).
    #[error("adoption refused {from} -> {to}: {why}")]
    Refused {
        /// The state the log has.
        from: String,
        /// The state written.
        to: String,
        /// The engine's reason.
        why: String,
    },
    /// The engine did not answer in time.
    #[error("adoption of {from} -> {to}: the engine did not answer")]
    NoAnswer {
        /// The state the log has.
        from: String,
        /// The state written.
        to: String,
    },
}

/// The engine's answer to an offered status move: the position of its
/// event, or why it was not adopted.
pub(super) fn answered(
    answer: Result<Adoption, tokio::time::error::Elapsed>,
    from: &dyn std::fmt::Display,
    to: &dyn std::fmt::Display,
) -> Result<u64, NotAdopted> {
    let (from, to) = (from.to_string(), to.to_string());
    match answer {
        Ok(Adoption::Accepted(position)) => Ok(position),
        Ok(Adoption::Refused(why)) => Err(NotAdopted::Refused {
            from,
            to,
            why: ingest_protocol::cut(&why, 300).into_owned(),
        }),
        Err(_) => Err(NotAdopted::NoAnswer { from, to }),
    }
}

/// The state and `message` of a status node (mrt-zk's JSON), the message
/// printable and cut to 512 bytes.
pub(super) fn status_of<S: StateKind>(data: &[u8]) -> Option<(S, String)> {
    let v = serde_json::from_slice::<serde_json::Value>(data).ok()?;
    let status = v["status"].as_str().and_then(S::from_name)?;
    let message = found_text(v["message"].as_str().unwrap_or("").as_bytes());
    Some((status, ingest_protocol::cut(&message, 512).into_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A round is due once the tree is quiet, and under a steady stream of
    /// writes (never quiet) at most `MAX_WAIT` after its first event.
    #[test]
    fn a_round_is_due_when_quiet_or_after_the_longest_wait() {
        let changed = zk::EventType::NodeDataChanged;
        let mut tree = TreeWatch::none();
        let mut now = tokio::time::Instant::now();
        assert!(tree.take_due_at(now).is_none());
        tree.keep(changed, "/jobs/jid0000000001/status".into(), now);
        now += QUIET / 2;
        assert!(tree.take_due_at(now).is_none());
        now += QUIET;
        assert_eq!(tree.take_due_at(now).map(|e| e.len()), Some(1));

        // A write every half QUIET: never quiet.
        let start = now;
        let mut taken = None;
        for _ in 0..100 {
            tree.keep(changed, "/jobs/jid0000000002/status".into(), now);
            now += QUIET / 2;
            taken = tree.take_due_at(now);
            if taken.is_some() {
                break;
            }
        }
        assert!(now - start <= MAX_WAIT + QUIET / 2);
        assert!(taken.is_some_and(|e| e.len() > 2));
    }

    #[test]
    fn lock_paths_name_their_job_and_lock_changes_their_meaning() {
        assert_eq!(job_of_lock("/jobs/jid0000000003/lock"), Some(Jid(3)));
        assert_eq!(job_of_lock("/jobs/jid0000000003/status"), None);
        assert_eq!(job_of_lock("/batches/bid0000000003/lock"), None);
        assert_eq!(
            LockChange::of("/locks/queue/ingest", true),
            Some(LockChange::Queue(true))
        );
        assert_eq!(
            LockChange::of("/locks/collections/demo", false),
            Some(LockChange::Collection("demo".into(), false))
        );
        assert_eq!(LockChange::of("/locks/collections/a/b", true), None);
        assert_eq!(LockChange::of("/locks/collections/", true), None);
        assert_eq!(LockChange::of("/locks/storage/x", true), None);
    }
}
