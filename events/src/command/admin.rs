//! Queue-wide and collection-wide decisions: holds, pause, repairs,
//! cleanup.

use chrono::{DateTime, Utc};

use crate::event::{self, StreamId};
use crate::lifecycle::{Lifecycle, StateKind};
use crate::state::State;

use super::rules::*;
use super::validate::*;
use super::*;

/// An admin holds a collection.
/// (`Command::HoldCollection`.)
pub(super) fn hold_collection(
    state: &State,
    _lc: &Lifecycle,
    d: &mut Decision,
    profile: &str,
    reason: &str,
) -> Result<(), Rejection> {
    check_profile(profile)?;
    if state.held_collections.contains(profile) {
        return Err(Rejection::NoChange(format!(
            "collection {profile} is already held"
        )));
    }
    d.push(
        state,
        StreamId::System,
        event::CollectionHeld {
            profile: profile.to_owned(),
            reason: reason.to_owned(),
        },
    );
    Ok(())
}

/// An admin releases a collection, and with it every held job and batch of it.
/// (`Command::ReleaseCollection`.)
pub(super) fn release_collection(
    state: &State,
    lc: &Lifecycle,
    d: &mut Decision,
    profile: &str,
    reason: &str,
) -> Result<(), Rejection> {
    check_profile(profile)?;
    if !state.held_collections.contains(profile) {
        return Err(Rejection::NoChange(format!(
            "collection {profile} is not held"
        )));
    }
    d.push(
        state,
        StreamId::System,
        event::CollectionReleased {
            profile: profile.to_owned(),
            reason: reason.to_owned(),
        },
    );
    release_held(state, lc, d, profile, reason, true);
    Ok(())
}

/// An admin releases every held job of a collection (the hold itself stays).
/// (`Command::ReleaseHeldJobs`.)
pub(super) fn release_held_jobs(
    state: &State,
    lc: &Lifecycle,
    d: &mut Decision,
    profile: &str,
    reason: &str,
) -> Result<(), Rejection> {
    check_profile(profile)?;
    release_held(state, lc, d, profile, reason, false);
    if d.events.is_empty() {
        return Err(Rejection::NoChange(format!(
            "collection {profile} has no held jobs"
        )));
    }
    Ok(())
}

/// The most faults one action may arm.
pub const MAX_FAULTS: u32 = 1000;

/// An admin arms faults. (`Command::ArmFaults`.)
pub(super) fn arm_faults(
    state: &State,
    d: &mut Decision,
    step: JobState,
    count: u32,
    reason: &str,
) -> Result<(), Rejection> {
    // A fault turns a step's success report into a failure: in a state
    // without a step no report comes, and the fault would stay armed.
    if !step.has_step() {
        let names: Vec<&str> = JobState::WITH_STEP.iter().map(|s| s.name()).collect();
        let (last, rest) = names.split_last().unwrap_or((&"", &[]));
        return Err(Rejection::Invalid {
            field: "state".into(),
            reason: format!(
                "{step} has no step a worker runs; faults go to {} or {last}",
                rest.join(", ")
            ),
        });
    }
    if count == 0 || count > MAX_FAULTS {
        return Err(Rejection::Invalid {
            field: "count".into(),
            reason: format!("{count} is outside 1-{MAX_FAULTS}"),
        });
    }
    d.push(
        state,
        StreamId::System,
        event::FaultsArmed {
            state: step,
            count,
            reason: reason.to_owned(),
        },
    );
    Ok(())
}

/// An admin disarms every fault. (`Command::ClearFaults`.)
pub(super) fn clear_faults(state: &State, d: &mut Decision) -> Result<(), Rejection> {
    let disarmed: u32 = state.armed_faults().values().sum();
    if disarmed == 0 {
        return Err(Rejection::NoChange("no fault is armed".into()));
    }
    d.push(state, StreamId::System, event::FaultsCleared { disarmed });
    Ok(())
}

/// An admin pauses the ingest queue.
/// (`Command::PauseQueue`.)
pub(super) fn pause_queue(
    state: &State,
    _lc: &Lifecycle,
    d: &mut Decision,
    reason: &str,
) -> Result<(), Rejection> {
    if state.paused {
        return Err(Rejection::NoChange(
            "the ingest queue is already paused".into(),
        ));
    }
    d.push(
        state,
        StreamId::System,
        event::QueuePaused {
            reason: reason.to_owned(),
        },
    );
    Ok(())
}

/// An admin resumes the ingest queue.
/// (`Command::ResumeQueue`.)
pub(super) fn resume_queue(
    state: &State,
    _lc: &Lifecycle,
    d: &mut Decision,
    reason: &str,
) -> Result<(), Rejection> {
    if !state.paused {
        return Err(Rejection::NoChange("the ingest queue is not paused".into()));
    }
    d.push(
        state,
        StreamId::System,
        event::QueueResumed {
            reason: reason.to_owned(),
        },
    );
    Ok(())
}

/// An admin repaired drift between the live ZooKeeper tree and the log;
/// records which paths were repaired.
/// (`Command::RecordRepair`.)
pub(super) fn record_repair(
    state: &State,
    _lc: &Lifecycle,
    d: &mut Decision,
    paths: &[String],
) -> Result<(), Rejection> {
    if paths.is_empty() {
        return Err(Rejection::NoChange("no paths were repaired".into()));
    }
    d.push(
        state,
        StreamId::System,
        event::TreeRepaired {
            paths: paths.to_vec(),
        },
    );
    Ok(())
}

/// An admin applied the repair of a consistency finding.
/// (`Command::RecordConsistencyRepair`.)
pub(super) fn record_consistency_repair(
    state: &State,
    d: &mut Decision,
    repaired: event::ConsistencyRepaired,
) -> Result<(), Rejection> {
    if repaired.paths.is_empty() {
        return Err(Rejection::NoChange("the repair changed nothing".into()));
    }
    if repaired.reason.trim().is_empty() {
        return Err(Rejection::Invalid {
            field: "reason".into(),
            reason: "a repair needs a reason".into(),
        });
    }
    check_text("reason", &repaired.reason)?;
    check_size("reason", repaired.reason.len(), 4096)?;
    let bytes = repaired.paths.iter().map(String::len).sum::<usize>()
        + repaired.finding.len()
        + repaired.rule.len()
        + repaired.action.len();
    check_size("paths", bytes, MAX_JOB_FIELD_BYTES)?;
    d.push(state, StreamId::System, repaired);
    Ok(())
}

/// The most nodes one [`event::ForeignChangeRepaired`] lists.
pub const MAX_FOREIGN_NODES: usize = 64;

/// The projector converged one item's nodes that another ZooKeeper client
/// had changed. Recorded on `stream` when the state holds that item, on the
/// system stream otherwise (a lock, or an item cleaned up or never made).
/// (`Command::RecordForeignChange`.)
pub(super) fn record_foreign_change(
    state: &State,
    d: &mut Decision,
    stream: StreamId,
    repaired: event::ForeignChangeRepaired,
) -> Result<(), Rejection> {
    if repaired.nodes.is_empty() {
        return Err(Rejection::NoChange("no foreign change was found".into()));
    }
    check_size("nodes", repaired.nodes.len(), MAX_FOREIGN_NODES)?;
    check_text("item", &repaired.item)?;
    check_size("item", repaired.item.len(), 256)?;
    check_text("reason", &repaired.reason)?;
    check_size("reason", repaired.reason.len(), 1024)?;
    for n in &repaired.nodes {
        check_text("path", &n.path)?;
        check_size("path", n.path.len(), 1024)?;
        check_size("found", n.found.len(), event::ForeignNode::MAX_FOUND_BYTES)?;
    }
    let known = match stream {
        StreamId::System => true,
        StreamId::Batch(b) => state.batches.contains_key(&b),
        StreamId::Job(j) => state.jobs.contains_key(&j),
        StreamId::Access(q) => state.access.contains_key(&q),
    };
    let stream = if known { stream } else { StreamId::System };
    d.push(state, stream, repaired);
    Ok(())
}

/// Removes finished (Completed or Deleted) batches from the live tree.
/// (`Command::Cleanup`.)
pub(super) fn cleanup(
    state: &State,
    lc: &Lifecycle,
    d: &mut Decision,
    before: &Option<DateTime<Utc>>,
) -> Result<(), Rejection> {
    for b in state.batches.values() {
        let old_enough = before.is_none_or(|t| b.last_modified < t);
        if !b.cleaned_up && lc.batches.is_terminal(b.status) && old_enough {
            d.push(
                state,
                StreamId::Batch(b.bid),
                event::BatchCleanedUp {
                    jobs: b.jobs.clone(),
                },
            );
        }
    }
    Ok(())
}

/// Removes one finished batch and its jobs from the live tree (mrt-zk's
/// `Batch.delete`, adopted): only a batch in a terminal state (Completed,
/// Deleted), as mrt-zk's `isDeletable` and [`cleanup`] take.
/// (`Command::CleanupBatch`.)
pub(super) fn cleanup_batch(
    state: &State,
    lc: &Lifecycle,
    d: &mut Decision,
    bid: &Bid,
) -> Result<(), Rejection> {
    let b = super::rules::live_batch(state, *bid)?;
    if !lc.batches.is_terminal(b.status) {
        return Err(Rejection::IllegalTransition {
            item: Item::Batch(*bid),
            current: b.status.to_string(),
            requested: "cleaned up (removed from the tree)".into(),
            allowed: lc.batches.allowed_names(b.status),
        });
    }
    d.push(
        state,
        StreamId::Batch(*bid),
        event::BatchCleanedUp {
            jobs: b.jobs.clone(),
        },
    );
    Ok(())
}
