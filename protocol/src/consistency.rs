//! The consistency report: `ingest check` and `GET /consistency`.
//!
//! A report is a list of [`Finding`]s, each naming the rule it broke, how
//! bad it is ([`Severity`], with Merritt's WARN/FAIL ages where Merritt has
//! them), the ZooKeeper path it is about, and, where there is one, the
//! [`Repair`] an admin may apply. Repairs are applied through recorded
//! commands (`POST /consistency/repair`), never by a silent delete.
//!
//! The same types are printed by the CLI, answered by the API and rendered
//! by the admin pages.

use serde::{Deserialize, Serialize};

/// How bad a finding is, in the words of Merritt's admin tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Severity {
    /// Worth a look; may resolve by itself (e.g. a lock younger than the
    /// FAIL age).
    Warn,
    /// Needs an admin.
    Fail,
}

impl Severity {
    /// `WARN` or `FAIL`.
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Warn => "WARN",
            Severity::Fail => "FAIL",
        }
    }
}

/// A repair an admin may apply to one finding.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Repair {
    /// The action, a stable word (e.g. `delete-node`, `project`,
    /// `record-version`).
    pub action: String,
    /// What applying it does, in one sentence for a person.
    pub description: String,
}

/// One thing the report found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finding {
    /// A stable id of this finding (the same finding gets the same id on
    /// the next run), used to ask for its repair.
    pub id: String,
    /// The rule broken, a stable kebab-case word (e.g. `stale-lock`,
    /// `orphan-batch-uuid`, `drift`).
    pub rule: String,
    /// How bad it is.
    pub severity: Severity,
    /// The ZooKeeper path (or other place) it is about.
    pub path: String,
    /// The batch or job (or ark) it concerns, when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    /// How old the thing is, in seconds, when the rule depends on age.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub age_secs: Option<u64>,
    /// What is wrong, bounded (never unbounded node data).
    pub detail: String,
    /// The repair on offer, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repair: Option<Repair>,
}

/// A whole report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConsistencyReport {
    /// When it was made (RFC 3339, UTC).
    pub checked_at: String,
    /// The log position the tree was compared with.
    pub position: u64,
    /// The nodes read.
    pub nodes_checked: u64,
    /// Every finding, FAIL first, then by rule and path.
    pub findings: Vec<Finding>,
}

impl ConsistencyReport {
    /// The number of findings of `severity`.
    pub fn count(&self, severity: Severity) -> usize {
        self.findings
            .iter()
            .filter(|f| f.severity == severity)
            .count()
    }

    /// `PASS`, `WARN` or `FAIL`: the worst finding, as Merritt's tool
    /// summarises a table.
    pub fn status(&self) -> &'static str {
        match self.findings.iter().map(|f| f.severity).max() {
            None => "PASS",
            Some(s) => s.as_str(),
        }
    }
}

/// The body of `POST /consistency/repair`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RepairRequest {
    /// The finding's id, from a report.
    pub finding: String,
    /// Why (recorded with the repair).
    pub reason: String,
}

/// What `POST /consistency/repair` accepts: a [`RepairRequest`] and,
/// optionally, the admin's name, as the other admin routes take it (a body
/// of a [`RepairRequest`] alone is one of these too).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RepairBody {
    /// The finding's id, from a report.
    pub finding: String,
    /// Why (recorded with the repair).
    pub reason: String,
    /// The admin's name (`admin:NAME` or `NAME`; default `admin:api`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub actor: Option<String>,
}

impl From<RepairRequest> for RepairBody {
    fn from(r: RepairRequest) -> RepairBody {
        RepairBody {
            finding: r.finding,
            reason: r.reason,
            actor: None,
        }
    }
}

/// The answer of `POST /consistency/repair`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RepairDone {
    /// The finding repaired (as it was before the repair).
    pub finding: Finding,
    /// What was changed, for a person.
    pub summary: String,
    /// The log position of the `ConsistencyRepaired` event.
    pub position: u64,
}
