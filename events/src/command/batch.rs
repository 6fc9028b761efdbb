//! Decisions on batches: submission, acquisition, rejection, reporting,
//! release and deletion.

use uuid::Uuid;

use crate::event::{self, StreamId, Submission};
use crate::ids::{Bid, Jid};
use crate::lifecycle::{BatchState, JobState, Lifecycle, StateKind};
use crate::state::State;

use super::rules::*;
use super::validate::*;
use super::*;

/// A depositor submits a batch.
/// (`Command::SubmitBatch`.)
pub(super) fn submit_batch(
    state: &State,
    _lc: &Lifecycle,
    d: &mut Decision,
    ids: Ids<'_>,
    uuid: &Uuid,
    submission: &Submission,
) -> Result<(), Rejection> {
    validate_submission(submission)?;
    if let Some(bid) = state.uuids.get(uuid) {
        return Err(Rejection::NoChange(format!(
            "a batch with uuid {uuid} already exists ({bid})"
        )));
    }
    let bid = ids.bid(state)?;
    d.push(
        state,
        StreamId::Batch(bid),
        event::BatchSubmitted {
            uuid: *uuid,
            submission: submission.clone(),
        },
    );
    Ok(())
}

/// The batch-pending daemon acquires a batch: Held if its collection is
/// held, else its jobs are created and it goes to Processing (Failed at
/// once when the payload expanded into no jobs).
/// (`Command::AcquireBatch`.)
pub(super) fn acquire_batch(
    state: &State,
    lc: &Lifecycle,
    d: &mut Decision,
    ids: Ids<'_>,
    bid: &Bid,
    jobs: &[JobSpec],
) -> Result<(), Rejection> {
    let b = live_batch(state, *bid)?;
    if park_if_held(state, lc, b, d)? {
        return Ok(());
    }
    for (i, spec) in jobs.iter().enumerate() {
        validate_spec(spec).map_err(|r| match r {
            Rejection::Invalid { field, reason } => Rejection::Invalid {
                field: format!("jobs[{i}].{field}"),
                reason,
            },
            other => other,
        })?;
    }
    let jids = ids.jids(state, jobs.len())?;
    d.push(
        state,
        StreamId::Batch(*bid),
        event::BatchAcquired { jobs: jids.clone() },
    );
    for (jid, spec) in jids.iter().zip(jobs) {
        d.push(state, StreamId::Job(*jid), job_created(b, spec));
    }
    if jobs.is_empty() {
        d.push(
            state,
            StreamId::Batch(*bid),
            event::BatchFailed {
                message: "the payload expanded into no jobs (empty manifest?)".into(),
            },
        );
    }
    Ok(())
}

/// A Merritt batch consumer acquired the batch: Processing with no jobs
/// yet (they come as `CreateJob`), or Held if its collection is held.
/// (`Command::OpenBatch`.)
pub(super) fn open_batch(
    state: &State,
    lc: &Lifecycle,
    d: &mut Decision,
    bid: &Bid,
) -> Result<(), Rejection> {
    let b = live_batch(state, *bid)?;
    if park_if_held(state, lc, b, d)? {
        return Ok(());
    }
    d.push(
        state,
        StreamId::Batch(*bid),
        event::BatchAcquired { jobs: Vec::new() },
    );
    Ok(())
}

/// The batch-pending daemon could not expand the payload (a corrupt
/// manifest, a manifest that cannot be fetched): the batch fails at once
/// with `message` (Held instead if its collection is held).
/// (`Command::RejectBatch`.)
pub(super) fn reject_batch(
    state: &State,
    lc: &Lifecycle,
    d: &mut Decision,
    bid: &Bid,
    message: &str,
) -> Result<(), Rejection> {
    let b = live_batch(state, *bid)?;
    if park_if_held(state, lc, b, d)? {
        return Ok(());
    }
    check_size("message", message.len(), MAX_JOB_FIELD_BYTES)?;
    d.push(
        state,
        StreamId::Batch(*bid),
        event::BatchAcquired { jobs: Vec::new() },
    );
    d.push(
        state,
        StreamId::Batch(*bid),
        event::BatchFailed {
            message: format!("the payload does not expand: {message}"),
        },
    );
    Ok(())
}

/// Adds a job to a batch that is Processing.
/// (`Command::CreateJob`.)
pub(super) fn create_job(
    state: &State,
    _lc: &Lifecycle,
    d: &mut Decision,
    ids: Ids<'_>,
    bid: &Bid,
    spec: &JobSpec,
) -> Result<(), Rejection> {
    let b = live_batch(state, *bid)?;
    if b.status != BatchState::Processing {
        return Err(Rejection::IllegalTransition {
            item: Item::Batch(*bid),
            current: b.status.to_string(),
            requested: "a new job".into(),
            allowed: vec!["jobs are added only while the batch is Processing".into()],
        });
    }
    validate_spec(spec)?;
    let jid = ids.jids(state, 1)?[0];
    d.push(state, StreamId::Job(jid), job_created(b, spec));
    Ok(())
}

/// An admin releases a held batch (once its collection is no longer held).
/// (`Command::ReleaseBatch`.)
pub(super) fn release_batch(
    state: &State,
    lc: &Lifecycle,
    d: &mut Decision,
    bid: &Bid,
    reason: &str,
) -> Result<(), Rejection> {
    let b = live_batch(state, *bid)?;
    if b.status != BatchState::Held {
        return Err(batch_illegal(lc, b, "Pending (a release)"));
    }
    batch_move(lc, b, BatchState::Pending)?;
    if state.held_collections.contains(&b.submission.profile_name) {
        return Err(Rejection::CollectionStillHeld {
            profile: b.submission.profile_name.clone(),
        });
    }
    d.push(
        state,
        StreamId::Batch(*bid),
        event::BatchReleased {
            reason: reason.to_owned(),
        },
    );
    Ok(())
}

/// An admin asks for a new report of a failed batch.
/// (`Command::UpdateReporting`.)
pub(super) fn update_reporting(
    state: &State,
    lc: &Lifecycle,
    d: &mut Decision,
    bid: &Bid,
    reason: &str,
) -> Result<(), Rejection> {
    let b = live_batch(state, *bid)?;
    batch_move(lc, b, BatchState::UpdateReporting)?;
    d.push(
        state,
        StreamId::Batch(*bid),
        event::BatchUpdateReporting {
            reason: reason.to_owned(),
        },
    );
    Ok(())
}

/// An admin deletes a batch and its deletable jobs (soft).
/// (`Command::DeleteBatch`.)
pub(super) fn delete_batch(
    state: &State,
    lc: &Lifecycle,
    d: &mut Decision,
    bid: &Bid,
    reason: &str,
) -> Result<(), Rejection> {
    let b = live_batch(state, *bid)?;
    // A Completed batch may be deleted as Merritt's admin tool offers it
    // ("Queue Del" on Failed and Completed batches: the batch's status
    // only; its completed jobs stay Completed): an admin-only move.
    if !lc.batches.admin_can(b.status, BatchState::Deleted) {
        return Err(batch_illegal(lc, b, BatchState::Deleted.name()));
    }
    let deletable = |s: JobState| lc.jobs.can(s, JobState::Deleted);
    let active: Vec<(Jid, JobState)> = state
        .batch_jobs(b)
        .filter(|j| !j.status.is_finished() && !deletable(j.status))
        .map(|j| (j.jid, j.status))
        .collect();
    if !active.is_empty() {
        return Err(Rejection::ActiveJobs {
            item: Item::Batch(*bid),
            jobs: active,
        });
    }
    for j in state.batch_jobs(b) {
        if deletable(j.status) {
            d.push(
                state,
                StreamId::Job(j.jid),
                event::JobDeleted {
                    from: j.status,
                    reason: format!("batch {bid} deleted: {reason}"),
                },
            );
        }
    }
    d.push(
        state,
        StreamId::Batch(*bid),
        event::BatchDeleted {
            reason: reason.to_owned(),
        },
    );
    Ok(())
}

/// The reporting daemon reports a batch: the report is recorded and the
/// batch ends Completed (every job completed) or Failed.
/// (`Command::ReportBatch`.)
pub(super) fn report_batch(
    state: &State,
    lc: &Lifecycle,
    d: &mut Decision,
    bid: &Bid,
    notification_error: &Option<String>,
) -> Result<(), Rejection> {
    let b = live_batch(state, *bid)?;
    if !matches!(
        b.status,
        BatchState::Reporting | BatchState::UpdateReporting
    ) {
        return Err(batch_illegal(lc, b, "a report"));
    }
    let mut successful = Vec::new();
    let mut failed = Vec::new();
    let mut unfinished = 0usize;
    for j in state.batch_jobs(b) {
        match j.status {
            JobState::Completed => successful.push(j.jid),
            JobState::Failed => failed.push(j.jid),
            JobState::Deleted => {}
            _ => unfinished += 1,
        }
    }
    // Jobs no requeue can recover are named, so the depositor knows which
    // objects must be submitted again.
    let unrecoverable: Vec<String> = state
        .batch_jobs(b)
        .filter(|j| j.status == JobState::Failed && j.failure.is_some_and(|k| !k.recoverable()))
        .map(|j| j.jid.to_string())
        .collect();
    let update = b.status == BatchState::UpdateReporting;
    let (ok_to, fail_to) = (lc.batches.success(b.status), lc.batches.fail(b.status));
    d.push(
        state,
        StreamId::Batch(*bid),
        event::BatchReported {
            successful_jobs: successful.clone(),
            failed_jobs: failed.clone(),
            update,
        },
    );
    let problem = match (notification_error, failed.len(), unfinished) {
        (Some(e), _, _) => Some(format!("the report could not be sent: {e}")),
        (None, 0, 0) => None,
        (None, f, 0) => Some(format!("{f} of {} job(s) failed", successful.len() + f)),
        (None, f, u) => Some(format!("{f} job(s) failed, {u} still at work")),
    };
    let problem = match (problem, unrecoverable.len()) {
        (Some(p), 1..=10) => Some(format!(
            "{p}; {} of them ({}) cannot be requeued: a new submission is required",
            unrecoverable.len(),
            unrecoverable.join(", ")
        )),
        (Some(p), n @ 11..) => Some(format!(
            "{p}; {n} of them ({}, …) cannot be requeued: a new submission is required",
            unrecoverable[..10].join(", ")
        )),
        (p, _) => p,
    };
    match (problem, ok_to, fail_to) {
        (None, Some(BatchState::Completed), _) => d.push(
            state,
            StreamId::Batch(*bid),
            event::BatchCompleted {
                message: format!("{} job(s) completed", successful.len()),
            },
        ),
        (Some(message), _, Some(BatchState::Failed)) => {
            d.push(state, StreamId::Batch(*bid), event::BatchFailed { message })
        }
        _ => return Err(batch_illegal(lc, b, "Completed or Failed")),
    }
    Ok(())
}
