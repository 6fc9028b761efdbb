//! Builds a big log quickly through the log's own append path: `decide`,
//! then [`ingest_events::log::Group`] staging (one sled batch per batch of
//! jobs, as the engine's group commit writes them), one flush at the end.
//! Used by `benches/log.rs` (start-up and audit figures) and
//! `benches/zk_rebuild.rs` (`ingest rebuild` into ZooKeeper).

use std::time::Instant;

use chrono::Utc;
use ingest_events::command::{decide, Command, JobSpec, Target};
use ingest_events::event::{
    Actor, Erc, Identifiers, InventoryParams, PayloadType, StoreParams, Submission, SubmissionMode,
};
use ingest_events::ids::Jid;
use ingest_events::lifecycle::Lifecycle;
use ingest_events::log::{AppendRequest, Log};
use ingest_events::State;
use uuid::Uuid;

/// The collections batches are spread over.
pub const COLLECTIONS: [&str; 4] = ["demo_content", "ucb_lib", "cdl_dryad", "ucla_dl"];

/// Events one batch of `per_batch` jobs writes: 13 per job plus 5 of the
/// batch's own.
pub fn events_per_batch(per_batch: u64) -> u64 {
    per_batch * 13 + 5
}

/// Jobs (rounded up to whole batches of `per_batch`) for a log of about
/// `events` events.
pub fn jobs_for_events(events: u64, per_batch: u64) -> u64 {
    let per_job = events_per_batch(per_batch) as f64 / per_batch as f64;
    (events as f64 / per_job).ceil() as u64
}

/// Builds a log of `jobs` jobs (rounded up to whole batches of
/// `per_batch`), each taken from submission through every step to
/// Completed and its batch reported, into `log`; returns the state the
/// builder folded along the way.
pub fn build(log: Log, jobs: u64, per_batch: u64) -> State {
    let mut b = Builder {
        log,
        state: State::new(),
        lifecycle: Lifecycle::builtin(),
    };
    let started = Instant::now();
    for n in 1..=jobs.div_ceil(per_batch) {
        b.batch(per_batch);
        if n % 5_000 == 0 {
            eprintln!(
                "  built {} events in {:.0} s",
                b.log.head().0,
                started.elapsed().as_secs_f64()
            );
        }
    }
    let head = b.log.head().0;
    b.log.wait_durable(head).expect("final flush");
    b.state
}

/// Decides and appends commands like the engine's writer: each batch's
/// commands staged in one [`ingest_events::log::Group`] (one sled batch, as
/// the engine's group commit writes them), no flush until the end, so that
/// building a big log stays quick.
struct Builder {
    log: Log,
    state: State,
    lifecycle: Lifecycle,
}

struct Staging<'a, 'g> {
    group: &'a mut ingest_events::log::Group<'g>,
    state: &'a mut State,
    lifecycle: &'a Lifecycle,
}

impl Staging<'_, '_> {
    fn run(&mut self, command: Command) {
        // Several actors and collections, as a repository has, so the
        // audit indexes have something to tell apart.
        let actor = match &command {
            Command::SubmitBatch { .. } => Actor::depositor("alice"),
            Command::StartJob { jid } | Command::SetJobStatus { jid, .. } => {
                Actor::worker(format!("w{}", jid.0 % 4))
            }
            _ => Actor::worker("bench"),
        };
        let decision = decide(self.state, self.lifecycle, &command)
            .unwrap_or_else(|r| panic!("{command:?} rejected: {r}"));
        let appended = match self.group.stage(&AppendRequest {
            actor,
            correlation_id: Uuid::new_v4(),
            timestamp: Utc::now(),
            expectations: decision.expectations,
            events: decision.events,
        }) {
            Ok(Ok(a)) => a,
            Ok(Err(c)) => panic!("conflict: {c}"),
            Err(e) => panic!("append: {e}"),
        };
        for r in &appended.records {
            self.state.apply(r).expect("fold while building");
        }
    }
}

impl Builder {
    /// One batch of `jobs` jobs from submission through every step to its
    /// report, written as one group.
    fn batch(&mut self, jobs: u64) {
        let mut group = self.log.begin_group();
        let mut s = Staging {
            group: &mut group,
            state: &mut self.state,
            lifecycle: &self.lifecycle,
        };
        s.batch(jobs);
        group.commit().expect("commit a group");
    }
}

impl Staging<'_, '_> {
    fn batch(&mut self, jobs: u64) {
        let bid = self.state.next_bid();
        self.run(Command::SubmitBatch {
            uuid: Uuid::new_v4(),
            submission: Submission {
                profile_name: COLLECTIONS[bid.0 as usize % COLLECTIONS.len()].into(),
                submitter: "alice".into(),
                payload_url: format!("https://example.org/{bid}/manifest.checkm"),
                payload_type: PayloadType::ContainerBatchManifest,
                response_type: "json".into(),
                submission_mode: SubmissionMode::Add,
                manifest: vec![],
                erc: Erc::default(),
                digest: None,
                extra: Default::default(),
            },
        });
        let first = self.state.next_jid();
        self.run(Command::AcquireBatch {
            bid,
            jobs: (0..jobs)
                .map(|i| JobSpec {
                    payload_url: format!("https://example.org/{bid}/{i}.zip"),
                    payload_type: PayloadType::Container,
                    identifiers: Identifiers {
                        primary_id: None,
                        local_ids: vec![format!("{bid}-{i}")],
                    },
                    metadata: Erc {
                        who: Some("Doe, Jane".into()),
                        what: Some(format!("Object {i}")),
                        when: Some("2024".into()),
                        r#where: None,
                    },
                    digest: None,
                    priority: None,
                })
                .collect(),
        });
        for jid in (first.0..first.0 + jobs).map(Jid) {
            let success = |message: &str| Command::SetJobStatus {
                jid,
                target: Target::Success,
                message: message.into(),
                priority: None,
            };
            self.run(Command::StartJob { jid });
            self.run(Command::RecordSpace {
                jid,
                space_needed: 1 << 20,
                priority: None,
            });
            self.run(success("estimated")); // -> Provisioning
            self.run(success("provisioned")); // -> Downloading
            self.run(success("downloaded")); // -> Processing
            self.run(Command::RecordIdentifiers {
                jid,
                identifiers: Identifiers {
                    primary_id: Some(format!("ark:/99999/fk4{}", jid.0)),
                    local_ids: vec![],
                },
            });
            self.run(success("processed")); // -> Storing
            self.run(Command::RecordStore {
                jid,
                store: StoreParams {
                    manifest_url: format!("https://example.org/manifests/{jid}"),
                    mode: "add".into(),
                    delete: false,
                },
            });
            self.run(success("stored")); // -> Recording
            self.run(Command::RecordInventory {
                jid,
                inventory: InventoryParams {
                    manifest_url: format!("https://example.org/manifests/{jid}"),
                    mode: "add".into(),
                },
            });
            self.run(success("recorded")); // -> Notify
            self.run(success("notified")); // -> Completed
        }
        self.run(Command::ReportBatch {
            bid,
            notification_error: None,
        });
    }
}

/// Builds the data directory `data` (log and a snapshot at its head) of
/// about `events` events unless it already has a log.
pub fn data_dir(data: &std::path::Path, events: u64, per_batch: u64) {
    let log_dir = ingest_engine::engine::log_dir(data);
    if log_dir.exists() {
        println!("reusing the data directory {}", data.display());
        return;
    }
    std::fs::create_dir_all(&log_dir).expect("create the data directory");
    let started = Instant::now();
    let log = Log::open(&log_dir, &ingest_events::log::LogConfig::default()).expect("open the log");
    let jobs = jobs_for_events(events, per_batch);
    let built = build(log, jobs, per_batch);
    println!(
        "built {} events ({} jobs) in {:.1} s",
        built.position,
        built.jobs.len(),
        started.elapsed().as_secs_f64()
    );
    // An engine that takes snapshots starts from one near the head.
    let mut engine = ingest_engine::engine::Engine::open(ingest_engine::engine::EngineConfig::new(
        data.to_path_buf(),
    ))
    .expect("open the engine");
    engine.snapshot_now().expect("write a snapshot");
}
