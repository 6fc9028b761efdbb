//! A ZooKeeper server for a bench, started with `tools/zk`.

use std::path::{Path, PathBuf};
use std::process::{Command as Process, Stdio};

/// A ZooKeeper started for the bench, stopped when dropped, or by its
/// watchdog if the bench dies: a shell in its own process group waiting for
/// the end of a pipe only this process writes to (see
/// `tests/integration/zk_server.rs`).
pub struct Server {
    /// The server's directory (data, log, pid).
    pub dir: PathBuf,
    /// The client port on 127.0.0.1.
    pub port: u16,
    _watchdog: Option<std::process::ChildStdin>,
}

fn zk_tool() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/zk")
}

impl Server {
    /// Starts a standalone server on a free port with the JVM flags
    /// `INGEST_ZK_JVMFLAGS` names, or `default_jvm` (a bench sizes the heap
    /// for its tree: tools/zk's default heap is sized for tests).
    pub fn start(default_jvm: &str) -> Server {
        let port: u16 = String::from_utf8_lossy(
            &Process::new(zk_tool())
                .arg("free-port")
                .output()
                .expect("tools/zk free-port")
                .stdout,
        )
        .trim()
        .parse()
        .expect("a free port");
        let dir =
            std::env::temp_dir().join(format!("ingest-bench-zk-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("server dir");
        // Run from the server's directory: a JVM heap dump lands there.
        let jvm = std::env::var("INGEST_ZK_JVMFLAGS").unwrap_or_else(|_| default_jvm.into());
        let status = Process::new(zk_tool())
            .env("INGEST_ZK_JVMFLAGS", jvm)
            .args(["start", "--port", &port.to_string(), "--dir"])
            .arg(&dir)
            .current_dir(&dir)
            .stdin(Stdio::null())
            .status()
            .expect("tools/zk start");
        assert!(status.success(), "tools/zk start failed");
        let watchdog = {
            use std::os::unix::process::CommandExt;
            Process::new("sh")
                .arg("-c")
                .arg(r#"trap '' INT TERM HUP; cat >/dev/null; "$0" stop --dir "$1" >/dev/null 2>&1; rm -rf "$1""#)
                .arg(zk_tool())
                .arg(&dir)
                .stdin(Stdio::piped())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .process_group(0)
                .spawn()
                .ok()
                .and_then(|mut c| c.stdin.take())
        };
        Server {
            dir,
            port,
            _watchdog: watchdog,
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = Process::new(zk_tool())
            .args(["stop", "--dir"])
            .arg(&self.dir)
            .stdin(Stdio::null())
            .status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Packets the server at `127.0.0.1:port` has received since it started
/// (`zk_packets_received` of the `mntr` four-letter word): every request,
/// a `multi` counting once, plus the sessions' pings.
pub fn packets_received(port: u16) -> u64 {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect for mntr");
    s.write_all(b"mntr").expect("send mntr");
    let mut out = String::new();
    s.read_to_string(&mut out).expect("read mntr");
    out.lines()
        .find_map(|l| l.strip_prefix("zk_packets_received"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no zk_packets_received in mntr's answer: {out:?}"))
}
