//! The access (assembly) daemons: one loop per task over `/access/small` or
//! `/access/large`, as mrt-store's consumer takes requests
//! (`Access.acquirePendingAssembly`): the children in sorted order, the
//! first Pending one whose ephemeral `lock` this session can create. A
//! Processing one whose lock this session can create is taken too: its
//! worker died, and nobody else would ever finish it. While
//! `/locks/queue/accessSmall` (or `accessLarge`) exists the queue is paused
//! and nothing is taken.
//!
//! The lock holds a [`LockNode`] with the digest of a fresh secret, and the
//! start and outcome reports carry the secret, so the engine accepts them
//! only from the holder (as for jobs). With the real steps the request is
//! assembled from the storage targets into the delivery area
//! ([`crate::real::assembly`]) and the outcome names the delivery; with the
//! simulated steps it succeeds, unless the request's token begins with
//! [`SIMULATED_FAILURE_PREFIX`], which asks for a failure.

use std::sync::Arc;
use std::time::Duration;

use ingest_client::Reply;
use ingest_config::DaemonKind;
use ingest_events::event::AccessQueue;
use ingest_events::Qid;
use ingest_projections::layout;
use ingest_protocol::access::{AccessOutcomeBody, AccessProgressBody};
use ingest_protocol::api::{OutcomeKind, SessionId, WorkerRef};
use ingest_protocol::endpoint::{AccessOutcome, ReportProgress, StartAccess};
use ingest_protocol::fence::{FenceSecret, LockNode};
use ingest_protocol::node::{decode, AccessStatusNode, AccessTokenNode};
use ingest_steps::assemble::Progress;
use tokio_util::sync::CancellationToken;
use zookeeper_client as zk;

use crate::daemon::{fresh_secret, release, Shared};
use crate::step::AccessEnded;

/// A token beginning with this asks the simulated assembly to fail.
pub const SIMULATED_FAILURE_PREFIX: &str = "simulate-failure";

/// How long the loop waits before looking again at an idle or paused queue.
const IDLE: Duration = Duration::from_millis(200);

/// The least time between two progress reports of one assembly.
const PROGRESS_EVERY: Duration = Duration::from_secs(1);

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The queue an access daemon consumes (the small one for any other kind).
pub fn queue_of(kind: DaemonKind) -> AccessQueue {
    match kind {
        DaemonKind::AccessLarge => AccessQueue::Large,
        _ => AccessQueue::Small,
    }
}

/// Runs one task of the access daemon of `queue` until `stop`.
pub async fn run(shared: Arc<Shared>, queue: AccessQueue, task: u32, stop: CancellationToken) {
    tracing::debug!(queue = %queue, task, "access daemon task started");
    while !stop.is_cancelled() {
        let took = match shared.session.client().await {
            Ok(client) => match take_one(&shared, &client, queue).await {
                Ok(took) => took,
                Err(e) => {
                    tracing::warn!(queue = %queue, error = %ingest_protocol::bounded(&e), "the access queue could not be read; trying again");
                    false
                }
            },
            Err(e) => {
                tracing::debug!(error = %ingest_protocol::bounded(&e), "no ZooKeeper session yet");
                false
            }
        };
        if !took {
            tokio::select! {
                () = tokio::time::sleep(IDLE) => {}
                () = stop.cancelled() => {}
            }
        }
    }
}

/// Takes, assembles and reports the first Pending (or lockless
/// Processing) request this session can lock and the engine lets it start;
/// whether it took one.
async fn take_one(
    shared: &Shared,
    client: &zk::Client,
    queue: AccessQueue,
) -> Result<bool, BoxError> {
    if client
        .check_stat(&layout::access_queue_lock(queue))
        .await?
        .is_some()
    {
        return Ok(false);
    }
    let dir = layout::access_queue(queue);
    let mut children = match client.list_children(&dir).await {
        Ok(c) => c,
        Err(zk::Error::NoNode) => return Ok(false),
        Err(e) => return Err(e.into()),
    };
    children.sort();
    for qid in children {
        // A child that is no request id was written by someone else: a
        // request id is what the engine's routes take.
        let Ok(id) = qid.parse::<Qid>() else {
            continue;
        };
        if !takeable(status(client, queue, id).await.as_deref()) {
            continue;
        }
        let fence = fresh_secret()?;
        let data = LockNode::new(&shared.name, &fence).to_bytes();
        let ephemeral = ingest_projections::acl::lock_options();
        let lock = layout::access_lock(queue, id);
        let created = match client.create(&lock, &data, &ephemeral).await {
            Ok((stat, _)) => stat,
            Err(zk::Error::NodeExists | zk::Error::NoNode) => continue,
            Err(e) => return Err(e.into()),
        };
        let result = assemble(shared, client, (queue, id), &fence).await;
        release(client, &lock, &created).await;
        if result? {
            return Ok(true);
        }
        // Not started (the engine has it in another state than the tree
        // says, or it moved meanwhile): the next request is looked at, so
        // one the projection shows stale never starves the rest of the
        // queue nor spins this loop.
    }
    Ok(false)
}

/// Whether a request with this status is taken once its lock is created: a
/// Pending one, or a Processing one whose lock was free (the worker that
/// took it died with its session), as a job in a step is taken again.
fn takeable(status: Option<&str>) -> bool {
    matches!(status, Some("Pending" | "Processing"))
}

/// The request's status, or `None` when its node is missing or unreadable
/// (a node written by someone else is skipped, not fatal).
async fn status(client: &zk::Client, queue: AccessQueue, qid: Qid) -> Option<String> {
    let (data, _) = client
        .get_data(&layout::access_status(queue, qid))
        .await
        .ok()?;
    decode::<AccessStatusNode>("/access/QUEUE/QID/status", &data)
        .ok()
        .map(|n| n.status)
}

/// Starts, assembles and reports one locked request; whether the engine
/// let it start.
async fn assemble(
    shared: &Shared,
    client: &zk::Client,
    (queue, id): (AccessQueue, Qid),
    fence: &FenceSecret,
) -> Result<bool, BoxError> {
    let qid = id;
    // Re-checked under the lock: another worker may have taken it between
    // the listing and the lock.
    if !takeable(status(client, queue, id).await.as_deref()) {
        return Ok(false);
    }
    let session_id = SessionId(client.session_id().0);
    let who = WorkerRef {
        worker: shared.name.clone(),
        session_id,
    };
    let started = shared.engine.report(&StartAccess(qid), fence, &who).await?;
    if let Reply::Refused { code, message } = started {
        tracing::info!(%qid, %code, message = %ingest_protocol::bounded(&message), "the access request was not started");
        return Ok(false);
    }
    let token = match client.get_data(&layout::access_token(queue, id)).await {
        Ok((data, _)) => decode::<AccessTokenNode>("/access/QUEUE/QID/token", &data).ok(),
        Err(_) => None,
    };
    let (outcome, message, delivery) = match (&token, &shared.steps.access) {
        (None, _) => (
            OutcomeKind::Failure,
            "the request's token node is missing or unreadable".to_string(),
            None,
        ),
        (Some(t), Some(assembler)) => {
            let assembler = Arc::clone(assembler);
            let t = t.clone();
            let (told, mut heard) = tokio::sync::watch::channel(None::<Progress>);
            let mut assembling = tokio::task::spawn_blocking(move || {
                let observe = |p: &Progress| {
                    told.send_replace(Some(p.clone()));
                };
                assembler.assemble(&t, Some(&observe))
            });
            let report = Reporter {
                shared,
                qid,
                fence,
                session_id,
            };
            match report.while_assembling(&mut assembling, &mut heard).await {
                Ok(Ok(done)) => {
                    let message = if done.failed_over.is_empty() {
                        format!("assembled from {}", done.delivery.target)
                    } else {
                        format!(
                            "assembled from {} after: {}",
                            done.delivery.target,
                            done.failed_over.join("; ")
                        )
                    };
                    (
                        OutcomeKind::Success,
                        ingest_protocol::cut(&message, 2048).into_owned(),
                        Some(done.delivery),
                    )
                }
                Ok(Err(e)) => (
                    OutcomeKind::Failure,
                    ingest_protocol::cut(&e.to_string(), 2048).into_owned(),
                    None,
                ),
                Err(e) => (
                    OutcomeKind::Failure,
                    format!("the assembly task failed: {e}"),
                    None,
                ),
            }
        }
        (Some(t), None) => {
            // The simulated assembly: as long as a simulated step (`--step-ms`).
            tokio::time::sleep(shared.steps.simulated_assembly).await;
            if t.token.starts_with(SIMULATED_FAILURE_PREFIX) {
                (
                    OutcomeKind::Failure,
                    "simulated assembly failure (asked for by the token)".to_string(),
                    None,
                )
            } else {
                (OutcomeKind::Success, String::new(), None)
            }
        }
    };
    let body = AccessOutcomeBody {
        worker: shared.name.clone(),
        session_id,
        outcome,
        message,
        delivery,
    };
    match shared
        .engine
        .report(&AccessOutcome(qid), fence, &body)
        .await?
    {
        Reply::Done(moved) => {
            tracing::info!(%qid, status = %moved.request.status, "assembly reported");
            // Told once the engine recorded the outcome, so the URL named
            // is one the server answers.
            if let (Some(notifier), Some(token)) = (&shared.steps.access_notify, &token) {
                let qid_text = qid.to_string();
                let ended = AccessEnded {
                    qid: &qid_text,
                    token,
                    delivery: body.delivery.as_ref(),
                    message: &body.message,
                };
                match notifier.notify(&shared.engine, ended).await {
                    Ok(done) => tracing::info!(%qid, %done, "access request notified"),
                    Err(e) => {
                        tracing::warn!(%qid, error = %ingest_protocol::bounded(&e), "the access request's notification failed")
                    }
                }
            }
        }
        Reply::Refused { code, message } => {
            tracing::warn!(%qid, %code, message = %ingest_protocol::bounded(&message), "the assembly's outcome was refused");
        }
    }
    Ok(true)
}

/// Tells the engine how far one assembly got.
struct Reporter<'a> {
    shared: &'a Shared,
    qid: Qid,
    fence: &'a FenceSecret,
    session_id: SessionId,
}

impl Reporter<'_> {
    /// Waits for `assembling` to end, reporting what `heard` says of its
    /// progress: the first news at once, then at most once every
    /// [`PROGRESS_EVERY`]. A report the engine refuses or cannot take is
    /// logged and the assembly goes on.
    async fn while_assembling<T>(
        &self,
        assembling: &mut tokio::task::JoinHandle<T>,
        heard: &mut tokio::sync::watch::Receiver<Option<Progress>>,
    ) -> Result<T, tokio::task::JoinError> {
        let mut next = tokio::time::Instant::now();
        let mut news = false;
        loop {
            tokio::select! {
                ended = &mut *assembling => return ended,
                changed = heard.changed(), if !news => {
                    if changed.is_err() {
                        // The assembly let its observer go: it is ending.
                        return assembling.await;
                    }
                    news = true;
                }
                () = tokio::time::sleep_until(next), if news => {
                    news = false;
                    let latest = heard.borrow_and_update().clone();
                    if let Some(p) = latest {
                        self.send(p).await;
                    }
                    next = tokio::time::Instant::now() + PROGRESS_EVERY;
                }
            }
        }
    }

    async fn send(&self, p: Progress) {
        let body = AccessProgressBody {
            worker: self.shared.name.clone(),
            session_id: self.session_id,
            target: p.target,
            files: p.files,
            bytes: p.bytes,
        };
        match self
            .shared
            .engine
            .report(&ReportProgress(self.qid), self.fence, &body)
            .await
        {
            Ok(Reply::Done(_)) => {
                tracing::debug!(qid = %self.qid, files = body.files, bytes = body.bytes, "assembly progress reported")
            }
            Ok(Reply::Refused { code, message }) => {
                tracing::info!(qid = %self.qid, %code, message = %ingest_protocol::bounded(&message), "the assembly's progress was refused")
            }
            Err(e) => {
                tracing::warn!(qid = %self.qid, error = %ingest_protocol::bounded(&e), "the assembly's progress could not be reported; the assembly goes on")
            }
        }
    }
}
