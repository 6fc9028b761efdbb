//! Collection holds through a real `ingest serve` with its in-process
//! workers and a real ZooKeeper (issue 26).
//!
//! - a batch submitted to a held collection goes Held at acquisition; once
//!   the collection is released it is acquired and completes without a
//!   restart (D1: the worker had put it among its acquired batches for
//!   good, so it stayed Pending until the worker restarted);
//! - `history --collection C` shows C's own holds and releases beside its
//!   batches' and jobs' events (D5).

use serde_json::Value;

use crate::server::{eventually, start, Server, ADMIN};
use crate::util::ingest_remote;
use crate::zk_server::{shared, unique_root};

/// The batch `bid` once its status is `status`.
async fn batch_in(s: &Server, bid: &str, status: &str, secs: u64) -> Value {
    eventually(&format!("batch {bid} to be {status}"), secs, async || {
        let batch = s.get(&format!("/batches/{bid}")).await;
        (batch["status"] == status).then_some(batch)
    })
    .await
}

/// `ingest ARGS` as the admin through the server.
fn admin(s: &Server, args: &[&str]) -> crate::util::Run {
    tokio::task::block_in_place(|| ingest_remote(&s.base, &[("INGEST_ADMIN_TOKEN", ADMIN)], args))
}

// D1: a batch released from a collection hold stayed Pending until the
// worker restarted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_released_from_a_collection_hold_is_acquired_and_completes() {
    let zk_server = shared();
    let hosts = zk_server.hosts();
    let root = unique_root("holds-release");
    let dir = tempfile::tempdir().expect("tempdir");
    let s = start(dir.path(), &hosts, &root, Some(&[]));
    admin(&s, &["collection", "held", "hold", "--reason", "migration"]).ok();
    let bid = s.submit_to("held", 2).await;
    batch_in(&s, &bid, "Held", 60).await;
    // Another collection's batch goes through meanwhile: the workers run.
    let other = s.submit_to("demo", 1).await;
    batch_in(&s, &other, "Completed", 60).await;
    assert_eq!(s.get(&format!("/batches/{bid}")).await["status"], "Held");

    admin(&s, &["collection", "held", "release", "--reason", "done"]).ok();
    let batch = batch_in(&s, &bid, "Completed", 60).await;
    assert_eq!(
        batch["successful_jobs"].as_array().map(Vec::len),
        Some(2),
        "{batch}"
    );

    // A second hold and release of the same collection: the workers follow
    // the batch again.
    admin(&s, &["collection", "held", "hold", "--reason", "again"]).ok();
    let second = s.submit_to("held", 1).await;
    batch_in(&s, &second, "Held", 60).await;
    admin(&s, &["collection", "held", "release", "--reason", "done"]).ok();
    batch_in(&s, &second, "Completed", 60).await;

    // D5: the collection's history has its own holds and releases.
    let run = admin(&s, &["history", "--collection", "held", "--format", "json"]).ok();
    let rows: Value = serde_json::from_str(&run.stdout).expect("history JSON");
    let events: Vec<&str> = rows
        .as_array()
        .expect("events")
        .iter()
        .filter_map(|r| r["event"].as_str())
        .collect();
    let count = |e: &str| events.iter().filter(|x| **x == e).count();
    assert_eq!(count("CollectionHeld"), 2, "{events:?}");
    assert_eq!(count("CollectionReleased"), 2, "{events:?}");
    assert!(count("BatchHeld") >= 2, "{events:?}");
    // Another collection's history has none of them.
    let run = admin(&s, &["history", "--collection", "demo", "--format", "json"]).ok();
    assert!(!run.stdout.contains("CollectionHeld"), "{}", run.stdout);
}
