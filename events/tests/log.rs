//! Integration tests of the sled event log ([`ingest_events::log::Log`]):
//! atomic appends, optimistic concurrency, reads, the live tail, group commit,
//! the hash chain (`verify`), tail repair and the one-process lock.
//!
//! Fault injection goes through the raw tree (`Log::raw_tree`,
//! `Log::raw_event_key`): the tests damage stored records the way a bad disk
//! or an interrupted write would, then check what the log reports.

use std::future::Future;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command as Process, Stdio};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread;
use std::time::{Duration, Instant};

use chrono::Utc;
use ingest_events::codec::{encode_for_fixture, GENESIS_HASH};
use ingest_events::command::{decide, Command, JobSpec, Target};
use ingest_events::event::{
    Actor, BatchHeld, BatchSubmitted, Erc, Event, Identifiers, PayloadType, QueuePaused,
    Submission, SubmissionMode,
};
use ingest_events::ids::{Bid, Jid};
use ingest_events::lifecycle::Lifecycle;
use ingest_events::log::{
    AppendRequest, Appended, Conflict, ExpectedVersion, Log, LogConfig, LogError, Proposed,
};
use ingest_events::{Recorded, State, StreamId};
use uuid::Uuid;

/// How long a test waits for a condition before it fails (never a sleep).
const DEADLINE: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

fn config() -> LogConfig {
    // Small cache: many tests run in parallel.
    LogConfig {
        cache_capacity: 8 * 1024 * 1024,
        ..LogConfig::default()
    }
}

/// Opens the log, waiting (up to [`DEADLINE`]) for a handle this process
/// dropped to let go of the directory.
///
/// sled 0.34 releases its `flock` on `<dir>/db` only when its I/O threads drop
/// their last reference to the file, shortly *after* the last `Db` handle is
/// dropped (spacejam/sled#1289), so an immediate re-open in the same process
/// can fail with `Locked`.
fn open(dir: &Path) -> Log {
    let deadline = Instant::now() + DEADLINE;
    let mut pause = Duration::from_millis(1);
    loop {
        match Log::open(dir, &config()) {
            Ok(log) => return log,
            Err(LogError::Locked { .. }) if Instant::now() < deadline => {
                // Nothing to wait on: sled gives no signal when it lets go.
                thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(50));
            }
            Err(e) => panic!("open log at {}: {e}", dir.display()),
        }
    }
}

fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir().expect("create a temporary directory")
}

fn submission(n: u64) -> Submission {
    Submission {
        profile_name: "demo_content".into(),
        submitter: "alice".into(),
        payload_url: format!("https://example.org/object-{n}.zip"),
        payload_type: PayloadType::Container,
        response_type: "json".into(),
        submission_mode: SubmissionMode::Add,
        manifest: vec![],
        erc: Erc::default(),
        digest: None,
        extra: Default::default(),
    }
}

fn spec(n: u64) -> JobSpec {
    JobSpec {
        payload_url: format!("https://example.org/file-{n}.pdf"),
        payload_type: PayloadType::File,
        identifiers: Identifiers::default(),
        metadata: Erc::default(),
        digest: None,
        priority: None,
    }
}

/// A plain event for tests that only care about the log, not the fold.
fn note(text: impl Into<String>) -> Event {
    Event::BatchHeld(BatchHeld {
        reason: text.into(),
    })
}

fn proposed(stream: StreamId, event: Event) -> Proposed {
    Proposed { stream, event }
}

fn request(events: Vec<Proposed>, expectations: Vec<(StreamId, ExpectedVersion)>) -> AppendRequest {
    AppendRequest {
        actor: Actor::admin("test"),
        correlation_id: Uuid::new_v4(),
        timestamp: Utc::now(),
        expectations,
        events,
    }
}

/// Appends and insists on success.
fn append(log: &Log, req: &AppendRequest) -> Appended {
    match log.append(req) {
        Ok(Ok(a)) => a,
        Ok(Err(c)) => panic!("unexpected conflict: {c}"),
        Err(e) => panic!("append failed: {e}"),
    }
}

/// Appends `n` one-event commands on batch streams 1..=n (one stream each).
fn append_notes(log: &Log, n: u64) -> Vec<Appended> {
    (1..=n)
        .map(|i| {
            append(
                log,
                &request(
                    vec![proposed(StreamId::Batch(Bid(i)), note(format!("n{i}")))],
                    vec![],
                ),
            )
        })
        .collect()
}

fn read_all(log: &Log) -> Vec<Recorded> {
    log.read_range(1, u64::MAX)
        .collect::<Result<_, _>>()
        .expect("read the whole log")
}

/// Decides commands against a folded state and appends them, like the engine.
struct Driver {
    log: Log,
    state: State,
    lifecycle: Lifecycle,
}

impl Driver {
    fn new(log: Log) -> Driver {
        Driver {
            log,
            state: State::new(),
            lifecycle: Lifecycle::builtin(),
        }
    }

    fn run(&mut self, command: Command) -> Appended {
        let decision = decide(&self.state, &self.lifecycle, &command)
            .unwrap_or_else(|r| panic!("{command:?} rejected: {r}"));
        let appended = append(&self.log, &request(decision.events, decision.expectations));
        for r in &appended.records {
            self.state
                .apply(r)
                .unwrap_or_else(|e| panic!("fold of {r:?}: {e}"));
        }
        appended
    }
}

/// Replaces a stored record's bytes, as a bad disk or a tool would.
fn overwrite(log: &Log, position: u64, bytes: Vec<u8>) {
    log.raw_tree()
        .insert(Log::raw_event_key(position), bytes)
        .expect("raw insert");
    log.raw_tree().flush().expect("raw flush");
}

fn raw(log: &Log, position: u64) -> Vec<u8> {
    log.raw_tree()
        .get(Log::raw_event_key(position))
        .expect("raw get")
        .unwrap_or_else(|| panic!("no record at {position}"))
        .to_vec()
}

/// Flips one byte in the middle of the stored record at `position`.
fn flip_byte(log: &Log, position: u64) {
    let mut bytes = raw(log, position);
    let i = bytes.len() / 2;
    bytes[i] ^= 0x5a;
    overwrite(log, position, bytes);
}

fn problem_positions(log: &Log) -> Vec<u64> {
    let report = log.verify(|_| {}).expect("verify");
    report.problems.iter().map(|p| p.position).collect()
}

/// Runs a future to completion on this thread, parking between polls; `None`
/// when the deadline passes first. The log's live tail is a tokio `watch`
/// channel, and this crate needs no runtime to follow it.
fn block_on_until<F: Future>(fut: F, deadline: Instant) -> Option<F::Output> {
    struct Unpark(thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut fut = std::pin::pin!(fut);
    loop {
        if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
            return Some(v);
        }
        let now = Instant::now();
        if now >= deadline {
            return None;
        }
        thread::park_timeout(deadline - now);
    }
}

// ---------------------------------------------------------------------------
// Appends
// ---------------------------------------------------------------------------

#[test]
fn one_event_is_appended_durable_and_read_back_as_returned() {
    let dir = tempdir();
    let log = open(dir.path());
    assert_eq!(log.head(), (0, GENESIS_HASH));
    assert_eq!(log.durable_position(), 0);

    let stream = StreamId::Batch(Bid(1));
    let event = Event::BatchSubmitted(BatchSubmitted {
        uuid: Uuid::new_v4(),
        submission: submission(1),
    });
    let a = append(
        &log,
        &request(
            vec![proposed(stream, event.clone())],
            vec![(stream, ExpectedVersion::NoStream)],
        ),
    );

    assert_eq!(a.positions, 1..=1);
    let r = &a.records[0];
    assert_eq!(r.event, event);
    assert_eq!(r.envelope.position, 1);
    assert_eq!(r.envelope.stream, stream);
    assert_eq!(r.envelope.version, 1);
    assert_eq!(r.envelope.prev_hash, GENESIS_HASH);
    assert_eq!(log.head(), (1, r.envelope.hash));
    assert!(
        log.durable_position() >= 1,
        "append returned before its flush"
    );
    assert_eq!(&log.read_one(1).expect("read 1"), r);
    assert_eq!(log.stream_version(stream).expect("version"), 1);
}

#[test]
fn a_multi_event_command_is_appended_as_one_gap_free_run() {
    let dir = tempdir();
    let mut d = Driver::new(open(dir.path()));
    let submitted = d.run(Command::SubmitBatch {
        uuid: Uuid::new_v4(),
        submission: submission(1),
    });
    // One command, four streams: BatchAcquired and a JobCreated per job.
    let acquired = d.run(Command::AcquireBatch {
        bid: Bid(1),
        jobs: (1..=3).map(spec).collect(),
    });

    assert_eq!(submitted.positions, 1..=1);
    assert_eq!(acquired.positions, 2..=5);
    let kinds: Vec<_> = acquired.records.iter().map(|r| r.event.kind()).collect();
    assert_eq!(
        kinds,
        ["BatchAcquired", "JobCreated", "JobCreated", "JobCreated"]
    );
    // One correlation id, one timestamp, a chain through the run.
    let first = &acquired.records[0].envelope;
    let mut prev = submitted.records[0].envelope.hash;
    for r in &acquired.records {
        assert_eq!(r.envelope.correlation_id, first.correlation_id);
        assert_eq!(r.envelope.timestamp, first.timestamp);
        assert_eq!(r.envelope.prev_hash, prev);
        prev = r.envelope.hash;
    }
    let versions: Vec<_> = acquired
        .records
        .iter()
        .map(|r| (r.envelope.stream, r.envelope.version))
        .collect();
    assert_eq!(
        versions,
        [
            (StreamId::Batch(Bid(1)), 2),
            (StreamId::Job(Jid(1)), 1),
            (StreamId::Job(Jid(2)), 1),
            (StreamId::Job(Jid(3)), 1),
        ]
    );
    assert_eq!(read_all(&d.log)[1..], acquired.records[..]);
    assert_eq!(d.state.jobs.len(), 3);
}

#[test]
fn positions_stay_gap_free_across_commands_and_reopens() {
    let dir = tempdir();
    let mut next = 1;
    for round in 0..3u64 {
        let log = open(dir.path());
        assert_eq!(log.head().0, next - 1, "round {round}: head after reopen");
        for size in 1..=4u64 {
            let events = (0..size)
                .map(|i| proposed(StreamId::Batch(Bid(100 * round + i + 1)), note("x")))
                .collect();
            let a = append(&log, &request(events, vec![]));
            assert_eq!(a.positions, next..=next + size - 1);
            next += size;
        }
    }
    let log = open(dir.path());
    let positions: Vec<u64> = read_all(&log).iter().map(|r| r.envelope.position).collect();
    assert_eq!(positions, (1..next).collect::<Vec<_>>());
}

#[test]
fn an_empty_command_writes_nothing_but_still_checks_expectations() {
    let dir = tempdir();
    let log = open(dir.path());
    append_notes(&log, 2);
    let a = append(&log, &request(vec![], vec![]));
    assert!(a.positions.is_empty(), "{:?}", a.positions);
    assert!(a.records.is_empty());
    assert_eq!(log.head().0, 2);

    let stream = StreamId::Batch(Bid(1));
    let conflict = log
        .append(&request(vec![], vec![(stream, ExpectedVersion::NoStream)]))
        .expect("no I/O error");
    assert!(conflict.is_err(), "{conflict:?}");
}

#[test]
fn a_stale_expected_version_is_a_conflict_and_appends_nothing() {
    let dir = tempdir();
    let log = open(dir.path());
    let a = StreamId::Batch(Bid(1));
    let b = StreamId::Batch(Bid(2));
    append(
        &log,
        &request(
            vec![proposed(a, note("a1")), proposed(a, note("a2"))],
            vec![(a, ExpectedVersion::NoStream)],
        ),
    );
    let head = log.head();

    let cases = [
        (
            vec![(a, ExpectedVersion::NoStream)],
            Conflict {
                stream: a,
                expected: ExpectedVersion::NoStream,
                actual: 2,
            },
        ),
        (
            vec![(a, ExpectedVersion::Exact(1))],
            Conflict {
                stream: a,
                expected: ExpectedVersion::Exact(1),
                actual: 2,
            },
        ),
        (
            vec![(b, ExpectedVersion::Exact(3))],
            Conflict {
                stream: b,
                expected: ExpectedVersion::Exact(3),
                actual: 0,
            },
        ),
        // The first expectation holds, the second does not: still nothing.
        (
            vec![
                (a, ExpectedVersion::Exact(2)),
                (b, ExpectedVersion::Exact(1)),
            ],
            Conflict {
                stream: b,
                expected: ExpectedVersion::Exact(1),
                actual: 0,
            },
        ),
    ];
    for (expectations, want) in cases {
        let req = request(
            vec![proposed(a, note("a3")), proposed(b, note("b1"))],
            expectations.clone(),
        );
        let got = log.append(&req).expect("no I/O error");
        assert_eq!(got, Err(want.clone()), "expectations {expectations:?}");
        assert!(want.to_string().contains(&want.actual.to_string()));
        assert_eq!(log.head(), head, "a conflict appended something");
        assert_eq!(log.stream_version(a).expect("version"), 2);
        assert_eq!(log.stream_version(b).expect("version"), 0);
    }

    // The same command with the right expectations goes through.
    let ok = append(
        &log,
        &request(
            vec![proposed(a, note("a3")), proposed(b, note("b1"))],
            vec![
                (a, ExpectedVersion::Exact(2)),
                (b, ExpectedVersion::NoStream),
                (a, ExpectedVersion::Any),
            ],
        ),
    );
    assert_eq!(ok.positions, 3..=4);
}

#[test]
fn timestamps_never_go_backwards() {
    let dir = tempdir();
    let log = open(dir.path());
    let later = append_notes(&log, 1)[0].records[0].envelope.timestamp;
    let mut req = request(vec![proposed(StreamId::System, note("old"))], vec![]);
    req.timestamp = later - chrono::Duration::hours(1);
    let a = append(&log, &req);
    assert_eq!(a.records[0].envelope.timestamp, later);
    assert_eq!(log.read_one(2).expect("read 2").envelope.timestamp, later);
}

// ---------------------------------------------------------------------------
// Reads
// ---------------------------------------------------------------------------

#[test]
fn reads_by_range_by_stream_and_from_a_position() {
    let dir = tempdir();
    let log = open(dir.path());
    let a = StreamId::Batch(Bid(1));
    let b = StreamId::Job(Jid(7));
    // Interleave two streams: a b a b a ...
    let mut written = Vec::new();
    for i in 0..10u64 {
        let s = if i % 2 == 0 { a } else { b };
        written.extend(
            append(
                &log,
                &request(vec![proposed(s, note(format!("{i}")))], vec![]),
            )
            .records,
        );
    }

    let range: Vec<Recorded> = log
        .read_range(3, 6)
        .collect::<Result<_, _>>()
        .expect("range");
    assert_eq!(range, written[2..6]);
    // Clamped to the head; position 0 reads from 1; an empty range is empty.
    assert_eq!(
        log.read_range(0, 1000).count(),
        10,
        "range past the head is clamped"
    );
    assert_eq!(log.read_range(7, 3).count(), 0);
    assert_eq!(log.read_range(11, 20).count(), 0);

    let from: Vec<Recorded> = log.read_from(8).collect::<Result<_, _>>().expect("from");
    assert_eq!(from, written[7..]);

    let stream_b = log.read_stream(b).expect("stream b");
    let want: Vec<Recorded> = written
        .iter()
        .filter(|r| r.envelope.stream == b)
        .cloned()
        .collect();
    assert_eq!(stream_b, want);
    let versions: Vec<u64> = stream_b.iter().map(|r| r.envelope.version).collect();
    assert_eq!(versions, [1, 2, 3, 4, 5]);
    assert!(log
        .read_stream(StreamId::Job(Jid(8)))
        .expect("empty stream")
        .is_empty());
}

#[test]
fn read_from_shows_only_durable_records() {
    let dir = tempdir();
    let log = open(dir.path());
    append_notes(&log, 2);
    let pending = log
        .append_unflushed(&request(
            vec![proposed(StreamId::System, note("p"))],
            vec![],
        ))
        .expect("append")
        .expect("no conflict");
    assert_eq!(pending.positions, 3..=3);
    // Written but not yet acknowledged: the live tail must not show it.
    assert_eq!(log.durable_position(), 2);
    assert_eq!(log.read_from(1).count(), 2);
    log.wait_durable(3).expect("flush");
    assert_eq!(log.read_from(1).count(), 3);
}

// ---------------------------------------------------------------------------
// The live tail and group commit
// ---------------------------------------------------------------------------

#[test]
fn live_tail_subscribers_see_every_event_in_order_while_a_writer_appends() {
    const COMMANDS: u64 = 150;
    let dir = tempdir();
    let log = open(dir.path());
    // Some history before the readers start: they must not miss it either.
    let mut written = append_notes(&log, 5)
        .into_iter()
        .flat_map(|a| a.records)
        .collect::<Vec<_>>();
    let total = 5 + (0..COMMANDS).map(|i| 1 + i % 3).sum::<u64>();

    let mut rx = log.subscribe();
    let deadline = Instant::now() + DEADLINE;
    let (watched, waited, appended) = thread::scope(|s| {
        // Reader 1: the watch channel, as an async projector would use it.
        let watcher = s.spawn(|| {
            let mut seen = Vec::new();
            let mut next = 1;
            loop {
                let upto = *rx.borrow_and_update();
                for r in log.read_range(next, upto) {
                    seen.push(r.expect("tail read"));
                    next += 1;
                }
                if next > total {
                    return seen;
                }
                block_on_until(rx.changed(), deadline)
                    .expect("the tail made no progress before the deadline")
                    .expect("the log dropped its sender");
            }
        });
        // Reader 2: blocking `wait_beyond`, for synchronous followers.
        let waiter = s.spawn(|| {
            let mut seen = Vec::new();
            let mut next = 1;
            while next <= total {
                assert!(Instant::now() < deadline, "wait_beyond made no progress");
                let upto = log.wait_beyond(next - 1, Duration::from_secs(1));
                for r in log.read_range(next, upto) {
                    seen.push(r.expect("tail read"));
                    next += 1;
                }
            }
            seen
        });
        let writer = s.spawn(|| {
            let mut out = Vec::new();
            for i in 0..COMMANDS {
                let events = (0..1 + i % 3)
                    .map(|k| proposed(StreamId::Job(Jid(i * 3 + k + 1)), note(format!("c{i}e{k}"))))
                    .collect();
                out.extend(append(&log, &request(events, vec![])).records);
            }
            out
        });
        (
            watcher.join().expect("watcher"),
            waiter.join().expect("waiter"),
            writer.join().expect("writer"),
        )
    });
    written.extend(appended);
    assert_eq!(written.len() as u64, total);
    assert_eq!(watched, written, "watch subscriber");
    assert_eq!(waited, written, "wait_beyond follower");
}

#[test]
fn concurrent_appenders_all_return_durable_with_gap_free_positions() {
    const THREADS: u64 = 8;
    const PER_THREAD: u64 = 25;
    let dir = tempdir();
    let log = open(dir.path());
    let per_thread: Vec<Vec<Appended>> = thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let log = &log;
                s.spawn(move || {
                    // Each thread owns one stream and checks its version.
                    let stream = StreamId::Job(Jid(t + 1));
                    (0..PER_THREAD)
                        .map(|i| {
                            let expected = match i * 2 {
                                0 => ExpectedVersion::NoStream,
                                v => ExpectedVersion::Exact(v),
                            };
                            let a = append(
                                log,
                                &request(
                                    vec![
                                        proposed(stream, note(format!("t{t}i{i}a"))),
                                        proposed(stream, note(format!("t{t}i{i}b"))),
                                    ],
                                    vec![(stream, expected)],
                                ),
                            );
                            let durable = log.durable_position();
                            assert!(
                                durable >= *a.positions.end(),
                                "append returned {:?} with durable position {durable}",
                                a.positions
                            );
                            a
                        })
                        .collect()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("appender"))
            .collect()
    });

    let total = THREADS * PER_THREAD * 2;
    let mut positions: Vec<u64> = Vec::new();
    for appends in &per_thread {
        // A thread's own appends come back in increasing positions.
        for w in appends.windows(2) {
            assert!(w[0].positions.end() < w[1].positions.start());
        }
        positions.extend(appends.iter().flat_map(|a| a.positions.clone()));
    }
    positions.sort_unstable();
    assert_eq!(positions, (1..=total).collect::<Vec<_>>());
    assert_eq!(log.durable_position(), total);

    let report = log.verify(|_| {}).expect("verify");
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    assert_eq!(report.events_checked, total);

    // Reopen: every acknowledged record is on disk.
    let head = log.head();
    drop(log);
    let log = open(dir.path());
    assert_eq!(log.head(), head);
    assert_eq!(read_all(&log).len() as u64, total);
}

/// Group commit, observed without a flush counter (the log exposes none):
/// appends written by several threads before anyone waits are all made
/// durable by the first `wait_durable`, i.e. by one flush.
#[test]
fn one_flush_covers_every_append_written_before_it() {
    let dir = tempdir();
    let log = open(dir.path());
    let mut rx = log.subscribe();
    let ends: Vec<u64> = thread::scope(|s| {
        let handles: Vec<_> = (0..4u64)
            .map(|t| {
                let log = &log;
                s.spawn(move || {
                    let a = log
                        .append_unflushed(&request(
                            vec![proposed(StreamId::Job(Jid(t + 1)), note("w"))],
                            vec![],
                        ))
                        .expect("append")
                        .expect("no conflict");
                    *a.positions.end()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("writer"))
            .collect()
    });
    assert_eq!(log.durable_position(), 0, "nothing waited, nothing flushed");
    assert!(!rx.has_changed().expect("sender alive"));

    let first = *ends.iter().min().expect("four writers");
    log.wait_durable(first).expect("flush");
    // The one flush started after all four writes, so it covered all of them.
    assert_eq!(log.durable_position(), 4);
    assert_eq!(*rx.borrow_and_update(), 4);
    for end in ends {
        log.wait_durable(end).expect("already durable");
    }
    assert!(
        !rx.has_changed().expect("sender alive"),
        "the later waits flushed again though everything was durable"
    );
}

// ---------------------------------------------------------------------------
// The hash chain
// ---------------------------------------------------------------------------

#[test]
fn verify_accepts_a_good_log_and_reports_its_head() {
    let dir = tempdir();
    let mut d = Driver::new(open(dir.path()));
    for n in 1..=3 {
        d.run(Command::SubmitBatch {
            uuid: Uuid::new_v4(),
            submission: submission(n),
        });
        d.run(Command::AcquireBatch {
            bid: Bid(n),
            jobs: vec![spec(n)],
        });
    }
    d.run(Command::StartJob { jid: Jid(2) });
    d.run(Command::SetJobStatus {
        jid: Jid(2),
        target: Target::Success,
        message: String::new(),
        priority: Some(3),
    });
    let (head, head_hash) = d.log.head();
    assert_eq!(head, 11);

    let mut progress = Vec::new();
    let report = d.log.verify(|p| progress.push(p)).expect("verify");
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    assert_eq!(report.events_checked, head);
    assert_eq!(report.head_position, head);
    assert_eq!(report.head_hash, head_hash);
    assert_eq!(report.head_hash, d.state.head_hash);
    assert_eq!(report.index_entries_checked, head);
    assert_eq!(progress, (1..=head).collect::<Vec<_>>());

    // The chain survives a reopen and folds to the same state.
    let Driver { log, state, .. } = d;
    drop(log);
    let log = open(dir.path());
    assert_eq!(log.head(), (head, head_hash));
    assert_eq!(log.needs_repair(), None);
    let mut folded = State::new();
    for r in read_all(&log) {
        folded.apply(&r).expect("fold");
    }
    assert_eq!(folded, state);
}

#[test]
fn verify_of_an_empty_log() {
    let dir = tempdir();
    let log = open(dir.path());
    let report = log.verify(|_| {}).expect("verify");
    assert!(report.problems.is_empty());
    assert_eq!(
        (
            report.events_checked,
            report.head_position,
            report.head_hash
        ),
        (0, 0, GENESIS_HASH)
    );
}

#[test]
fn verify_reports_a_flipped_byte_in_the_middle_by_position() {
    let dir = tempdir();
    let log = open(dir.path());
    append_notes(&log, 10);
    flip_byte(&log, 5);

    match log.read_one(5) {
        Err(LogError::Corrupt { position: 5, .. }) => {}
        other => panic!("read_one(5) = {other:?}"),
    }
    let range: Vec<_> = log.read_range(4, 6).collect();
    assert!(range[0].is_ok() && range[2].is_ok(), "{range:?}");
    assert!(
        matches!(range[1], Err(LogError::Corrupt { position: 5, .. })),
        "{range:?}"
    );
    // Every note is on its own stream, so the damage is exactly one problem.
    let report = log.verify(|_| {}).expect("verify");
    assert_eq!(
        report
            .problems
            .iter()
            .map(|p| p.position)
            .collect::<Vec<_>>(),
        [5],
        "{:?}",
        report.problems
    );
    assert_eq!(report.events_checked, 10);
    assert_eq!(report.head_position, 10);
}

#[test]
fn verify_reports_a_well_formed_record_that_breaks_the_chain() {
    let dir = tempdir();
    let log = open(dir.path());
    let records: Vec<Recorded> = append_notes(&log, 6)
        .into_iter()
        .flat_map(|a| a.records)
        .collect();
    // A record re-encoded with a forged previous hash: it decodes and its own
    // hash matches, only the link to position 3 is wrong.
    let mut forged = records[3].envelope.clone();
    forged.prev_hash = [7; 32];
    let (bytes, _) = encode_for_fixture(&forged, &records[3].event);
    overwrite(&log, 4, bytes);
    assert!(log.read_one(4).is_ok(), "the forged record decodes");

    let report = log.verify(|_| {}).expect("verify");
    let positions: Vec<u64> = report.problems.iter().map(|p| p.position).collect();
    assert!(positions.contains(&4), "{:?}", report.problems);
    assert!(
        report
            .problems
            .iter()
            .any(|p| p.message.contains("previous-hash")),
        "{:?}",
        report.problems
    );
}

#[test]
fn verify_reports_records_swapped_out_of_order() {
    let dir = tempdir();
    let log = open(dir.path());
    append_notes(&log, 6);
    let (three, four) = (raw(&log, 3), raw(&log, 4));
    overwrite(&log, 3, four);
    overwrite(&log, 4, three);
    match log.read_one(3) {
        Err(LogError::Corrupt {
            position: 3,
            reason,
        }) => {
            assert!(reason.contains("claims position 4"), "{reason}")
        }
        other => panic!("read_one(3) = {other:?}"),
    }
    let positions = problem_positions(&log);
    assert!(
        positions.contains(&3) && positions.contains(&4),
        "{positions:?}"
    );
}

// ---------------------------------------------------------------------------
// Tail repair
// ---------------------------------------------------------------------------

#[test]
fn a_torn_tail_is_refused_until_repair_truncates_exactly_the_bad_records() {
    let dir = tempdir();
    let log = open(dir.path());
    let a = StreamId::Batch(Bid(1));
    append_notes(&log, 7);
    // The last command: three events, two of them on stream `a`.
    append(
        &log,
        &request(
            vec![
                proposed(StreamId::Job(Jid(1)), note("j")),
                proposed(a, note("a2")),
                proposed(a, note("a3")),
            ],
            vec![],
        ),
    );
    assert_eq!(log.head().0, 10);
    assert_eq!(log.stream_version(a).expect("version"), 3);
    let good_head = log.read_one(8).expect("read 8").envelope.hash;
    flip_byte(&log, 9);
    flip_byte(&log, 10);
    drop(log);

    let log = open(dir.path());
    let (first_bad, reason) = log.needs_repair().expect("the tail needs repair");
    assert_eq!(first_bad, 9, "{reason}");
    match log.append(&request(vec![proposed(a, note("refused"))], vec![])) {
        Err(LogError::NeedsRepair { position: 9, .. }) => {}
        other => panic!("append on a torn log = {other:?}"),
    }
    // Reads of the good part still work.
    assert_eq!(log.read_range(1, 8).filter(Result::is_ok).count(), 8);

    assert_eq!(log.repair_tail().expect("repair"), 9..=10);
    assert_eq!(log.needs_repair(), None);
    assert_eq!(log.head(), (8, good_head));
    assert_eq!(log.durable_position(), 8);
    // The truncated events' index entries are gone too.
    assert_eq!(log.stream_version(a).expect("version"), 1);
    assert_eq!(log.stream_version(StreamId::Job(Jid(1))).expect("v"), 1);
    assert_eq!(log.read_stream(a).expect("stream").len(), 1);

    // Appends resume on a valid chain and versions continue.
    let resumed = append(
        &log,
        &request(
            vec![proposed(a, note("after repair"))],
            vec![(a, ExpectedVersion::Exact(1))],
        ),
    );
    assert_eq!(resumed.positions, 9..=9);
    assert_eq!(resumed.records[0].envelope.prev_hash, good_head);
    assert_eq!(resumed.records[0].envelope.version, 2);
    let report = log.verify(|_| {}).expect("verify");
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    assert_eq!(report.events_checked, 9);
    drop(log);

    let log = open(dir.path());
    assert_eq!(log.needs_repair(), None);
    assert_eq!(log.head().0, 9);
}

#[test]
fn a_last_record_with_a_broken_link_is_a_torn_tail() {
    let dir = tempdir();
    let log = open(dir.path());
    let records: Vec<Recorded> = append_notes(&log, 5)
        .into_iter()
        .flat_map(|a| a.records)
        .collect();
    let mut forged = records[4].envelope.clone();
    forged.prev_hash = [1; 32];
    overwrite(&log, 5, encode_for_fixture(&forged, &records[4].event).0);
    drop(log);

    let log = open(dir.path());
    assert_eq!(log.needs_repair().map(|(p, _)| p), Some(5));
    assert_eq!(log.repair_tail().expect("repair"), 5..=5);
    assert_eq!(log.head(), (4, records[3].envelope.hash));
    append_notes(&log, 1);
    assert!(problem_positions(&log).is_empty());
}

#[test]
fn damage_followed_by_intact_records_is_not_repaired() {
    let dir = tempdir();
    let log = open(dir.path());
    append_notes(&log, 10);
    flip_byte(&log, 5);
    let head = log.head();
    drop(log);

    let log = open(dir.path());
    assert_eq!(log.needs_repair().map(|(p, _)| p), Some(5));
    match log.repair_tail() {
        Err(LogError::Unrepairable(msg)) => {
            assert!(
                msg.contains("position 5") && msg.contains("position 6"),
                "{msg}"
            )
        }
        other => panic!("repair of mid-log damage = {other:?}"),
    }
    // Nothing was removed, and appends stay refused.
    assert_eq!(log.head().0, head.0);
    assert_eq!(log.read_range(6, 10).filter(Result::is_ok).count(), 5);
    assert!(matches!(
        log.append(&request(
            vec![proposed(StreamId::System, note("x"))],
            vec![]
        )),
        Err(LogError::NeedsRepair { position: 5, .. })
    ));
    assert_eq!(problem_positions(&log), [5]);
}

#[test]
fn repair_of_a_good_log_is_refused() {
    let dir = tempdir();
    let log = open(dir.path());
    append_notes(&log, 3);
    assert!(matches!(log.repair_tail(), Err(LogError::Unrepairable(_))));
    assert_eq!(log.head().0, 3);
}

// ---------------------------------------------------------------------------
// One process per log
// ---------------------------------------------------------------------------

/// sled takes an exclusive `flock` on `<dir>/db`; a second open, even from the
/// same process, fails, and `Log::open` maps that failure to `Locked`.
#[test]
fn a_second_open_in_the_same_process_is_locked() {
    let dir = tempdir();
    let log = open(dir.path());
    append_notes(&log, 1);
    match Log::open(dir.path(), &config()) {
        Err(LogError::Locked { path }) => assert_eq!(path, dir.path()),
        Err(other) => panic!("second open failed with {other:?}, not Locked"),
        Ok(_) => panic!("the log opened twice in one process"),
    }
    // Closing the first handle releases the lock.
    drop(log);
    let log = open(dir.path());
    assert_eq!(log.head().0, 1);
}

const HOLDER_ENV: &str = "INGEST_LOG_HOLDER_CHILD";
const HOLDER_TEST: &str = "a_log_held_by_another_process_is_locked";

/// Kills the child on every exit path, so a failing test leaves no process behind.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Re-executes this test binary as a child that holds the log open until its
/// stdin closes (or a minute passes, should the parent vanish).
#[test]
fn a_log_held_by_another_process_is_locked() {
    if let Ok(dir) = std::env::var(HOLDER_ENV) {
        let log = open(Path::new(&dir));
        // On a line of its own: libtest has already printed "test NAME ... ".
        println!("\nOPEN {}", log.head().0);
        std::io::stdout().flush().expect("flush stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        thread::spawn(move || {
            let _ = std::io::stdin().lines().count();
            let _ = tx.send(());
        });
        let _ = rx.recv_timeout(Duration::from_secs(60));
        return;
    }

    let dir = tempdir();
    append_notes(&open(dir.path()), 2);
    let exe = std::env::current_exe().expect("current exe");
    let mut child = KillOnDrop(
        Process::new(&exe)
            .args([HOLDER_TEST, "--exact", "--nocapture", "--test-threads=1"])
            .env(HOLDER_ENV, dir.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", exe.display())),
    );
    let stdout = child.0.stdout.take().expect("child stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + DEADLINE;
    let opened = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) if line.starts_with("OPEN ") => break line,
            Ok(_) => {}
            Err(e) => panic!("the child did not report opening the log: {e}"),
        }
    };
    assert_eq!(opened, "OPEN 2");

    let second = Log::open(dir.path(), &config());
    let message = match &second {
        Err(e) => e.to_string(),
        Ok(_) => "opened".into(),
    };
    assert!(
        matches!(second, Err(LogError::Locked { .. })),
        "open while another process holds the log: {message}"
    );
    assert!(message.contains("in use by another process"), "{message}");

    drop(child.0.stdin.take());
    let status = child.0.wait().expect("wait for the child");
    assert!(status.success(), "the holder child failed: {status}");
    // Once the other process is gone the log opens again.
    assert_eq!(open(dir.path()).head().0, 2);
}

/// Regression: the record hash covered the header and the payload but not the
/// stored kind name, so rewriting the name alone turned a `QueuePaused` into a
/// `BatchFailed` (same name length, same one-string payload) that read back
/// and verified as intact.
#[test]
fn rewriting_an_event_kind_breaks_the_chain() {
    let dir = tempdir();
    let log = open(dir.path());
    append_notes(&log, 2);
    let pause = append(
        &log,
        &request(
            vec![proposed(
                StreamId::System,
                Event::QueuePaused(QueuePaused {
                    reason: "maintenance".into(),
                }),
            )],
            vec![],
        ),
    );
    append_notes(&log, 1);
    let pos = *pause.positions.start();
    let mut bytes = raw(&log, pos);
    let at = bytes
        .windows(b"QueuePaused".len())
        .position(|w| w == b"QueuePaused")
        .expect("the kind name is stored in the record");
    bytes[at..at + b"BatchFailed".len()].copy_from_slice(b"BatchFailed");
    overwrite(&log, pos, bytes);

    match log.read_one(pos) {
        Err(LogError::Corrupt { position, .. }) => assert_eq!(position, pos),
        other => panic!(
            "the rewritten record reads back as {:?}",
            other.map(|r| r.event)
        ),
    }
    assert_eq!(problem_positions(&log), [pos]);
}
// Regression: group commit shared almost no flushes, because sled 0.34's
// apply_batch waits for a running flush; appends are now combined by a leader.

// Linux only: it counts the process's write syscalls in /proc/self/io.

const GROUP_COMMIT_ENV: &str = "INGEST_GROUP_COMMIT_CHILD";
const GROUP_COMMIT_TEST: &str = "concurrent_appenders_share_flushes";

/// Write syscalls (`syscw` in /proc/self/io) per append, for `threads`
/// threads appending `per_thread` one-event commands each. sled writes (and
/// syncs) its log buffer on each flush, and nothing else writes here, so this
/// is proportional to flushes per append.
#[cfg(target_os = "linux")]
fn writes_per_append(log: &Log, threads: u64, per_thread: u64) -> f64 {
    let syscw = || -> u64 {
        let io = std::fs::read_to_string("/proc/self/io").expect("read /proc/self/io");
        io.lines()
            .find_map(|l| l.strip_prefix("syscw: "))
            .and_then(|v| v.trim().parse().ok())
            .expect("syscw in /proc/self/io")
    };
    let base = log.head().0;
    let before = syscw();
    thread::scope(|s| {
        for t in 0..threads {
            s.spawn(move || {
                for i in 0..per_thread {
                    let stream = StreamId::Job(Jid(base + t * per_thread + i + 1));
                    append(log, &request(vec![proposed(stream, note("x"))], vec![]));
                }
            });
        }
    });
    (syscw() - before) as f64 / (threads * per_thread) as f64
}

/// Group commit: concurrent appenders must share flushes. Measured in a
/// child process of its own so that no other test's I/O is counted.
#[cfg(target_os = "linux")]
#[test]
fn concurrent_appenders_share_flushes() {
    if let Ok(dir) = std::env::var(GROUP_COMMIT_ENV) {
        let log = open(Path::new(&dir));
        let alone = writes_per_append(&log, 1, 200);
        let shared = writes_per_append(&log, 16, 200);
        println!("\nWRITES {alone} {shared}");
        return;
    }
    let dir = tempdir();
    let exe = std::env::current_exe().expect("current exe");
    let out = Process::new(&exe)
        .args([
            GROUP_COMMIT_TEST,
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(GROUP_COMMIT_ENV, dir.path())
        .output()
        .expect("run the child");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("WRITES "))
        .unwrap_or_else(|| panic!("child output: {stdout}"));
    let (alone, shared) = line.split_once(' ').expect("two numbers");
    let (alone, shared): (f64, f64) = (
        alone.parse().expect("number"),
        shared.parse().expect("number"),
    );
    // One appender flushes once per append. Sixteen appenders must share:
    // allow half as many flushes per append as one appender needs.
    assert!(
        shared < alone / 2.0,
        "16 concurrent appenders made {shared:.2} write syscalls per append, one appender {alone:.2}: flushes are not shared"
    );
}

/// The combining leader writes groups: concurrent appenders need fewer
/// groups (each with one flush) than appends.
#[test]
fn concurrent_appends_are_written_in_shared_groups() {
    let dir = tempdir();
    let log = open(dir.path());
    let threads = 8u64;
    let per_thread = 50u64;
    let barrier = std::sync::Barrier::new(threads as usize);
    thread::scope(|s| {
        for t in 0..threads {
            let (log, barrier) = (&log, &barrier);
            s.spawn(move || {
                barrier.wait();
                for i in 0..per_thread {
                    let stream = StreamId::Job(Jid(t * per_thread + i + 1));
                    append(log, &request(vec![proposed(stream, note("x"))], vec![]));
                }
            });
        }
    });
    assert_eq!(log.head().0, threads * per_thread);
    assert!(
        log.append_groups() < threads * per_thread,
        "{} groups for {} appends",
        log.append_groups(),
        threads * per_thread
    );
}

/// Regression: `verify` read the records and the stream index without one
/// consistent view, so while writes went on it reported "stream index entry
/// points past the end of the log" on a healthy log (14 of 40 calls under
/// load). It now checks the log up to the durable position of its start.
#[test]
fn verify_sees_no_problem_in_a_healthy_log_while_writes_go_on() {
    let dir = tempdir();
    let log = std::sync::Arc::new(open(dir.path()));
    append_notes(&log, 50);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (log, stop) = (std::sync::Arc::clone(&log), std::sync::Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) && n < 20_000 {
                append_notes(&log, 5);
                n += 5;
            }
        })
    };
    for round in 0..40 {
        let report = log.verify(|_| {}).expect("verify");
        assert!(
            report.problems.is_empty(),
            "round {round}: {:?}",
            report.problems
        );
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    writer.join().expect("writer");
    assert!(log.verify(|_| {}).expect("verify").problems.is_empty());
}

#[test]
fn a_log_reopens_with_the_storage_settings_it_was_created_with() {
    // Created uncompressed with a small segment, re-opened compressed with
    // the default segment: sled refuses changed settings, so the log must
    // repeat the persisted ones. And the other way round (a log created
    // compressed before new logs were not, or with --log-compression).
    let zstd = LogConfig {
        compression: Some(3),
        ..config()
    };
    let dir = tempdir();
    let first = LogConfig {
        compression: None,
        segment_size: 256 * 1024,
        ..config()
    };
    {
        let log = Log::open(dir.path(), &first).expect("open");
        append_notes(&log, 1);
    }
    let log = Log::open(dir.path(), &zstd).expect("re-open with other settings");
    assert_eq!(log.head().0, 1);
    drop(log);
    let compressed = tempdir();
    {
        let log = Log::open(compressed.path(), &zstd).expect("open");
        append_notes(&log, 1);
    }
    let plain = LogConfig {
        compression: None,
        ..config()
    };
    let log = Log::open(compressed.path(), &plain).expect("re-open a compressed log");
    assert_eq!(log.read_one(1).expect("read").envelope.position, 1);
}

// ---------------------------------------------------------------------------
// Copies between logs (replication, bootstrap, backup, restore)
// ---------------------------------------------------------------------------

/// Every frame of `log` from `from` on, at most `max_bytes` each.
fn frames_of(log: &Log, from: u64, max_bytes: usize) -> Vec<Vec<u8>> {
    log.read_frames(from, u64::MAX, max_bytes)
        .map(|f| f.expect("read a frame").1)
        .collect()
}

#[test]
fn a_copied_log_has_the_same_records_indexes_and_head() {
    let (a_dir, b_dir) = (tempdir(), tempdir());
    let (a, b) = (open(a_dir.path()), open(b_dir.path()));
    append_notes(&a, 20);
    // Two events of one stream in one command, so stream versions move by two.
    append(
        &a,
        &request(
            vec![
                proposed(StreamId::Batch(Bid(3)), note("x")),
                proposed(StreamId::Batch(Bid(3)), note("y")),
            ],
            vec![],
        ),
    );
    let frames = frames_of(&a, 1, 300);
    assert!(frames.len() > 1, "small frames split the log");
    for f in &frames {
        b.import(f).expect("import a frame");
    }
    assert_eq!(a.head(), b.head());
    assert_eq!(read_all(&a), read_all(&b));
    assert_eq!(
        b.stream_version(StreamId::Batch(Bid(3))).unwrap(),
        a.stream_version(StreamId::Batch(Bid(3))).unwrap()
    );
    assert_eq!(b.read_stream(StreamId::Batch(Bid(3))).unwrap().len(), 3);
    b.wait_durable(b.head().0).unwrap();
    let report = b.verify(|_| {}).expect("verify the copy");
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    // The copy goes on as a log of its own.
    append_notes(&b, 1);
    assert_eq!(b.head().0, 23);
}

#[test]
fn a_record_that_does_not_continue_the_log_is_refused_and_nothing_is_written() {
    let (a_dir, b_dir, c_dir) = (tempdir(), tempdir(), tempdir());
    let (a, b, c) = (open(a_dir.path()), open(b_dir.path()), open(c_dir.path()));
    append_notes(&a, 5);
    append_notes(&c, 5); // another history: other timestamps and ids
    let whole = frames_of(&a, 1, usize::MAX).concat();

    // Starting past the head: a gap.
    let from_three = frames_of(&a, 3, usize::MAX).concat();
    let err = b.import(&from_three).unwrap_err();
    assert!(err.to_string().contains("position 1"), "{err}");
    assert_eq!(b.head().0, 0);

    // One flipped byte inside a record: its hash fails; nothing of the frame lands.
    let mut tampered = whole.clone();
    let at = tampered.len() - 10;
    tampered[at] ^= 0x40;
    assert!(b.import(&tampered).is_err());
    assert_eq!(b.head().0, 0, "all or nothing");

    // A cut frame.
    assert!(b.import(&whole[..whole.len() - 3]).is_err());
    assert_eq!(b.head().0, 0);

    // Records of another history after this one's head.
    b.import(&whole).unwrap();
    let other = frames_of(&c, 6, usize::MAX).concat();
    append_notes(&c, 1);
    let other_next = frames_of(&c, 6, usize::MAX).concat();
    assert!(other.is_empty());
    let err = b.import(&other_next).unwrap_err();
    assert!(err.to_string().contains("previous hash"), "{err}");
    assert_eq!(b.head(), a.head());
}
