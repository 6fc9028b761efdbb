//! Model test: random command sequences through `decide`, a real log in a
//! temporary directory, and `State::apply`, with every invariant checked
//! after every command.
//!
//! Commands name their batch or job through a [`Pick`]: mostly an existing
//! item in a state where the command is plausible (so sequences walk jobs and
//! batches to the end), sometimes any existing item, sometimes a raw id
//! (batches up to 6, jobs up to 12) that may not exist; with three profiles,
//! one of them invalid, duplicate submission uuids and out-of-range
//! priorities, about half the commands are rejected, so the rejections are
//! exercised as much as the moves. `PROPTEST_CASES` overrides the number of
//! cases (64 by default). A failure prints the shrunk op sequence.

mod common;

use std::collections::{BTreeMap, BTreeSet};

use common::{check_rejection_message, submission, Harness};
use ingest_events::command::{Command, JobSpec, Target};
use ingest_events::event::{
    Event, Identifiers, InventoryParams, PayloadType, StoreParams, StreamId,
};
use ingest_events::lifecycle::{BatchState, JobState, StateKind};
use ingest_events::{Bid, Jid, Recorded, State};
use proptest::prelude::*;

/// Which job or batch an op names, resolved against the state when the op
/// runs: mostly an item that exists (so sequences get deep), sometimes a raw
/// id that may not.
#[derive(Debug, Clone, Copy)]
enum Pick {
    /// The k-th (modulo) item the op is likely to be accepted for.
    Live(u8),
    /// The k-th (modulo) existing item.
    Any(u8),
    /// This id, whether it exists or not.
    Raw(u8),
}

impl Pick {
    fn resolve<T: Copy>(self, plausible: &[T], all: &[T], raw: impl Fn(u64) -> T) -> T {
        let nth = |v: &[T], k: u8| (!v.is_empty()).then(|| v[usize::from(k) % v.len()]);
        match self {
            Pick::Live(k) => nth(plausible, k).or_else(|| nth(all, k)),
            Pick::Any(k) => nth(all, k),
            Pick::Raw(n) => Some(raw(u64::from(n))),
        }
        .unwrap_or_else(|| raw(1))
    }

    /// `Live` picks among the jobs `plausible` accepts (where the op will
    /// likely be accepted), so sequences walk jobs to the end.
    fn job(self, state: &State, plausible: impl Fn(JobState) -> bool) -> Jid {
        let all: Vec<Jid> = state.jobs.keys().copied().collect();
        let live: Vec<Jid> = state
            .jobs
            .values()
            .filter(|j| !j.cleaned_up && plausible(j.status))
            .map(|j| j.jid)
            .collect();
        self.resolve(&live, &all, Jid)
    }

    fn batch(self, state: &State, plausible: impl Fn(BatchState) -> bool) -> Bid {
        let all: Vec<Bid> = state.batches.keys().copied().collect();
        let live: Vec<Bid> = state
            .batches
            .values()
            .filter(|b| !b.cleaned_up && plausible(b.status))
            .map(|b| b.bid)
            .collect();
        self.resolve(&live, &all, Bid)
    }
}

/// One step of a sequence, kept small so shrunk failures read well.
#[derive(Debug, Clone)]
enum Op {
    Submit {
        uuid: u8,
        profile: u8,
    },
    Acquire {
        bid: Pick,
        jobs: u8,
        bad_priority: bool,
    },
    CreateJob {
        bid: Pick,
    },
    Start {
        jid: Pick,
    },
    Success {
        jid: Pick,
        priority: Option<u8>,
    },
    Fail {
        jid: Pick,
    },
    MoveTo {
        jid: Pick,
        to: u8,
    },
    Space {
        jid: Pick,
        priority: Option<u8>,
    },
    Identifiers {
        jid: Pick,
    },
    Store {
        jid: Pick,
    },
    Inventory {
        jid: Pick,
    },
    StepRetry {
        jid: Pick,
    },
    Requeue {
        jid: Pick,
    },
    /// A worker reports a failure of kind `digest_mismatch` (unrecoverable).
    FailDigest {
        jid: Pick,
    },
    HoldJob {
        jid: Pick,
    },
    ReleaseJob {
        jid: Pick,
    },
    DeleteJob {
        jid: Pick,
    },
    ReleaseBatch {
        bid: Pick,
    },
    UpdateReporting {
        bid: Pick,
    },
    DeleteBatch {
        bid: Pick,
    },
    Report {
        bid: Pick,
        notification_fails: bool,
    },
    HoldCollection {
        profile: u8,
    },
    ReleaseCollection {
        profile: u8,
    },
    ReleaseHeldJobs {
        profile: u8,
    },
    Pause,
    Resume,
    RecordRepair {
        paths: u8,
    },
    Cleanup,
}

const PROFILES: [&str; 3] = ["alpha", "beta", "bad/profile"];

fn profile(p: u8) -> String {
    PROFILES[usize::from(p) % PROFILES.len()].to_string()
}

fn spec(k: u8, priority: Option<u8>) -> JobSpec {
    JobSpec {
        payload_url: format!("https://example.org/obj{k}.zip"),
        payload_type: PayloadType::File,
        identifiers: Identifiers {
            primary_id: None,
            local_ids: vec![format!("loc{k}")],
        },
        metadata: Default::default(),
        digest: None,
        priority,
    }
}

impl Op {
    fn command(&self, state: &State) -> Command {
        use BatchState as B;
        use JobState as J;
        let at_work = |s: JobState| s.is_active();
        let started = |s: JobState| s.is_active() && s != J::Pending;
        let bid = |b: &Pick, p: fn(BatchState) -> bool| b.batch(state, p);
        let reason = String::from("model");
        let job = |j: &Pick, p: &dyn Fn(JobState) -> bool| j.job(state, p);
        match self {
            Op::Submit { uuid, profile: p } => Command::SubmitBatch {
                uuid: uuid::Uuid::from_u128(u128::from(*uuid) + 1),
                submission: submission(&profile(*p)),
            },
            Op::Acquire {
                bid: b,
                jobs,
                bad_priority,
            } => Command::AcquireBatch {
                bid: bid(b, |s| s == B::Pending),
                jobs: (0..*jobs)
                    .map(|k| spec(k, bad_priority.then_some(100).or(Some(k * 3))))
                    .collect(),
            },
            Op::CreateJob { bid: b } => Command::CreateJob {
                bid: bid(b, |s| s == B::Processing),
                spec: spec(9, None),
            },
            Op::Start { jid: j } => Command::StartJob {
                jid: job(j, &|s| s == J::Pending),
            },
            Op::Success { jid: j, priority } => Command::SetJobStatus {
                jid: job(j, &started),
                target: Target::Success,
                message: String::new(),
                priority: *priority,
            },
            Op::Fail { jid: j } => Command::SetJobStatus {
                jid: job(j, &at_work),
                target: Target::Fail,
                message: "step failed".into(),
                priority: None,
            },
            Op::MoveTo { jid: j, to } => Command::SetJobStatus {
                jid: job(j, &|s| s != J::Completed && s != J::Deleted),
                target: Target::To(JobState::ALL[usize::from(*to) % JobState::ALL.len()]),
                message: "forced".into(),
                priority: None,
            },
            Op::Space { jid: j, priority } => Command::RecordSpace {
                jid: job(j, &at_work),
                space_needed: 1_000_000,
                priority: *priority,
            },
            Op::Identifiers { jid: j } => Command::RecordIdentifiers {
                jid: job(j, &at_work),
                identifiers: Identifiers {
                    primary_id: Some("ark:/13030/m5x".into()),
                    local_ids: vec![],
                },
            },
            Op::Store { jid: j } => Command::RecordStore {
                jid: job(j, &at_work),
                store: StoreParams {
                    manifest_url: "https://store.example.org/m".into(),
                    mode: "add".into(),
                    delete: false,
                },
            },
            Op::Inventory { jid: j } => Command::RecordInventory {
                jid: job(j, &at_work),
                inventory: InventoryParams {
                    manifest_url: "https://store.example.org/m".into(),
                    mode: "add".into(),
                },
            },
            Op::StepRetry { jid: j } => Command::RecordStepRetry {
                jid: job(j, &at_work),
                attempt: 2,
                message: "transient".into(),
            },
            Op::Requeue { jid: j } => Command::RequeueJob {
                jid: job(j, &|s| s == J::Failed),
                reason,
            },
            Op::FailDigest { jid: j } => {
                let jid = job(j, &started);
                let reported = state.jobs.get(&jid).map_or(J::Downloading, |j| j.status);
                let kind = ingest_events::event::FailureKind::DigestMismatch;
                Command::outcome(jid, reported, false, "sha256 mismatch", Some(kind))
            }
            Op::HoldJob { jid: j } => Command::HoldJob {
                jid: job(j, &|s| s == J::Pending),
                reason,
            },
            Op::ReleaseJob { jid: j } => Command::ReleaseJob {
                jid: job(j, &|s| s == J::Held),
                reason,
            },
            Op::DeleteJob { jid: j } => Command::DeleteJob {
                jid: job(j, &|s| s == J::Held || s == J::Failed),
                reason,
            },
            Op::ReleaseBatch { bid: b } => Command::ReleaseBatch {
                bid: bid(b, |s| s == B::Held),
                reason,
            },
            Op::UpdateReporting { bid: b } => Command::UpdateReporting {
                bid: bid(b, |s| s == B::Failed),
                reason,
            },
            Op::DeleteBatch { bid: b } => Command::DeleteBatch {
                bid: bid(b, |s| s == B::Failed || s == B::Held),
                reason,
            },
            Op::Report {
                bid: b,
                notification_fails,
            } => Command::ReportBatch {
                bid: bid(b, |s| s == B::Reporting || s == B::UpdateReporting),
                notification_error: notification_fails.then(|| "smtp down".to_string()),
            },
            Op::HoldCollection { profile: p } => Command::HoldCollection {
                profile: profile(*p),
                reason,
            },
            Op::ReleaseCollection { profile: p } => Command::ReleaseCollection {
                profile: profile(*p),
                reason,
            },
            Op::ReleaseHeldJobs { profile: p } => Command::ReleaseHeldJobs {
                profile: profile(*p),
                reason,
            },
            Op::Pause => Command::PauseQueue { reason },
            Op::Resume => Command::ResumeQueue { reason },
            Op::RecordRepair { paths } => Command::RecordRepair {
                paths: (0..*paths)
                    .map(|k| format!("/jobs/states/pending/05-jid{k:010}"))
                    .collect(),
            },
            Op::Cleanup => Command::Cleanup { before: None },
        }
    }
}

fn op() -> impl Strategy<Value = Op> {
    let pick = |raw_max: u8| {
        prop_oneof![
            // Mostly the first plausible item, so one job at a time is
            // walked to the end rather than many a step each.
            8 => Just(Pick::Live(0)),
            4 => any::<u8>().prop_map(Pick::Live),
            3 => any::<u8>().prop_map(Pick::Any),
            1 => (1u8..=raw_max).prop_map(Pick::Raw),
        ]
    };
    let bid = move || pick(6);
    let jid = move || pick(12);
    // Profile 2 is invalid; keep it rare.
    let profile = || prop_oneof![4 => 0u8..=1, 1 => Just(2u8)];
    let priority =
        || prop_oneof![6 => Just(None), 3 => (0u8..=99).prop_map(Some), 1 => Just(Some(100u8))];
    prop_oneof![
        5 => (0u8..6, profile()).prop_map(|(uuid, profile)| Op::Submit { uuid, profile }),
        8 => (bid(), 0u8..=3, proptest::bool::weighted(0.05))
            .prop_map(|(bid, jobs, bad_priority)| Op::Acquire { bid, jobs, bad_priority }),
        1 => bid().prop_map(|bid| Op::CreateJob { bid }),
        10 => jid().prop_map(|jid| Op::Start { jid }),
        25 => (jid(), priority()).prop_map(|(jid, priority)| Op::Success { jid, priority }),
        4 => jid().prop_map(|jid| Op::Fail { jid }),
        2 => (jid(), 0u8..12).prop_map(|(jid, to)| Op::MoveTo { jid, to }),
        1 => (jid(), priority()).prop_map(|(jid, priority)| Op::Space { jid, priority }),
        1 => jid().prop_map(|jid| Op::Identifiers { jid }),
        1 => jid().prop_map(|jid| Op::Store { jid }),
        1 => jid().prop_map(|jid| Op::Inventory { jid }),
        1 => jid().prop_map(|jid| Op::StepRetry { jid }),
        4 => jid().prop_map(|jid| Op::Requeue { jid }),
        2 => jid().prop_map(|jid| Op::FailDigest { jid }),
        2 => jid().prop_map(|jid| Op::HoldJob { jid }),
        2 => jid().prop_map(|jid| Op::ReleaseJob { jid }),
        2 => jid().prop_map(|jid| Op::DeleteJob { jid }),
        1 => bid().prop_map(|bid| Op::ReleaseBatch { bid }),
        2 => bid().prop_map(|bid| Op::UpdateReporting { bid }),
        2 => bid().prop_map(|bid| Op::DeleteBatch { bid }),
        4 => (bid(), proptest::bool::weighted(0.2))
            .prop_map(|(bid, notification_fails)| Op::Report { bid, notification_fails }),
        2 => profile().prop_map(|profile| Op::HoldCollection { profile }),
        2 => profile().prop_map(|profile| Op::ReleaseCollection { profile }),
        1 => profile().prop_map(|profile| Op::ReleaseHeldJobs { profile }),
        1 => Just(Op::Pause),
        1 => Just(Op::Resume),
        1 => (0u8..=2).prop_map(|paths| Op::RecordRepair { paths }),
        1 => Just(Op::Cleanup),
    ]
}

/// A batch submitted and acquired with 1–3 jobs: sequences may start with a
/// few, so that the job commands that follow have jobs to work on.
fn setup() -> impl Strategy<Value = Vec<Op>> {
    (0u8..6, 0u8..=1, 1u8..=3).prop_map(|(uuid, profile, jobs)| {
        vec![
            Op::Submit { uuid, profile },
            Op::Acquire {
                bid: Pick::Live(0),
                jobs,
                bad_priority: false,
            },
        ]
    })
}

/// A sequence of `min` to `max` ops after up to three setups (six ops).
fn sequence(min: usize, max: usize) -> impl Strategy<Value = Vec<Op>> {
    (
        proptest::collection::vec(setup(), 0..=3),
        proptest::collection::vec(op(), min..=max),
    )
        .prop_map(|(setups, ops)| setups.into_iter().flatten().chain(ops).collect())
}

/// What the invariants need to know about the history, kept from the records.
#[derive(Default)]
struct History {
    /// Position at which each batch last left Processing.
    left_processing: BTreeMap<Bid, u64>,
    /// Position at which each job last left Failed (a requeue or an explicit move).
    revived: BTreeMap<Jid, u64>,
    /// Requeues (moves with `retry`) per job.
    requeues: BTreeMap<Jid, u32>,
    /// Jobs moved out of Failed by an explicit `SetJobStatus` target rather
    /// than a requeue: the code lets that skip the requeue's bookkeeping
    /// (no retry counted, any Failed target, `last_successful_status` kept
    /// even when it is none), so such a job can be at work with no
    /// `last_successful_status`.
    forced_out_of_failed: BTreeSet<Jid>,
}

/// What a run saw, to make sure the sequences reach deep states.
#[derive(Default)]
struct Coverage {
    accepted: usize,
    rejected: usize,
    statuses: BTreeSet<JobState>,
    batch_statuses: BTreeSet<BatchState>,
}

/// Checks the records one accepted command appended against the state the
/// command was decided on.
fn check_command_records(op: &Op, before: &State, records: &[Recorded], history: &mut History) {
    // An explicit target goes around the pause and the collection hold
    // (tests/scenarios/suspected-bugs.yml); every other command must not.
    let explicit = matches!(op, Op::MoveTo { .. });
    for r in records {
        let at = r.envelope.position;
        match (&r.event, r.envelope.stream) {
            (Event::JobStatusChanged(e), StreamId::Job(jid)) => {
                let job = &before.jobs[&jid];
                if e.from == JobState::Pending && e.to == JobState::Estimating && !explicit {
                    assert!(
                        !before.paused,
                        "#{at}: {jid} started while the queue was paused"
                    );
                    assert!(
                        !before
                            .held_collections
                            .contains(&job.configuration.profile_name),
                        "#{at}: {jid} started while its collection was held"
                    );
                }
                // A failure no requeue recovers leaves Failed by no move at
                // all (a delete is a JobDeleted).
                assert!(
                    e.from != JobState::Failed || job.failure.is_none_or(|k| k.recoverable()),
                    "#{at}: {jid} failed with {:?} and moved to {}",
                    job.failure,
                    e.to
                );
                if e.from == JobState::Failed {
                    history.revived.insert(jid, at);
                    if !e.retry {
                        history.forced_out_of_failed.insert(jid);
                    }
                }
                if e.retry {
                    assert_eq!(
                        e.from,
                        JobState::Failed,
                        "#{at}: a requeue not out of Failed"
                    );
                    assert!(
                        !matches!(
                            e.to,
                            JobState::Failed
                                | JobState::Deleted
                                | JobState::Completed
                                | JobState::Held
                        ),
                        "#{at}: requeue of {jid} to {}",
                        e.to
                    );
                    *history.requeues.entry(jid).or_default() += 1;
                }
                if let Some(p) = e.priority {
                    assert!(p <= 99, "#{at}: priority {p}");
                }
            }
            (Event::BatchAcquired(e), StreamId::Batch(bid)) => {
                let b = &before.batches[&bid];
                assert!(
                    !before.held_collections.contains(&b.submission.profile_name),
                    "#{at}: {bid} acquired while its collection was held"
                );
                let first = before.next_jid();
                let expected: Vec<Jid> =
                    (0..e.jobs.len() as u64).map(|i| Jid(first.0 + i)).collect();
                assert_eq!(e.jobs, expected, "#{at}: job ids are allocated in order");
            }
            (Event::BatchReportingStarted(_), StreamId::Batch(bid)) => {
                history.left_processing.insert(bid, at);
            }
            (Event::BatchFailed(_), StreamId::Batch(bid))
                if before.batches[&bid].status == BatchState::Processing
                    || before.batches[&bid].status == BatchState::Pending =>
            {
                history.left_processing.insert(bid, at);
            }
            (Event::BatchReported(e), StreamId::Batch(bid)) => {
                let b = &before.batches[&bid];
                let with = |s: JobState| -> Vec<Jid> {
                    before
                        .batch_jobs(b)
                        .filter(|j| j.status == s)
                        .map(|j| j.jid)
                        .collect()
                };
                assert_eq!(
                    e.successful_jobs,
                    with(JobState::Completed),
                    "#{at}: report of {bid}"
                );
                assert_eq!(
                    e.failed_jobs,
                    with(JobState::Failed),
                    "#{at}: report of {bid}"
                );
            }
            _ => {}
        }
    }
}

/// Every invariant that must hold between commands.
fn check_invariants(h: &Harness, history: &History) {
    let state = &h.state;
    let lc = &h.lc;

    // Positions are gap-free from 1, and the head is the state's.
    let (head, head_hash) = h.log.head();
    assert_eq!(head, state.position);
    assert_eq!(head_hash, state.head_hash);
    let mut expected = 1;
    for r in h.log.read_range(1, head) {
        let r = r.expect("read a record");
        assert_eq!(r.envelope.position, expected, "positions must be gap-free");
        expected += 1;
    }
    assert_eq!(expected, head + 1);

    // The state kept by apply is the fold of the whole log.
    assert!(
        h.fold_from_scratch() == *state,
        "incremental state differs from the fold"
    );

    // The log verifies, and its head is the state's.
    let report = h.log.verify(|_| {}).expect("verify");
    assert!(report.problems.is_empty(), "verify: {:?}", report.problems);
    assert_eq!(report.head_hash, state.head_hash);
    assert_eq!(report.head_position, state.position);
    assert_eq!(report.events_checked, state.position);

    // Ids are allocated without gaps.
    for (i, bid) in state.batches.keys().enumerate() {
        assert_eq!(*bid, Bid(i as u64 + 1), "batch ids have a gap");
    }
    for (i, jid) in state.jobs.keys().enumerate() {
        assert_eq!(*jid, Jid(i as u64 + 1), "job ids have a gap");
    }

    // A failure's kind belongs to a Failed job (or one deleted since).
    for j in state.jobs.values() {
        if j.failure.is_some() {
            assert!(
                matches!(j.status, JobState::Failed | JobState::Deleted),
                "{} is {} with failure {:?}",
                j.jid,
                j.status,
                j.failure
            );
        }
    }

    // Every job belongs to exactly one batch, the one it names.
    let mut owner: BTreeMap<Jid, Bid> = BTreeMap::new();
    for b in state.batches.values() {
        for jid in &b.jobs {
            assert!(
                owner.insert(*jid, b.bid).is_none(),
                "{jid} is listed by two batches"
            );
        }
    }
    for j in state.jobs.values() {
        assert_eq!(
            owner.get(&j.jid),
            Some(&j.bid),
            "{} is not listed by its batch",
            j.jid
        );
        assert!(state.batches.contains_key(&j.bid));
    }
    assert_eq!(
        owner.len(),
        state.jobs.len(),
        "a batch lists a job that does not exist"
    );

    for j in state.jobs.values() {
        let jid = j.jid;
        assert!(j.priority <= 99, "{jid} priority {}", j.priority);
        assert_eq!(
            j.retry_count,
            history.requeues.get(&jid).copied().unwrap_or(0),
            "{jid}: retry_count counts the requeues"
        );
        match j.status {
            JobState::Failed => assert!(j.failed_in.is_some(), "{jid} Failed without failed_in"),
            JobState::Deleted => {}
            _ => assert!(
                j.failed_in.is_none(),
                "{jid} is {} with failed_in",
                j.status
            ),
        }
        if j.cleaned_up {
            assert!(
                state.batches[&j.bid].cleaned_up,
                "{jid} cleaned up without its batch"
            );
            assert!(
                lc.jobs.is_terminal(j.status),
                "{jid} cleaned up while {}",
                j.status
            );
        }
        if j.last_successful_status.is_none() && !history.forced_out_of_failed.contains(&jid) {
            assert!(
                matches!(
                    j.status,
                    JobState::Pending | JobState::Failed | JobState::Deleted
                ),
                "{jid} is {} without a last_successful_status",
                j.status
            );
        }
    }

    for b in state.batches.values() {
        let bid = b.bid;
        let jobs: Vec<_> = state.batch_jobs(b).collect();
        if b.cleaned_up {
            assert!(
                lc.batches.is_terminal(b.status),
                "{bid} cleaned up while {}",
                b.status
            );
            assert!(
                jobs.iter().all(|j| j.cleaned_up),
                "{bid} cleaned up without its jobs"
            );
        }
        match b.status {
            BatchState::Pending | BatchState::Held => {
                assert!(jobs.is_empty(), "{bid} is {} with jobs", b.status)
            }
            // Jobs are created by the acquisition; an empty payload fails the
            // batch in the same append, so a Processing batch always has a
            // job, and its last job finishing moves it on in the same command.
            BatchState::Processing => {
                assert!(!jobs.is_empty(), "{bid} is Processing without jobs");
                assert!(
                    jobs.iter().any(|j| !j.status.is_finished()),
                    "{bid} is Processing but every job finished"
                );
            }
            // Every job was finished when the batch left Processing; a job
            // that is not finished now was taken out of Failed since.
            BatchState::Reporting | BatchState::UpdateReporting | BatchState::Failed => {
                let left = history.left_processing.get(&bid).copied();
                assert!(
                    left.is_some(),
                    "{bid} is {} but never left Processing",
                    b.status
                );
                for j in &jobs {
                    if !j.status.is_finished() {
                        assert!(
                            history.revived.get(&j.jid).copied() > left,
                            "{bid} is {} while {} is {} and was not taken out of Failed since",
                            b.status,
                            j.jid,
                            j.status
                        );
                    }
                }
            }
            // Completed: every job completed or was deleted at the report,
            // and both are terminal. Deleted: every remaining job was deleted.
            BatchState::Completed | BatchState::Deleted => {
                for j in &jobs {
                    assert!(
                        matches!(j.status, JobState::Completed | JobState::Deleted),
                        "{bid} is {} while {} is {}",
                        b.status,
                        j.jid,
                        j.status
                    );
                }
                if b.status == BatchState::Completed {
                    assert!(
                        jobs.iter().any(|j| j.status == JobState::Completed)
                            || jobs.iter().all(|j| j.status == JobState::Deleted),
                        "{bid} Completed"
                    );
                }
            }
        }
    }
}

/// Each job's history, read by stream, is a path of the lifecycle from Pending.
fn check_job_paths(h: &Harness) {
    for jid in h.state.jobs.keys() {
        let records = h
            .log
            .read_stream(StreamId::Job(*jid))
            .expect("read a job stream");
        let mut status = None;
        for (i, r) in records.iter().enumerate() {
            assert_eq!(r.envelope.version, i as u64 + 1, "{jid} stream versions");
            match (&r.event, status) {
                (Event::JobCreated(_), None) => status = Some(JobState::Pending),
                (Event::JobStatusChanged(e), Some(s)) => {
                    assert_eq!(e.from, s, "{jid} moved from a state it was not in");
                    assert!(h.lc.jobs.can(s, e.to), "{jid} {s} -> {}", e.to);
                    status = Some(e.to);
                }
                (Event::JobDeleted(e), Some(s)) => {
                    assert_eq!(e.from, s);
                    assert!(
                        h.lc.jobs.can(s, JobState::Deleted) || s == JobState::Completed,
                        "{jid} {s} -> Deleted"
                    );
                    status = Some(JobState::Deleted);
                }
                (Event::JobCreated(_), Some(_)) => panic!("{jid} created twice"),
                (_, None) => panic!("{jid} has events before its creation"),
                _ => {}
            }
        }
        assert_eq!(
            status,
            Some(h.state.jobs[jid].status),
            "{jid} stream ends elsewhere"
        );
    }
}

fn run(ops: &[Op], coverage: &mut Coverage) {
    let mut h = Harness::new();
    let mut history = History::default();
    for op in ops {
        let cmd = op.command(&h.state);
        let before = h.state.clone();
        let head = h.log.head();
        match h.execute(&cmd) {
            Ok(records) => {
                coverage.accepted += 1;
                check_command_records(op, &before, &records, &mut history);
                if records.is_empty() {
                    assert_eq!(
                        h.log.head(),
                        head,
                        "{op:?}: an empty decision moved the head"
                    );
                }
            }
            Err(rejection) => {
                coverage.rejected += 1;
                assert_eq!(h.log.head(), head, "{op:?}: rejected but appended");
                assert!(h.state == before, "{op:?}: rejected but changed the state");
                check_rejection_message(&rejection);
            }
        }
        check_invariants(&h, &history);
        coverage
            .statuses
            .extend(h.state.jobs.values().map(|j| j.status));
        coverage
            .batch_statuses
            .extend(h.state.batches.values().map(|b| b.status));
    }
    check_job_paths(&h);
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64)
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases(),
        // No regression files are written next to the sources; a failure
        // prints the shrunk sequence, which becomes a named scenario test.
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn random_command_sequences_keep_every_invariant(ops in sequence(1, 54)) {
        run(&ops, &mut Coverage::default());
    }
}

/// The generator reaches deep states often enough for the invariants to
/// mean something: a fixed-seed run over a few sequences sees every job and
/// batch state, and both accepted and rejected commands.
#[test]
fn generated_sequences_reach_every_state() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

    let mut runner = TestRunner::new_with_rng(
        Config::default(),
        TestRng::from_seed(RngAlgorithm::ChaCha, &[7u8; 32]),
    );
    let strategy = sequence(40, 54);
    let mut coverage = Coverage::default();
    for _ in 0..16 {
        let ops = strategy
            .new_tree(&mut runner)
            .expect("generate a sequence")
            .current();
        run(&ops, &mut coverage);
    }
    assert!(coverage.accepted > 0 && coverage.rejected > 0);
    let missing_jobs: Vec<_> = JobState::ALL
        .iter()
        .filter(|s| !coverage.statuses.contains(s))
        .collect();
    let missing_batches: Vec<_> = BatchState::ALL
        .iter()
        .filter(|s| !coverage.batch_statuses.contains(s))
        .collect();
    assert!(
        missing_jobs.is_empty() && missing_batches.is_empty(),
        "no sequence reached job states {missing_jobs:?} / batch states {missing_batches:?} \
         ({} accepted, {} rejected)",
        coverage.accepted,
        coverage.rejected
    );
}
