//! The projection is a pure function of the log (DESIGN.md invariant 4): the
//! same log gives the same tree byte for byte, and the tree materialized at an
//! earlier position or time is the one projected live at that point.

mod common;

use ingest_projections::{materialize, Projector, Until};

const SCENARIOS: [&str; 4] = [
    "job-lifecycle.yaml",
    "cleanup.yaml",
    "holds.yaml",
    "reporting.yaml",
];

#[test]
fn the_same_log_projects_to_the_same_bytes_twice() {
    for name in SCENARIOS {
        let run = common::run_scenario(name);
        let records = run.harness.records();
        let project = || {
            let mut p = Projector::new();
            let mut ops = vec![p.init().expect("init")];
            ops.extend(p.project_all(&records).expect("project"));
            (p.tree().dump_yaml(None), ops)
        };
        let (first_dump, first_ops) = project();
        let (second_dump, second_ops) = project();
        assert_eq!(first_dump.as_bytes(), second_dump.as_bytes(), "{name}");
        assert_eq!(first_ops, second_ops, "{name}");
        assert_eq!(
            first_ops, run.live_ops,
            "{name}: live and replayed operations differ"
        );
    }
}

#[test]
fn materialize_at_a_position_equals_the_tree_projected_live_there() {
    for name in SCENARIOS {
        let run = common::run_scenario(name);
        let records = run.harness.records();
        assert_eq!(run.snapshots.len(), records.len() + 1);
        for (position, live) in run.snapshots.iter().enumerate() {
            let tree =
                materialize(&records, Until::Position(position as u64)).expect("materialize");
            assert!(
                &tree == live,
                "{name}: at position {position}:\n{}",
                live.diff(&tree)
            );
        }
        let end = materialize(&records, Until::End).expect("materialize");
        assert_eq!(Some(&end), run.snapshots.last(), "{name}");
    }
}

#[test]
fn materialize_at_a_time_equals_the_tree_after_that_times_last_event() {
    for name in SCENARIOS {
        let run = common::run_scenario(name);
        let records = run.harness.records();
        for step in 0..run.harness.steps {
            let at = common::time_of(step);
            let last = records
                .iter()
                .filter(|r| r.envelope.timestamp <= at)
                .map(|r| r.envelope.position)
                .max()
                .unwrap_or(0);
            let tree = materialize(records.iter(), Until::Time(at)).expect("materialize");
            assert!(
                tree == run.snapshots[last as usize],
                "{name}: at {at} (position {last}):\n{}",
                run.snapshots[last as usize].diff(&tree)
            );
        }
        let before = common::time_of(0) - chrono::Duration::seconds(1);
        let empty = materialize(&records, Until::Time(before)).expect("materialize");
        assert_eq!(
            &empty, &run.snapshots[0],
            "{name}: before the first event only the base nodes"
        );
    }
}
