//! A real ZooKeeper for the integration tests, run with `tools/zk` on a free
//! loopback port in a temporary directory.
//!
//! [`shared`] starts one server per test process (a `OnceLock`); every test
//! works under its own root ([`unique_root`]), so tests run in parallel on
//! it. [`ZkServer::dedicated`] starts a server of its own, for a test that
//! stops and restarts it.
//!
//! The server must never outlive the test run, however the run ends.
//! `tools/zk start` daemonizes the server, so it is not our child and does
//! not die with us. Each server therefore gets a **watchdog**: a small shell
//! process in its own process group (so a Ctrl-C in the terminal does not
//! reach it first) that reads its stdin, a pipe whose only writer is this
//! test process (std opens pipes close-on-exec, so no other child inherits
//! it). When the test process exits, normally, on a panic, or killed with
//! SIGKILL, the kernel closes the pipe, the watchdog's `cat` sees end of file
//! and runs `tools/zk stop --dir DIR`, then removes the directory. No polling
//! and no pid files.
//!
//! Under cargo test, a whole test binary is one process: the shared server
//! lives until the process exits and the watchdog stops it. Under nextest,
//! every test is a process of its own: the shared server is held through an
//! `Arc` only by the test, and dropping it at the end of the test stops the
//! server synchronously (the watchdog remains the safety net).

use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

/// One local ZooKeeper server.
pub struct ZkServer {
    /// The loopback port.
    pub port: u16,
    /// Its directory (configuration, data, logs).
    pub dir: PathBuf,
    watchdog: Mutex<Option<(Child, ChildStdin)>>,
}

/// `tools/zk`: from `INGEST_ZK_TOOL` (set by `tools/test`) or the repository.
pub fn zk_tool() -> PathBuf {
    std::env::var_os("INGEST_ZK_TOOL")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/zk"))
}

pub fn run_tool(args: &[&str]) -> Result<String, String> {
    // Run from the temporary directory: a JVM heap dump of a server lands
    // there, not in the repository.
    let out = Command::new(zk_tool())
        .args(args)
        .current_dir(std::env::temp_dir())
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {}: {e}", zk_tool().display()))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "tools/zk {} failed ({}):\n{}{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

static SERVERS: AtomicU64 = AtomicU64::new(0);

impl ZkServer {
    /// Starts a server of its own (stopped when dropped, or by its watchdog
    /// when the process ends).
    pub fn dedicated() -> ZkServer {
        let n = SERVERS.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("ingest-zk-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let dir_text = dir.to_string_lossy().into_owned();
        let mut failures = Vec::new();
        for _ in 0..3 {
            let port: u16 = match run_tool(&["free-port"]).map(|s| s.trim().parse()) {
                Ok(Ok(p)) => p,
                Ok(Err(e)) => panic!("tools/zk free-port printed no port: {e}"),
                Err(e) => panic!("{e}"),
            };
            // The watchdog first, so even a start that hangs is cleaned up.
            let watchdog = spawn_watchdog(&dir);
            let server = ZkServer {
                port,
                dir: dir.clone(),
                watchdog: Mutex::new(watchdog),
            };
            match run_tool(&[
                "start",
                "--port",
                &port.to_string(),
                "--dir",
                &dir_text,
                "--timeout",
                "90",
            ]) {
                Ok(_) => return server,
                // Another process may have taken the port meanwhile.
                Err(e) => failures.push(e),
            }
        }
        panic!(
            "cannot start a ZooKeeper for the tests:\n{}",
            failures.join("\n")
        );
    }

    /// `127.0.0.1:PORT`.
    pub fn hosts(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Stops the server (its data stays for [`ZkServer::start`]).
    pub fn stop(&self) {
        if let Err(e) = run_tool(&["stop", "--dir", &self.dir.to_string_lossy()]) {
            panic!("{e}");
        }
    }

    /// Starts the stopped server again on the same port and data.
    pub fn start(&self) {
        if let Err(e) = run_tool(&[
            "start",
            "--port",
            &self.port.to_string(),
            "--dir",
            &self.dir.to_string_lossy(),
            "--timeout",
            "90",
        ]) {
            panic!("{e}");
        }
    }
}

impl Drop for ZkServer {
    fn drop(&mut self) {
        let _ = run_tool(&["stop", "--dir", &self.dir.to_string_lossy()]);
        let _ = std::fs::remove_dir_all(&self.dir);
        // Closing the pipe lets the watchdog go (its stop finds nothing).
        if let Ok(mut w) = self.watchdog.lock() {
            if let Some((mut child, stdin)) = w.take() {
                drop(stdin);
                let _ = child.wait();
            }
        }
    }
}

/// A process that stops the server of `dir` once our end of its stdin
/// closes (see the module docs). `None` when it cannot be started.
fn spawn_watchdog(dir: &Path) -> Option<(Child, ChildStdin)> {
    spawn_watchdog_for(dir, "stop")
}

/// As [`spawn_watchdog`], stopping with `tools/zk STOP --dir DIR` (`stop`
/// for one server, `ensemble stop` for an ensemble).
pub fn spawn_watchdog_for(dir: &Path, stop: &str) -> Option<(Child, ChildStdin)> {
    let script =
        r#"trap '' INT TERM HUP; cat >/dev/null; "$0" $2 --dir "$1" >/dev/null 2>&1; rm -rf "$1""#;
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(script)
        .arg(zk_tool())
        .arg(dir)
        .arg(stop)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .ok()?;
    let mut stdin = child.stdin.take()?;
    // Nothing is ever written; the pipe only carries our liveness.
    let _ = stdin.flush();
    Some((child, stdin))
}

/// The shared server: kept alive (cargo test) or only referenced (nextest).
type Slot = (Option<Arc<ZkServer>>, Weak<ZkServer>);

/// The server shared by the tests of this process, started on first use.
pub fn shared() -> Arc<ZkServer> {
    static SHARED: OnceLock<Mutex<Slot>> = OnceLock::new();
    let slot = SHARED.get_or_init(|| Mutex::new((None, Weak::new())));
    let mut slot = slot.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(s) = slot.1.upgrade() {
        return s;
    }
    let server = Arc::new(ZkServer::dedicated());
    // Under nextest (one test per process) the test's Arc is the only strong
    // one, so the server stops when the test ends; under cargo test the
    // static keeps it for the other tests of the process.
    if std::env::var_os("NEXTEST_RUN_ID").is_none() {
        slot.0 = Some(Arc::clone(&server));
    }
    slot.1 = Arc::downgrade(&server);
    server
}

/// A root no other test uses: `/ingest-test-NAME-PID-N`.
pub fn unique_root(name: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "/ingest-test-{name}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}
