//! The `ingest` command line.
//!
//! Grammar: `ingest [GLOBAL OPTIONS] NOUN [ID] VERB [OPTIONS]` for actions on
//! one item (`ingest job jid0000000001 fail --message "…"`,
//! `ingest collection demo hold --reason "…"`), and plain verbs for the rest
//! (`submit`, `show`, `history`, `verify`, `repair`, `lifecycle`, `cleanup`,
//! `status`).
//!
//! - `args.rs`: the grammar (clap);
//! - this file: [`run_with`] and `common`, the commands written once against
//!   a [`backend::Backend`] (the engine on the data directory, or a server);
//! - `admin.rs`: each admin action's engine command and API route;
//! - `list.rs`: `batches` and `jobs`, pages of a listing;
//! - `local.rs`: commands that need the data directory itself;
//! - `remote.rs`: commands that only exist through a server;
//! - `check.rs`: `check`, the consistency report and its repairs;
//! - `audit.rs`: `audit export`, `audit prove`, `audit verify`;
//! - `zk.rs`: `project`, `tree`, `rebuild`, `diff`;
//! - `output.rs`: YAML, JSON, tables; a closed pipe ends quietly.

use anyhow::{Context, Result};
use ingest_events::lifecycle::ItemKind;
use ingest_events::{Actor, Lifecycle};

use ingest_engine::{Engine, EngineConfig, EngineError};
use ingest_protocol::history::table;

use backend::{Backend, Local, Refused, Remote};

mod access;
mod admin;
pub mod args;
mod audit;
pub mod backend;
mod backup;
pub mod check;
pub mod exit;
mod list;
mod local;
mod opts;
mod output;
pub mod remote;
pub mod verify;
pub mod zk;

use admin::admin_action;
pub use args::*;
use local::{keys, local_only, submission_input};
use output::{emit, print_rows, print_verified, write_stdout};

/// Runs the CLI; `globals` says which global options the user set (for
/// `serve`, whose configuration file may set them otherwise).
///
/// # Errors
/// Anything that went wrong, with context naming what.
pub fn run_with(cli: Cli, globals: ingest_config::GlobalOverrides) -> Result<i32> {
    if let Cmd::Serve(args) = &cli.command {
        let config = ingest_config::ServeConfig::load(args, &globals)?;
        ingest_config::init_tracing(config.log_format);
        return ingest_server::serve::run(config);
    }
    if let Cmd::Worker(args) = &cli.command {
        ingest_config::init_tracing(cli.log_format);
        let mut args = (**args).clone();
        args.engine = cli.engine.clone().context(
            "ingest worker needs --engine URL (or INGEST_ENGINE): the server it reports to",
        )?;
        return ingest_worker::run(args);
    }
    ingest_config::init_tracing(cli.log_format);
    let lifecycle = match &cli.states {
        Some(p) => Lifecycle::load(p)?,
        None => Lifecycle::builtin(),
    };
    if let Cmd::Lifecycle { format, of } = &cli.command {
        let of: Vec<ItemKind> = of.iter().map(|i| (*i).into()).collect();
        print!(
            "{}",
            match (format, of.first()) {
                (LifecycleFormat::Mermaid, Some(item)) => lifecycle.mermaid(*item),
                // clap requires --of with mermaid.
                (LifecycleFormat::Table | LifecycleFormat::Mermaid, _) => lifecycle.table(&of),
            }
        );
        return Ok(0);
    }
    if let Cmd::Keys { action } = &cli.command {
        return keys(action);
    }
    if let Cmd::Completions { shell } = &cli.command {
        let mut out = Vec::new();
        clap_complete::generate(
            *shell,
            &mut <Cli as clap::CommandFactory>::command(),
            "ingest",
            &mut out,
        );
        write_stdout(&String::from_utf8_lossy(&out));
        return Ok(0);
    }
    if let Cmd::Man = &cli.command {
        let mut out = Vec::new();
        clap_mangen::Man::new(<Cli as clap::CommandFactory>::command())
            .render(&mut out)
            .context("rendering the manual page")?;
        write_stdout(&String::from_utf8_lossy(&out));
        return Ok(0);
    }
    if let Cmd::Audit {
        action: AuditAction::Verify { file, key },
    } = &cli.command
    {
        // Stands alone: no data directory, no server.
        return audit::verify(file, key.as_deref());
    }
    if let Cmd::ZkDigest { auth_file } = &cli.command {
        // Stands alone: no data directory, no server, no ZooKeeper.
        return zk::digest(auth_file.as_deref());
    }
    if let Cmd::Backup(args) = &cli.command {
        return backup::backup(args, cli.engine.as_deref(), &cli.data_dir);
    }
    if let Cmd::Restore(args) = &cli.command {
        if cli.engine.is_some() {
            return Err(exit::Usage(
                "restore writes a new data directory (--data-dir) on this machine: it takes no --engine".into(),
            )
            .into());
        }
        return backup::restore(args, &cli.data_dir);
    }
    if let Cmd::Export { what } = &cli.command {
        if cli.engine.is_some() {
            return Err(exit::Usage(
                "export reads an OCFL storage root (--storage-target) directly: the server's objects API serves no file content, so it does not go through --engine; run it where the storage root is mounted, without --engine".into(),
            )
            .into());
        }
        return local::export(what);
    }
    if let Some(base) = cli.engine.clone() {
        // Two places named for one command: refuse rather than silently
        // run against the server (the data directory was ignored).
        if let Some(dir) = &globals.data_dir {
            return Err(exit::Usage(format!(
                "both a server (--engine or INGEST_ENGINE: {}) and a data directory (--data-dir or INGEST_DATA_DIR: {}) are given; a command runs against one: unset INGEST_ENGINE (or drop --engine) to use the data directory, or drop --data-dir (and INGEST_DATA_DIR) to use the server",
                ingest_protocol::cut(&base, 200),
                dir.display()
            ))
            .into());
        }
        let admin_name = match &cli.actor {
            Some(a) => a.strip_prefix("admin:").unwrap_or(a).to_string(),
            None => std::env::var("USER").unwrap_or_else(|_| "cli".into()),
        };
        let mut remote = Remote::new(&base, admin_name)?;
        return match common(&mut remote, cli.command, None)? {
            Flow::Done(code) => Ok(code),
            Flow::Other(command) => remote::run(&remote, *command),
        };
    }
    if let Cmd::Tree(args) = &cli.command {
        if args.live {
            // The live tree comes from ZooKeeper: no data directory needed.
            return zk::tree_live(args.clone());
        }
    }
    // A typo in --data-dir must not open an empty log and answer as if the
    // queue were empty: only the first submission creates the directory.
    if !cli.data_dir.exists() && !matches!(cli.command, Cmd::Submit(_)) {
        return Err(exit::Usage(format!(
            "there is no data directory at {} (a typo? `ingest submit` or `ingest serve` creates one there)",
            cli.data_dir.display()
        ))
        .into());
    }
    if let Cmd::Verify(args) = &cli.command {
        // The log alone: a damaged, truncated or read-only one is reported,
        // not refused by the engine's start-up.
        return verify::run(&cli.data_dir, args);
    }
    let mut config = EngineConfig::new(&cli.data_dir);
    config.lifecycle = lifecycle;
    let engine = match Engine::open(config) {
        Ok(engine) => engine,
        Err(e @ EngineError::Log(ingest_events::LogError::Locked { .. })) => {
            return Err(anyhow::Error::new(e)
                .context(remote::locked_hint(&cli.data_dir))
                .context(format!(
                    "cannot open the engine in {}",
                    cli.data_dir.display()
                )));
        }
        Err(e) => {
            return Err(e)
                .with_context(|| format!("cannot open the engine in {}", cli.data_dir.display()))
        }
    };
    let default_actor = || Actor::admin(std::env::var("USER").unwrap_or_else(|_| "cli".into()));
    let actor = match &cli.actor {
        Some(a) => a
            .parse::<Actor>()
            .map_err(anyhow::Error::msg)
            .context("invalid --actor")?,
        None => default_actor(),
    };
    let explicit_actor = cli.actor.is_some().then(|| actor.clone());
    let mut local = Local { engine, actor };
    match common(&mut local, cli.command, explicit_actor)? {
        Flow::Done(code) => Ok(code),
        Flow::Other(command) => local_only(&mut local, *command),
    }
}

/// What [`common`] did with a command.
enum Flow {
    /// It ran; the exit code.
    Done(i32),
    /// It is not one of the commands written against [`Backend`].
    Other(Box<Cmd>),
}

/// The commands written once against [`Backend`]: the same words and the
/// same output on the data directory and through a server.
fn common(backend: &mut dyn Backend, command: Cmd, actor: Option<Actor>) -> Result<Flow> {
    let outcome = match command {
        Cmd::Submit(args) => {
            let input = submission_input(*args)?;
            backend.submit(input, actor).map(|s| {
                println!("submitted batch {} (uuid {}), {}", s.bid, s.uuid, s.status);
            })
        }
        Cmd::Show { what, format } => match what {
            ShowWhat::Batch { bid } => backend.batch(bid).and_then(|v| show_batch(&v, format)),
            ShowWhat::Job { jid } => backend.job(jid).and_then(|v| emit(&v, format)),
        },
        Cmd::History {
            batch,
            job,
            since,
            until,
            by,
            collection,
            limit,
            format,
        } => {
            let query = ingest_protocol::history::HistoryQuery {
                batch,
                job,
                since,
                until,
                actor: by,
                collection,
                limit,
            };
            match query.validate() {
                Err(e) => Err(Refused(e.to_string()).into()),
                Ok(()) => backend.history(&query).and_then(|(rows, truncated)| {
                    if truncated {
                        eprintln!(
                            "more events matched than the limit of {}: narrow the query (--since/--until) or raise --limit",
                            query.row_limit()
                        );
                    }
                    print_history(&rows, format)
                }),
            }
        }
        // `NOUN ID VERB` forms of show and history.
        Cmd::Batch {
            bid,
            action: BatchAction::Show(ShowFormat { format }),
        } => backend.batch(bid).and_then(|v| show_batch(&v, format)),
        Cmd::Job {
            jid,
            action: JobAction::Show(ShowFormat { format }),
        } => backend.job(jid).and_then(|v| emit(&v, format)),
        Cmd::Batch {
            bid,
            action: BatchAction::History(HistoryFormat { format }),
        } => backend
            .batch_history(bid)
            .and_then(|rows| print_history(&rows, format)),
        Cmd::Job {
            jid,
            action: JobAction::History(HistoryFormat { format }),
        } => backend
            .job_history(jid)
            .and_then(|rows| print_history(&rows, format)),
        Cmd::Status { format } => backend.status().and_then(|v| emit(&v, format)),
        Cmd::Batches(args) => list::batches(backend, args),
        Cmd::Jobs(args) => list::jobs(backend, args),
        Cmd::Verify(_) => {
            return match backend.verify() {
                Ok(v) => Ok(Flow::Done(print_verified(&v))),
                Err(e) => refused_or(e).map(Flow::Done),
            }
        }
        other => match admin_action(other)? {
            Ok(action) => backend.admin(action).map(|rows| print_rows(&rows)),
            Err(other) => return Ok(Flow::Other(other)),
        },
    };
    match outcome {
        Ok(()) => Ok(Flow::Done(0)),
        Err(e) => refused_or(e).map(Flow::Done),
    }
}

fn print_history(rows: &[ingest_protocol::history::HistoryRow], format: Format) -> Result<()> {
    match format {
        Format::Table => {
            write_stdout(&table(rows));
            Ok(())
        }
        f => emit(&rows, f),
    }
}

/// A [`Refused`] error is printed and gives exit code 1; others go up.
fn refused_or(e: anyhow::Error) -> Result<i32> {
    match e.downcast_ref::<Refused>() {
        Some(r) => {
            eprintln!("refused: {r}");
            Ok(1)
        }
        None => Err(e),
    }
}

/// Prints a batch; says on stderr when an update report is due (its
/// depositor's report still says it failed).
fn show_batch(v: &ingest_protocol::report::BatchView, format: Format) -> Result<()> {
    emit(v, format)?;
    if v.update_report_due {
        eprintln!(
            "note: batch {} is Failed but every failed job of it has since completed (or was deleted); its depositor's report still says it failed: send an update report with `ingest batch {} update-reporting --reason '…'`",
            v.bid, v.bid
        );
    }
    Ok(())
}
