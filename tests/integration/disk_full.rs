//! Issue 25, finding 7: a writer stopped by a full disk recovers by itself
//! once space is freed. A real `ingest serve` on a small tmpfs: a filler
//! file takes the space, submissions go on until the writer stops (503),
//! the filler is removed, and the server starts itself anew (the same
//! process, re-executed), reopening the log at its durable head: every
//! acknowledged submission is there, the log verifies, and new
//! submissions are taken.

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::server::{ADMIN, DEPOSITOR, WORKER};
use crate::util::ingest_bin;

/// A tmpfs of `size`, unmounted on drop.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: &Path, size: &str) -> Option<Tmpfs> {
        std::fs::create_dir_all(at).expect("mount point");
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(at)
            .output();
        match out {
            Ok(o) if o.status.success() => Some(Tmpfs(at.to_path_buf())),
            other => {
                let why = match other {
                    Ok(o) => String::from_utf8_lossy(&o.stderr).into_owned(),
                    Err(e) => e.to_string(),
                };
                crate::util::untested(&format!(
                    "cannot mount a tmpfs (root and mount(8) are needed): {why}"
                ));
                None
            }
        }
    }
}

/// The server, killed when dropped (also when the test fails: it outlives
/// a panic otherwise, re-executed on a tmpfs nobody watches).
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

async fn submit(http: &reqwest::Client, base: &str, n: u64) -> Result<String, u16> {
    let r = http
        .post(format!("{base}/batches"))
        .bearer_auth(DEPOSITOR)
        .json(&json!({
            "submitter": "alice", "profile": "demo", "type": "object-manifest",
            "payload_url": format!("https://example.org/b{n}.checkm"),
            // Large enough records that the disk fills in a few hundred.
            "manifest": (0..40).map(|i| format!("https://example.org/object-{n}-{i}-{}.checkm loc{n}x{i}", "p".repeat(100))).collect::<Vec<_>>(),
            "erc_what": format!("Object {n}"),
        }))
        .send()
        .await
        .map_err(|_| 0u16)?;
    match r.status().as_u16() {
        201 => Ok(
            r.json::<serde_json::Value>().await.map_err(|_| 1u16)?["bid"]
                .as_str()
                .expect("bid")
                .to_string(),
        ),
        s => Err(s),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_stopped_by_a_full_disk_recovers_once_space_is_freed() {
    let tmp = tempfile::tempdir().expect("tmp");
    let Some(fs) = Tmpfs::mount(&tmp.path().join("disk"), "48m") else {
        return;
    };
    let data = fs.0.join("data");
    let mut child = Killed(
        Command::new(ingest_bin())
            .arg("--data-dir")
            .arg(&data)
            .args(["serve", "--listen", "127.0.0.1:0", "--working-storage"])
            .arg(tmp.path().join("work"))
            .env("INGEST_ADMIN_TOKEN", ADMIN)
            .env("INGEST_DEPOSITOR_TOKEN", DEPOSITOR)
            .env("INGEST_WORKER_TOKEN", WORKER)
            .env_remove("INGEST_CONFIG")
            .env_remove("INGEST_WORKER_STEPS")
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(tmp.path().join("serve.log")).expect("log"))
            .spawn()
            .expect("serve"),
    );
    // Every "listening" line the process prints, in order (it prints one
    // again when it starts itself anew).
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let stdout = child.0.stdout.take().expect("stdout");
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            if let Some(base) = line.strip_prefix("ingest serve listening on ") {
                let _ = tx.send(base.to_string());
            }
        }
    });
    let base = rx.recv_timeout(Duration::from_secs(60)).expect("listening");
    let http = reqwest::Client::new();
    // Fill the disk but a little.
    let filler = fs.0.join("filler");
    let status = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "dd if=/dev/zero of={} bs=1M 2>/dev/null; true",
            filler.display()
        ))
        .status()
        .expect("dd");
    assert!(status.success());
    let _ = std::fs::remove_file(fs.0.join("room"));
    // Leave a little room so the engine gets somewhere before it stops.
    let room = Command::new("sh")
        .arg("-c")
        .arg(format!("truncate -s -3M {}", filler.display()))
        .status()
        .expect("truncate");
    assert!(room.success());
    let mut acked = Vec::new();
    let mut refused = Vec::new();
    for n in 0..20_000u64 {
        match submit(&http, &base, n).await {
            Ok(bid) if refused.is_empty() => acked.push(bid),
            Ok(bid) => panic!("{bid} was acknowledged after the writer failed ({refused:?})"),
            // The group whose write failed is answered 500 (its outcome is
            // unknown); every command after it 503 (the writer stopped).
            Err(status) => {
                refused.push(status);
                if status == 503 {
                    break;
                }
                assert!(refused.len() < 10, "the writer did not stop: {refused:?}");
            }
        }
    }
    assert_eq!(
        refused.last(),
        Some(&503),
        "the writer stopped once the disk was full: {refused:?}"
    );
    assert!(!acked.is_empty());
    // Space freed: the server starts itself anew and takes commands again.
    std::fs::remove_file(&filler).expect("free the space");
    let base = rx
        .recv_timeout(Duration::from_secs(120))
        .expect("the server started itself anew");
    let deadline = Instant::now() + Duration::from_secs(60);
    let bid = loop {
        match submit(&http, &base, 99_999).await {
            Ok(bid) => break bid,
            Err(s) => assert!(
                Instant::now() < deadline,
                "no write taken after recovery: {s}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    acked.push(bid);
    for bid in &acked {
        let r = http
            .get(format!("{base}/batches/{bid}"))
            .bearer_auth(ADMIN)
            .send()
            .await
            .expect("read");
        assert_eq!(
            r.status().as_u16(),
            200,
            "{bid} was acknowledged and is gone"
        );
    }
    let v: serde_json::Value = http
        .get(format!("{base}/verify"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .expect("verify")
        .json()
        .await
        .expect("json");
    assert_eq!(v["problems"].as_array().map(Vec::len), Some(0), "{v}");
    let log = std::fs::read_to_string(tmp.path().join("serve.log")).unwrap_or_default();
    assert!(log.contains("starts itself anew"), "{log}");
    drop(child);
    drop(fs);
}
