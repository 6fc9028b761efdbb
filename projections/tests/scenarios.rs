//! Data-driven scenarios: each file under `tests/scenarios/` gives the steps
//! (commands) and the expected tree. See `common::Step` for the step forms;
//! run with `INGEST_BLESS=1` to append the actual tree to a scenario that has
//! no expectation yet (an existing expectation is never overwritten).

mod common;

use std::collections::BTreeSet;

macro_rules! scenarios {
    ($($name:ident => $file:literal,)+) => {
        $(
            #[test]
            fn $name() {
                common::run_scenario($file);
            }
        )+

        /// Every scenario file has a test above, so none is silently skipped.
        #[test]
        fn every_scenario_file_is_run() {
            let listed: BTreeSet<&str> = [$($file),+].into_iter().collect();
            let found: BTreeSet<String> = std::fs::read_dir(common::scenario_dir())
                .expect("scenario dir")
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(".yaml"))
                .collect();
            let found: BTreeSet<&str> = found.iter().map(String::as_str).collect();
            assert_eq!(found, listed, "add new scenario files to the list in tests/scenarios.rs");
        }
    };
}

scenarios! {
    transitions_document => "transitions-document.yaml",
    job_lifecycle => "job-lifecycle.yaml",
    priority_change => "priority-change.yaml",
    requeue => "requeue.yaml",
    holds => "holds.yaml",
    pause_resume => "pause-resume.yaml",
    deletes => "deletes.yaml",
    reporting => "reporting.yaml",
    cleanup => "cleanup.yaml",
    job_data => "job-data.yaml",
    access => "access.yaml",
}
