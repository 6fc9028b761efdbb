//! What an operator installs from `deploy/`: the Prometheus alert rules
//! (`promtool check rules` and `promtool test rules`), the systemd units
//! (`systemd-analyze verify`) and the Grafana dashboard, through
//! `tools/check-deploy`; and every series they name is one the server or a
//! worker serves, so renaming a metric breaks this test, not a dashboard.

use std::collections::BTreeSet;
use std::process::Command;

use ingest_worker::metrics::WorkerMetrics;

use crate::util::ingest_bin;

fn repo() -> &'static std::path::Path {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn the_deploy_files_pass_promtool_and_systemd_analyze() {
    let out = Command::new(repo().join("tools/check-deploy"))
        .arg("--bin")
        .arg(ingest_bin())
        .output()
        .expect("run tools/check-deploy");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "tools/check-deploy failed:\n{}\n{stderr}",
        String::from_utf8_lossy(&out.stdout)
    );
    if stderr.contains("SKIPPED") {
        eprintln!("{stderr}");
    }
}

/// In CI a deploy check that cannot run FAILS: without `systemd-analyze`
/// on the `PATH` (every other program still there), `CI=true` makes
/// `tools/check-deploy` fail instead of passing on "SKIPPED".
#[test]
fn the_deploy_check_fails_in_ci_without_systemd_analyze() {
    let bin = tempfile::tempdir().expect("tempdir");
    let path = std::env::var_os("PATH").expect("PATH");
    for dir in std::env::split_paths(&path) {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let link = bin.path().join(&name);
            if name != "systemd-analyze" && !link.exists() {
                std::os::unix::fs::symlink(entry.path(), link).expect("symlink");
            }
        }
    }
    let run = |ci: &str| {
        Command::new(repo().join("tools/check-deploy"))
            .arg("--bin")
            .arg(ingest_bin())
            .env("PATH", bin.path())
            .env("CI", ci)
            .output()
            .expect("run tools/check-deploy")
    };
    let out = run("true");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "passed in CI without systemd-analyze:\n{stderr}"
    );
    assert!(
        stderr.contains("systemd-analyze is not installed and CI is set"),
        "{stderr}"
    );
    // Locally it says it skipped, and passes.
    let out = run("false");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("SKIPPED (fails in CI)"), "{stderr}");
}

/// The metric names a text mentions (`ingest_…`), as their families.
fn mentioned(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while let Some(at) = text[i..].find("ingest_") {
        let start = i + at;
        let before = start.checked_sub(1).map(|b| bytes[b]);
        let mut end = start;
        while end < bytes.len() && (bytes[end].is_ascii_lowercase() || bytes[end] == b'_') {
            end += 1;
        }
        i = end.max(start + 1);
        if before.is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-') {
            continue;
        }
        let mut name = &text[start..end];
        for suffix in ["_bucket", "_count", "_sum", "_total"] {
            name = name.strip_suffix(suffix).unwrap_or(name);
        }
        names.insert(name.to_string());
    }
    names
}

/// The families a page declares (`# TYPE name kind`).
fn declared(page: &str) -> BTreeSet<String> {
    page.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

/// Scraped from a real `ingest serve` (its projector attached) and a
/// worker's metrics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_series_the_alerts_and_dashboard_name_is_served() {
    use crate::server::{eventually, start};
    use crate::zk_server::{shared, unique_root};
    let zk = shared();
    let dir = tempfile::tempdir().expect("tempdir");
    let server = start(dir.path(), &zk.hosts(), &unique_root("series"), None);
    let http = reqwest::Client::new();
    // The projector's series appear once it is attached.
    let page = eventually("the projector's series", 60, async || {
        let page = http
            .get(format!("{}/metrics", server.base))
            .send()
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        page.contains("ingest_projector_state").then_some(page)
    })
    .await;
    let mut served = declared(&page);
    served.extend(declared(&WorkerMetrics::new("w").render().expect("render")));
    for file in [
        "deploy/prometheus/alerts.yml",
        "deploy/grafana/ingest-dashboard.json",
    ] {
        let text = std::fs::read_to_string(repo().join(file)).expect("read");
        let names = mentioned(&text);
        assert!(names.len() > 5, "{file}: {names:?}");
        let unknown: Vec<_> = names.difference(&served).collect();
        assert!(
            unknown.is_empty(),
            "{file} names series nobody serves: {unknown:?}\nserved: {served:?}"
        );
    }
}

/// The ZooKeeper-session gauge of `ingest serve` follows the session: during
/// an outage it leaves SyncConnected even though no worker report (and so no
/// lock check) touches ZooKeeper. Before, the gauge was set only by lock
/// checks and said SyncConnected for the whole outage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_session_gauge_says_disconnected_during_an_outage() {
    use crate::server::{eventually, start};
    use crate::zk_server::{unique_root, ZkServer};
    let zk = ZkServer::dedicated();
    let dir = tempfile::tempdir().expect("tempdir");
    let server = start(dir.path(), &zk.hosts(), &unique_root("session"), Some(&[]));
    let bid = server.submit(1).await;
    eventually("the batch completes", 60, async || {
        let b = server.get(&format!("/batches/{bid}")).await;
        (b["status"] == "Completed").then_some(())
    })
    .await;
    let http = reqwest::Client::new();
    let scrape = async || {
        http.get(format!("{}/metrics", server.base))
            .send()
            .await
            .expect("scrape")
            .text()
            .await
            .expect("page")
    };
    let connected = "ingest_zookeeper_session_state{state=\"SyncConnected\"} 1";
    let page = scrape().await;
    assert!(page.contains(connected), "{page}");
    tokio::task::block_in_place(|| zk.stop());
    eventually("the gauge leaves SyncConnected", 60, async || {
        let page = scrape().await;
        (!page.contains(connected)
            && page.contains("ingest_zookeeper_session_state{state=\"SyncConnected\"} 0"))
        .then_some(())
    })
    .await;
}
