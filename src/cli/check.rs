//! `ingest check`: the consistency report and its repairs, on the data
//! directory (with `--zk` and `--storage-target`) or through a server
//! (`--engine URL`: `GET /consistency`, `POST /consistency/repair`), with
//! the same output.
//!
//! Exit codes (see `exit.rs`): 0 when the report passes (and after
//! applied repairs), 1 when it has a WARN or FAIL finding or a repair was
//! refused, 2 for usage errors, 3 when a source (ZooKeeper, a storage
//! target, the server) cannot be read.

use std::io::{BufRead, IsTerminal, Write};

use anyhow::{bail, Context, Result};
use chrono::Utc;
use clap::Args;
use ingest_engine::consistency::{self, CheckError, RepairContext, Sources};
use ingest_engine::{Engine, EngineError};
use ingest_events::Actor;
use ingest_projections::AdminConfig;
use ingest_protocol::consistency::{ConsistencyReport, Finding, RepairBody, RepairDone, Severity};

use super::backend::{Refused, Remote};
use super::exit;
use super::opts::Format;
use super::output::{emit, table, write_stdout};
use super::zk::{self, TxnArgs, ZkArgs};

/// `ingest check` options.
#[derive(Debug, Args)]
pub struct CheckArgs {
    /// ZooKeeper (the tree rules and the drift need it; without --zk only the storage targets are checked).
    #[command(flatten)]
    pub zk: ZkArgs,
    /// An OCFL storage target to compare with the inventory, NAME=DIR (as `serve --storage-target`; opened read-only); repeat for several.
    #[arg(
        long = "storage-target",
        env = "INGEST_STORAGE_TARGETS",
        value_delimiter = ',',
        value_name = "NAME=DIR"
    )]
    pub storage_targets: Vec<String>,
    /// Output format of the report.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
    /// Apply the repair of this finding (its id from the report) and record it; needs --reason.
    #[arg(long, value_name = "ID", conflicts_with = "repair_all")]
    pub repair: Option<String>,
    /// Apply every repair on offer, one by one (shows them and asks first, unless --yes); needs --reason.
    #[arg(long)]
    pub repair_all: bool,
    /// With --repair-all: do not ask.
    #[arg(long, requires = "repair_all")]
    pub yes: bool,
    /// Why (recorded with each repair).
    #[arg(long, value_name = "TEXT")]
    pub reason: Option<String>,
    /// Transaction caps (for the repair of drift).
    #[command(flatten)]
    pub txn: TxnArgs,
    /// Report an access request Processing without its worker's lock once it has been so for this many seconds.
    #[arg(long, value_name = "SECS", default_value_t = ingest_projections::consistency::STUCK_AFTER_SECS)]
    pub stuck_after: u64,
    /// How long a drift repair waits for a running projector to give up leadership, in seconds.
    #[arg(long, value_name = "SECS", default_value_t = 10.0)]
    pub leader_wait: f64,
}

impl CheckArgs {
    fn reason(&self) -> Result<Option<String>> {
        if self.repair.is_none() && !self.repair_all {
            return Ok(None);
        }
        match self.reason.as_deref().map(str::trim) {
            Some(r) if !r.is_empty() => Ok(Some(r.to_string())),
            _ => Err(exit::Usage(
                "a repair needs --reason TEXT: it is recorded with the repair".into(),
            )
            .into()),
        }
    }
}

/// Prints a report; its exit code (0 PASS, 1 WARN or FAIL).
fn print_report(report: &ConsistencyReport, format: Format) -> Result<i32> {
    match format {
        Format::Table => {
            let rows = report
                .findings
                .iter()
                .map(|f| {
                    vec![
                        f.severity.as_str().to_string(),
                        f.rule.clone(),
                        f.path.clone(),
                        f.age_secs.map_or("-".into(), |a| format!("{a}s")),
                        f.repair.as_ref().map_or("-".into(), |r| r.action.clone()),
                        f.id.clone(),
                        f.detail.clone(),
                    ]
                })
                .collect();
            if !report.findings.is_empty() {
                write_stdout(&table(
                    &["SEVERITY", "RULE", "PATH", "AGE", "REPAIR", "ID", "DETAIL"],
                    rows,
                ));
            }
            write_stdout(&format!(
                "{}: {} FAIL, {} WARN; {} nodes and objects checked against the log at position {} ({})\n",
                report.status(),
                report.count(Severity::Fail),
                report.count(Severity::Warn),
                report.nodes_checked,
                report.position,
                report.checked_at
            ));
        }
        f => emit(report, f)?,
    }
    Ok(i32::from(!report.findings.is_empty()))
}

/// The findings `--repair-all` would repair, shown; `true` when the user
/// (or `--yes`) agrees.
fn confirm(findings: &[&Finding], yes: bool) -> Result<bool> {
    if findings.is_empty() {
        println!("no finding has a repair on offer");
        return Ok(false);
    }
    println!("would repair {} finding(s):", findings.len());
    for f in findings {
        let action = f.repair.as_ref().map_or("-", |r| r.action.as_str());
        println!("  {} {} {} ({action})", f.id, f.rule, f.path);
    }
    if yes {
        return Ok(true);
    }
    if !std::io::stdin().is_terminal() {
        println!("not repaired: give --yes to repair without asking");
        return Ok(false);
    }
    print!("repair them? [y/N] ");
    std::io::stdout().flush().ok();
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line)?;
    Ok(matches!(line.trim(), "y" | "Y" | "yes"))
}

/// Runs `ingest check` on the data directory.
///
/// # Errors
/// Usage errors; sources that cannot be read give exit 3.
pub fn local(engine: &mut Engine, actor: &Actor, args: CheckArgs) -> Result<i32> {
    let reason = args.reason()?;
    let zk = match args.zk.zk {
        Some(_) => Some(zk::zk_config(&args.zk)?),
        None => None,
    };
    if zk.is_none() && args.storage_targets.is_empty() {
        bail!(exit::Usage(
            "give --zk HOST:PORT (the tree rules and drift) and/or --storage-target NAME=DIR (versions the inventory lacks)".into()
        ));
    }
    let targets = ingest_server::serve::target_specs(&args.storage_targets)
        .map_err(|e| exit::Usage(format!("{e:#}")))?;
    let inventory = ingest_engine::objects::open_inventory(engine.log())?;
    let admin = match &zk {
        Some(z) => {
            let mut a = AdminConfig::new(z.clone(), zk::identity(engine));
            a.limits = zk::limits(&args.txn);
            a.leader_wait = zk::seconds(args.leader_wait, "--leader-wait")?;
            Some(a)
        }
        None => None,
    };
    let rt = zk::runtime()?;
    let log = engine.shared_log();
    let state = engine.state().clone();
    let job = |jid| state.jobs.get(&jid).cloned();
    let sources = Sources {
        log: &log,
        job: &job,
        zk: zk.as_ref(),
        targets: &targets,
        inventory: Some(&inventory),
        stuck_after_secs: args.stuck_after,
        tree_read: None,
        cancelled: None,
    };
    let unreadable = |e: CheckError| -> Result<i32> {
        eprintln!("error: {e}");
        Ok(exit::UNREACHABLE)
    };
    let ids: Vec<String> = match (&args.repair, args.repair_all) {
        (None, false) => {
            return match rt.block_on(consistency::check(sources, Utc::now())) {
                Ok(c) => print_report(&c.report, args.format),
                Err(e) => unreadable(e),
            }
        }
        (Some(id), _) => vec![id.clone()],
        (None, true) => {
            let checked = match rt.block_on(consistency::check(sources, Utc::now())) {
                Ok(c) => c,
                Err(e) => return unreadable(e),
            };
            let offered: Vec<&Finding> = checked
                .report
                .findings
                .iter()
                .filter(|f| f.repair.is_some())
                .collect();
            if !confirm(&offered, args.yes)? {
                return Ok(i32::from(!checked.report.findings.is_empty()));
            }
            offered.iter().map(|f| f.id.clone()).collect()
        }
    };
    let reason = reason.unwrap_or_default();
    let ctx = RepairContext {
        sources,
        admin: admin.as_ref(),
        converger: None,
    };
    let mut code = 0;
    for id in ids {
        match rt.block_on(consistency::apply(&ctx, &id, &reason, Utc::now())) {
            Ok(applied) => match engine.execute(actor, &applied.command) {
                Ok(outcome) => {
                    let at = outcome.records.last().map_or(0, |r| r.envelope.position);
                    println!(
                        "repaired {} ({}): {}; recorded as event #{at}",
                        applied.finding.id, applied.finding.rule, applied.summary
                    );
                }
                Err(EngineError::Rejected(r)) => {
                    eprintln!("error: {id} was repaired but the log refused to record it: {r}");
                    code = 1;
                }
                Err(e) => return Err(e).context("recording the repair in the log"),
            },
            Err(CheckError::NoSuchFinding { .. }) if args.repair_all => {
                println!("{id}: resolved by an earlier repair");
            }
            Err(e @ (CheckError::NoSuchFinding { .. } | CheckError::NoRepair { .. })) => {
                eprintln!("refused: {e}");
                code = 1;
            }
            Err(e) => {
                eprintln!("error: {e}");
                return Ok(exit::UNREACHABLE);
            }
        }
    }
    Ok(code)
}

/// Runs `ingest --engine URL check`.
///
/// # Errors
/// An unreachable server or a missing admin token.
pub fn remote(remote: &Remote, args: CheckArgs) -> Result<i32> {
    let reason = args.reason()?;
    if args.zk.zk.is_some() || !args.storage_targets.is_empty() {
        bail!(exit::Usage(
            "through a server, the report reads the server's own ZooKeeper and storage targets: drop --zk and --storage-target".into()
        ));
    }
    let client = remote.admin_api()?;
    let get = || -> Result<ConsistencyReport> {
        remote.run(client.get(&ingest_protocol::endpoint::Consistency {
            stuck_after: args.stuck_after,
        }))
    };
    let ids: Vec<String> = match (&args.repair, args.repair_all) {
        (None, false) => {
            return match get() {
                Ok(r) => print_report(&r, args.format),
                Err(e) if e.is::<Refused>() => {
                    eprintln!("refused: {e}");
                    Ok(exit::UNREACHABLE)
                }
                Err(e) => Err(e),
            };
        }
        (Some(id), _) => vec![id.clone()],
        (None, true) => {
            let report = get()?;
            let offered: Vec<&Finding> = report
                .findings
                .iter()
                .filter(|f| f.repair.is_some())
                .collect();
            if !confirm(&offered, args.yes)? {
                return Ok(i32::from(!report.findings.is_empty()));
            }
            offered.iter().map(|f| f.id.clone()).collect()
        }
    };
    let mut code = 0;
    for id in ids {
        let body = RepairBody {
            finding: id.clone(),
            reason: reason.clone().unwrap_or_default(),
            actor: Some(remote.admin_name.clone()),
        };
        let done: Result<RepairDone> =
            remote.run(client.call(&ingest_protocol::endpoint::ConsistencyRepair, &body));
        match done {
            Ok(d) => println!(
                "repaired {} ({}): {}; recorded as event #{}",
                d.finding.id, d.finding.rule, d.summary, d.position
            ),
            Err(e) if args.repair_all && e.to_string().contains("no_such_finding") => {
                println!("{id}: resolved by an earlier repair");
            }
            Err(e) if e.is::<Refused>() => {
                eprintln!("refused: {e}");
                code = 1;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(code)
}
