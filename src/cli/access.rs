//! `ingest access …`: the access (assembly) queue (issue 12), on the data
//! directory or through a server (`--engine`), with one output shape.

use anyhow::{Context, Result};
use clap::Subcommand;
use ingest_events::command::Command;
use ingest_events::event::{AccessContent, AccessPackaging, AccessQueue, AccessToken};
use ingest_events::{Actor, Qid};
use ingest_protocol::access::{AccessList, AccessRequestBody, AccessView};
use ingest_protocol::api::AdminBody;
use ingest_protocol::endpoint::{self as e, AdminAction as Route};

use super::backend::Refused;
use super::backend::{Local, Remote};
use super::opts::{Format, Reason};
use super::output::{emit, print_rows, table, time, write_stdout};

/// Actions on the access (assembly) queue.
#[derive(Debug, Subcommand)]
pub enum AccessAction {
    /// Queue an assembly request for a stored object: the small or the large
    /// queue by the version's size in the inventory (large above 500000000
    /// bytes, Merritt's QueueSizeLimit); an ark the inventory does not know
    /// is refused.
    Request {
        /// The object's ark (ark:/NAAN/name).
        #[arg(long)]
        ark: String,
        /// The version (0 for the latest).
        #[arg(long, default_value_t = 0)]
        version: u32,
        /// zip, tar or targz.
        #[arg(long = "container", default_value = "zip")]
        container: String,
        /// An admin's override of the bytes to assemble (chooses the queue; the inventory's size otherwise).
        #[arg(long)]
        size: Option<u64>,
        /// The token the requester polls with (a new uuid when absent).
        #[arg(long)]
        token: Option<String>,
        /// The storage node the object is read from.
        #[arg(long, default_value_t = 0)]
        delivery_node: u32,
        /// producer (the depositor's files), full (system/ files too) or
        /// object (the whole object: every version, each full; no --version).
        #[arg(long, default_value = "producer")]
        content: AccessContent,
        /// Lay the files out as a BagIt bag inside the container.
        #[arg(long)]
        bag: bool,
        /// Output format.
        #[arg(long, value_enum, default_value_t = Format::Yaml)]
        format: Format,
    },
    /// Every request, small queue first, and the paused queues (a table, as
    /// `ingest batches` and `ingest jobs` print).
    List {
        /// Output format.
        #[arg(long, value_enum, default_value_t = Format::Table)]
        format: Format,
    },
    /// One request.
    Show {
        /// The request (qid + 10 digits).
        qid: Qid,
        /// Output format.
        #[arg(long, value_enum, default_value_t = Format::Yaml)]
        format: Format,
    },
    /// Requeue a failed request (Failed -> Pending, as Merritt's admin tool does).
    Requeue {
        /// The request.
        qid: Qid,
        #[command(flatten)]
        reason: Reason,
    },
    /// Delete a Completed or Failed request (soft: status Deleted).
    Delete {
        /// The request.
        qid: Qid,
        #[command(flatten)]
        reason: Reason,
    },
    /// Pause one access queue (/locks/queue/accessSmall or accessLarge).
    Pause {
        /// small or large.
        queue: AccessQueue,
        #[command(flatten)]
        reason: Reason,
    },
    /// Resume one access queue.
    Resume {
        /// small or large.
        queue: AccessQueue,
        #[command(flatten)]
        reason: Reason,
    },
}

/// An admin action: the engine's command and the API's route.
fn admin(action: &AccessAction) -> Option<(Command, Route, String)> {
    Some(match action {
        AccessAction::Requeue { qid, reason } => (
            Command::RequeueAccess {
                qid: *qid,
                reason: reason.reason.clone(),
            },
            Route::RequeueAccess(e::RequeueAccess(*qid)),
            reason.reason.clone(),
        ),
        AccessAction::Delete { qid, reason } => (
            Command::DeleteAccess {
                qid: *qid,
                reason: reason.reason.clone(),
            },
            Route::DeleteAccess(e::DeleteAccess(*qid)),
            reason.reason.clone(),
        ),
        AccessAction::Pause { queue, reason } => (
            Command::PauseAccessQueue {
                queue: *queue,
                reason: reason.reason.clone(),
            },
            Route::PauseAccessQueue(e::PauseAccessQueue(*queue)),
            reason.reason.clone(),
        ),
        AccessAction::Resume { queue, reason } => (
            Command::ResumeAccessQueue {
                queue: *queue,
                reason: reason.reason.clone(),
            },
            Route::ResumeAccessQueue(e::ResumeAccessQueue(*queue)),
            reason.reason.clone(),
        ),
        _ => return None,
    })
}

/// Runs `action` on the data directory; a refusal is exit code 1.
pub(super) fn local(local: &mut Local, action: AccessAction) -> Result<i32> {
    local_inner(local, action).or_else(super::refused_or)
}

/// Runs `action` through the server; a refusal is exit code 1.
pub(super) fn remote(remote: &Remote, action: AccessAction) -> Result<i32> {
    remote_inner(remote, action).or_else(super::refused_or)
}

fn local_inner(local: &mut Local, action: AccessAction) -> Result<i32> {
    if let Some((command, ..)) = admin(&action) {
        let actor = local.actor.clone();
        let rows = local.execute(&actor, &command)?;
        print_rows(&rows);
        return Ok(0);
    }
    match action {
        AccessAction::Request {
            ark,
            version,
            container,
            size,
            token,
            delivery_node,
            content,
            bag,
            format,
        } => {
            let inventory = ingest_engine::objects::open_inventory(local.engine.log())?;
            let whole = content == AccessContent::Object;
            let found = ingest_engine::objects::requested(&inventory, &ark, version, whole)
                .map_err(|e| match e {
                    ingest_engine::objects::RequestedVersionError::Inventory(_) => {
                        anyhow::Error::new(e)
                    }
                    refused => Refused(refused.to_string()).into(),
                })?;
            let token = AccessToken {
                token: token.unwrap_or_else(|| uuid::Uuid::new_v4().to_string()),
                ark,
                version: found.version,
                format: container,
                size: size.unwrap_or(found.size),
                delivery_node,
            };
            let next = local.engine.state().next_qid();
            local.execute(
                &Actor::depositor("access"),
                &Command::RequestAccess {
                    token,
                    packaging: AccessPackaging { content, bag },
                    size_limit: AccessQueue::DEFAULT_SIZE_LIMIT,
                },
            )?;
            let state = local.engine.state();
            let a = state
                .access
                .get(&next)
                .context("the request appended nothing")?;
            emit(&AccessView::from(a), format)?;
        }
        AccessAction::List { format } => print_list(&AccessList::of(local.engine.state()), format)?,
        AccessAction::Show { qid, format } => {
            let state = local.engine.state();
            let a = state
                .access
                .get(&qid)
                .ok_or_else(|| Refused(format!("access request {qid} does not exist")))?;
            emit(&AccessView::from(a), format)?;
        }
        _ => {}
    }
    Ok(0)
}

fn remote_inner(remote: &Remote, action: AccessAction) -> Result<i32> {
    if let Some((_, route, reason)) = admin(&action) {
        let body = AdminBody {
            actor: Some(remote.admin_name.clone()),
            reason,
        };
        let client = remote.admin_api()?;
        let appended = remote.run(client.admin(&route, &body))?;
        print_rows(&appended.events);
        return Ok(0);
    }
    match action {
        AccessAction::Request {
            ark,
            version,
            container,
            size,
            token,
            delivery_node,
            content,
            bag,
            format,
        } => {
            let body = AccessRequestBody {
                token,
                ark,
                version,
                format: container,
                size,
                delivery_node,
                content,
                bag,
            };
            // The size override is an admin's.
            let client = if body.size.is_some() {
                remote.admin_api()?
            } else {
                remote.reader_api()?
            };
            let moved = remote.run(client.request_access(&body))?;
            emit(&moved.request, format)?;
        }
        AccessAction::List { format } => {
            let client = remote.reader_api()?;
            print_list(&remote.run(client.access_list())?, format)?;
        }
        AccessAction::Show { qid, format } => {
            let client = remote.reader_api()?;
            emit(&remote.run(client.access(qid))?, format)?;
        }
        _ => {}
    }
    Ok(0)
}

/// How far a Processing request's assembly got, as its worker last said
/// (`42% 3 files from primary`); empty when nobody said.
fn progress(a: &AccessView) -> String {
    let Some(p) = &a.progress else {
        return String::new();
    };
    let done = match a.size {
        0 => format!("{} bytes", p.bytes),
        size => format!(
            "{}%",
            (u128::from(p.bytes) * 100 / u128::from(size)).min(100)
        ),
    };
    format!("{done} {} files from {}", p.files, p.target)
}

/// `ingest access list`: a table like the other listings' (one request a
/// row, then how many and the paused queues), or the list as JSON/YAML.
fn print_list(list: &AccessList, format: Format) -> Result<()> {
    if format != Format::Table {
        return emit(list, format);
    }
    let rows = list
        .items
        .iter()
        .map(|a| {
            vec![
                a.qid.clone(),
                a.queue.clone(),
                a.status.clone(),
                a.ark.clone(),
                a.version.to_string(),
                a.format.clone(),
                a.size.to_string(),
                progress(a),
                a.content.name().to_string(),
                a.delivery
                    .as_ref()
                    .map_or_else(String::new, |d| d.target.clone()),
                a.delivery
                    .as_ref()
                    .map_or_else(String::new, |d| match a.expired {
                        true => format!("{} (expired)", time(&d.expires)),
                        false => time(&d.expires),
                    }),
                a.delivery
                    .as_ref()
                    .map_or_else(String::new, |d| d.url.clone()),
                a.retry_count.to_string(),
                time(&a.last_modified),
                a.message.clone(),
            ]
        })
        .collect();
    let mut out = table(
        &[
            "QID", "QUEUE", "STATUS", "ARK", "VERSION", "FORMAT", "BYTES", "PROGRESS", "CONTENT",
            "TARGET", "EXPIRES", "URL", "REQUEUES", "MODIFIED", "MESSAGE",
        ],
        rows,
    );
    out.push_str(&format!("{} requests", list.items.len()));
    if !list.paused.is_empty() {
        out.push_str(&format!("; paused: {}", list.paused.join(", ")));
    }
    out.push('\n');
    write_stdout(&out);
    Ok(())
}
