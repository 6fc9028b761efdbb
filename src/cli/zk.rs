//! The ZooKeeper commands of the CLI: `tree`, `project`, `rebuild`, `diff`.
//!
//! Thin glue over `ingest_projections`: the [`Sink`] (`project`), the
//! in-place convergence of `rebuild` and `diff --repair`, and
//! `materialize`-style time travel (`tree --at`). Each command that talks
//! to ZooKeeper runs on its own small tokio runtime.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use chrono::Utc;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use ingest_events::command::Command;
use ingest_events::Actor;
use ingest_projections::rebuild::{self, Progress};
use ingest_projections::zk::{self as zkio, ReadOptions};
use ingest_projections::SinkError;
use ingest_projections::{
    AdminConfig, RunMode, Sink, SinkConfig, SinkState, SinkStatus, Tree, TxnLimits, ZkConfig,
};

use ingest_engine::tree::tree_from_log;
use ingest_engine::{Engine, EngineError};

pub use ingest_config::ZkArgs;

/// Transaction caps.
#[derive(Debug, Clone, Args)]
pub struct TxnArgs {
    /// Cap on the serialized bytes of one ZooKeeper transaction (keep it well under jute.maxbuffer, 1 MiB by default).
    #[arg(long, value_name = "BYTES", default_value_t = 512 * 1024)]
    pub max_txn_bytes: usize,
    /// Cap on the node operations of one transaction.
    #[arg(long, value_name = "N", default_value_t = 4096)]
    pub max_txn_ops: usize,
}

/// `ingest tree` options.
#[derive(Debug, Clone, Args)]
pub struct TreeArgs {
    /// The tree as it was after this log position, or at this time (RFC 3339).
    #[arg(long, value_name = "POSITION|TIME", conflicts_with = "live")]
    pub at: Option<String>,
    /// Only the node at this path and those under it.
    #[arg(long, value_name = "PREFIX")]
    pub path: Option<String>,
    /// Print the live tree read from ZooKeeper (needs --zk).
    #[arg(long)]
    pub live: bool,
    /// With --live: include /ingest-engine and ephemeral nodes (worker locks, the leader).
    #[arg(long, requires = "live")]
    pub all: bool,
    /// ZooKeeper.
    #[command(flatten)]
    pub zk: ZkArgs,
}

/// `ingest project` options.
#[derive(Debug, Args)]
pub struct ProjectArgs {
    /// ZooKeeper.
    #[command(flatten)]
    pub zk: ZkArgs,
    /// Transaction caps.
    #[command(flatten)]
    pub txn: TxnArgs,
    /// Keep following the log until Ctrl-C or SIGTERM (then finish the transaction in flight).
    #[arg(long)]
    pub follow: bool,
}

/// `ingest rebuild` options.
#[derive(Debug, Args)]
pub struct RebuildArgs {
    /// ZooKeeper.
    #[command(flatten)]
    pub zk: ZkArgs,
    /// Transaction caps.
    #[command(flatten)]
    pub txn: TxnArgs,
    /// Re-take a tree whose checkpoint is not this log's (tampered with, foreign, unreadable or ahead): first show what the rebuild would change and ask (or --yes), then rebuild and record a TreeRepaired event naming the admin.
    #[arg(long)]
    pub force: bool,
    /// With --force: do not ask (needed when stdin is not a terminal).
    #[arg(long, requires = "force")]
    pub yes: bool,
    /// Tests only: pause this long after each transaction, in milliseconds (a rebuild slow enough to be killed half-way).
    #[arg(long, value_name = "MS", default_value_t = 0, hide = true)]
    pub txn_pause_ms: u64,
    /// How long to wait for a running projector to give up leadership, in seconds.
    #[arg(long, value_name = "SECS", default_value_t = 10.0)]
    pub leader_wait: f64,
}

/// `ingest diff` options.
#[derive(Debug, Args)]
pub struct DiffArgs {
    /// ZooKeeper.
    #[command(flatten)]
    pub zk: ZkArgs,
    /// Apply the difference to the live tree and record the repair in the log.
    /// On a data directory this takes the projector's role (stop the
    /// server first); with `--engine URL` the server's running projector
    /// converges each drifted item, recorded in its history.
    #[arg(long)]
    pub repair: bool,
    /// Transaction caps (for --repair).
    #[command(flatten)]
    pub txn: TxnArgs,
    /// With --repair: how long to wait for a running projector to give up leadership, in seconds.
    #[arg(long, value_name = "SECS", default_value_t = 10.0)]
    pub leader_wait: f64,
}

pub(super) fn seconds(value: f64, what: &str) -> Result<Duration> {
    if !value.is_finite() || value <= 0.0 || value > 86_400.0 {
        bail!("{what} must be a number of seconds between 0 and 86400, got {value}");
    }
    Ok(Duration::from_secs_f64(value))
}

pub(super) fn zk_config(args: &ZkArgs) -> Result<ZkConfig> {
    args.require()
        .map_err(|e| super::exit::Usage(e.to_string()).into())
}

pub(super) fn limits(args: &TxnArgs) -> TxnLimits {
    TxnLimits {
        max_bytes: args.max_txn_bytes,
        max_ops: args.max_txn_ops,
    }
}

/// Who this engine is, for the leader node: host and data directory.
pub(super) fn identity(engine: &Engine) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".into());
    let dir = std::fs::canonicalize(engine.data_dir())
        .unwrap_or_else(|_| engine.data_dir().to_path_buf());
    format!("ingest@{host}:{}", dir.display())
}

pub(super) fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

fn bar_style(template: &str) -> ProgressStyle {
    ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_bar())
}

// ---------------------------------------------------------------------------
// zk-digest

/// Runs `ingest zk-digest`: prints the digest identity of credentials.
///
/// # Errors
/// No credentials, or credentials that are not `user:password`.
pub fn digest(file: Option<&std::path::Path>) -> Result<i32> {
    let credentials = ingest_config::zk::read_credentials(file)
        .map_err(|e| super::exit::Usage(e.to_string()))?
        .ok_or_else(|| {
            super::exit::Usage(format!(
                "give the credentials with --auth-file FILE or in {}",
                ingest_config::zk::AUTH_ENV
            ))
        })?;
    println!("{}", credentials.id());
    Ok(0)
}

// ---------------------------------------------------------------------------
// tree

/// Runs `ingest tree`.
///
/// # Errors
/// A log that cannot be read, a bad `--at`, or ZooKeeper trouble with `--live`.
pub fn tree(engine: &mut Engine, args: TreeArgs) -> Result<i32> {
    if args.live {
        return tree_live(args);
    }
    let tree = tree_from_log(engine.log(), args.at.as_deref())?;
    print_tree(&tree, args.path.as_deref());
    Ok(0)
}

/// Runs `ingest tree --live`: the tree read from ZooKeeper (no data
/// directory needed).
///
/// # Errors
/// No ZooKeeper settings, or ZooKeeper cannot be read.
pub fn tree_live(args: TreeArgs) -> Result<i32> {
    let tree = {
        let config = zk_config(&args.zk)?;
        let all = args.all;
        let live = runtime()?.block_on(async {
            let client = zkio::connect(&config).await?;
            zkio::read_tree(
                &client,
                &config,
                ReadOptions {
                    include_engine: all,
                },
            )
            .await
        });
        let live = live.with_context(|| {
            format!(
                "cannot read the live tree under {} from {}",
                config.root, config.hosts
            )
        })?;
        if all {
            live.tree
        } else {
            live.without_ephemeral()
        }
    };
    print_tree(&tree, args.path.as_deref());
    Ok(0)
}

fn print_tree(tree: &Tree, path: Option<&str>) {
    let text = tree.dump_yaml(path);
    if text.is_empty() {
        if let Some(p) = path {
            eprintln!("no node at or under {p}");
        }
    }
    super::write_stdout(&text);
}

// ---------------------------------------------------------------------------
// project

/// Runs `ingest project`.
///
/// # Errors
/// Invalid settings, or an error of the sink that needs an operator (drift,
/// a tree of another log, an oversized event).
pub fn project(engine: &mut Engine, args: ProjectArgs) -> Result<i32> {
    let zk = zk_config(&args.zk)?;
    let root = zk.root.clone();
    let mut config = SinkConfig::new(zk.clone(), identity(engine));
    config.limits = limits(&args.txn);
    // A rebuild that died half-way is finished before projecting.
    let mut admin = AdminConfig::new(zk, identity(engine));
    admin.limits = config.limits;
    config.resume = Some(ingest_projections::Resumer(std::sync::Arc::new(
        ingest_projections::Resume::new(engine.shared_log(), admin),
    )));
    let sink = Sink::new(engine.shared_log(), config)?;
    let status = sink.status();
    let mode = if args.follow {
        RunMode::Follow
    } else {
        RunMode::CatchUp
    };
    let rt = runtime()?;
    let mut interrupted = None;
    let report = rt.block_on(async {
        // SIGTERM or Ctrl-C: the sink stops after its transaction in flight.
        let stop = ingest_config::shutdown::on_signal();
        interrupted = Some(stop.clone());
        let progress = tokio::spawn(show_progress(status, args.follow));
        let result = sink.run(mode, stop).await;
        // The status channel closes with the run, which ends the display.
        let leader = progress.await.ok().flatten();
        (result, leader)
    });
    let (report, leader) = report;
    let report = report.with_context(|| format!("projecting into {root}"))?;
    if let Some(leader) = leader {
        println!(
            "another projector led {root} ({leader}); this one stood by, and the tree reached position {}",
            report.checkpoint.position
        );
    }
    println!(
        "projected {} events ({} node operations in {} transactions) into {root}; checkpoint {}",
        report.events_applied, report.ops_applied, report.transactions, report.checkpoint
    );
    if interrupted.is_some_and(|t| t.is_cancelled()) && !args.follow {
        println!("interrupted before the end of the log");
        return Ok(130);
    }
    Ok(0)
}

/// A progress bar on a terminal, log lines every few seconds otherwise,
/// until the run ends; returns the leader this sink last stood by for.
async fn show_progress(
    mut status: tokio::sync::watch::Receiver<SinkStatus>,
    follow: bool,
) -> Option<String> {
    let mut stood_by = None;
    let tty = std::io::stderr().is_terminal();
    let bar = tty.then(|| {
        let bar = ProgressBar::new(0);
        bar.set_style(bar_style(
            "{spinner} {msg:>12} [{bar:40}] {pos}/{len} events ({per_sec}, eta {eta})",
        ));
        bar
    });
    let mut last_line = Instant::now();
    loop {
        let s = status.borrow_and_update().clone();
        match &s.state {
            SinkState::Standby { leader } => stood_by = Some(leader.clone()),
            SinkState::Connected => stood_by = None,
            _ => {}
        }
        let state = match &s.state {
            SinkState::Connected if s.events_behind == 0 && follow => "following".to_string(),
            SinkState::Connected => "projecting".to_string(),
            SinkState::Disconnected => "disconnected".to_string(),
            SinkState::Standby { .. } => "standing by".to_string(),
            SinkState::Starting => "connecting".to_string(),
            other => format!("{other:?}").to_lowercase(),
        };
        match &bar {
            Some(bar) => {
                bar.set_length(s.durable);
                bar.set_position(s.checkpoint);
                bar.set_message(state);
            }
            None if last_line.elapsed() >= Duration::from_secs(2) => {
                last_line = Instant::now();
                tracing::info!(
                    state = %state,
                    checkpoint = s.checkpoint,
                    durable = s.durable,
                    events_behind = s.events_behind,
                    seconds_behind = format!("{:.1}", s.seconds_behind_at(Utc::now())),
                    events = s.events_applied,
                    ops = s.ops_applied,
                    "projection progress"
                );
            }
            None => {}
        }
        if status.changed().await.is_err() {
            break;
        }
    }
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    stood_by
}

// ---------------------------------------------------------------------------
// rebuild and diff

/// Progress of rebuild and repair, on a terminal.
struct AdminProgress {
    bar: Option<ProgressBar>,
    phase: u8,
}

impl AdminProgress {
    fn new() -> AdminProgress {
        AdminProgress {
            bar: std::io::stderr().is_terminal().then(|| ProgressBar::new(0)),
            phase: 0,
        }
    }

    fn update(&mut self, p: Progress) {
        let Some(bar) = &self.bar else {
            if let Progress::Reading { nodes } = p {
                tracing::info!(nodes, "read the live tree");
            }
            return;
        };
        let (phase, msg, pos, len) = match p {
            Progress::Projecting { done, total } => (1, "projecting the log", done, total),
            Progress::Reading { nodes } => (2, "read the live tree", nodes as u64, nodes as u64),
            Progress::Applying { done, total } => (3, "applying", done as u64, total as u64),
        };
        if phase != self.phase {
            self.phase = phase;
            bar.reset();
            bar.set_style(bar_style("{msg:>20} [{bar:40}] {pos}/{len}"));
            bar.set_message(msg);
        }
        bar.set_length(len);
        bar.set_position(pos);
    }

    fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

/// Runs `ingest rebuild`.
///
/// # Errors
/// Invalid settings, leadership held by a running projector, a tree of
/// another log (without `--force`), or ZooKeeper trouble (retrying is safe).
pub fn rebuild(engine: &mut Engine, actor: &Actor, args: RebuildArgs) -> Result<i32> {
    let zk = zk_config(&args.zk)?;
    let root = zk.root.clone();
    let mut config = AdminConfig::new(zk, identity(engine));
    config.limits = limits(&args.txn);
    config.leader_wait = seconds(args.leader_wait, "--leader-wait")?;
    config.force = args.force;
    config.txn_pause = Duration::from_millis(args.txn_pause_ms);
    let log = engine.shared_log();
    let rt = runtime()?;
    if args.force && !confirm_force(&rt, &log, &config.zk, args.yes)? {
        println!("nothing was changed");
        return Ok(1);
    }
    let mut progress = AdminProgress::new();
    let report = rt.block_on(rebuild::rebuild(&log, &config, &mut |p| progress.update(p)));
    progress.finish();
    let report = report.with_context(|| format!("rebuilding the tree under {root}"))?;
    let c = &report.converge;
    if let Some(previous) = &report.previous {
        println!("the tree was at {previous}");
    }
    if report.resumed {
        println!("a rebuild that had not finished was found and finished (its marker is removed, the queue's pause is what the log says)");
    }
    println!(
        "rebuilt the tree under {root} from the log: {} node(s) created, {} set, {} deleted in {} transaction(s), {} round(s); {} node(s) expected",
        c.created, c.set, c.deleted, c.transactions, c.rounds, report.expected_nodes
    );
    println!(
        "worker locks: {} left alone, {} deleted with their node",
        c.locks_kept,
        c.locks_deleted.len()
    );
    for l in &c.locks_deleted {
        println!("  deleted lock {l}");
    }
    if report.secured > 0 {
        println!(
            "ACLs set on {} node(s): written by this identity only, read by anyone",
            report.secured
        );
    }
    println!("checkpoint {}", report.checkpoint);
    if args.force {
        // A forced rebuild overrode what the tree said it held: an admin's
        // decision, recorded with what it changed.
        let mut paths = vec![ingest_projections::checkpoint::CHECKPOINT_NODE.to_string()];
        paths.extend(c.paths.iter().take(MAX_RECORDED_PATHS).cloned());
        if c.paths.len() > MAX_RECORDED_PATHS {
            paths.push(format!(
                "(and {} more path(s))",
                c.paths.len() - MAX_RECORDED_PATHS
            ));
        }
        return record_repair(engine, actor, &paths);
    }
    if c.stale_locks_removed.is_empty() {
        return Ok(0);
    }
    // A rebuild restores what the log says and records nothing, except
    // the stale locks it removed: those were no one's, and their removal
    // is an admin's action on the live tree.
    for l in &c.stale_locks_removed {
        println!("  removed stale lock {l}");
    }
    record_repair(engine, actor, &c.stale_locks_removed)
}

/// Paths a forced rebuild's `TreeRepaired` event names, at most.
const MAX_RECORDED_PATHS: usize = 1000;

/// Paths of each kind a `--force` preview lists.
const PREVIEW_PATHS: usize = 20;

/// Shows what a forced rebuild would change and asks; `true` to go on.
fn confirm_force(
    rt: &tokio::runtime::Runtime,
    log: &ingest_events::Log,
    zk: &ZkConfig,
    yes: bool,
) -> Result<bool> {
    let mut progress = AdminProgress::new();
    let preview = rt.block_on(rebuild::preview(log, zk, &mut |p| progress.update(p)));
    progress.finish();
    let p = preview.with_context(|| format!("reading the tree under {}", zk.root))?;
    let d = &p.diff;
    println!(
        "the tree under {}: its checkpoint is {}",
        zk.root, p.checkpoint
    );
    println!(
        "rebuilding it to position {} of this log would create {} node(s), set {}, delete {}, and remove {} stale lock(s):",
        p.target,
        d.missing.len(),
        d.differing.len(),
        d.unexpected.len(),
        p.stale_locks.len()
    );
    let list = |sign: &str, paths: &mut dyn Iterator<Item = &String>, total: usize| {
        for path in paths.take(PREVIEW_PATHS) {
            println!("  {sign} {path}");
        }
        if total > PREVIEW_PATHS {
            println!("  {sign} … and {} more", total - PREVIEW_PATHS);
        }
    };
    list("+", &mut d.missing.iter(), d.missing.len());
    list(
        "~",
        &mut d.differing.iter().map(|x| &x.path),
        d.differing.len(),
    );
    list("-", &mut d.unexpected.iter(), d.unexpected.len());
    list("-", &mut p.stale_locks.iter(), p.stale_locks.len());
    println!("the checkpoint is set to this log's position {}, and the rebuild is recorded as a TreeRepaired event", p.target);
    if yes {
        return Ok(true);
    }
    if !std::io::stdin().is_terminal() {
        return Err(super::exit::Usage(
            "rebuild --force changes the tree shown above: run it on a terminal to answer, or add --yes".into(),
        )
        .into());
    }
    eprint!("re-take the tree under {}? [y/N] ", zk.root);
    let mut answer = String::new();
    std::io::stdin()
        .read_line(&mut answer)
        .context("reading the answer")?;
    Ok(matches!(answer.trim(), "y" | "Y" | "yes"))
}

/// Records a repair of the live tree (`TreeRepaired`) naming `paths`:
/// exit 0, or 2 when the log refused it.
fn record_repair(engine: &mut Engine, actor: &Actor, paths: &[String]) -> Result<i32> {
    let command = Command::RecordRepair {
        paths: paths.to_vec(),
    };
    match engine.execute(actor, &command) {
        Ok(outcome) => {
            for r in &outcome.records {
                println!(
                    "recorded as event #{} ({}, {} path(s))",
                    r.envelope.position,
                    r.event.kind(),
                    paths.len()
                );
            }
            Ok(0)
        }
        Err(EngineError::Rejected(r)) => {
            eprintln!("error: the repair was applied but the log refused to record it: {r}");
            Ok(2)
        }
        Err(e) => Err(e).context("recording the repair in the log"),
    }
}

/// How many events after position `at` would change the tree (events such
/// as a recorded repair change nothing in it).
fn unprojected_changes(log: &ingest_events::Log, at: u64) -> Result<u64> {
    let mut projector = ingest_projections::Projector::new();
    projector.init()?;
    let mut changes = 0;
    for record in log.read_range(1, log.head().0) {
        let record = record?;
        let ops = projector.project(&record)?;
        if record.envelope.position > at && !ops.ops.is_empty() {
            changes += 1;
        }
    }
    Ok(changes)
}

/// Runs `ingest diff`: exit 0 when the live tree matches the log, 1 when it
/// differs, 2 when it could not be compared. With `--repair`, a difference is
/// repaired and recorded (`TreeRepaired`), and the exit code is 0.
///
/// # Errors
/// Invalid settings; ZooKeeper and log trouble is reported with exit 2.
pub fn diff(engine: &mut Engine, actor: &Actor, args: DiffArgs) -> Result<i32> {
    let zk = zk_config(&args.zk)?;
    let root = zk.root.clone();
    let rt = runtime()?;
    let log = engine.shared_log();
    let mut progress = AdminProgress::new();
    let found = rt.block_on(rebuild::diff(&log, &zk, &mut |p| progress.update(p)));
    progress.finish();
    let report = match found {
        Ok(r) => r,
        // A checkpoint that is not this log's (tampered, foreign, ahead, or
        // not a checkpoint at all) is drift of the tree, not an outage: exit
        // 1, as for any other difference (it was 3, "cannot reach").
        Err(
            e @ (SinkError::ForeignTree { .. }
            | SinkError::CheckpointAhead { .. }
            | SinkError::BadCheckpoint { .. }),
        ) => {
            println!("drift: {e}");
            return Ok(super::exit::REFUSED);
        }
        Err(e) => {
            eprintln!("error: cannot compare the tree under {root} with the log: {e}");
            return Ok(super::exit::UNREACHABLE);
        }
    };
    match &report.checkpoint {
        Some(cp) => println!(
            "comparing the live tree under {root} ({} nodes) with the log at its checkpoint, {cp}",
            report.live_nodes
        ),
        None => println!(
            "the tree under {root} has no checkpoint (never projected); comparing it with the base nodes"
        ),
    }
    // This process holds the data directory, so no projector of it runs:
    // a tree behind the log's head will not catch up by itself, and events
    // left out of it are drift, whatever the comparison at its checkpoint
    // says (before, a server stopped before its projector had caught up
    // left a tree that `diff` called clean).
    let head = log.head().0;
    let behind = match unprojected_changes(&log, report.position) {
        Ok(n) => n,
        Err(e) => {
            eprintln!("error: cannot project the log past the tree's checkpoint: {e}");
            return Ok(super::exit::UNREACHABLE);
        }
    };
    if behind > 0 {
        println!(
            "the tree is at position {} but the log's head is {head}: {behind} event(s) that change the tree were never projected",
            report.position
        );
    }
    if !report.locks.is_empty() {
        println!(
            "({} worker lock(s) not compared: {})",
            report.locks.len(),
            report.locks.join(", ")
        );
    }
    for lock in &report.stale_locks {
        println!("stale lock {lock}: not ephemeral, no session owns it; it blocks its item (repair removes it)");
    }
    if let Some(marker) = &report.rebuilding {
        println!("the tree is incomplete: {marker} did not finish; the queue stays paused until `ingest rebuild` (or a starting `ingest serve`) finishes it");
    }
    if !report.has_drift() && behind == 0 {
        println!("no differences: {} nodes match", report.expected_nodes);
        return Ok(0);
    }
    if !report.has_drift() {
        println!(
            "no differences up to the checkpoint: {} nodes match",
            report.expected_nodes
        );
    }
    if !report.diff.is_empty() {
        print!("{}", report.diff);
        println!(
            "{} difference(s): {} missing, {} unexpected, {} differing",
            report.diff.missing.len() + report.diff.unexpected.len() + report.diff.differing.len(),
            report.diff.missing.len(),
            report.diff.unexpected.len(),
            report.diff.differing.len()
        );
    }
    if !args.repair {
        return Ok(1);
    }
    let mut config = AdminConfig::new(zk, identity(engine));
    config.limits = limits(&args.txn);
    config.leader_wait = seconds(args.leader_wait, "--leader-wait")?;
    let mut progress = AdminProgress::new();
    let repaired = rt.block_on(rebuild::repair(&log, &config, &mut |p| progress.update(p)));
    progress.finish();
    let repaired = match repaired {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot repair the tree under {root}: {e}");
            return Ok(2);
        }
    };
    let c = &repaired.converge;
    println!(
        "repaired the tree under {root}: {} node(s) created, {} set, {} deleted in {} transaction(s)",
        c.created, c.set, c.deleted, c.transactions
    );
    for l in &c.stale_locks_removed {
        println!("  removed stale lock {l}");
    }
    if c.paths.is_empty() {
        println!("nothing was left to repair (the tree matched by the time it was locked)");
        return Ok(0);
    }
    record_repair(engine, actor, &c.paths)
}
