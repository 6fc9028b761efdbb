use super::provision::{used_percent, DfProbe, FixedProbe};
use super::*;
use std::path::Path;

fn job(state: JobState) -> JobCtx {
    JobCtx::detached(ingest_events::Jid(1), state, 5)
}

fn report(r: StepResult) -> Outcome {
    match r {
        StepResult::Report(o) => o,
        StepResult::Wait(w) => panic!("waits: {w}"),
    }
}

#[test]
fn capacity_counts_reserved_blocks_as_df_does() {
    // 100 blocks, 42 used, nothing reserved: 42%.
    assert_eq!(used_percent(100, 58, 58), 42.0);
    // 100 blocks, 40 used, 60 free of which 20 are reserved for root:
    // df says 40 / (40 + 40) = 50%.
    assert_eq!(used_percent(100, 60, 40), 50.0);
    assert_eq!(used_percent(100, 100, 100), 0.0);
    assert_eq!(used_percent(0, 0, 0), 0.0);
    let here = DfProbe.used_percent(Path::new("/")).expect("statvfs /");
    assert!((0.0..=100.0).contains(&here), "{here}");
    assert!(DfProbe.used_percent(Path::new("/no/such/dir")).is_err());
}

#[test]
fn the_rng_is_deterministic() {
    let a = Rng::new(7);
    let b = Rng::new(7);
    for _ in 0..10 {
        assert_eq!(a.next_u64(), b.next_u64());
    }
    assert!((0.0..1.0).contains(&a.unit()));
}

#[tokio::test]
async fn faults_fail_the_next_job_once_and_rates_apply() {
    let probe = Arc::new(FixedProbe::new(10.0));
    let steps = Steps::simulated(SimSettings::default(), Some(1), probe, 70.0, "/".into());
    steps.faults.fail_next(JobState::Storing);
    let storing = steps.get(JobState::Storing).expect("step");
    assert!(!report(storing.run(&job(JobState::Storing)).await).success);
    let ok = report(storing.run(&job(JobState::Storing)).await);
    assert!(ok.success);
    assert!(ok.store.is_some());
    let always = Simulate::new(
        SimSettings {
            duration: Duration::ZERO,
            failure_rate: 1.0,
        },
        Arc::new(Rng::new(3)),
        Faults::default(),
    );
    assert!(!report(always.run(&job(JobState::Processing)).await).success);
}

/// The simulated provisioning step at a 70 % threshold, measuring with
/// `probe`.
fn provisioning(probe: &FixedProbe) -> Arc<dyn Step> {
    Steps::simulated(
        SimSettings::default(),
        Some(1),
        Arc::new(probe.clone()),
        70.0,
        "/".into(),
    )
    .get(JobState::Provisioning)
    .expect("step")
}

#[tokio::test]
async fn provisioning_waits_while_storage_is_full() {
    let probe = FixedProbe::new(95.0);
    let step = provisioning(&probe);
    let j = job(JobState::Provisioning);
    assert!(matches!(step.run(&j).await, StepResult::Wait(_)));
    probe.set(50.0);
    assert!(report(step.run(&j).await).success);
}

/// Regression (issue 15 item 5): provisioning looked only at the fill
/// level, so a 30 MB job passed on an empty 20 MiB working storage and
/// failed in Downloading. It waits while the job needs more than there
/// is.
#[tokio::test]
async fn provisioning_waits_while_the_job_needs_more_than_is_free() {
    let probe = FixedProbe::new(1.0);
    probe.set_available(20 * 1024 * 1024);
    let step = provisioning(&probe);
    let mut j = job(JobState::Provisioning);
    j.space_needed = Some(30_000_000);
    match step.run(&j).await {
        StepResult::Wait(why) => assert!(why.contains("needs 30000000"), "{why}"),
        other => panic!("a 30 MB job passed on 20 MiB: {other:?}"),
    }
    probe.set_available(64 * 1024 * 1024);
    assert!(report(step.run(&j).await).success);
}
