//! `ingest backup` and `ingest restore` (issue 22) against a real
//! `ingest serve` that keeps taking submissions meanwhile: the backup is a
//! consistent copy at a position, the restored log verifies and equals the
//! source up to that position, a restore to an earlier position equals the
//! source there, and a backup with one byte changed is refused and leaves
//! nothing behind.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};

use crate::server::{start, ADMIN, DEPOSITOR};
use crate::util::{ingest_bin, Run};
use crate::zk_server::{shared, unique_root};

fn ingest(args: &[&str], engine: Option<&str>) -> Run {
    let mut cmd = Command::new(ingest_bin());
    if let Some(e) = engine {
        cmd.args(["--engine", e]);
    }
    let out = cmd
        .args(args)
        .env("INGEST_ADMIN_TOKEN", ADMIN)
        .env_remove("INGEST_ENGINE")
        .env_remove("INGEST_ADMIN_TOKEN_FILE")
        .output()
        .expect("run ingest");
    Run::from_output(out)
}

/// The hash the source holds at `position` (from its own frames route).
async fn source_hash(base: &str, position: u64) -> String {
    let r = reqwest::Client::new()
        .get(format!("{base}/replication/frames?from=1&to={position}"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .expect("frames");
    assert_eq!(r.status().as_u16(), 200);
    r.headers()["ingest-to-hash"]
        .to_str()
        .expect("hash")
        .to_string()
}

fn restored(out: &Run) -> Value {
    serde_json::from_str(&out.stdout).expect("restore prints JSON")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_taken_under_load_restores_to_a_verified_equal_log_and_a_tampered_one_is_refused()
{
    let zk = shared();
    let dir = tempfile::tempdir().expect("tmp");
    let server = start(dir.path(), &zk.hosts(), &unique_root("backup"), None);
    let base = server.base.clone();
    // Submissions go on while the backup is taken.
    let stop = tokio_util::sync::CancellationToken::new();
    let load = {
        let (base, stop) = (base.clone(), stop.clone());
        tokio::spawn(async move {
            let http = reqwest::Client::new();
            let mut n = 0u64;
            while !stop.is_cancelled() {
                n += 1;
                let r = http
                    .post(format!("{base}/batches"))
                    .bearer_auth(DEPOSITOR)
                    .json(&json!({
                        "submitter": "alice", "profile": "demo", "type": "object-manifest",
                        "payload_url": format!("https://example.org/b{n}.checkm"),
                        "manifest": [format!("https://example.org/a{n}.checkm loc{n}")],
                        "erc_what": format!("Object {n}"),
                    }))
                    .send()
                    .await
                    .expect("submit");
                assert_eq!(r.status().as_u16(), 201);
            }
            n
        })
    };
    // Let some history build up first.
    let http = reqwest::Client::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let s: Value = http
            .get(format!("{base}/replication"))
            .bearer_auth(ADMIN)
            .send()
            .await
            .expect("status")
            .json()
            .await
            .expect("json");
        if s["applied"].as_u64().unwrap_or(0) >= 40 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no load");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let file = dir.path().join("log.backup");
    let f = file.to_string_lossy().into_owned();
    let b = tokio::task::spawn_blocking({
        let (f, base) = (f.clone(), base.clone());
        move || ingest(&["backup", "--out", &f], Some(&base))
    })
    .await
    .expect("join")
    .ok();
    let trailer: Value = serde_json::from_str(&b.stdout).expect("backup prints its trailer");
    let position = trailer["position"].as_u64().expect("position");
    stop.cancel();
    let submitted = load.await.expect("load");
    assert!(submitted > 0);
    assert!(position >= 40, "{trailer}");
    assert_eq!(
        trailer["head_hash"].as_str().unwrap(),
        source_hash(&base, position).await
    );

    // The whole backup restores and verifies.
    let whole = dir.path().join("restored");
    let r = ingest(
        &[
            "--data-dir",
            &whole.to_string_lossy(),
            "restore",
            "--from",
            &f,
        ],
        None,
    )
    .ok();
    let r = restored(&r);
    assert_eq!(r["position"].as_u64(), Some(position));
    assert_eq!(r["head_hash"], trailer["head_hash"]);
    assert_eq!(r["verified"].as_u64(), Some(position));
    ingest(&["--data-dir", &whole.to_string_lossy(), "verify"], None).ok();

    // To an earlier position: the same records as the source's there.
    let half = dir.path().join("half");
    let r = ingest(
        &[
            "--data-dir",
            &half.to_string_lossy(),
            "restore",
            "--from",
            &f,
            "--to-position",
            &(position / 2).to_string(),
        ],
        None,
    )
    .ok();
    let r = restored(&r);
    let p = r["position"].as_u64().expect("position");
    assert!(p <= position / 2 && p + 3 > position / 2, "{r}");
    assert_eq!(
        r["head_hash"].as_str().unwrap(),
        source_hash(&base, p).await
    );

    // Into a data directory that holds a log: refused.
    ingest(
        &[
            "--data-dir",
            &whole.to_string_lossy(),
            "restore",
            "--from",
            &f,
        ],
        None,
    )
    .failed();

    // One byte changed in a record: refused, nothing left behind.
    let mut bytes = std::fs::read(&file).expect("read");
    let at = bytes.len() / 2;
    bytes[at] ^= 0x20;
    let tampered = dir.path().join("tampered.backup");
    std::fs::write(&tampered, &bytes).expect("write");
    let bad = dir.path().join("bad");
    let run = ingest(
        &[
            "--data-dir",
            &bad.to_string_lossy(),
            "restore",
            "--from",
            &tampered.to_string_lossy(),
        ],
        None,
    );
    assert_eq!(run.code, 1, "{run:?}");
    assert!(run.stderr.contains("refused"), "{}", run.stderr);
    assert!(
        !Path::new(&bad).join("log").exists(),
        "nothing is left of a refused restore"
    );
    // Cut short: refused too.
    let cut = dir.path().join("cut.backup");
    std::fs::write(&cut, &std::fs::read(&file).expect("read")[..at]).expect("write");
    let run = ingest(
        &[
            "--data-dir",
            &dir.path().join("cut").to_string_lossy(),
            "restore",
            "--from",
            &cut.to_string_lossy(),
        ],
        None,
    );
    assert_eq!(run.code, 1, "{run:?}");

    // A backup needs the server when it holds the data directory.
    let run = ingest(
        &[
            "--data-dir",
            &dir.path().join("data").to_string_lossy(),
            "backup",
            "--out",
            &dir.path().join("x").to_string_lossy(),
        ],
        None,
    );
    assert_ne!(run.code, 0);
    assert!(run.stderr.contains("--engine"), "{}", run.stderr);
    drop(server);
}
