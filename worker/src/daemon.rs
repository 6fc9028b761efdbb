//! The consumer daemons.
//!
//! **Dispatch.** For each queue a worker consumes, ONE lister task keeps
//! the queue's listing (a ZooKeeper child watch, re-listed at most every
//! [`RELIST_DEBOUNCE`] so that a burst of changes costs one listing) and
//! publishes it to the worker's tasks of that queue. A task picks an item
//! that no task of this worker holds or backs off from, takes the item's
//! ephemeral lock (its data: a [`LockNode`] with the digest of a fresh
//! [`FenceSecret`]), re-checks the item's status, does the work and reports
//! through the API with the secret. An item whose lock another worker
//! holds, or that asked to wait, is backed off from by itself
//! ([`ITEM_BACKOFF_MIN`] doubling to [`ITEM_BACKOFF_MAX`]); the task goes on
//! with the next item, so no single item stalls a queue.
//!
//! **Chaining.** After an accepted report the engine's answer gives the
//! job's new state. When this worker runs the daemon of that state, the
//! lock is kept and the job goes on with the next step at once: every step
//! is still its own reported, projected transition, but one lock carries a
//! job through every state this worker serves. The next step runs in a
//! task of the next state's daemon: the job is *handed off* through that
//! daemon's inbox (a bounded channel the daemon's tasks read before their
//! queue), and the task that ran the step goes back to its own queue. So
//! each daemon's `tasks` bound the jobs in *its* step, as they would
//! without chaining, and a worker's job_pending tasks no longer bound the
//! jobs in its whole pipeline. When the next daemon's inbox is full (its
//! tasks are all busy and one job already waits), the task runs the next
//! step itself rather than wait; a hand-off never blocks, so no cycle of
//! full inboxes can stall a worker. When the chain ends, the
//! lock is kept until the projection shows the job's new state (bounded),
//! so that no worker takes the item again from a projection that lags.
//!
//! **Batches.** Pending batches are taken oldest first, past any that
//! cannot be taken now (a held collection, a refusal); several
//! batch-pending tasks expand and acquire batches at once (`batch_pending=N`).
//! The lister reads a batch's nodes only until it has seen it pending or
//! acquired, so a burst of N batches does not cost N reads per listing. A
//! batch found Held (its collection is on hold) is no candidate while it
//! stays Held: the lister watches its status node, and the batch is a
//! candidate again as soon as the status changes (a release), so what the
//! worker does with a batch follows the queue. Batches to report
//! come from the engine's answers (a report that finished a batch's last
//! job names the batch) and from a slow sweep of `/batches` for batches
//! that entered Reporting any other way.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures_util::{StreamExt as _, TryStreamExt as _};
use ingest_events::JobState;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use zookeeper_client as zk;

use super::retry::RetryPolicy;
use super::session::Session;
use super::step::{ApiCtx, JobCtx, Rng, StepResult, Steps};
use ingest_client::{Client as EngineClient, Reply};
use ingest_config::DaemonKind;
use ingest_protocol::api::{
    AcquireBody, Acquired, JobMoved, OutcomeBody, OutcomeKind, ReportBody, Reported, SessionId,
    WorkerRef,
};
use ingest_protocol::fence::{FenceSecret, LockNode};
use ingest_protocol::node::decode;

/// The shortest wait between two listings of one queue: changes that come
/// closer together are seen in one listing.
pub const RELIST_DEBOUNCE: Duration = Duration::from_millis(20);
/// The same for the queues of the states after Pending: their jobs are
/// mostly carried through by chains (see [`CHAIN_GRACE`]), so they are
/// listed less often.
pub const CHAINED_RELIST_DEBOUNCE: Duration = Duration::from_millis(100);
/// How long a job must have been in the queue of a state after Pending
/// before this worker tries to lock it. A job that just entered such a
/// queue is almost always in a chain of the worker that holds its lock and
/// leaves the queue within a step; trying it at once cost every other
/// worker a lock create that fails (with 4 workers, 6.8 of the 32
/// ZooKeeper requests per job). A job left there (a worker that does not
/// serve the state, a crash, a wait) is taken this much later.
pub const CHAIN_GRACE: Duration = Duration::from_millis(250);
/// A queue is listed again after this long even when its watch did not
/// fire (a safety net; watches are the way changes are seen).
const RELIST_EVERY: Duration = Duration::from_secs(5);
/// How often the reporting daemons sweep `/batches` for batches that
/// entered Reporting without a report of this worker naming them.
const REPORTING_SWEEP: Duration = Duration::from_secs(10);
/// The first wait before an item that could not be taken is tried again.
pub const ITEM_BACKOFF_MIN: Duration = Duration::from_millis(250);
/// How long a job whose chain just ended here is no candidate for this
/// worker's tasks (see `Shared::linger`): longer than a listing takes to
/// follow the projection.
pub const LISTING_GRACE: Duration = Duration::from_millis(500);
/// The longest wait before an item that could not be taken is tried again.
pub const ITEM_BACKOFF_MAX: Duration = Duration::from_secs(10);
/// How many of the eligible head items (of the first one's priority) a job
/// task picks among at random, so that the workers do not all race for
/// the first. With 4 workers of 4 job_pending tasks, 16 tasks racing over
/// 8 items made 2.7 lock creates per job fail; over 32 they rarely meet.
const SPREAD: usize = 32;
/// How long a worker keeps its lock after the last report of a chain,
/// waiting for the projection to show the item's new state.
const PROJECTION_WAIT: Duration = Duration::from_secs(5);
/// The most items a worker remembers claims of; past it the backed-off
/// ones are forgotten (they may then be tried sooner).
const MAX_CLAIMS: usize = 100_000;
/// The most batches waiting to be reported that a worker remembers.
const MAX_TO_REPORT: usize = 10_000;

/// Counts of a worker's work.
#[derive(Debug, Default)]
pub struct Stats {
    /// Reports the API accepted.
    pub accepted: AtomicU64,
    /// Reports the API refused with 409 (their results were discarded).
    pub refused: AtomicU64,
    /// Job locks this worker took.
    pub job_locks: AtomicU64,
    /// Job lock creations that found the lock taken.
    pub lock_busy: AtomicU64,
    /// Steps run while holding a lock taken for an earlier step.
    pub chained: AtomicU64,
    /// Chained steps handed to a task of the next step's daemon (the rest
    /// of the chained steps ran in the task of the step before).
    pub handoffs: AtomicU64,
    /// Queue listings.
    pub listings: AtomicU64,
    /// Job steps running now.
    pub in_flight: std::sync::atomic::AtomicI64,
    /// The most job steps that ran at once.
    pub peak_in_flight: std::sync::atomic::AtomicI64,
    /// Jobs a step asked to wait, as last noted.
    pub waiting: std::sync::atomic::AtomicI64,
    /// Batches taken for reporting because an engine answer named them
    /// (rather than found by the slow sweep).
    pub named_reports: AtomicU64,
}

/// An item a task of this worker has in hand or backs off from.
#[derive(Debug, Clone, Copy)]
enum Claim {
    /// A task works on it (`tries` before this one).
    InHand { tries: u32 },
    /// Not before `until`; `tries` so far.
    Backoff { until: Instant, tries: u32 },
}

/// What one task shares with the others of its worker.
pub struct Shared {
    /// Counts.
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
    /// The job states whose daemon this worker runs (a chain goes on
    /// through these).
    pub runs: HashSet<JobState>,
    /// The batch statuses whose reporting daemon this worker runs
    /// (`Reporting`, `UpdateReporting`).
    pub reports: HashSet<&'static str>,
    /// Batches known to be acquired (their `states` node exists). A batch
    /// never returns to Pending once acquired, so the batch-pending lister
    /// skips these without reading ZooKeeper again. Only the `states` node
    /// puts a batch here: an acquisition that parked the batch Held does
    /// not (a Held batch goes back to Pending when released).
    acquired: Mutex<HashSet<String>>,
    /// Batches a task found Held. They are no candidates until the lister,
    /// which watches each one's status node, sees the status change and
    /// takes them out again.
    held: Mutex<HashSet<String>>,
    /// Wakes the batch-pending lister when `held` grew, so it starts
    /// watching the new ones.
    held_grew: tokio::sync::Notify,
    /// Batches a listing saw pending (a status, no `states`) and not yet
    /// acquired: later listings keep them without reading ZooKeeper again
    /// (a task re-checks a batch before acquiring it).
    pending: Mutex<HashSet<String>>,
    /// Why each waiting job waits, so the reason is logged at INFO once
    /// when it changes rather than on every look.
    waiting: Mutex<HashMap<String, String>>,
    /// Items in hand or backed off from, by id, over every daemon.
    claims: Mutex<HashMap<String, Claim>>,
    /// Batches an answer said entered a reporting status, with it, for the
    /// reporting daemons.
    to_report: Mutex<VecDeque<(String, String)>>,
    /// Wakes the reporting tasks when `to_report` grows.
    report_wake: tokio::sync::Notify,
    /// Each served job state's inbox of chained jobs (see [`Chain`]).
    inboxes: HashMap<JobState, Inbox>,
}

/// The jobs handed to one state's daemon, lock held, by tasks that ran
/// the step before.
struct Inbox {
    tx: async_channel::Sender<Box<Chain>>,
    rx: async_channel::Receiver<Box<Chain>>,
}

/// A job whose lock this worker's session holds, between two of its
/// steps.
struct Chain {
    item: Item,
    /// The client of the session that holds the lock.
    client: zk::Client,
    held: Held,
    /// The state whose step runs next.
    state: JobState,
    /// The state the last accepted step moved the job out of (the first
    /// state before any): the projection shows the job past it once it
    /// caught up.
    left: JobState,
    /// Steps accepted under this lock so far.
    steps: u32,
    /// What a step reported of the job's size, for the next.
    space_needed: Option<u64>,
}

/// The most waiting jobs whose reasons are remembered; past it the memory
/// starts over (a reason may then be logged again).
const MAX_WAITING_REMEMBERED: usize = 10_000;

impl Shared {
    /// The shared state of a worker's tasks; `daemons` are the daemons it
    /// runs, each with its number of tasks.
    pub fn new(
        name: String,
        session: Arc<Session>,
        engine: EngineClient,
        steps: Steps,
        daemons: &[(DaemonKind, u32)],
        rng: Rng,
    ) -> Shared {
        let mut inboxes = HashMap::new();
        for (kind, tasks) in daemons {
            if let Some(Target::Jobs(state)) = Target::of(*kind) {
                // As many waiting jobs as the daemon has tasks: enough to
                // keep them busy, few enough that a worker does not hold
                // locks on jobs it cannot start soon.
                let (tx, rx) = async_channel::bounded((*tasks).max(1) as usize);
                inboxes.insert(state, Inbox { tx, rx });
            }
        }
        let runs = inboxes.keys().copied().collect();
        Shared {
            stats: Arc::new(Stats::default()),
            name,
            session,
            engine,
            steps,
            rng,
            runs,
            reports: daemons
                .iter()
                .filter_map(|(k, _)| match Target::of(*k) {
                    Some(Target::ReportingBatches(status)) => Some(status),
                    _ => None,
                })
                .collect(),
            acquired: Mutex::default(),
            held: Mutex::default(),
            held_grew: tokio::sync::Notify::new(),
            pending: Mutex::default(),
            waiting: Mutex::default(),
            claims: Mutex::default(),
            to_report: Mutex::default(),
            report_wake: tokio::sync::Notify::new(),
            inboxes,
        }
    }

    /// Hands `chain` to a task of its state's daemon; gives it back when
    /// that daemon's inbox is full (or this worker does not run it).
    fn hand_off(&self, chain: Box<Chain>) -> Result<(), Box<Chain>> {
        let Some(inbox) = self.inboxes.get(&chain.state) else {
            return Err(chain);
        };
        match inbox.tx.try_send(chain) {
            Ok(()) => {
                self.stats.handoffs.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Err(async_channel::TrySendError::Full(c) | async_channel::TrySendError::Closed(c)) => {
                Err(c)
            }
        }
    }

    /// Logs at INFO that `jid` waits in `state`, when the reason is new;
    /// says whether it did.
    fn note_waiting(&self, jid: &str, state: JobState, why: &str) -> bool {
        let mut waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        if waiting.get(jid).map(String::as_str) == Some(why) {
            tracing::debug!(%jid, %state, %why, "the job still waits");
            return false;
        }
        if waiting.len() >= MAX_WAITING_REMEMBERED {
            waiting.clear();
        }
        tracing::info!(%jid, %state, %why, "the job waits");
        waiting.insert(jid.to_string(), why.to_string());
        self.stats.waiting.store(
            i64::try_from(waiting.len()).unwrap_or(i64::MAX),
            Ordering::Relaxed,
        );
        true
    }

    /// Marks batch `bid` Held: no candidate until the batch-pending lister
    /// sees its status change.
    fn note_held(&self, bid: &str) {
        self.forget_pending(bid);
        let new = self
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(bid.to_string());
        if new {
            self.held_grew.notify_one();
        }
    }

    /// Marks batch `bid` acquired (or gone): never a candidate again.
    fn note_acquired(&self, bid: &str) {
        self.forget_pending(bid);
        self.acquired
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(bid.to_string());
    }

    /// Forgets that batch `bid` was seen pending.
    fn forget_pending(&self, bid: &str) {
        self.pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(bid);
    }

    /// Forgets that `jid` waited (it moved on).
    fn done_waiting(&self, jid: &str) {
        let mut waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        if waiting.remove(jid).is_some() {
            self.stats.waiting.store(
                i64::try_from(waiting.len()).unwrap_or(i64::MAX),
                Ordering::Relaxed,
            );
        }
    }

    /// Picks an item of `items` no task of this worker holds or backs off
    /// from, and marks it in hand; else the earliest time one may be
    /// tried.
    fn pick(&self, target: Target, items: &[Item]) -> Result<Item, Option<Instant>> {
        let now = Instant::now();
        let mut claims = self.claims.lock().unwrap_or_else(PoisonError::into_inner);
        let mut eligible = Vec::new();
        let mut next: Option<Instant> = None;
        let wanted = match target {
            Target::Jobs(_) => SPREAD,
            _ => 1,
        };
        let (acquired, held) = match target {
            // A batch a task of this worker acquired (or found Held) stays
            // in the listing until the next one: no candidate now.
            Target::PendingBatches => (
                Some(self.acquired.lock().unwrap_or_else(PoisonError::into_inner)),
                Some(self.held.lock().unwrap_or_else(PoisonError::into_inner)),
            ),
            _ => (None, None),
        };
        let grace = match target {
            Target::Jobs(state) if state != JobState::Pending => Some(CHAIN_GRACE),
            _ => None,
        };
        for item in items {
            if acquired.as_ref().is_some_and(|a| a.contains(&item.id))
                || held.as_ref().is_some_and(|h| h.contains(&item.id))
            {
                continue;
            }
            if let (Some(grace), Some(since)) = (grace, item.since) {
                let from = since + grace;
                if from > now {
                    next = Some(next.map_or(from, |n| n.min(from)));
                    continue;
                }
            }
            match claims.get(&claim_key(target, &item.id)) {
                None => {}
                Some(Claim::InHand { .. }) => continue,
                Some(Claim::Backoff { until, .. }) if *until > now => {
                    next = Some(next.map_or(*until, |n| n.min(*until)));
                    continue;
                }
                Some(Claim::Backoff { .. }) => {}
            }
            // A job of a lower priority waits for those of a higher.
            if eligible
                .first()
                .is_some_and(|f: &&Item| f.priority != item.priority)
            {
                break;
            }
            eligible.push(item);
            if eligible.len() >= wanted {
                break;
            }
        }
        if eligible.is_empty() {
            return Err(next);
        }
        let item = eligible[self.rng.below(eligible.len())].clone();
        if claims.len() >= MAX_CLAIMS {
            claims.retain(|_, c| matches!(c, Claim::InHand { .. }));
        }
        let key = claim_key(target, &item.id);
        let tries = match claims.get(&key) {
            Some(Claim::Backoff { tries, .. }) => *tries,
            _ => 0,
        };
        claims.insert(key, Claim::InHand { tries });
        Ok(item)
    }

    /// Settles the claim on `id` after a try: forgotten once the item was
    /// dealt with, else backed off from.
    fn settle(&self, target: Target, id: &str, tried: Tried) {
        let id = claim_key(target, id);
        let mut claims = self.claims.lock().unwrap_or_else(PoisonError::into_inner);
        match tried {
            Tried::Done => {
                claims.remove(&id);
            }
            Tried::Skipped | Tried::Waited | Tried::Refused | Tried::Failed => {
                let tries = match claims.get(&id) {
                    Some(Claim::Backoff { tries, .. } | Claim::InHand { tries }) => *tries,
                    None => 0,
                }
                .saturating_add(1);
                let wait = RetryPolicy {
                    retries: 0,
                    first_backoff: ITEM_BACKOFF_MIN,
                    max_backoff: ITEM_BACKOFF_MAX,
                }
                .backoff(tries);
                claims.insert(
                    id,
                    Claim::Backoff {
                        until: Instant::now() + wait,
                        tries,
                    },
                );
            }
        }
    }

    /// After a job's chain ended here, its queue entries may still be in
    /// listings published a moment ago (each intermediate state's queue
    /// held it briefly): the job is no candidate for [`LISTING_GRACE`], so
    /// no task locks it again only to find it moved on (a lock create, a
    /// status read and a release for nothing).
    fn linger(&self, target: Target, id: &str) {
        let mut claims = self.claims.lock().unwrap_or_else(PoisonError::into_inner);
        if claims.len() >= MAX_CLAIMS {
            claims.retain(|_, c| matches!(c, Claim::InHand { .. }));
        }
        claims.insert(
            claim_key(target, id),
            Claim::Backoff {
                until: Instant::now() + LISTING_GRACE,
                tries: 0,
            },
        );
    }

    /// Notes that batch `bid` waits in `status` (from an engine answer).
    fn note_reporting(&self, bid: &str, status: &str) {
        if !self.reports.contains(status) || bid.is_empty() {
            return;
        }
        let mut queue = self
            .to_report
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if queue.len() < MAX_TO_REPORT && !queue.iter().any(|(b, _)| b == bid) {
            queue.push_back((bid.to_string(), status.to_string()));
        }
        drop(queue);
        self.report_wake.notify_waiters();
    }
}

/// The key of an item's claim. A job is one item whatever queue it is
/// seen in; a batch is a different item to the pending daemon and to the
/// reporting daemon: before, a worker whose batch-pending task had lost the
/// race for a batch's lock backed off from that batch id, and the same
/// worker's reporting task, named the batch at its end, waited out that
/// back-off (reporting p99 of 0.6 to 0.9 s with 4 workers, once 9.2 s).
fn claim_key(target: Target, id: &str) -> String {
    match target {
        Target::Jobs(_) => id.to_string(),
        Target::PendingBatches => format!("pending {id}"),
        Target::ReportingBatches(_) => format!("reporting {id}"),
    }
}

/// What the daemon works on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Target {
    /// `/batches/BID` without `states`: acquire.
    PendingBatches,
    /// Batches whose status is this: report.
    ReportingBatches(&'static str),
    /// `/jobs/states/<state>`.
    Jobs(JobState),
}

impl Target {
    /// The target of a daemon; `None` for the access daemons, which run
    /// their own loop (`crate::access`).
    pub fn of(kind: DaemonKind) -> Option<Target> {
        Some(match kind {
            DaemonKind::AccessSmall | DaemonKind::AccessLarge => return None,
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
        })
    }
}

/// An item a daemon may take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Item {
    /// `bid…` or `jid…`.
    id: String,
    priority: u8,
    /// When this worker's lister first saw the job in its queue (job
    /// queues only).
    since: Option<Instant>,
}

/// A queue's listing, as its lister last published it.
pub type Listing = watch::Receiver<Arc<Vec<Item>>>;

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
    /// The try failed (ZooKeeper or the API unreachable).
    Failed,
}

type BoxError = anyhow::Error;

/// Starts the lister of `target`; its tasks read the listing it publishes.
pub fn start_lister(
    shared: Arc<Shared>,
    target: Target,
    stop: CancellationToken,
) -> (Listing, tokio::task::JoinHandle<()>) {
    let (tx, rx) = watch::channel(Arc::new(Vec::new()));
    let task = tokio::spawn(run_lister(shared, target, tx, stop));
    (rx, task)
}

async fn run_lister(
    shared: Arc<Shared>,
    target: Target,
    tx: watch::Sender<Arc<Vec<Item>>>,
    stop: CancellationToken,
) {
    let mut failures = 0u32;
    // When each job in the queue was first seen (job queues).
    let mut seen: HashMap<String, Instant> = HashMap::new();
    // The watches on the status nodes of batches found Held (the
    // batch-pending lister), and the session they were set in.
    let mut held = HeldWatches::default();
    while !stop.is_cancelled() {
        let listed = async {
            let client = shared.session.client().await?;
            if target == Target::PendingBatches {
                held.watch(&shared, &client).await?;
            }
            list(&shared, &client, target).await
        }
        .await;
        let listed = listed.map(|(mut items, watcher)| {
            if let Target::Jobs(_) = target {
                let now = Instant::now();
                let mut next = HashMap::with_capacity(items.len());
                for item in &mut items {
                    let since = seen.get(&item.id).copied().unwrap_or(now);
                    item.since = Some(since);
                    next.insert(item.id.clone(), since);
                }
                seen = next;
            }
            (items, watcher)
        });
        shared.stats.listings.fetch_add(1, Ordering::Relaxed);
        // With how many items the listing came back.
        let (watcher, backlog) = match listed {
            Ok((items, watcher)) => {
                failures = 0;
                let backlog = items.len();
                tx.send_if_modified(|old| {
                    let changed = old.as_slice() != items.as_slice();
                    if changed {
                        *old = Arc::new(items);
                    }
                    changed
                });
                (watcher, backlog)
            }
            Err(e) => {
                failures = failures.saturating_add(1);
                if failures == 1 || failures.is_power_of_two() {
                    tracing::warn!(?target, failures, error = %ingest_protocol::bounded(format_args!("{e:#}")), "cannot list the queue");
                }
                let wait = RetryPolicy {
                    retries: 0,
                    first_backoff: Duration::from_millis(100),
                    max_backoff: Duration::from_secs(5),
                }
                .backoff(failures);
                tokio::select! {
                    () = tokio::time::sleep(wait) => {}
                    () = stop.cancelled() => {}
                }
                continue;
            }
        };
        let every = match target {
            Target::ReportingBatches(_) => REPORTING_SWEEP,
            _ => RELIST_EVERY,
        };
        let changed = async move {
            match watcher {
                Some(w) => {
                    w.changed().await;
                }
                None => std::future::pending::<()>().await,
            }
        };
        let batches = target == Target::PendingBatches;
        tokio::select! {
            () = changed => {}
            () = tokio::time::sleep(every) => {}
            () = stop.cancelled() => {}
            Some(bid) = held.watches.next(), if !held.watches.is_empty() => {
                // Its status changed (a release, a delete): it is read again.
                held.watched.remove(&bid);
                shared.held.lock().unwrap_or_else(PoisonError::into_inner).remove(&bid);
            }
            () = shared.held_grew.notified(), if batches => {}
        }
        // Changes that come in a burst are seen in one listing.
        let debounce = match target {
            Target::Jobs(state) if state != JobState::Pending => CHAINED_RELIST_DEBOUNCE,
            _ => RELIST_DEBOUNCE,
        } + backlog_delay(target, backlog);
        tokio::select! {
            () = tokio::time::sleep(debounce) => {}
            () = stop.cancelled() => {}
        }
    }
}

/// The batch-pending lister's watches on the status nodes of the batches
/// found Held ([`Shared::held`]): when one fires, the batch is no longer
/// taken for Held and the next listing reads it again.
#[derive(Default)]
struct HeldWatches {
    /// The session the watches were set in.
    session: Option<zk::SessionId>,
    /// The batches watched.
    watched: HashSet<String>,
    /// Each watch, resolving to its batch when it fires.
    watches:
        futures_util::stream::FuturesUnordered<futures_util::future::BoxFuture<'static, String>>,
}

impl HeldWatches {
    /// Watches every batch of `shared.held` not watched yet; one whose
    /// status is no longer Held is taken out of `shared.held` at once. In a
    /// new session every batch is forgotten (the old session's watches
    /// never fire), so each is read again.
    async fn watch(&mut self, shared: &Shared, client: &zk::Client) -> Result<(), BoxError> {
        let session = client.session_id();
        if self.session != Some(session) {
            self.session = Some(session);
            self.watched.clear();
            self.watches = futures_util::stream::FuturesUnordered::new();
            shared
                .held
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clear();
        }
        let new: Vec<String> = shared
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter(|b| !self.watched.contains(*b))
            .cloned()
            .collect();
        for bid in new {
            match client
                .get_and_watch_data(&format!("/batches/{bid}/status"))
                .await
            {
                Ok((data, _, watcher)) => {
                    if decode::<StatusOnly>("status", &data).is_ok_and(|n| n.status == "Held") {
                        self.watched.insert(bid.clone());
                        self.watches.push(Box::pin(async move {
                            let _ = watcher.changed().await;
                            bid
                        }));
                        continue;
                    }
                    crate::session::park(watcher);
                }
                Err(zk::Error::NoNode) => {}
                Err(e) => return Err(e.into()),
            }
            // Released (or gone) before the watch was set.
            shared
                .held
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&bid);
        }
        Ok(())
    }
}

/// How much longer a job queue whose last listing held `backlog` items
/// waits before it is listed again: its tasks have work in the listing they
/// hold, and every listing of a long queue sends every name (with 4 workers
/// and 1,000 jobs Pending, listing the Pending queue was most of
/// ZooKeeper's CPU). One millisecond per item, at most [`MAX_BACKLOG_DELAY`].
fn backlog_delay(target: Target, backlog: usize) -> Duration {
    match target {
        Target::Jobs(_) => {
            Duration::from_millis(u64::try_from(backlog).unwrap_or(u64::MAX)).min(MAX_BACKLOG_DELAY)
        }
        _ => Duration::ZERO,
    }
}

/// The most [`backlog_delay`] adds to a listing's debounce.
const MAX_BACKLOG_DELAY: Duration = Duration::from_millis(200);

/// Runs one task of `kind` on the listing of its queue until `stop` is
/// cancelled.
pub async fn run_task(
    shared: Arc<Shared>,
    kind: DaemonKind,
    task: u32,
    mut listing: Listing,
    stop: CancellationToken,
) {
    let Some(target) = Target::of(kind) else {
        return;
    };
    tracing::debug!(daemon = %kind, task, "daemon task started");
    let inbox = match target {
        Target::Jobs(state) => shared.inboxes.get(&state).map(|i| i.rx.clone()),
        _ => None,
    };
    while !stop.is_cancelled() {
        // A job handed on by the task that ran its step before comes
        // before the queue: its lock is held already.
        if let Some(chain) = inbox.as_ref().and_then(|rx| rx.try_recv().ok()) {
            run_chain(&shared, chain, &stop).await;
            continue;
        }
        let client = match shared.session.client().await {
            Ok(c) if connected(&c) => c,
            Ok(_) | Err(_) => {
                // Disconnected: no new side effects until the session is back.
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_millis(200)) => {}
                    () = stop.cancelled() => {}
                }
                continue;
            }
        };
        // A reporting task registers for wake-ups BEFORE it reads the
        // batches the engine named: `notify_waiters` keeps no permit, so a
        // batch named between the read and the wait below was missed, and
        // it waited for the next wake-up or the 10-second sweep (a batch
        // reporting p99 of 9.2 s in one run of 4 workers).
        let reporting = matches!(target, Target::ReportingBatches(_));
        let wake = shared.report_wake.notified();
        tokio::pin!(wake);
        if reporting {
            wake.as_mut().enable();
        }
        // The listing is shared, not copied: every task of every daemon
        // reads it at each turn, and a copy of a queue of thousands of jobs
        // per turn was a quarter of a worker's CPU with 4 workers.
        let listed: Arc<Vec<Item>> = Arc::clone(&listing.borrow_and_update());
        let with_named: Vec<Item>;
        let items: &[Item] = match target {
            Target::ReportingBatches(status) => {
                // Batches the engine's answers named come first.
                let named: Vec<String> = shared
                    .to_report
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .iter()
                    .filter(|(_, s)| s == status)
                    .map(|(b, _)| b.clone())
                    .collect();
                let mut first: Vec<Item> = named
                    .into_iter()
                    .map(|id| Item {
                        id,
                        priority: 0,
                        since: None,
                    })
                    .collect();
                first.retain(|i| !listed.contains(i));
                first.extend(listed.iter().cloned());
                with_named = first;
                &with_named
            }
            _ => &listed,
        };
        match shared.pick(target, items) {
            Ok(item) => {
                let mut named = false;
                if matches!(target, Target::ReportingBatches(_)) {
                    let mut queue = shared
                        .to_report
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner);
                    let before = queue.len();
                    queue.retain(|(b, _)| *b != item.id);
                    if queue.len() < before {
                        named = true;
                        shared.stats.named_reports.fetch_add(1, Ordering::Relaxed);
                    }
                }
                let tried = match try_item(&shared, &client, target, &item, named, &stop).await {
                    Ok(Some(t)) => t,
                    // The chain goes on in a task of the next daemon,
                    // which settles the claim when it ends.
                    Ok(None) => continue,
                    Err(e) => {
                        tracing::warn!(daemon = %kind, task, item = %item.id, error = %ingest_protocol::bounded(format_args!("{e:#}")), "daemon try failed");
                        Tried::Failed
                    }
                };
                shared.settle(target, &item.id, tried);
                if tried == Tried::Done && !matches!(target, Target::PendingBatches) {
                    shared.linger(target, &item.id);
                }
            }
            Err(next) => {
                let wait = next.map_or(ITEM_BACKOFF_MAX, |n| {
                    n.saturating_duration_since(Instant::now())
                });
                let handed = async {
                    match &inbox {
                        Some(rx) => rx.recv().await.ok(),
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    r = listing.changed() => {
                        if r.is_err() {
                            // The lister stopped: so does the task.
                            break;
                        }
                    }
                    Some(chain) = handed => run_chain(&shared, chain, &stop).await,
                    () = &mut wake, if reporting => {}
                    () = tokio::time::sleep(wait) => {}
                    () = stop.cancelled() => {}
                }
            }
        }
    }
    // Jobs handed here that no task will run now: their locks go back. A
    // closed inbox takes no more (a task that would hand a job on runs its
    // step itself, and its chain ends at the stop).
    if let Some(rx) = &inbox {
        rx.close();
        while let Ok(chain) = rx.try_recv() {
            release(&chain.client, &chain.held.path, &chain.held.created).await;
            shared.settle(Target::Jobs(chain.state), &chain.item.id, Tried::Skipped);
        }
    }
    tracing::debug!(daemon = %kind, task, "daemon task stopped");
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
                        since: None,
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
            let (unknown, known_pending): (Vec<String>, HashSet<String>) = {
                let mut acquired = shared
                    .acquired
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                let mut held = shared.held.lock().unwrap_or_else(PoisonError::into_inner);
                let mut pending = shared
                    .pending
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                // Forget batches cleanup removed, so the sets stay bounded.
                let listed: HashSet<&String> = bids.iter().collect();
                acquired.retain(|b| listed.contains(b));
                held.retain(|b| listed.contains(b));
                pending
                    .retain(|b| listed.contains(b) && !acquired.contains(b) && !held.contains(b));
                let unknown = bids
                    .into_iter()
                    .filter(|b| !acquired.contains(b) && !held.contains(b))
                    .collect();
                (unknown, pending.clone())
            };
            // Every pending batch, oldest first: a task passes over those
            // it cannot take now (held, refused) to the next. Only batches
            // this worker has not seen pending yet are read, many at once:
            // read one after another, a burst of 200 submissions kept the
            // first acquisition waiting for 400 round trips. Stats, not a
            // multi-read of the nodes' data: a status node that someone
            // else made huge would fail a multi-read of every batch with it,
            // and stall acquisition for all of them.
            let fresh: Vec<String> = unknown
                .iter()
                .filter(|b| !known_pending.contains(*b))
                .cloned()
                .collect();
            let reads = fresh.into_iter().map(|bid| {
                let client = client.clone();
                async move {
                    let seen = if client
                        .check_stat(&format!("/batches/{bid}/states"))
                        .await?
                        .is_some()
                    {
                        BatchSeen::Acquired
                    } else if client
                        .check_stat(&format!("/batches/{bid}/status"))
                        .await?
                        .is_some()
                    {
                        BatchSeen::Pending
                    } else {
                        BatchSeen::Unknown
                    };
                    Ok::<_, zk::Error>((bid, seen))
                }
            });
            let read: HashMap<String, BatchSeen> = futures_util::stream::iter(reads)
                .buffered(LIST_READS_IN_FLIGHT)
                .try_collect()
                .await?;
            let mut items = Vec::new();
            for bid in &unknown {
                // Not read: seen pending before, and not acquired since.
                let seen = read.get(bid).copied().unwrap_or(BatchSeen::Pending);
                match seen {
                    BatchSeen::Acquired => {
                        shared
                            .acquired
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .insert(bid.clone());
                    }
                    BatchSeen::Pending => {
                        shared
                            .pending
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .insert(bid.clone());
                        items.push(Item {
                            id: bid.clone(),
                            priority: 0,
                            since: None,
                        });
                    }
                    // A listing reads stats only; a task's re-check finds Held.
                    BatchSeen::Held | BatchSeen::Unknown => {}
                }
            }
            Ok((items, Some(watcher)))
        }
        Target::ReportingBatches(wanted) => {
            // The slow sweep, for batches that entered a reporting status
            // without an answer to this worker naming them: the engine
            // lists them from its state, so the sweep's cost does not grow
            // with the finished batches in the tree (reading every batch's
            // status node, 2,000 finished batches made a fresh worker's
            // first sweep 2,000 ZooKeeper reads).
            let page = shared.engine.reporting_batches(wanted).await?;
            let items = page
                .bids
                .into_iter()
                .take(ingest_protocol::api::MAX_REPORTING_LISTED)
                .filter(|bid| bid.parse::<ingest_events::Bid>().is_ok())
                .map(|id| Item {
                    id,
                    priority: 0,
                    since: None,
                })
                .collect();
            Ok((items, None))
        }
    }
}

/// What a listing of `/batches` (or a task's re-check) found out about a
/// batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BatchSeen {
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
async fn pending_batch(client: &zk::Client, bid: &str) -> Result<BatchSeen, BoxError> {
    if client
        .check_stat(&format!("/batches/{bid}/states"))
        .await?
        .is_some()
    {
        return Ok(BatchSeen::Acquired);
    }
    Ok(
        match read_status(client, &format!("/batches/{bid}/status"))
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

/// How many node reads a listing of `/batches` has in flight.
const LIST_READS_IN_FLIGHT: usize = 32;

/// Whether batch `bid` is one `target` works on now.
async fn batch_matches(client: &zk::Client, target: Target, bid: &str) -> Result<bool, BoxError> {
    match target {
        Target::PendingBatches => Ok(pending_batch(client, bid).await? == BatchSeen::Pending),
        Target::ReportingBatches(status) => {
            Ok(read_status(client, &format!("/batches/{bid}/status"))
                .await?
                .as_deref()
                == Some(status))
        }
        Target::Jobs(_) => Ok(false),
    }
}

/// Whether the batch status node at `path` says `wanted`, waiting (bounded
/// by [`PROJECTION_WAIT`]) while it still says `Processing`.
async fn reached_status(client: &zk::Client, path: &str, wanted: &str) -> Result<bool, BoxError> {
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

/// A fresh secret from the operating system's generator.
pub(crate) fn fresh_secret() -> Result<FenceSecret, BoxError> {
    let mut bytes = [0u8; 32];
    getrandom::getrandom(&mut bytes)
        .map_err(|e| anyhow::anyhow!("cannot draw a lock secret: {e}"))?;
    Ok(FenceSecret::from_bytes(bytes))
}

/// A lock this worker's session holds.
struct Held {
    path: String,
    created: zk::Stat,
    fence: FenceSecret,
}

/// Tries `item`: `None` when it was handed, lock held, to a task of the
/// next step's daemon.
/// `named`: an engine answer named this batch as entering its reporting
/// status (the projection may not show it yet).
async fn try_item(
    shared: &Shared,
    client: &zk::Client,
    target: Target,
    item: &Item,
    named: bool,
    stop: &CancellationToken,
) -> Result<Option<Tried>, BoxError> {
    let path = lock_path(target, &item.id);
    let fence = fresh_secret()?;
    let data = LockNode::new(&shared.name, &fence).to_bytes();
    let ephemeral = ingest_projections::acl::lock_options();
    let created = match client.create(&path, &data, &ephemeral).await {
        Ok((stat, _)) => stat,
        Err(zk::Error::NodeExists) => {
            match target {
                Target::Jobs(_) => {
                    shared.stats.lock_busy.fetch_add(1, Ordering::Relaxed);
                }
                // Someone holds the lock of a batch the engine named to us:
                // another worker's reporting task, or a batch-pending task
                // of another worker trying it from an old listing (it lets
                // go at once). Named again, it is tried after a short
                // back-off instead of waiting for the 10-second sweep
                // (once a 9.2 s reporting p99 with 4 workers).
                Target::ReportingBatches(status) if named => {
                    shared.note_reporting(&item.id, status);
                }
                _ => {}
            }
            return Ok(Some(Tried::Skipped));
        }
        Err(zk::Error::NoNode) => return Ok(Some(Tried::Skipped)),
        Err(e) => return Err(e.into()),
    };
    let held = Held {
        path,
        created,
        fence,
    };
    if let Target::Jobs(first) = target {
        shared.stats.job_locks.fetch_add(1, Ordering::Relaxed);
        let status_path = format!("/jobs/{}/status", item.id);
        match read_status(client, &status_path).await {
            Ok(s) if s.as_deref() == Some(first.to_string().as_str()) => {}
            other => {
                release(client, &held.path, &held.created).await;
                return other.map(|_| Some(Tried::Skipped));
            }
        }
        let chain = Box::new(Chain {
            item: item.clone(),
            client: client.clone(),
            held,
            state: first,
            left: first,
            steps: 0,
            space_needed: None,
        });
        return match chain_steps(shared, chain, stop).await {
            ChainEnd::HandedOff => Ok(None),
            ChainEnd::Ended(chain, result, until) => {
                let_go(&chain.client, &chain.held, until).await;
                result.map(Some)
            }
        };
    }
    match locked(shared, client, target, item, &held, named).await {
        Ok((tried, until)) => {
            let_go(client, &held, until).await;
            Ok(Some(tried))
        }
        Err(e) => {
            release(client, &held.path, &held.created).await;
            Err(e)
        }
    }
}

/// What the projection is to show before a lock is released, so that no
/// worker takes the item again from a projection that lags.
enum Until {
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
async fn let_go(client: &zk::Client, held: &Held, until: Until) {
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

/// How a chain of steps ended in one task.
enum ChainEnd {
    /// Handed to a task of the next step's daemon, lock held.
    HandedOff,
    /// Ended here: the lock is to be released once the projection shows
    /// what the `Until` says.
    Ended(Box<Chain>, Result<Tried, BoxError>, Until),
}

/// Runs a chain handed to this task, and releases and settles it when it
/// ends here.
async fn run_chain(shared: &Shared, chain: Box<Chain>, stop: &CancellationToken) {
    let id = chain.item.id.clone();
    let ChainEnd::Ended(chain, result, until) = chain_steps(shared, chain, stop).await else {
        return;
    };
    let_go(&chain.client, &chain.held, until).await;
    let tried = result.unwrap_or_else(|e| {
        tracing::warn!(jid = %id, state = %chain.state, error = %ingest_protocol::bounded(format_args!("{e:#}")), "a chained step failed");
        Tried::Failed
    });
    // Whatever came of the last step, the earlier ones were done.
    let tried = match tried {
        Tried::Waited => Tried::Waited,
        _ => Tried::Done,
    };
    let target = Target::Jobs(chain.state);
    shared.settle(target, &id, tried);
    if tried == Tried::Done {
        shared.linger(target, &id);
    }
}

/// Who reports (this worker and `client`'s session) and how (the API with
/// the lock's secret `fence`).
fn identity(shared: &Shared, client: &zk::Client, fence: &FenceSecret) -> (WorkerRef, ApiCtx) {
    let session_id = client.session_id().0;
    let who = WorkerRef {
        worker: shared.name.clone(),
        session_id: SessionId(session_id),
    };
    let api = ApiCtx {
        engine: shared.engine.clone(),
        worker: shared.name.clone(),
        session_id,
        fence: fence.clone(),
    };
    (who, api)
}

/// Runs `chain`'s steps while the engine's answers move the job into
/// states this worker serves; hands the job on to the next state's daemon
/// when its inbox has room.
async fn chain_steps(shared: &Shared, mut chain: Box<Chain>, stop: &CancellationToken) -> ChainEnd {
    let status_path = format!("/jobs/{}/status", chain.item.id);
    loop {
        let (who, api) = identity(shared, &chain.client, &chain.held.fence);
        let stepped = step_once(
            shared,
            &chain.client,
            &chain.item,
            chain.state,
            &who,
            &api,
            &mut chain.space_needed,
        )
        .await;
        let (tried, moved) = match stepped {
            Ok(r) => r,
            Err(e) => return ChainEnd::Ended(chain, Err(e), Until::Now),
        };
        let Some(moved) = moved.filter(|_| tried == Tried::Done) else {
            if chain.steps > 0 {
                // The chain stops here: the earlier steps were done. The
                // lock is kept until the projection shows the state they
                // left the job in.
                let until = Until::Status {
                    path: status_path,
                    old: chain.left.to_string(),
                };
                let tried = match tried {
                    Tried::Waited => Tried::Waited,
                    _ => Tried::Done,
                };
                return ChainEnd::Ended(chain, Ok(tried), until);
            }
            return ChainEnd::Ended(chain, Ok(tried), Until::Now);
        };
        chain.steps += 1;
        chain.left = chain.state;
        shared.note_reporting(&moved.bid, &moved.batch_status);
        match moved.status.parse::<JobState>().ok() {
            // Go on with the next step under the same lock.
            Some(next)
                if next != chain.state
                    && shared.runs.contains(&next)
                    && shared.steps.get(next).is_some()
                    && !stop.is_cancelled()
                    && connected(&chain.client) =>
            {
                shared.stats.chained.fetch_add(1, Ordering::Relaxed);
                chain.state = next;
                match shared.hand_off(chain) {
                    Ok(()) => return ChainEnd::HandedOff,
                    // That daemon is busy: run its step here.
                    Err(c) => chain = c,
                }
            }
            _ => {
                let until = Until::Status {
                    path: status_path,
                    old: chain.state.to_string(),
                };
                return ChainEnd::Ended(chain, Ok(Tried::Done), until);
            }
        }
    }
}

/// Works on a batch whose lock this session holds; what to wait for
/// before the lock is released.
async fn locked(
    shared: &Shared,
    client: &zk::Client,
    target: Target,
    item: &Item,
    held: &Held,
    named: bool,
) -> Result<(Tried, Until), BoxError> {
    let (who, api) = identity(shared, client, &held.fence);
    let batch_ctx = || super::step::BatchCtx {
        bid: item.id.clone(),
        zk: client.clone(),
        api: api.clone(),
    };
    match target {
        Target::PendingBatches => {
            match pending_batch(client, &item.id).await? {
                BatchSeen::Pending => {}
                // Acquired by another worker, or gone: never pending again.
                BatchSeen::Acquired | BatchSeen::Unknown => {
                    shared.note_acquired(&item.id);
                    return Ok((Tried::Skipped, Until::Now));
                }
                // Parked by a collection hold: a candidate again when it is
                // released.
                BatchSeen::Held => {
                    shared.note_held(&item.id);
                    return Ok((Tried::Skipped, Until::Now));
                }
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
                    () = session_ended(client) => return Ok((Tried::Refused, Until::Now)),
                };
                match expansion {
                    super::step::Expansion::Jobs(jobs) => body.jobs = Some(jobs),
                    super::step::Expansion::Failed(why) => {
                        // The depositor's input quoted: bounded, so the
                        // report fits any server's body limit.
                        body.expansion_error = Some(
                            ingest_protocol::cut(&why, ingest_protocol::MAX_MESSAGE_BYTES)
                                .into_owned(),
                        )
                    }
                }
            }
            let path = format!("/batches/{}/acquire", item.id);
            let (tried, answer) = match report::<Acquired>(shared, &path, &held.fence, &body).await
            {
                // The expansion is more than the server reads in one request:
                // the batch fails once, with a report that fits, instead of
                // being expanded and refused again every turn.
                Err(e) if too_large(&e) && body.jobs.is_some() => {
                    let jobs = body.jobs.take().map_or(0, |j| j.len());
                    tracing::warn!(bid = %item.id, jobs, "the batch's expansion is larger than the server accepts; the batch fails");
                    body.expansion_error = Some(format!(
                        "the payload expands into {jobs} job(s), more than the server accepts in one request (413 payload_too_large): split the batch"
                    ));
                    report::<Acquired>(shared, &path, &held.fence, &body).await?
                }
                other => other?,
            };
            match answer {
                // Its collection is held: the batch went Held, not
                // acquired, and comes back to Pending when released.
                Some(a) if a.status == "Held" => {
                    shared.note_held(&item.id);
                    let status = format!("/batches/{}/status", item.id);
                    let until = Until::Status {
                        path: status,
                        old: "Pending".into(),
                    };
                    Ok((tried, until))
                }
                Some(a) => {
                    shared.note_acquired(&item.id);
                    if a.status == "Failed" {
                        // Failed as it was acquired (its payload did not
                        // expand): it never enters Reporting, so the
                        // depositor hears of it here.
                        if let Some(work) = &shared.steps.batch {
                            if let Some(e) = work.failed(&batch_ctx(), &a.message).await {
                                tracing::warn!(bid = %item.id, error = %ingest_protocol::bounded(&e), "cannot notify the depositor of the batch's failure");
                            }
                        }
                    }
                    let states = format!("/batches/{}/states", item.id);
                    Ok((tried, Until::Exists(states)))
                }
                None => Ok((tried, Until::Now)),
            }
        }
        Target::ReportingBatches(status) => {
            let ready = if named {
                // The engine said so a moment ago: a projection that still
                // shows the batch Processing is waited for, not taken as a
                // reason to leave the batch to the slow sweep (which then
                // took up to 10 s: the reporting p99 with 4 workers).
                reached_status(client, &format!("/batches/{}/status", item.id), status).await?
            } else {
                batch_matches(client, target, &item.id).await?
            };
            if !ready {
                return Ok((Tried::Skipped, Until::Now));
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
                    () = session_ended(client) => return Ok((Tried::Refused, Until::Now)),
                };
                body.notification_error = sent;
            }
            let path = format!("/batches/{}/report", item.id);
            let (tried, _) = report::<Reported>(shared, &path, &held.fence, &body).await?;
            if tried == Tried::Done {
                let until = Until::Status {
                    path: format!("/batches/{}/status", item.id),
                    old: status.to_string(),
                };
                return Ok((tried, until));
            }
            Ok((tried, Until::Now))
        }
        // Jobs go through `chain_steps`.
        Target::Jobs(_) => Ok((Tried::Skipped, Until::Now)),
    }
}

/// Runs the step of `state` for `item` and reports it; the engine's answer
/// when it was accepted.
async fn step_once(
    shared: &Shared,
    client: &zk::Client,
    item: &Item,
    state: JobState,
    who: &WorkerRef,
    api: &ApiCtx,
    space_needed: &mut Option<u64>,
) -> Result<(Tried, Option<JobMoved>), BoxError> {
    if state == JobState::Pending {
        let path = format!("/jobs/{}/start", item.id);
        return report::<JobMoved>(shared, &path, &api.fence, who).await;
    }
    let Some(step) = shared.steps.get(state) else {
        return Ok((Tried::Skipped, None));
    };
    let ctx = JobCtx {
        jid: item.id.clone(),
        state,
        priority: item.priority,
        zk: Some(client.clone()),
        api: Some(api.clone()),
        space_needed: *space_needed,
    };
    let began = Instant::now();
    // The step is dropped as soon as the session ends: its lock is gone, so
    // its result could only be refused.
    let now = shared.stats.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
    shared
        .stats
        .peak_in_flight
        .fetch_max(now, Ordering::Relaxed);
    let _in_flight = InFlight(&shared.stats);
    let result = tokio::select! {
        r = step.run(&ctx) => r,
        () = session_ended(client) => {
            tracing::warn!(jid = %item.id, %state, "the session ended during the step; the step is dropped");
            return Ok((Tried::Refused, None));
        }
    };
    let outcome = match result {
        StepResult::Report(o) => o,
        StepResult::Wait(why) => {
            let _logged = shared.note_waiting(&item.id, state, &why);
            return Ok((Tried::Waited, None));
        }
    };
    shared.done_waiting(&item.id);
    if outcome.space_needed.is_some() {
        *space_needed = outcome.space_needed;
    }
    if client.state().is_terminated() {
        tracing::warn!(jid = %item.id, %state, "the session ended during the step; the result is dropped");
        return Ok((Tried::Refused, None));
    }
    let body = OutcomeBody {
        worker: who.worker.clone(),
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
        failure: outcome.failure,
        duration_ms: Some(u64::try_from(began.elapsed().as_millis()).unwrap_or(u64::MAX)),
    };
    let path = format!("/jobs/{}/outcome", item.id);
    report::<JobMoved>(shared, &path, &api.fence, &body).await
}

/// Counts a step out of [`Stats::in_flight`] when it ends, however it ends.
struct InFlight<'a>(&'a Stats);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
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

/// POSTs a fenced report whose route answers `R` (`Acquired`, `Reported`
/// or `JobMoved`), with the lock's secret. The answer is decoded, so a
/// server that answers another shape is an error.
async fn report<R: serde::de::DeserializeOwned>(
    shared: &Shared,
    path: &str,
    fence: &FenceSecret,
    body: &impl serde::Serialize,
) -> Result<(Tried, Option<R>), BoxError> {
    match shared.engine.report::<_, R>(path, fence, body).await? {
        Reply::Done(answer) => {
            shared.stats.accepted.fetch_add(1, Ordering::Relaxed);
            Ok((Tried::Done, Some(answer)))
        }
        Reply::Refused { code, message } => {
            shared.stats.refused.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(%path, %code, message = %ingest_protocol::bounded(&message), "the report was refused; its result is discarded");
            Ok((Tried::Refused, None))
        }
    }
}

/// Whether `e` is the server's 413: the request body is over its limit.
fn too_large(e: &BoxError) -> bool {
    e.downcast_ref::<ingest_client::ClientError>()
        .and_then(ingest_client::ClientError::status)
        == Some(413)
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
            crate::session::park(watcher);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn daemons_map_to_their_queues() {
        assert_eq!(
            Target::of(DaemonKind::BatchPending),
            Some(Target::PendingBatches)
        );
        assert_eq!(
            Target::of(DaemonKind::Downloading),
            Some(Target::Jobs(JobState::Downloading))
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
        Shared::new(
            "w".into(),
            Arc::new(Session::new(ingest_projections::ZkConfig::new(
                "127.0.0.1:1".to_string(),
            ))),
            EngineClient::new(engine, "token").expect("client"),
            Steps::simulated(
                SimSettings::default(),
                Some(1),
                Arc::new(FixedProbe::new(0.0)),
                90.0,
                "/".into(),
            ),
            &[(DaemonKind::JobPending, 1), (DaemonKind::Estimating, 1)],
            Rng::new(1),
        )
    }

    fn items(ids: &[&str]) -> Vec<Item> {
        ids.iter()
            .map(|id| Item {
                id: (*id).to_string(),
                priority: 5,
                since: None,
            })
            .collect()
    }

    /// Several batch-pending tasks: a batch one of them acquired is still
    /// in the listing until the lister reads `/batches` again, and must
    /// not cost another task a lock, a read and a release.
    #[test]
    fn a_job_whose_chain_ended_here_is_not_locked_again_from_a_stale_listing() {
        let shared = shared("http://127.0.0.1:1");
        let target = Target::Jobs(JobState::Estimating);
        let queue = items(&["jid1"]);
        let first = shared.pick(target, &queue).expect("jid1");
        shared.settle(target, &first.id, Tried::Done);
        shared.linger(target, &first.id);
        // The estimating queue's last listing still shows jid1, which the
        // chain has carried on to Completed.
        assert!(shared.pick(target, &queue).is_err());
        assert!(shared
            .pick(target, &items(&["jid1", "jid2"]))
            .is_ok_and(|i| i.id == "jid2"));
    }

    #[test]
    fn a_batch_acquired_here_is_not_picked_again_from_a_stale_listing() {
        let shared = shared("http://127.0.0.1:1");
        let queue = items(&["bid1", "bid2"]);
        let first = shared.pick(Target::PendingBatches, &queue).expect("bid1");
        assert_eq!(first.id, "bid1");
        // What `locked` does when the acquire was accepted.
        shared
            .acquired
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(first.id.clone());
        shared.settle(Target::PendingBatches, "bid1", Tried::Done);
        let next = shared.pick(Target::PendingBatches, &queue).expect("bid2");
        assert_eq!(next.id, "bid2", "bid1 is acquired");
        shared.settle(Target::PendingBatches, "bid2", Tried::Done);
        assert!(shared
            .pick(Target::PendingBatches, &items(&["bid1"]))
            .is_err());
        // Job queues are not filtered by batches.
        assert!(shared
            .pick(Target::Jobs(JobState::Pending), &items(&["bid1"]))
            .is_ok());
    }

    /// Regression: the batch-pending daemon stopped at the first batch it
    /// could not take, so one held or refused batch kept every later batch
    /// Pending. An item that could not be taken is now backed off from by
    /// itself and the next one is picked.
    #[test]
    fn an_item_that_cannot_be_taken_does_not_hold_up_the_next() {
        let shared = shared("http://127.0.0.1:1");
        let queue = items(&["bid1", "bid2", "bid3"]);
        let first = shared.pick(Target::PendingBatches, &queue).expect("bid1");
        assert_eq!(first.id, "bid1", "batches are taken oldest first");
        // In hand: another task takes the next.
        let second = shared.pick(Target::PendingBatches, &queue).expect("bid2");
        assert_eq!(second.id, "bid2");
        shared.settle(Target::PendingBatches, "bid1", Tried::Refused);
        shared.settle(Target::PendingBatches, "bid2", Tried::Done);
        // bid1 backs off; bid2 was dealt with (and would have left the
        // listing); the next pick is bid2 again only because the listing
        // still shows it, else bid3.
        let next = shared
            .pick(Target::PendingBatches, &items(&["bid1", "bid3"]))
            .expect("bid3");
        assert_eq!(next.id, "bid3");
        shared.settle(Target::PendingBatches, "bid3", Tried::Skipped);
        // Everything backs off: the answer is when to look again.
        let wait = shared
            .pick(Target::PendingBatches, &items(&["bid1", "bid3"]))
            .expect_err("nothing to take now");
        assert!(wait.is_some());
    }

    /// A job that just entered the queue of a state after Pending is in
    /// another worker's chain: it is no candidate until it has stayed
    /// there for CHAIN_GRACE. Pending jobs are candidates at once.
    #[test]
    fn a_job_just_seen_after_pending_waits_out_the_chain_grace() {
        let shared = shared("http://127.0.0.1:1");
        let now = Instant::now();
        let fresh = Item {
            id: "jid1".into(),
            priority: 5,
            since: Some(now),
        };
        let wait = shared
            .pick(
                Target::Jobs(JobState::Estimating),
                std::slice::from_ref(&fresh),
            )
            .expect_err("too fresh");
        assert!(wait.is_some_and(|t| t >= now + CHAIN_GRACE));
        assert!(shared
            .pick(
                Target::Jobs(JobState::Pending),
                std::slice::from_ref(&fresh)
            )
            .is_ok_and(|i| i.id == "jid1"));
        let old = Item {
            id: "jid2".into(),
            priority: 5,
            since: now.checked_sub(CHAIN_GRACE * 2),
        };
        assert!(shared
            .pick(Target::Jobs(JobState::Estimating), &[fresh, old])
            .is_ok_and(|i| i.id == "jid2"));
    }

    /// The random spread over the head of a queue never takes a job of a
    /// lower priority while one of a higher is free.
    /// A worker's batch-pending task that lost the race for a batch's lock
    /// backs off from it; when the batch ends and the engine names it to
    /// this worker for reporting, its reporting task takes it at once.
    #[test]
    fn a_pending_back_off_does_not_hold_up_the_report_of_the_same_batch() {
        let shared = shared("http://127.0.0.1:1");
        let batch = items(&["bid1"]);
        let tried = shared.pick(Target::PendingBatches, &batch).expect("bid1");
        shared.settle(Target::PendingBatches, &tried.id, Tried::Skipped);
        assert!(
            shared.pick(Target::PendingBatches, &batch).is_err(),
            "the pending daemon backs off"
        );
        let reporting = Target::ReportingBatches("Reporting");
        let item = shared
            .pick(reporting, &batch)
            .expect("the reporting daemon is not held back by it");
        assert_eq!(item.id, "bid1");
        shared.settle(reporting, &item.id, Tried::Done);
    }

    #[test]
    fn the_spread_stays_within_the_first_priority() {
        let shared = shared("http://127.0.0.1:1");
        let target = Target::Jobs(JobState::Pending);
        let mut queue = items(&["jid1", "jid2"]);
        queue[0].priority = 1;
        queue[1].priority = 2;
        for _ in 0..20 {
            let item = shared.pick(target, &queue).expect("jid1");
            assert_eq!(item.id, "jid1");
            shared.settle(target, &item.id, Tried::Done);
        }
    }

    /// A long job queue is listed less often; short ones and batches are not
    /// delayed.
    #[test]
    fn a_long_queue_is_listed_less_often() {
        let pending = Target::Jobs(JobState::Pending);
        assert_eq!(backlog_delay(pending, 0), Duration::ZERO);
        assert_eq!(backlog_delay(pending, 50), Duration::from_millis(50));
        assert_eq!(backlog_delay(pending, 100_000), MAX_BACKLOG_DELAY);
        assert_eq!(backlog_delay(Target::PendingBatches, 1000), Duration::ZERO);
    }

    /// Chaining goes on only through the states whose daemon runs here.
    #[test]
    fn a_worker_knows_which_states_it_serves() {
        let shared = shared("http://127.0.0.1:1");
        assert!(shared.runs.contains(&JobState::Pending));
        assert!(shared.runs.contains(&JobState::Estimating));
        assert!(!shared.runs.contains(&JobState::Provisioning));
        assert!(shared.reports.is_empty());
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
            bid: "bid1".into(),
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
                            ..ErrorDetail::default()
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
        let fence = FenceSecret::from_bytes([3; 32]);
        let tried = report::<JobMoved>(&shared, "/jobs/jid1/start", &fence, &who).await;
        assert_eq!(tried.ok().map(|t| t.0), Some(Tried::Done));
        let tried = report::<JobMoved>(&shared, "/jobs/jid2/start", &fence, &who).await;
        assert_eq!(tried.ok().map(|t| t.0), Some(Tried::Refused));
        let tried = report::<JobMoved>(&shared, "/jobs/jid3/start", &fence, &who).await;
        assert!(
            tried.is_err(),
            "an answer of another shape is not an acceptance"
        );
        assert_eq!(shared.stats.accepted.load(Ordering::Relaxed), 1);
        assert_eq!(shared.stats.refused.load(Ordering::Relaxed), 1);
    }
}
