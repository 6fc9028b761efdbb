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
//! jobs in its whole pipeline. When the next daemon's inbox is full, or
//! every task of it has been on one job for longer than [`LONG_STEP`] (a
//! store of a 100,000-file object held the next job's store for minutes
//! when the job waited in that inbox), the task runs the next step itself
//! rather than wait. A job handed on before every task went on a long step
//! is taken by the daemon's *spare* ([`run_spare`]) within a second of the
//! last task going long, and run in a task of its own (at most as many at
//! once as the daemon has tasks, which is all its inbox holds), so no job
//! waits behind a long store. A hand-off never blocks, so no cycle of full
//! inboxes can stall a worker. When the chain ends, the
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

use ingest_events::{Bid, Jid, JobState};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use zookeeper_client as zk;

use super::retry::RetryPolicy;
use super::session::Session;
use super::step::{Rng, Steps};
use ingest_client::Client as EngineClient;
use ingest_config::DaemonKind;

mod chain;
mod lister;
mod lock;
mod status;

use chain::{run_chain, try_item};
pub use lister::start_lister;
use lock::Held;
pub(crate) use lock::{fresh_secret, release};

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
    /// Chained steps run in the task of the step before because the next
    /// daemon had no room: its inbox full, or its tasks on long steps.
    pub busy_handoffs: AtomicU64,
    /// Chained steps run by a daemon's spare ([`run_spare`]): handed to the
    /// daemon before all its tasks went on long steps.
    pub spare_runs: AtomicU64,
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
    acquired: Mutex<HashSet<Bid>>,
    /// Batches a task found Held. They are no candidates until the lister,
    /// which watches each one's status node, sees the status change and
    /// takes them out again.
    held: Mutex<HashSet<Bid>>,
    /// Wakes the batch-pending lister when `held` grew, so it starts
    /// watching the new ones.
    held_grew: tokio::sync::Notify,
    /// Batches a listing saw pending (a status, no `states`) and not yet
    /// acquired: later listings keep them without reading ZooKeeper again
    /// (a task re-checks a batch before acquiring it).
    pending: Mutex<HashSet<Bid>>,
    /// Why each waiting job waits, so the reason is logged at INFO once
    /// when it changes rather than on every look.
    waiting: Mutex<HashMap<Jid, String>>,
    /// Items in hand or backed off from, by id, over every daemon.
    claims: Mutex<HashMap<String, Claim>>,
    /// Batches an answer said entered a reporting status, with it, for the
    /// reporting daemons.
    to_report: Mutex<VecDeque<(Bid, String)>>,
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
    /// What the daemon's tasks are doing.
    working: Arc<Working>,
}

/// A task whose work on a job has lasted this long is on a long step (a
/// store of a large object): a job handed to its daemon is not counted on
/// it.
pub const LONG_STEP: Duration = Duration::from_secs(5);

impl Inbox {
    /// Whether a job handed here now would soon be taken: fewer jobs wait
    /// than the daemon has tasks that are idle or on a short step. A job
    /// handed to a daemon whose tasks are all on long steps waited behind
    /// them (one store of a 100,000-file object held the next job's store
    /// for minutes), when the task that ran its last step could run the
    /// next one at once. Tasks on short steps are counted, so a busy
    /// pipeline of short steps hands off as before (each daemon's tasks
    /// keep their own step; running in place there cost a third of the
    /// throughput in `tools/load`).
    fn has_room(&self) -> bool {
        self.tx.len() < self.working.available()
    }
}

/// When each task of one daemon began the work it is doing.
struct Working {
    /// Per task: milliseconds since `epoch`, plus one, when its work
    /// began; 0 while it waits for work.
    since: Vec<AtomicU64>,
    epoch: Instant,
}

impl Working {
    fn new(tasks: usize) -> Working {
        Working {
            since: (0..tasks).map(|_| AtomicU64::new(0)).collect(),
            epoch: Instant::now(),
        }
    }

    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX - 1) + 1
    }

    /// The tasks that wait for work or began theirs less than
    /// [`LONG_STEP`] ago.
    fn available(&self) -> usize {
        let now = self.now();
        let long = u64::try_from(LONG_STEP.as_millis()).unwrap_or(u64::MAX);
        self.since
            .iter()
            .map(|s| s.load(Ordering::Acquire))
            .filter(|&began| began == 0 || now.saturating_sub(began) < long)
            .count()
    }
}

/// Marks a task as working while it lives.
struct Busy(Option<(Arc<Working>, usize)>);

impl Busy {
    fn new(working: Option<&Arc<Working>>, task: u32) -> Busy {
        let task = task as usize;
        match working {
            Some(w) if task < w.since.len() => {
                w.since[task].store(w.now(), Ordering::Release);
                Busy(Some((Arc::clone(w), task)))
            }
            _ => Busy(None),
        }
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        if let Some((w, task)) = &self.0 {
            w.since[*task].store(0, Ordering::Release);
        }
    }
}

/// A job whose lock this worker's session holds, between two of its
/// steps.
struct Chain {
    item: Item,
    /// The job (the item's id).
    jid: Jid,
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
                let working = Arc::new(Working::new((*tasks).max(1) as usize));
                inboxes.insert(state, Inbox { tx, rx, working });
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
    /// that daemon has no room ([`Inbox::has_room`]) or this worker does
    /// not run it, and the caller runs the step itself.
    fn hand_off(&self, chain: Box<Chain>) -> Result<(), Box<Chain>> {
        let Some(inbox) = self.inboxes.get(&chain.state) else {
            return Err(chain);
        };
        if !inbox.has_room() {
            self.stats.busy_handoffs.fetch_add(1, Ordering::Relaxed);
            return Err(chain);
        }
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
    fn note_waiting(&self, jid: Jid, state: JobState, why: &str) -> bool {
        let mut waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        if waiting.get(&jid).map(String::as_str) == Some(why) {
            tracing::debug!(%jid, %state, %why, "the job still waits");
            return false;
        }
        if waiting.len() >= MAX_WAITING_REMEMBERED {
            waiting.clear();
        }
        tracing::info!(%jid, %state, %why, "the job waits");
        waiting.insert(jid, why.to_string());
        self.stats.waiting.store(
            i64::try_from(waiting.len()).unwrap_or(i64::MAX),
            Ordering::Relaxed,
        );
        true
    }

    /// Marks batch `bid` Held: no candidate until the batch-pending lister
    /// sees its status change.
    fn note_held(&self, bid: Bid) {
        self.forget_pending(bid);
        let new = self
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(bid);
        if new {
            self.held_grew.notify_one();
        }
    }

    /// Marks batch `bid` acquired (or gone): never a candidate again.
    fn note_acquired(&self, bid: Bid) {
        self.forget_pending(bid);
        self.acquired
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(bid);
    }

    /// Forgets that batch `bid` was seen pending.
    fn forget_pending(&self, bid: Bid) {
        self.pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&bid);
    }

    /// Forgets that `jid` waited (it moved on).
    fn done_waiting(&self, jid: Jid) {
        let mut waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        if waiting.remove(&jid).is_some() {
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
            let batch = match item.id {
                ItemId::Batch(bid) => Some(bid),
                ItemId::Job(_) => None,
            };
            if batch.is_some_and(|b| {
                acquired.as_ref().is_some_and(|a| a.contains(&b))
                    || held.as_ref().is_some_and(|h| h.contains(&b))
            }) {
                continue;
            }
            if let (Some(grace), Some(since)) = (grace, item.since) {
                let from = since + grace;
                if from > now {
                    next = Some(next.map_or(from, |n| n.min(from)));
                    continue;
                }
            }
            match claims.get(&claim_key(target, item.id)) {
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
        let key = claim_key(target, item.id);
        let tries = match claims.get(&key) {
            Some(Claim::Backoff { tries, .. }) => *tries,
            _ => 0,
        };
        claims.insert(key, Claim::InHand { tries });
        Ok(item)
    }

    /// Settles the claim on `id` after a try: forgotten once the item was
    /// dealt with, else backed off from.
    fn settle(&self, target: Target, id: ItemId, tried: Tried) {
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
    fn linger(&self, target: Target, id: ItemId) {
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

    /// Notes that batch `bid` waits in `status` (from an engine answer; a
    /// `bid` that is not a batch id, as from a server older than the field,
    /// is none).
    fn note_reporting(&self, bid: &str, status: &str) {
        if !self.reports.contains(status) {
            return;
        }
        let Ok(bid) = bid.parse::<Bid>() else {
            return;
        };
        self.note_reporting_bid(bid, status);
    }

    /// [`Shared::note_reporting`] of a batch id.
    fn note_reporting_bid(&self, bid: Bid, status: &str) {
        if !self.reports.contains(status) {
            return;
        }
        let mut queue = self
            .to_report
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if queue.len() < MAX_TO_REPORT && !queue.iter().any(|(b, _)| *b == bid) {
            queue.push_back((bid, status.to_string()));
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
fn claim_key(target: Target, id: ItemId) -> String {
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

/// The id of an item a daemon may take: a job of a job queue, or a batch.
/// Only names that are ids become items (the listers check them at the
/// door), so every path and report built from one is well formed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ItemId {
    /// A job (`jid…`).
    Job(Jid),
    /// A batch (`bid…`).
    Batch(Bid),
}

impl std::fmt::Display for ItemId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ItemId::Job(jid) => jid.fmt(f),
            ItemId::Batch(bid) => bid.fmt(f),
        }
    }
}

/// An item a daemon may take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Item {
    /// The job or batch.
    id: ItemId,
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
    let (inbox, working) = match target {
        Target::Jobs(state) => match shared.inboxes.get(&state) {
            Some(i) => (Some(i.rx.clone()), Some(Arc::clone(&i.working))),
            None => (None, None),
        },
        _ => (None, None),
    };
    while !stop.is_cancelled() {
        // A job handed on by the task that ran its step before comes
        // before the queue: its lock is held already.
        if let Some(chain) = inbox.as_ref().and_then(|rx| rx.try_recv().ok()) {
            let _busy = Busy::new(working.as_ref(), task);
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
                let named: Vec<Bid> = shared
                    .to_report
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .iter()
                    .filter(|(_, s)| s == status)
                    .map(|(b, _)| *b)
                    .collect();
                let mut first: Vec<Item> = named
                    .into_iter()
                    .map(|bid| Item {
                        id: ItemId::Batch(bid),
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
                    queue.retain(|(b, _)| ItemId::Batch(*b) != item.id);
                    if queue.len() < before {
                        named = true;
                        shared.stats.named_reports.fetch_add(1, Ordering::Relaxed);
                    }
                }
                let working = Busy::new(working.as_ref(), task);
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
                drop(working);
                shared.settle(target, item.id, tried);
                if tried == Tried::Done && !matches!(target, Target::PendingBatches) {
                    shared.linger(target, item.id);
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
                let mut took = None;
                tokio::select! {
                    r = listing.changed() => {
                        if r.is_err() {
                            // The lister stopped: so does the task.
                            break;
                        }
                    }
                    Some(chain) = handed => took = Some(chain),
                    () = &mut wake, if reporting => {}
                    () = tokio::time::sleep(wait) => {}
                    () = stop.cancelled() => {}
                }
                if let Some(chain) = took {
                    let _busy = Busy::new(working.as_ref(), task);
                    run_chain(&shared, chain, &stop).await;
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
            shared.settle(Target::Jobs(chain.state), chain.item.id, Tried::Skipped);
        }
    }
    tracing::debug!(daemon = %kind, task, "daemon task stopped");
}

/// How often a daemon's spare looks whether its inbox holds jobs that no
/// task will take soon.
const SPARE_LOOK: Duration = Duration::from_secs(1);

/// Runs the spare of `state`'s daemon until `stop` is cancelled. A job
/// handed to the daemon while one of its tasks was on a short step waits in
/// the inbox; when that step turns out long (a store of a large object) and
/// every task of the daemon is on a long step, the job would wait behind
/// them for as long as they last. The spare takes such jobs and runs each
/// in a task of its own, at most as many at once as the daemon has tasks
/// (the inbox holds no more), so the share of a daemon's work a long step
/// can hold up is bounded by the time a step needs to count as long.
pub async fn run_spare(shared: Arc<Shared>, state: JobState, stop: CancellationToken) {
    let Some(inbox) = shared.inboxes.get(&state) else {
        return;
    };
    let (rx, working) = (inbox.rx.clone(), Arc::clone(&inbox.working));
    let spares = Arc::new(tokio::sync::Semaphore::new(working.since.len()));
    let mut running = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            () = tokio::time::sleep(SPARE_LOOK) => {}
            () = stop.cancelled() => break,
        }
        while running.try_join_next().is_some() {}
        while !rx.is_empty() && working.available() == 0 {
            let Ok(permit) = Arc::clone(&spares).try_acquire_owned() else {
                break;
            };
            let Ok(chain) = rx.try_recv() else {
                break;
            };
            shared.stats.spare_runs.fetch_add(1, Ordering::Relaxed);
            tracing::info!(jid = %chain.item.id, %state, "every task of the daemon is on a long step: its spare runs a job handed to it");
            let (shared, stop) = (Arc::clone(&shared), stop.clone());
            running.spawn(async move {
                run_chain(&shared, chain, &stop).await;
                drop(permit);
            });
        }
    }
    while running.join_next().await.is_some() {}
}

/// Whether the session can do work now (not disconnected, not ended).
fn connected(client: &zk::Client) -> bool {
    matches!(
        client.state(),
        zk::SessionState::SyncConnected | zk::SessionState::ConnectedReadOnly
    )
}

#[cfg(test)]
mod tests;
