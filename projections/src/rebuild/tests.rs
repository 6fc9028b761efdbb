use super::plan::{group_of, pack, plan_units, Group, Unit};
use super::*;
use crate::ops::Op;
use std::collections::BTreeMap;

#[test]
fn paths_are_grouped_by_job_and_batch() {
    let job = Group::Job("jid0000000007".into());
    assert_eq!(group_of("/jobs/jid0000000007", None), job);
    assert_eq!(group_of("/jobs/jid0000000007/status", None), job);
    assert_eq!(group_of("/jobs/states/pending/05-jid0000000007", None), job);
    assert_eq!(
        group_of(
            "/batches/bid0000000001/states/batch-processing/jid0000000007",
            None
        ),
        job
    );
    let batch = Group::Batch("bid0000000001".into());
    assert_eq!(group_of("/batches/bid0000000001/status", None), batch);
    assert_eq!(
        group_of("/batches/bid0000000001/states/batch-failed", None),
        batch
    );
    assert_eq!(group_of("/batch-uuids/u", Some(b"bid0000000001")), batch);
    assert_eq!(group_of("/batch-uuids/u", Some(b"junk")), Group::Other);
    assert_eq!(group_of("/jobs/states/pending", None), Group::Other);
    assert_eq!(group_of("/locks/queue/ingest", None), Group::Other);
}

#[test]
fn units_create_parents_first_and_delete_children_first() {
    let mut expected = Tree::new();
    expected
        .apply_all(&[
            Op::create("/jobs", ""),
            Op::create("/jobs/states", ""),
            Op::create("/jobs/states/pending", ""),
            Op::create("/jobs/jid0000000001", ""),
            Op::create("/jobs/jid0000000001/status", "x"),
            Op::create("/jobs/states/pending/05-jid0000000001", ""),
        ])
        .expect("valid");
    let mut live_tree = Tree::new();
    live_tree
        .apply_all(&[
            Op::create("/jobs", ""),
            Op::create("/jobs/states", ""),
            Op::create("/jobs/states/pending", ""),
            Op::create("/jobs/jid0000000002", ""),
            Op::create("/jobs/jid0000000002/status", "y"),
            Op::create("/jobs/jid0000000002/lock", ""),
            Op::create("/jobs/states/pending/05-jid0000000002", ""),
        ])
        .expect("valid");
    let live = LiveTree {
        tree: live_tree.clone(),
        ephemeral: [("/jobs/jid0000000002/lock".to_string(), 7)].into(),
        ctimes: BTreeMap::new(),
    };
    let diff = expected.diff_filtered(&live_tree, |p| !layout::is_ephemeral_lock(p));
    let units = plan_units(&diff, &expected, &live);
    let rendered: Vec<Vec<String>> = units
        .iter()
        .map(|u| u.ops.iter().map(Op::to_string).collect())
        .collect();
    assert_eq!(
        rendered,
        vec![
            vec![
                "create /jobs/jid0000000001 = ".to_string(),
                "create /jobs/jid0000000001/status = x".to_string(),
                "create /jobs/states/pending/05-jid0000000001 = ".to_string(),
            ],
            vec![
                "delete /jobs/states/pending/05-jid0000000002".to_string(),
                "delete /jobs/jid0000000002/status".to_string(),
                "delete /jobs/jid0000000002/lock".to_string(),
                "delete /jobs/jid0000000002".to_string(),
            ],
        ]
    );
    let mut t = live_tree;
    for u in &units {
        t.apply_all(&u.ops).expect("each unit applies in order");
    }
    assert_eq!(t, expected);
}

#[test]
fn packing_keeps_units_whole() {
    let unit = |n: usize, tag: &str| Unit {
        ops: (0..n).map(|i| Op::delete(format!("/{tag}{i}"))).collect(),
    };
    let limits = TxnLimits {
        max_bytes: 1 << 20,
        max_ops: 5,
    };
    let txns = pack(
        vec![unit(3, "a"), unit(3, "b"), unit(2, "c"), unit(7, "d")],
        limits,
    );
    let sizes: Vec<usize> = txns.iter().map(Vec::len).collect();
    assert_eq!(sizes, vec![3, 5, 5, 2]);
}
