//! Access (assembly) request decisions: mrt-zk's `/access/{small,large}`
//! queue, its `access_states` and the pause of each queue.

use crate::event::{self, AccessDelivery, AccessPackaging, AccessQueue, AccessToken, StreamId};
use crate::ids::Qid;
use crate::lifecycle::{AccessState, Lifecycle};
use crate::state::{AccessRequest, State};

use super::validate::*;
use super::*;

/// The longest token, ark or format an assembly request may carry.
pub const MAX_ACCESS_FIELD_BYTES: usize = 1024;

fn field(name: &str, value: &str) -> Result<(), Rejection> {
    check_size(name, value.len(), MAX_ACCESS_FIELD_BYTES)?;
    check_text(name, value)
}

/// Checks an assembly request's fields at the door.
pub(super) fn validate_token(t: &AccessToken) -> Result<(), Rejection> {
    field("token", &t.token)?;
    field("ark", &t.ark)?;
    field("format", &t.format)?;
    let invalid = |f: &str, reason: &str| Rejection::Invalid {
        field: f.into(),
        reason: reason.into(),
    };
    if t.token.trim().is_empty() {
        return Err(invalid("token", "is empty"));
    }
    if !t.ark.starts_with("ark:/") || t.ark.len() <= "ark:/".len() {
        return Err(invalid("ark", "must be an ark (ark:/NAAN/name)"));
    }
    if !matches!(t.format.as_str(), "zip" | "tar" | "targz") {
        return Err(invalid("format", "must be zip, tar or targz"));
    }
    Ok(())
}

fn request<'a>(state: &'a State, qid: &Qid) -> Result<&'a AccessRequest, Rejection> {
    state.access.get(qid).ok_or(Rejection::NotFound {
        item: Item::Access(*qid),
    })
}

fn illegal(a: &AccessRequest, lc: &Lifecycle, to: AccessState) -> Rejection {
    Rejection::IllegalTransition {
        item: Item::Access(a.qid),
        current: a.status.to_string(),
        requested: to.to_string(),
        allowed: lc.access.allowed_names(a.status),
    }
}

fn moved(
    state: &State,
    d: &mut Decision,
    a: &AccessRequest,
    to: AccessState,
    message: &str,
    requeue: bool,
) {
    d.push(
        state,
        StreamId::Access(a.qid),
        event::AccessStatusChanged {
            from: a.status,
            to,
            message: message.to_owned(),
            requeue,
        },
    );
}

/// A requester asks for an object to be assembled; the queue is chosen by
/// size as mrt-store does. (`Command::RequestAccess`.)
pub(super) fn request_access(
    state: &State,
    _lc: &Lifecycle,
    d: &mut Decision,
    token: &AccessToken,
    packaging: AccessPackaging,
    size_limit: u64,
) -> Result<(), Rejection> {
    validate_token(token)?;
    if packaging.bag && packaging.content == event::AccessContent::Object {
        return Err(Rejection::Invalid {
            field: "bag".into(),
            reason: "a bag holds one version: the whole object (content object) is not bagged"
                .into(),
        });
    }
    if let Some(a) = state.access.values().find(|a| a.token.token == token.token) {
        return Err(Rejection::NoChange(format!(
            "token {} is already queued as {}",
            token.token, a.qid
        )));
    }
    let qid = state.next_qid();
    d.push(
        state,
        StreamId::Access(qid),
        event::AccessRequested {
            queue: AccessQueue::for_size(token.size, size_limit),
            token: token.clone(),
        },
    );
    if packaging != AccessPackaging::default() {
        d.push(
            state,
            StreamId::Access(qid),
            event::AccessPackagingChosen { packaging },
        );
    }
    Ok(())
}

/// A worker takes a pending request (Pending → Processing); refused while
/// its queue is paused. A request already Processing is taken again: the
/// server lets a worker start only while it holds the request's ephemeral
/// lock, so a second start means the worker that moved it to Processing lost
/// its session (it died) and its lock with it; without this the request
/// stayed in Processing for good. (`Command::StartAccess`.)
pub(super) fn start_access(
    state: &State,
    lc: &Lifecycle,
    d: &mut Decision,
    qid: &Qid,
) -> Result<(), Rejection> {
    let a = request(state, qid)?;
    let retake = a.status == AccessState::Processing;
    if !retake
        && (a.status != AccessState::Pending || !lc.access.can(a.status, AccessState::Processing))
    {
        return Err(illegal(a, lc, AccessState::Processing));
    }
    if state.paused_access.contains(&a.queue) {
        return Err(Rejection::AccessQueuePaused {
            item: Item::Access(a.qid),
            queue: a.queue,
        });
    }
    let message = if retake {
        "taken again: the worker that held it lost its lock"
    } else {
        ""
    };
    moved(state, d, a, AccessState::Processing, message, false);
    Ok(())
}

/// A worker reports the assembly's outcome: the success or fail successor of
/// the state it worked on; a report on a state the request has left is
/// stale. (`Command::AccessOutcome`.)
pub(super) fn access_outcome(
    state: &State,
    lc: &Lifecycle,
    d: &mut Decision,
    qid: &Qid,
    success: bool,
    message: &str,
    delivery: Option<&AccessDelivery>,
) -> Result<(), Rejection> {
    let a = request(state, qid)?;
    check_size("message", message.len(), MAX_JOB_FIELD_BYTES)?;
    if let Some(delivery) = delivery {
        if !success {
            return Err(Rejection::Invalid {
                field: "delivery".into(),
                reason: "a failed assembly has no delivery".into(),
            });
        }
        field("delivery url", &delivery.url)?;
        field("delivery target", &delivery.target)?;
        field("delivery sha256", &delivery.sha256)?;
    }
    if a.status != AccessState::Processing {
        return Err(Rejection::StaleReport {
            item: Item::Access(a.qid),
            current: a.status.to_string(),
            reported: AccessState::Processing.to_string(),
        });
    }
    let to = if success {
        lc.access.success(a.status)
    } else {
        lc.access.fail(a.status)
    };
    let Some(to) = to else {
        return Err(illegal(
            a,
            lc,
            if success {
                AccessState::Completed
            } else {
                AccessState::Failed
            },
        ));
    };
    if let Some(delivery) = delivery {
        d.push(
            state,
            StreamId::Access(a.qid),
            event::AccessDelivered {
                delivery: delivery.clone(),
            },
        );
    }
    moved(state, d, a, to, message, false);
    Ok(())
}

/// An admin requeues a failed request: back to Pending, as Merritt's admin
/// tool does (`set_status(Pending)`), so a worker takes it again. A request
/// in Processing is accepted too: the server refuses it while a worker holds
/// its lock, so here it is one whose worker died. (`Command::RequeueAccess`.)
pub(super) fn requeue_access(
    state: &State,
    lc: &Lifecycle,
    d: &mut Decision,
    qid: &Qid,
    reason: &str,
) -> Result<(), Rejection> {
    let a = request(state, qid)?;
    if !lc.access.admin_can(a.status, AccessState::Pending) {
        return Err(Rejection::IllegalTransition {
            item: Item::Access(a.qid),
            current: a.status.to_string(),
            requested: "Pending (requeue)".into(),
            allowed: lc.access.allowed_names(a.status),
        });
    }
    moved(state, d, a, AccessState::Pending, reason, true);
    Ok(())
}

/// An admin deletes a Completed or Failed request (soft: status Deleted, as
/// the admin tool's "Queue Del"), or a Processing one whose worker died (the
/// server refuses it while a lock is held). (`Command::DeleteAccess`.)
pub(super) fn delete_access(
    state: &State,
    lc: &Lifecycle,
    d: &mut Decision,
    qid: &Qid,
    reason: &str,
) -> Result<(), Rejection> {
    let a = request(state, qid)?;
    if !lc.access.admin_can(a.status, AccessState::Deleted) {
        return Err(illegal(a, lc, AccessState::Deleted));
    }
    moved(state, d, a, AccessState::Deleted, reason, false);
    Ok(())
}

/// An admin pauses one access queue (`/locks/queue/accessSmall|accessLarge`).
/// (`Command::PauseAccessQueue`.)
pub(super) fn pause_access_queue(
    state: &State,
    _lc: &Lifecycle,
    d: &mut Decision,
    queue: AccessQueue,
    reason: &str,
) -> Result<(), Rejection> {
    if state.paused_access.contains(&queue) {
        return Err(Rejection::NoChange(format!(
            "the {queue} access queue is already paused"
        )));
    }
    d.push(
        state,
        StreamId::System,
        event::AccessQueuePaused {
            queue,
            reason: reason.to_owned(),
        },
    );
    Ok(())
}

/// An admin resumes one access queue. (`Command::ResumeAccessQueue`.)
pub(super) fn resume_access_queue(
    state: &State,
    _lc: &Lifecycle,
    d: &mut Decision,
    queue: AccessQueue,
    reason: &str,
) -> Result<(), Rejection> {
    if !state.paused_access.contains(&queue) {
        return Err(Rejection::NoChange(format!(
            "the {queue} access queue is not paused"
        )));
    }
    d.push(
        state,
        StreamId::System,
        event::AccessQueueResumed {
            queue,
            reason: reason.to_owned(),
        },
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::Event;

    fn token(t: &str, ark: &str, format: &str, size: u64) -> AccessToken {
        AccessToken {
            token: t.into(),
            ark: ark.into(),
            version: 0,
            format: format.into(),
            size,
            delivery_node: 9501,
        }
    }

    fn request(t: AccessToken) -> Result<Decision, Rejection> {
        let cmd = Command::RequestAccess {
            token: t,
            packaging: Default::default(),
            size_limit: AccessQueue::DEFAULT_SIZE_LIMIT,
        };
        decide(&State::new(), &Lifecycle::builtin(), &cmd)
    }

    #[test]
    fn the_queue_is_chosen_by_size_as_mrt_store_chooses_it() {
        for (size, queue) in [
            (0, AccessQueue::Small),
            (500_000_000, AccessQueue::Small),
            (500_000_001, AccessQueue::Large),
        ] {
            let d = request(token("t", "ark:/1/2", "zip", size)).expect("accepted");
            match &d.events[0].event {
                Event::AccessRequested(e) => assert_eq!(e.queue, queue, "{size}"),
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn hostile_requests_are_refused_naming_the_field() {
        let long = "a".repeat(MAX_ACCESS_FIELD_BYTES + 1);
        for (t, field) in [
            (token("", "ark:/1/2", "zip", 1), "token"),
            (token("a\nb", "ark:/1/2", "zip", 1), "token"),
            (token(&long, "ark:/1/2", "zip", 1), "token"),
            (token("t", "http://x", "zip", 1), "ark"),
            (token("t", "ark:/", "zip", 1), "ark"),
            (token("t", &format!("ark:/{long}"), "zip", 1), "ark"),
            (token("t", "ark:/1/2", "rar", 1), "format"),
        ] {
            match request(t) {
                Err(Rejection::Invalid { field: f, reason }) => {
                    assert_eq!(f, field);
                    assert!(reason.len() < 2 * MAX_ACCESS_FIELD_BYTES, "{reason}");
                }
                other => panic!("{field}: {other:?}"),
            }
        }
    }
}
