//! The CLI against a running server (`ingest --engine URL …`): the
//! commands that are not written against [`super::backend::Backend`].
//!
//! sled lets one process open a data directory, and `ingest serve` holds it,
//! so while a server runs the CLI's commands go through its HTTP API.
//! Commands that act as a worker (`job JID success`, `batch BID acquire`, …)
//! are refused here: through a server, a worker's report is fenced on the
//! ZooKeeper lock it holds, which the CLI does not. `repair`, `project` and
//! `rebuild` need the data directory or the projector role and say to stop
//! the server first; `diff --repair` asks the server's running projector.

use anyhow::{bail, Result};
pub use ingest_config::server_file::locked_hint;
use ingest_protocol::api::{CleanupBody, DiffRepairBody, DiffRepaired, Diffed};
use ingest_protocol::endpoint;

use super::backend::{Refused, Remote};
use super::{emit, print_rows, refused_or, zk, Cmd};

/// Runs a command that [`super::common`] did not take, against the server.
///
/// # Errors
/// An unreachable server, a missing token, or a server error.
pub fn run(remote: &Remote, command: Cmd) -> Result<i32> {
    match run_inner(remote, command) {
        Ok(code) => Ok(code),
        Err(e) => refused_or(e),
    }
}

fn run_inner(remote: &Remote, command: Cmd) -> Result<i32> {
    match command {
        Cmd::Lifecycle { .. }
        | Cmd::Serve(_)
        | Cmd::Worker(_)
        | Cmd::Keys { .. }
        | Cmd::Export { .. }
        | Cmd::Backup(_)
        | Cmd::Restore(_)
        | Cmd::Completions { .. }
        | Cmd::Man => Ok(0),
        Cmd::Access { action } => super::access::remote(remote, action),
        Cmd::Inventory {
            ark,
            collection,
            local_id,
            format,
        } => {
            let client = remote.reader_api()?;
            let v = match (ark, collection.zip(local_id)) {
                (Some(ark), _) => remote.run(client.get(&endpoint::GetObject(ark)))?,
                (None, Some((collection, local_id))) => remote.run(client.get(
                    &endpoint::FindObject(ingest_protocol::api::ObjectQuery {
                        collection,
                        local_id,
                    }),
                ))?,
                (None, None) => bail!("give an ark, or --collection and --local-id"),
            };
            emit(&v, format)?;
            Ok(0)
        }
        Cmd::Tree(args) => {
            if args.live {
                // The live tree comes from ZooKeeper, not from the log.
                return zk::tree_live(args);
            }
            let query = ingest_protocol::api::TreeQuery {
                at: args.at.clone(),
                path: args.path.clone(),
            };
            let client = remote.admin_api()?;
            let text = remote.run(client.get(&endpoint::GetTree(query)))?;
            if text.is_empty() {
                if let Some(p) = &args.path {
                    eprintln!("no node at or under {p}");
                }
            }
            super::write_stdout(&text);
            Ok(0)
        }
        Cmd::Diff(args) => {
            let client = remote.admin_api()?;
            if args.repair {
                let body = DiffRepairBody {
                    actor: Some(remote.admin_name.clone()),
                    reason: "ingest diff --repair".into(),
                };
                return match remote.run(client.diff_repair(&body)) {
                    Ok(done) => Ok(print_diff_repair(&done)),
                    Err(e) if e.is::<Refused>() => {
                        eprintln!("refused: {e}");
                        Ok(super::exit::UNREACHABLE)
                    }
                    Err(e) => Err(e),
                };
            }
            match remote.run(client.diff()) {
                Ok(d) => Ok(print_diff(&d)),
                // A diff that cannot run is not drift: 3, as unreachable.
                Err(e) if e.is::<Refused>() => {
                    eprintln!("refused: {e}");
                    Ok(super::exit::UNREACHABLE)
                }
                Err(e) => Err(e),
            }
        }
        Cmd::Check(args) => super::check::remote(remote, args),
        Cmd::Repair { .. } => bail!("`repair` truncates the log and needs it to itself: stop the server (SIGTERM) first, then run `ingest repair` on its data directory"),
        Cmd::Project(_) => bail!("the server already projects the log into ZooKeeper; `ingest project` is for a data directory no server holds"),
        Cmd::Rebuild(_) => bail!("`rebuild` takes over the projector's role: stop the server (SIGTERM), run `ingest rebuild` on its data directory, then start it again"),
        Cmd::Cleanup { before } => {
            let body = CleanupBody {
                actor: Some(remote.admin_name.clone()),
                reason: "ingest cleanup".into(),
                before,
            };
            let client = remote.admin_api()?;
            let done = remote.run(client.cleanup(&body))?;
            print_rows(&done.events);
            Ok(0)
        }
        Cmd::Audit { action } => super::audit::remote(remote, action),
        Cmd::ZkDigest { .. } => bail!("`zk-digest` is run before a server is reached"),
        Cmd::Batch { bid, .. } => bail!(worker_only("batch", &bid.to_string())),
        Cmd::Job { jid, .. } => bail!(worker_only("job", &jid.to_string())),
        Cmd::Submit(_)
        | Cmd::Show { .. }
        | Cmd::History { .. }
        | Cmd::Status { .. }
        | Cmd::Verify(_)
        | Cmd::Collection { .. }
        | Cmd::Queue { .. }
        | Cmd::Batches(_)
        | Cmd::Jobs(_) => bail!("this command is run by the common path"),
    }
}

fn worker_only(noun: &str, id: &str) -> String {
    format!(
        "this `{noun} {id}` action is a worker's report: through a server, workers report on routes fenced by the ZooKeeper lock they hold (POST /jobs/JID/outcome, /batches/BID/acquire, …), which the CLI does not hold. Admins can force a failure (`job JID move failed --message …`), requeue, hold, release or delete; or stop the server and run the command on its data directory"
    )
}

/// Prints what `POST /diff/repair` did and the comparison after it; the
/// exit code is the later comparison's (0 when the tree now matches).
fn print_diff_repair(done: &DiffRepaired) -> i32 {
    if done.found == 0 {
        println!("nothing to repair");
    } else {
        println!(
            "the server's projector repaired {} item(s) and removed {} stale lock(s) of {} difference(s) found{}",
            done.repaired.len(),
            done.stale_locks_removed.len(),
            done.found,
            if done.position > 0 {
                format!(", recorded at position {}", done.position)
            } else {
                String::new()
            }
        );
        for item in &done.repaired {
            println!("  repaired {item}");
        }
        for lock in &done.stale_locks_removed {
            println!("  removed stale lock {lock}");
        }
    }
    print_diff(&done.after)
}

fn print_diff(v: &Diffed) -> i32 {
    match &v.checkpoint {
        Some(cp) => println!(
            "comparing the live tree ({} nodes) with the log at its checkpoint, {cp}",
            v.live_nodes
        ),
        None => println!(
            "the tree has no checkpoint (never projected); comparing it with the base nodes"
        ),
    }
    let (missing, unexpected, differing) = (v.missing.len(), v.unexpected.len(), v.differing.len());
    for lock in &v.stale_locks {
        println!("stale lock {lock}: not ephemeral, no session owns it (`ingest diff --repair` removes it)");
    }
    if missing + unexpected + differing == 0 {
        println!("no differences: {} nodes match", v.expected_nodes);
        return i32::from(!v.stale_locks.is_empty());
    }
    print!("{}", v.text);
    println!(
        "{} difference(s): {missing} missing, {unexpected} unexpected, {differing} differing",
        missing + unexpected + differing
    );
    1
}
