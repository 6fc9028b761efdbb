//! The short version of `tools/campaign faults` the suite runs.
//!
//! It lives in this package so that cargo builds the tool before running
//! it (`CARGO_BIN_EXE_ingest-campaign`); the `ingest` binary it drives is
//! built by the same workspace test run, next to it.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn ingest_bin() -> PathBuf {
    let bin = Path::new(env!("CARGO_BIN_EXE_ingest-campaign")).with_file_name("ingest");
    assert!(
        bin.exists(),
        "{} is missing: run the workspace's tests (cargo nextest run --workspace --all-targets), which build it",
        bin.display()
    );
    bin
}

fn zk_tool() -> PathBuf {
    std::env::var_os("INGEST_ZK_TOOL")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tools/zk"))
}

/// The tool itself, with a few faults of the kinds the replication tests
/// do not repeat, must report nothing lost and exit 0.
#[test]
fn the_fault_campaign_tool_loses_nothing_in_a_short_run() {
    let tool = PathBuf::from(env!("CARGO_BIN_EXE_ingest-campaign"));
    let work = tempfile::tempdir().expect("tmp");
    let out = Command::new(&tool)
        .args(["--ingest"])
        .arg(ingest_bin())
        .arg("--zk-tool")
        .arg(zk_tool())
        .arg("--work")
        .arg(work.path().join("campaign"))
        .args([
            "faults",
            "--leader-kills",
            "2",
            "--disk-losses",
            "1",
            "--pauses",
            "0",
            "--follower-kills",
            "2",
            "--zk-outages",
            "0",
            "--max-seconds",
            "240",
        ])
        .stdin(Stdio::null())
        .output()
        .expect("run ingest-campaign");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the campaign failed:\n{stdout}\n{stderr}"
    );
    let row = stdout
        .lines()
        .find(|l| l.starts_with("| 5 of 5"))
        .unwrap_or_else(|| panic!("no result row:\n{stdout}"));
    let lost: Vec<&str> = row.split('|').map(str::trim).collect();
    assert_eq!(lost[4], "0", "{row}");
}
