use super::chain::report;
use super::lister::{backlog_delay, batch_ids, job_items, MAX_BACKLOG_DELAY};
use super::lock::lock_path;
use super::*;
use ingest_protocol::api::{JobMoved, SessionId, WorkerRef};
use ingest_protocol::endpoint::StartJob;
use ingest_protocol::fence::FenceSecret;

#[test]
fn daemons_map_to_their_queues() {
    assert_eq!(
        Target::of(DaemonKind::BatchPending),
        Some(Target::PendingBatches)
    );
    assert_eq!(
        Target::of(DaemonKind::Downloading),
        Some(Target::Jobs(JobState::Downloading))
    );
    assert_eq!(
        lock_path(ItemId::Batch(Bid(1))),
        "/batches/bid0000000001/lock"
    );
    assert_eq!(lock_path(ItemId::Job(Jid(1))), "/jobs/jid0000000001/lock");
}

fn shared(engine: &str) -> Shared {
    use crate::step::{FixedProbe, SimSettings};
    Shared::new(
        "w".into(),
        Arc::new(Session::new(ingest_projections::ZkConfig::new(
            "127.0.0.1:1".to_string(),
        ))),
        EngineClient::new(engine, "token").expect("client"),
        Steps::simulated(
            SimSettings::default(),
            Some(1),
            Arc::new(FixedProbe::new(0.0)),
            90.0,
            "/".into(),
        ),
        &[(DaemonKind::JobPending, 1), (DaemonKind::Estimating, 1)],
        Rng::new(1),
    )
}

/// `jidN` or `bidN` as the id of job or batch N.
fn id(short: &str) -> ItemId {
    let n = |p: &str| short.strip_prefix(p).and_then(|n| n.parse().ok());
    match (n("jid"), n("bid")) {
        (Some(j), _) => ItemId::Job(Jid(j)),
        (_, Some(b)) => ItemId::Batch(Bid(b)),
        _ => panic!("{short} is no short id"),
    }
}

fn items(ids: &[&str]) -> Vec<Item> {
    ids.iter()
        .map(|short| Item {
            id: id(short),
            priority: 5,
            since: None,
        })
        .collect()
}

/// Several batch-pending tasks: a batch one of them acquired is still
/// in the listing until the lister reads `/batches` again, and must
/// not cost another task a lock, a read and a release.
#[test]
fn a_job_whose_chain_ended_here_is_not_locked_again_from_a_stale_listing() {
    let shared = shared("http://127.0.0.1:1");
    let target = Target::Jobs(JobState::Estimating);
    let queue = items(&["jid1"]);
    let first = shared.pick(target, &queue).expect("jid1");
    shared.settle(target, first.id, Tried::Done);
    shared.linger(target, first.id);
    // The estimating queue's last listing still shows jid1, which the
    // chain has carried on to Completed.
    assert!(shared.pick(target, &queue).is_err());
    assert!(shared
        .pick(target, &items(&["jid1", "jid2"]))
        .is_ok_and(|i| i.id == id("jid2")));
}

#[test]
fn a_batch_acquired_here_is_not_picked_again_from_a_stale_listing() {
    let shared = shared("http://127.0.0.1:1");
    let queue = items(&["bid1", "bid2"]);
    let first = shared.pick(Target::PendingBatches, &queue).expect("bid1");
    assert_eq!(first.id, id("bid1"));
    // What `locked` does when the acquire was accepted.
    shared
        .acquired
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(Bid(1));
    shared.settle(Target::PendingBatches, id("bid1"), Tried::Done);
    let next = shared.pick(Target::PendingBatches, &queue).expect("bid2");
    assert_eq!(next.id, id("bid2"), "bid1 is acquired");
    shared.settle(Target::PendingBatches, id("bid2"), Tried::Done);
    assert!(shared
        .pick(Target::PendingBatches, &items(&["bid1"]))
        .is_err());
    // Job queues are not filtered by batches.
    assert!(shared
        .pick(Target::Jobs(JobState::Pending), &items(&["bid1"]))
        .is_ok());
}

/// Regression: the batch-pending daemon stopped at the first batch it
/// could not take, so one held or refused batch kept every later batch
/// Pending. An item that could not be taken is now backed off from by
/// itself and the next one is picked.
#[test]
fn an_item_that_cannot_be_taken_does_not_hold_up_the_next() {
    let shared = shared("http://127.0.0.1:1");
    let queue = items(&["bid1", "bid2", "bid3"]);
    let first = shared.pick(Target::PendingBatches, &queue).expect("bid1");
    assert_eq!(first.id, id("bid1"), "batches are taken oldest first");
    // In hand: another task takes the next.
    let second = shared.pick(Target::PendingBatches, &queue).expect("bid2");
    assert_eq!(second.id, id("bid2"));
    shared.settle(Target::PendingBatches, id("bid1"), Tried::Refused);
    shared.settle(Target::PendingBatches, id("bid2"), Tried::Done);
    // bid1 backs off; bid2 was dealt with (and would have left the
    // listing); the next pick is bid2 again only because the listing
    // still shows it, else bid3.
    let next = shared
        .pick(Target::PendingBatches, &items(&["bid1", "bid3"]))
        .expect("bid3");
    assert_eq!(next.id, id("bid3"));
    shared.settle(Target::PendingBatches, id("bid3"), Tried::Skipped);
    // Everything backs off: the answer is when to look again.
    let wait = shared
        .pick(Target::PendingBatches, &items(&["bid1", "bid3"]))
        .expect_err("nothing to take now");
    assert!(wait.is_some());
}

/// A job that just entered the queue of a state after Pending is in
/// another worker's chain: it is no candidate until it has stayed
/// there for CHAIN_GRACE. Pending jobs are candidates at once.
#[test]
fn a_job_just_seen_after_pending_waits_out_the_chain_grace() {
    let shared = shared("http://127.0.0.1:1");
    let now = Instant::now();
    let fresh = Item {
        id: id("jid1"),
        priority: 5,
        since: Some(now),
    };
    let wait = shared
        .pick(
            Target::Jobs(JobState::Estimating),
            std::slice::from_ref(&fresh),
        )
        .expect_err("too fresh");
    assert!(wait.is_some_and(|t| t >= now + CHAIN_GRACE));
    assert!(shared
        .pick(
            Target::Jobs(JobState::Pending),
            std::slice::from_ref(&fresh)
        )
        .is_ok_and(|i| i.id == id("jid1")));
    let old = Item {
        id: id("jid2"),
        priority: 5,
        since: now.checked_sub(CHAIN_GRACE * 2),
    };
    assert!(shared
        .pick(Target::Jobs(JobState::Estimating), &[fresh, old])
        .is_ok_and(|i| i.id == id("jid2")));
}

/// The random spread over the head of a queue never takes a job of a
/// lower priority while one of a higher is free.
/// A worker's batch-pending task that lost the race for a batch's lock
/// backs off from it; when the batch ends and the engine names it to
/// this worker for reporting, its reporting task takes it at once.
#[test]
fn a_pending_back_off_does_not_hold_up_the_report_of_the_same_batch() {
    let shared = shared("http://127.0.0.1:1");
    let batch = items(&["bid1"]);
    let tried = shared.pick(Target::PendingBatches, &batch).expect("bid1");
    shared.settle(Target::PendingBatches, tried.id, Tried::Skipped);
    assert!(
        shared.pick(Target::PendingBatches, &batch).is_err(),
        "the pending daemon backs off"
    );
    let reporting = Target::ReportingBatches("Reporting");
    let item = shared
        .pick(reporting, &batch)
        .expect("the reporting daemon is not held back by it");
    assert_eq!(item.id, id("bid1"));
    shared.settle(reporting, item.id, Tried::Done);
}

#[test]
fn the_spread_stays_within_the_first_priority() {
    let shared = shared("http://127.0.0.1:1");
    let target = Target::Jobs(JobState::Pending);
    let mut queue = items(&["jid1", "jid2"]);
    queue[0].priority = 1;
    queue[1].priority = 2;
    for _ in 0..20 {
        let item = shared.pick(target, &queue).expect("jid1");
        assert_eq!(item.id, id("jid1"));
        shared.settle(target, item.id, Tried::Done);
    }
}

/// A long job queue is listed less often; short ones and batches are not
/// delayed.
#[test]
fn a_long_queue_is_listed_less_often() {
    let pending = Target::Jobs(JobState::Pending);
    assert_eq!(backlog_delay(pending, 0), Duration::ZERO);
    assert_eq!(backlog_delay(pending, 50), Duration::from_millis(50));
    assert_eq!(backlog_delay(pending, 100_000), MAX_BACKLOG_DELAY);
    assert_eq!(backlog_delay(Target::PendingBatches, 1000), Duration::ZERO);
}

/// Chaining goes on only through the states whose daemon runs here.
#[test]
fn a_worker_knows_which_states_it_serves() {
    let shared = shared("http://127.0.0.1:1");
    assert!(shared.runs.contains(&JobState::Pending));
    assert!(shared.runs.contains(&JobState::Estimating));
    assert!(!shared.runs.contains(&JobState::Provisioning));
    assert!(shared.reports.is_empty());
}

/// Regression: why a job waited (a full working storage, an unreadable
/// one) was logged only at DEBUG, so jobs waited silently; now at INFO,
/// once per reason.
#[tokio::test]
async fn a_wait_is_logged_once_per_reason() {
    let shared = shared("http://127.0.0.1:1");
    let full = "working storage /w is 95.0% full (threshold 70%)";
    assert!(shared.note_waiting(Jid(1), JobState::Provisioning, full));
    assert!(!shared.note_waiting(Jid(1), JobState::Provisioning, full));
    assert!(shared.note_waiting(Jid(2), JobState::Provisioning, full));
    let gone = "cannot measure /w: No such file or directory";
    assert!(shared.note_waiting(Jid(1), JobState::Provisioning, gone));
    shared.done_waiting(Jid(1));
    assert!(shared.note_waiting(Jid(1), JobState::Provisioning, gone));
}

/// A report's answer is read as its route's type: an accepted report is
/// counted, a 409 is a refusal, and a 2xx answer of another shape is an
/// error rather than an acceptance.
#[tokio::test]
async fn reports_read_typed_answers() {
    use axum::http::StatusCode;
    use axum::routing::post;
    use ingest_protocol::api::{ErrorBody, ErrorDetail};
    let moved = JobMoved {
        jid: "jid1".into(),
        status: "Estimating".into(),
        batch_status: "Processing".into(),
        bid: "bid1".into(),
        events: Vec::new(),
    };
    let app = axum::Router::new()
        .route(
            "/jobs/jid0000000001/start",
            post(move |axum::Json(who): axum::Json<WorkerRef>| {
                let moved = moved.clone();
                async move {
                    assert_eq!(who.worker, "w");
                    assert_eq!(who.session_id, SessionId(7));
                    axum::Json(moved)
                }
            }),
        )
        .route(
            "/jobs/jid0000000002/start",
            post(|| async {
                let refused = ErrorBody {
                    error: ErrorDetail {
                        code: "lock_not_held".into(),
                        message: "nobody holds it".into(),
                        ..ErrorDetail::default()
                    },
                };
                (StatusCode::CONFLICT, axum::Json(refused))
            }),
        )
        .route(
            "/jobs/jid0000000003/start",
            post(|| async {
                axum::Json(ingest_protocol::api::FaultsView {
                    armed: Default::default(),
                })
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    let shared = shared(&format!("http://{addr}"));
    let who = WorkerRef {
        worker: "w".into(),
        session_id: SessionId(7),
    };
    let fence = FenceSecret::from_bytes([3; 32]);
    let tried = report(&shared, &StartJob(Jid(1)), &fence, &who).await;
    assert_eq!(tried.ok().map(|t| t.0), Some(Tried::Done));
    let tried = report(&shared, &StartJob(Jid(2)), &fence, &who).await;
    assert_eq!(tried.ok().map(|t| t.0), Some(Tried::Refused));
    let tried = report(&shared, &StartJob(Jid(3)), &fence, &who).await;
    assert!(
        tried.is_err(),
        "an answer of another shape is not an acceptance"
    );
    assert_eq!(shared.stats.accepted.load(Ordering::Relaxed), 1);
    assert_eq!(shared.stats.refused.load(Ordering::Relaxed), 1);
}

/// Names another ZooKeeper client wrote into a queue or under `/batches`
/// are checked at the door: only a priority and a job id, or a batch id,
/// become items.
#[test]
fn listed_names_that_are_not_ids_are_left_out() {
    let names: Vec<String> = [
        "05-jid0000000002",
        "05-jid0000000001",
        "05-x",
        "jid0000000003",
        "xx-jid0000000004",
        "05-jid0000000000",
        "05-jid00000000011",
        "05-../../../x",
    ]
    .map(String::from)
    .to_vec();
    let items = job_items(&names);
    let ids: Vec<(ItemId, u8)> = items.iter().map(|i| (i.id, i.priority)).collect();
    assert_eq!(ids, [(ItemId::Job(Jid(2)), 5), (ItemId::Job(Jid(1)), 5)]);
    let bids = batch_ids(
        [
            "bid0000000001",
            ".ingest-id",
            "bid1",
            "bid0000000002",
            "jid0000000001",
        ]
        .map(String::from)
        .to_vec(),
    );
    assert_eq!(bids, [Bid(1), Bid(2)]);
}
