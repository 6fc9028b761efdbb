//! The admin actions: each one's engine command and API route, so the same
//! words act on the data directory and through a server.

use anyhow::Result;
use ingest_events::command::{Command, Target};
use ingest_events::JobState;
use ingest_protocol::endpoint::{self as e, AdminAction as Route};

use super::args::{BatchAction, Cmd, CollectionAction, JobAction, QueueAction};
use super::backend::AdminAction;

/// The admin actions: the engine command and the API route of each.
pub(super) fn admin_action(command: Cmd) -> Result<Result<AdminAction, Box<Cmd>>> {
    let action = |command, route: Route, reason: String| AdminAction {
        command,
        route,
        reason,
    };
    Ok(Ok(match command {
        Cmd::Batch { bid, action: a } => match a {
            BatchAction::Release(r) => action(
                Command::ReleaseBatch {
                    bid,
                    reason: r.reason.clone(),
                },
                Route::ReleaseBatch(e::ReleaseBatch(bid)),
                r.reason,
            ),
            BatchAction::UpdateReporting(r) => action(
                Command::UpdateReporting {
                    bid,
                    reason: r.reason.clone(),
                },
                Route::UpdateReporting(e::UpdateReporting(bid)),
                r.reason,
            ),
            BatchAction::Delete(r) => action(
                Command::DeleteBatch {
                    bid,
                    reason: r.reason.clone(),
                },
                Route::DeleteBatch(e::DeleteBatch(bid)),
                r.reason,
            ),
            a => return Ok(Err(Box::new(Cmd::Batch { bid, action: a }))),
        },
        Cmd::Job { jid, action: a } => match a {
            JobAction::Requeue(r) => action(
                Command::RequeueJob {
                    jid,
                    reason: r.reason.clone(),
                },
                Route::RequeueJob(e::RequeueJob(jid)),
                r.reason,
            ),
            JobAction::Hold(r) => action(
                Command::HoldJob {
                    jid,
                    reason: r.reason.clone(),
                },
                Route::HoldJob(e::HoldJob(jid)),
                r.reason,
            ),
            JobAction::Release(r) => action(
                Command::ReleaseJob {
                    jid,
                    reason: r.reason.clone(),
                },
                Route::ReleaseJob(e::ReleaseJob(jid)),
                r.reason,
            ),
            JobAction::Delete(r) => action(
                Command::DeleteJob {
                    jid,
                    reason: r.reason.clone(),
                },
                Route::DeleteJob(e::DeleteJob(jid)),
                r.reason,
            ),
            JobAction::Move {
                state: JobState::Failed,
                args,
            } => action(
                Command::SetJobStatus {
                    jid,
                    target: Target::To(JobState::Failed),
                    message: args.message.clone(),
                    priority: args.priority,
                },
                Route::FailJob(e::FailJob(jid)),
                args.message,
            ),
            a => return Ok(Err(Box::new(Cmd::Job { jid, action: a }))),
        },
        Cmd::Collection { profile, action: a } => {
            let p = profile.clone();
            let (route, r) = match &a {
                CollectionAction::Hold(r) => (
                    Route::HoldCollection(e::HoldCollection(p)),
                    r.reason.clone(),
                ),
                CollectionAction::Release(r) => (
                    Route::ReleaseCollection(e::ReleaseCollection(p)),
                    r.reason.clone(),
                ),
                CollectionAction::ReleaseJobs(r) => (
                    Route::ReleaseCollectionJobs(e::ReleaseCollectionJobs(p)),
                    r.reason.clone(),
                ),
            };
            let command = match a {
                CollectionAction::Hold(r) => Command::HoldCollection {
                    profile: profile.clone(),
                    reason: r.reason,
                },
                CollectionAction::Release(r) => Command::ReleaseCollection {
                    profile: profile.clone(),
                    reason: r.reason,
                },
                CollectionAction::ReleaseJobs(r) => Command::ReleaseHeldJobs {
                    profile: profile.clone(),
                    reason: r.reason,
                },
            };
            action(command, route, r)
        }
        Cmd::Queue { action: a } => match a {
            QueueAction::Pause(r) => action(
                Command::PauseQueue {
                    reason: r.reason.clone(),
                },
                Route::PauseQueue(e::PauseQueue),
                r.reason,
            ),
            QueueAction::Resume(r) => action(
                Command::ResumeQueue {
                    reason: r.reason.clone(),
                },
                Route::ResumeQueue(e::ResumeQueue),
                r.reason,
            ),
        },
        other => return Ok(Err(Box::new(other))),
    }))
}
