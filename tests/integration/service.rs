//! The engine service: concurrent callers share group commits, state is
//! published only once durable, and shutdown answers every queued command.

use std::sync::Arc;

use ingest_engine::engine::Outcome;
use ingest_engine::engine::{Engine, EngineConfig};
use ingest_engine::service::{EngineHandle, EngineService, ServiceError};
use ingest_events::command::Command;
use ingest_events::event::{Erc, PayloadType, Submission, SubmissionMode};
use ingest_events::Actor;

/// A depositor's submission of batch `n`, executed.
async fn submit(h: &EngineHandle, n: usize) -> Outcome {
    h.execute(
        Actor::depositor("d"),
        Command::SubmitBatch {
            uuid: uuid::Uuid::new_v4(),
            submission: submission(n),
        },
    )
    .await
    .expect("submit")
}

fn submission(n: usize) -> Submission {
    Submission {
        profile_name: "demo".into(),
        submitter: format!("depositor{n}"),
        payload_url: format!("https://example.org/{n}"),
        payload_type: PayloadType::File,
        response_type: "json".into(),
        submission_mode: SubmissionMode::Add,
        manifest: vec![],
        erc: Erc::default(),
        digest: None,
        extra: Default::default(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_commands_all_land_durably_and_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let service = EngineService::start(Engine::open(EngineConfig::new(dir.path())).unwrap());
    let handle = service.handle();
    let mut tasks = Vec::new();
    for n in 0..200 {
        let h = handle.clone();
        tasks.push(tokio::spawn(async move {
            let out = submit(&h, n).await;
            let pos = out.records[0].envelope.position;
            // Published state includes the command once it is answered.
            assert!(h.state().position >= pos);
            assert!(h.log().durable_position() >= pos);
            pos
        }));
    }
    let mut positions = Vec::new();
    for t in tasks {
        positions.push(t.await.unwrap());
    }
    positions.sort_unstable();
    assert_eq!(positions, (1..=200).collect::<Vec<u64>>());
    assert_eq!(handle.state().batches.len(), 200);

    // A refused command is answered with the rejection and appends nothing.
    let err = handle
        .execute(
            Actor::admin("a"),
            Command::ReleaseJob {
                jid: ingest_events::Jid(9),
                reason: String::new(),
            },
        )
        .await
        .unwrap_err();
    assert!(matches!(err, ServiceError::Engine(_)), "{err:?}");
    assert_eq!(handle.log().head().0, 200);

    let log = Arc::clone(handle.log());
    service.shutdown().await;
    let err = handle
        .execute(
            Actor::admin("a"),
            Command::PauseQueue {
                reason: String::new(),
            },
        )
        .await
        .unwrap_err();
    assert!(matches!(err, ServiceError::Stopped), "{err:?}");
    assert!(log.verify(|_| {}).unwrap().problems.is_empty());
}

/// Issue 10: the engine keeps the batches in a reporting status in an index
/// beside its published state (the workers' reporting sweep reads it), and
/// rebuilds it when it starts over a log that has such batches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reporting_index_follows_each_batch_and_survives_a_restart() {
    use ingest_events::command::{JobSpec, Target};
    use ingest_events::event::{PayloadType, StreamId};
    use ingest_events::lifecycle::{BatchState, JobState};
    let dir = tempfile::tempdir().unwrap();
    let admin = || Actor::admin("alice");
    let service = EngineService::start(Engine::open(EngineConfig::new(dir.path())).unwrap());
    let h = service.handle();
    let listed =
        |h: &EngineHandle, status| h.reporting_batches(status, 10).expect("a reporting status");
    let mut bids = Vec::new();
    for n in 0..3 {
        let out = submit(&h, n).await;
        let StreamId::Batch(bid) = out.records[0].envelope.stream else {
            panic!("a batch stream");
        };
        bids.push(bid);
    }
    // The first two batches fail their only job: they enter Reporting.
    for bid in &bids[..2] {
        let out = h
            .execute(
                Actor::worker("w"),
                Command::AcquireBatch {
                    bid: *bid,
                    jobs: vec![JobSpec {
                        payload_url: "https://example.org/x".into(),
                        payload_type: PayloadType::File,
                        identifiers: Default::default(),
                        metadata: Erc::default(),
                        digest: None,
                        priority: None,
                    }],
                },
            )
            .await
            .expect("acquire");
        let jid = out
            .records
            .iter()
            .find_map(|r| match r.envelope.stream {
                StreamId::Job(jid) => Some(jid),
                _ => None,
            })
            .expect("a job");
        h.execute(Actor::worker("w"), Command::StartJob { jid })
            .await
            .expect("start");
        h.execute(
            admin(),
            Command::SetJobStatus {
                jid,
                target: Target::To(JobState::Failed),
                message: "forced".into(),
                priority: None,
            },
        )
        .await
        .expect("fail");
    }
    assert_eq!(
        listed(&h, BatchState::Reporting),
        (bids[..2].to_vec(), false)
    );
    assert_eq!(
        h.reporting_batches(BatchState::Reporting, 1),
        Some((bids[..1].to_vec(), true)),
        "the limit, and more"
    );
    assert_eq!(h.reporting_batches(BatchState::Pending, 10), None);
    h.execute(
        Actor::worker("w"),
        Command::ReportBatch {
            bid: bids[0],
            notification_error: None,
        },
    )
    .await
    .expect("report");
    h.execute(
        admin(),
        Command::UpdateReporting {
            bid: bids[0],
            reason: "again".into(),
        },
    )
    .await
    .expect("update-reporting");
    assert_eq!(listed(&h, BatchState::Reporting), (vec![bids[1]], false));
    assert_eq!(
        listed(&h, BatchState::UpdateReporting),
        (vec![bids[0]], false)
    );
    service.shutdown().await;
    drop(h);

    // Started again over the same log: the index is built from the state.
    let service = EngineService::start(Engine::open(EngineConfig::new(dir.path())).unwrap());
    let h = service.handle();
    assert_eq!(listed(&h, BatchState::Reporting), (vec![bids[1]], false));
    assert_eq!(
        listed(&h, BatchState::UpdateReporting),
        (vec![bids[0]], false)
    );
    h.execute(
        Actor::worker("w"),
        Command::ReportBatch {
            bid: bids[1],
            notification_error: None,
        },
    )
    .await
    .expect("report");
    assert_eq!(listed(&h, BatchState::Reporting), (Vec::new(), false));
    service.shutdown().await;
}
