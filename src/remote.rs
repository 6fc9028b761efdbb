//! The CLI against a running server (`ingest --engine URL …`).
//!
//! sled lets one process open a data directory, and `ingest serve` holds it,
//! so while a server runs the CLI's commands go through its HTTP API: the
//! same words, the same output, the server's log. Admin actions use the
//! admin token (`INGEST_ADMIN_TOKEN` or `INGEST_ADMIN_TOKEN_FILE`); reading
//! and submitting fall back to the depositor token.
//!
//! Commands that act as a worker (`job JID success`, `batch BID acquire`, …)
//! are refused here: through a server, a worker's report is fenced on the
//! ZooKeeper lock it holds, which the CLI does not. `repair`, `project`,
//! `rebuild` and `diff --repair` need the data directory or the projector
//! role and say to stop the server first.

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::cli::{
    BatchAction, Cli, Cmd, CollectionAction, Format, JobAction, QueueAction, ShowWhat,
};
use crate::history::{self, HistoryRow};

/// The file `ingest serve` writes in its data directory while it runs, so
/// that a CLI that finds the directory locked can say where the server is.
pub const SERVER_FILE: &str = "serve.json";

/// What `ingest serve` records in [`SERVER_FILE`].
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct ServerFile {
    /// The server's process id.
    pub pid: u32,
    /// Its API's base URL.
    pub url: String,
}

/// Reads the server file of `data_dir`, if a server wrote one.
pub fn server_file(data_dir: &Path) -> Option<ServerFile> {
    let text = std::fs::read_to_string(data_dir.join(SERVER_FILE)).ok()?;
    serde_json::from_str(&text).ok()
}

/// The hint added to "the log is in use" errors.
pub fn locked_hint(data_dir: &Path) -> String {
    match server_file(data_dir) {
        Some(s) => format!(
            "`ingest serve` (pid {}) holds {}; run the command through it: `ingest --engine {} …` (or set INGEST_ENGINE={}), with INGEST_ADMIN_TOKEN set to its admin token",
            s.pid,
            data_dir.display(),
            s.url,
            s.url
        ),
        None => format!(
            "another process holds {}; if it is `ingest serve`, run the command through it with `ingest --engine URL …` (or INGEST_ENGINE=URL) and INGEST_ADMIN_TOKEN",
            data_dir.display()
        ),
    }
}

/// Which token a call needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Admin,
    /// Depositor routes (the admin token works there too).
    Reader,
}

struct Remote {
    base: String,
    http: reqwest::Client,
    runtime: tokio::runtime::Runtime,
}

/// What a call answered.
enum Answer {
    Ok(Value, String),
    /// A refusal (4xx): already printed.
    Refused,
}

impl Remote {
    fn new(base: &str) -> Result<Remote> {
        let url = reqwest::Url::parse(base).with_context(|| {
            format!("--engine {base:?} is not a URL (like http://127.0.0.1:7878)")
        })?;
        if !matches!(url.scheme(), "http" | "https") {
            bail!("--engine {base:?}: the URL must be http:// or https://");
        }
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(300))
            .connect_timeout(Duration::from_secs(10))
            .build()
            .context("cannot build the HTTP client")?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("cannot start a runtime")?;
        Ok(Remote {
            base: base.trim_end_matches('/').to_string(),
            http,
            runtime,
        })
    }

    fn token(role: Role) -> Result<String> {
        let from = |var: &str, file_var: &str| -> Result<Option<String>> {
            if let Some(v) = std::env::var(var).ok().filter(|v| !v.trim().is_empty()) {
                return Ok(Some(v.trim().to_string()));
            }
            match std::env::var(file_var).ok().filter(|v| !v.is_empty()) {
                Some(f) => std::fs::read_to_string(&f)
                    .map(|t| Some(t.trim().to_string()))
                    .with_context(|| format!("cannot read {file_var}={f}")),
                None => Ok(None),
            }
        };
        if let Some(t) = from("INGEST_ADMIN_TOKEN", "INGEST_ADMIN_TOKEN_FILE")? {
            return Ok(t);
        }
        if role == Role::Reader {
            if let Some(t) = from("INGEST_DEPOSITOR_TOKEN", "INGEST_DEPOSITOR_TOKEN_FILE")? {
                return Ok(t);
            }
            bail!("set INGEST_ADMIN_TOKEN (or INGEST_DEPOSITOR_TOKEN, or their _FILE forms) to talk to the server");
        }
        bail!("set INGEST_ADMIN_TOKEN or INGEST_ADMIN_TOKEN_FILE: this command is an admin action on the server");
    }

    fn call(&self, method: Method, path: &str, role: Role, body: Option<Value>) -> Result<Answer> {
        let token = Remote::token(role)?;
        let url = format!("{}{path}", self.base);
        let mut req = self.http.request(method.clone(), &url).bearer_auth(token);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let (status, text) = self
            .runtime
            .block_on(async {
                let resp = req.send().await?;
                let status = resp.status();
                let text = resp.text().await?;
                Ok::<_, reqwest::Error>((status, text))
            })
            .with_context(|| format!("cannot reach the server: {method} {url}"))?;
        let value: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        if status.is_success() {
            return Ok(Answer::Ok(value, text));
        }
        let code = value["error"]["code"].as_str().unwrap_or("");
        let message = value["error"]["message"].as_str().unwrap_or(text.trim());
        match status {
            StatusCode::UNAUTHORIZED => bail!(
                "the server at {} refused the token (401 {code}): set INGEST_ADMIN_TOKEN to its admin token",
                self.base
            ),
            s if s.is_client_error() => {
                eprintln!("refused: {message} ({s} {code})");
                Ok(Answer::Refused)
            }
            s => bail!("{method} {url}: {s} {code}: {message}"),
        }
    }
}

/// Runs `cli` against the server at `base`; returns the exit code.
///
/// # Errors
/// An unreachable server, a missing token, or a server error.
pub fn run(cli: Cli, base: &str) -> Result<i32> {
    let remote = Remote::new(base)?;
    let actor = cli.actor.clone();
    let admin_name = || -> Value {
        match &actor {
            Some(a) => json!(a.strip_prefix("admin:").unwrap_or(a)),
            None => json!(std::env::var("USER").unwrap_or_else(|_| "cli".into())),
        }
    };
    let act = |method: Method, path: String, reason: String| -> Result<i32> {
        let body = json!({"actor": admin_name(), "reason": reason});
        appended(remote.call(method, &path, Role::Admin, Some(body))?)
    };
    match cli.command {
        Cmd::Lifecycle { .. } | Cmd::Serve(_) | Cmd::Worker(_) | Cmd::Keys { .. } => Ok(0),
        Cmd::Inventory {
            ark,
            collection,
            local_id,
            format,
        } => {
            let path = match (ark, collection.zip(local_id)) {
                (Some(ark), _) => format!("/objects/{ark}"),
                (None, Some((c, l))) => {
                    let mut url =
                        reqwest::Url::parse("http://x/objects").context("building the query")?;
                    url.query_pairs_mut()
                        .append_pair("collection", &c)
                        .append_pair("local_id", &l);
                    format!("/objects?{}", url.query().unwrap_or_default())
                }
                (None, None) => bail!("give an ark, or --collection and --local-id"),
            };
            show(remote.call(Method::GET, &path, Role::Reader, None)?, format)
        }
        Cmd::Submit(args) => {
            let input = crate::cli::submission_input(*args)?;
            let body = serde_json::to_value(&input).context("encoding the submission")?;
            match remote.call(Method::POST, "/batches", Role::Reader, Some(body))? {
                Answer::Ok(v, _) => {
                    println!(
                        "submitted batch {} (uuid {}), {}",
                        v["bid"].as_str().unwrap_or("?"),
                        v["uuid"].as_str().unwrap_or("?"),
                        v["status"].as_str().unwrap_or("?")
                    );
                    Ok(0)
                }
                Answer::Refused => Ok(1),
            }
        }
        Cmd::Show { what, format } => {
            let path = match what {
                ShowWhat::Batch { bid } => format!("/batches/{bid}"),
                ShowWhat::Job { jid } => format!("/jobs/{jid}"),
            };
            show(remote.call(Method::GET, &path, Role::Reader, None)?, format)
        }
        Cmd::History { batch, job, format } => {
            let path = match (batch, job) {
                (Some(bid), _) => format!("/batches/{bid}/history"),
                (None, Some(jid)) => format!("/jobs/{jid}/history"),
                (None, None) => bail!("give --batch BID or --job JID"),
            };
            let Answer::Ok(v, _) = remote.call(Method::GET, &path, Role::Reader, None)? else {
                return Ok(1);
            };
            let rows: Vec<HistoryRow> = serde_json::from_value(v["events"].clone())
                .context("the server's history has an unexpected shape")?;
            match format {
                Format::Table => print!("{}", history::table(&rows)),
                Format::Json => println!("{}", serde_json::to_string_pretty(&rows)?),
                Format::Yaml => print!("{}", serde_norway::to_string(&rows)?),
            }
            Ok(0)
        }
        Cmd::Status { format } => show(remote.call(Method::GET, "/status", Role::Admin, None)?, format),
        Cmd::Verify => verify(remote.call(Method::GET, "/verify", Role::Admin, None)?),
        Cmd::Tree(args) => {
            if args.live {
                // The live tree comes from ZooKeeper, not from the log.
                return crate::zkcmd::tree_live(args);
            }
            let mut url = reqwest::Url::parse("http://x/tree").context("building the query")?;
            {
                let mut q = url.query_pairs_mut();
                if let Some(at) = &args.at {
                    q.append_pair("at", at);
                }
                if let Some(p) = &args.path {
                    q.append_pair("path", p);
                }
            }
            let path = match url.query() {
                Some(q) => format!("/tree?{q}"),
                None => "/tree".to_string(),
            };
            match remote.call(Method::GET, &path, Role::Admin, None)? {
                Answer::Ok(_, text) => {
                    if text.is_empty() {
                        if let Some(p) = &args.path {
                            eprintln!("no node at or under {p}");
                        }
                    }
                    print!("{text}");
                    Ok(0)
                }
                Answer::Refused => Ok(1),
            }
        }
        Cmd::Diff(args) => {
            if args.repair {
                bail!("`diff --repair` writes the live tree as the projector: stop the server (SIGTERM), run `ingest diff --repair` on its data directory, then start it again; `ingest --engine URL diff` only compares");
            }
            diff(remote.call(Method::GET, "/diff", Role::Admin, None)?)
        }
        Cmd::Repair { .. } => bail!("`repair` truncates the log and needs it to itself: stop the server (SIGTERM) first, then run `ingest repair` on its data directory"),
        Cmd::Project(_) => bail!("the server already projects the log into ZooKeeper; `ingest project` is for a data directory no server holds"),
        Cmd::Rebuild(_) => bail!("`rebuild` takes over the projector's role: stop the server (SIGTERM), run `ingest rebuild` on its data directory, then start it again"),
        Cmd::Cleanup { before } => {
            let mut body = json!({"actor": admin_name(), "reason": "ingest cleanup"});
            if let Some(b) = before {
                body["before"] = json!(b.to_rfc3339());
            }
            appended(remote.call(Method::POST, "/cleanup", Role::Admin, Some(body))?)
        }
        Cmd::Queue { action } => match action {
            QueueAction::Pause(r) => act(Method::POST, "/queue/pause".into(), r.reason),
            QueueAction::Resume(r) => act(Method::POST, "/queue/resume".into(), r.reason),
        },
        Cmd::Collection { profile, action } => {
            let (verb, r) = match action {
                CollectionAction::Hold(r) => ("hold", r),
                CollectionAction::Release(r) => ("release", r),
                CollectionAction::ReleaseJobs(r) => ("release-jobs", r),
            };
            act(Method::POST, format!("/collections/{profile}/{verb}"), r.reason)
        }
        Cmd::Batch { bid, action } => match action {
            BatchAction::Release(r) => act(Method::POST, format!("/batches/{bid}/release"), r.reason),
            BatchAction::UpdateReporting(r) => act(
                Method::POST,
                format!("/batches/{bid}/update-reporting"),
                r.reason,
            ),
            BatchAction::Delete(r) => act(Method::DELETE, format!("/batches/{bid}"), r.reason),
            BatchAction::Acquire | BatchAction::Report { .. } => bail!(worker_only("batch", &bid.to_string())),
        },
        Cmd::Job { jid, action } => match action {
            JobAction::Hold(r) => act(Method::POST, format!("/jobs/{jid}/hold"), r.reason),
            JobAction::Release(r) => act(Method::POST, format!("/jobs/{jid}/release"), r.reason),
            JobAction::Requeue(r) => act(Method::POST, format!("/jobs/{jid}/requeue"), r.reason),
            JobAction::Delete(r) => act(Method::DELETE, format!("/jobs/{jid}"), r.reason),
            JobAction::Move {
                state: ingest_events::JobState::Failed,
                args,
            } => {
                act(Method::POST, format!("/jobs/{jid}/fail"), args.message)
            }
            _ => bail!(worker_only("job", &jid.to_string())),
        },
    }
}

fn worker_only(noun: &str, id: &str) -> String {
    format!(
        "this `{noun} {id}` action is a worker's report: through a server, workers report on routes fenced by the ZooKeeper lock they hold (POST /jobs/JID/outcome, /batches/BID/acquire, …), which the CLI does not hold. Admins can force a failure (`job JID move failed --message …`), requeue, hold, release or delete; or stop the server and run the command on its data directory"
    )
}

fn appended(answer: Answer) -> Result<i32> {
    let Answer::Ok(v, _) = answer else {
        return Ok(1);
    };
    let rows: Vec<HistoryRow> = serde_json::from_value(v["events"].clone()).unwrap_or_default();
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
    Ok(0)
}

fn show(answer: Answer, format: Format) -> Result<i32> {
    let Answer::Ok(v, _) = answer else {
        return Ok(1);
    };
    match format {
        Format::Json => println!("{}", serde_json::to_string_pretty(&v)?),
        Format::Yaml | Format::Table => print!("{}", serde_norway::to_string(&v)?),
    }
    Ok(0)
}

fn verify(answer: Answer) -> Result<i32> {
    let Answer::Ok(v, _) = answer else {
        return Ok(1);
    };
    let problems = v["problems"].as_array().cloned().unwrap_or_default();
    for p in &problems {
        println!(
            "position {}: {}",
            p["position"],
            p["message"].as_str().unwrap_or_default()
        );
    }
    println!(
        "{} events checked, {} stream index entries checked, head position {}, head hash {}",
        v["events_checked"],
        v["index_entries_checked"],
        v["head_position"],
        v["head_hash"].as_str().unwrap_or_default()
    );
    if problems.is_empty() {
        println!("ok: the hash chain and the stream index verify");
        Ok(0)
    } else {
        println!("FAILED: {} problem(s)", problems.len());
        Ok(1)
    }
}

fn diff(answer: Answer) -> Result<i32> {
    let Answer::Ok(v, _) = answer else {
        return Ok(2);
    };
    match v["checkpoint"].as_str() {
        Some(cp) => println!(
            "comparing the live tree ({} nodes) with the log at its checkpoint, {cp}",
            v["live_nodes"]
        ),
        None => println!(
            "the tree has no checkpoint (never projected); comparing it with the base nodes"
        ),
    }
    let count = |k: &str| v[k].as_array().map_or(0, Vec::len);
    let (missing, unexpected, differing) =
        (count("missing"), count("unexpected"), count("differing"));
    if missing + unexpected + differing == 0 {
        println!("no differences: {} nodes match", v["expected_nodes"]);
        return Ok(0);
    }
    print!("{}", v["text"].as_str().unwrap_or_default());
    println!(
        "{} difference(s): {missing} missing, {unexpected} unexpected, {differing} differing",
        missing + unexpected + differing
    );
    Ok(1)
}
