//! The consistency rules of the live tree: Merritt's admin tool's "orphan"
//! tests (mrt-zk's `NodeDump` in test mode), with its ages, over a tree
//! read from ZooKeeper, and the drift against the log turned into findings.
//!
//! The rules are pure: they read a [`LiveTree`] and a clock value given
//! by the caller, and say what they found and which nodes a repair would
//! delete; the engine assembles the report and records each repair.
//! [`delete_subtrees`] applies a delete repair to ZooKeeper.
//!
//! Every node is hostile: data is decoded bounded
//! ([`ingest_protocol::node::decode`]), a node that cannot be read is a
//! finding (`unreadable-node`), and no node's data is ever quoted; paths
//! are cut to [`MAX_PATH_SHOWN`] bytes in what is shown.

use std::collections::BTreeMap;

use ingest_protocol::consistency::{Finding, Repair, Severity};
use ingest_protocol::cut;
use ingest_protocol::node::{self, AccessStatusNode, JobStatusNode, SubmissionNode};

use crate::layout;
use crate::tree::TreeDiff;
use crate::zk::LiveTree;

/// Merritt's alert age: a worker lock older than this is reported
/// (mrt-zk's `NodeDump::AGE_ALERT`, 120 s).
pub const AGE_ALERT_SECS: u64 = 120;
/// Merritt's fail age: a broken node younger than this is a WARN (it may be
/// a write in progress), older a FAIL (mrt-zk's `NodeDump::AGE_FAIL`, 1 h).
pub const AGE_FAIL_SECS: u64 = 3600;
/// How long a request may stay Processing without its worker's lock
/// before the report names it (`ingest check --stuck-after`), by default:
/// an access daemon takes such a request again within a poll of the lock's
/// session expiring, so one still there after Merritt's alert age has no
/// daemon taking it.
pub const STUCK_AFTER_SECS: u64 = AGE_ALERT_SECS;
/// The most bytes of a path shown in a finding.
pub const MAX_PATH_SHOWN: usize = 512;
/// The most bytes of a node's data the rules decode; a larger node is an
/// `unreadable-node` finding.
pub const MAX_DATA_READ: usize = 256 * 1024;

/// What a repair of a finding would do, with the exact paths (a
/// [`Finding`] shows them cut).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RepairPlan {
    /// No repair on offer (an admin decides).
    None,
    /// Delete these nodes, each with everything under it.
    DeleteNodes(Vec<String>),
    /// Converge the live tree to the log: the whole tree (as `ingest diff
    /// --repair`) where the repair takes the projector's role, or the item
    /// of this path through the running projector.
    RepairDrift(String),
}

/// A finding with the plan of its repair.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// What is shown.
    pub finding: Finding,
    /// What a repair does.
    pub plan: RepairPlan,
}

/// The stable id of a finding: its rule and a 64-bit FNV-1a hash of the
/// exact place it is about, so the same finding has the same id on the
/// next run and an id never quotes a hostile path.
pub fn finding_id(rule: &str, place: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in rule.bytes().chain([0u8]).chain(place.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{rule}-{h:016x}")
}

/// A path as shown in a finding (cut, lossless for ordinary paths).
pub fn shown(path: &str) -> String {
    cut(path, MAX_PATH_SHOWN).into_owned()
}

/// The delete repair of `paths`.
pub fn delete_repair(paths: &[String]) -> Repair {
    let what = match paths {
        [one] => shown(one),
        _ => format!("{} nodes", paths.len()),
    };
    Repair {
        action: "delete-node".into(),
        description: format!(
            "delete {what} (with any node under it) from ZooKeeper, version-checked, and record the repair as an event"
        ),
    }
}

/// The repair of drift.
pub fn drift_repair() -> Repair {
    Repair {
        action: "repair-drift".into(),
        description: "converge the live tree to the log at its checkpoint (as `ingest diff --repair`) and record the repair as an event".into(),
    }
}

/// The rules over one tree read.
struct Rules<'a> {
    live: &'a LiveTree,
    now_ms: i64,
    stuck_after_secs: u64,
    log_has: &'a dyn Fn(&str) -> bool,
    out: Vec<Found>,
}

impl Rules<'_> {
    fn exists(&self, path: &str) -> bool {
        self.live.tree.contains(path)
    }

    fn age_secs(&self, path: &str) -> Option<u64> {
        let ctime = *self.live.ctimes.get(path)?;
        Some(u64::try_from(self.now_ms.saturating_sub(ctime).max(0)).unwrap_or(0) / 1000)
    }

    /// Merritt's `node_stat`: WARN while younger than the fail age.
    fn by_age(&self, path: &str) -> Severity {
        match self.age_secs(path) {
            Some(a) if a < AGE_FAIL_SECS => Severity::Warn,
            _ => Severity::Fail,
        }
    }

    /// Records a finding about `path`; `delete` are the nodes its repair
    /// would delete, offered only when the log does not have them (a node
    /// the log has is restored by the drift repair instead).
    ///
    /// A node the log's tree has is no finding of these rules: the
    /// projector made it by design (a manifest-failed batch's empty
    /// `states` node), and wherever the live node or its neighbours differ
    /// from the log, the drift says so.
    fn push(
        &mut self,
        rule: &str,
        severity: Severity,
        path: &str,
        subject: Option<String>,
        detail: String,
        delete: Option<&str>,
    ) {
        if (self.log_has)(path) {
            return;
        }
        let (repair, plan) = match delete {
            Some(d) if !(self.log_has)(d) => {
                let paths = vec![d.to_string()];
                (Some(delete_repair(&paths)), RepairPlan::DeleteNodes(paths))
            }
            _ => (None, RepairPlan::None),
        };
        let place = match delete {
            Some(d) if d != path => format!("{path}\0{d}"),
            _ => path.to_string(),
        };
        self.out.push(Found {
            finding: Finding {
                id: finding_id(rule, &place),
                rule: rule.into(),
                severity,
                path: shown(path),
                subject,
                age_secs: self.age_secs(path),
                detail,
                repair,
            },
            plan,
        });
    }

    fn data(&self, path: &str) -> &[u8] {
        self.live.tree.get(path).unwrap_or_default()
    }

    /// The node's data as one bounded line of text (a bid, a priority).
    fn text(&mut self, path: &str, what: &'static str) -> Option<String> {
        let data = self.data(path);
        let problem = if data.len() > MAX_DATA_READ {
            format!("{} bytes, more than the {MAX_DATA_READ} read", data.len())
        } else {
            match std::str::from_utf8(data) {
                Ok(t) if t.len() <= 256 && !t.chars().any(char::is_control) => {
                    return Some(t.trim().to_string())
                }
                Ok(_) => format!(
                    "{} bytes of text, not a short single-line value",
                    data.len()
                ),
                Err(_) => format!("{} bytes that are not UTF-8", data.len()),
            }
        };
        self.unreadable(path, what, problem);
        None
    }

    fn json<T: serde::de::DeserializeOwned>(
        &mut self,
        path: &str,
        what: &'static str,
    ) -> Option<T> {
        let data = self.data(path);
        if data.len() > MAX_DATA_READ {
            let problem = format!("{} bytes, more than the {MAX_DATA_READ} read", data.len());
            self.unreadable(path, what, problem);
            return None;
        }
        match node::decode::<T>(what, data) {
            Ok(v) => Some(v),
            Err(e) => {
                self.unreadable(path, what, e.to_string());
                None
            }
        }
    }

    fn unreadable(&mut self, path: &str, what: &'static str, problem: String) {
        let detail = format!("the {what} node cannot be read: {}", cut(&problem, 512));
        self.push(
            "unreadable-node",
            Severity::Fail,
            path,
            None,
            detail,
            Some(path),
        );
    }

    fn run(&mut self) {
        let paths: Vec<&str> = self.live.tree.iter().map(|(p, _)| p).collect();
        let mut queue_entries: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for path in paths {
            let parts: Vec<&str> = path.split('/').skip(1).collect();
            match parts.as_slice() {
                ["batch-uuids", _uuid] => self.batch_uuid(path),
                ["batches", bid, "submission"] if is_id(bid, "bid") => self.submission(path),
                ["batches", bid, "states"]
                    if is_id(bid, "bid") && !self.live.tree.has_children(path) =>
                {
                    let sev = self.by_age(path);
                    self.push(
                        "empty-states",
                        sev,
                        path,
                        Some((*bid).to_string()),
                        "the batch's states node has no job under it (Merritt: \"should have children\")".into(),
                        Some(path),
                    );
                }
                ["batches", bid, "states", set, jid]
                    if is_id(bid, "bid") && set.starts_with("batch-") && is_id(jid, "jid") =>
                {
                    let job = format!("/jobs/{jid}");
                    if !self.exists(&job) {
                        let sev = self.by_age(path);
                        self.push(
                            "orphan-batch-child",
                            sev,
                            path,
                            Some((*jid).to_string()),
                            format!("the batch names job {jid}, but /jobs/{jid} does not exist"),
                            Some(path),
                        );
                    }
                }
                ["jobs", jid] if is_id(jid, "jid") => self.job(path, jid),
                ["jobs", jid, "bid"] if is_id(jid, "jid") => self.job_bid(path, jid),
                ["jobs", "states", _state, entry] => {
                    if let Some((pp, jid)) = entry.split_once('-') {
                        if pp.len() == 2
                            && pp.bytes().all(|b| b.is_ascii_digit())
                            && is_id(jid, "jid")
                        {
                            queue_entries
                                .entry((*jid).to_string())
                                .or_default()
                                .push(path.to_string());
                            if !self.exists(&format!("/jobs/{jid}")) {
                                let sev = self.by_age(path);
                                self.push(
                                    "orphan-queue-entry",
                                    sev,
                                    path,
                                    Some((*jid).to_string()),
                                    format!("a queue entry of job {jid}, but /jobs/{jid} does not exist"),
                                    Some(path),
                                );
                            }
                        }
                    }
                }
                [kind @ ("batches" | "jobs"), id, "lock"] if *id != "states" => {
                    self.lock(path, kind, id)
                }
                ["access", "small" | "large", qid, "lock"] if is_id(qid, "qid") => {
                    self.lock(path, "access", qid)
                }
                ["access", "small" | "large", qid, "status"] if is_id(qid, "qid") => {
                    self.access_status(path, qid)
                }
                _ => {}
            }
        }
        for (jid, entries) in queue_entries {
            if entries.len() < 2 {
                continue;
            }
            for e in &entries {
                self.push(
                    "duplicate-queue-entry",
                    Severity::Fail,
                    e,
                    Some(jid.clone()),
                    format!(
                        "job {jid} has {} queue entries; a job is in exactly one queue",
                        entries.len()
                    ),
                    Some(e),
                );
            }
        }
    }

    fn batch_uuid(&mut self, path: &str) {
        let Some(bid) = self.text(path, "batch uuid") else {
            return;
        };
        let target = format!("/batches/{bid}");
        if bid.is_empty() || !is_id(&bid, "bid") || !self.exists(&target) {
            let sev = self.by_age(path);
            let detail = if is_id(&bid, "bid") {
                format!("the uuid names batch {bid}, but {target} does not exist")
            } else {
                "the uuid's data is not a batch id".to_string()
            };
            self.push(
                "orphan-batch-uuid",
                sev,
                path,
                is_id(&bid, "bid").then_some(bid),
                detail,
                Some(path),
            );
        }
    }

    fn submission(&mut self, path: &str) {
        let Some(sub) = self.json::<SubmissionNode>(path, "batch submission") else {
            return;
        };
        let uuid = sub.batch_id;
        let ok =
            !uuid.is_empty() && !uuid.contains('/') && self.exists(&format!("/batch-uuids/{uuid}"));
        if !ok {
            let sev = self.by_age(path);
            self.push(
                "missing-batch-uuid",
                sev,
                path,
                None,
                format!(
                    "the submission's batchID {} has no /batch-uuids node",
                    cut(&uuid, 64)
                ),
                None,
            );
        }
    }

    fn job(&mut self, path: &str, jid: &str) {
        let status_path = format!("{path}/status");
        if !self.exists(&status_path) {
            let sev = self.by_age(path);
            self.push(
                "job-without-status",
                sev,
                path,
                Some(jid.into()),
                format!("job {jid} has no status node"),
                Some(path),
            );
            return;
        }
        let Some(status) = self.json::<JobStatusNode>(&status_path, "job status") else {
            return;
        };
        let priority_path = format!("{path}/priority");
        let priority = if self.exists(&priority_path) {
            match self.text(&priority_path, "job priority") {
                Some(t) => match t.parse::<u8>() {
                    Ok(p) if p <= 99 => p,
                    _ => {
                        self.unreadable(&priority_path, "job priority", "not a number 0-99".into());
                        return;
                    }
                },
                None => return,
            }
        } else {
            0
        };
        let state = status.status.to_lowercase();
        let entry = format!("/jobs/states/{state}/{priority:02}-{jid}");
        if !self.exists(&entry) {
            let sev = self.by_age(path);
            self.push(
                "job-without-queue-entry",
                sev,
                path,
                Some(jid.into()),
                format!(
                    "job {jid} is {} with priority {priority}, but its queue entry /jobs/states/{}/{priority:02}-{jid} does not exist",
                    cut(&status.status, 64),
                    cut(&state, 64)
                ),
                None,
            );
        }
    }

    fn job_bid(&mut self, path: &str, jid: &str) {
        let Some(bid) = self.text(path, "job bid") else {
            return;
        };
        if !is_id(&bid, "bid") || !self.exists(&format!("/batches/{bid}")) {
            let sev = self.by_age(path);
            self.push(
                "job-without-batch",
                sev,
                path,
                Some(jid.into()),
                if is_id(&bid, "bid") {
                    format!("job {jid} names batch {bid}, which does not exist")
                } else {
                    format!("job {jid}'s bid node does not hold a batch id")
                },
                None,
            );
            return;
        }
        let status_path = format!("/jobs/{jid}/status");
        if !self.exists(&status_path) {
            // Reported by the job rule.
            return;
        }
        let Some(status) = self.json::<JobStatusNode>(&status_path, "job status") else {
            return;
        };
        let want = match status.status.to_lowercase().as_str() {
            "deleted" => "batch-deleted",
            "completed" => "batch-completed",
            "failed" => "batch-failed",
            _ => "batch-processing",
        };
        let child = format!("/batches/{bid}/states/{want}/{jid}");
        if !self.exists(&child) {
            let sev = self.by_age(path);
            self.push(
                "job-without-batch-child",
                sev,
                path,
                Some(jid.into()),
                format!("job {jid} should be in {want} of batch {bid}, but {child} does not exist"),
                None,
            );
        }
        for other in [
            "batch-deleted",
            "batch-completed",
            "batch-failed",
            "batch-processing",
        ] {
            if other == want {
                continue;
            }
            let extra = format!("/batches/{bid}/states/{other}/{jid}");
            if self.exists(&extra) {
                let sev = self.by_age(path);
                self.push(
                    "extra-batch-child",
                    sev,
                    &extra,
                    Some(jid.into()),
                    format!("job {jid} is in {want}, so it should not be in {other} of batch {bid}; a job has one batch child"),
                    Some(&extra),
                );
            }
        }
    }

    fn lock(&mut self, path: &str, kind: &str, id: &str) {
        let subject = Some(cut(id, 64).into_owned());
        if !self.live.ephemeral.contains_key(path) {
            self.push(
                "stale-lock",
                Severity::Fail,
                path,
                subject,
                format!(
                    "a persistent lock on a {}: no session owns it, so it blocks its item for ever",
                    match kind {
                        "batches" => "batch",
                        "jobs" => "job",
                        _ => "access request",
                    }
                ),
                Some(path),
            );
            return;
        }
        let Some(age) = self.age_secs(path) else {
            return;
        };
        if age < AGE_ALERT_SECS {
            return;
        }
        let severity = if age < AGE_FAIL_SECS {
            Severity::Warn
        } else {
            Severity::Fail
        };
        self.push(
            "old-lock",
            severity,
            path,
            subject,
            format!(
                "held by a live session for {age} s (Merritt alerts at {AGE_ALERT_SECS} s); deleting it makes its holder's reports refused and frees the item"
            ),
            Some(path),
        );
    }
}

impl Rules<'_> {
    /// An access request in Processing whose `lock` is gone: its worker
    /// died, and no access daemon has taken it again for longer than the
    /// bound (the engine's state has no lock, so only the tree says so).
    /// Its age is the status node's `last_modified`, when it entered
    /// Processing or was last taken.
    fn access_status(&mut self, path: &str, qid: &str) {
        let Some(status) = self.json::<AccessStatusNode>(path, "access status") else {
            return;
        };
        if status.status != "Processing" {
            return;
        }
        let request = &path[..path.len() - "/status".len()];
        let lock = format!("{request}/lock");
        if self.exists(&lock) {
            return;
        }
        let changed =
            chrono::DateTime::parse_from_str(&status.last_modified, "%Y-%m-%d %H:%M:%S %z")
                .map(|t| t.timestamp_millis())
                .ok();
        let age = changed.map_or(u64::MAX, |ms| {
            u64::try_from(self.now_ms.saturating_sub(ms).max(0)).unwrap_or(0) / 1000
        });
        if age < self.stuck_after_secs {
            return;
        }
        let since =
            changed.map_or_else(|| "an unreadable time".to_string(), |_| format!("{age} s"));
        let severity = if age < AGE_FAIL_SECS {
            Severity::Warn
        } else {
            Severity::Fail
        };
        // The finding is about the missing lock: the status node is the
        // log's, and a requeue (not a delete) is the repair.
        self.push(
            "access-without-lock",
            severity,
            &lock,
            Some(cut(qid, 64).into_owned()),
            format!(
                "access request {} has been Processing for {since} with no worker holding its lock (the bound is {} s): no access daemon is taking it; start one, or `ingest access requeue` or `delete` it",
                cut(qid, 64),
                self.stuck_after_secs
            ),
            None,
        );
    }
}

/// `bid0000000001`-like: the prefix and at least one digit (Merritt's
/// `bid[0-9]+`).
fn is_id(s: &str, prefix: &str) -> bool {
    s.strip_prefix(prefix)
        .is_some_and(|d| !d.is_empty() && d.len() <= 20 && d.bytes().all(|b| b.is_ascii_digit()))
}

/// Merritt's rules over `live` at `now_ms` (milliseconds since the Unix
/// epoch). `log_has` says whether the log's tree has a node: a delete
/// repair is offered only for nodes it does not have.
///
/// An access request Processing without its lock is reported once it has
/// been so for `stuck_after_secs` ([`STUCK_AFTER_SECS`] by default).
pub fn tree_findings(
    live: &LiveTree,
    now_ms: i64,
    stuck_after_secs: u64,
    log_has: &dyn Fn(&str) -> bool,
) -> Vec<Found> {
    let mut rules = Rules {
        live,
        now_ms,
        stuck_after_secs,
        log_has,
        out: Vec::new(),
    };
    rules.run();
    rules.out
}

/// The drift between the log's tree and the live tree as findings (FAIL,
/// repaired by converging the tree), leaving out paths `already` reported
/// by another rule.
pub fn drift_findings(diff: &TreeDiff, already: &dyn Fn(&str) -> bool) -> Vec<Found> {
    let mut out = Vec::new();
    let mut push = |path: &str, what: &str| {
        if already(path) || layout::is_ephemeral_lock(path) {
            return;
        }
        out.push(Found {
            finding: Finding {
                id: finding_id("drift", path),
                rule: "drift".into(),
                severity: Severity::Fail,
                path: shown(path),
                subject: None,
                age_secs: None,
                detail: what.to_string(),
                repair: Some(drift_repair()),
            },
            plan: RepairPlan::RepairDrift(path.to_string()),
        });
    };
    for p in &diff.missing {
        push(p, "the log's tree has this node; the live tree does not");
    }
    for p in &diff.unexpected {
        push(p, "the live tree has this node; the log's tree does not");
    }
    for d in &diff.differing {
        push(
            &d.path,
            &format!(
                "the node's data differs from the log's ({} bytes live, {} expected)",
                d.actual.len(),
                d.expected.len()
            ),
        );
    }
    out
}

/// Deletes each of `paths` with every node under it, in one ZooKeeper
/// transaction, each node version-checked against what was just read (a
/// node changed or added meanwhile makes the whole transaction fail, and
/// nothing is deleted). Returns every path deleted, parents last; empty
/// when none of `paths` exists any more.
///
/// # Errors
/// [`ZkError`] on I/O or when the tree changed under the transaction.
pub async fn delete_subtrees(
    config: &crate::zk::ZkConfig,
    paths: &[String],
) -> Result<Vec<String>, crate::zk::ZkError> {
    use crate::zk::{call, connect, ZkError, ZkErrorKind};
    let client = connect(config).await?;
    let deadline = config.request_timeout;
    // Depth-first: (path, version), children before their parent.
    let mut doomed: Vec<(String, i32)> = Vec::new();
    for root in paths {
        let mut stack = vec![(root.clone(), false)];
        while let Some((path, expanded)) = stack.pop() {
            let Some(stat) = call(deadline, "exists", &path, client.check_stat(&path)).await?
            else {
                continue;
            };
            if expanded || stat.num_children == 0 {
                doomed.push((path, stat.version));
                continue;
            }
            let children =
                call(deadline, "get_children", &path, client.list_children(&path)).await?;
            if children.len() > 10_000 {
                return Err(ZkError::new(
                    "get_children",
                    shown(&path),
                    ZkErrorKind::Server(zookeeper_client::Error::BadArguments(
                        &"more than 10000 nodes under one repaired node",
                    )),
                ));
            }
            stack.push((path.clone(), true));
            for c in children {
                stack.push((format!("{path}/{c}"), false));
            }
        }
    }
    if doomed.is_empty() {
        return Ok(Vec::new());
    }
    let mut w = client.new_multi_writer();
    for (path, version) in &doomed {
        w.add_delete(path, Some(*version))
            .map_err(|e| ZkError::new("multi", shown(path), ZkErrorKind::Server(e)))?;
    }
    match tokio::time::timeout(deadline, w.commit()).await {
        Ok(Ok(_)) => Ok(doomed.into_iter().map(|(p, _)| p).collect()),
        Ok(Err(zookeeper_client::MultiWriteError::OperationFailed { index, source })) => {
            Err(ZkError::new(
                "multi delete",
                doomed.get(index).map(|(p, _)| shown(p)).unwrap_or_default(),
                ZkErrorKind::Server(source),
            ))
        }
        Ok(Err(zookeeper_client::MultiWriteError::RequestFailed { source })) => Err(ZkError::new(
            "multi delete",
            shown(&paths[0]),
            ZkErrorKind::Server(source),
        )),
        Err(_) => Err(ZkError::new(
            "multi delete",
            shown(&paths[0]),
            ZkErrorKind::Timeout(deadline),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::Tree;

    const NOW: i64 = 10_000_000_000;

    fn live(nodes: &[(&str, &[u8])], ephemeral: &[&str], age_secs: i64) -> LiveTree {
        let map: BTreeMap<String, Vec<u8>> = nodes
            .iter()
            .map(|(p, d)| ((*p).to_string(), d.to_vec()))
            .collect();
        LiveTree {
            ctimes: map
                .keys()
                .map(|p| (p.clone(), NOW - age_secs * 1000))
                .collect(),
            tree: Tree::from(map),
            ephemeral: ephemeral.iter().map(|p| ((*p).to_string(), 7)).collect(),
        }
    }

    fn rules(l: &LiveTree) -> Vec<(String, Severity, String)> {
        tree_findings(l, NOW, STUCK_AFTER_SECS, &|_| false)
            .into_iter()
            .map(|f| (f.finding.rule, f.finding.severity, f.finding.path))
            .collect()
    }

    fn good_job() -> Vec<(&'static str, &'static [u8])> {
        vec![
            ("/batch-uuids", b""),
            ("/batch-uuids/u1", b"bid0000000001"),
            ("/batches", b""),
            ("/batches/bid0000000001", b""),
            ("/batches/bid0000000001/submission", br#"{"batchID":"u1"}"#),
            ("/batches/bid0000000001/states", b""),
            ("/batches/bid0000000001/states/batch-processing", b""),
            (
                "/batches/bid0000000001/states/batch-processing/jid0000000001",
                b"",
            ),
            ("/jobs", b""),
            ("/jobs/states", b""),
            ("/jobs/states/pending", b""),
            ("/jobs/states/pending/05-jid0000000001", b""),
            ("/jobs/jid0000000001", b""),
            ("/jobs/jid0000000001/bid", b"bid0000000001"),
            ("/jobs/jid0000000001/priority", b"5"),
            ("/jobs/jid0000000001/status", br#"{"status":"Pending"}"#),
        ]
    }

    #[test]
    fn a_consistent_tree_has_no_finding() {
        assert_eq!(rules(&live(&good_job(), &[], 99_999)), vec![]);
    }

    #[test]
    fn each_merritt_rule_reports_with_merritts_ages() {
        let mut nodes = good_job();
        nodes.push(("/batch-uuids/u2", b"bid0000000009"));
        nodes.push(("/batches/bid0000000001/states/batch-failed", b""));
        nodes.push((
            "/batches/bid0000000001/states/batch-failed/jid0000000001",
            b"",
        ));
        nodes.push((
            "/batches/bid0000000001/states/batch-failed/jid0000000007",
            b"",
        ));
        nodes.push(("/jobs/states/failed", b""));
        nodes.push(("/jobs/states/failed/05-jid0000000001", b""));
        nodes.push(("/jobs/states/failed/05-jid0000000008", b""));
        nodes.push(("/batches/bid0000000002", b""));
        nodes.push(("/batches/bid0000000002/states", b""));
        let young = rules(&live(&nodes, &[], 10));
        let old = rules(&live(&nodes, &[], AGE_FAIL_SECS as i64));
        let names: Vec<&str> = young.iter().map(|(r, _, _)| r.as_str()).collect();
        for rule in [
            "orphan-batch-uuid",
            "orphan-batch-child",
            "extra-batch-child",
            "orphan-queue-entry",
            "duplicate-queue-entry",
            "empty-states",
        ] {
            assert!(names.contains(&rule), "{rule} in {young:?}");
        }
        let sev = |v: &[(String, Severity, String)], rule: &str| {
            v.iter().find(|(r, _, _)| r == rule).map(|(_, s, _)| *s)
        };
        assert_eq!(sev(&young, "orphan-batch-uuid"), Some(Severity::Warn));
        assert_eq!(sev(&old, "orphan-batch-uuid"), Some(Severity::Fail));
        assert_eq!(sev(&young, "duplicate-queue-entry"), Some(Severity::Fail));
    }

    #[test]
    fn locks_stale_and_old() {
        let mut nodes = good_job();
        nodes.push(("/jobs/jid0000000001/lock", b""));
        nodes.push(("/batches/bid0000000001/lock", b""));
        let l = live(&nodes, &["/batches/bid0000000001/lock"], 60);
        assert_eq!(
            rules(&l),
            vec![(
                "stale-lock".to_string(),
                Severity::Fail,
                "/jobs/jid0000000001/lock".to_string()
            )]
        );
        let l = live(
            &nodes,
            &["/batches/bid0000000001/lock"],
            AGE_ALERT_SECS as i64,
        );
        assert!(rules(&l).contains(&(
            "old-lock".to_string(),
            Severity::Warn,
            "/batches/bid0000000001/lock".to_string()
        )));
        let l = live(
            &nodes,
            &["/batches/bid0000000001/lock"],
            AGE_FAIL_SECS as i64,
        );
        assert!(rules(&l).contains(&(
            "old-lock".to_string(),
            Severity::Fail,
            "/batches/bid0000000001/lock".to_string()
        )));
    }

    /// A Processing request with no lock is named once it has been so for
    /// the bound, and not while its lock is held, before the bound, or in
    /// another state; the age is the status node's `last_modified`.
    #[test]
    fn an_access_request_processing_without_a_lock_is_reported_after_the_bound() {
        let at = |secs_ago: i64| {
            let t = chrono::DateTime::from_timestamp_millis(NOW - secs_ago * 1000).expect("time");
            format!(
                r#"{{"status":"Processing","last_modified":"{}","message":""}}"#,
                t.format("%Y-%m-%d %H:%M:%S %z")
            )
        };
        let status = "/access/small/qid0000000001/status";
        let lock = "/access/small/qid0000000001/lock";
        let found = |data: &str, locked: bool, bound: u64| -> Vec<(String, Severity, String)> {
            let mut nodes: Vec<(&str, &[u8])> = vec![
                ("/access", b""),
                ("/access/small", b""),
                ("/access/small/qid0000000001", b""),
                (status, data.as_bytes()),
            ];
            if locked {
                nodes.push((lock, b""));
            }
            let owned: &[&str] = if locked { &[lock] } else { &[] };
            let l = live(&nodes, owned, 1);
            tree_findings(&l, NOW, bound, &|_| false)
                .into_iter()
                .map(|f| (f.finding.rule, f.finding.severity, f.finding.path))
                .collect()
        };
        let stuck = vec![(
            "access-without-lock".to_string(),
            Severity::Warn,
            lock.to_string(),
        )];
        assert_eq!(found(&at(200), false, STUCK_AFTER_SECS), stuck);
        assert_eq!(found(&at(200), true, STUCK_AFTER_SECS), vec![]);
        assert_eq!(found(&at(30), false, STUCK_AFTER_SECS), vec![]);
        assert_eq!(found(&at(30), false, 10), stuck);
        assert_eq!(
            found(&at(99_999), false, STUCK_AFTER_SECS)[0].1,
            Severity::Fail
        );
        let pending = at(200).replace("Processing", "Pending");
        assert_eq!(found(&pending, false, STUCK_AFTER_SECS), vec![]);
        // An unreadable time counts as old, not as never.
        let garbled = r#"{"status":"Processing","last_modified":"yesterday"}"#;
        assert_eq!(
            found(garbled, false, STUCK_AFTER_SECS)[0].0,
            "access-without-lock"
        );
    }

    #[test]
    fn hostile_data_is_a_bounded_finding() {
        let huge = vec![b'x'; MAX_DATA_READ + 1];
        let binary: &[u8] = &[0xff, 0xfe, 0x00, 0x01];
        for (path, data) in [
            ("/batch-uuids/u1", huge.as_slice()),
            ("/batch-uuids/u1", binary),
            ("/jobs/jid0000000001/status", b"{not json" as &[u8]),
            ("/jobs/jid0000000001/priority", b"999"),
        ] {
            let mut nodes = good_job();
            for n in nodes.iter_mut() {
                if n.0 == path {
                    n.1 = data;
                }
            }
            let found = tree_findings(&live(&nodes, &[], 10), NOW, STUCK_AFTER_SECS, &|_| false);
            let f = found
                .iter()
                .find(|f| f.finding.rule == "unreadable-node")
                .unwrap_or_else(|| panic!("{path}: {found:?}"));
            assert_eq!(f.finding.severity, Severity::Fail);
            assert!(f.finding.detail.len() < 1024, "{}", f.finding.detail);
            assert!(!f.finding.detail.contains("xxxx"));
        }
    }

    #[test]
    fn ids_are_stable_and_nodes_the_log_has_are_no_findings() {
        let mut nodes = good_job();
        nodes.push(("/batches/bid0000000002", b""));
        nodes.push(("/batches/bid0000000002/states", b""));
        let l = live(&nodes, &[], 10);
        let a = tree_findings(&l, NOW, STUCK_AFTER_SECS, &|_| false);
        let b = tree_findings(&l, NOW + 5000, STUCK_AFTER_SECS, &|_| false);
        assert_eq!(a[0].finding.id, b[0].finding.id);
        assert!(a[0].finding.id.starts_with("empty-states-"));
        assert_eq!(
            a[0].plan,
            RepairPlan::DeleteNodes(vec!["/batches/bid0000000002/states".into()])
        );
        // D2: the log projects a manifest-failed batch's empty `states`
        // node; it was a WARN, then a FAIL after an hour.
        let states = "/batches/bid0000000002/states";
        assert!(tree_findings(&l, NOW, STUCK_AFTER_SECS, &|p| p == states).is_empty());
    }
}
