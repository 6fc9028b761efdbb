//! A graceful stop under load (issue 11, finding 8): on SIGTERM the
//! in-process workers finish their steps in hand and report them, and the
//! projector stops only after those reports are in the tree, so that
//! `ingest diff` afterwards finds the tree at the log's head. Before, the
//! projector stopped first, the workers' last reports stayed out of
//! ZooKeeper, and `diff` called the tree clean by comparing at its
//! checkpoint. And `GET /diff` while the projector runs.

use std::process::Command;

use crate::server::{eventually, start_with, Server, ADMIN};
use crate::util::ingest_bin;
use crate::zk_server::{shared, unique_root};

/// `ingest serve` with in-process simulated workers, several tasks per step.
fn busy_server(dir: &std::path::Path, hosts: &str, root: &str, args: &[&str]) -> Server {
    let args: Vec<String> = args.iter().map(ToString::to_string).collect();
    start_with(
        dir,
        hosts,
        root,
        Some(&[
            "recording=on",
            "downloading=4",
            "processing=4",
            "estimating=4",
        ]),
        "simulate",
        &args,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigterm_under_load_leaves_a_tree_at_the_logs_head() {
    let zk_server = shared();
    let hosts = zk_server.hosts();
    let root = unique_root("shutdown-drain");
    let dir = tempfile::tempdir().expect("tempdir");
    // Steps that take a while, so that several are in hand at the SIGTERM.
    let mut s = busy_server(dir.path(), &hosts, &root, &["--step-ms", "400"]);
    let bid = s.submit(40).await;
    eventually("jobs in several states at once", 60, async || {
        let (_, body) = s.call(reqwest::Method::GET, "/status", ADMIN, None).await;
        let busy = ["Downloading", "Processing", "Estimating"]
            .iter()
            .filter(|st| body["jobs_by_state"][**st].as_u64().unwrap_or(0) > 0)
            .count();
        (busy >= 1).then_some(())
    })
    .await;
    let before = s.get(&format!("/batches/{bid}")).await;
    assert_ne!(before["status"], "Completed", "the load was over too soon");

    s.terminate(60).await;
    let log = std::fs::read_to_string(&s.log).expect("server log");
    assert!(
        log.contains("the projector reached the log's head"),
        "the server did not wait for its projector: {log}"
    );

    let diff = Command::new(ingest_bin())
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .args(["diff", "--zk", &hosts, "--zk-root", &root])
        .output()
        .expect("diff");
    let out = String::from_utf8_lossy(&diff.stdout);
    assert_eq!(
        diff.status.code(),
        Some(0),
        "the tree is not at the log's head after a graceful stop:\n{out}\n{}",
        String::from_utf8_lossy(&diff.stderr)
    );
    assert!(!out.contains("never projected"), "{out}");
}

/// Regression (issue 11, finding 10): `GET /diff` gave up with 503
/// "checkpoint kept moving" on 19 of 20 calls while the projector was busy.
/// The server now holds its projector between two transactions for the
/// read, so every call under load compares one position.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn diff_answers_while_the_projector_is_busy() {
    let zk_server = shared();
    let hosts = zk_server.hosts();
    let root = unique_root("diff-busy");
    let dir = tempfile::tempdir().expect("tempdir");
    let s = busy_server(dir.path(), &hosts, &root, &[]);
    let bid = s.submit(120).await;
    let mut under_load = 0;
    loop {
        let (_, batch) = s
            .call(
                reqwest::Method::GET,
                &format!("/batches/{bid}"),
                ADMIN,
                None,
            )
            .await;
        if batch["status"] == "Completed" {
            break;
        }
        let (status, body) = s.call(reqwest::Method::GET, "/diff", ADMIN, None).await;
        assert_eq!(status, 200, "GET /diff under load: {body}");
        assert_eq!(body["missing"], serde_json::json!([]), "{body}");
        assert_eq!(body["unexpected"], serde_json::json!([]), "{body}");
        assert_eq!(body["differing"], serde_json::json!([]), "{body}");
        under_load += 1;
        assert!(under_load < 10_000, "the batch never completed");
    }
    assert!(under_load >= 3, "only {under_load} diffs ran under load");
}
