//! Decisions on jobs: the steps' reports, moves, requeue, holds and
//! deletion.

use crate::event::{self, FailureKind, Identifiers, InventoryParams, StoreParams, StreamId};
use crate::ids::Jid;
use crate::lifecycle::{BatchState, JobState, Lifecycle, StateKind};
use crate::state::State;

use super::rules::*;
use super::validate::*;
use super::*;

/// The job-pending daemon acquires a job: Held if its collection is held,
/// else Estimating. Refused while the queue is paused.
/// (`Command::StartJob`.)
pub(super) fn start_job(
    state: &State,
    lc: &Lifecycle,
    d: &mut Decision,
    jid: &Jid,
) -> Result<(), Rejection> {
    let j = live_job(state, *jid)?;
    // The lifecycle lets Failed go to Estimating (a requeue's target), but
    // a start is not a requeue: it would skip the retry count, and the
    // refusal of a failure no requeue recovers.
    if j.status == JobState::Failed {
        return Err(refused_out_of_failed(lc, j, "a start"));
    }
    job_move(lc, j, JobState::Estimating)?;
    let profile = &j.configuration.profile_name;
    if state.held_collections.contains(profile) {
        job_move(lc, j, JobState::Held)?;
        d.push(
            state,
            StreamId::Job(*jid),
            status_changed(
                j,
                JobState::Held,
                format!("collection {profile} is held"),
                false,
                None,
            ),
        );
    } else if state.paused {
        return Err(Rejection::QueuePaused {
            item: Item::Job(*jid),
        });
    } else {
        d.push(
            state,
            StreamId::Job(*jid),
            status_changed(j, JobState::Estimating, String::new(), false, None),
        );
    }
    Ok(())
}

/// A step reports its outcome, or an admin forces a move.
/// (`Command::SetJobStatus`.)
pub(super) fn set_job_status(
    state: &State,
    lc: &Lifecycle,
    d: &mut Decision,
    jid: &Jid,
    target: &Target,
    message: &str,
    priority: &Option<u8>,
) -> Result<(), Rejection> {
    let j = live_job(state, *jid)?;
    let to = match target {
        Target::To(s) => *s,
        Target::Success => lc
            .jobs
            .success(j.status)
            .ok_or_else(|| no_successor(lc, j, "success"))?,
        Target::Fail => lc
            .jobs
            .fail(j.status)
            .ok_or_else(|| no_successor(lc, j, "fail"))?,
    };
    job_move(lc, j, to)?;
    // Moves with rules of their own go through their own command, so
    // an explicit target cannot skip them.
    if j.status == JobState::Failed && to != JobState::Deleted {
        return Err(refused_out_of_failed(
            lc,
            j,
            &format!("{to} by a status change"),
        ));
    }
    if j.status == JobState::Pending && to == JobState::Estimating {
        let profile = &j.configuration.profile_name;
        if state.held_collections.contains(profile) {
            return Err(Rejection::CollectionStillHeld {
                profile: profile.clone(),
            });
        }
        if state.paused {
            return Err(Rejection::QueuePaused {
                item: Item::Job(*jid),
            });
        }
    }
    if let Some(p) = priority {
        check_priority(*p)?;
        if to == JobState::Deleted {
            return Err(Rejection::Invalid {
                field: "priority".into(),
                reason: "a deleted job keeps its priority; do not set one with a delete".into(),
            });
        }
    }
    if to == JobState::Deleted {
        d.push(
            state,
            StreamId::Job(*jid),
            event::JobDeleted {
                from: j.status,
                reason: message.to_owned(),
            },
        );
    } else {
        d.push(
            state,
            StreamId::Job(*jid),
            status_changed(j, to, message.to_owned(), false, *priority),
        );
    }
    finish_batch_if_done(state, d, j.bid, &[(*jid, to)]);
    Ok(())
}

/// The refusal of `requested`, a move of the Failed job `j` other than its
/// requeue or delete: naming the requeue's target, or, for a failure no
/// requeue recovers, only Deleted.
fn refused_out_of_failed(lc: &Lifecycle, j: &crate::state::Job, requested: &str) -> Rejection {
    Rejection::IllegalTransition {
        item: Item::Job(j.jid),
        current: j.status.to_string(),
        requested: requested.to_string(),
        allowed: match j.failure.filter(|k| !k.recoverable()) {
            Some(kind) => vec![format!(
                "Deleted (it failed with {kind}: {})",
                kind.remedy()
            )],
            None => vec![
                format!(
                    "a requeue (resumes at {}, retry_count + 1)",
                    requeue_target(lc, j)
                ),
                "Deleted".into(),
            ],
        },
    }
}

/// What a step hands on with its outcome (`Command::StepOutcome`'s data).
pub(super) struct Handoffs<'a> {
    pub(super) priority: &'a Option<u8>,
    pub(super) space_needed: &'a Option<u64>,
    pub(super) identifiers: &'a Option<Identifiers>,
    pub(super) store: &'a Option<StoreParams>,
    pub(super) inventory: &'a Option<InventoryParams>,
    pub(super) failure: &'a Option<FailureKind>,
}

/// A worker reports the outcome of the step it did, with the data the
/// step recorded, as ONE command: the data events and the move are
/// appended atomically, and a report for a state the job has left is
/// refused as stale (so a duplicated report cannot move a job twice).
/// (`Command::StepOutcome`.)
pub(super) fn step_outcome(
    state: &State,
    lc: &Lifecycle,
    d: &mut Decision,
    (jid, reported, success, message): (&Jid, &JobState, &bool, &str),
    handoffs: Handoffs<'_>,
) -> Result<(), Rejection> {
    let Handoffs {
        priority,
        space_needed,
        identifiers,
        store,
        inventory,
        failure,
    } = handoffs;
    let j = live_job(state, *jid)?;
    if j.status != *reported {
        return Err(Rejection::StaleReport {
            item: Item::Job(*jid),
            current: j.status.to_string(),
            reported: reported.to_string(),
        });
    }
    let to = if *success {
        lc.jobs
            .success(j.status)
            .ok_or_else(|| no_successor(lc, j, "success"))?
    } else {
        lc.jobs
            .fail(j.status)
            .ok_or_else(|| no_successor(lc, j, "fail"))?
    };
    job_move(lc, j, to)?;
    if let Some(p) = priority {
        check_priority(*p)?;
    }
    let stream = StreamId::Job(*jid);
    // A report that restates what the job already has (the ark the
    // minting route recorded, a re-measured size that did not change)
    // appends nothing for it.
    if let Some(space_needed) = space_needed.filter(|s| *s != j.space_needed) {
        d.push(
            state,
            stream,
            event::JobSpaceEstimated {
                space_needed,
                priority: None,
            },
        );
    }
    if let Some(ids) = identifiers.as_ref().filter(|ids| **ids != j.identifiers) {
        validate_identifiers(ids)?;
        d.push(
            state,
            stream,
            event::JobIdentifiersAssigned {
                identifiers: ids.clone(),
            },
        );
    }
    if let Some(store) = store {
        d.push(
            state,
            stream,
            event::JobStoreRecorded {
                store: store.clone(),
            },
        );
    }
    if let Some(inventory) = inventory {
        d.push(
            state,
            stream,
            event::JobInventoryRecorded {
                inventory: inventory.clone(),
            },
        );
    }
    d.push(
        state,
        stream,
        status_changed(j, to, message.to_owned(), false, *priority),
    );
    // The kind of the failure is its own record, right after the move to
    // Failed: `decide` refuses a kind with a success, and a fail successor
    // that is not Failed (a lifecycle file's choice) carries no kind.
    if let Some(kind) = failure.filter(|_| !*success && to == JobState::Failed) {
        d.push(state, stream, event::JobFailureClassified { kind });
    }
    finish_batch_if_done(state, d, j.bid, &[(*jid, to)]);
    Ok(())
}

/// The estimating step records the space a job needs.
/// (`Command::RecordSpace`.)
pub(super) fn record_space(
    state: &State,
    lc: &Lifecycle,
    d: &mut Decision,
    jid: &Jid,
    space_needed: &u64,
    priority: &Option<u8>,
) -> Result<(), Rejection> {
    let j = changeable_job(state, lc, *jid)?;
    if let Some(p) = priority {
        check_priority(*p)?;
    }
    d.push(
        state,
        StreamId::Job(j.jid),
        event::JobSpaceEstimated {
            space_needed: *space_needed,
            priority: *priority,
        },
    );
    Ok(())
}

/// The processing step records the job's ark and local ids.
/// (`Command::RecordIdentifiers`.)
pub(super) fn record_identifiers(
    state: &State,
    lc: &Lifecycle,
    d: &mut Decision,
    jid: &Jid,
    identifiers: &Identifiers,
) -> Result<(), Rejection> {
    let j = changeable_job(state, lc, *jid)?;
    validate_identifiers(identifiers)?;
    d.push(
        state,
        StreamId::Job(j.jid),
        event::JobIdentifiersAssigned {
            identifiers: identifiers.clone(),
        },
    );
    Ok(())
}

/// The storage step's parameters.
/// (`Command::RecordStore`.)
pub(super) fn record_store(
    state: &State,
    lc: &Lifecycle,
    d: &mut Decision,
    jid: &Jid,
    store: &StoreParams,
) -> Result<(), Rejection> {
    let j = changeable_job(state, lc, *jid)?;
    d.push(
        state,
        StreamId::Job(j.jid),
        event::JobStoreRecorded {
            store: store.clone(),
        },
    );
    Ok(())
}

/// The inventory step's parameters.
/// (`Command::RecordInventory`.)
pub(super) fn record_inventory(
    state: &State,
    lc: &Lifecycle,
    d: &mut Decision,
    jid: &Jid,
    inventory: &InventoryParams,
) -> Result<(), Rejection> {
    let j = changeable_job(state, lc, *jid)?;
    d.push(
        state,
        StreamId::Job(j.jid),
        event::JobInventoryRecorded {
            inventory: inventory.clone(),
        },
    );
    Ok(())
}

/// A step hit a recoverable error and tries again.
/// (`Command::RecordStepRetry`.)
pub(super) fn record_step_retry(
    state: &State,
    lc: &Lifecycle,
    d: &mut Decision,
    jid: &Jid,
    attempt: &u32,
    message: &str,
) -> Result<(), Rejection> {
    let j = changeable_job(state, lc, *jid)?;
    if !j.status.is_active() {
        return Err(Rejection::IllegalTransition {
            item: Item::Job(*jid),
            current: j.status.to_string(),
            requested: "a step retry".into(),
            allowed: vec!["retries are recorded only while a step is at work".into()],
        });
    }
    d.push(
        state,
        StreamId::Job(j.jid),
        event::JobStepRetried {
            state: j.status,
            attempt: *attempt,
            message: message.to_owned(),
        },
    );
    Ok(())
}

/// An admin requeues a failed job at the step after its `last_successful_status`.
/// (`Command::RequeueJob`.)
pub(super) fn requeue_job(
    state: &State,
    lc: &Lifecycle,
    d: &mut Decision,
    jid: &Jid,
    reason: &str,
) -> Result<(), Rejection> {
    let j = live_job(state, *jid)?;
    if j.status != JobState::Failed {
        return Err(Rejection::IllegalTransition {
            item: Item::Job(*jid),
            current: j.status.to_string(),
            requested: "a requeue".into(),
            allowed: vec!["only Failed jobs are requeued".into()],
        });
    }
    // The transitions document: a payload whose digest does not match the
    // depositor's fails the job with no recovery; a new submission is
    // required. Every path that moves a Failed job back (API, CLI, admin
    // UI) is this command.
    if let Some(kind) = j.failure.filter(|k| !k.recoverable()) {
        return Err(Rejection::UnrecoverableFailure {
            item: Item::Job(*jid),
            kind,
        });
    }
    // While its batch is being reported, a job requeued would run after a
    // report that already counted it as failed, and the report would be
    // overtaken (before: "0 successful, 0 failed" and the batch Failed while
    // the job ran). The requeue waits for the report: once the batch is
    // Completed or Failed, a requeue sends it to UpdateReporting.
    if let Some(b) = state.batches.get(&j.bid) {
        if matches!(
            b.status,
            BatchState::Reporting | BatchState::UpdateReporting
        ) {
            return Err(Rejection::IllegalTransition {
                item: Item::Job(*jid),
                current: j.status.to_string(),
                requested: "a requeue".into(),
                allowed: vec![format!(
                    "none while its batch {} is {}: requeue once the batch's report is done",
                    j.bid, b.status
                )],
            });
        }
    }
    let to = requeue_target(lc, j);
    job_move(lc, j, to)?;
    d.push(
        state,
        StreamId::Job(*jid),
        status_changed(j, to, reason.to_owned(), true, None),
    );
    Ok(())
}

/// An admin holds a pending job.
/// (`Command::HoldJob`.)
pub(super) fn hold_job(
    state: &State,
    lc: &Lifecycle,
    d: &mut Decision,
    jid: &Jid,
    reason: &str,
) -> Result<(), Rejection> {
    let j = live_job(state, *jid)?;
    job_move(lc, j, JobState::Held)?;
    d.push(
        state,
        StreamId::Job(*jid),
        status_changed(j, JobState::Held, reason.to_owned(), false, None),
    );
    Ok(())
}

/// An admin releases a held job.
/// (`Command::ReleaseJob`.)
pub(super) fn release_job(
    state: &State,
    lc: &Lifecycle,
    d: &mut Decision,
    jid: &Jid,
    reason: &str,
) -> Result<(), Rejection> {
    let j = live_job(state, *jid)?;
    if j.status != JobState::Held {
        return Err(illegal(lc, j, "Pending (a release)"));
    }
    job_move(lc, j, JobState::Pending)?;
    // One rule for releasing a job and a batch (the transitions document's
    // "after confirming that the target collection is no longer Held"):
    // refused while the collection is held, where the release would only
    // be undone when the job starts. `collection PROFILE release-jobs` is
    // the collection-wide action for releasing them under a hold.
    let profile = &j.configuration.profile_name;
    if state.held_collections.contains(profile) {
        return Err(Rejection::CollectionStillHeld {
            profile: profile.clone(),
        });
    }
    d.push(
        state,
        StreamId::Job(*jid),
        status_changed(j, JobState::Pending, reason.to_owned(), false, None),
    );
    Ok(())
}

/// An admin deletes a job (soft: status Deleted, its history and stored
/// object kept): a move of the lifecycle's table or an admin-only one (a
/// Completed job, as mrt-zk's `Job.delete` allows and Merritt's admin tool
/// offers, "Queue Del"; [`JobState::ADMIN_MOVES`]).
/// (`Command::DeleteJob`.)
pub(super) fn delete_job(
    state: &State,
    lc: &Lifecycle,
    d: &mut Decision,
    jid: &Jid,
    reason: &str,
) -> Result<(), Rejection> {
    let j = live_job(state, *jid)?;
    if !lc.jobs.admin_can(j.status, JobState::Deleted) {
        return Err(illegal(lc, j, JobState::Deleted.name()));
    }
    d.push(
        state,
        StreamId::Job(*jid),
        event::JobDeleted {
            from: j.status,
            reason: reason.to_owned(),
        },
    );
    finish_batch_if_done(state, d, j.bid, &[(*jid, JobState::Deleted)]);
    Ok(())
}
