//! The engine service: concurrent callers share group commits, state is
//! published only once durable, and shutdown answers every queued command.

use std::sync::Arc;

use ingest_engine::engine::{Engine, EngineConfig};
use ingest_engine::service::{EngineService, ServiceError};
use ingest_events::command::Command;
use ingest_events::event::{Erc, PayloadType, Submission, SubmissionMode};
use ingest_events::Actor;

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
            let out = h
                .execute(
                    Actor::depositor("d"),
                    Command::SubmitBatch {
                        uuid: uuid::Uuid::new_v4(),
                        submission: submission(n),
                    },
                )
                .await
                .expect("submit");
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
