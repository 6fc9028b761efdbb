//! The `ingest` command line.
//!
//! Grammar: `ingest [GLOBAL OPTIONS] NOUN [ID] VERB [OPTIONS]` for actions on
//! one item (`ingest job jid0000000001 fail --message "…"`,
//! `ingest collection demo hold --reason "…"`), and plain verbs for the rest
//! (`submit`, `show`, `history`, `verify`, `repair`, `lifecycle`, `cleanup`,
//! `status`).

use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};
use ingest_events::command::{Command, JobSpec, Target};
use ingest_events::event::{Identifiers, InventoryParams, StoreParams};
use ingest_events::{Actor, Bid, Jid, JobState, Lifecycle};
use serde::Serialize;

use ingest_config::LogFormat;
use ingest_engine::{Engine, EngineConfig, EngineError};
use ingest_protocol::history::{table, HistoryRow};
use ingest_protocol::submission::{expand_simple, split_local_ids, SubmissionInput};

use backend::{AdminAction, Backend, Local, Refused, Remote};
use ingest_client::Method;

pub mod backend;
pub mod remote;
pub mod zk;

/// `ingest`: an event-sourced ingest queue for digital-preservation repositories.
#[derive(Debug, Parser)]
#[command(
    name = "ingest",
    version,
    about = "An event-sourced ingest queue for digital-preservation repositories",
    long_about = "An event-sourced ingest queue for digital-preservation repositories.\n\n\
Every change to a batch or job is an event appended to a hash-chained log in the data \
directory (the source of truth); the ZooKeeper queue tree Merritt's workers read is \
projected from it.\n\n\
Grammar: `ingest NOUN ID VERB` acts on one item (batch, job, collection, queue); \
`submit`, `show`, `history`, `verify`, `repair`, `lifecycle`, `cleanup` and `status` stand alone.",
    after_help = "Examples:\n  ingest submit --profile demo --submitter alice --payload-url https://example.org/a.zip --type container\n  ingest batch bid0000000001 acquire\n  ingest job jid0000000001 start\n  ingest job jid0000000001 success\n  ingest job jid0000000001 fail --message 'HEAD https://… returned 404'\n  ingest job jid0000000001 requeue --reason 'server fixed'\n  ingest collection demo hold --reason 'storage migration'\n  ingest history --batch bid0000000001 --format table\n  ingest verify"
)]
pub struct Cli {
    /// The data directory holding the event log.
    #[arg(
        long,
        global = true,
        env = "INGEST_DATA_DIR",
        default_value = "./ingest-data"
    )]
    pub data_dir: PathBuf,
    /// A lifecycle file (mrt-zk states.yml format) to use instead of the built-in one.
    #[arg(long, global = true, env = "INGEST_STATES", value_name = "FILE")]
    pub states: Option<PathBuf>,
    /// Who is acting: admin:NAME, worker:NAME, depositor:NAME (default admin:$USER; depositor:SUBMITTER for submit).
    #[arg(long, global = true, env = "INGEST_ACTOR")]
    pub actor: Option<String>,
    /// Run the command through the `ingest serve` at this URL (its HTTP API) instead of opening the data directory, which a running server holds. Tokens from INGEST_ADMIN_TOKEN (or INGEST_DEPOSITOR_TOKEN for submit/show/history).
    #[arg(long, global = true, env = "INGEST_ENGINE", value_name = "URL")]
    pub engine: Option<String>,
    /// Log output on stderr.
    #[arg(long, global = true, env = "INGEST_LOG_FORMAT", value_enum, default_value_t = LogFormat::Human)]
    pub log_format: LogFormat,
    /// What to do.
    #[command(subcommand)]
    pub command: Cmd,
}

/// Output formats of listings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// YAML.
    Yaml,
    /// JSON.
    Json,
    /// An aligned text table.
    Table,
}

/// Lifecycle output formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LifecycleFormat {
    /// The transition table.
    Table,
    /// A Mermaid state diagram generated from the table.
    Mermaid,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Cmd {
    /// Submit a batch (fields as options, or --file submission.yml; options override the file).
    Submit(Box<SubmitArgs>),
    /// Show a batch or a job as the log says it is now.
    Show {
        /// What to show.
        #[command(subcommand)]
        what: ShowWhat,
        /// Output format.
        #[arg(long, global = true, value_enum, default_value_t = Format::Yaml)]
        format: Format,
    },
    /// Every event of a batch and its jobs (or of one job), in log order.
    History {
        /// The batch.
        #[arg(long, conflicts_with = "job", required_unless_present = "job")]
        batch: Option<Bid>,
        /// The job.
        #[arg(long)]
        job: Option<Jid>,
        /// Output format.
        #[arg(long, value_enum, default_value_t = Format::Table)]
        format: Format,
    },
    /// Re-check the whole hash chain and every stream index entry.
    Verify,
    /// Truncate a torn tail that fails the hash chain (only the tail; never the middle).
    Repair {
        /// Do it: without this, only say what would be removed.
        #[arg(long)]
        yes: bool,
    },
    /// Print the job and batch lifecycle.
    Lifecycle {
        /// Output format.
        #[arg(long, value_enum, default_value_t = LifecycleFormat::Table)]
        format: LifecycleFormat,
    },
    /// Act on a batch.
    Batch {
        /// The batch id (bid0000000001).
        bid: Bid,
        /// The action.
        #[command(subcommand)]
        action: BatchAction,
    },
    /// Act on a job.
    Job {
        /// The job id (jid0000000001).
        jid: Jid,
        /// The action.
        #[command(subcommand)]
        action: JobAction,
    },
    /// Hold or release a collection.
    Collection {
        /// The collection profile.
        profile: String,
        /// The action.
        #[command(subcommand)]
        action: CollectionAction,
    },
    /// Pause or resume the ingest queue.
    Queue {
        /// The action.
        #[command(subcommand)]
        action: QueueAction,
    },
    /// Remove finished (Completed or Deleted) batches from the live tree; their history stays.
    Cleanup {
        /// Only batches last changed before this time (RFC 3339).
        #[arg(long)]
        before: Option<chrono::DateTime<chrono::Utc>>,
    },
    /// Print the ZooKeeper tree the log projects (or, with --live, the live one), as YAML.
    Tree(zk::TreeArgs),
    /// Project the log into ZooKeeper: catch up from the checkpoint (and, with --follow, keep going).
    Project(zk::ProjectArgs),
    /// Rebuild the live ZooKeeper tree from the log after an incident (worker locks are left alone).
    Rebuild(zk::RebuildArgs),
    /// Compare the live ZooKeeper tree with what the log says it should be (exit 1 on drift).
    Diff(zk::DiffArgs),
    /// Run the queue service: the engine, the ZooKeeper projector and the HTTP API in one process (until SIGTERM or Ctrl-C).
    Serve(Box<ingest_config::ServeArgs>),
    /// Run worker daemons (simulated steps) against a server's API and ZooKeeper (until SIGTERM or Ctrl-C).
    Worker(Box<ingest_worker::WorkerArgs>),
    /// An object in the inventory: by ark, or by collection and local id.
    Inventory {
        /// The ark (ark:/NAAN/NAME).
        #[arg(required_unless_present = "local_id")]
        ark: Option<String>,
        /// The collection of --local-id.
        #[arg(long, requires = "local_id")]
        collection: Option<String>,
        /// A local id (with --collection).
        #[arg(long, requires = "collection")]
        local_id: Option<String>,
        /// Output format.
        #[arg(long, value_enum, default_value_t = Format::Yaml)]
        format: Format,
    },
    /// Storage-manifest signing keys: make one, or publish its public key.
    Keys {
        /// The action.
        #[command(subcommand)]
        action: KeysAction,
    },
    /// Counts of batches and jobs by state, holds, pause, log head.
    Status {
        /// Output format.
        #[arg(long, value_enum, default_value_t = Format::Yaml)]
        format: Format,
    },
}

/// `ingest submit` options.
#[derive(Debug, Args)]
pub struct SubmitArgs {
    /// A submission file (YAML or JSON) with the fields below.
    #[arg(long, value_name = "FILE")]
    pub file: Option<PathBuf>,
    /// The collection profile.
    #[arg(long)]
    pub profile: Option<String>,
    /// Who submits.
    #[arg(long)]
    pub submitter: Option<String>,
    /// The payload URL.
    #[arg(long)]
    pub payload_url: Option<String>,
    /// file, container, object-manifest, single-file-batch-manifest, container-batch-manifest, batch-manifest.
    #[arg(long = "type")]
    pub payload_type: Option<String>,
    /// add or update.
    #[arg(long)]
    pub submission_mode: Option<String>,
    /// The response type (json, xml, …).
    #[arg(long)]
    pub response_type: Option<String>,
    /// An inline manifest line `URL [LOCAL_ID [ARK]]`; repeat for several.
    #[arg(long = "manifest", value_name = "LINE")]
    pub manifest: Vec<String>,
    /// ERC who.
    #[arg(long)]
    pub erc_who: Option<String>,
    /// ERC what (title).
    #[arg(long)]
    pub erc_what: Option<String>,
    /// ERC when (date).
    #[arg(long)]
    pub erc_when: Option<String>,
    /// ERC where (local id).
    #[arg(long)]
    pub erc_where: Option<String>,
    /// The depositor's digest of a single-file payload, ALGORITHM:HEX.
    #[arg(long)]
    pub digest: Option<String>,
}

/// What `show` shows.
#[derive(Debug, Subcommand)]
pub enum ShowWhat {
    /// A batch with its jobs.
    Batch {
        /// The batch id.
        bid: Bid,
    },
    /// A job.
    Job {
        /// The job id.
        jid: Jid,
    },
}

/// Actions on a batch.
#[derive(Debug, Subcommand)]
pub enum BatchAction {
    /// Acquire a pending batch: Held if its collection is held, else create its jobs (Processing).
    Acquire,
    /// Release a held batch (Held -> Pending) once its collection is no longer held.
    Release(Reason),
    /// Ask for a new report of a failed batch (Failed -> UpdateReporting).
    UpdateReporting(Reason),
    /// Report a batch in Reporting or UpdateReporting (-> Completed or Failed).
    Report {
        /// The error of sending the report, if it failed.
        #[arg(long)]
        notification_error: Option<String>,
    },
    /// Delete a Held or Failed batch and its deletable jobs (soft: status Deleted).
    Delete(Reason),
}

/// Actions on a job.
#[derive(Debug, Subcommand)]
pub enum JobAction {
    /// Acquire a pending job: Held if its collection is held, else Estimating.
    Start,
    /// The current step succeeded: move to its success state.
    Success(MoveArgs),
    /// The current step failed: move to its fail state.
    Fail(MoveArgs),
    /// Move to an explicit state (an admin's force, e.g. `move failed`).
    Move {
        /// The target state.
        state: JobState,
        /// Options.
        #[command(flatten)]
        args: MoveArgs,
    },
    /// Record the space the job needs (estimating).
    Space {
        /// Bytes.
        bytes: u64,
        /// A new priority (0-99).
        #[arg(long)]
        priority: Option<u8>,
    },
    /// Record the job's ark and local ids (processing).
    Identifiers {
        /// The ark.
        #[arg(long)]
        ark: Option<String>,
        /// Local ids, `;`-separated.
        #[arg(long)]
        local_id: Option<String>,
    },
    /// Record the storage step's parameters.
    Store {
        /// The storage manifest URL.
        #[arg(long)]
        manifest_url: String,
        /// add or update.
        #[arg(long, default_value = "add")]
        mode: String,
        /// Delete files absent from the manifest.
        #[arg(long)]
        delete: bool,
    },
    /// Record the inventory step's parameters.
    Inventory {
        /// The storage manifest URL.
        #[arg(long)]
        manifest_url: String,
        /// add or update.
        #[arg(long, default_value = "add")]
        mode: String,
    },
    /// Requeue a Failed job at the step after its last successful status (retry_count + 1).
    Requeue(Reason),
    /// Hold a Pending job.
    Hold(Reason),
    /// Release a Held job (-> Pending).
    Release(Reason),
    /// Delete a Held or Failed job (soft: status Deleted).
    Delete(Reason),
}

/// Options of a status move.
#[derive(Debug, Args)]
pub struct MoveArgs {
    /// Why (the step's error for a failure).
    #[arg(long, default_value = "")]
    pub message: String,
    /// A new priority (0-99) set together with the move.
    #[arg(long)]
    pub priority: Option<u8>,
}

/// A reason recorded with an admin action.
#[derive(Debug, Args)]
pub struct Reason {
    /// Why; recorded with the event.
    #[arg(long, default_value = "")]
    pub reason: String,
}

/// Actions on a collection.
#[derive(Debug, Subcommand)]
pub enum CollectionAction {
    /// Hold the collection: its new batches and jobs park in Held.
    Hold(Reason),
    /// Release the collection and every held batch and job of it.
    Release(Reason),
    /// Release every held job of the collection (the hold stays).
    ReleaseJobs(Reason),
}

/// Signing-key actions.
#[derive(Debug, Subcommand)]
pub enum KeysAction {
    /// Make a new Ed25519 key (PKCS#8 PEM, mode 0600); refuses to overwrite.
    Generate {
        /// Where to write it.
        file: PathBuf,
    },
    /// Print the public key (SPKI PEM) and its fingerprint, for verifiers.
    Show {
        /// The key file.
        file: PathBuf,
    },
}

/// Actions on the queue.
#[derive(Debug, Subcommand)]
pub enum QueueAction {
    /// Pause: no job leaves Pending.
    Pause(Reason),
    /// Resume.
    Resume(Reason),
}

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
    if let Cmd::Lifecycle { format } = &cli.command {
        print!(
            "{}",
            match format {
                LifecycleFormat::Table => lifecycle.table(),
                LifecycleFormat::Mermaid => lifecycle.mermaid(),
            }
        );
        return Ok(0);
    }
    if let Cmd::Keys { action } = &cli.command {
        return keys(action);
    }
    if let Some(base) = cli.engine.clone() {
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
            ShowWhat::Batch { bid } => backend.batch(bid).and_then(|v| emit(&v, format)),
            ShowWhat::Job { jid } => backend.job(jid).and_then(|v| emit(&v, format)),
        },
        Cmd::History { batch, job, format } => {
            let rows = match (batch, job) {
                (Some(bid), _) => backend.batch_history(bid),
                (None, Some(jid)) => backend.job_history(jid),
                (None, None) => bail!("give --batch BID or --job JID"),
            };
            rows.and_then(|rows| match format {
                Format::Table => {
                    write_stdout(&table(&rows));
                    Ok(())
                }
                f => emit(&rows, f),
            })
        }
        Cmd::Status { format } => backend.status().and_then(|v| emit(&v, format)),
        Cmd::Verify => {
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

/// The admin actions: the engine command and the API route of each.
fn admin_action(command: Cmd) -> Result<Result<AdminAction, Box<Cmd>>> {
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

/// The commands that need the data directory itself: worker reports,
/// repair, the ZooKeeper commands, inventory, cleanup.
fn local_only(local: &mut Local, command: Cmd) -> Result<i32> {
    let actor = local.actor.clone();
    let engine = &mut local.engine;
    match command {
        Cmd::Lifecycle { .. } | Cmd::Serve(_) | Cmd::Worker(_) | Cmd::Keys { .. } => Ok(0),
        Cmd::Inventory {
            ark,
            collection,
            local_id,
            format,
        } => inventory(engine, ark, collection.zip(local_id), format),
        Cmd::Repair { yes } => repair(engine, yes),
        Cmd::Batch { bid, action } => {
            let command = match action {
                BatchAction::Acquire => {
                    let b = engine
                        .state()
                        .batches
                        .get(&bid)
                        .with_context(|| format!("batch {bid} does not exist"))?;
                    let jobs: Vec<JobSpec> = expand_simple(&b.submission)
                        .with_context(|| format!("cannot expand batch {bid}"))?;
                    Command::AcquireBatch { bid, jobs }
                }
                BatchAction::Report { notification_error } => Command::ReportBatch {
                    bid,
                    notification_error,
                },
                BatchAction::Release(_)
                | BatchAction::UpdateReporting(_)
                | BatchAction::Delete(_) => {
                    bail!("an admin action is run by the common path")
                }
            };
            run_command(engine, &actor, &command)
        }
        Cmd::Job { jid, action } => {
            let command = match action {
                JobAction::Start => Command::StartJob { jid },
                JobAction::Success(m) => Command::SetJobStatus {
                    jid,
                    target: Target::Success,
                    message: m.message,
                    priority: m.priority,
                },
                JobAction::Fail(m) => Command::SetJobStatus {
                    jid,
                    target: Target::Fail,
                    message: m.message,
                    priority: m.priority,
                },
                JobAction::Move { state, args } => Command::SetJobStatus {
                    jid,
                    target: Target::To(state),
                    message: args.message,
                    priority: args.priority,
                },
                JobAction::Space { bytes, priority } => Command::RecordSpace {
                    jid,
                    space_needed: bytes,
                    priority,
                },
                JobAction::Identifiers { ark, local_id } => Command::RecordIdentifiers {
                    jid,
                    identifiers: Identifiers {
                        primary_id: ark,
                        local_ids: local_id.as_deref().map(split_local_ids).unwrap_or_default(),
                    },
                },
                JobAction::Store {
                    manifest_url,
                    mode,
                    delete,
                } => Command::RecordStore {
                    jid,
                    store: StoreParams {
                        manifest_url,
                        mode,
                        delete,
                    },
                },
                JobAction::Inventory { manifest_url, mode } => Command::RecordInventory {
                    jid,
                    inventory: InventoryParams { manifest_url, mode },
                },
                JobAction::Requeue(_)
                | JobAction::Hold(_)
                | JobAction::Release(_)
                | JobAction::Delete(_) => bail!("an admin action is run by the common path"),
            };
            run_command(engine, &actor, &command)
        }
        Cmd::Cleanup { before } => {
            let code = run_command(engine, &actor, &Command::Cleanup { before })?;
            Ok(code)
        }
        Cmd::Tree(args) => zk::tree(engine, args),
        Cmd::Project(args) => zk::project(engine, args),
        Cmd::Rebuild(args) => zk::rebuild(engine, args),
        Cmd::Diff(args) => zk::diff(engine, &actor, args),
        Cmd::Submit(_)
        | Cmd::Show { .. }
        | Cmd::History { .. }
        | Cmd::Status { .. }
        | Cmd::Verify
        | Cmd::Collection { .. }
        | Cmd::Queue { .. } => bail!("this command is run by the common path"),
    }
}

/// Reads a submission file (YAML or JSON).
///
/// # Errors
/// When the file cannot be read or parsed; the message names the file and
/// the line.
fn submission_file(path: &std::path::Path) -> Result<SubmissionInput> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read submission file {}", path.display()))?;
    serde_norway::from_str(&text)
        .with_context(|| format!("invalid submission file {}", path.display()))
}

/// The submission `ingest submit`'s options and file describe (options
/// override the file).
///
/// # Errors
/// An unreadable or invalid submission file.
pub(crate) fn submission_input(args: SubmitArgs) -> Result<SubmissionInput> {
    let from_options = SubmissionInput {
        submitter: args.submitter,
        profile: args.profile,
        payload_type: args.payload_type,
        payload_url: args.payload_url,
        submission_mode: args.submission_mode,
        response_type: args.response_type,
        manifest: args.manifest,
        erc_who: args.erc_who,
        erc_what: args.erc_what,
        erc_when: args.erc_when,
        erc_where: args.erc_where,
        digest: args.digest,
        extra: Default::default(),
    };
    Ok(match &args.file {
        Some(path) => from_options.or(submission_file(path)?),
        None => from_options,
    })
}

/// Runs one command on the engine and prints what it appended; a refusal
/// prints `refused: …` and gives exit code 1.
fn run_command(engine: &mut Engine, actor: &Actor, command: &Command) -> Result<i32> {
    match engine.execute(actor, command) {
        Ok(outcome) => {
            let rows: Vec<HistoryRow> = outcome.records.iter().map(HistoryRow::from).collect();
            print_rows(&rows);
            Ok(0)
        }
        Err(EngineError::Rejected(r)) => {
            eprintln!("refused: {r}");
            Ok(1)
        }
        Err(e) => Err(e.into()),
    }
}

/// Prints appended events, one line each (`nothing to do` for none).
fn print_rows(rows: &[HistoryRow]) {
    if rows.is_empty() {
        println!("nothing to do");
    }
    let mut out = std::io::stdout().lock();
    for r in rows {
        let _ = writeln!(
            out,
            "#{:<6} {:<13} {:<22} {}",
            r.position, r.stream, r.event, r.detail
        );
    }
}

/// Prints a verification and gives its exit code (1 when it failed).
fn print_verified(v: &ingest_protocol::api::Verified) -> i32 {
    for p in &v.problems {
        println!("position {}: {}", p.position, p.message);
    }
    println!(
        "{} events checked, {} stream index entries checked, head position {}, head hash {}",
        v.events_checked, v.index_entries_checked, v.head_position, v.head_hash
    );
    if v.problems.is_empty() {
        println!("ok: the hash chain and the stream index verify");
        0
    } else {
        println!("FAILED: {} problem(s)", v.problems.len());
        1
    }
}

fn keys(action: &KeysAction) -> Result<i32> {
    use ingest_steps::signing::SigningKeyFile;
    let (key, made) = match action {
        KeysAction::Generate { file } => (
            SigningKeyFile::generate(file)
                .with_context(|| format!("cannot make a key at {}", file.display()))?,
            true,
        ),
        KeysAction::Show { file } => (
            SigningKeyFile::load(file)
                .with_context(|| format!("cannot read the key {}", file.display()))?,
            false,
        ),
    };
    if made {
        eprintln!(
            "wrote a new signing key to {}; give it to ingest with --signing-key",
            key.path().display()
        );
    }
    println!("# fingerprint {}", key.fingerprint());
    print!("{}", key.public_key_pem());
    Ok(0)
}

fn inventory(
    engine: &Engine,
    ark: Option<String>,
    local: Option<(String, String)>,
    format: Format,
) -> Result<i32> {
    let tree = engine
        .log()
        .side_tree("inventory")
        .context("cannot open the inventory")?;
    let inventory = ingest_steps::inventory::Inventory::new(tree);
    let ark = match (ark, local) {
        (Some(ark), _) => ark,
        (None, Some((collection, local_id))) => {
            match inventory.by_local_id(&collection, &local_id)? {
                Some(ark) => ark,
                None => {
                    eprintln!("no object with local id {local_id:?} in collection {collection}");
                    return Ok(1);
                }
            }
        }
        (None, None) => bail!("give an ark, or --collection and --local-id"),
    };
    let versions = inventory.versions(&ark)?;
    if versions.is_empty() {
        eprintln!("no object {ark} in the inventory");
        return Ok(1);
    }
    emit(
        &serde_json::json!({"ark": ark, "versions": versions}),
        format,
    )?;
    Ok(0)
}

fn repair(engine: &Engine, yes: bool) -> Result<i32> {
    let log = engine.log();
    let Some((position, reason)) = log.needs_repair() else {
        println!(
            "the log's tail verifies; nothing to repair (run `ingest verify` for the whole chain)"
        );
        return Ok(0);
    };
    let (head, _) = log.head();
    if !yes {
        println!("the tail fails at position {position} ({reason}); `ingest repair --yes` would remove positions {position}..={head}");
        return Ok(1);
    }
    let removed = log.repair_tail()?;
    println!(
        "removed the torn tail, positions {}..={} ({} event(s)); the log now ends at {} and accepts appends",
        removed.start(),
        removed.end(),
        removed.end() - removed.start() + 1,
        removed.start() - 1
    );
    Ok(0)
}

fn emit<T: Serialize>(value: &T, format: Format) -> Result<()> {
    match format {
        Format::Json => write_stdout(&format!("{}\n", serde_json::to_string_pretty(value)?)),
        Format::Yaml | Format::Table => write_stdout(&serde_norway::to_string(value)?),
    }
    Ok(())
}

/// Writes `text` to stdout. A reader that went away (`ingest tree | head`)
/// ends the process quietly with code 0 instead of a panic.
pub(crate) fn write_stdout(text: &str) {
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("error: cannot write to stdout: {e}");
        std::process::exit(1);
    }
}
