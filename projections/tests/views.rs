//! Reporting views folded from the scenarios' logs.

mod common;

use common::MemHarness;
use ingest_events::command::{Command, Target};
use ingest_events::{Bid, Jid};
use ingest_projections::views::{BatchView, QueueView};
use ingest_projections::Views;

fn views_of(name: &str) -> Views {
    let run = common::run_scenario(name);
    Views::from_records(&run.harness.records()).expect("fold")
}

#[test]
fn a_reported_batch_shows_its_jobs_timings_and_report() {
    let v = views_of("reporting.yaml");
    let b = v.batch(Bid(1)).expect("batch 1");
    assert_eq!(b.status, "Completed");
    assert_eq!(b.job_count, 2);
    assert_eq!(b.jobs_by_state.get("Completed"), Some(&2));
    assert_eq!(b.successful_jobs, ["jid0000000001", "jid0000000002"]);
    assert!(b.failed_jobs.is_empty());
    // Steps are one second apart: submitted at step 0, acquired at 1, the
    // last job completed (and the batch reached Reporting) at 17, reported
    // (Completed) at 18.
    let t = &b.timings;
    assert_eq!(t.submitted, common::time_of(0));
    assert_eq!(t.acquired, Some(common::time_of(1)));
    assert_eq!(t.reporting, Some(common::time_of(17)));
    assert_eq!(t.completed, Some(common::time_of(18)));
    assert_eq!(t.submitted_to_acquired_ms, Some(1_000));
    assert_eq!(t.acquired_to_reporting_ms, Some(16_000));
    assert_eq!(t.reporting_to_completed_ms, Some(1_000));
    assert_eq!(t.submitted_to_completed_ms, Some(18_000));
    let report = b.report.as_ref().expect("reported");
    assert!(!report.update);
    assert_eq!(report.successful_jobs.len(), 2);
    // Job 1 waited in Pending from step 1 to its start at step 2, then spent
    // one second in each step; job 2 waited until step 10.
    let j1 = &b.jobs[0];
    assert_eq!(j1.time_in_state_ms.get("Pending"), Some(&1_000));
    assert_eq!(j1.time_in_state_ms.get("Storing"), Some(&1_000));
    assert_eq!(j1.time_in_state_ms.get("Completed"), None);
    assert_eq!(j1.in_state_since, common::time_of(9));
    assert_eq!(b.jobs[1].time_in_state_ms.get("Pending"), Some(&9_000));

    let failed = v.batch(Bid(2)).expect("batch 2");
    assert_eq!(failed.status, "Failed");
    assert_eq!(failed.failed_jobs, ["jid0000000004"]);
    assert!(failed.report.as_ref().expect("reported").update);
}

#[test]
fn retries_count_requeues_and_step_retries() {
    let v = views_of("requeue.yaml");
    let b = v.batch(Bid(1)).expect("batch");
    assert_eq!(b.retries.requeues, 3);
    assert_eq!(b.retries.step_retries, 0);
    let v = views_of("job-data.yaml");
    assert_eq!(v.batch(Bid(1)).expect("batch").retries.step_retries, 1);
}

#[test]
fn the_queue_view_counts_live_jobs_by_state_and_priority() {
    let v = views_of("priority-change.yaml");
    let q: QueueView = v.queue();
    assert_eq!(q.jobs.len(), 12, "every state is listed");
    assert_eq!(q.live_jobs, 2);
    assert_eq!(q.jobs["Provisioning"].total, 1);
    assert_eq!(q.jobs["Provisioning"].by_priority.get("02"), Some(&1));
    assert_eq!(q.jobs["Failed"].by_priority.get("99"), Some(&1));
    assert_eq!(q.jobs["Pending"].total, 0);
    assert_eq!(q.batches_by_state.get("Processing"), Some(&1));

    let v = views_of("cleanup.yaml");
    let q = v.queue();
    assert_eq!(q.live_jobs, 1, "cleaned-up jobs leave the queues");
    assert!(v.batch(Bid(1)).expect("history is kept").cleaned_up);
}

#[test]
fn the_collection_view_shows_holds_and_counts() {
    let mut h = MemHarness::default();
    let a = h.submit("alpha");
    h.acquire(a, 2);
    h.ok(Command::HoldCollection {
        profile: "alpha".into(),
        reason: "audit".into(),
    });
    h.ok(Command::StartJob { jid: Jid(1) });
    let b = h.submit("beta");
    h.acquire(b, 1);
    h.set(Jid(3), Target::Fail);
    h.ok(Command::PauseQueue {
        reason: "maintenance".into(),
    });
    let v = Views::from_records(&h.records).expect("fold");
    let alpha = v.collection("alpha").expect("alpha");
    assert!(alpha.held);
    assert_eq!(alpha.jobs_by_state.get("Held"), Some(&1));
    assert_eq!(alpha.jobs_by_state.get("Pending"), Some(&1));
    assert_eq!(alpha.batches, ["bid0000000001"]);
    let beta = v.collection("beta").expect("beta");
    assert!(!beta.held);
    assert_eq!(beta.batches_by_state.get("Reporting"), Some(&1));
    assert_eq!(v.collections().len(), 2);
    assert!(v.collection("gamma").is_none());
    let q = v.queue();
    assert!(q.paused);
    assert_eq!(q.held_collections, ["alpha"]);
}

#[test]
fn views_serialize_as_json_and_yaml_and_are_deterministic() {
    let run = common::run_scenario("job-lifecycle.yaml");
    let records = run.harness.records();
    let first = Views::from_records(&records).expect("fold");
    let second = Views::from_records(&records).expect("fold");
    let json = serde_json::to_string_pretty(&first.batches()).expect("json");
    assert_eq!(
        json,
        serde_json::to_string_pretty(&second.batches()).expect("json")
    );
    let back: Vec<BatchView> = serde_json::from_str(&json).expect("round trip");
    assert_eq!(back, first.batches());
    let yaml = serde_norway::to_string(&first.queue()).expect("yaml");
    let back: QueueView = serde_norway::from_str(&yaml).expect("round trip");
    assert_eq!(back, first.queue());
    assert!(json.contains("\"bid\": \"bid0000000001\""), "{json}");
    let yaml = serde_norway::to_string(&first.collections()).expect("yaml");
    assert!(yaml.contains("profile: demo_content"), "{yaml}");
}
