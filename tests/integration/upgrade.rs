//! Issue 25, finding 12: a data directory and a tree written by an earlier
//! release, served by this one. 0.1.0 projected each job's
//! `configuration` without the keys Merritt's readers need (`profile`,
//! `submissionDate`, …), and nothing converged those nodes short of a
//! rebuild with the server stopped: `ingest diff` found drift and `/readyz`
//! said ready. The engine now keeps the layout version the tree was
//! projected with (`/ingest-engine/layout`); a tree without it, or with an
//! older one, is converged item by item while serving, each rewrite
//! recorded, and the progress shown in `/readyz`.
//!
//! The fixture was written by ingest 0.1.0 (commit c7d7a85) through
//! `tools/upgrade-fixture`: a batch of 3 jobs Completed, the queue paused,
//! a batch of 2 jobs Pending.

use std::path::PathBuf;

use reqwest::Method;
use serde_json::{json, Value};
use zookeeper_client as zk;

use crate::server::{eventually, start_with_data, until_no_drift, ADMIN};
use crate::zk_server::{shared, unique_root};

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/upgrade-0.1.0")
}

/// Writes the fixture's tree under `root`, node by node, as it was.
async fn load_tree(hosts: &str, root: &str) {
    let top = zk::Client::connect(hosts).await.expect("zk");
    let acl = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    top.create(root, b"", &acl).await.expect("root");
    let zk = zk::Client::connect(&format!("{hosts}{root}"))
        .await
        .expect("zk");
    let text = std::fs::read_to_string(fixture().join("tree.jsonl")).expect("tree");
    for line in text.lines() {
        let node: Value = serde_json::from_str(line).expect("a node");
        let path = node["path"].as_str().expect("path");
        let data = node["data"].as_str().expect("data");
        zk.create(path, data.as_bytes(), &acl)
            .await
            .expect("create");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tree_and_log_written_by_0_1_0_converge_by_themselves_when_served() {
    let zk_server = shared();
    let root = unique_root("upgrade-0-1-0");
    let dir = tempfile::tempdir().expect("tempdir");
    let untar = std::process::Command::new("tar")
        .arg("-xzf")
        .arg(fixture().join("data.tar.gz"))
        .arg("-C")
        .arg(dir.path())
        .status()
        .expect("tar");
    assert!(untar.success());
    load_tree(&zk_server.hosts(), &root).await;
    let zk = zk::Client::connect(&format!("{}{root}", zk_server.hosts()))
        .await
        .expect("zk");
    let (before, _) = zk
        .get_data("/jobs/jid0000000004/configuration")
        .await
        .expect("0.1.0's configuration");
    assert!(
        !String::from_utf8_lossy(&before).contains("submissionDate"),
        "the fixture is 0.1.0's layout"
    );

    let server = start_with_data(
        dir.path(),
        &dir.path().join("data"),
        &zk_server.hosts(),
        &root,
    );
    // No drift left, without a rebuild or a stop.
    until_no_drift(&server, "the upgraded tree has no drift", 60).await;
    let (after, _) = zk
        .get_data("/jobs/jid0000000004/configuration")
        .await
        .expect("configuration");
    let after: Value = serde_json::from_slice(&after).expect("json");
    for key in ["profile", "submissionDate", "submitter"] {
        assert!(after.get(key).is_some(), "{key} in {after}");
    }
    let (layout, _) = zk
        .get_data("/ingest-engine/layout")
        .await
        .expect("the layout node");
    assert_eq!(
        String::from_utf8_lossy(&layout),
        ingest_projections::checkpoint::LAYOUT_VERSION.to_string()
    );
    // Each rewritten item is recorded in its history, naming the upgrade.
    let history = server.get("/jobs/jid0000000004/history").await;
    let recorded = history["events"]
        .as_array()
        .expect("events")
        .iter()
        .any(|e| {
            e["event"] == "ForeignChangeRepaired"
                && e["detail"].as_str().is_some_and(|d| d.contains("layout"))
        });
    assert!(recorded, "{history:#}");
    // Ready, with nothing left to converge, and the queue still works.
    let (status, ready) = server.call(Method::GET, "/readyz", ADMIN, None).await;
    assert_eq!(status, 200, "{ready}");
    assert!(
        ready.get("converging").is_none_or(Value::is_null),
        "{ready}"
    );
    let (status, body) = server
        .call(
            Method::POST,
            "/queue/resume",
            ADMIN,
            Some(json!({"reason": "after the upgrade"})),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let bid = server.submit(1).await;
    eventually(
        "a batch submitted after the upgrade is projected",
        30,
        async || {
            zk.check_stat(&format!("/batches/{bid}"))
                .await
                .ok()
                .flatten()
                .map(|_| ())
        },
    )
    .await;
}
