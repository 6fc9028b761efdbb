//! Trying an item under its lock and running the chain of steps that one
//! lock carries a job through.

use std::sync::atomic::Ordering;
use std::time::Instant;

use ingest_events::JobState;
use tokio_util::sync::CancellationToken;
use zookeeper_client as zk;

use super::lock::{fresh_secret, let_go, lock_path, release, session_ended, Held, Until};
use super::status::{batch_matches, pending_batch, reached_status, read_status, BatchSeen};
use super::{connected, BoxError, Chain, Item, ItemId, Shared, Stats, Target, Tried};
use crate::step::{ApiCtx, JobCtx, StepResult};
use ingest_client::Reply;
use ingest_projections::layout;
use ingest_protocol::api::{
    AcquireBody, JobMoved, OutcomeBody, OutcomeKind, ReportBody, SessionId, WorkerRef,
};
use ingest_protocol::endpoint::{AcquireBatch, Fenced, JobOutcome, ReportBatch, StartJob};
use ingest_protocol::fence::{FenceSecret, LockNode};

/// Tries `item`: `None` when it was handed, lock held, to a task of the
/// next step's daemon.
/// `named`: an engine answer named this batch as entering its reporting
/// status (the projection may not show it yet).
pub(super) async fn try_item(
    shared: &Shared,
    client: &zk::Client,
    target: Target,
    item: &Item,
    named: bool,
    stop: &CancellationToken,
) -> Result<Option<Tried>, BoxError> {
    let path = lock_path(item.id);
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
                    if let ItemId::Batch(bid) = item.id {
                        shared.note_reporting_bid(bid, status);
                    }
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
    if let (Target::Jobs(first), ItemId::Job(jid)) = (target, item.id) {
        shared.stats.job_locks.fetch_add(1, Ordering::Relaxed);
        match read_status(client, &layout::job_status(jid)).await {
            Ok(s) if s.as_deref() == Some(first.to_string().as_str()) => {}
            other => {
                release(client, &held.path, &held.created).await;
                return other.map(|_| Some(Tried::Skipped));
            }
        }
        let chain = Box::new(Chain {
            item: item.clone(),
            jid,
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
pub(super) async fn run_chain(shared: &Shared, chain: Box<Chain>, stop: &CancellationToken) {
    let id = chain.item.id;
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
    shared.settle(target, id, tried);
    if tried == Tried::Done {
        shared.linger(target, id);
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
    let status_path = layout::job_status(chain.jid);
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
    let ItemId::Batch(bid) = item.id else {
        // Jobs go through `chain_steps`.
        return Ok((Tried::Skipped, Until::Now));
    };
    let batch_ctx = || crate::step::BatchCtx {
        bid,
        zk: client.clone(),
        api: api.clone(),
    };
    match target {
        Target::PendingBatches => {
            match pending_batch(client, bid).await? {
                BatchSeen::Pending => {}
                // Acquired by another worker, or gone: never pending again.
                BatchSeen::Acquired | BatchSeen::Unknown => {
                    shared.note_acquired(bid);
                    return Ok((Tried::Skipped, Until::Now));
                }
                // Parked by a collection hold: a candidate again when it is
                // released.
                BatchSeen::Held => {
                    shared.note_held(bid);
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
                    crate::step::Expansion::Jobs(jobs) => body.jobs = Some(jobs),
                    crate::step::Expansion::Failed(why) => {
                        // The depositor's input quoted: bounded, so the
                        // report fits any server's body limit.
                        body.expansion_error = Some(
                            ingest_protocol::cut(&why, ingest_protocol::MAX_MESSAGE_BYTES)
                                .into_owned(),
                        )
                    }
                }
            }
            let acquire = AcquireBatch(bid);
            let (tried, answer) = match report(shared, &acquire, &held.fence, &body).await {
                // The expansion is more than the server reads in one request:
                // the batch fails once, with a report that fits, instead of
                // being expanded and refused again every turn.
                Err(e) if too_large(&e) && body.jobs.is_some() => {
                    let jobs = body.jobs.take().map_or(0, |j| j.len());
                    tracing::warn!(%bid, jobs, "the batch's expansion is larger than the server accepts; the batch fails");
                    body.expansion_error = Some(format!(
                        "the payload expands into {jobs} job(s), more than the server accepts in one request (413 payload_too_large): split the batch"
                    ));
                    report(shared, &acquire, &held.fence, &body).await?
                }
                other => other?,
            };
            match answer {
                // Its collection is held: the batch went Held, not
                // acquired, and comes back to Pending when released.
                Some(a) if a.status == "Held" => {
                    shared.note_held(bid);
                    let until = Until::Status {
                        path: layout::batch_status(bid),
                        old: "Pending".into(),
                    };
                    Ok((tried, until))
                }
                Some(a) => {
                    shared.note_acquired(bid);
                    if a.status == "Failed" {
                        // Failed as it was acquired (its payload did not
                        // expand): it never enters Reporting, so the
                        // depositor hears of it here.
                        if let Some(work) = &shared.steps.batch {
                            if let Some(e) = work.failed(&batch_ctx(), &a.message).await {
                                tracing::warn!(%bid, error = %ingest_protocol::bounded(&e), "cannot notify the depositor of the batch's failure");
                            }
                        }
                    }
                    Ok((tried, Until::Exists(layout::batch_states(bid))))
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
                reached_status(client, &layout::batch_status(bid), status).await?
            } else {
                batch_matches(client, target, bid).await?
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
            let (tried, _) = report(shared, &ReportBatch(bid), &held.fence, &body).await?;
            if tried == Tried::Done {
                let until = Until::Status {
                    path: layout::batch_status(bid),
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
    let ItemId::Job(jid) = item.id else {
        return Ok((Tried::Skipped, None));
    };
    if state == JobState::Pending {
        return report(shared, &StartJob(jid), &api.fence, who).await;
    }
    let Some(step) = shared.steps.get(state) else {
        return Ok((Tried::Skipped, None));
    };
    let ctx = JobCtx {
        jid,
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
            tracing::warn!(%jid, %state, "the session ended during the step; the step is dropped");
            return Ok((Tried::Refused, None));
        }
    };
    let outcome = match result {
        StepResult::Report(o) => o,
        StepResult::Wait(why) => {
            if shared.note_waiting(jid, state, &why) {
                // Said to the engine when the reason changes, so that
                // `ingest jobs`, `show job` and the UI show it.
                if let Err(e) = shared
                    .engine
                    .job_waiting(jid, &state.to_string(), &why)
                    .await
                {
                    tracing::debug!(%jid, error = %e, "cannot say why the job waits");
                }
            }
            return Ok((Tried::Waited, None));
        }
    };
    shared.done_waiting(jid);
    if outcome.space_needed.is_some() {
        *space_needed = outcome.space_needed;
    }
    if client.state().is_terminated() {
        tracing::warn!(%jid, %state, "the session ended during the step; the result is dropped");
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
    report(shared, &JobOutcome(jid), &api.fence, &body).await
}

/// Counts a step out of [`Stats::in_flight`] when it ends, however it ends.
struct InFlight<'a>(&'a Stats);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Sends a fenced report to `endpoint` (`AcquireBatch`, `ReportBatch`,
/// `StartJob` or `JobOutcome`), with the lock's secret. The answer is
/// decoded as the endpoint's reply, so a server that answers another shape
/// is an error.
pub(super) async fn report<E: Fenced>(
    shared: &Shared,
    endpoint: &E,
    fence: &FenceSecret,
    body: &E::Body,
) -> Result<(Tried, Option<E::Reply>), BoxError> {
    match shared.engine.report(endpoint, fence, body).await? {
        Reply::Done(answer) => {
            shared.stats.accepted.fetch_add(1, Ordering::Relaxed);
            Ok((Tried::Done, Some(answer)))
        }
        Reply::Refused { code, message } => {
            shared.stats.refused.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(path = %endpoint.path(), %code, message = %ingest_protocol::bounded(&message), "the report was refused; its result is discarded");
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
