//! The writer's role as the replication controller sees it.

use ingest_engine::{Engine, EngineConfig, EngineService, ReplicationError, Replicator};

/// Acknowledges every write (a medium that never fails).
struct Accepting;

impl Replicator for Accepting {
    fn replicate(&mut self, _frames: &[Vec<u8>]) -> Result<(), ReplicationError> {
        Ok(())
    }
}

/// When `set_role` returns, `leading()` already shows the new role. The
/// controller watches `leading` right after taking the lead and steps down
/// when it reads false; a role published only after the reply made a fresh
/// leader step down at once on a loaded machine (seen in CI).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_new_role_is_published_before_set_role_returns() {
    let dir = tempfile::tempdir().expect("tmp");
    let engine = Engine::open(EngineConfig::new(dir.path().join("data"))).expect("open");
    let service = EngineService::start_replicated(engine);
    let service = service.handle();
    let leading = service.leading();
    for round in 0..200 {
        service
            .set_role(Some(Box::new(Accepting)))
            .await
            .expect("lead");
        assert!(*leading.borrow(), "round {round}: still shown as following");
        service.set_role(None).await.expect("follow");
        assert!(!*leading.borrow(), "round {round}: still shown as leading");
    }
}
