//! The lifecycle: which states jobs and batches have and which moves between
//! them are allowed.
//!
//! The states themselves are fixed in code ([`JobState`], [`BatchState`]): the
//! engine and the projection give several of them a meaning (Pending is where
//! work starts, Failed and Deleted do not update `last_successful_status`,
//! Completed and Deleted are terminal). The *transitions* come from a
//! `states.yml` in the format of Merritt's `mrt-zk` library. The project's own
//! copy is embedded in the binary ([`Lifecycle::builtin`]); an operator may load
//! another one ([`Lifecycle::load`]), which is validated and every problem
//! reported with its line.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::Path;

use serde::{Deserialize, Serialize};
use yaml_rust2::parser::{Event as YamlEvent, MarkedEventReceiver, Parser};
use yaml_rust2::scanner::Marker;

/// The lifecycle file the project ships, embedded in the binary.
pub const BUILTIN_STATES_YML: &str = include_str!("../states.yml");

/// A state enum of one kind of queue item.
pub trait StateKind: Copy + Ord + fmt::Debug + fmt::Display + 'static {
    /// Every state, in the order the lifecycle file lists them.
    const ALL: &'static [Self];
    /// The section of the lifecycle file that describes this kind.
    const SECTION: &'static str;
    /// `job` or `batch`, for messages.
    const ITEM: &'static str;
    /// The state an item is created in.
    const INITIAL: Self;
    /// The moves only an admin command makes, beside the lifecycle file's
    /// table: `(from, to, command)`. mrt-zk's code and Merritt's admin tool
    /// make them although its `states.yml` does not list them (a Completed
    /// item's "Queue Del", an access request's requeue). They are part of
    /// the table the engine enforces ([`Machine::admin_can`]) and that
    /// `ingest lifecycle` prints, whatever file is loaded.
    const ADMIN_MOVES: &'static [(Self, Self, &'static str)];
    /// The name as written in the lifecycle file and in ZooKeeper status nodes.
    fn name(self) -> &'static str;
    /// Looks a state up by its name as written in the lifecycle file.
    fn from_name(name: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|s| s.name() == name)
    }
}

macro_rules! state_enum {
    ($(#[$doc:meta])* $name:ident, $section:literal, $item:literal, [$($variant:ident),+ $(,)?],
     admin: [$(($from:ident, $to:ident, $cmd:literal)),* $(,)?]) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[allow(missing_docs)]
        pub enum $name { $($variant),+ }

        impl StateKind for $name {
            const ALL: &'static [Self] = &[$(Self::$variant),+];
            const SECTION: &'static str = $section;
            const ITEM: &'static str = $item;
            const INITIAL: Self = Self::Pending;
            const ADMIN_MOVES: &'static [(Self, Self, &'static str)] =
                &[$((Self::$from, Self::$to, $cmd)),*];
            fn name(self) -> &'static str {
                match self { $(Self::$variant => stringify!($variant)),+ }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.name())
            }
        }

        impl std::str::FromStr for $name {
            type Err = UnknownState;
            /// Accepts the lifecycle name in any case (`Downloading`, `downloading`)
            /// and the hyphenated form Merritt's documents use (`update-reporting`).
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                let folded: String = s.chars().filter(|c| *c != '-' && *c != '_').collect();
                Self::ALL
                    .iter()
                    .copied()
                    .find(|st| st.name().eq_ignore_ascii_case(&folded))
                    .ok_or_else(|| UnknownState {
                        input: s.to_string(),
                        item: $item,
                        known: Self::ALL.iter().map(|st| st.name()).collect::<Vec<_>>().join(", "),
                    })
            }
        }
    };
}

state_enum!(
    /// The twelve states of a job.
    JobState,
    "job_states",
    "job",
    [Pending, Held, Estimating, Provisioning, Downloading, Processing, Storing, Recording, Notify, Completed, Failed, Deleted],
    admin: [(Completed, Deleted, "delete")]
);
state_enum!(
    /// The eight states of a batch.
    BatchState,
    "batch_states",
    "batch",
    [Pending, Held, Processing, Reporting, UpdateReporting, Completed, Failed, Deleted],
    admin: [(Completed, Deleted, "delete")]
);

state_enum!(
    /// The five states of an access (assembly) request, mrt-zk's
    /// `access_states`.
    AccessState,
    "access_states",
    "access request",
    [Pending, Processing, Completed, Deleted, Failed],
    // Processing → Pending or Deleted: a request whose worker died (the
    // server refuses both while a worker holds the request's lock).
    admin: [
        (Completed, Deleted, "delete"),
        (Failed, Pending, "requeue"),
        (Processing, Pending, "requeue"),
        (Processing, Deleted, "delete")
    ]
);

impl JobState {
    /// The states with a step a worker runs (every state a job daemon works
    /// on, besides Pending which only starts jobs), in lifecycle order.
    pub const WITH_STEP: [JobState; 7] = [
        JobState::Estimating,
        JobState::Provisioning,
        JobState::Downloading,
        JobState::Processing,
        JobState::Storing,
        JobState::Recording,
        JobState::Notify,
    ];

    /// Whether a worker runs a step in this state (see [`Self::WITH_STEP`]).
    pub fn has_step(self) -> bool {
        Self::WITH_STEP.contains(&self)
    }

    /// The lower-case name used in `/jobs/states/<state>` queue paths.
    pub fn queue_name(self) -> String {
        self.name().to_ascii_lowercase()
    }

    /// Whether a job in this state still has work ahead of it without an
    /// admin (neither finished nor parked).
    pub fn is_active(self) -> bool {
        !matches!(
            self,
            Self::Completed | Self::Failed | Self::Deleted | Self::Held
        )
    }

    /// Whether the job is done as far as its batch is concerned.
    pub fn is_finished(self) -> bool {
        matches!(self, Self::Completed | Self::Failed | Self::Deleted)
    }
}

/// A state name that is not one of the item's states.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{input:?} is not a {item} state (known: {known})")]
pub struct UnknownState {
    /// What was given.
    pub input: String,
    /// `job` or `batch`.
    pub item: &'static str,
    /// The known states, comma-separated.
    pub known: String,
}

/// The rules of one state: where it may go, and where success and failure lead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateRule<S> {
    /// Every allowed target, in file order.
    pub targets: Vec<S>,
    /// The target marked `success: true`, if any.
    pub success: Option<S>,
    /// The target marked `fail: true`, if any.
    pub fail: Option<S>,
}

/// The transition table of one kind of item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Machine<S: StateKind> {
    rules: BTreeMap<S, StateRule<S>>,
}

impl<S: StateKind> Machine<S> {
    /// The rule of a state.
    pub fn rule(&self, state: S) -> &StateRule<S> {
        // Validation guarantees every state has a rule.
        &self.rules[&state]
    }

    /// The states `from` may move to.
    pub fn allowed(&self, from: S) -> &[S] {
        &self.rule(from).targets
    }

    /// Whether `from → to` is allowed.
    pub fn can(&self, from: S, to: S) -> bool {
        self.allowed(from).contains(&to)
    }

    /// Where success leads from `from`.
    pub fn success(&self, from: S) -> Option<S> {
        self.rule(from).success
    }

    /// Where failure leads from `from`.
    pub fn fail(&self, from: S) -> Option<S> {
        self.rule(from).fail
    }

    /// Whether an admin command may move an item `from → to`: a move of the
    /// table, or one of [`StateKind::ADMIN_MOVES`].
    pub fn admin_can(&self, from: S, to: S) -> bool {
        self.can(from, to)
            || S::ADMIN_MOVES
                .iter()
                .any(|(f, t, _)| *f == from && *t == to)
    }

    /// The admin-only moves out of `from`, with the command of each.
    pub fn admin_moves(&self, from: S) -> impl Iterator<Item = (S, &'static str)> + '_ {
        S::ADMIN_MOVES
            .iter()
            .filter(move |(f, t, _)| *f == from && !self.can(from, *t))
            .map(|(_, t, c)| (*t, *c))
    }

    /// A terminal state has no way out; only items in a terminal state are
    /// *deletable* from the live tree (mrt-zk's `deletable?`).
    pub fn is_terminal(&self, state: S) -> bool {
        self.allowed(state).is_empty()
    }

    /// Every state with its rule, in the order of [`StateKind::ALL`].
    pub fn iter(&self) -> impl Iterator<Item = (S, &StateRule<S>)> {
        S::ALL.iter().map(move |s| (*s, self.rule(*s)))
    }

    /// The allowed targets as a readable list, for error messages.
    pub fn allowed_names(&self, from: S) -> Vec<String> {
        self.allowed(from)
            .iter()
            .map(|s| s.name().to_string())
            .collect()
    }
}

/// The job and batch transition tables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lifecycle {
    /// Job transitions.
    pub jobs: Machine<JobState>,
    /// Batch transitions.
    pub batches: Machine<BatchState>,
    /// Access (assembly) request transitions, from `access_states`; a file
    /// without that section (written before the access queue) gets the
    /// built-in table.
    pub access: Machine<AccessState>,
    /// Where the table came from (`built-in` or a path), for messages.
    pub source: String,
}

/// One problem in a lifecycle file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// 1-based line in the file.
    pub line: usize,
    /// What is wrong there.
    pub message: String,
}

/// A lifecycle file that cannot be used. Every problem found is listed.
///
/// ### Handling
/// Fatal at start-up: print it and exit; nothing has been appended.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LifecycleError {
    /// The file could not be read.
    #[error("cannot read lifecycle file {path}: {reason}")]
    Read {
        /// The path given.
        path: String,
        /// The I/O error.
        reason: String,
    },
    /// The file was read but is not a valid lifecycle.
    #[error("{}", render_problems(file, problems))]
    Invalid {
        /// Where the file came from.
        file: String,
        /// Every problem, in line order.
        problems: Vec<Problem>,
    },
}

fn render_problems(source: &str, problems: &[Problem]) -> String {
    let mut out = format!(
        "invalid lifecycle file {source}: {} problem(s)",
        problems.len()
    );
    for p in problems {
        out.push_str(&format!("\n  {source}:{}: {}", p.line, p.message));
    }
    out
}

impl Lifecycle {
    /// The lifecycle embedded in the binary (a copy of mrt-zk 2.7's `states.yml`).
    pub fn builtin() -> Lifecycle {
        match Self::from_yaml_str(BUILTIN_STATES_YML, "built-in") {
            Ok(l) => l,
            // The embedded file is checked by a unit test; reaching this is a build defect.
            Err(e) => unreachable!("the embedded states.yml is invalid: {e}"),
        }
    }

    /// Loads and validates a lifecycle file.
    ///
    /// # Errors
    /// [`LifecycleError::Read`] when the file cannot be read,
    /// [`LifecycleError::Invalid`] listing every problem with its line.
    pub fn load(path: &Path) -> Result<Lifecycle, LifecycleError> {
        let text = std::fs::read_to_string(path).map_err(|e| LifecycleError::Read {
            path: path.display().to_string(),
            reason: e.to_string(),
        })?;
        Self::from_yaml_str(&text, &path.display().to_string())
    }

    /// Parses and validates lifecycle YAML text.
    ///
    /// # Errors
    /// [`LifecycleError::Invalid`] listing every problem with its line.
    pub fn from_yaml_str(text: &str, source: &str) -> Result<Lifecycle, LifecycleError> {
        let invalid = |problems: Vec<Problem>| LifecycleError::Invalid {
            file: source.to_string(),
            problems,
        };
        let root = parse_marked(text).map_err(|p| invalid(vec![p]))?;
        let mut problems = Vec::new();
        let sections = match &root {
            Node::Map(entries, _) => entries,
            Node::Null(_) => {
                return Err(invalid(vec![Problem {
                    line: 1,
                    message: "the file is empty".into(),
                }]));
            }
            other => {
                return Err(invalid(vec![Problem {
                    line: other.line(),
                    message: "expected a mapping of sections (job_states, batch_states)".into(),
                }]));
            }
        };
        check_duplicates(sections, "section", &mut problems);
        // Every section is checked for shape, also ones the engine does not use
        // (mrt-zk's `access_states`), so a typo anywhere is caught.
        let mut raw = BTreeMap::new();
        for (key, line, node) in sections {
            if let Some(table) = raw_table(key, node, *line, &mut problems) {
                raw.entry(key.clone()).or_insert(table);
            }
        }
        let jobs = build_machine::<JobState>(raw.get(JobState::SECTION), &mut problems);
        let batches = build_machine::<BatchState>(raw.get(BatchState::SECTION), &mut problems);
        let access = match raw.get(AccessState::SECTION) {
            Some(table) => build_machine::<AccessState>(Some(table), &mut problems),
            // The built-in file has the section, so this does not recurse.
            None if source != "built-in" => Some(Lifecycle::builtin().access),
            None => build_machine::<AccessState>(None, &mut problems),
        };
        problems.sort_by_key(|p| p.line);
        problems.dedup();
        match (jobs, batches, access) {
            (Some(jobs), Some(batches), Some(access)) if problems.is_empty() => Ok(Lifecycle {
                jobs,
                batches,
                access,
                source: source.to_string(),
            }),
            _ => Err(invalid(problems)),
        }
    }

    /// The tables of `items` (every kind when empty) as aligned text: one
    /// row per state with its targets, including the admin-only moves the
    /// engine allows ([`StateKind::ADMIN_MOVES`]).
    pub fn table(&self, items: &[ItemKind]) -> String {
        let mut out = String::new();
        for item in ItemKind::or_all(items) {
            if !out.is_empty() {
                out.push('\n');
            }
            match item {
                ItemKind::Job => render_table(&mut out, "Jobs", &self.jobs),
                ItemKind::Batch => render_table(&mut out, "Batches", &self.batches),
                ItemKind::Access => render_table(&mut out, "Access requests", &self.access),
            }
        }
        out
    }

    /// ONE Mermaid `stateDiagram-v2` of `item`, generated from the table the
    /// engine enforces (admin-only moves labelled `admin COMMAND`): a
    /// renderer reads one diagram per input.
    pub fn mermaid(&self, item: ItemKind) -> String {
        let mut out = String::new();
        match item {
            ItemKind::Job => render_mermaid(&mut out, "Job", &self.jobs),
            ItemKind::Batch => render_mermaid(&mut out, "Batch", &self.batches),
            ItemKind::Access => render_mermaid(&mut out, "Access request", &self.access),
        }
        out
    }
}

/// The kinds of items with a lifecycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ItemKind {
    /// Jobs.
    Job,
    /// Batches.
    Batch,
    /// Access (assembly) requests.
    Access,
}

impl ItemKind {
    /// Every kind, in the order `ingest lifecycle` prints them.
    pub const ALL: [ItemKind; 3] = [ItemKind::Job, ItemKind::Batch, ItemKind::Access];

    fn or_all(items: &[ItemKind]) -> &[ItemKind] {
        match items.is_empty() {
            true => &Self::ALL,
            false => items,
        }
    }
}

fn render_table<S: StateKind>(out: &mut String, title: &str, m: &Machine<S>) {
    let w = S::ALL
        .iter()
        .map(|s| s.name().len())
        .max()
        .unwrap_or(8)
        .max(5);
    out.push_str(&format!("{title} ({} states)\n", S::ALL.len()));
    out.push_str(&format!(
        "{:<w$}  {:<w$}  {:<w$}  {:<8}  allowed targets (admin only: command)\n",
        "state", "success", "fail", "terminal"
    ));
    for (s, rule) in m.iter() {
        let name = |o: Option<S>| o.map_or("-", |s| s.name());
        let targets: Vec<String> = rule
            .targets
            .iter()
            .map(|t| t.name().to_string())
            .chain(
                m.admin_moves(s)
                    .map(|(t, c)| format!("{} (admin: {c})", t.name())),
            )
            .collect();
        out.push_str(&format!(
            "{:<w$}  {:<w$}  {:<w$}  {:<8}  {}\n",
            s.name(),
            name(rule.success),
            name(rule.fail),
            if m.is_terminal(s) { "yes" } else { "no" },
            if targets.is_empty() {
                "-".to_string()
            } else {
                targets.join(", ")
            }
        ));
    }
}

fn render_mermaid<S: StateKind>(out: &mut String, title: &str, m: &Machine<S>) {
    out.push_str(&format!(
        "---\ntitle: {title} lifecycle\n---\nstateDiagram-v2\n"
    ));
    out.push_str(&format!("    [*] --> {}\n", S::INITIAL.name()));
    for (s, rule) in m.iter() {
        for t in &rule.targets {
            let label = match (rule.success == Some(*t), rule.fail == Some(*t)) {
                (true, true) => " : success / fail",
                (true, false) => " : success",
                (false, true) => " : fail",
                (false, false) => "",
            };
            out.push_str(&format!("    {} --> {}{}\n", s.name(), t.name(), label));
        }
        for (t, command) in m.admin_moves(s) {
            out.push_str(&format!(
                "    {} --> {} : admin {command}\n",
                s.name(),
                t.name()
            ));
        }
        if m.is_terminal(s) {
            out.push_str(&format!("    {} --> [*]\n", s.name()));
        }
    }
}

/// A section as read, names still unchecked, each with its line.
struct RawState {
    line: usize,
    targets: Vec<RawTarget>,
}

struct RawTarget {
    name: String,
    line: usize,
    success: bool,
    fail: bool,
}

type RawTable = Vec<(String, RawState)>;

fn raw_table(
    section: &str,
    node: &Node,
    line: usize,
    problems: &mut Vec<Problem>,
) -> Option<RawTable> {
    let entries = match node {
        Node::Map(e, _) => e,
        Node::Null(_) => {
            problems.push(Problem {
                line,
                message: format!("section {section} is empty"),
            });
            return None;
        }
        other => {
            problems.push(Problem {
                line: other.line(),
                message: format!("section {section} must map each state to its allowed targets"),
            });
            return None;
        }
    };
    check_duplicates(entries, &format!("state in {section}"), problems);
    let mut table = RawTable::new();
    for (state, state_line, body) in entries {
        let targets = match body {
            Node::Null(_) => Vec::new(),
            Node::Map(t, _) => {
                check_duplicates(t, &format!("target of {state}"), problems);
                t.iter()
                    .map(|(name, tl, marks)| raw_target(state, name, *tl, marks, problems))
                    .collect()
            }
            other => {
                problems.push(Problem {
                    line: other.line(),
                    message: format!(
                        "state {state} must map its targets (or be empty for a terminal state)"
                    ),
                });
                Vec::new()
            }
        };
        if table.iter().all(|(n, _)| n != state) {
            table.push((
                state.clone(),
                RawState {
                    line: *state_line,
                    targets,
                },
            ));
        }
    }
    // Generic checks that hold for any section: unknown targets and unreachable states.
    let names: BTreeSet<&str> = table.iter().map(|(n, _)| n.as_str()).collect();
    let mut reached: BTreeSet<&str> = BTreeSet::new();
    for (state, rs) in &table {
        let mut success = 0;
        let mut fail = 0;
        for t in &rs.targets {
            if !names.contains(t.name.as_str()) {
                let marker = match (t.success, t.fail) {
                    (true, true) => "success/fail marker on ",
                    (true, false) => "success marker on ",
                    (false, true) => "fail marker on ",
                    (false, false) => "",
                };
                problems.push(Problem {
                    line: t.line,
                    message: format!(
                        "{marker}transition {state} -> {}: {} is not a state of {section}",
                        t.name, t.name
                    ),
                });
            }
            reached.insert(t.name.as_str());
            success += usize::from(t.success);
            fail += usize::from(t.fail);
        }
        for (count, kind) in [(success, "success"), (fail, "fail")] {
            if count > 1 {
                problems.push(Problem {
                    line: rs.line,
                    message: format!(
                        "state {state} marks {count} transitions as {kind}; at most one may be"
                    ),
                });
            }
        }
    }
    for (i, (state, rs)) in table.iter().enumerate() {
        // The first state listed is where items start; every other needs a way in.
        if i > 0 && !reached.contains(state.as_str()) {
            problems.push(Problem {
                line: rs.line,
                message: format!("state {state} in {section} has no way in"),
            });
        }
    }
    Some(table)
}

fn raw_target(
    state: &str,
    name: &str,
    line: usize,
    marks: &Node,
    problems: &mut Vec<Problem>,
) -> RawTarget {
    let mut t = RawTarget {
        name: name.to_string(),
        line,
        success: false,
        fail: false,
    };
    match marks {
        Node::Null(_) => {}
        Node::Map(entries, _) => {
            check_duplicates(entries, &format!("marker of {state} -> {name}"), problems);
            for (key, kl, value) in entries {
                let flag = match value {
                    Node::Scalar(v, _) if v == "true" => true,
                    Node::Scalar(v, _) if v == "false" => false,
                    other => {
                        problems.push(Problem {
                            line: other.line(),
                            message: format!(
                                "marker {key} of {state} -> {name} must be true or false"
                            ),
                        });
                        false
                    }
                };
                match key.as_str() {
                    "success" => t.success = flag,
                    "fail" => t.fail = flag,
                    other => problems.push(Problem {
                        line: *kl,
                        message: format!("unknown marker {other:?} on {state} -> {name} (expected success or fail)"),
                    }),
                }
            }
        }
        other => problems.push(Problem {
            line: other.line(),
            message: format!(
                "transition {state} -> {name} must be empty or {{success: true}} / {{fail: true}}"
            ),
        }),
    }
    t
}

fn build_machine<S: StateKind>(
    raw: Option<&RawTable>,
    problems: &mut Vec<Problem>,
) -> Option<Machine<S>> {
    let Some(raw) = raw else {
        problems.push(Problem {
            line: 1,
            message: format!("missing section {}", S::SECTION),
        });
        return None;
    };
    let mut rules = BTreeMap::new();
    let first_line = raw.first().map_or(1, |(_, rs)| rs.line);
    for (name, rs) in raw {
        let Some(state) = S::from_name(name) else {
            problems.push(Problem {
                line: rs.line,
                message: format!(
                    "{name} is not a {} state (the engine knows {})",
                    S::ITEM,
                    S::ALL
                        .iter()
                        .map(|s| s.name())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            });
            continue;
        };
        let mut rule = StateRule {
            targets: Vec::new(),
            success: None,
            fail: None,
        };
        for t in &rs.targets {
            // Unknown targets were already reported by the generic checks.
            if let Some(target) = S::from_name(&t.name) {
                rule.targets.push(target);
                if t.success {
                    rule.success = Some(target);
                }
                if t.fail {
                    rule.fail = Some(target);
                }
            }
        }
        rules.insert(state, rule);
    }
    for s in S::ALL {
        if !rules.contains_key(s) {
            problems.push(Problem {
                line: first_line,
                message: format!(
                    "section {} does not define the {} state {}",
                    S::SECTION,
                    S::ITEM,
                    s.name()
                ),
            });
        }
    }
    if raw.first().map(|(n, _)| n.as_str()) != Some(S::INITIAL.name()) {
        problems.push(Problem {
            line: first_line,
            message: format!(
                "the first state of {} must be {}, where items start",
                S::SECTION,
                S::INITIAL.name()
            ),
        });
    }
    (rules.len() == S::ALL.len()).then_some(Machine { rules })
}

fn check_duplicates(entries: &[(String, usize, Node)], what: &str, problems: &mut Vec<Problem>) {
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    for (key, line, _) in entries {
        if let Some(first) = seen.get(key.as_str()) {
            problems.push(Problem {
                line: *line,
                message: format!("duplicate {what} {key:?} (first defined on line {first})"),
            });
        } else {
            seen.insert(key, *line);
        }
    }
}

/// A YAML node with the line it starts on.
#[derive(Debug)]
enum Node {
    Null(usize),
    Scalar(String, usize),
    Map(Vec<(String, usize, Node)>, usize),
    Seq(usize),
}

impl Node {
    fn line(&self) -> usize {
        match self {
            Node::Null(l) | Node::Scalar(_, l) | Node::Map(_, l) | Node::Seq(l) => *l,
        }
    }
}

/// Builds a [`Node`] tree from parser events, keeping each key's line. YAML
/// loaders that build a map drop duplicate keys silently; this one keeps them
/// so they can be reported.
#[derive(Default)]
struct Builder {
    stack: Vec<Frame>,
    root: Option<Node>,
    problem: Option<Problem>,
}

enum Frame {
    Map {
        entries: Vec<(String, usize, Node)>,
        line: usize,
        key: Option<(String, usize)>,
    },
    Seq {
        line: usize,
        depth: usize,
    },
}

impl Builder {
    fn push_value(&mut self, node: Node) {
        match self.stack.last_mut() {
            None => self.root = Some(node),
            Some(Frame::Seq { .. }) => {}
            Some(Frame::Map { entries, key, .. }) => match key.take() {
                None => match node {
                    Node::Scalar(s, l) => *key = Some((s, l)),
                    Node::Null(l) => *key = Some((String::new(), l)),
                    other => {
                        self.problem.get_or_insert(Problem {
                            line: other.line(),
                            message: "mapping keys must be plain state names".into(),
                        });
                        *key = Some((String::new(), other.line()));
                    }
                },
                Some((k, kl)) => entries.push((k, kl, node)),
            },
        }
    }
}

fn line_of(mark: Marker) -> usize {
    // yaml-rust2 counts lines from 1.
    mark.line().max(1)
}

impl MarkedEventReceiver for Builder {
    fn on_event(&mut self, ev: YamlEvent, mark: Marker) {
        let line = line_of(mark);
        if let Some(Frame::Seq { depth, .. }) = self.stack.last_mut() {
            // Sequences carry no lifecycle meaning; skip their content.
            match ev {
                YamlEvent::SequenceStart(..) | YamlEvent::MappingStart(..) => *depth += 1,
                YamlEvent::SequenceEnd | YamlEvent::MappingEnd if *depth > 0 => *depth -= 1,
                YamlEvent::SequenceEnd => {
                    if let Some(Frame::Seq { line, .. }) = self.stack.pop() {
                        self.push_value(Node::Seq(line));
                    }
                }
                _ => {}
            }
            return;
        }
        match ev {
            YamlEvent::Scalar(s, style, _, _) => {
                let plain = matches!(style, yaml_rust2::scanner::TScalarStyle::Plain);
                if plain && (s.is_empty() || s == "~" || s == "null") {
                    self.push_value(Node::Null(line));
                } else {
                    self.push_value(Node::Scalar(s, line));
                }
            }
            YamlEvent::MappingStart(..) => self.stack.push(Frame::Map {
                entries: Vec::new(),
                line,
                key: None,
            }),
            YamlEvent::MappingEnd => {
                if let Some(Frame::Map { entries, line, .. }) = self.stack.pop() {
                    self.push_value(Node::Map(entries, line));
                }
            }
            YamlEvent::SequenceStart(..) => self.stack.push(Frame::Seq { line, depth: 0 }),
            YamlEvent::Alias(_) => {
                self.problem.get_or_insert(Problem {
                    line,
                    message: "aliases are not supported in lifecycle files".into(),
                });
                self.push_value(Node::Null(line));
            }
            _ => {}
        }
    }
}

fn parse_marked(text: &str) -> Result<Node, Problem> {
    let mut builder = Builder::default();
    let mut parser = Parser::new_from_str(text);
    parser.load(&mut builder, false).map_err(|e| Problem {
        line: line_of(*e.marker()),
        message: format!("not valid YAML: {}", e.info()),
    })?;
    if let Some(p) = builder.problem {
        return Err(p);
    }
    Ok(builder.root.unwrap_or(Node::Null(1)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problems(text: &str) -> Vec<Problem> {
        match Lifecycle::from_yaml_str(text, "t.yml") {
            Err(LifecycleError::Invalid { problems, .. }) => problems,
            other => panic!("expected problems, got {other:?}"),
        }
    }

    #[test]
    fn builtin_lifecycle_has_the_documented_states() {
        let l = Lifecycle::builtin();
        assert_eq!(JobState::ALL.len(), 12);
        assert_eq!(BatchState::ALL.len(), 8);
        assert_eq!(
            l.jobs.success(JobState::Processing),
            Some(JobState::Storing)
        );
        assert_eq!(l.jobs.fail(JobState::Notify), Some(JobState::Failed));
        assert_eq!(
            l.batches.success(BatchState::Processing),
            Some(BatchState::Reporting)
        );
        assert_eq!(
            l.batches.fail(BatchState::Processing),
            Some(BatchState::Reporting)
        );
        assert!(l.jobs.is_terminal(JobState::Completed));
        assert!(l.jobs.is_terminal(JobState::Deleted));
        assert!(!l.jobs.is_terminal(JobState::Failed));
        assert!(l.jobs.can(JobState::Failed, JobState::Storing));
        assert!(!l.jobs.can(JobState::Completed, JobState::Deleted));
    }

    #[test]
    fn access_states_are_loaded_and_checked() {
        let l = Lifecycle::builtin();
        assert_eq!(AccessState::ALL.len(), 5);
        assert_eq!(
            l.access.success(AccessState::Processing),
            Some(AccessState::Completed)
        );
        assert_eq!(
            l.access.fail(AccessState::Processing),
            Some(AccessState::Failed)
        );
        assert!(l.access.can(AccessState::Failed, AccessState::Deleted));
        assert!(l.access.is_terminal(AccessState::Completed));
        // A typo in access_states is reported with its line, like the others.
        let text = BUILTIN_STATES_YML.replace(
            "access_states:\n  Pending:\n    Processing:",
            "access_states:\n  Pending:\n    Procesing:",
        );
        assert_ne!(text, BUILTIN_STATES_YML, "the built-in file changed shape");
        let err = Lifecycle::from_yaml_str(&text, "t.yml").expect_err("a typo");
        assert!(err.to_string().contains("Procesing"), "{err}");
        // A file written before the access queue keeps working.
        let cut = BUILTIN_STATES_YML
            .split("access_states:")
            .next()
            .expect("a prefix");
        let old = Lifecycle::from_yaml_str(cut, "old.yml").expect("no access section");
        assert_eq!(old.access, l.access);
    }

    #[test]
    fn unknown_target_is_reported_with_its_line() {
        let text = BUILTIN_STATES_YML.replacen(
            "    Provisioning: {success: true}",
            "    Provisionning: {success: true}",
            1,
        );
        let p = problems(&text);
        let line = text
            .lines()
            .position(|l| l.contains("Provisionning"))
            .unwrap()
            + 1;
        assert!(
            p.iter().any(|p| p.line == line
                && p.message
                    .contains("success marker on transition Estimating -> Provisionning")),
            "{p:?}"
        );
    }

    #[test]
    fn state_with_no_way_in_is_reported() {
        // Nothing leads to Storing any more.
        let text = BUILTIN_STATES_YML
            .replacen(
                "    Storing: {success: true}",
                "    Recording: {success: true}",
                1,
            )
            .replacen(
                "    Storing:\n    Recording:\n    Notify:\n    Deleted:",
                "    Recording:\n    Notify:\n    Deleted:",
                1,
            );
        let p = problems(&text);
        let line = text.lines().position(|l| l == "  Storing:").unwrap() + 1;
        assert!(
            p.iter().any(
                |p| p.line == line && p.message.contains("Storing in job_states has no way in")
            ),
            "{p:?}"
        );
    }

    #[test]
    fn duplicate_keys_are_reported_at_the_duplicate() {
        let text = BUILTIN_STATES_YML.replacen(
            "  Held:\n    Pending:\n    Deleted:\n",
            "  Held:\n    Pending:\n    Pending:\n    Deleted:\n",
            1,
        );
        let p = problems(&text);
        let first = text.lines().position(|l| l == "  Held:").unwrap() + 2;
        assert!(
            p.iter().any(|p| p.line == first + 1
                && p.message
                    .contains(&format!("first defined on line {first}"))),
            "{p:?}"
        );
    }

    #[test]
    fn markers_must_be_known_and_single() {
        let text = BUILTIN_STATES_YML
            .replacen(
                "    Failed: {fail: true}\n  Held:",
                "    Failed: {fial: true}\n  Held:",
                1,
            )
            .replacen(
                "    Recording: {success: true}\n    Failed: {fail: true}",
                "    Recording: {success: true}\n    Failed: {success: true}",
                1,
            );
        let p = problems(&text);
        assert!(
            p.iter()
                .any(|p| p.message.contains("unknown marker \"fial\"")),
            "{p:?}"
        );
        assert!(
            p.iter().any(|p| p
                .message
                .contains("state Storing marks 2 transitions as success")),
            "{p:?}"
        );
    }

    #[test]
    fn unknown_state_and_missing_section_and_bad_yaml() {
        let p = problems("job_states:\n  Pending:\n    Frozen:\n  Frozen:\n");
        assert!(
            p.iter()
                .any(|p| p.line == 4 && p.message.contains("Frozen is not a job state")),
            "{p:?}"
        );
        assert!(
            p.iter()
                .any(|p| p.message.contains("missing section batch_states")),
            "{p:?}"
        );
        let p = problems("job_states:\n  Pending: [\n");
        assert_eq!(p.len(), 1);
        assert!(p[0].message.starts_with("not valid YAML"), "{p:?}");
    }

    #[test]
    fn state_names_parse_in_any_case_and_hyphenated() {
        assert_eq!(
            "update-reporting".parse::<BatchState>(),
            Ok(BatchState::UpdateReporting)
        );
        assert_eq!("downloading".parse::<JobState>(), Ok(JobState::Downloading));
        assert!("frozen"
            .parse::<JobState>()
            .unwrap_err()
            .to_string()
            .contains("Pending, Held"));
    }

    #[test]
    fn mermaid_is_generated_from_the_table() {
        let l = Lifecycle::builtin();
        let m = l.mermaid(ItemKind::Job);
        for (s, rule) in l.jobs.iter() {
            for t in &rule.targets {
                assert!(
                    m.contains(&format!("    {} --> {}", s, t)),
                    "{s} -> {t} missing"
                );
            }
        }
        // B16: one diagram per output.
        assert_eq!(m.matches("stateDiagram-v2").count(), 1, "{m}");
        assert!(l
            .mermaid(ItemKind::Batch)
            .contains("Processing --> Reporting : success / fail"));
    }

    // D3: the engine allowed moves the printed table did not show (a
    // Completed job deleted, an access request requeued from Failed).
    #[test]
    fn the_admin_moves_the_engine_allows_are_in_the_table_and_the_diagrams() {
        let l = Lifecycle::builtin();
        assert!(l.jobs.admin_can(JobState::Completed, JobState::Deleted));
        assert!(!l.jobs.admin_can(JobState::Notify, JobState::Deleted));
        assert!(l
            .batches
            .admin_can(BatchState::Completed, BatchState::Deleted));
        assert!(l
            .access
            .admin_can(AccessState::Failed, AccessState::Pending));
        assert!(l
            .access
            .admin_can(AccessState::Completed, AccessState::Deleted));
        // A Processing request whose worker died is requeued (the server
        // refuses it while a lock is held); a Pending one is not deleted.
        assert!(l
            .access
            .admin_can(AccessState::Processing, AccessState::Pending));
        assert!(!l
            .access
            .admin_can(AccessState::Pending, AccessState::Deleted));
        let table = l.table(&[]);
        let row = |title: &str, state: &str| -> String {
            let section = table.split(title).nth(1).expect(title);
            section
                .lines()
                .find(|r| r.split_whitespace().next() == Some(state))
                .unwrap_or_else(|| panic!("{title} {state}: {table}"))
                .to_string()
        };
        assert!(row("Jobs", "Completed").ends_with("Deleted (admin: delete)"));
        assert!(row("Batches", "Completed").ends_with("Deleted (admin: delete)"));
        assert!(row("Access requests", "Failed").contains("Pending (admin: requeue)"));
        assert!(l
            .mermaid(ItemKind::Access)
            .contains("    Failed --> Pending : admin requeue\n"));
        assert!(l
            .mermaid(ItemKind::Job)
            .contains("    Completed --> Deleted : admin delete\n"));
        assert_eq!(l.table(&[ItemKind::Batch]).matches("states)").count(), 1);
    }
}
