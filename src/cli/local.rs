//! The commands that need the data directory itself: worker reports run by
//! hand, repair, inventory, cleanup, keys and the ZooKeeper commands.

use anyhow::{bail, Context, Result};
use ingest_engine::{Engine, EngineError};
use ingest_events::command::{Command, JobSpec, Target};
use ingest_events::event::{Identifiers, InventoryParams, StoreParams};
use ingest_events::Actor;
use ingest_protocol::history::HistoryRow;
use ingest_protocol::submission::{expand_simple, split_local_ids, SubmissionInput};

use super::args::{BatchAction, Cmd, ExportWhat, JobAction, KeysAction, SubmitArgs};
use super::backend::Local;
use super::opts::Format;
use super::output::{emit, print_rows};
use super::zk;

/// The commands that need the data directory itself: worker reports,
/// repair, the ZooKeeper commands, inventory, cleanup.
pub(super) fn local_only(local: &mut Local, command: Cmd) -> Result<i32> {
    let actor = local.actor.clone();
    let engine = &mut local.engine;
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
        Cmd::Access { action } => super::access::local(local, action),
        Cmd::Inventory {
            ark,
            collection,
            local_id,
            format,
        } => inventory(engine, ark, collection.zip(local_id), format),
        Cmd::Repair { yes } => repair(engine, yes),
        Cmd::Audit { action } => super::audit::run(engine, action),
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
                | BatchAction::Delete(_)
                | BatchAction::Show(_)
                | BatchAction::History(_) => {
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
                | JobAction::Delete(_)
                | JobAction::Show(_)
                | JobAction::History(_) => bail!("an admin action is run by the common path"),
            };
            run_command(engine, &actor, &command)
        }
        Cmd::Cleanup { before } => {
            let code = run_command(engine, &actor, &Command::Cleanup { before })?;
            Ok(code)
        }
        Cmd::Tree(args) => zk::tree(engine, args),
        Cmd::Project(args) => zk::project(engine, args),
        Cmd::Rebuild(args) => zk::rebuild(engine, &actor, args),
        Cmd::Diff(args) => zk::diff(engine, &actor, args),
        Cmd::Check(args) => super::check::local(engine, &actor, args),
        Cmd::ZkDigest { .. } => bail!("`zk-digest` is run before the data directory is opened"),
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
pub(super) fn submission_input(args: SubmitArgs) -> Result<SubmissionInput> {
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
        uuid: None,
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

pub(super) fn keys(action: &KeysAction) -> Result<i32> {
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
    emit(&ingest_protocol::api::ObjectView { ark, versions }, format)?;
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
    // The preview and the repair run one check (`Log::repair_plan`), so the
    // preview never promises what the repair then refuses.
    let plan = match log.repair_plan() {
        Ok(plan) => plan,
        Err(ingest_events::LogError::Unrepairable(why)) => {
            println!("the tail fails at position {position} ({reason}); `ingest repair` cannot repair it: {why}");
            return Ok(1);
        }
        Err(e) => return Err(e.into()),
    };
    if !yes {
        println!(
            "the tail fails at position {position} ({reason}); `ingest repair --yes` would remove positions {}..={} ({} event(s)) and nothing else",
            plan.start(),
            plan.end(),
            plan.end() - plan.start() + 1
        );
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

/// `ingest export bagit`: a bag of a stored version, read from a storage
/// target; no data directory, no server.
pub(super) fn export(what: &ExportWhat) -> Result<i32> {
    use ingest_steps::bagit::{export_bag, BagOptions};
    use ingest_steps::digest::Algorithm;
    let ExportWhat::Bagit {
        ark,
        dir,
        version,
        storage_targets,
        target,
        source_organization,
        digests,
    } = what;
    let mut specs = Vec::new();
    for spec in storage_targets {
        // The one parser of NAME=DIR, as serve and the workers read it.
        let (name, root) = ingest_worker::real::marker::parse_spec(spec)
            .map_err(|e| super::exit::Usage(format!("--storage-target: {e}")))?;
        specs.push((name.to_string(), std::path::PathBuf::from(root)));
    }
    let (name, root) = match target {
        Some(t) => specs.iter().find(|(n, _)| n == t).ok_or_else(|| {
            super::exit::Usage(format!(
                "--target {:?} names no --storage-target",
                ingest_protocol::cut(t, 100)
            ))
        })?,
        None => specs
            .first()
            .ok_or_else(|| super::exit::Usage("give --storage-target NAME=DIR".into()))?,
    };
    let mut algorithms = Vec::new();
    for d in digests {
        let a: Algorithm = d.trim().parse().map_err(|_| {
            super::exit::Usage(format!(
                "--digests: {:?} is not one of md5, sha1, sha256, sha512",
                ingest_protocol::cut(d, 40)
            ))
        })?;
        if !algorithms.contains(&a) {
            algorithms.push(a);
        }
    }
    let storage = ingest_steps::ocfl::OcflTarget::open_existing(name, root).with_context(|| {
        format!(
            "cannot open the storage target {name} at {}",
            root.display()
        )
    })?;
    let options = BagOptions {
        source_organization: source_organization.clone(),
        algorithms,
    };
    let bag = export_bag(&storage, ark.trim(), *version, dir, &options).with_context(|| {
        format!(
            "cannot export {} from {name} as a bag",
            ingest_protocol::cut(ark, 200)
        )
    })?;
    println!(
        "bagged {} v{} from {name}: {} file(s), {} bytes, in {}",
        bag.ark,
        bag.version,
        bag.files,
        bag.bytes,
        bag.dir.display()
    );
    Ok(0)
}
