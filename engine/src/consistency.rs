//! The consistency report (`ingest check`, `GET /consistency`) and its
//! repairs.
//!
//! A report reads three things: the live ZooKeeper tree, checked with
//! Merritt's orphan rules ([`ingest_projections::consistency`]); the drift
//! between that tree and the log ([`rebuild::diff`], the same comparison
//! as `ingest diff`); and every configured OCFL storage target, whose
//! object versions are compared with the inventory (a version stored but
//! never recorded, from any failure between Storing and Recording).
//!
//! Each finding carries the repair on offer. A repair is applied by
//! [`apply`], which checks again first and refuses a finding that is no
//! longer there, then changes ZooKeeper (a version-checked delete, or a
//! convergence as `diff --repair`) or the inventory (recording the version
//! through its normal path), and gives back the command that records the
//! repair in the log (`ConsistencyRepaired`): the caller appends it. A
//! finding that cannot be decided (a version whose job the log does not
//! know, a local id bound to another ark) offers no repair and says it
//! needs an admin's decision.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use chrono::{DateTime, Utc};
use ingest_events::command::Command;
use ingest_events::log::Log;
use ingest_events::state::Job;
use ingest_events::{Jid, JobState};
use ingest_projections::consistency::{self as rules, Found, RepairPlan};
use ingest_projections::rebuild::{self, AdminConfig, LiveRead};
use ingest_projections::sink::{ConvergeScope, Converger};
use ingest_projections::{layout, ZkConfig};
use ingest_protocol::consistency::{ConsistencyReport, Finding, Repair, Severity};
use ingest_protocol::cut;
use ingest_steps::inventory::{Inventory, InventoryFile, ObjectVersionRecord};
use ingest_steps::ocfl::OcflTarget;

/// The most findings of one rule a report lists; the rest are counted in
/// one `report-truncated` finding.
pub const MAX_PER_RULE: usize = 500;

/// A storage target to check: its name and root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetSpec {
    /// The target's name (as in `--storage-target NAME=DIR`).
    pub name: String,
    /// Its OCFL storage root.
    pub root: PathBuf,
}

/// What a check reads.
#[derive(Clone, Copy)]
pub struct Sources<'a> {
    /// The log.
    pub log: &'a Log,
    /// A job of the folded state (for the jobs named by stored versions;
    /// a lookup, so a server holds its state's lock only per job).
    pub job: &'a (dyn Fn(Jid) -> Option<Job> + Sync),
    /// ZooKeeper (`None`: no tree rules, no drift).
    pub zk: Option<&'a ZkConfig>,
    /// The storage targets (empty: no OCFL rule).
    pub targets: &'a [TargetSpec],
    /// The inventory (`None`: no OCFL rule).
    pub inventory: Option<&'a Inventory>,
    /// How long an access request may be Processing without its lock
    /// before it is reported ([`rules::STUCK_AFTER_SECS`] by default).
    pub stuck_after_secs: u64,
    /// Called by [`check`] once the tree and its checkpoint are read, before
    /// storage is scanned: a server that held its projector for a
    /// consistent read of the tree lets it go here, so a long scan of
    /// storage never holds up the queue.
    pub tree_read: Option<&'a (dyn Fn() + Sync)>,
    /// Set when whoever asked for the check went away (a server's client
    /// disconnected): the scan of storage stops before its next object,
    /// with [`CheckError::Cancelled`], rather than reading on for nobody.
    pub cancelled: Option<&'a std::sync::atomic::AtomicBool>,
}

/// Why a check or a repair could not be done.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// Whoever asked for the check went away ([`Sources::cancelled`]); the
    /// scan of storage stopped.
    #[error(
        "the check was cancelled: whoever asked for it went away, so the scan of storage stopped"
    )]
    Cancelled,
    /// ZooKeeper could not be read or compared with the log.
    #[error("cannot compare the tree under {root} with the log: {source}")]
    Tree {
        /// The root.
        root: String,
        /// Why.
        source: ingest_projections::SinkError,
    },
    /// A storage target could not be read.
    #[error("cannot read storage target {name}: {detail}")]
    Storage {
        /// The target.
        name: String,
        /// Why.
        detail: String,
    },
    /// The inventory could not be read or written.
    #[error("the inventory failed: {0}")]
    Inventory(String),
    /// The finding is not in the report any more.
    #[error("there is no finding {id} now (already repaired, or it resolved itself); run the check again for the current ids")]
    NoSuchFinding {
        /// The id asked for (cut).
        id: String,
    },
    /// The finding has no repair on offer.
    #[error("finding {id} has no repair on offer: {why}")]
    NoRepair {
        /// The finding.
        id: String,
        /// Why (e.g. it needs an admin's decision).
        why: String,
    },
    /// The repair needs the projector's role, and no projector of this
    /// process can converge it (a server without ZooKeeper, or without a
    /// projector that records its repairs).
    #[error("finding {id} is drift, repaired by converging the tree to the log, which needs the projector's role: run it on the server whose projector leads, or stop the server and run `ingest check --repair {id}` (or `ingest diff --repair`) on its data directory")]
    NeedsProjector {
        /// The finding.
        id: String,
    },
    /// The repair failed in ZooKeeper.
    #[error("the repair of {id} failed in ZooKeeper (nothing was recorded): {detail}")]
    Repair {
        /// The finding.
        id: String,
        /// Why.
        detail: String,
    },
}

/// What a repair does, by finding id (the exact paths; a [`Finding`]
/// shows them cut).
#[derive(Debug, Clone, PartialEq)]
pub enum Plan {
    /// A tree repair.
    Tree(RepairPlan),
    /// Record this version in the inventory.
    RecordVersion(Box<ObjectVersionRecord>),
    /// No repair: the reason an admin must decide.
    AdminDecision(String),
}

/// A report with the plans of its repairs.
#[derive(Debug, Clone)]
pub struct Checked {
    /// What is shown.
    pub report: ConsistencyReport,
    /// The plan of each finding, by id.
    pub plans: BTreeMap<String, Plan>,
}

/// Runs every rule: [`read_tree`], then [`check_read`].
///
/// # Errors
/// [`CheckError`] when a source cannot be read (a broken node is a
/// finding, not an error).
pub async fn check(src: Sources<'_>, now: DateTime<Utc>) -> Result<Checked, CheckError> {
    let tree = read_tree(src.zk).await?;
    check_read(src, tree, now)
}

/// The ZooKeeper half of [`check`]: the live tree and its checkpoint, read
/// the same before and after (`None` without ZooKeeper). All I/O to
/// ZooKeeper and nothing that blocks, so a server awaits it on its runtime.
///
/// # Errors
/// [`CheckError::Tree`] when the tree cannot be read.
pub async fn read_tree(zk: Option<&ZkConfig>) -> Result<Option<LiveRead>, CheckError> {
    let Some(zk) = zk else {
        return Ok(None);
    };
    rebuild::read_checkpointed(zk, &mut |_| {})
        .await
        .map(Some)
        .map_err(|source| CheckError::Tree {
            root: zk.root.clone(),
            source,
        })
}

/// The rest of [`check`], given what [`read_tree`] read: the comparison
/// with the log (a fold), the tree rules and the scan of storage. No I/O
/// to ZooKeeper; it blocks (log reads, storage scans), so a server runs it
/// on a blocking thread.
///
/// # Errors
/// [`CheckError`] when a source cannot be read (a broken node is a
/// finding, not an error).
pub fn check_read(
    src: Sources<'_>,
    tree: Option<LiveRead>,
    now: DateTime<Utc>,
) -> Result<Checked, CheckError> {
    let mut found: Vec<(Finding, Plan)> = Vec::new();
    let mut nodes = 0u64;
    let mut position = src.log.durable_position();
    if let (Some(zk), Some(read)) = (src.zk, tree) {
        let diff = rebuild::compare(src.log, zk, read, &mut |_| {}).map_err(|source| {
            CheckError::Tree {
                root: zk.root.clone(),
                source,
            }
        })?;
        position = diff.position;
        nodes = diff.live.tree.len() as u64;
        let unexpected: BTreeSet<&str> = diff.diff.unexpected.iter().map(String::as_str).collect();
        let log_has = |p: &str| layout::is_owned(p) && !unexpected.contains(p);
        let tree = rules::tree_findings(
            &diff.live,
            now.timestamp_millis(),
            src.stuck_after_secs,
            &log_has,
        );
        let named: BTreeSet<String> = tree
            .iter()
            .flat_map(|f| match &f.plan {
                RepairPlan::DeleteNodes(p) => p.clone(),
                _ => Vec::new(),
            })
            .collect();
        let under_named = |p: &str| {
            named.contains(p)
                || named.iter().any(|n| {
                    p.len() > n.len() && p.starts_with(n.as_str()) && p.as_bytes()[n.len()] == b'/'
                })
        };
        let drift = rules::drift_findings(&diff.diff, &under_named);
        for Found { finding, plan } in tree.into_iter().chain(drift) {
            found.push((finding, Plan::Tree(plan)));
        }
    }
    if let Some(tree_read) = src.tree_read {
        tree_read();
    }
    if let Some(inventory) = src.inventory {
        if !src.targets.is_empty() {
            let (more, read) = unrecorded_versions(src, inventory, now)?;
            nodes += read;
            found.extend(more);
        }
    }
    Ok(assemble(found, position, nodes, now))
}

/// Sorts (FAIL first, then rule, then path), caps each rule, and indexes
/// the plans.
fn assemble(
    mut found: Vec<(Finding, Plan)>,
    position: u64,
    nodes: u64,
    now: DateTime<Utc>,
) -> Checked {
    found.sort_by(|(a, _), (b, _)| {
        b.severity
            .cmp(&a.severity)
            .then_with(|| a.rule.cmp(&b.rule))
            .then_with(|| a.path.cmp(&b.path))
            .then_with(|| a.id.cmp(&b.id))
    });
    let mut per_rule: BTreeMap<String, usize> = BTreeMap::new();
    let mut findings = Vec::new();
    let mut plans = BTreeMap::new();
    for (f, plan) in found {
        let n = per_rule.entry(f.rule.clone()).or_default();
        *n += 1;
        if *n > MAX_PER_RULE {
            continue;
        }
        plans.insert(f.id.clone(), plan);
        findings.push(f);
    }
    for (rule, n) in per_rule {
        if n > MAX_PER_RULE {
            findings.push(Finding {
                id: rules::finding_id("report-truncated", &rule),
                rule: "report-truncated".into(),
                severity: Severity::Warn,
                path: "-".into(),
                subject: Some(rule.clone()),
                age_secs: None,
                detail: format!(
                    "{} more {rule} findings are not listed (at most {MAX_PER_RULE} per rule); repair these and check again",
                    n - MAX_PER_RULE
                ),
                repair: None,
            });
        }
    }
    Checked {
        report: ConsistencyReport {
            checked_at: now.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            position,
            nodes_checked: nodes,
            findings,
        },
        plans,
    }
}

/// One stored version as read from one or more targets.
struct Stored {
    targets: Vec<String>,
    message: String,
    files: Vec<InventoryFile>,
    differs: bool,
}

/// The job a storing step named in a version's OCFL message (`… job JID`).
fn jid_of(message: &str) -> Option<Jid> {
    let tail = message.rsplit_once(" job ")?.1;
    tail.split_whitespace().next()?.parse().ok()
}

/// Object versions in the storage targets that the inventory does not
/// hold, skipping those whose job is still between Storing and Recording.
fn unrecorded_versions(
    src: Sources<'_>,
    inventory: &Inventory,
    now: DateTime<Utc>,
) -> Result<(Vec<(Finding, Plan)>, u64), CheckError> {
    let inv = |e: ingest_steps::inventory::InventoryError| CheckError::Inventory(e.to_string());
    let mut versions: BTreeMap<(String, u32), Stored> = BTreeMap::new();
    let mut read = 0u64;
    for t in src.targets {
        let storage = |e: ingest_steps::ocfl::StorageError| CheckError::Storage {
            name: t.name.clone(),
            detail: e.to_string(),
        };
        // Opened read-only: the staging area belongs to the process storing.
        let target = OcflTarget::open_existing(&t.name, &t.root).map_err(storage)?;
        let cancelled = || {
            src.cancelled
                .is_some_and(|c| c.load(std::sync::atomic::Ordering::Relaxed))
        };
        let arks = target.arks_unless(&cancelled).map_err(storage)?;
        if cancelled() {
            return Err(CheckError::Cancelled);
        }
        for ark in arks {
            if cancelled() {
                return Err(CheckError::Cancelled);
            }
            read += 1;
            let recorded: BTreeSet<u32> = inventory
                .versions(&ark)
                .map_err(inv)?
                .iter()
                .map(|r| r.version)
                .collect();
            for v in target.versions(&ark).map_err(storage)? {
                if recorded.contains(&v) {
                    continue;
                }
                let info = target.version_info(&ark, v).map_err(storage)?;
                let files: Vec<InventoryFile> = info
                    .files
                    .iter()
                    .map(|f| InventoryFile {
                        path: f.logical_path.clone(),
                        size: f.size,
                        digests: BTreeMap::from([(
                            info.digest_algorithm.clone(),
                            f.sha512.clone(),
                        )]),
                    })
                    .collect();
                let entry = versions.entry((ark.clone(), v)).or_insert_with(|| Stored {
                    targets: Vec::new(),
                    message: info.message.clone(),
                    files: files.clone(),
                    differs: false,
                });
                entry.differs |= entry.files != files || entry.message != info.message;
                entry.targets.push(t.name.clone());
            }
        }
    }
    let mut out = Vec::new();
    for ((ark, version), stored) in versions {
        let jid = jid_of(&stored.message);
        let job = jid.and_then(|j| (src.job)(j));
        if job
            .as_ref()
            .is_some_and(|j| matches!(j.status, JobState::Storing | JobState::Recording))
        {
            // In flight: the job's own Recording step records it.
            continue;
        }
        let place = format!("{}/{ark}/v{version}", stored.targets.join("+"));
        let path = format!("ocfl:{}", rules::shown(&place));
        let decided = decide(inventory, &ark, version, &stored, job.as_ref(), now).map_err(inv)?;
        let (repair, plan, why) = match decided {
            Ok(record) => (
                Some(Repair {
                    action: "record-version".into(),
                    description: format!(
                        "record {} v{version} in the inventory as job {} stored it (files and digests read from storage), and record the repair as an event",
                        cut(&ark, 128),
                        record.jid
                    ),
                }),
                Plan::RecordVersion(Box::new(record)),
                String::new(),
            ),
            Err(why) => (None, Plan::AdminDecision(why.to_string()), format!("; needs an admin decision: {why}")),
        };
        let finding = Finding {
            id: rules::finding_id("unrecorded-version", &format!("{ark}\0{version}")),
            rule: "unrecorded-version".into(),
            severity: Severity::Fail,
            path,
            subject: Some(match jid {
                Some(j) => j.to_string(),
                None => cut(&ark, 128).into_owned(),
            }),
            age_secs: None,
            detail: format!(
                "version {version} of {} is in storage target(s) {} but not in the inventory{why}",
                cut(&ark, 128),
                stored.targets.join(", ")
            ),
            repair,
        };
        out.push((finding, plan));
    }
    Ok((out, read))
}

/// Why a stored version cannot be recorded without an admin's decision.
#[derive(Debug, thiserror::Error)]
enum Undecided {
    #[error("the version names no job the log knows, so its collection and local ids are unknown")]
    NoJob,
    #[error("the storage targets hold different content under this version")]
    Differs,
    #[error("job {0} has another ark than the stored object")]
    OtherArk(Jid),
    #[error(
        "the inventory's latest version of this object is {latest}, so v{version} cannot follow it"
    )]
    NotNext { latest: u32, version: u32 },
    #[error("local id {} of collection {collection} is bound to another object, {}: this object duplicates it (keep it under a new local id, or leave it unrecorded)", cut(.lid, 128), cut(.other, 128))]
    LocalIdBound {
        lid: String,
        collection: String,
        other: String,
    },
}

/// The record a repair would write, or why an admin must decide.
fn decide(
    inventory: &Inventory,
    ark: &str,
    version: u32,
    stored: &Stored,
    job: Option<&Job>,
    now: DateTime<Utc>,
) -> Result<Result<ObjectVersionRecord, Undecided>, ingest_steps::inventory::InventoryError> {
    let Some(job) = job else {
        return Ok(Err(Undecided::NoJob));
    };
    if stored.differs {
        return Ok(Err(Undecided::Differs));
    }
    if job.identifiers.primary_id.as_deref() != Some(ark) {
        return Ok(Err(Undecided::OtherArk(job.jid)));
    }
    let latest = inventory.latest(ark)?.map_or(0, |r| r.version);
    if latest + 1 != version {
        return Ok(Err(Undecided::NotNext { latest, version }));
    }
    let collection = job.configuration.profile_name.clone();
    for lid in &job.identifiers.local_ids {
        if let Some(other) = inventory.by_local_id(&collection, lid)? {
            if other != ark {
                return Ok(Err(Undecided::LocalIdBound {
                    lid: lid.clone(),
                    collection,
                    other,
                }));
            }
        }
    }
    let mut erc = BTreeMap::new();
    for (key, value) in [
        ("who", &job.metadata.who),
        ("what", &job.metadata.what),
        ("when", &job.metadata.when),
    ] {
        if let Some(v) = value {
            erc.insert(key.to_string(), v.clone());
        }
    }
    Ok(Ok(ObjectVersionRecord {
        ark: ark.to_string(),
        version,
        collection,
        local_ids: job.identifiers.local_ids.clone(),
        files: stored.files.clone(),
        storage_targets: stored.targets.clone(),
        jid: job.jid.to_string(),
        bid: job.bid.to_string(),
        recorded_at: now,
        erc,
    }))
}

/// Where a repair may act.
pub struct RepairContext<'a> {
    /// What the check reads.
    pub sources: Sources<'a>,
    /// Set when this process may take the projector's role (the CLI on the
    /// data directory); `None` on a server, whose projector holds it.
    pub admin: Option<&'a AdminConfig>,
    /// On a server: its running projector, which converges a drifted item
    /// while it projects.
    pub converger: Option<&'a Converger>,
}

/// What a repair did: the command that records it, and what to tell.
#[derive(Debug, Clone)]
pub struct Applied {
    /// The finding repaired.
    pub finding: Finding,
    /// `RecordConsistencyRepair`, to append.
    pub command: Command,
    /// What was changed, for a person.
    pub summary: String,
}

/// How long a server's repair of drift waits for its projector.
pub const CONVERGE_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// Applies the repair of finding `id` (checking again first) and returns
/// the command that records it; the caller appends it.
///
/// # Errors
/// [`CheckError::NoSuchFinding`] when the finding is not there now;
/// [`CheckError::NoRepair`] when none is on offer;
/// [`CheckError::NeedsProjector`] for drift without the projector's role;
/// others when a source fails.
pub async fn apply(
    ctx: &RepairContext<'_>,
    id: &str,
    reason: &str,
    now: DateTime<Utc>,
) -> Result<Applied, CheckError> {
    let checked = check(ctx.sources, now).await?;
    apply_checked(ctx, &checked, id, reason, now).await
}

/// [`apply`] after its check: applies the repair of finding `id` of
/// `checked`, a check made just now. A tree repair is I/O to ZooKeeper; a
/// recorded version is one inventory transaction.
///
/// # Errors
/// As [`apply`].
pub async fn apply_checked(
    ctx: &RepairContext<'_>,
    checked: &Checked,
    id: &str,
    reason: &str,
    now: DateTime<Utc>,
) -> Result<Applied, CheckError> {
    let shown_id = cut(id, 128).into_owned();
    let (Some(finding), Some(plan)) = (
        checked.report.findings.iter().find(|f| f.id == id),
        checked.plans.get(id),
    ) else {
        return Err(CheckError::NoSuchFinding { id: shown_id });
    };
    let (action, paths) = match plan {
        Plan::AdminDecision(why) => {
            return Err(CheckError::NoRepair {
                id: shown_id,
                why: format!("it needs an admin decision: {why}"),
            })
        }
        Plan::Tree(RepairPlan::None) => {
            return Err(CheckError::NoRepair {
                id: shown_id,
                why: "the log has this node; see the drift findings, or look at it with `ingest tree --live`".into(),
            })
        }
        Plan::Tree(RepairPlan::DeleteNodes(paths)) => {
            let zk = ctx.sources.zk.ok_or_else(|| CheckError::NoRepair {
                id: shown_id.clone(),
                why: "no ZooKeeper is configured".into(),
            })?;
            let deleted = rules::delete_subtrees(zk, paths)
                .await
                .map_err(|e| CheckError::Repair {
                    id: shown_id.clone(),
                    detail: e.to_string(),
                })?;
            if deleted.is_empty() {
                return Err(CheckError::NoSuchFinding { id: shown_id });
            }
            ("delete-node", deleted)
        }
        Plan::Tree(RepairPlan::RepairDrift(path)) if ctx.admin.is_none() => {
            let Some(converger) = ctx.converger else {
                return Err(CheckError::NeedsProjector { id: shown_id });
            };
            let asked = converger.converge(
                ConvergeScope::Paths(vec![path.clone()]),
                format!("consistency repair of {shown_id}: {reason}"),
            );
            let done = tokio::time::timeout(CONVERGE_WAIT, asked)
                .await
                .map_err(|_| CheckError::Repair {
                    id: shown_id.clone(),
                    detail: format!(
                        "the projector did not converge it within {} s (it does once it leads and catches up)",
                        CONVERGE_WAIT.as_secs()
                    ),
                })?
                .map_err(|e| CheckError::Repair {
                    id: shown_id.clone(),
                    detail: e.to_string(),
                })?;
            if done.repaired.is_empty() {
                return Err(CheckError::NoSuchFinding { id: shown_id });
            }
            ("repair-drift", vec![path.clone()])
        }
        Plan::Tree(RepairPlan::RepairDrift(_)) => {
            let Some(admin) = ctx.admin else {
                return Err(CheckError::NeedsProjector { id: shown_id });
            };
            let repaired = rebuild::repair(ctx.sources.log, admin, &mut |_| {})
                .await
                .map_err(|e| CheckError::Repair {
                    id: shown_id.clone(),
                    detail: e.to_string(),
                })?;
            if repaired.converge.paths.is_empty() {
                return Err(CheckError::NoSuchFinding { id: shown_id });
            }
            ("repair-drift", repaired.converge.paths)
        }
        Plan::RecordVersion(record) => {
            let inventory = ctx
                .sources
                .inventory
                .ok_or_else(|| CheckError::Inventory("no inventory is open".into()))?;
            let record = ObjectVersionRecord {
                recorded_at: now,
                ..(**record).clone()
            };
            inventory
                .record(&record)
                .map_err(|e| CheckError::Inventory(e.to_string()))?;
            let paths = record
                .storage_targets
                .iter()
                .map(|t| format!("ocfl:{t}/{}/v{}", record.ark, record.version))
                .collect();
            ("record-version", paths)
        }
    };
    let summary = format!(
        "{action}: {}",
        paths
            .iter()
            .map(|p: &String| rules::shown(p))
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok(Applied {
        finding: finding.clone(),
        command: Command::RecordConsistencyRepair {
            finding: finding.id.clone(),
            rule: finding.rule.clone(),
            action: action.to_string(),
            paths,
            reason: reason.to_string(),
        },
        summary: cut(&summary, 2048).into_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_storing_steps_message_names_the_job() {
        assert_eq!(
            jid_of("add: batch bid0000000001 job jid0000000042"),
            Some("jid0000000042".parse().expect("jid"))
        );
        assert_eq!(jid_of("made by hand"), None);
        assert_eq!(jid_of("x job notajid"), None);
    }

    #[test]
    fn findings_are_sorted_and_capped_per_rule() {
        let f = |rule: &str, sev: Severity, n: usize| Finding {
            id: rules::finding_id(rule, &n.to_string()),
            rule: rule.into(),
            severity: sev,
            path: format!("/p/{n:04}"),
            subject: None,
            age_secs: None,
            detail: String::new(),
            repair: None,
        };
        let mut found: Vec<(Finding, Plan)> = (0..MAX_PER_RULE + 3)
            .map(|n| {
                (
                    f("drift", Severity::Fail, n),
                    Plan::Tree(RepairPlan::RepairDrift("/x".into())),
                )
            })
            .collect();
        found.push((
            f("old-lock", Severity::Warn, 1),
            Plan::Tree(RepairPlan::None),
        ));
        found.push((
            f("stale-lock", Severity::Fail, 1),
            Plan::Tree(RepairPlan::None),
        ));
        let checked = assemble(found, 7, 9, Utc::now());
        let r = &checked.report;
        assert_eq!(r.findings[0].rule, "drift");
        assert_eq!(r.findings[MAX_PER_RULE].rule, "stale-lock");
        assert_eq!(r.findings[MAX_PER_RULE + 1].rule, "old-lock");
        let last = r.findings.last().expect("truncation finding");
        assert_eq!(last.rule, "report-truncated");
        assert!(last.detail.starts_with("3 more drift"));
        assert_eq!(r.status(), "FAIL");
        assert_eq!(checked.plans.len(), MAX_PER_RULE + 2);
    }
}
