//! Interoperability with Merritt (issue 12): the projection as Merritt's own
//! code reads it.
//!
//! - Every scenario of `tests/data/merritt/*.yaml` (the batch happy path, a
//!   failure, recovery with UpdateReporting, deletes and cleanup,
//!   lowest-priority-first, a collection hold, a queue pause, the access
//!   queue's happy and fail paths) runs through
//!   the engine and is projected into a real ZooKeeper; the live tree,
//!   normalised as mrt-zk's harness compares trees (ids numbered in order of
//!   appearance, timestamps and uuids replaced), must equal the reviewed
//!   `<name>.tree` beside it. `INGEST_MERRITT_BLESS=1` writes the trees
//!   instead (review the diff before committing).
//! - An independent ZooKeeper client (`tests/interop/merritt_reader.py`,
//!   Python kazoo, installed into a virtual environment under the test
//!   target's temporary directory) reads each projected tree as a Merritt
//!   worker would: queues in priority order, a job lock taken, every node
//!   parsed, `profile` where mrt-ingest looks for it.

use std::path::{Path, PathBuf};
use std::process::Command as Process;

use super::*;

/// The scenarios and their expected trees.
fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/merritt")
}

fn scenarios() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(data_dir())
        .expect("tests/data/merritt")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    assert!(files.len() >= 9, "{files:?}");
    files
}

/// Runs the scenario at `path` and projects it under a new root; the root.
async fn project(path: &Path, server: &ZkServer) -> (String, ZkConfig) {
    let name = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let root = unique_root(&format!("merritt-{name}"));
    let zk = zk_config(&server.hosts(), &root);
    let mut f = Fixture::new();
    f.try_scenario_at(path).unwrap_or_else(|e| panic!("{e}"));
    catch_up(f.log(), &zk, "merritt").await;
    (root, zk)
}

/// The tree as text, normalised: `bidNNNNNNNNNN`/`jidNNNNNNNNNN`/`qidNNNNNNNNNN` become
/// `bid-1`, `jid-1`, `qid-1`, … in order of first appearance; timestamps and uuids
/// become `<time>` and `<uuid>`.
fn normalise(text: &str) -> String {
    let mut ids: BTreeMap<String, String> = BTreeMap::new();
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    let bytes = text.as_bytes();
    let mut out: Vec<u8> = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let rest = &bytes[i..];
        let id_prefix = ["bid", "jid", "qid"].into_iter().find(|p| {
            rest.starts_with(p.as_bytes())
                && rest.len() >= 13
                && rest[3..13].iter().all(u8::is_ascii_digit)
        });
        if let Some(prefix) = id_prefix {
            let id = String::from_utf8_lossy(&rest[..13]).into_owned();
            let name = ids.entry(id).or_insert_with(|| {
                let c = counts.entry(prefix).or_default();
                *c += 1;
                format!("{prefix}-{c}")
            });
            out.extend_from_slice(name.as_bytes());
            i += 13;
        } else if is_time(rest) {
            // `2024-05-16 10:11:12 +0000` or `2024-05-16T10:11:12+00:00`.
            out.extend_from_slice(b"<time>");
            i += 25;
        } else if is_uuid(rest) {
            out.extend_from_slice(b"<uuid>");
            i += 36;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    // Only ASCII runs were replaced, with ASCII.
    String::from_utf8(out).expect("still UTF-8")
}

fn is_time(b: &[u8]) -> bool {
    let digits = |r: std::ops::Range<usize>| b[r].iter().all(u8::is_ascii_digit);
    b.len() >= 25
        && digits(0..4)
        && b[4] == b'-'
        && digits(5..7)
        && b[7] == b'-'
        && digits(8..10)
        && (b[10] == b' ' || b[10] == b'T')
        && digits(11..13)
        && b[13] == b':'
        && (&b[19..25] == b" +0000" || &b[19..25] == b"+00:00")
}

fn is_uuid(b: &[u8]) -> bool {
    b.len() >= 36
        && b[..36].iter().enumerate().all(|(k, c)| match k {
            8 | 13 | 18 | 23 => *c == b'-',
            _ => c.is_ascii_hexdigit(),
        })
}

/// Each Merritt scenario gives its reviewed tree.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn merritt_scenarios_project_the_expected_trees() {
    let server = shared();
    let bless = std::env::var("INGEST_MERRITT_BLESS").is_ok_and(|v| v == "1");
    let mut failures = Vec::new();
    for path in scenarios() {
        let (_, zk) = project(&path, &server).await;
        let actual = normalise(&live_tree(&zk).await.dump_yaml(None));
        let expected_path = path.with_extension("tree");
        if bless {
            std::fs::write(&expected_path, &actual).expect("write the expected tree");
            continue;
        }
        let expected = std::fs::read_to_string(&expected_path).unwrap_or_else(|e| {
            panic!(
                "{}: {e}; run with INGEST_MERRITT_BLESS=1, review and commit",
                expected_path.display()
            )
        });
        if expected != actual {
            let diff: Vec<String> = expected
                .lines()
                .zip(actual.lines())
                .enumerate()
                .filter(|(_, (e, a))| e != a)
                .take(10)
                .map(|(n, (e, a))| {
                    format!(
                        "  line {}: expected {e:?}\n           actual   {a:?}",
                        n + 1
                    )
                })
                .collect();
            failures.push(format!(
                "{} differs ({} vs {} lines):\n{}",
                expected_path.display(),
                expected.lines().count(),
                actual.lines().count(),
                diff.join("\n")
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A Python with kazoo, in a virtual environment kept under the test
/// target's temporary directory (made once); `None` when pip cannot reach
/// the package index (the test then fails in CI and is skipped locally, saying so).
fn kazoo_python() -> Option<PathBuf> {
    crate::util::venv_python("merritt-interop-venv", "kazoo==2.11.0", "kazoo")
}

/// Merritt's reader, written independently with kazoo, reads every node of
/// every scenario's projected tree, takes the queues in priority order and
/// a job lock, and finds `profile` where mrt-ingest looks for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_independent_merritt_reader_reads_every_projected_node() {
    let Some(python) = tokio::task::spawn_blocking(kazoo_python)
        .await
        .expect("the venv task")
    else {
        return;
    };
    let server = shared();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/interop/merritt_reader.py");
    let mut profiles_seen = 0;
    for path in scenarios() {
        let (root, _) = project(&path, &server).await;
        let out = Process::new(&python)
            .arg(&script)
            .arg(server.hosts())
            .arg(&root)
            .output()
            .expect("run the reader");
        assert!(
            out.status.success(),
            "{}: Merritt's reader found problems:\n{}{}",
            path.display(),
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        );
        let summary: serde_json::Value =
            serde_json::from_slice(&out.stdout).expect("the reader's summary");
        assert!(summary["json_nodes"].as_u64() > Some(0), "{summary}");
        profiles_seen += summary["profiles"].as_object().map_or(0, |m| m.len());
        if path.ends_with("lowest-priority-first.yaml") {
            let pending: Vec<&str> = summary["queues"]["pending"]
                .as_array()
                .expect("pending")
                .iter()
                .filter_map(|v| v.as_str())
                .collect();
            assert!(pending.len() >= 2, "{summary}");
            assert!(
                pending[0].starts_with("01-"),
                "lowest number first: {pending:?}"
            );
            assert!(summary["locked"].is_string(), "{summary}");
        }
        // The access queues, as mrt-store's consumer takes them.
        if path.ends_with("access-happy-path.yaml") {
            assert_eq!(
                summary["access_metrics"]["num_assemblies_completed"], 2,
                "{summary}"
            );
            assert_eq!(summary["access"]["large"].as_array().map(Vec::len), Some(1));
            assert!(summary["access_locked"]["small"].is_string(), "{summary}");
        }
        if path.ends_with("access-fail-path.yaml") {
            assert_eq!(summary["access_paused"]["large"], true, "{summary}");
            assert!(
                summary["access_locked"].get("large").is_none(),
                "a paused queue is not taken: {summary}"
            );
            assert_eq!(
                summary["access_metrics"]["num_assemblies_processing"], 1,
                "{summary}"
            );
        }
    }
    assert!(profiles_seen > 0, "no job's profile was found");
}
