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

/// Runs the tool with `args` (its mode and theirs) in a new work
/// directory; fails the test unless it exits 0. Returns its stdout.
fn campaign(args: &[&str]) -> String {
    let tool = PathBuf::from(env!("CARGO_BIN_EXE_ingest-campaign"));
    let work = tempfile::tempdir().expect("tmp");
    let out = Command::new(&tool)
        .args(["--ingest"])
        .arg(ingest_bin())
        .arg("--zk-tool")
        .arg(zk_tool())
        .arg("--work")
        .arg(work.path().join("campaign"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run ingest-campaign");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the campaign failed:\n{stdout}\n{stderr}"
    );
    stdout
}

/// The tool itself, with a few faults of the kinds the replication tests
/// do not repeat, must report nothing lost and exit 0.
#[test]
fn the_fault_campaign_tool_loses_nothing_in_a_short_run() {
    let stdout = campaign(&[
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
    ]);
    let row = stdout
        .lines()
        .find(|l| l.starts_with("| 5 of 5"))
        .unwrap_or_else(|| panic!("no result row:\n{stdout}"));
    let lost: Vec<&str> = row.split('|').map(str::trim).collect();
    assert_eq!(lost[4], "0", "{row}");
}

/// `throughput` on a small burst, twice (`--runs 2`): every run is measured
/// until acknowledged and until projected, the replicated run's projector
/// holds the whole burst by the time its figures are printed, and the last
/// table gives each repetition's ratios and their medians.
#[test]
fn the_throughput_tool_reports_acknowledged_and_projected_rates() {
    let stdout = campaign(&[
        "throughput",
        "--batches",
        "300",
        "--concurrency",
        "8",
        "--runs",
        "2",
    ]);
    let cells = |prefix: &str, nth: usize| -> Vec<String> {
        stdout
            .lines()
            .filter(|l| l.starts_with(prefix))
            .nth(nth)
            .unwrap_or_else(|| panic!("no row {prefix} #{nth}:\n{stdout}"))
            .split('|')
            .map(|c| c.trim().to_string())
            .collect()
    };
    let number = |c: &str| -> f64 {
        c.parse()
            .unwrap_or_else(|_| panic!("{c:?} is not a number:\n{stdout}"))
    };
    // The acknowledged table: three rates and the tail's figures.
    let ack = cells("| 300 | 8 |", 0);
    for rate in &ack[3..6] {
        assert!(number(rate) > 0.0, "{ack:?}");
    }
    // The projected table: after the acknowledged one, a row per run.
    for run in ["| single (standalone) |", "| single (ensemble of 3) |"] {
        let row = cells(run, 0);
        assert!(number(&row[4]) > 0.0, "{row:?}");
    }
    let replicated = cells("| replicated (3 + 3) |", 0);
    assert_eq!(replicated[5], "1.00", "{replicated:?}");
    assert!(number(&replicated[3]) > 0.0, "{replicated:?}");
    // Projection ends no sooner than the last acknowledgement, so its
    // CPU covers at least as long a wall time.
    for run in ["| single (standalone) |", "| replicated (3 + 3) |"] {
        let until_ack = cells(run, 1);
        let until_projected = cells(run, 2);
        assert_eq!(until_ack[2], "acknowledged", "{until_ack:?}");
        assert_eq!(until_projected[2], "projected", "{until_projected:?}");
        assert!(
            number(&until_projected[4]) >= number(&until_ack[4]),
            "{until_ack:?} {until_projected:?}"
        );
    }
    // The replicated run's tail writes and its followers' reads were
    // counted at the ensemble's servers.
    let requests = cells("| replicated (3 + 3) |", 2);
    assert!(number(&requests[11]) > 0.0, "{requests:?}");
    // The leader's share of the engines' CPU is given apart: all of a
    // single run's, part of a replicated one's (its followers apply every
    // record too).
    for until in 1..=2 {
        let single = cells("| single (standalone) |", until);
        assert_eq!(single[5], single[6], "{single:?}");
        let replicated = cells("| replicated (3 + 3) |", until);
        let (engines, leader) = (number(&replicated[5]), number(&replicated[6]));
        assert!(leader > 0.0 && leader < engines, "{replicated:?}");
    }
    // Two repetitions, each with its own tables, then the summary: each
    // repetition's ratios as its own tables gave them, and their medians.
    assert!(stdout.contains("## Repetition 2 of 2"), "{stdout}");
    for k in 0..2 {
        let ack = cells("| 300 | 8 |", k);
        let summary = cells(&format!("| {} |", k + 1), 0);
        // Each single run's row in the projected table comes first of its three.
        let projected_standalone = cells("| single (standalone) |", 3 * k);
        let projected_ensemble = cells("| single (ensemble of 3) |", 3 * k);
        let expected = [
            ("replicated rate", &ack[5]),
            ("acknowledged against the standalone", &ack[6]),
            ("acknowledged against the ensemble", &ack[7]),
            ("projected against the standalone", &projected_standalone[5]),
            ("projected against the ensemble", &projected_ensemble[5]),
        ];
        for (column, (what, cell)) in expected.into_iter().enumerate() {
            assert_eq!(&summary[column + 2], cell, "{what}: {summary:?}");
        }
    }
    let median = cells("| median |", 0);
    for column in 2..7 {
        let (a, b) = (
            number(&cells("| 1 |", 0)[column]),
            number(&cells("| 2 |", 0)[column]),
        );
        let m = number(&median[column]);
        // The mean of the two, as printed (rounded to the column's places).
        let tolerance = if column == 2 { 1.0 } else { 0.011 };
        assert!(
            (m - (a + b) / 2.0).abs() <= tolerance,
            "{median:?}: {a} {b}"
        );
    }
}

/// `sustained` on short probes: each of the three setups is probed
/// open-loop, and the tool prints the highest rate each held and the
/// replicated run's ratio to each single run. The rate here is far below
/// what any setup holds, so each holds it, and the search ends there (the
/// search itself is tested in `sustained::tests`).
#[test]
fn the_sustained_tool_finds_the_rate_each_setup_holds() {
    let stdout = campaign(&[
        "sustained",
        "--seconds",
        "2",
        "--start-rate",
        "20",
        "--max-rate",
        "20",
        "--warm-up",
        "50",
        "--max-in-flight",
        "64",
    ]);
    let row = |prefix: &str| -> Vec<String> {
        stdout
            .lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no row {prefix}:\n{stdout}"))
            .split('|')
            .map(|c| c.trim().to_string())
            .collect()
    };
    for run in [
        "| single (standalone) |",
        "| single (ensemble of 3) |",
        "| replicated (3 + 3) |",
    ] {
        let r = row(run);
        // 20 batches/s held; nothing above was tried.
        assert_eq!(r[2], "20", "{r:?}");
        assert_eq!(r[3], "none up to 20 (--max-rate)", "{r:?}");
        let p99: u64 = r[4].parse().unwrap_or_else(|_| panic!("{r:?}"));
        assert!(p99 <= 1000, "{r:?}");
        let cpu: Vec<f64> = r[6]
            .split(" / ")
            .map(|c| c.parse().unwrap_or_else(|_| panic!("{r:?}")))
            .collect();
        assert!(cpu.len() == 2 && cpu[0] > 0.0 && cpu[1] > 0.0, "{r:?}");
        // The group commit's records per tail write, for the replicated run.
        if run.starts_with("| replicated") {
            let per_write: f64 = r[7].parse().unwrap_or_else(|_| panic!("{r:?}"));
            assert!(per_write >= 1.0, "{r:?}");
        } else {
            assert_eq!(r[7], "-", "{r:?}");
        }
        assert_eq!(r[8], "1", "{r:?}");
    }
    let ratios = stdout
        .lines()
        .skip_while(|l| !l.starts_with("| replicated / single (standalone) |"))
        .nth(2)
        .unwrap_or_else(|| panic!("no ratios:\n{stdout}"));
    assert_eq!(
        ratios, "| 1.00 (at least: --max-rate held) | 1.00 (at least: --max-rate held) |",
        "{stdout}"
    );
}
