//! The consumer daemons: each task lists its queue in ZooKeeper, locks one
//! item with an ephemeral node of this worker's session, re-checks it, does
//! the work, reports through the API and releases the lock.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ingest_events::JobState;
use tokio_util::sync::CancellationToken;
use zookeeper_client as zk;

use super::retry::RetryPolicy;
use super::session::Session;
use super::step::{JobCtx, Rng, StepResult, Steps};
use ingest_client::{Client as EngineClient, Reply};
use ingest_config::DaemonKind;
use ingest_protocol::api::{
    AcquireBody, Acquired, JobMoved, OutcomeBody, OutcomeKind, ReportBody, Reported, SessionId,
    WorkerRef,
};
use ingest_protocol::node::decode;

/// The first wait when a queue has nothing to take.
const BACKOFF_MIN: Duration = Duration::from_millis(25);
/// The longest wait between two looks at a queue that stays idle.
const BACKOFF_MAX: Duration = Duration::from_millis(1000);
/// How many of the queue's head items a task picks among at random.
const SPREAD: usize = 8;
/// How long a worker keeps its lock after a report, waiting for the
/// projection to show the item's new state (so that no other worker takes
/// the item again from a projection that lags).
const PROJECTION_WAIT: Duration = Duration::from_secs(5);

/// Counts of a worker's reports.
#[derive(Debug, Default)]
pub struct Stats {
    /// Reports the API accepted.
    pub accepted: AtomicU64,
    /// Reports the API refused with 409 (their results were discarded).
    pub refused: AtomicU64,
}

/// What one task shares with the others of its worker.
pub struct Shared {
    /// Counts of reports.
    pub stats: Arc<Stats>,
    /// The worker's name, as reported.
    pub name: String,
    /// The ZooKeeper session.
    pub session: Arc<Session>,
    /// The API.
    pub engine: EngineClient,
    /// The steps.
    pub steps: Steps,
    /// Randomness for spread and jitter.
    pub rng: Rng,
    /// Batches known to be acquired (their `states` node exists). A batch
    /// never returns to Pending once acquired, so the batch-pending daemons
    /// skip these without reading ZooKeeper again: without it every look
    /// re-read every batch ever submitted (until cleanup), and a burst of N
    /// batches cost on the order of N² reads.
    pub acquired: std::sync::Mutex<std::collections::HashSet<String>>,
    /// Why each waiting job waits, so the reason is logged at INFO once
    /// when it changes rather than on every look (and not only at DEBUG,
    /// where an operator would never see why jobs do not move).
    pub waiting: std::sync::Mutex<std::collections::HashMap<String, String>>,
}

/// The most waiting jobs whose reasons are remembered; past it the memory
/// starts over (a reason may then be logged again).
const MAX_WAITING_REMEMBERED: usize = 10_000;

impl Shared {
    /// Logs at INFO that `jid` waits in `state`, when the reason is new;
    /// says whether it did.
    fn note_waiting(&self, jid: &str, state: JobState, why: &str) -> bool {
        let mut waiting = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        if waiting.get(jid).map(String::as_str) == Some(why) {
            tracing::debug!(%jid, %state, %why, "the job still waits");
            return false;
        }
        if waiting.len() >= MAX_WAITING_REMEMBERED {
            waiting.clear();
        }
        tracing::info!(%jid, %state, %why, "the job waits");
        waiting.insert(jid.to_string(), why.to_string());
        true
    }

    /// Forgets that `jid` waited (it moved on).
    fn done_waiting(&self, jid: &str) {
        self.waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(jid);
    }
}

/// What the daemon works on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    /// `/batches/BID` without `states`: acquire.
    PendingBatches,
    /// Batches whose status is this: report.
    ReportingBatches(&'static str),
    /// `/jobs/states/<state>`.
    Jobs(JobState),
}

impl Target {
    fn of(kind: DaemonKind) -> Target {
        match kind {
            DaemonKind::BatchPending => Target::PendingBatches,
            DaemonKind::BatchReporting => Target::ReportingBatches("Reporting"),
            DaemonKind::BatchUpdateReporting => Target::ReportingBatches("UpdateReporting"),
            DaemonKind::JobPending => Target::Jobs(JobState::Pending),
            DaemonKind::Estimating => Target::Jobs(JobState::Estimating),
            DaemonKind::Provisioning => Target::Jobs(JobState::Provisioning),
            DaemonKind::Downloading => Target::Jobs(JobState::Downloading),
            DaemonKind::Processing => Target::Jobs(JobState::Processing),
            DaemonKind::Storing => Target::Jobs(JobState::Storing),
            DaemonKind::Recording => Target::Jobs(JobState::Recording),
            DaemonKind::Notify => Target::Jobs(JobState::Notify),
        }
    }
}

/// An item a daemon may take.
#[derive(Debug, Clone)]
struct Item {
    /// `bid…` or `jid…`.
    id: String,
    priority: u8,
}

/// What came of trying one item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tried {
    /// Someone else holds it, or it moved on.
    Skipped,
    /// A step asked to wait (provisioning).
    Waited,
    /// Reported and accepted.
    Done,
    /// Reported and refused (409): the result was discarded.
    Refused,
}

type BoxError = anyhow::Error;

/// Runs one task of `kind` until `stop` is cancelled.
pub async fn run_task(shared: Arc<Shared>, kind: DaemonKind, task: u32, stop: CancellationToken) {
    let target = Target::of(kind);
    let mut idle = 0u32;
    tracing::debug!(daemon = %kind, task, "daemon task started");
    while !stop.is_cancelled() {
        let (progress, watcher) = match cycle(&shared, target, &stop).await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(daemon = %kind, task, error = %format!("{e:#}"), "daemon cycle failed");
                (false, None)
            }
        };
        if progress {
            idle = 0;
            continue;
        }
        idle = idle.saturating_add(1);
        let wait = backoff(idle);
        let changed = async move {
            match watcher {
                Some(w) => {
                    w.changed().await;
                }
                None => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            () = changed => {}
            () = tokio::time::sleep(wait) => {}
            () = stop.cancelled() => {}
        }
    }
    tracing::debug!(daemon = %kind, task, "daemon task stopped");
}

/// The wait before the next look at a queue that stayed idle `idle`
/// times: from [`BACKOFF_MIN`] doubling to [`BACKOFF_MAX`], with jitter
/// (half to full), by the worker's one back-off calculator.
fn backoff(idle: u32) -> Duration {
    RetryPolicy {
        retries: 0,
        first_backoff: BACKOFF_MIN,
        max_backoff: BACKOFF_MAX,
    }
    .backoff(idle.saturating_add(1))
}

/// One look at the queue: tries its items (starting at a random one among
/// the head) until one is done. Gives whether something was reported and a
/// watcher of the queue, when there is one.
async fn cycle(
    shared: &Shared,
    target: Target,
    stop: &CancellationToken,
) -> Result<(bool, Option<zk::OneshotWatcher>), BoxError> {
    let client = shared.session.client().await?;
    let (items, watcher) = list(shared, &client, target).await?;
    if items.is_empty() {
        return Ok((false, watcher));
    }
    // FIFO for batches; spread the tasks over the head of job queues.
    let start = match target {
        Target::Jobs(_) => shared.rng.below(items.len().min(SPREAD)),
        _ => 0,
    };
    let mut progress = false;
    for item in items[start..].iter().chain(&items[..start]) {
        if stop.is_cancelled() || !connected(&client) {
            // Disconnected: no new side effects until the session is back.
            break;
        }
        match try_item(shared, &client, target, item).await? {
            Tried::Done => {
                progress = true;
                break;
            }
            // Refused (paused queue, lost lock): back off rather than retry
            // the whole queue at once.
            Tried::Refused => break,
            Tried::Skipped | Tried::Waited => {}
        }
    }
    Ok((progress, watcher))
}

/// Whether the session can do work now (not disconnected, not ended).
fn connected(client: &zk::Client) -> bool {
    matches!(
        client.state(),
        zk::SessionState::SyncConnected | zk::SessionState::ConnectedReadOnly
    )
}

async fn list(
    shared: &Shared,
    client: &zk::Client,
    target: Target,
) -> Result<(Vec<Item>, Option<zk::OneshotWatcher>), BoxError> {
    match target {
        Target::Jobs(state) => {
            if state == JobState::Pending {
                // A paused queue starts no job: watch the pause lock instead.
                let (paused, watcher) = client
                    .check_and_watch_stat(ingest_projections::layout::QUEUE_LOCK)
                    .await?;
                if paused.is_some() {
                    return Ok((Vec::new(), Some(watcher)));
                }
            }
            let path = ingest_projections::layout::queue(state);
            let (mut names, watcher) = match client.list_and_watch_children(&path).await {
                Ok(r) => r,
                Err(zk::Error::NoNode) => return Ok((Vec::new(), None)),
                Err(e) => return Err(e.into()),
            };
            names.sort();
            let items = names
                .iter()
                .filter_map(|n| {
                    let (p, jid) = n.split_once('-')?;
                    Some(Item {
                        id: jid.to_string(),
                        priority: p.parse().ok()?,
                    })
                })
                .collect();
            Ok((items, Some(watcher)))
        }
        Target::PendingBatches => {
            let (mut bids, watcher) = match client.list_and_watch_children("/batches").await {
                Ok(r) => r,
                Err(zk::Error::NoNode) => return Ok((Vec::new(), None)),
                Err(e) => return Err(e.into()),
            };
            bids.sort();
            let unknown: Vec<String> = {
                let mut acquired = shared
                    .acquired
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                // Forget batches cleanup removed, so the set stays bounded.
                let listed: std::collections::HashSet<&String> = bids.iter().collect();
                acquired.retain(|b| listed.contains(b));
                bids.into_iter().filter(|b| !acquired.contains(b)).collect()
            };
            // FIFO: the oldest pending batches, a few more than one task
            // takes so that tasks meeting each other's locks find another.
            let mut items = Vec::new();
            for bid in unknown {
                if client
                    .check_stat(&format!("/batches/{bid}/states"))
                    .await?
                    .is_some()
                {
                    shared
                        .acquired
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .insert(bid);
                    continue;
                }
                if client
                    .check_stat(&format!("/batches/{bid}/status"))
                    .await?
                    .is_some()
                {
                    items.push(Item {
                        id: bid,
                        priority: 0,
                    });
                    if items.len() >= SPREAD {
                        break;
                    }
                }
            }
            Ok((items, Some(watcher)))
        }
        Target::ReportingBatches(_) => {
            let (mut bids, watcher) = match client.list_and_watch_children("/batches").await {
                Ok(r) => r,
                Err(zk::Error::NoNode) => return Ok((Vec::new(), None)),
                Err(e) => return Err(e.into()),
            };
            bids.sort();
            let mut items = Vec::new();
            for bid in bids {
                if batch_matches(client, target, &bid).await? {
                    items.push(Item {
                        id: bid,
                        priority: 0,
                    });
                }
            }
            // Reporting batches change status without changing /batches.
            drop(watcher);
            Ok((items, None))
        }
    }
}

/// Whether batch `bid` is one `target` works on now.
async fn batch_matches(client: &zk::Client, target: Target, bid: &str) -> Result<bool, BoxError> {
    match target {
        Target::PendingBatches => Ok(client
            .check_stat(&format!("/batches/{bid}/states"))
            .await?
            .is_none()
            && client
                .check_stat(&format!("/batches/{bid}/status"))
                .await?
                .is_some()),
        Target::ReportingBatches(status) => {
            Ok(read_status(client, &format!("/batches/{bid}/status"))
                .await?
                .as_deref()
                == Some(status))
        }
        Target::Jobs(_) => Ok(false),
    }
}

/// The `status` key that job and batch status nodes share
/// ([`ingest_protocol::node::JobStatusNode`],
/// [`ingest_protocol::node::BatchStatusNode`]).
#[derive(serde::Deserialize)]
struct StatusOnly {
    #[serde(default)]
    status: String,
}

/// The `status` field of a status node, `None` when the node is gone.
async fn read_status(client: &zk::Client, path: &str) -> Result<Option<String>, BoxError> {
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

fn lock_path(target: Target, id: &str) -> String {
    match target {
        Target::Jobs(_) => format!("/jobs/{id}/lock"),
        _ => format!("/batches/{id}/lock"),
    }
}

async fn try_item(
    shared: &Shared,
    client: &zk::Client,
    target: Target,
    item: &Item,
) -> Result<Tried, BoxError> {
    let lock = lock_path(target, &item.id);
    let ephemeral = zk::CreateMode::Ephemeral.with_acls(zk::Acls::anyone_all());
    let created = match client
        .create(&lock, shared.name.as_bytes(), &ephemeral)
        .await
    {
        Ok((stat, _)) => stat,
        Err(zk::Error::NodeExists | zk::Error::NoNode) => return Ok(Tried::Skipped),
        Err(e) => return Err(e.into()),
    };
    let result = locked(shared, client, target, item).await;
    release(client, &lock, &created).await;
    result
}

/// Works on an item whose lock this session holds.
async fn locked(
    shared: &Shared,
    client: &zk::Client,
    target: Target,
    item: &Item,
) -> Result<Tried, BoxError> {
    let session_id = client.session_id().0;
    let who = WorkerRef {
        worker: shared.name.clone(),
        session_id: SessionId(session_id),
    };
    let batch_ctx = || super::step::BatchCtx {
        bid: item.id.clone(),
        zk: client.clone(),
        api: super::step::ApiCtx {
            engine: shared.engine.clone(),
            worker: shared.name.clone(),
            session_id,
        },
    };
    match target {
        Target::PendingBatches => {
            if !batch_matches(client, target, &item.id).await? {
                return Ok(Tried::Skipped);
            }
            let mut body = AcquireBody {
                worker: who.worker,
                session_id: who.session_id,
                jobs: None,
                expansion_error: None,
            };
            if let Some(work) = &shared.steps.batch {
                let ctx = batch_ctx();
                let expansion = tokio::select! {
                    e = work.expand(&ctx) => e,
                    () = session_ended(client) => return Ok(Tried::Refused),
                };
                match expansion {
                    super::step::Expansion::Jobs(jobs) => body.jobs = Some(jobs),
                    super::step::Expansion::Failed(why) => body.expansion_error = Some(why),
                }
            }
            let path = format!("/batches/{}/acquire", item.id);
            let tried = report::<Acquired>(shared, &path, &body).await?;
            if tried == Tried::Done {
                let states = format!("/batches/{}/states", item.id);
                await_projection(client, &states, |stat| stat.is_some()).await;
            }
            Ok(tried)
        }
        Target::ReportingBatches(status) => {
            if !batch_matches(client, target, &item.id).await? {
                return Ok(Tried::Skipped);
            }
            let mut body = ReportBody {
                worker: who.worker,
                session_id: who.session_id,
                notification_error: None,
            };
            if let Some(work) = &shared.steps.batch {
                let ctx = batch_ctx();
                let sent = tokio::select! {
                    e = work.report(&ctx) => e,
                    () = session_ended(client) => return Ok(Tried::Refused),
                };
                body.notification_error = sent;
            }
            let path = format!("/batches/{}/report", item.id);
            let tried = report::<Reported>(shared, &path, &body).await?;
            if tried == Tried::Done {
                await_status(client, &format!("/batches/{}/status", item.id), status).await;
            }
            Ok(tried)
        }
        Target::Jobs(state) => {
            let status_path = format!("/jobs/{}/status", item.id);
            if read_status(client, &status_path).await?.as_deref() != Some(&state.to_string()) {
                return Ok(Tried::Skipped);
            }
            let tried = if state == JobState::Pending {
                report::<JobMoved>(shared, &format!("/jobs/{}/start", item.id), &who).await?
            } else {
                let Some(step) = shared.steps.get(state) else {
                    return Ok(Tried::Skipped);
                };
                let ctx = JobCtx {
                    jid: item.id.clone(),
                    state,
                    priority: item.priority,
                    zk: Some(client.clone()),
                    api: Some(super::step::ApiCtx {
                        engine: shared.engine.clone(),
                        worker: shared.name.clone(),
                        session_id,
                    }),
                };
                let began = Instant::now();
                // The step is dropped as soon as the session ends: its lock
                // is gone, so its result could only be refused.
                let result = tokio::select! {
                    r = step.run(&ctx) => r,
                    () = session_ended(client) => {
                        tracing::warn!(jid = %item.id, %state, "the session ended during the step; the step is dropped");
                        return Ok(Tried::Refused);
                    }
                };
                let outcome = match result {
                    StepResult::Report(o) => o,
                    StepResult::Wait(why) => {
                        let _logged = shared.note_waiting(&item.id, state, &why);
                        return Ok(Tried::Waited);
                    }
                };
                shared.done_waiting(&item.id);
                if client.state().is_terminated() {
                    tracing::warn!(jid = %item.id, %state, "the session ended during the step; the result is dropped");
                    return Ok(Tried::Refused);
                }
                let body = OutcomeBody {
                    worker: who.worker,
                    session_id: who.session_id,
                    state: state.to_string(),
                    outcome: if outcome.success {
                        OutcomeKind::Success
                    } else {
                        OutcomeKind::Failure
                    },
                    message: outcome.message,
                    priority: outcome.priority,
                    space_needed: outcome.space_needed,
                    identifiers: outcome.identifiers,
                    store: outcome.store,
                    inventory: outcome.inventory,
                    duration_ms: Some(
                        u64::try_from(began.elapsed().as_millis()).unwrap_or(u64::MAX),
                    ),
                };
                report::<JobMoved>(shared, &format!("/jobs/{}/outcome", item.id), &body).await?
            };
            if tried == Tried::Done {
                await_status(client, &status_path, &state.to_string()).await;
            }
            Ok(tried)
        }
    }
}

/// Resolves once `client`'s session has ended (expired, closed, refused).
async fn session_ended(client: &zk::Client) {
    let mut states = client.state_watcher();
    while !states.state().is_terminated() {
        states.changed().await;
    }
}

/// Deletes the lock node only while it is still the one this session made:
/// a lock removed under this worker may since be another worker's.
async fn release(client: &zk::Client, lock: &str, created: &zk::Stat) {
    match client.check_stat(lock).await {
        Ok(Some(now))
            if now.czxid == created.czxid && now.ephemeral_owner == client.session_id().0 =>
        {
            match client.delete(lock, Some(now.version)).await {
                Ok(()) | Err(zk::Error::NoNode) => {}
                Err(e) => tracing::debug!(%lock, error = %e, "cannot release the lock"),
            }
        }
        Ok(Some(_)) => tracing::debug!(%lock, "the lock is another worker's now; left alone"),
        Ok(None) => {}
        // The session is gone or unreachable: its ephemeral node goes with it.
        Err(e) => tracing::debug!(%lock, error = %e, "cannot check the lock"),
    }
}

/// POSTs a fenced report whose route answers `R` (`Acquired`, `Reported`
/// or `JobMoved`). The answer is decoded, so a server that answers another
/// shape is an error, but nothing in it is needed: the daemon learns the
/// item's new state from the projection.
async fn report<R: serde::de::DeserializeOwned>(
    shared: &Shared,
    path: &str,
    body: &impl serde::Serialize,
) -> Result<Tried, BoxError> {
    match shared.engine.report::<_, R>(path, body).await? {
        Reply::Done(_) => {
            shared.stats.accepted.fetch_add(1, Ordering::Relaxed);
            Ok(Tried::Done)
        }
        Reply::Refused { code, message } => {
            shared.stats.refused.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(%path, %code, %message, "the report was refused; its result is discarded");
            Ok(Tried::Refused)
        }
    }
}

/// Waits (bounded) until the status node at `path` no longer says `old`.
async fn await_status(client: &zk::Client, path: &str, old: &str) {
    let deadline = Instant::now() + PROJECTION_WAIT;
    while Instant::now() < deadline {
        let Ok((data, _, watcher)) = client.get_and_watch_data(path).await else {
            return;
        };
        let now = decode::<StatusOnly>("status", &data).map(|n| n.status);
        if now.as_deref().ok() != Some(old) {
            return;
        }
        let _ = tokio::time::timeout_at(deadline.into(), watcher.changed()).await;
    }
}

/// Waits (bounded) until `check` holds for the node at `path`.
async fn await_projection(
    client: &zk::Client,
    path: &str,
    check: impl Fn(Option<&zk::Stat>) -> bool,
) {
    let deadline = Instant::now() + PROJECTION_WAIT;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_to_its_cap_with_jitter() {
        for idle in 0..40 {
            let d = backoff(idle);
            let full = BACKOFF_MIN
                .saturating_mul(1u32 << idle.min(10))
                .min(BACKOFF_MAX);
            assert!(d <= full && d >= full / 2, "{idle}: {d:?} vs {full:?}");
        }
        assert!(backoff(30) >= BACKOFF_MAX / 2);
    }

    #[test]
    fn daemons_map_to_their_queues() {
        assert_eq!(Target::of(DaemonKind::BatchPending), Target::PendingBatches);
        assert_eq!(
            Target::of(DaemonKind::Downloading),
            Target::Jobs(JobState::Downloading)
        );
        assert_eq!(
            lock_path(Target::PendingBatches, "bid1"),
            "/batches/bid1/lock"
        );
        assert_eq!(
            lock_path(Target::Jobs(JobState::Notify), "jid1"),
            "/jobs/jid1/lock"
        );
    }

    fn shared(engine: &str) -> Shared {
        use crate::step::{FixedProbe, SimSettings};
        Shared {
            stats: Arc::new(Stats::default()),
            name: "w".into(),
            session: Arc::new(Session::new(ingest_projections::ZkConfig::new(
                "127.0.0.1:1".to_string(),
            ))),
            engine: EngineClient::new(engine, "token").expect("client"),
            steps: Steps::simulated(
                SimSettings::default(),
                Some(1),
                Arc::new(FixedProbe::new(0.0)),
                90.0,
                "/".into(),
            ),
            rng: Rng::new(1),
            acquired: Default::default(),
            waiting: Default::default(),
        }
    }

    /// Regression: why a job waited (a full working storage, an unreadable
    /// one) was logged only at DEBUG, so jobs waited silently; now at INFO,
    /// once per reason.
    #[tokio::test]
    async fn a_wait_is_logged_once_per_reason() {
        let shared = shared("http://127.0.0.1:1");
        let full = "working storage /w is 95.0% full (threshold 70%)";
        assert!(shared.note_waiting("jid1", JobState::Provisioning, full));
        assert!(!shared.note_waiting("jid1", JobState::Provisioning, full));
        assert!(shared.note_waiting("jid2", JobState::Provisioning, full));
        let gone = "cannot measure /w: No such file or directory";
        assert!(shared.note_waiting("jid1", JobState::Provisioning, gone));
        shared.done_waiting("jid1");
        assert!(shared.note_waiting("jid1", JobState::Provisioning, gone));
    }

    /// A report's answer is read as its route's type: an accepted report is
    /// counted, a 409 is a refusal, and a 2xx answer of another shape is an
    /// error rather than an acceptance.
    #[tokio::test]
    async fn reports_read_typed_answers() {
        use axum::http::StatusCode;
        use axum::routing::post;
        use ingest_protocol::api::{ErrorBody, ErrorDetail};
        let moved = JobMoved {
            jid: "jid1".into(),
            status: "Estimating".into(),
            batch_status: "Processing".into(),
            events: Vec::new(),
        };
        let app = axum::Router::new()
            .route(
                "/jobs/jid1/start",
                post(move |axum::Json(who): axum::Json<WorkerRef>| {
                    let moved = moved.clone();
                    async move {
                        assert_eq!(who.worker, "w");
                        assert_eq!(who.session_id, SessionId(7));
                        axum::Json(moved)
                    }
                }),
            )
            .route(
                "/jobs/jid2/start",
                post(|| async {
                    let refused = ErrorBody {
                        error: ErrorDetail {
                            code: "lock_not_held".into(),
                            message: "nobody holds it".into(),
                        },
                    };
                    (StatusCode::CONFLICT, axum::Json(refused))
                }),
            )
            .route(
                "/jobs/jid3/start",
                post(|| async {
                    axum::Json(ingest_protocol::api::FaultsView {
                        armed: Default::default(),
                    })
                }),
            );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        let shared = shared(&format!("http://{addr}"));
        let who = WorkerRef {
            worker: "w".into(),
            session_id: SessionId(7),
        };
        let tried = report::<JobMoved>(&shared, "/jobs/jid1/start", &who).await;
        assert_eq!(tried.ok(), Some(Tried::Done));
        let tried = report::<JobMoved>(&shared, "/jobs/jid2/start", &who).await;
        assert_eq!(tried.ok(), Some(Tried::Refused));
        let tried = report::<JobMoved>(&shared, "/jobs/jid3/start", &who).await;
        assert!(
            tried.is_err(),
            "an answer of another shape is not an acceptance"
        );
        assert_eq!(shared.stats.accepted.load(Ordering::Relaxed), 1);
        assert_eq!(shared.stats.refused.load(Ordering::Relaxed), 1);
    }
}
