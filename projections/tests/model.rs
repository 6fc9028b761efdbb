//! A model test (sled's `prop_tree_matches_btreemap` style): random command
//! sequences through `decide`, projected event by event. After every event:
//! - every operation is valid against an independent in-memory tree that
//!   applies only the emitted operations (ZooKeeper's rules), and that tree
//!   equals the projector's own model;
//! - every live job is in exactly one `/jobs/states/*` queue and exactly one
//!   `batch-*` set (DESIGN.md invariant 6);
//! - the tree equals the tree computed directly from the folded state by an
//!   independent oracle.

mod common;

use common::{check_invariants, oracle_mismatch, MemHarness};
use ingest_events::command::{Command, Target};
use ingest_events::event::{Event, Identifiers, InventoryParams, StoreParams, StreamId};
use ingest_events::lifecycle::{JobState, StateKind};
use ingest_events::{Bid, Jid};
use ingest_projections::{Projector, Tree};
use proptest::prelude::*;

const PROFILES: [&str; 2] = ["alpha", "beta"];

#[derive(Debug, Clone)]
enum Action {
    Submit(usize),
    Acquire(usize, usize),
    Start(usize),
    Success(usize, Option<u8>),
    Fail(usize),
    MoveTo(usize, usize, Option<u8>),
    Requeue(usize),
    HoldJob(usize),
    ReleaseJob(usize),
    HoldCollection(usize),
    ReleaseCollection(usize),
    ReleaseHeldJobs(usize),
    ReleaseBatch(usize),
    Pause,
    Resume,
    Space(usize, Option<u8>),
    Identifiers(usize, bool),
    Store(usize),
    Inventory(usize),
    StepRetry(usize),
    DeleteJob(usize),
    DeleteBatch(usize),
    UpdateReporting(usize),
    Report(usize, bool),
    Cleanup,
}

fn priority() -> impl Strategy<Value = Option<u8>> {
    prop::option::weighted(0.3, prop_oneof![Just(0u8), Just(5), Just(10), Just(99)])
}

fn action() -> impl Strategy<Value = Action> {
    let i = || 0usize..16;
    prop_oneof![
        3 => (0..PROFILES.len()).prop_map(Action::Submit),
        3 => (i(), 0usize..4).prop_map(|(b, n)| Action::Acquire(b, n)),
        4 => i().prop_map(Action::Start),
        12 => (i(), priority()).prop_map(|(j, p)| Action::Success(j, p)),
        3 => i().prop_map(Action::Fail),
        2 => (i(), 0..JobState::ALL.len(), priority()).prop_map(|(j, s, p)| Action::MoveTo(j, s, p)),
        2 => i().prop_map(Action::Requeue),
        1 => i().prop_map(Action::HoldJob),
        1 => i().prop_map(Action::ReleaseJob),
        1 => (0..PROFILES.len()).prop_map(Action::HoldCollection),
        1 => (0..PROFILES.len()).prop_map(Action::ReleaseCollection),
        1 => (0..PROFILES.len()).prop_map(Action::ReleaseHeldJobs),
        1 => i().prop_map(Action::ReleaseBatch),
        1 => Just(Action::Pause),
        1 => Just(Action::Resume),
        2 => (i(), priority()).prop_map(|(j, p)| Action::Space(j, p)),
        1 => (i(), any::<bool>()).prop_map(|(j, e)| Action::Identifiers(j, e)),
        1 => i().prop_map(Action::Store),
        1 => i().prop_map(Action::Inventory),
        1 => i().prop_map(Action::StepRetry),
        1 => i().prop_map(Action::DeleteJob),
        1 => i().prop_map(Action::DeleteBatch),
        1 => i().prop_map(Action::UpdateReporting),
        3 => (i(), any::<bool>()).prop_map(|(b, e)| Action::Report(b, e)),
        1 => Just(Action::Cleanup),
    ]
}

/// The command an action stands for in the current state (`None` when there
/// is nothing to act on). Indices pick among live jobs and batches.
fn command(h: &mut MemHarness, a: &Action) -> Option<Command> {
    let jobs: Vec<Jid> = h
        .state
        .jobs
        .values()
        .filter(|j| !j.cleaned_up)
        .map(|j| j.jid)
        .collect();
    let batches: Vec<Bid> = h
        .state
        .batches
        .values()
        .filter(|b| !b.cleaned_up)
        .map(|b| b.bid)
        .collect();
    let job = |i: usize| (!jobs.is_empty()).then(|| jobs[i % jobs.len()]);
    let batch = |i: usize| (!batches.is_empty()).then(|| batches[i % batches.len()]);
    let reason = || "model".to_string();
    let set = |jid, target, priority| Command::SetJobStatus {
        jid,
        target,
        message: "model".into(),
        priority,
    };
    Some(match a {
        Action::Submit(p) => {
            h.submit(PROFILES[*p]);
            return None;
        }
        Action::Acquire(b, n) => {
            let bid = batch(*b)?;
            let first = h.state.next_jid().0;
            Command::AcquireBatch {
                bid,
                jobs: (0..*n as u64)
                    .map(|k| common::spec(&format!("https://example.org/o{}.zip", first + k)))
                    .collect(),
            }
        }
        Action::Start(j) => Command::StartJob { jid: job(*j)? },
        Action::Success(j, p) => set(job(*j)?, Target::Success, *p),
        Action::Fail(j) => set(job(*j)?, Target::Fail, None),
        Action::MoveTo(j, s, p) => set(job(*j)?, Target::To(JobState::ALL[*s]), *p),
        Action::Requeue(j) => Command::RequeueJob {
            jid: job(*j)?,
            reason: reason(),
        },
        Action::HoldJob(j) => Command::HoldJob {
            jid: job(*j)?,
            reason: reason(),
        },
        Action::ReleaseJob(j) => Command::ReleaseJob {
            jid: job(*j)?,
            reason: reason(),
        },
        Action::HoldCollection(p) => Command::HoldCollection {
            profile: PROFILES[*p].into(),
            reason: reason(),
        },
        Action::ReleaseCollection(p) => Command::ReleaseCollection {
            profile: PROFILES[*p].into(),
            reason: reason(),
        },
        Action::ReleaseHeldJobs(p) => Command::ReleaseHeldJobs {
            profile: PROFILES[*p].into(),
            reason: reason(),
        },
        Action::ReleaseBatch(b) => Command::ReleaseBatch {
            bid: batch(*b)?,
            reason: reason(),
        },
        Action::Pause => Command::PauseQueue { reason: reason() },
        Action::Resume => Command::ResumeQueue { reason: reason() },
        Action::Space(j, p) => Command::RecordSpace {
            jid: job(*j)?,
            space_needed: 1 << 20,
            priority: *p,
        },
        Action::Identifiers(j, empty) => Command::RecordIdentifiers {
            jid: job(*j)?,
            identifiers: if *empty {
                Identifiers::default()
            } else {
                Identifiers {
                    primary_id: Some("ark:/13030/m5x".into()),
                    local_ids: vec!["l1".into()],
                }
            },
        },
        Action::Store(j) => Command::RecordStore {
            jid: job(*j)?,
            store: StoreParams {
                manifest_url: "https://example.org/m".into(),
                mode: "add".into(),
                delete: false,
            },
        },
        Action::Inventory(j) => Command::RecordInventory {
            jid: job(*j)?,
            inventory: InventoryParams {
                manifest_url: "https://example.org/m".into(),
                mode: "add".into(),
            },
        },
        Action::StepRetry(j) => Command::RecordStepRetry {
            jid: job(*j)?,
            attempt: 2,
            message: "timeout".into(),
        },
        Action::DeleteJob(j) => Command::DeleteJob {
            jid: job(*j)?,
            reason: reason(),
        },
        Action::DeleteBatch(b) => Command::DeleteBatch {
            bid: batch(*b)?,
            reason: reason(),
        },
        Action::UpdateReporting(b) => Command::UpdateReporting {
            bid: batch(*b)?,
            reason: reason(),
        },
        Action::Report(b, err) => Command::ReportBatch {
            bid: batch(*b)?,
            notification_error: err.then(|| "smtp down".to_string()),
        },
        Action::Cleanup => Command::Cleanup { before: None },
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn every_projected_tree_keeps_the_invariants_and_matches_the_state(
        actions in prop::collection::vec(action(), 1..90)
    ) {
        let mut h = MemHarness::default();
        let mut projector = Projector::new();
        let mut mirror = Tree::new();
        let init = projector.init().expect("init");
        mirror.apply_all(&init.ops).expect("base nodes");
        let mut acquired = std::collections::BTreeSet::new();
        for a in &actions {
            let before = h.records.len();
            if let Some(cmd) = command(&mut h, a) {
                // Rejected commands append nothing, as in the engine.
                let _ = h.run(&cmd);
            }
            let new: Vec<_> = h.records[before..].to_vec();
            for r in &new {
                if let (Event::BatchAcquired(_), StreamId::Batch(b)) = (&r.event, r.envelope.stream) {
                    acquired.insert(b);
                }
                let ops = projector.project(r).map_err(|e| TestCaseError::fail(format!("{a:?}: {e}")))?;
                if let Err(e) = mirror.apply_all(&ops.ops) {
                    return Err(TestCaseError::fail(format!("{} ({a:?}): invalid op: {e}", r.event.describe())));
                }
                prop_assert_eq!(&mirror, projector.tree());
                if let Err(e) = check_invariants(projector.state(), projector.tree()) {
                    return Err(TestCaseError::fail(format!("after {} ({a:?}): {e}", r.event.describe())));
                }
                if let Some(m) = oracle_mismatch(projector.state(), &acquired, projector.tree()) {
                    return Err(TestCaseError::fail(format!("after {} ({a:?}):\n{m}", r.event.describe())));
                }
            }
        }
    }
}

/// The generator reaches deep states: without this, a weak generator could
/// make the property above pass vacuously.
#[test]
fn the_generator_reaches_completed_jobs_reports_and_cleanups() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..64 {
        let actions = prop::collection::vec(action(), 60..90)
            .new_tree(&mut runner)
            .expect("tree")
            .current();
        let mut h = MemHarness::default();
        for a in &actions {
            if let Some(cmd) = command(&mut h, a) {
                let _ = h.run(&cmd);
            }
        }
        for r in &h.records {
            seen.insert(r.event.kind());
            if let Event::JobStatusChanged(e) = &r.event {
                seen.insert(e.to.name());
            }
        }
    }
    for kind in [
        "BatchReported",
        "BatchCleanedUp",
        "JobDeleted",
        "Completed",
        "Storing",
        "CollectionHeld",
        "BatchHeld",
    ] {
        assert!(
            seen.contains(kind),
            "the generator never produced {kind}: {seen:?}"
        );
    }
}
