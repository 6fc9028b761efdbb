//! The processes of a round: `ingest serve` and `ingest worker` children
//! (started, watched, killed), their CPU time and their logs.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use chrono::Utc;
use tokio::process::{Child, Command};

use crate::*;

/// The tokens of one run (at least 16 characters, distinct).
pub(crate) struct Tokens {
    pub(crate) admin: String,
    pub(crate) depositor: String,
    pub(crate) worker: String,
}

impl Tokens {
    pub(crate) fn new() -> Tokens {
        let salt = format!("{}-{}", std::process::id(), Utc::now().timestamp_micros());
        Tokens {
            admin: format!("load-admin-{salt}"),
            depositor: format!("load-depositor-{salt}"),
            worker: format!("load-worker-{salt}"),
        }
    }
}

/// A child process with its logs; killed (SIGKILL) when dropped.
pub(crate) struct Proc {
    pub(crate) name: String,
    pub(crate) child: Child,
    pub(crate) stdout: PathBuf,
    pub(crate) stderr: PathBuf,
}

impl Proc {
    pub(crate) fn spawn(name: &str, mut cmd: Command, dir: &Path, pids: &Path) -> Result<Proc> {
        let stdout = dir.join(format!("{name}.out"));
        let stderr = dir.join(format!("{name}.log"));
        let out = std::fs::File::create(&stdout)
            .with_context(|| format!("cannot create {}", stdout.display()))?;
        let err = std::fs::File::create(&stderr)
            .with_context(|| format!("cannot create {}", stderr.display()))?;
        cmd.stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .kill_on_drop(true);
        let child = cmd.spawn().with_context(|| {
            format!(
                "cannot start {name} ({})",
                Path::new(cmd.as_std().get_program()).display()
            )
        })?;
        if let Some(pid) = child.id() {
            let mut f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(pids)
                .with_context(|| format!("cannot open {}", pids.display()))?;
            writeln!(f, "{pid}").with_context(|| format!("cannot write {}", pids.display()))?;
        }
        Ok(Proc {
            name: name.to_string(),
            child,
            stdout,
            stderr,
        })
    }

    /// The last lines of its stderr log (and stdout), for error messages.
    pub(crate) fn tail(&self) -> String {
        let mut s = String::new();
        for path in [&self.stderr, &self.stdout] {
            let text = strip_ansi(&std::fs::read_to_string(path).unwrap_or_default());
            let lines: Vec<&str> = text.lines().collect();
            if lines.is_empty() {
                continue;
            }
            let _ = writeln!(s, "---- last lines of {} ----", path.display());
            for l in &lines[lines.len().saturating_sub(TAIL_LINES)..] {
                let _ = writeln!(s, "{l}");
            }
        }
        if s.is_empty() {
            s = format!("({} wrote nothing)\n", self.name);
        }
        s
    }

    /// An error when the process has exited.
    pub(crate) fn check_alive(&mut self) -> Result<()> {
        match self.child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => bail!("{} exited ({status})\n{}", self.name, self.tail()),
            Err(e) => bail!("cannot check on {}: {e}", self.name),
        }
    }

    /// Waits until its stdout has a line starting with `prefix`; gives the line.
    pub(crate) async fn await_line(&mut self, prefix: &str, within: Duration) -> Result<String> {
        let deadline = Instant::now() + within;
        loop {
            let text = std::fs::read_to_string(&self.stdout).unwrap_or_default();
            if let Some(line) = text.lines().find(|l| l.starts_with(prefix)) {
                return Ok(line.to_string());
            }
            self.check_alive()
                .with_context(|| format!("{} did not start", self.name))?;
            if Instant::now() > deadline {
                bail!(
                    "{} did not print {prefix:?} within {within:?}\n{}",
                    self.name,
                    self.tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Sends SIGTERM (a graceful stop) unless it has exited.
    pub(crate) fn terminate(&mut self) {
        if let Ok(Some(_)) = self.child.try_wait() {
            return;
        }
        if let Some(pid) = self.child.id() {
            let _ = std::process::Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .stderr(Stdio::null())
                .status();
        }
    }

    /// Waits for it to exit, then SIGKILL after `grace`.
    pub(crate) async fn reap(&mut self, grace: Duration) {
        if tokio::time::timeout(grace, self.child.wait())
            .await
            .is_err()
        {
            eprintln!("{} did not stop within {grace:?}; killing it", self.name);
            let _ = self.child.kill().await;
        }
    }
}

/// The `ingest` binary (checked) and the work directory (created).
pub(crate) fn binary_and_work_dir(args: &Args) -> Result<(PathBuf, PathBuf)> {
    let ingest = match &args.ingest {
        Some(p) => p.clone(),
        None => std::env::current_exe()
            .context("cannot find this program's path")?
            .with_file_name("ingest"),
    };
    if !ingest.is_file() {
        bail!(
            "the ingest binary {} does not exist (build it: cargo build --release --bin ingest, or give --ingest PATH)",
            ingest.display()
        );
    }
    let work = match &args.work_dir {
        Some(d) => d.clone(),
        None => std::env::temp_dir().join(format!("ingest-load-{}", std::process::id())),
    };
    std::fs::create_dir_all(&work)
        .with_context(|| format!("cannot create the work directory {}", work.display()))?;
    Ok((ingest, work))
}

/// The children of one round; all are killed when this is dropped.
pub(crate) struct RoundProcs {
    pub(crate) server: Proc,
    pub(crate) workers: Vec<Proc>,
}

/// ZooKeeper's `zk_packets_received` (the 4-letter word `mntr`), `None`
/// when the server does not answer it.
pub(crate) async fn zk_packets_received(hosts: &str) -> Option<u64> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let host = hosts.split(',').next()?;
    let ask = async {
        let mut stream = tokio::net::TcpStream::connect(host).await.ok()?;
        stream.write_all(b"mntr").await.ok()?;
        let mut text = String::new();
        stream.read_to_string(&mut text).await.ok()?;
        Some(text)
    };
    let text = tokio::time::timeout(Duration::from_secs(5), ask)
        .await
        .ok()??;
    text.lines().find_map(|l| {
        let (k, v) = l.split_once('\t')?;
        (k == "zk_packets_received").then(|| v.trim().parse().ok())?
    })
}

/// CPU seconds used so far.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Cpu {
    pub(crate) serve: f64,
    pub(crate) workers: f64,
    pub(crate) zookeeper: Option<f64>,
}

/// The user + system CPU seconds of a process, from `/proc/PID/stat`
/// (clock ticks of 1/100 s, Linux's USER_HZ on every common platform).
pub(crate) fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the command name, which is in parentheses.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of stat(5); `rest` starts at field 3.
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / 100.0)
}

impl RoundProcs {
    pub(crate) fn cpu(&self, zk_pid: Option<u32>) -> Cpu {
        let of = |p: &Proc| p.child.id().and_then(cpu_seconds).unwrap_or(0.0);
        Cpu {
            serve: of(&self.server),
            workers: self.workers.iter().map(of).sum(),
            zookeeper: zk_pid.and_then(cpu_seconds),
        }
    }

    pub(crate) fn check_alive(&mut self) -> Result<()> {
        self.server.check_alive()?;
        for w in &mut self.workers {
            w.check_alive()?;
        }
        Ok(())
    }

    pub(crate) async fn stop(&mut self) {
        // Workers first (they release their locks through the server), all at once.
        for w in &mut self.workers {
            w.terminate();
        }
        for w in &mut self.workers {
            w.reap(Duration::from_secs(25)).await;
        }
        self.server.terminate();
        self.server.reap(Duration::from_secs(20)).await;
    }
}

/// Starts `ingest serve` with its data in `dir/data`: the engine, the
/// projector and the API, no in-process daemons. Gives it and its base URL.
pub(crate) async fn start_server(
    args: &Args,
    ingest: &Path,
    dir: &Path,
    pids: &Path,
    root: &str,
    tokens: &Tokens,
) -> Result<(Proc, String)> {
    let mut cmd = Command::new(ingest);
    cmd.arg("--data-dir").arg(dir.join("data")).args([
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--zk",
        &args.zk,
        "--zk-root",
        root,
        // The real rounds' file server listens on 127.0.0.1, which the
        // outbound policy refuses unless allowed.
        "--allow-network",
        "127.0.0.0/8",
    ]);
    clean_env(&mut cmd, tokens);
    let mut server = Proc::spawn("serve", cmd, dir, pids)?;
    let line = server
        .await_line("ingest serve listening on ", Duration::from_secs(60))
        .await?;
    let base = line
        .trim()
        .trim_start_matches("ingest serve listening on ")
        .to_string();
    Ok((server, base))
}

pub(crate) fn clean_env(cmd: &mut Command, tokens: &Tokens) {
    for var in [
        "INGEST_WORKER_STEPS",
        "INGEST_CONFIG",
        "INGEST_DAEMONS",
        "INGEST_DATA_DIR",
        "INGEST_PROFILES_DIR",
        "INGEST_LISTEN",
        "INGEST_ZK",
        "INGEST_ZK_ROOT",
        "INGEST_ENGINE",
        "INGEST_WORKER_DAEMONS",
        "INGEST_ADMIN_TOKEN_FILE",
        "INGEST_DEPOSITOR_TOKEN_FILE",
        "INGEST_WORKER_TOKEN_FILE",
        "INGEST_METRICS_TOKEN_FILE",
        "INGEST_METRICS_TOKEN",
        "INGEST_PROVISIONING_THRESHOLD",
        "INGEST_WORKING_STORAGE",
        // The real steps' options (real mode sets its own).
        "INGEST_FILE_ROOT",
        "INGEST_STORAGE_TARGETS",
        "INGEST_SIGNING_KEY",
        "INGEST_OUTBOX",
        "INGEST_SMTP_URL",
        "INGEST_STEP_RETRIES",
        "INGEST_RETRY_BACKOFF_MS",
        "INGEST_MAX_OBJECT_BYTES",
        "INGEST_MAX_OBJECT_FILES",
        "INGEST_TRANSFERS_PER_JOB",
        "INGEST_TRANSFERS",
    ] {
        cmd.env_remove(var);
    }
    cmd.env("INGEST_ADMIN_TOKEN", &tokens.admin)
        .env("INGEST_DEPOSITOR_TOKEN", &tokens.depositor)
        .env("INGEST_WORKER_TOKEN", &tokens.worker);
}

/// The last few WARN and ERROR lines of each process, for error messages.
pub(crate) fn last_warnings(procs: &RoundProcs) -> String {
    let mut s = String::new();
    for p in std::iter::once(&procs.server).chain(&procs.workers) {
        let text = strip_ansi(&std::fs::read_to_string(&p.stderr).unwrap_or_default());
        let lines: Vec<&str> = text
            .lines()
            .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
            .collect();
        if lines.is_empty() {
            continue;
        }
        let _ = writeln!(
            s,
            "last warnings of {} ({} in all, log {}):",
            p.name,
            lines.len(),
            p.stderr.display()
        );
        for l in &lines[lines.len().saturating_sub(3)..] {
            let _ = writeln!(s, "  {}", truncate(l, 300));
        }
    }
    s
}

/// What the logs of a round's processes hold.
pub(crate) struct LogScan {
    /// Worker reports the API refused.
    pub(crate) refused: usize,
    pub(crate) warn: usize,
    pub(crate) error: usize,
    /// A few distinct WARN/ERROR messages.
    pub(crate) samples: Vec<String>,
}

/// Counts refused reports and WARN/ERROR lines in the logs of `procs`.
pub(crate) fn scan(procs: &RoundProcs) -> LogScan {
    let mut out = LogScan {
        refused: 0,
        warn: 0,
        error: 0,
        samples: Vec::new(),
    };
    let mut samples: BTreeMap<String, String> = BTreeMap::new();
    for p in std::iter::once(&procs.server).chain(&procs.workers) {
        let text = strip_ansi(&std::fs::read_to_string(&p.stderr).unwrap_or_default());
        for line in text.lines() {
            let warn = line.contains(" WARN ");
            let error = line.contains(" ERROR ");
            if line.contains("was refused") {
                out.refused += 1;
            }
            if warn {
                out.warn += 1;
            }
            if error {
                out.error += 1;
            }
            if (warn || error) && samples.len() < 5 {
                // One sample per message, without the timestamp.
                let msg = line
                    .split_once(if warn { " WARN " } else { " ERROR " })
                    .map_or(line, |(_, m)| m)
                    .trim()
                    .to_string();
                let key: String = msg.chars().take(60).collect();
                samples
                    .entry(key)
                    .or_insert_with(|| format!("{}: {}", p.name, truncate(&msg, 200)));
            }
        }
    }
    out.samples = samples.into_values().collect();
    out
}

/// Removes terminal colour sequences (`ESC [ ... m`), which the human log
/// format writes even to a file.
pub(crate) fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' && chars.peek() == Some(&'[') {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

pub(crate) fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        s.chars().take(n).collect::<String>() + "…"
    }
}

/// The CPU seconds of this process's reaped children (cutime + cstime).
pub(crate) fn children_cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return 0.0;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // cutime and cstime are fields 16 and 17 of stat(5); `rest` starts at field 3.
    let field = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok());
    field(13).unwrap_or(0.0) / 100.0 + field(14).unwrap_or(0.0) / 100.0
}
