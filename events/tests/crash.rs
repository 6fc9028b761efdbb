//! The crash test: appenders are killed at random moments and every append
//! they acknowledged must survive.
//!
//! In the manner of sled's crash harness, the test re-executes its own binary
//! as a child (`INGEST_CRASH_CHILD=<dir>` selects the child's role). The child
//! opens the log in `<dir>`, folds it, and drives batches through their whole
//! lifecycle from several threads, with commands of one event and of several.
//! After each `append` returns it prints `ACK <first> <last> <events> end`.
//! The parent waits for the first acknowledgement, lets the child run for a
//! random 5–300 ms, kills it with SIGKILL and re-opens the directory:
//!
//! 1. the log opens without needing repair and `verify` reports no problem;
//! 2. every acknowledged position is there, readable, and belongs to one
//!    command whose events are all there (the event count of each command is
//!    encoded in its correlation id, so unacknowledged commands are checked
//!    for atomicity too);
//! 3. the log folds into a [`State`] without error (incrementally: what
//!    earlier rounds checked is pinned by the hash chain);
//! 4. an append works again, and the next round's child continues the log.
//!
//! `INGEST_CRASH_ROUNDS` (default 24) and `INGEST_CRASH_SEED` change the run;
//! the seed is printed so a failure can be replayed.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command as Process, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use chrono::Utc;
use ingest_events::codec::{Hash, GENESIS_HASH};
use ingest_events::command::{decide, Command, JobSpec, Target};
use ingest_events::event::{
    Actor, Erc, Event, Identifiers, PayloadType, Submission, SubmissionMode, TreeRepaired,
};
use ingest_events::lifecycle::Lifecycle;
use ingest_events::log::{
    AppendRequest, Appended, ExpectedVersion, Log, LogConfig, LogError, Proposed,
};
use ingest_events::{Recorded, State, StreamId};
use uuid::Uuid;

const TEST_NAME: &str = "acknowledged_appends_survive_random_kills";
const CHILD_ENV: &str = "INGEST_CRASH_CHILD";
const ROUNDS_ENV: &str = "INGEST_CRASH_ROUNDS";
const SEED_ENV: &str = "INGEST_CRASH_SEED";
const DEFAULT_ROUNDS: u32 = 24;
/// Appending threads in the child.
const CHILD_THREADS: u64 = 4;
/// How long the parent waits for a child's first acknowledgement.
const FIRST_ACK_DEADLINE: Duration = Duration::from_secs(60);
/// A child that was never killed (its parent vanished) stops by itself.
const CHILD_LIFETIME: Duration = Duration::from_secs(120);

#[test]
fn acknowledged_appends_survive_random_kills() {
    match std::env::var_os(CHILD_ENV) {
        Some(dir) => child(Path::new(&dir)),
        None => parent(),
    }
}

fn config() -> LogConfig {
    LogConfig {
        cache_capacity: 16 * 1024 * 1024,
        ..LogConfig::default()
    }
}

/// Opens the log, waiting (up to a deadline) for a handle dropped by this
/// process, or by the process that had it before, to let go of the directory.
///
/// sled 0.34 releases its `flock` on `<dir>/db` only when its I/O threads drop
/// their last reference to the file, shortly *after* the last `Db` handle is
/// dropped (spacejam/sled#1289): a child started right after the parent closed
/// the log can find it still locked.
fn open(dir: &Path) -> Result<Log, LogError> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut pause = Duration::from_millis(1);
    loop {
        match Log::open(dir, &config()) {
            Err(LogError::Locked { .. }) if Instant::now() < deadline => {
                // Nothing to wait on: sled gives no signal when it lets go.
                thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(50));
            }
            other => return other,
        }
    }
}

/// A correlation id that carries the number of events of its command in its
/// low 16 bits, so the parent can check every command for atomicity, also the
/// ones it never saw acknowledged.
fn correlation_id(events: usize) -> Uuid {
    let events = u128::try_from(events).expect("event count fits");
    assert!(events > 0 && events < 1 << 16);
    Uuid::from_u128(fastrand::u128(..) << 16 | events)
}

fn events_of(correlation_id: Uuid) -> u64 {
    (correlation_id.as_u128() & 0xffff) as u64
}

// ---------------------------------------------------------------------------
// The parent
// ---------------------------------------------------------------------------

/// One `ACK` line: a command the child saw acknowledged.
#[derive(Debug, Clone, Copy)]
struct Ack {
    first: u64,
    last: u64,
    events: u64,
}

fn parse_ack(line: &str) -> Option<Ack> {
    // The first line can follow libtest's "test NAME ... " on the same line.
    let (_, rest) = line.split_once("ACK ")?;
    let fields: Vec<&str> = rest.split(' ').collect();
    match fields[..] {
        [first, last, events, "end"] => Some(Ack {
            first: first.parse().ok()?,
            last: last.parse().ok()?,
            events: events.parse().ok()?,
        }),
        _ => None,
    }
}

/// Kills the child on every exit path, so a failing test leaves no process behind.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[cfg(unix)]
fn killed_by_us(status: ExitStatus) -> bool {
    use std::os::unix::process::ExitStatusExt;
    status.signal() == Some(9)
}

#[cfg(not(unix))]
fn killed_by_us(status: ExitStatus) -> bool {
    !status.success()
}

#[derive(Debug, Default)]
struct Totals {
    acked_commands: u64,
    acked_events: u64,
    multi_event_commands: u64,
}

fn parent() {
    let rounds: u32 = match std::env::var(ROUNDS_ENV) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|e| panic!("{ROUNDS_ENV}={v:?}: {e}")),
        Err(_) => DEFAULT_ROUNDS,
    };
    let seed: u64 = match std::env::var(SEED_ENV) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|e| panic!("{SEED_ENV}={v:?}: {e}")),
        Err(_) => fastrand::u64(..),
    };
    println!("crash test: {rounds} rounds, seed {seed} (replay with {SEED_ENV}={seed})");
    let mut rng = fastrand::Rng::with_seed(seed);
    let dir = tempfile::tempdir().expect("create a temporary directory");
    let exe = std::env::current_exe().expect("current exe");
    let started = Instant::now();
    let mut totals = Totals::default();
    let mut checked = Checked {
        state: State::new(),
        head_hash: GENESIS_HASH,
    };

    for round in 1..=rounds {
        let delay = Duration::from_millis(rng.u64(5..=300));
        let spawned = Instant::now();
        let (acks, first_ack) = run_child(&exe, dir.path(), delay)
            .unwrap_or_else(|e| panic!("round {round} (seed {seed}): {e}"));
        let killed = Instant::now();
        let before = checked.state.position;
        check_recovery(dir.path(), &acks, &mut totals, &mut checked)
            .unwrap_or_else(|e| panic!("round {round} (seed {seed}): {e}"));
        let head = checked.state.position;
        let check_time = killed.elapsed();
        let acked_last = acks.iter().map(|a| a.last).max().unwrap_or(0);
        println!(
            "round {round:2}: first ack after {:4} ms, killed {:3} ms later, {:4} commands acknowledged (last position {acked_last}), log head {before} -> {head}, checked in {} ms",
            (first_ack - spawned).as_millis(),
            delay.as_millis(),
            acks.len(),
            check_time.as_millis(),
        );
    }
    let head = checked.state.position;
    println!(
        "crash test summary: {rounds} rounds in {:.1} s, {head} events in the log, {} commands / {} events acknowledged ({} multi-event commands), seed {seed}",
        started.elapsed().as_secs_f64(),
        totals.acked_commands,
        totals.acked_events,
        totals.multi_event_commands,
    );
    assert!(totals.acked_events > 0);
}

/// Runs one child until its first acknowledgement, then `delay` more, kills
/// it and returns every acknowledgement it printed and when the first came.
fn run_child(exe: &Path, dir: &Path, delay: Duration) -> Result<(Vec<Ack>, Instant), String> {
    let mut child = KillOnDrop(
        Process::new(exe)
            .args([TEST_NAME, "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, dir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("spawn {}: {e}", exe.display()))?,
    );
    let stdout = child.0.stdout.take().ok_or("no child stdout")?;
    let (tx, rx) = mpsc::channel();
    let reader = thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(ack) = parse_ack(&line) {
                if tx.send(ack).is_err() {
                    break;
                }
            }
        }
    });
    let first = rx
        .recv_timeout(FIRST_ACK_DEADLINE)
        .map_err(|e| format!("no acknowledgement from the child ({e})"))?;
    let first_at = Instant::now();
    // The deliberate random delay: the moment of the kill is the test input.
    thread::sleep(delay);
    child.0.kill().map_err(|e| format!("kill the child: {e}"))?;
    let status = child
        .0
        .wait()
        .map_err(|e| format!("wait for the child: {e}"))?;
    if !killed_by_us(status) {
        return Err(format!(
            "the child ended by itself ({status}) before the kill"
        ));
    }
    // Lines written before the kill are still in the pipe: read to its end.
    reader
        .join()
        .map_err(|_| "the stdout reader panicked".to_string())?;
    let mut acks = vec![first];
    acks.extend(rx.try_iter());
    Ok((acks, first_at))
}

/// What the parent has checked so far: the log folded up to its head.
struct Checked {
    state: State,
    /// The hash of the record at `state.position`, which (through the chain
    /// that `verify` re-checks) stands for every record before it.
    head_hash: Hash,
}

/// Re-opens the log after a kill and checks everything the module doc lists.
/// Records up to `checked` were checked in earlier rounds: `verify` re-checks
/// the whole chain, so it is enough to see that the checked head still has
/// the same hash, and to fold and check only the records after it.
fn check_recovery(
    dir: &Path,
    acks: &[Ack],
    totals: &mut Totals,
    checked: &mut Checked,
) -> Result<(), String> {
    let log = open(dir).map_err(|e| format!("re-open: {e}"))?;
    if let Some((position, reason)) = log.needs_repair() {
        return Err(format!("the log needs repair at {position}: {reason}"));
    }
    let report = log.verify(|_| {}).map_err(|e| format!("verify: {e}"))?;
    if !report.problems.is_empty() {
        return Err(format!("verify: {:?}", report.problems));
    }
    // The audit indexes (actor runs, collections) are written in the same
    // batch as the records: a kill never leaves a record without them.
    let missing = log
        .audit_index_problems()
        .map_err(|e| format!("audit indexes: {e}"))?;
    if !missing.is_empty() {
        return Err(format!("audit indexes: {missing:?}"));
    }
    let (head, head_hash) = log.head();
    if report.events_checked != head || report.head_hash != head_hash {
        return Err(format!(
            "verify checked {} events up to hash {:x?}, the head is {head} {:x?}",
            report.events_checked, report.head_hash, head_hash
        ));
    }

    // Every acknowledged command is there, whole.
    for ack in acks {
        if ack.last > head || ack.last + 1 - ack.first != ack.events {
            return Err(format!("acknowledged {ack:?} but the head is {head}"));
        }
        let records: Vec<Recorded> = log
            .read_range(ack.first, ack.last)
            .collect::<Result<_, _>>()
            .map_err(|e| format!("acknowledged {ack:?} does not read back: {e}"))?;
        let id = records[0].envelope.correlation_id;
        if records.len() as u64 != ack.events
            || events_of(id) != ack.events
            || records.iter().any(|r| r.envelope.correlation_id != id)
        {
            return Err(format!(
                "acknowledged {ack:?} reads back as another command"
            ));
        }
        totals.acked_commands += 1;
        totals.acked_events += ack.events;
        totals.multi_event_commands += u64::from(ack.events > 1);
    }

    // The part checked in earlier rounds is unchanged.
    let before = checked.state.position;
    if before > 0 {
        let r = log
            .read_one(before)
            .map_err(|e| format!("position {before}, checked before: {e}"))?;
        if r.envelope.hash != checked.head_hash {
            return Err(format!("position {before} changed since it was checked"));
        }
    }
    if head < before {
        return Err(format!("the head went back from {before} to {head}"));
    }

    // Every new command is whole (acknowledged or not), and it folds.
    let state = &mut checked.state;
    let mut run: Option<(Uuid, u64)> = None;
    for r in log.read_range(before + 1, head) {
        let r = r.map_err(|e| format!("read: {e}"))?;
        state.apply(&r).map_err(|e| format!("fold: {e}"))?;
        let id = r.envelope.correlation_id;
        run = match run {
            Some((current, n)) if current == id => Some((id, n + 1)),
            Some((current, n)) if n != events_of(current) => {
                return Err(format!(
                    "command {current} has {n} of its {} events before position {}",
                    events_of(current),
                    r.envelope.position
                ))
            }
            _ => Some((id, 1)),
        };
    }
    if let Some((current, n)) = run {
        if n != events_of(current) {
            return Err(format!(
                "the last command {current} has {n} of its {} events",
                events_of(current)
            ));
        }
    }

    // Appending works again.
    let version = state.system_version;
    let expected = match version {
        0 => ExpectedVersion::NoStream,
        v => ExpectedVersion::Exact(v),
    };
    let appended = log
        .append(&AppendRequest {
            actor: Actor::admin("crash-test"),
            correlation_id: correlation_id(1),
            timestamp: Utc::now(),
            expectations: vec![(StreamId::System, expected)],
            events: vec![Proposed {
                stream: StreamId::System,
                event: Event::TreeRepaired(TreeRepaired { paths: vec![] }),
            }],
        })
        .map_err(|e| format!("append after recovery: {e}"))?
        .map_err(|c| format!("append after recovery: {c}"))?;
    if appended.positions != (head + 1..=head + 1) || log.durable_position() != head + 1 {
        return Err(format!(
            "append after recovery wrote {:?}",
            appended.positions
        ));
    }
    for r in &appended.records {
        state.apply(r).map_err(|e| format!("fold: {e}"))?;
    }
    checked.head_hash = state.head_hash;
    Ok(())
}

// ---------------------------------------------------------------------------
// The child
// ---------------------------------------------------------------------------

/// The child's log, its folded state, and its acknowledgement channel.
struct Engine {
    log: Log,
    lifecycle: Lifecycle,
    fold: Mutex<Fold>,
    /// Signalled whenever the fold advances.
    advanced: Condvar,
}

struct Fold {
    state: State,
    /// Records appended by one thread while an earlier position is still in
    /// another thread's hands; applied once the gap closes.
    pending: BTreeMap<u64, Recorded>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn child(dir: &Path) -> ! {
    // A failed assertion in any thread must end the child at once with an
    // error status, which the parent reports; a kill is the only other end.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        default_hook(info);
        std::process::exit(101);
    }));
    let log = open(dir).unwrap_or_else(|e| panic!("open {}: {e}", dir.display()));
    let mut state = State::new();
    for r in log.read_range(1, u64::MAX) {
        state
            .apply(&r.expect("read the log at start-up"))
            .expect("fold the log at start-up");
    }
    let engine = Engine {
        log,
        lifecycle: Lifecycle::builtin(),
        fold: Mutex::new(Fold {
            state,
            pending: BTreeMap::new(),
        }),
        advanced: Condvar::new(),
    };
    let stop = Instant::now() + CHILD_LIFETIME;
    thread::scope(|s| {
        for t in 0..CHILD_THREADS {
            let engine = &engine;
            s.spawn(move || {
                let mut worker = Worker {
                    engine,
                    name: format!("w{t}"),
                    after: 0,
                };
                let mut n = t;
                while Instant::now() < stop {
                    worker.batch(1 + n % 3);
                    n += 1;
                }
            });
        }
    });
    std::process::exit(0)
}

/// One appending thread of the child.
struct Worker<'a> {
    engine: &'a Engine,
    name: String,
    /// The last position this thread appended: its next decision must see it.
    after: u64,
}

impl Worker<'_> {
    /// Drives one batch of `jobs` jobs from submission to its report.
    fn batch(&mut self, jobs: u64) {
        let submitted = self.exec(&Command::SubmitBatch {
            uuid: Uuid::from_u128(fastrand::u128(..)),
            submission: Submission {
                profile_name: "crash_content".into(),
                submitter: self.name.clone(),
                payload_url: "https://example.org/batch.checkm".into(),
                payload_type: PayloadType::BatchManifest,
                response_type: "json".into(),
                submission_mode: SubmissionMode::Add,
                manifest: vec![],
                erc: Erc::default(),
                digest: None,
                extra: Default::default(),
            },
        });
        let StreamId::Batch(bid) = submitted.records[0].envelope.stream else {
            panic!("SubmitBatch wrote {:?}", submitted.records[0]);
        };
        let specs = (0..jobs)
            .map(|i| JobSpec {
                payload_url: format!("https://example.org/{bid}/{i}.zip"),
                payload_type: PayloadType::Container,
                identifiers: Identifiers::default(),
                metadata: Erc::default(),
                digest: None,
                priority: Some(u8::try_from(i).expect("few jobs")),
            })
            .collect();
        // One command, 1 + jobs events: BatchAcquired and a JobCreated each.
        let acquired = self.exec(&Command::AcquireBatch { bid, jobs: specs });
        let Event::BatchAcquired(a) = &acquired.records[0].event else {
            panic!("AcquireBatch wrote {:?}", acquired.records[0]);
        };
        for &jid in &a.jobs {
            self.exec(&Command::StartJob { jid });
            // Estimating -> ... -> Completed; the batch's last job also moves
            // the batch to Reporting in the same command.
            for _ in 0..7 {
                self.exec(&Command::SetJobStatus {
                    jid,
                    target: Target::Success,
                    message: String::new(),
                    priority: None,
                });
            }
        }
        self.exec(&Command::ReportBatch {
            bid,
            notification_error: None,
        });
    }

    /// Decides `command` against the fold, appends it, acknowledges it on
    /// stdout and folds it. A conflict (another thread took the same id)
    /// waits for the fold to catch up and decides again.
    fn exec(&mut self, command: &Command) -> Appended {
        let engine = self.engine;
        loop {
            let (decision, seen) = {
                let mut fold = lock(&engine.fold);
                while fold.state.position < self.after {
                    fold = engine
                        .advanced
                        .wait(fold)
                        .unwrap_or_else(|e| e.into_inner());
                }
                let decision = decide(&fold.state, &engine.lifecycle, command)
                    .unwrap_or_else(|r| panic!("{command:?} rejected: {r}"));
                (decision, fold.state.position)
            };
            let request = AppendRequest {
                actor: Actor::worker(self.name.clone()),
                correlation_id: correlation_id(decision.events.len()),
                timestamp: Utc::now(),
                expectations: decision.expectations,
                events: decision.events,
            };
            match engine.log.append(&request) {
                Ok(Ok(appended)) => {
                    acknowledge(&appended);
                    self.after = *appended.positions.end();
                    self.fold(appended.records.clone());
                    return appended;
                }
                Ok(Err(_conflict)) => {
                    // The conflicting record is past `seen` and its writer
                    // folds it as soon as its own append returns.
                    let mut fold = lock(&engine.fold);
                    while fold.state.position <= seen {
                        fold = engine
                            .advanced
                            .wait(fold)
                            .unwrap_or_else(|e| e.into_inner());
                    }
                }
                Err(e) => panic!("append failed: {e}"),
            }
        }
    }

    fn fold(&self, records: Vec<Recorded>) {
        let mut fold = lock(&self.engine.fold);
        for r in records {
            fold.pending.insert(r.envelope.position, r);
        }
        loop {
            let next = fold.state.position + 1;
            let Some(r) = fold.pending.remove(&next) else {
                break;
            };
            fold.state.apply(&r).unwrap_or_else(|e| panic!("fold: {e}"));
        }
        self.engine.advanced.notify_all();
    }
}

/// Prints one acknowledgement line; a parent that stopped reading ends the child.
fn acknowledge(appended: &Appended) {
    let (first, last) = (*appended.positions.start(), *appended.positions.end());
    let mut out = std::io::stdout().lock();
    let written = writeln!(out, "ACK {first} {last} {} end", appended.records.len())
        .and_then(|()| out.flush());
    if written.is_err() {
        std::process::exit(0);
    }
}
