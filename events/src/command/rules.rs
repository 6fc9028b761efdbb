//! The rules every family of decisions shares: finding live items, legal
//! moves and their rejections, the events of a move, holds.

use std::collections::BTreeMap;

use crate::event::{self, JobConfiguration, StreamId};
use crate::ids::{Bid, Jid};
use crate::lifecycle::{BatchState, JobState, Lifecycle, StateKind};
use crate::state::{Batch, Job, State};

use super::*;

/// Where a requeue sends a failed job: the step after its
/// `last_successful_status`, or Pending when it has none (a job that failed
/// before any step succeeded starts over).
///
/// The step after a state is its success successor; for a state without one
/// (Pending, Held) it is the first target that moves forward (not Held,
/// Failed or Deleted): Pending → Estimating, Held → Pending.
pub fn requeue_target(lc: &Lifecycle, job: &Job) -> JobState {
    job.last_successful_status
        .and_then(|s| {
            lc.jobs.success(s).or_else(|| {
                lc.jobs
                    .allowed(s)
                    .iter()
                    .copied()
                    .find(|t| !matches!(t, JobState::Held | JobState::Failed | JobState::Deleted))
            })
        })
        .filter(|t| lc.jobs.can(JobState::Failed, *t))
        .unwrap_or(JobState::Pending)
}

pub(super) fn release_held(
    state: &State,
    lc: &Lifecycle,
    d: &mut Decision,
    profile: &str,
    reason: &str,
    batches: bool,
) {
    for j in state.jobs.values() {
        if j.status == JobState::Held
            && !j.cleaned_up
            && j.configuration.profile_name == profile
            && lc.jobs.can(JobState::Held, JobState::Pending)
        {
            d.push(
                state,
                StreamId::Job(j.jid),
                status_changed(
                    j,
                    JobState::Pending,
                    format!("collection {profile} released: {reason}"),
                    false,
                    None,
                ),
            );
        }
    }
    if batches {
        for b in state.batches.values() {
            if b.status == BatchState::Held && !b.cleaned_up && b.submission.profile_name == profile
            {
                d.push(
                    state,
                    StreamId::Batch(b.bid),
                    event::BatchReleased {
                        reason: format!("collection {profile} released: {reason}"),
                    },
                );
            }
        }
    }
}

/// Moves the batch to Reporting in the same command when the jobs being
/// moved leave none of its jobs at work.
pub(super) fn finish_batch_if_done(
    state: &State,
    d: &mut Decision,
    bid: Bid,
    moved: &[(Jid, JobState)],
) {
    let Some(b) = state.batches.get(&bid) else {
        return;
    };
    if b.status != BatchState::Processing {
        return;
    }
    let overlay: BTreeMap<Jid, JobState> = moved.iter().copied().collect();
    let done = state.batch_jobs(b).all(|j| {
        overlay
            .get(&j.jid)
            .copied()
            .unwrap_or(j.status)
            .is_finished()
    });
    if done {
        let any_failed = state
            .batch_jobs(b)
            .any(|j| overlay.get(&j.jid).copied().unwrap_or(j.status) == JobState::Failed);
        let reason = if any_failed {
            "every job finished, some failed"
        } else {
            "every job finished"
        };
        d.push(
            state,
            StreamId::Batch(bid),
            event::BatchReportingStarted {
                reason: reason.into(),
            },
        );
    }
}

pub(super) fn job_created(b: &Batch, spec: &JobSpec) -> event::JobCreated {
    event::JobCreated {
        bid: b.bid,
        priority: spec.priority.unwrap_or(DEFAULT_PRIORITY),
        configuration: JobConfiguration {
            profile_name: b.submission.profile_name.clone(),
            submitter: b.submission.submitter.clone(),
            payload_url: spec.payload_url.clone(),
            payload_type: spec.payload_type,
            response_type: b.submission.response_type.clone(),
            submission_mode: b.submission.submission_mode,
            digest: spec.digest.clone(),
        },
        identifiers: spec.identifiers.clone(),
        metadata: spec.metadata.clone(),
    }
}

pub(super) fn status_changed(
    j: &Job,
    to: JobState,
    message: String,
    retry: bool,
    priority: Option<u8>,
) -> event::JobStatusChanged {
    event::JobStatusChanged {
        from: j.status,
        to,
        message,
        retry,
        priority,
    }
}

pub(super) fn live_batch(state: &State, bid: Bid) -> Result<&Batch, Rejection> {
    let b = state.batches.get(&bid).ok_or(Rejection::NotFound {
        item: Item::Batch(bid),
    })?;
    if b.cleaned_up {
        return Err(Rejection::CleanedUp {
            item: Item::Batch(bid),
        });
    }
    Ok(b)
}

pub(super) fn live_job(state: &State, jid: Jid) -> Result<&Job, Rejection> {
    let j = state.jobs.get(&jid).ok_or(Rejection::NotFound {
        item: Item::Job(jid),
    })?;
    if j.cleaned_up {
        return Err(Rejection::CleanedUp {
            item: Item::Job(jid),
        });
    }
    Ok(j)
}

/// A job whose data may still be recorded: not in a terminal state.
pub(super) fn changeable_job<'a>(
    state: &'a State,
    lc: &Lifecycle,
    jid: Jid,
) -> Result<&'a Job, Rejection> {
    let j = live_job(state, jid)?;
    if lc.jobs.is_terminal(j.status) {
        return Err(illegal(lc, j, "a data change"));
    }
    Ok(j)
}

pub(super) fn job_move(lc: &Lifecycle, j: &Job, to: JobState) -> Result<(), Rejection> {
    if lc.jobs.can(j.status, to) {
        Ok(())
    } else {
        Err(illegal(lc, j, to.name()))
    }
}

/// A pending batch being acquired parks in Held while its collection is
/// held (`true`: the decision is complete); otherwise it may go on to
/// Processing.
pub(super) fn park_if_held(
    state: &State,
    lc: &Lifecycle,
    b: &Batch,
    d: &mut Decision,
) -> Result<bool, Rejection> {
    batch_move(lc, b, BatchState::Processing)?;
    let profile = &b.submission.profile_name;
    if !state.held_collections.contains(profile) {
        return Ok(false);
    }
    batch_move(lc, b, BatchState::Held)?;
    d.push(
        state,
        StreamId::Batch(b.bid),
        event::BatchHeld {
            reason: format!("collection {profile} is held"),
        },
    );
    Ok(true)
}

pub(super) fn batch_move(lc: &Lifecycle, b: &Batch, to: BatchState) -> Result<(), Rejection> {
    if lc.batches.can(b.status, to) {
        Ok(())
    } else {
        Err(batch_illegal(lc, b, to.name()))
    }
}

pub(super) fn illegal(lc: &Lifecycle, j: &Job, requested: &str) -> Rejection {
    Rejection::IllegalTransition {
        item: Item::Job(j.jid),
        current: j.status.to_string(),
        requested: requested.to_string(),
        allowed: lc.jobs.allowed_names(j.status),
    }
}

pub(super) fn batch_illegal(lc: &Lifecycle, b: &Batch, requested: &str) -> Rejection {
    Rejection::IllegalTransition {
        item: Item::Batch(b.bid),
        current: b.status.to_string(),
        requested: requested.to_string(),
        allowed: lc.batches.allowed_names(b.status),
    }
}

pub(super) fn no_successor(lc: &Lifecycle, j: &Job, which: &str) -> Rejection {
    illegal(lc, j, &format!("its {which} successor (it has none)"))
}
