//! Copies of a big log (issue 22): `ingest backup` of a running engine, a
//! restore, and the bootstrap of a new replica from a peer, against a plain
//! copy of the same log directory on the same disk in the same run.
//!
//! ```sh
//! INGEST_BENCH_REPL_EVENTS=1000000 INGEST_BENCH_REPL_DIR=/var/tmp/repl-1m cargo bench --bench replication
//! ```
//!
//! It builds (or reuses, with `INGEST_BENCH_REPL_DIR`) a data directory of
//! about `INGEST_BENCH_REPL_EVENTS` events (default 1,000,000), then:
//! - the baseline: `cp -r` of its log directory;
//! - `ingest --engine URL backup` through a running `ingest serve` on it;
//! - `ingest restore` of that backup into a new data directory (verified);
//! - bootstrap: a standalone ZooKeeper, `ingest serve --replicas 2` on the
//!   data directory (it leads), then a second, empty engine, timed from its
//!   start until it follows at the leader's head (it copies every record
//!   from the leader over HTTP, checking each against its chain).
//!
//! Every process it starts is stopped at the end.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use support::log_builder;
use support::zk_server::Server;

const JOBS_PER_BATCH: u64 = 20;
const ADMIN: &str = "bench-admin-token-0123456789";

fn ingest_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_ingest"))
}

/// A running `ingest serve`, killed when dropped.
struct Serve {
    child: Child,
    base: String,
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serve(data: &Path, extra: &[&str], log: &Path) -> Serve {
    let mut child = Command::new(ingest_bin())
        .arg("--data-dir")
        .arg(data)
        .args(["serve", "--listen", "127.0.0.1:0", "--working-storage"])
        .arg(data.with_extension("work"))
        .args(extra)
        .env("INGEST_ADMIN_TOKEN", ADMIN)
        .env("INGEST_DEPOSITOR_TOKEN", "bench-depositor-token-0123456789")
        .env("INGEST_WORKER_TOKEN", "bench-worker-token-0123456789")
        .env_remove("INGEST_CONFIG")
        .env_remove("INGEST_WORKER_STEPS")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(log).expect("log"))
        .spawn()
        .expect("start ingest serve");
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().expect("stdout")),
        &mut line,
    )
    .expect("the listening line");
    let base = line
        .trim()
        .strip_prefix("ingest serve listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_string();
    Serve { child, base }
}

fn replication(base: &str) -> Option<serde_json::Value> {
    let out = Command::new("curl")
        .args(["-s", "-H", &format!("Authorization: Bearer {ADMIN}")])
        .arg(format!("{base}/replication"))
        .output()
        .ok()?;
    serde_json::from_slice(&out.stdout).ok()
}

fn wait_for(what: &str, within: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !f() {
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn timed(f: impl FnOnce()) -> Duration {
    let t = Instant::now();
    f();
    t.elapsed()
}

fn run_ok(cmd: &mut Command) {
    let out = cmd.output().expect("run");
    assert!(
        out.status.success(),
        "{cmd:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let events: u64 = std::env::var("INGEST_BENCH_REPL_EVENTS")
        .ok()
        .map(|v| v.parse().expect("INGEST_BENCH_REPL_EVENTS"))
        .unwrap_or(1_000_000);
    let (data, _keep): (PathBuf, Option<tempfile::TempDir>) =
        match std::env::var_os("INGEST_BENCH_REPL_DIR") {
            Some(d) => (PathBuf::from(d), None),
            None => {
                let t = tempfile::tempdir().expect("temp dir");
                (t.path().join("data"), Some(t))
            }
        };
    log_builder::data_dir(&data, events, JOBS_PER_BATCH);
    let scratch =
        tempfile::tempdir_in(data.parent().unwrap_or(Path::new("/tmp"))).expect("scratch");
    let s = scratch.path();
    let log_dir = ingest_engine::engine::log_dir(&data);
    let head = {
        let log = ingest_events::log::Log::open(&log_dir, &Default::default()).expect("open");
        log.durable_position()
    };
    println!("log of {head} events in {}", data.display());

    // Baseline: the same bytes copied on the same disk.
    let copy = timed(|| {
        run_ok(
            Command::new("cp")
                .arg("-r")
                .arg(&log_dir)
                .arg(s.join("copy")),
        )
    });

    // Backup through a running engine.
    let backup_file = s.join("log.backup");
    let backup = {
        let server = serve(&data, &[], &s.join("serve.log"));
        timed(|| {
            run_ok(
                Command::new(ingest_bin())
                    .args(["--engine", &server.base, "backup", "--out"])
                    .arg(&backup_file)
                    .env("INGEST_ADMIN_TOKEN", ADMIN),
            )
        })
    };
    let restore = timed(|| {
        run_ok(
            Command::new(ingest_bin())
                .arg("--data-dir")
                .arg(s.join("restored"))
                .args(["restore", "--from"])
                .arg(&backup_file),
        )
    });

    // Bootstrap of a new replica from a peer.
    // The leader projects its 1M events meanwhile (about a million nodes):
    // 512 MiB of heap was not enough for them.
    let zk = Server::start("-Xms64m -Xmx3g -XX:+UseSerialGC");
    let hosts = format!("127.0.0.1:{}", zk.port);
    let root = format!("/bench-repl-{}", std::process::id());
    let group = |id: &str| -> Vec<String> {
        [
            "--zk",
            &hosts,
            "--zk-root",
            &root,
            "--replicas",
            "2",
            "--engine-id",
            id,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };
    let a_args = group("a");
    let a = serve(
        &data,
        &a_args.iter().map(String::as_str).collect::<Vec<_>>(),
        &s.join("a.log"),
    );
    wait_for("the full engine leads", Duration::from_secs(300), || {
        replication(&a.base).is_some_and(|r| r["role"] == "leader")
    });
    let b_args = group("b");
    let started = Instant::now();
    let b = serve(
        &s.join("b"),
        &b_args.iter().map(String::as_str).collect::<Vec<_>>(),
        &s.join("b.log"),
    );
    wait_for(
        "the new replica follows at the head",
        Duration::from_secs(900),
        || {
            replication(&b.base)
                .is_some_and(|r| r["role"] == "follower" && r["applied"].as_u64() == Some(head))
        },
    );
    let bootstrap = started.elapsed();
    drop(b);
    drop(a);
    drop(zk);

    let secs = |d: Duration| d.as_secs_f64();
    println!();
    println!("| events | cp -r of the log s | backup through serve s | backup / cp | restore (verified) s | bootstrap of a replica s | bootstrap events/s |");
    println!("|---|---|---|---|---|---|---|");
    println!(
        "| {head} | {:.1} | {:.1} | {:.2} | {:.1} | {:.1} | {:.0} |",
        secs(copy),
        secs(backup),
        secs(backup) / secs(copy),
        secs(restore),
        secs(bootstrap),
        head as f64 / secs(bootstrap)
    );
}
