//! Given/when/then tests of the command decisions, as data.
//!
//! Each file in `tests/scenarios/*.yml` is a list of scenarios:
//!
//! ```yaml
//! - name: a started job goes to Estimating
//!   given: [submit, acquire b1]
//!   when: start j1
//!   then:
//!     - "jid0000000001: JobStatusChanged Pending -> Estimating"
//!   state:
//!     - j1 status=Estimating lss=Pending retry=0
//! ```
//!
//! `given` commands must be accepted; `when` is one command; `then` lists the
//! events it appends, one line each as [`common::render_record`] writes them,
//! or `rejected` gives the rejection as [`common::render_rejection`] writes
//! it. `state` lines check fields of a job (`jN`), a batch (`bN`) or the
//! queue (`queue`) afterwards. Every command runs through `decide`, a real log
//! in a temporary directory and the fold (see [`common::Harness::execute`],
//! which also checks the mrt-zk `last_successful_status`/`retry_count` rule
//! after every move, and that a rejected command appends nothing). A rejection's
//! message must name the item, its state and the allowed targets.
//!
//! ## The command language
//! One command per line: a verb, positional arguments, `key=value` options
//! (`key="a value with spaces"`). Ids are `b1`/`j1` or written out
//! (`bid0000000001`). Options default to: profile `demo`, priority unset,
//! reason and message empty.
//!
//! | command | arguments and options |
//! |---|---|
//! | `submit` | `profile= uuid=N submitter= url= digest=ALG:HEX manifest="a\|b" extra=KEY:VALUE` |
//! | `acquire B` | `jobs=N` (default 1) `priority= digest=ALG:HEX url=` |
//! | `create-job B` | `priority=` |
//! | `start J` | |
//! | `success J`, `fail J` | `priority= msg=` |
//! | `move J STATE` | `priority= msg=` |
//! | `walk J STATE` | start and success moves until the job is in STATE (`given` only) |
//! | `space J BYTES` | `priority=` |
//! | `identifiers J` | `ark= local=a,b` |
//! | `store J` | `url= mode= delete=true` |
//! | `inventory J` | `url= mode=` |
//! | `step-retry J` | `attempt=N msg=` |
//! | `requeue J`, `hold-job J`, `release-job J`, `delete-job J` | `reason=` |
//! | `release-batch B`, `update-reporting B`, `delete-batch B` | `reason=` |
//! | `hold-collection P`, `release-collection P`, `release-held-jobs P` | `reason=` |
//! | `pause`, `resume` | `reason=` |
//! | `report B` | `error=` (the notification failed) |
//! | `record-repair` | `paths=/a,/b` |
//! | `cleanup` | `before=RFC3339` |

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use common::{check_rejection_message, render_record, render_rejection, submission, Harness};
use ingest_events::command::{Command, JobSpec, Target};
use ingest_events::event::{Digest, Identifiers, InventoryParams, PayloadType, StoreParams};
use ingest_events::lifecycle::{BatchState, JobState, StateKind};
use ingest_events::{Bid, Jid};
use serde::Deserialize;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Scenario {
    name: String,
    #[serde(default)]
    given: Vec<String>,
    when: String,
    #[serde(default)]
    then: Option<Vec<String>>,
    #[serde(default)]
    rejected: Option<String>,
    #[serde(default)]
    state: Vec<String>,
}

fn scenarios_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/scenarios")
}

/// Splits a line into words; `"…"` keeps spaces (also after `key=`).
fn words(line: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    let mut any = false;
    for c in line.chars() {
        match c {
            '"' => {
                quoted = !quoted;
                any = true;
            }
            c if c.is_whitespace() && !quoted => {
                if any {
                    out.push(std::mem::take(&mut cur));
                    any = false;
                }
            }
            c => {
                cur.push(c);
                any = true;
            }
        }
    }
    if quoted {
        return Err(format!("unbalanced quote in {line:?}"));
    }
    if any {
        out.push(cur);
    }
    Ok(out)
}

/// A parsed command line: verb, positional arguments, options.
struct Line {
    verb: String,
    args: Vec<String>,
    opts: BTreeMap<String, String>,
    text: String,
}

impl Line {
    fn parse(text: &str) -> Result<Line, String> {
        let mut words = words(text)?.into_iter();
        let verb = words.next().ok_or("empty command")?;
        let mut args = Vec::new();
        let mut opts = BTreeMap::new();
        for w in words {
            match w.split_once('=') {
                Some((k, v)) => {
                    opts.insert(k.to_string(), v.to_string());
                }
                None => args.push(w),
            }
        }
        Ok(Line {
            verb,
            args,
            opts,
            text: text.to_string(),
        })
    }

    fn arg(&self, i: usize, what: &str) -> Result<&str, String> {
        self.args
            .get(i)
            .map(String::as_str)
            .ok_or_else(|| format!("{:?}: missing {what}", self.text))
    }

    fn opt(&self, key: &str) -> Option<&str> {
        self.opts.get(key).map(String::as_str)
    }

    fn text_opt(&self, key: &str) -> String {
        self.opt(key).unwrap_or_default().to_string()
    }

    fn num<T: std::str::FromStr>(&self, key: &str) -> Result<Option<T>, String> {
        self.opt(key)
            .map(|v| {
                v.parse()
                    .map_err(|_| format!("{:?}: {key}={v} is not a number", self.text))
            })
            .transpose()
    }

    fn bid(&self, i: usize) -> Result<Bid, String> {
        parse_bid(self.arg(i, "batch id")?)
    }

    fn jid(&self, i: usize) -> Result<Jid, String> {
        parse_jid(self.arg(i, "job id")?)
    }

    fn reason(&self) -> String {
        self.text_opt("reason")
    }

    /// Rejects options the verb does not take, so a typo cannot pass silently.
    fn only(&self, keys: &[&str]) -> Result<(), String> {
        match self.opts.keys().find(|k| !keys.contains(&k.as_str())) {
            Some(k) => Err(format!("{:?}: unknown option {k}", self.text)),
            None => Ok(()),
        }
    }
}

fn parse_bid(s: &str) -> Result<Bid, String> {
    match s.strip_prefix('b').and_then(|n| n.parse::<u64>().ok()) {
        Some(n) => Ok(Bid(n)),
        None => s.parse().map_err(|e| format!("{e}")),
    }
}

fn parse_jid(s: &str) -> Result<Jid, String> {
    match s.strip_prefix('j').and_then(|n| n.parse::<u64>().ok()) {
        Some(n) => Ok(Jid(n)),
        None => s.parse().map_err(|e| format!("{e}")),
    }
}

fn parse_digest(s: &str) -> Result<Digest, String> {
    let (algorithm, value) = s
        .split_once(':')
        .ok_or_else(|| format!("digest {s:?} is not ALG:HEX"))?;
    Ok(Digest {
        algorithm: algorithm.into(),
        value: value.into(),
    })
}

fn job_state(s: &str) -> Result<JobState, String> {
    s.parse().map_err(|e| format!("{e}"))
}

/// Turns a command line into a [`Command`] (everything but `walk`).
fn command(h: &mut Harness, line: &Line) -> Result<Command, String> {
    let reason = line.reason();
    let cmd = match line.verb.as_str() {
        "submit" => {
            line.only(&[
                "profile",
                "uuid",
                "submitter",
                "url",
                "digest",
                "manifest",
                "extra",
            ])?;
            let mut s = submission(line.opt("profile").unwrap_or("demo"));
            if let Some(v) = line.opt("submitter") {
                s.submitter = v.into();
            }
            if let Some(v) = line.opt("url") {
                s.payload_url = v.into();
            }
            if let Some(v) = line.opt("digest") {
                s.digest = Some(parse_digest(v)?);
            }
            if let Some(v) = line.opt("manifest") {
                s.manifest = v.split('|').map(str::to_string).collect();
            }
            if let Some(v) = line.opt("extra") {
                let (k, v) = v
                    .split_once(':')
                    .ok_or_else(|| format!("extra={v} is not KEY:VALUE"))?;
                s.extra.insert(k.into(), v.into());
            }
            let uuid = match line.num::<u128>("uuid")? {
                Some(n) => uuid::Uuid::from_u128(n),
                None => h.next_uuid(),
            };
            Command::SubmitBatch {
                uuid,
                submission: s,
            }
        }
        "acquire" => {
            line.only(&["jobs", "priority", "digest", "url"])?;
            let bid = line.bid(0)?;
            let n = line.num::<usize>("jobs")?.unwrap_or(1);
            let digest = line.opt("digest").map(parse_digest).transpose()?;
            let priority = line.num("priority")?;
            let jobs = (1..=n)
                .map(|k| JobSpec {
                    payload_url: line
                        .opt("url")
                        .map_or_else(|| format!("https://example.org/obj{k}.zip"), str::to_string),
                    payload_type: PayloadType::File,
                    identifiers: Identifiers {
                        primary_id: None,
                        local_ids: vec![format!("loc{k}")],
                    },
                    metadata: Default::default(),
                    digest: digest.clone(),
                    priority,
                })
                .collect();
            Command::AcquireBatch { bid, jobs }
        }
        "create-job" => {
            line.only(&["priority"])?;
            Command::CreateJob {
                bid: line.bid(0)?,
                spec: JobSpec {
                    payload_url: "https://example.org/extra.zip".into(),
                    payload_type: PayloadType::File,
                    identifiers: Identifiers::default(),
                    metadata: Default::default(),
                    digest: None,
                    priority: line.num("priority")?,
                },
            }
        }
        "start" => Command::StartJob { jid: line.jid(0)? },
        "success" | "fail" | "move" => {
            line.only(&["priority", "msg"])?;
            let target = match line.verb.as_str() {
                "success" => Target::Success,
                "fail" => Target::Fail,
                _ => Target::To(job_state(line.arg(1, "target state")?)?),
            };
            Command::SetJobStatus {
                jid: line.jid(0)?,
                target,
                message: line.text_opt("msg"),
                priority: line.num("priority")?,
            }
        }
        "space" => {
            line.only(&["priority"])?;
            Command::RecordSpace {
                jid: line.jid(0)?,
                space_needed: line
                    .arg(1, "bytes")?
                    .parse()
                    .map_err(|_| format!("{:?}: bytes", line.text))?,
                priority: line.num("priority")?,
            }
        }
        "identifiers" => {
            line.only(&["ark", "local"])?;
            Command::RecordIdentifiers {
                jid: line.jid(0)?,
                identifiers: Identifiers {
                    primary_id: line.opt("ark").map(str::to_string),
                    local_ids: line
                        .opt("local")
                        .map(|l| l.split(',').map(str::to_string).collect())
                        .unwrap_or_default(),
                },
            }
        }
        "store" => {
            line.only(&["url", "mode", "delete"])?;
            Command::RecordStore {
                jid: line.jid(0)?,
                store: StoreParams {
                    manifest_url: line.text_opt("url"),
                    mode: line.opt("mode").unwrap_or("add").into(),
                    delete: line.opt("delete") == Some("true"),
                },
            }
        }
        "inventory" => {
            line.only(&["url", "mode"])?;
            Command::RecordInventory {
                jid: line.jid(0)?,
                inventory: InventoryParams {
                    manifest_url: line.text_opt("url"),
                    mode: line.opt("mode").unwrap_or("add").into(),
                },
            }
        }
        "step-retry" => {
            line.only(&["attempt", "msg"])?;
            Command::RecordStepRetry {
                jid: line.jid(0)?,
                attempt: line.num("attempt")?.unwrap_or(2),
                message: line.text_opt("msg"),
            }
        }
        "requeue" => Command::RequeueJob {
            jid: line.jid(0)?,
            reason,
        },
        "hold-job" => Command::HoldJob {
            jid: line.jid(0)?,
            reason,
        },
        "release-job" => Command::ReleaseJob {
            jid: line.jid(0)?,
            reason,
        },
        "delete-job" => Command::DeleteJob {
            jid: line.jid(0)?,
            reason,
        },
        "release-batch" => Command::ReleaseBatch {
            bid: line.bid(0)?,
            reason,
        },
        "update-reporting" => Command::UpdateReporting {
            bid: line.bid(0)?,
            reason,
        },
        "delete-batch" => Command::DeleteBatch {
            bid: line.bid(0)?,
            reason,
        },
        "hold-collection" => Command::HoldCollection {
            profile: line.args.first().cloned().unwrap_or_default(),
            reason,
        },
        "release-collection" => Command::ReleaseCollection {
            profile: line.args.first().cloned().unwrap_or_default(),
            reason,
        },
        "release-held-jobs" => Command::ReleaseHeldJobs {
            profile: line.args.first().cloned().unwrap_or_default(),
            reason,
        },
        "record-repair" => {
            line.only(&["paths"])?;
            Command::RecordRepair {
                paths: line
                    .opt("paths")
                    .map(|p| p.split(',').map(str::to_string).collect())
                    .unwrap_or_default(),
            }
        }
        "pause" => Command::PauseQueue { reason },
        "resume" => Command::ResumeQueue { reason },
        "report" => {
            line.only(&["error"])?;
            Command::ReportBatch {
                bid: line.bid(0)?,
                notification_error: line.opt("error").map(str::to_string),
            }
        }
        "cleanup" => {
            line.only(&["before"])?;
            Command::Cleanup {
                before: line
                    .opt("before")
                    .map(|t| {
                        chrono::DateTime::parse_from_rfc3339(t)
                            .map(|t| t.to_utc())
                            .map_err(|e| format!("before={t}: {e}"))
                    })
                    .transpose()?,
            }
        }
        "cleanup-batch" => Command::CleanupBatch { bid: line.bid(0)? },
        other => return Err(format!("unknown command {other:?}")),
    };
    if !matches!(
        line.verb.as_str(),
        "submit"
            | "acquire"
            | "create-job"
            | "success"
            | "fail"
            | "move"
            | "space"
            | "identifiers"
            | "store"
            | "inventory"
            | "step-retry"
            | "report"
            | "record-repair"
            | "cleanup"
    ) {
        line.only(&["reason"])?;
    }
    Ok(cmd)
}

/// More moves than lead from Pending to Completed.
const WALK_LIMIT: usize = 16;

/// Runs a `given` line; it must be accepted.
fn given(h: &mut Harness, text: &str) -> Result<(), String> {
    let line = Line::parse(text)?;
    if line.verb == "walk" {
        let jid = line.jid(0)?;
        let to = job_state(line.arg(1, "target state")?)?;
        for _ in 0..WALK_LIMIT {
            let job = h
                .state
                .jobs
                .get(&jid)
                .ok_or_else(|| format!("walk: no job {jid}"))?;
            if job.status == to {
                return Ok(());
            }
            let cmd = match job.status {
                JobState::Pending => Command::StartJob { jid },
                _ => Command::SetJobStatus {
                    jid,
                    target: Target::Success,
                    message: String::new(),
                    priority: None,
                },
            };
            h.execute(&cmd)
                .map_err(|r| format!("{text:?}: {cmd:?} was rejected: {r}"))?;
        }
        return Err(format!("{text:?}: {to} is not on the job's success path"));
    }
    let cmd = command(h, &line)?;
    h.execute(&cmd)
        .map(|_| ())
        .map_err(|r| format!("given {text:?} was rejected: {}", render_rejection(&r)))
}

fn ids(v: &[Jid]) -> String {
    v.iter()
        .map(|j| j.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

fn opt_state(s: Option<JobState>) -> String {
    s.map_or_else(|| "none".to_string(), |s| s.to_string())
}

/// The actual value of `key` of the item a `state` line names.
fn actual(h: &Harness, item: &str, key: &str) -> Result<String, String> {
    if item == "queue" {
        return Ok(match key {
            "paused" => h.state.paused.to_string(),
            "held" => h
                .state
                .held_collections
                .iter()
                .cloned()
                .collect::<Vec<_>>()
                .join(","),
            "batches" => h.state.batches.len().to_string(),
            "jobs" => h.state.jobs.len().to_string(),
            other => return Err(format!("unknown queue field {other}")),
        });
    }
    if item.starts_with('j') {
        let jid = parse_jid(item)?;
        let j = h
            .state
            .jobs
            .get(&jid)
            .ok_or_else(|| format!("no job {jid}"))?;
        return Ok(match key {
            "status" => j.status.to_string(),
            "lss" => opt_state(j.last_successful_status),
            "failed_in" => opt_state(j.failed_in),
            "retry" => j.retry_count.to_string(),
            "priority" => j.priority.to_string(),
            "space" => j.space_needed.to_string(),
            "step_retries" => j.step_retries.to_string(),
            "batch" => j.bid.to_string(),
            "message" => j.message.clone(),
            "cleaned" => j.cleaned_up.to_string(),
            "ark" => j.identifiers.primary_id.clone().unwrap_or_default(),
            "local" => j.identifiers.local_ids.join(","),
            "store" => j
                .store
                .as_ref()
                .map(|s| format!("{} {} delete={}", s.manifest_url, s.mode, s.delete))
                .unwrap_or_default(),
            "inventory" => j
                .inventory
                .as_ref()
                .map(|s| format!("{} {}", s.manifest_url, s.mode))
                .unwrap_or_default(),
            other => return Err(format!("unknown job field {other}")),
        });
    }
    let bid = parse_bid(item)?;
    let b = h
        .state
        .batches
        .get(&bid)
        .ok_or_else(|| format!("no batch {bid}"))?;
    Ok(match key {
        "status" => b.status.to_string(),
        "jobs" => ids(&b.jobs),
        "message" => b.message.clone(),
        "cleaned" => b.cleaned_up.to_string(),
        "report" => b
            .report
            .as_ref()
            .map(|r| {
                format!(
                    "{}ok:{} failed:{}",
                    if r.update { "update " } else { "" },
                    ids(&r.successful_jobs),
                    ids(&r.failed_jobs)
                )
            })
            .unwrap_or_else(|| "none".into()),
        other => return Err(format!("unknown batch field {other}")),
    })
}

/// Expected id lists may use the short forms (`j1,j2`).
fn normalize(key: &str, value: &str) -> Result<String, String> {
    if key == "jobs" && !value.is_empty() && !value.chars().all(|c| c.is_ascii_digit()) {
        let list: Result<Vec<Jid>, String> = value.split(',').map(parse_jid).collect();
        return Ok(ids(&list?));
    }
    if key == "report" && value != "none" {
        let mut out = String::new();
        for part in value.split(' ') {
            if !out.is_empty() {
                out.push(' ');
            }
            match part.split_once(':') {
                Some((k, v)) if !v.is_empty() => {
                    let list: Result<Vec<Jid>, String> = v.split(',').map(parse_jid).collect();
                    out.push_str(&format!("{k}:{}", ids(&list?)));
                }
                _ => out.push_str(part),
            }
        }
        return Ok(out);
    }
    Ok(value.to_string())
}

fn check_state(h: &Harness, text: &str) -> Result<(), String> {
    let line = Line::parse(text)?;
    let mut problems = Vec::new();
    for (key, want) in &line.opts {
        let got = actual(h, &line.verb, key)?;
        let want = normalize(key, want)?;
        if got != want {
            problems.push(format!(
                "{} {key}: expected {want:?}, got {got:?}",
                line.verb
            ));
        }
    }
    if line.opts.is_empty() {
        return Err(format!("state line {text:?} checks nothing"));
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("; "))
    }
}

fn run(s: &Scenario) -> Result<(), String> {
    let mut h = Harness::new();
    for g in &s.given {
        given(&mut h, g)?;
    }
    let line = Line::parse(&s.when)?;
    let cmd = command(&mut h, &line)?;
    let head = h.log.head();
    let outcome = h.execute(&cmd);
    match (&s.then, &s.rejected, outcome) {
        (Some(then), None, Ok(records)) => {
            let got: Vec<String> = records.iter().map(render_record).collect();
            if &got != then {
                return Err(format!(
                    "events differ\n  expected:\n    {}\n  got:\n    {}",
                    then.join("\n    "),
                    got.join("\n    ")
                ));
            }
            // Every event of one command is one atomic append: one correlation.
            if records
                .windows(2)
                .any(|w| w[0].envelope.correlation_id != w[1].envelope.correlation_id)
            {
                return Err("one command's events carry different correlation ids".into());
            }
        }
        (None, Some(want), Err(rejection)) => {
            let got = render_rejection(&rejection);
            if &got != want {
                return Err(format!(
                    "rejection differs\n  expected: {want}\n  got:      {got}\n  message:  {rejection}"
                ));
            }
            check_rejection_message(&rejection);
            if h.log.head() != head {
                return Err("a rejected command moved the log head".into());
            }
        }
        (Some(_), None, Err(rejection)) => {
            return Err(format!(
                "expected events, got a rejection: {}",
                render_rejection(&rejection)
            ))
        }
        (None, Some(want), Ok(records)) => {
            return Err(format!(
                "expected the rejection {want:?}, got events:\n    {}",
                records
                    .iter()
                    .map(render_record)
                    .collect::<Vec<_>>()
                    .join("\n    ")
            ))
        }
        _ => return Err("a scenario needs exactly one of `then` and `rejected`".into()),
    }
    for line in &s.state {
        check_state(&h, line)?;
    }
    // The state kept up to date command by command is the fold of the log.
    if h.fold_from_scratch() != h.state {
        return Err("the state folded from scratch differs from the one kept by apply".into());
    }
    Ok(())
}

/// Runs every scenario of one file and reports every failure at once.
fn run_file(file: &str) {
    let path = scenarios_dir().join(file);
    let text =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let scenarios: Vec<Scenario> =
        serde_norway::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(!scenarios.is_empty(), "{file} has no scenarios");
    let mut names = std::collections::BTreeSet::new();
    let mut failures = Vec::new();
    for s in &scenarios {
        assert!(
            names.insert(&s.name),
            "{file}: duplicate scenario name {:?}",
            s.name
        );
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(s)));
        match result {
            Ok(Ok(())) => {}
            Ok(Err(e)) => failures.push(format!("{file}: {}\n  {e}", s.name)),
            Err(panic) => {
                let msg = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                failures.push(format!("{file}: {}\n  panicked: {msg}", s.name));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} scenarios failed:\n\n{}",
        failures.len(),
        scenarios.len(),
        failures.join("\n\n")
    );
}

const FILES: [&str; 6] = [
    "batches.yml",
    "jobs.yml",
    "requeue.yml",
    "admin.yml",
    "validation.yml",
    "explicit-moves.yml",
];

#[test]
fn batches() {
    run_file("batches.yml");
}

#[test]
fn jobs() {
    run_file("jobs.yml");
}

#[test]
fn requeue() {
    run_file("requeue.yml");
}

#[test]
fn admin() {
    run_file("admin.yml");
}

#[test]
fn validation() {
    run_file("validation.yml");
}

/// Behaviour of `command.rs` that looks wrong (see the file); these fail
/// until it changes.
#[test]
fn explicit_moves() {
    run_file("explicit-moves.yml");
}

#[test]
fn every_scenario_file_is_run() {
    let dir = scenarios_dir();
    let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("read {}: {e}", dir.display()));
    for entry in entries {
        let name = entry
            .expect("a directory entry")
            .file_name()
            .to_string_lossy()
            .into_owned();
        assert!(
            FILES.contains(&name.as_str()),
            "tests/scenarios/{name} is not run: add it to FILES and give it a #[test] in decisions.rs"
        );
    }
}

/// Every job transition of the lifecycle is exercised by some scenario (as
/// the `when` of a scenario or on the way there), and every batch state is
/// reached.
#[test]
fn scenarios_cover_every_transition() {
    use std::collections::BTreeSet;
    let lc = ingest_events::Lifecycle::builtin();
    let mut job_moves: BTreeSet<(JobState, JobState)> = BTreeSet::new();
    let mut batch_states: BTreeSet<BatchState> = BTreeSet::new();
    for file in FILES {
        let path = scenarios_dir().join(file);
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
        let scenarios: Vec<Scenario> =
            serde_norway::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        for s in scenarios {
            let mut h = Harness::new();
            let mut lines: Vec<String> = s.given.clone();
            lines.push(s.when.clone());
            for (i, text) in lines.iter().enumerate() {
                let before = h.log.head().0;
                if i + 1 < lines.len() {
                    if given(&mut h, text).is_err() {
                        break;
                    }
                } else {
                    let Ok(line) = Line::parse(text) else { break };
                    let Ok(cmd) = command(&mut h, &line) else {
                        break;
                    };
                    let _ = h.execute(&cmd);
                }
                for r in h.log.read_range(before + 1, h.log.head().0) {
                    let r = r.expect("read a record");
                    match &r.event {
                        ingest_events::Event::JobStatusChanged(e) => {
                            job_moves.insert((e.from, e.to));
                        }
                        ingest_events::Event::JobDeleted(e) => {
                            job_moves.insert((e.from, JobState::Deleted));
                        }
                        _ => {}
                    }
                }
                for b in h.state.batches.values() {
                    batch_states.insert(b.status);
                }
            }
        }
    }
    let mut missing = Vec::new();
    for (from, rule) in lc.jobs.iter() {
        for to in &rule.targets {
            if !job_moves.contains(&(from, *to)) {
                missing.push(format!("job {from} -> {to}"));
            }
        }
    }
    for s in BatchState::ALL {
        if !batch_states.contains(s) {
            missing.push(format!("batch state {s}"));
        }
    }
    assert!(
        missing.is_empty(),
        "no scenario exercises: {}",
        missing.join(", ")
    );
}

/// Suspected bug (codec.rs / command.rs): a command whose event is larger
/// than the decoder's limit (`codec::MAX_RECORD_BYTES`) must be refused,
/// by `decide` or by the append. It was accepted, appended and acknowledged,
/// and then could not be read back: the log opened as needing repair, and the
/// repair truncates an accepted batch.
#[test]
fn an_oversize_submission_is_refused_or_readable() {
    use ingest_events::log::AppendRequest;

    let h = Harness::new();
    let mut s = submission("demo");
    // 17 lines of 1 MiB: over the 16 MiB a record may have.
    s.manifest = vec!["x".repeat(1 << 20); 17];
    let cmd = Command::SubmitBatch {
        uuid: uuid::Uuid::from_u128(1),
        submission: s,
    };
    let Ok(decision) = ingest_events::decide(&h.state, &h.lc, &cmd) else {
        return;
    };
    let appended = h.log.append(&AppendRequest {
        actor: ingest_events::Actor::depositor("alice"),
        correlation_id: uuid::Uuid::from_u128(2),
        timestamp: common::base_time(),
        expectations: decision.expectations,
        events: decision.events,
    });
    match appended {
        Ok(Ok(a)) => {
            for p in a.positions {
                if let Err(e) = h.log.read_one(p) {
                    panic!("an acknowledged record cannot be read back: {e}");
                }
            }
            assert_eq!(h.log.needs_repair(), None);
        }
        // Refused by the log: nothing may have been written.
        Ok(Err(_)) | Err(_) => assert_eq!(h.log.head().0, 0),
    }
}
