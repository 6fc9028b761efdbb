//! History queries (`--since/--until`, `--actor`, `--collection`, a batch or
//! a job) answered from the log's indexes give exactly what a full scan of
//! the log filtered the same way gives, on generated logs; old logs get
//! their indexes at open; a repair keeps them whole.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use chrono::{DateTime, Duration, TimeZone, Utc};
use ingest_engine::history::{query, HistoryQuery, Scope};
use ingest_events::event::{
    Actor, Erc, Event, Identifiers, JobConfiguration, JobCreated, JobStatusChanged, PayloadType,
    Submission, SubmissionMode,
};
use ingest_events::lifecycle::JobState;
use ingest_events::log::{AppendRequest, Log, LogConfig, Proposed};
use ingest_events::{Bid, Jid, Recorded, StreamId};
use proptest::prelude::*;
use uuid::Uuid;

const ACTORS: [&str; 4] = ["admin:alice", "worker:w1", "worker:w2", "engine"];
const COLLECTIONS: [&str; 3] = ["demo", "ucb_lib", "cdl_dryad"];

fn actor(i: u8) -> Actor {
    ACTORS[i as usize % ACTORS.len()].parse().expect("actor")
}

fn open(dir: &Path) -> Log {
    Log::open(
        dir,
        &LogConfig {
            cache_capacity: 4 * 1024 * 1024,
            ..LogConfig::default()
        },
    )
    .expect("open the log")
}

fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 1, 0, 0, 0)
        .single()
        .expect("time")
}

fn submitted(collection: &str) -> Event {
    Event::BatchSubmitted(ingest_events::event::BatchSubmitted {
        uuid: Uuid::new_v4(),
        submission: Submission {
            profile_name: collection.into(),
            submitter: "alice".into(),
            payload_url: "https://example.org/p".into(),
            payload_type: PayloadType::File,
            response_type: "json".into(),
            submission_mode: SubmissionMode::Add,
            manifest: vec![],
            erc: Erc::default(),
            digest: None,
            extra: Default::default(),
        },
    })
}

fn created(bid: Bid, collection: &str) -> Event {
    Event::JobCreated(JobCreated {
        bid,
        priority: 5,
        configuration: JobConfiguration {
            profile_name: collection.into(),
            submitter: "alice".into(),
            payload_url: "https://example.org/p".into(),
            payload_type: PayloadType::File,
            response_type: "json".into(),
            submission_mode: SubmissionMode::Add,
            digest: None,
        },
        identifiers: Identifiers::default(),
        metadata: Erc::default(),
    })
}

fn moved() -> Event {
    Event::JobStatusChanged(JobStatusChanged {
        from: JobState::Pending,
        to: JobState::Estimating,
        message: "m".into(),
        retry: false,
        priority: None,
    })
}

/// One generated command: who, how many seconds after the previous one, and
/// what it does (`kind` picks: a new batch, a new job, events on existing
/// streams).
#[derive(Debug, Clone)]
struct Op {
    actor: u8,
    seconds: u8,
    kind: u8,
    pick: u16,
    events: u8,
}

fn op() -> impl Strategy<Value = Op> {
    (0u8..4, 0u8..3, 0u8..6, any::<u16>(), 1u8..4).prop_map(
        |(actor, seconds, kind, pick, events)| Op {
            actor,
            seconds,
            kind,
            pick,
            events,
        },
    )
}

/// The batches (with their jobs and collection) a generated log holds.
#[derive(Default)]
struct Built {
    batches: BTreeMap<Bid, (String, Vec<Jid>)>,
    jobs: Vec<Jid>,
}

/// Writes the generated commands, some in one group (one sled batch), as the
/// engine's group commit does.
fn build(log: &Log, ops: &[Op]) -> Built {
    let mut b = Built::default();
    let mut time = t0();
    let mut group = log.begin_group();
    for op in ops {
        time += Duration::seconds(i64::from(op.seconds));
        let events: Vec<Proposed> = match op.kind {
            0 => {
                let bid = Bid(b.batches.len() as u64 + 1);
                let c = COLLECTIONS[op.pick as usize % COLLECTIONS.len()];
                b.batches.insert(bid, (c.to_string(), Vec::new()));
                vec![Proposed {
                    stream: StreamId::Batch(bid),
                    event: submitted(c),
                }]
            }
            1 if !b.batches.is_empty() => {
                let bid = *b
                    .batches
                    .keys()
                    .nth(op.pick as usize % b.batches.len())
                    .expect("a batch");
                let mut out = Vec::new();
                for _ in 0..op.events {
                    let jid = Jid(b.jobs.len() as u64 + 1);
                    b.jobs.push(jid);
                    let (c, jobs) = b.batches.get_mut(&bid).expect("batch");
                    jobs.push(jid);
                    out.push(Proposed {
                        stream: StreamId::Job(jid),
                        event: created(bid, c),
                    });
                }
                out
            }
            _ if !b.jobs.is_empty() => (0..op.events)
                .map(|n| Proposed {
                    stream: StreamId::Job(
                        b.jobs[(op.pick as usize + n as usize * 7) % b.jobs.len()],
                    ),
                    event: moved(),
                })
                .collect(),
            _ => vec![Proposed {
                stream: StreamId::System,
                event: Event::QueuePaused(ingest_events::event::QueuePaused { reason: "r".into() }),
            }],
        };
        group
            .stage(&AppendRequest {
                actor: actor(op.actor),
                correlation_id: Uuid::new_v4(),
                timestamp: time,
                expectations: vec![],
                events,
            })
            .expect("stage")
            .expect("no conflict");
        if op.pick % 5 == 0 {
            let last = group.commit().expect("commit");
            if let Some(last) = last {
                log.wait_durable(last).expect("flush");
            }
            group = log.begin_group();
        }
    }
    if let Some(last) = group.commit().expect("commit") {
        log.wait_durable(last).expect("flush");
    }
    b
}

/// The answer by scanning every record and filtering: what the indexes must equal.
fn scanned(log: &Log, scope: &Scope, q: &HistoryQuery) -> Vec<u64> {
    let records: Vec<Recorded> = log
        .read_range(1, log.durable_position())
        .collect::<Result<_, _>>()
        .expect("read the log");
    let mut collection_of: BTreeMap<StreamId, String> = BTreeMap::new();
    for r in &records {
        match &r.event {
            Event::BatchSubmitted(e) => {
                collection_of.insert(r.envelope.stream, e.submission.profile_name.clone());
            }
            Event::JobCreated(e) => {
                collection_of.insert(r.envelope.stream, e.configuration.profile_name.clone());
            }
            _ => {}
        }
    }
    let in_scope: Option<BTreeSet<StreamId>> = match scope {
        Scope::Log => None,
        Scope::Batch(bid, jobs) => Some(
            std::iter::once(StreamId::Batch(*bid))
                .chain(jobs.iter().map(|j| StreamId::Job(*j)))
                .collect(),
        ),
        Scope::Job(jid) => Some([StreamId::Job(*jid)].into()),
    };
    records
        .iter()
        .filter(|r| {
            let e = &r.envelope;
            q.since.is_none_or(|t| e.timestamp >= t)
                && q.until.is_none_or(|t| e.timestamp < t)
                && q.actor.as_ref().is_none_or(|a| *a == e.actor)
                && q.collection
                    .as_ref()
                    .is_none_or(|c| collection_of.get(&e.stream) == Some(c))
                && in_scope.as_ref().is_none_or(|s| s.contains(&e.stream))
        })
        .map(|r| r.envelope.position)
        .collect()
}

fn indexed(log: &Log, scope: &Scope, q: &HistoryQuery) -> (Vec<u64>, bool) {
    let (rows, truncated) = query(log, scope, q).expect("query");
    (rows.iter().map(|r| r.position).collect(), truncated)
}

/// A query from generated numbers: each filter on or off.
fn make_query(built: &Built, f: (u8, u16, u16, u8, u8, u16)) -> (Scope, HistoryQuery) {
    let (mask, since, until, a, c, s) = f;
    let scope = match (mask >> 4) % 3 {
        1 if !built.batches.is_empty() => {
            let (bid, (_, jobs)) = built
                .batches
                .iter()
                .nth(s as usize % built.batches.len())
                .expect("a batch");
            Scope::Batch(*bid, jobs.clone())
        }
        2 if !built.jobs.is_empty() => Scope::Job(built.jobs[s as usize % built.jobs.len()]),
        _ => Scope::Log,
    };
    let q = HistoryQuery {
        since: (mask & 1 != 0).then(|| t0() + Duration::seconds(i64::from(since % 120))),
        until: (mask & 2 != 0).then(|| t0() + Duration::seconds(i64::from(until % 120))),
        actor: (mask & 4 != 0).then(|| actor(a)),
        collection: (mask & 8 != 0)
            .then(|| COLLECTIONS[c as usize % COLLECTIONS.len()].to_string()),
        ..HistoryQuery::default()
    };
    (scope, q)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn indexed_answers_equal_a_filtered_scan(
        ops in proptest::collection::vec(op(), 1..80),
        queries in proptest::collection::vec((any::<u8>(), any::<u16>(), any::<u16>(), any::<u8>(), any::<u8>(), any::<u16>()), 12),
    ) {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = open(dir.path());
        let built = build(&log, &ops);
        prop_assert!(log.audit_index_problems().expect("check").is_empty());
        for f in queries {
            let (scope, q) = make_query(&built, f);
            let expected = scanned(&log, &scope, &q);
            let (got, truncated) = indexed(&log, &scope, &q);
            prop_assert_eq!(&got, &expected, "{:?} {:?}", scope, q);
            prop_assert!(!truncated);
            // A limit gives the first rows and says more matched.
            if expected.len() > 1 {
                let limit = expected.len() / 2;
                let (got, truncated) = indexed(&log, &scope, &HistoryQuery { limit: Some(limit), ..q.clone() });
                prop_assert_eq!(&got[..], &expected[..limit]);
                prop_assert!(truncated);
            }
        }
    }
}

/// Removes the audit indexes and their marker, as a log written before them.
fn strip_indexes(log: &Log) {
    let tree = log.raw_tree();
    let mut batch = sled::Batch::default();
    for item in tree.iter() {
        let (k, _) = item.expect("read");
        if matches!(k[0], b'a' | b'c' | b'x') {
            batch.remove(k);
        }
    }
    tree.apply_batch(batch).expect("strip");
    log.wait_durable(0).expect("flush");
}

#[test]
fn an_old_log_gets_its_indexes_at_open() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ops: Vec<Op> = (0..60u16)
        .map(|i| Op {
            actor: (i % 3) as u8,
            seconds: (i % 2) as u8,
            kind: (i % 6) as u8,
            pick: i * 13,
            events: (i % 3 + 1) as u8,
        })
        .collect();
    // Every actor alone, every collection alone.
    let queries: Vec<HistoryQuery> = (0..ACTORS.len() as u8)
        .map(|a| HistoryQuery {
            actor: Some(actor(a)),
            ..HistoryQuery::default()
        })
        .chain(COLLECTIONS.iter().map(|c| HistoryQuery {
            collection: Some(c.to_string()),
            ..HistoryQuery::default()
        }))
        .collect();
    let before: Vec<Vec<u64>> = {
        let log = open(dir.path());
        build(&log, &ops);
        let before: Vec<Vec<u64>> = queries
            .iter()
            .map(|q| indexed(&log, &Scope::Log, q).0)
            .collect();
        strip_indexes(&log);
        assert!(!log.audit_index_problems().expect("check").is_empty());
        before
    };
    assert!(before.iter().filter(|b| !b.is_empty()).count() >= 4);
    let log = open(dir.path());
    assert_eq!(
        log.audit_index_problems().expect("check"),
        Vec::<String>::new()
    );
    for (q, before) in queries.iter().zip(&before) {
        let after = indexed(&log, &Scope::Log, q).0;
        assert_eq!(&after, before, "{q:?}");
        assert_eq!(after, scanned(&log, &Scope::Log, q), "{q:?}");
    }
}

#[test]
fn a_repaired_tail_leaves_no_index_entry_behind() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ops: Vec<Op> = (0..40u16)
        .map(|i| Op {
            actor: (i % 2) as u8,
            seconds: 1,
            kind: (i % 4) as u8,
            pick: i * 7 + 1,
            events: 2,
        })
        .collect();
    let head = {
        let log = open(dir.path());
        build(&log, &ops);
        let head = log.head().0;
        // Tear the last three records.
        for p in head - 2..=head {
            log.raw_tree()
                .insert(Log::raw_event_key(p), b"torn".to_vec())
                .expect("tear");
        }
        log.wait_durable(0).expect("flush");
        head
    };
    let log = open(dir.path());
    assert!(log.needs_repair().is_some());
    log.repair_tail().expect("repair");
    assert_eq!(log.head().0, head - 3);
    assert_eq!(
        log.audit_index_problems().expect("check"),
        Vec::<String>::new()
    );
    // Appending after the repair starts a fresh run and stays whole.
    log.append(&AppendRequest {
        actor: actor(0),
        correlation_id: Uuid::new_v4(),
        timestamp: Utc::now(),
        expectations: vec![],
        events: vec![Proposed {
            stream: StreamId::Batch(Bid(999)),
            event: submitted("demo"),
        }],
    })
    .expect("append")
    .expect("no conflict");
    assert_eq!(
        log.audit_index_problems().expect("check"),
        Vec::<String>::new()
    );
}
