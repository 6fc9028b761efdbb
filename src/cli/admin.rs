//! The admin actions: each one's engine command and API route, so the same
//! words act on the data directory and through a server.

use anyhow::Result;
use ingest_client::Method;
use ingest_events::command::{Command, Target};
use ingest_events::JobState;

use super::args::{BatchAction, Cmd, CollectionAction, JobAction, QueueAction};
use super::backend::AdminAction;

/// The admin actions: the engine command and the API route of each.
pub(super) fn admin_action(command: Cmd) -> Result<Result<AdminAction, Box<Cmd>>> {
    let action = |command, method: Method, path: String, reason: String| AdminAction {
        command,
        route: (method, path),
        reason,
    };
    Ok(Ok(match command {
        Cmd::Batch { bid, action: a } => match a {
            BatchAction::Release(r) => action(
                Command::ReleaseBatch {
                    bid,
                    reason: r.reason.clone(),
                },
                Method::POST,
                format!("/batches/{bid}/release"),
                r.reason,
            ),
            BatchAction::UpdateReporting(r) => action(
                Command::UpdateReporting {
                    bid,
                    reason: r.reason.clone(),
                },
                Method::POST,
                format!("/batches/{bid}/update-reporting"),
                r.reason,
            ),
            BatchAction::Delete(r) => action(
                Command::DeleteBatch {
                    bid,
                    reason: r.reason.clone(),
                },
                Method::DELETE,
                format!("/batches/{bid}"),
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
                Method::POST,
                format!("/jobs/{jid}/requeue"),
                r.reason,
            ),
            JobAction::Hold(r) => action(
                Command::HoldJob {
                    jid,
                    reason: r.reason.clone(),
                },
                Method::POST,
                format!("/jobs/{jid}/hold"),
                r.reason,
            ),
            JobAction::Release(r) => action(
                Command::ReleaseJob {
                    jid,
                    reason: r.reason.clone(),
                },
                Method::POST,
                format!("/jobs/{jid}/release"),
                r.reason,
            ),
            JobAction::Delete(r) => action(
                Command::DeleteJob {
                    jid,
                    reason: r.reason.clone(),
                },
                Method::DELETE,
                format!("/jobs/{jid}"),
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
                Method::POST,
                format!("/jobs/{jid}/fail"),
                args.message,
            ),
            a => return Ok(Err(Box::new(Cmd::Job { jid, action: a }))),
        },
        Cmd::Collection { profile, action: a } => {
            let (verb, r) = match &a {
                CollectionAction::Hold(r) => ("hold", r.reason.clone()),
                CollectionAction::Release(r) => ("release", r.reason.clone()),
                CollectionAction::ReleaseJobs(r) => ("release-jobs", r.reason.clone()),
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
            action(
                command,
                Method::POST,
                format!("/collections/{profile}/{verb}"),
                r,
            )
        }
        Cmd::Queue { action: a } => match a {
            QueueAction::Pause(r) => action(
                Command::PauseQueue {
                    reason: r.reason.clone(),
                },
                Method::POST,
                "/queue/pause".into(),
                r.reason,
            ),
            QueueAction::Resume(r) => action(
                Command::ResumeQueue {
                    reason: r.reason.clone(),
                },
                Method::POST,
                "/queue/resume".into(),
                r.reason,
            ),
        },
        other => return Ok(Err(Box::new(other))),
    }))
}
