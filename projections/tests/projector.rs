//! The projector's operations, event by event: every job transition of the
//! lifecycle, priority re-keying, cleanup split points, batching by size, and
//! fold errors.

mod common;

use std::collections::VecDeque;

use common::{project_checked, MemHarness};
use ingest_events::command::{Command, Target};
use ingest_events::event::Event;
use ingest_events::lifecycle::{JobState, StateKind};
use ingest_events::{Jid, Recorded};
use ingest_projections::layout::{self, BatchSet};
use ingest_projections::ops::TRANSACTION_OVERHEAD;
use ingest_projections::{batches_by_size, EventOps, Op, ProjectError, Projector, Tree};

/// The explicit moves that take a job from Pending to `target`, through
/// states that are not terminal.
fn path_to(h: &MemHarness, target: JobState) -> Vec<JobState> {
    let lc = &h.lifecycle.jobs;
    let mut queue = VecDeque::from([vec![JobState::Pending]]);
    let mut seen = vec![JobState::Pending];
    while let Some(path) = queue.pop_front() {
        let last = *path.last().expect("non-empty");
        if last == target {
            return path[1..].to_vec();
        }
        // Explicit moves do not leave Failed (a requeue does), so paths avoid it.
        if lc.is_terminal(last) || last == JobState::Failed {
            continue;
        }
        for next in lc.allowed(last) {
            if !seen.contains(next) {
                seen.push(*next);
                let mut p = path.clone();
                p.push(*next);
                queue.push_back(p);
            }
        }
    }
    panic!("{target} cannot be reached from Pending");
}

/// The operations the move of `jid` must give, from the tree before it.
fn expected_move_ops(
    before: &Tree,
    h: &MemHarness,
    jid: Jid,
    from: JobState,
    status_data: &[u8],
) -> Vec<Op> {
    let j = &h.state.jobs[&jid];
    let mut ops = vec![Op::set(layout::job_status(jid), status_data.to_vec())];
    ops.push(Op::delete(layout::queue_ref(from, j.priority, jid)));
    ops.push(Op::create(layout::queue_ref(j.status, j.priority, jid), ""));
    let (old_set, new_set) = (BatchSet::of(from), BatchSet::of(j.status));
    if old_set != new_set {
        ops.push(Op::delete(layout::batch_child(j.bid, old_set, jid)));
        let dir = layout::batch_set(j.bid, new_set);
        if !before.contains(&dir) {
            ops.push(Op::create(dir, ""));
        }
        ops.push(Op::create(layout::batch_child(j.bid, new_set, jid), ""));
    }
    ops
}

/// Every allowed job move, explicit and as success / fail, projects to
/// exactly: set status, move the queue reference, move the batch child when
/// the set changes; the tree keeps the invariants and matches the oracle.
#[test]
fn every_job_transition_moves_status_queue_reference_and_batch_set() {
    let lc = ingest_events::Lifecycle::builtin();
    let mut cases = Vec::new();
    for (from, rule) in lc.jobs.iter() {
        for to in &rule.targets {
            // A failed job leaves Failed only by a requeue (or a delete); the
            // requeue case below covers that move.
            if from == JobState::Failed && *to != JobState::Deleted {
                continue;
            }
            cases.push((from, Some(Target::To(*to))));
        }
        if rule.success.is_some() {
            cases.push((from, Some(Target::Success)));
        }
        if rule.fail.is_some() {
            cases.push((from, Some(Target::Fail)));
        }
    }
    cases.push((JobState::Failed, None));
    assert!(cases.len() >= 35, "{} cases", cases.len());
    for (from, target) in cases {
        let mut h = MemHarness::default();
        let bid = h.submit("demo");
        // A second job keeps the batch at work whatever the first one does.
        let jid = h.acquire(bid, 2)[0];
        for step in path_to(&h, from) {
            h.set(jid, Target::To(step));
        }
        assert_eq!(h.state.jobs[&jid].status, from);
        let (before_projector, _) = project_checked(&h.records);
        let before = before_projector.tree().clone();
        let records = match target {
            Some(t) => h.set(jid, t),
            None => h.ok(Command::RequeueJob {
                jid,
                reason: String::new(),
            }),
        };
        let (_, all_ops) = project_checked(&h.records);
        let ops = &all_ops[all_ops.len() - records.len()].ops;
        let status_data = ops
            .first()
            .and_then(|o| o.data())
            .unwrap_or_else(|| panic!("{from} -> {target:?}: no status write in {ops:?}"));
        let status: serde_json::Value = serde_json::from_slice(status_data).expect("status JSON");
        let to = h.state.jobs[&jid].status;
        assert_eq!(status["status"], to.name(), "{from} -> {target:?}");
        let want = expected_move_ops(&before, &h, jid, from, status_data);
        assert_eq!(ops, &want, "{from} -> {target:?}");
    }
}

/// A move with a new priority sets the priority node and re-keys the queue
/// reference in the same event.
#[test]
fn a_priority_change_with_a_move_rekeys_the_queue_reference() {
    let mut h = MemHarness::default();
    let bid = h.submit("demo");
    let jid = h.acquire(bid, 1)[0];
    h.ok(Command::StartJob { jid });
    let records = h.ok(Command::SetJobStatus {
        jid,
        target: Target::Success,
        message: String::new(),
        priority: Some(10),
    });
    assert_eq!(records.len(), 1);
    let (_, all) = project_checked(&h.records);
    let ops = &all.last().expect("ops").ops;
    let kinds: Vec<(String, &str)> = ops
        .iter()
        .map(|o| (o.kind().to_string(), o.path()))
        .collect();
    assert_eq!(
        kinds,
        [
            ("set".to_string(), "/jobs/jid0000000001/status"),
            ("set".to_string(), "/jobs/jid0000000001/priority"),
            (
                "delete".to_string(),
                "/jobs/states/estimating/05-jid0000000001"
            ),
            (
                "create".to_string(),
                "/jobs/states/provisioning/10-jid0000000001"
            ),
        ]
    );
    assert_eq!(ops[1].data(), Some(&b"10"[..]));
}

/// A cleanup's operations can be cut at its split points: every part leaves
/// each job wholly present or wholly gone.
#[test]
fn cleanup_split_points_never_leave_a_job_half_deleted() {
    let mut h = MemHarness::default();
    let bid = h.submit("demo");
    let jobs = h.acquire(bid, 3);
    for jid in &jobs {
        h.ok(Command::SetJobStatus {
            jid: *jid,
            target: Target::Fail,
            message: "x".into(),
            priority: None,
        });
    }
    h.ok(Command::ReportBatch {
        bid,
        notification_error: None,
    });
    h.ok(Command::DeleteBatch {
        bid,
        reason: "x".into(),
    });
    let other = h.submit("demo");
    h.acquire(other, 1);
    let cleanup = h.ok(Command::Cleanup { before: None });
    assert!(matches!(cleanup[0].event, Event::BatchCleanedUp(_)));
    let (_, all) = project_checked(&h.records);
    let event = all.last().expect("cleanup ops");
    assert_eq!(event.split_points.len(), 3, "{:?}", event.split_points);
    let parts = event.parts();
    assert_eq!(parts.len(), 4);
    let mut tree = {
        let mut p = Projector::new();
        p.init().expect("init");
        for r in &h.records[..h.records.len() - 1] {
            p.project(r).expect("project");
        }
        p.into_tree()
    };
    for (i, part) in parts.iter().enumerate() {
        tree.apply_all(part.iter())
            .expect("each part is valid on its own");
        for jid in &jobs {
            let present = [
                layout::job(*jid),
                layout::queue_ref(JobState::Deleted, 5, *jid),
            ]
            .iter()
            .filter(|p| tree.contains(p))
            .count();
            assert!(
                present == 0 || present == 2,
                "part {i}: {jid} is half deleted"
            );
        }
    }
    assert!(!tree.contains(&layout::batch(bid)));
    assert!(tree.contains(&layout::batch(other)));
}

/// Grouping events by serialized size keeps every group under the cap,
/// except an event that is too large on its own.
#[test]
fn events_are_grouped_under_the_size_cap() {
    let run = common::run_scenario("job-lifecycle.yaml");
    let events: &[EventOps] = &run.live_ops;
    for cap in [200, 1_000, 4_096, 1 << 20] {
        let ranges = batches_by_size(events, cap);
        let mut next = 0;
        for r in &ranges {
            assert_eq!(r.start, next);
            next = r.end;
            let size: usize = TRANSACTION_OVERHEAD
                + events[r.clone()]
                    .iter()
                    .map(EventOps::serialized_size)
                    .sum::<usize>();
            assert!(
                size <= cap || r.len() == 1,
                "cap {cap}: {r:?} is {size} bytes"
            );
        }
        assert_eq!(next, events.len());
    }
}

/// A record out of order is refused by the fold and changes nothing.
#[test]
fn a_record_out_of_order_is_refused_and_changes_nothing() {
    let mut h = MemHarness::default();
    let bid = h.submit("demo");
    h.acquire(bid, 1);
    let mut p = Projector::new();
    p.init().expect("init");
    let second: &Recorded = &h.records[1];
    let before = p.tree().clone();
    assert!(matches!(p.project(second), Err(ProjectError::Fold(_))));
    assert_eq!(p.tree(), &before);
    assert_eq!(p.position(), 0);
    for r in &h.records {
        p.project(r).expect("in order");
    }
    assert_eq!(p.position(), h.records.len() as u64);
}

/// Without `init`, the projector still creates every parent it needs.
#[test]
fn parents_are_created_on_demand_without_init() {
    let mut h = MemHarness::default();
    let bid = h.submit("demo");
    let jid = h.acquire(bid, 1)[0];
    h.ok(Command::StartJob { jid });
    let mut p = Projector::new();
    let mut tree = Tree::new();
    for r in &h.records {
        let ops = p.project(r).expect("project");
        tree.apply_all(&ops.ops)
            .expect("valid against an empty tree");
    }
    assert_eq!(&tree, p.tree());
    assert!(tree.contains("/jobs/states/estimating/05-jid0000000001"));
    // Queues are created as jobs need them and stay when emptied.
    assert!(tree.contains("/jobs/states/pending"));
    assert!(!tree.contains("/jobs/states/failed"));
}

/// `project_traced`'s pre-images are what the tree held before each
/// operation: the live sink undoes pending operations with them to know the
/// tree its checkpoint names (issue 23: a foreign change is converged to
/// that view). Checked over a walk with moves, a priority change, a hold, a
/// delete and a cleanup: the tree after the event, with the event's
/// operations undone in reverse order from their pre-images, is the tree
/// before it.
#[test]
fn pre_images_give_back_the_tree_before_each_event() {
    let mut h = MemHarness::default();
    let bid = h.submit("demo");
    let jids = h.acquire(bid, 2);
    h.ok(Command::StartJob { jid: jids[0] });
    h.ok(Command::SetJobStatus {
        jid: jids[0],
        target: Target::Success,
        message: String::new(),
        priority: Some(10),
    });
    h.ok(Command::HoldJob {
        jid: jids[1],
        reason: "check".into(),
    });
    h.ok(Command::DeleteJob {
        jid: jids[1],
        reason: "gone".into(),
    });
    let mut p = Projector::new();
    p.init().expect("init");
    for r in &h.records {
        let before = p.tree().clone();
        let (ops, pre) = p.project_traced(r).expect("project");
        assert_eq!(ops.ops.len(), pre.len(), "one pre-image per operation");
        let mut undone: std::collections::BTreeMap<String, Vec<u8>> = p
            .tree()
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_vec()))
            .collect();
        for (op, pre) in ops.ops.iter().zip(&pre).rev() {
            match pre {
                Some(d) => undone.insert(op.path().to_string(), d.clone()),
                None => undone.remove(op.path()),
            };
        }
        assert_eq!(
            Tree::from(undone),
            before,
            "position {}",
            r.envelope.position
        );
    }
}
