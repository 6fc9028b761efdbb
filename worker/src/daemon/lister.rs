//! The lister of a queue: one per queue a worker consumes, publishing the
//! queue's listing to the worker's tasks of that queue.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};

use futures_util::{StreamExt as _, TryStreamExt as _};
use ingest_events::{Bid, Jid, JobState};
use ingest_projections::layout;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use zookeeper_client as zk;

use super::status::{BatchSeen, StatusOnly};
use super::{
    BoxError, Item, ItemId, Listing, Shared, Target, CHAINED_RELIST_DEBOUNCE, RELIST_DEBOUNCE,
    RELIST_EVERY, REPORTING_SWEEP,
};
use crate::retry::RetryPolicy;
use ingest_protocol::node::decode;

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
    let mut seen: HashMap<ItemId, Instant> = HashMap::new();
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
                    next.insert(item.id, since);
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
    watched: HashSet<Bid>,
    /// Each watch, resolving to its batch when it fires.
    watches: futures_util::stream::FuturesUnordered<futures_util::future::BoxFuture<'static, Bid>>,
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
        let new: Vec<Bid> = shared
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter(|b| !self.watched.contains(*b))
            .copied()
            .collect();
        for bid in new {
            match client.get_and_watch_data(&layout::batch_status(bid)).await {
                Ok((data, _, watcher)) => {
                    if decode::<StatusOnly>("status", &data).is_ok_and(|n| n.status == "Held") {
                        self.watched.insert(bid);
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
pub(super) fn backlog_delay(target: Target, backlog: usize) -> Duration {
    match target {
        Target::Jobs(_) => {
            Duration::from_millis(u64::try_from(backlog).unwrap_or(u64::MAX)).min(MAX_BACKLOG_DELAY)
        }
        _ => Duration::ZERO,
    }
}

/// The most [`backlog_delay`] adds to a listing's debounce.
pub(super) const MAX_BACKLOG_DELAY: Duration = Duration::from_millis(200);

async fn list(
    shared: &Shared,
    client: &zk::Client,
    target: Target,
) -> Result<(Vec<Item>, Option<zk::OneshotWatcher>), BoxError> {
    match target {
        Target::Jobs(state) => {
            if state == JobState::Pending {
                // A paused queue starts no job: watch the pause lock instead.
                let (paused, watcher) = client.check_and_watch_stat(layout::QUEUE_LOCK).await?;
                if paused.is_some() {
                    return Ok((Vec::new(), Some(watcher)));
                }
            }
            let path = layout::queue(state);
            let (mut names, watcher) = match client.list_and_watch_children(&path).await {
                Ok(r) => r,
                Err(zk::Error::NoNode) => return Ok((Vec::new(), None)),
                Err(e) => return Err(e.into()),
            };
            names.sort();
            Ok((job_items(&names), Some(watcher)))
        }
        Target::PendingBatches => {
            let (bids, watcher) = match client.list_and_watch_children(layout::BATCHES).await {
                Ok(r) => r,
                Err(zk::Error::NoNode) => return Ok((Vec::new(), None)),
                Err(e) => return Err(e.into()),
            };
            let mut bids = batch_ids(bids);
            bids.sort();
            let (unknown, known_pending): (Vec<Bid>, HashSet<Bid>) = {
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
                let listed: HashSet<&Bid> = bids.iter().collect();
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
            let fresh: Vec<Bid> = unknown
                .iter()
                .filter(|b| !known_pending.contains(*b))
                .copied()
                .collect();
            let reads = fresh.into_iter().map(|bid| {
                let client = client.clone();
                async move {
                    let seen = if client
                        .check_stat(&layout::batch_states(bid))
                        .await?
                        .is_some()
                    {
                        BatchSeen::Acquired
                    } else if client
                        .check_stat(&layout::batch_status(bid))
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
            let read: HashMap<Bid, BatchSeen> = futures_util::stream::iter(reads)
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
                            .insert(*bid);
                    }
                    BatchSeen::Pending => {
                        shared
                            .pending
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .insert(*bid);
                        items.push(Item {
                            id: ItemId::Batch(*bid),
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
            tracing::debug!(status = %wanted, batches = page.bids.len(), "reporting sweep");
            let items = page
                .bids
                .into_iter()
                .take(ingest_protocol::api::MAX_REPORTING_LISTED)
                .filter_map(|bid| bid.parse::<Bid>().ok())
                .map(|bid| Item {
                    id: ItemId::Batch(bid),
                    priority: 0,
                    since: None,
                })
                .collect();
            Ok((items, None))
        }
    }
}

/// How many node reads a listing of `/batches` has in flight.
const LIST_READS_IN_FLIGHT: usize = 32;

/// The items of a job queue's children (`PP-jid…`), checked at the door:
/// a name another ZooKeeper client wrote that is not a priority and a job
/// id is left out (it used to become an item whose id went into every
/// path and report of the job's chain).
pub(super) fn job_items(names: &[String]) -> Vec<Item> {
    names
        .iter()
        .filter_map(|n| {
            let (p, jid) = n.split_once('-')?;
            let jid: Jid = jid.parse().ok()?;
            Some(Item {
                id: ItemId::Job(jid),
                priority: p.parse().ok()?,
                since: None,
            })
        })
        .collect()
}

/// The batch ids among `/batches`' children, checked at the door: any
/// other name (the engine's own scratch nodes, or one another client wrote)
/// is left out.
pub(super) fn batch_ids(names: Vec<String>) -> Vec<Bid> {
    names
        .into_iter()
        .filter_map(|b| b.parse::<Bid>().ok())
        .collect()
}
