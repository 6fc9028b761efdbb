//! Snapshots, signed checkpoints, audit bundles and consistency proofs,
//! on real logs in temporary data directories.

use std::path::Path;

use ingest_engine::audit::{self, Failure, Verified};
use ingest_engine::engine::{CheckpointPolicy, Engine, EngineConfig};
use ingest_engine::snapshot::{self, SnapshotPolicy};
use ingest_events::command::{Command, JobSpec, Target};
use ingest_events::event::{Actor, Erc, Identifiers, PayloadType, Submission, SubmissionMode};
use ingest_events::Bid;
use ingest_steps::signing::SigningKeyFile;
use uuid::Uuid;

fn config(dir: &Path, key: Option<&Path>) -> EngineConfig {
    let mut c = EngineConfig::new(dir);
    c.snapshots = SnapshotPolicy {
        every_events: 0,
        every: None,
        keep: 1000,
    };
    c.checkpoints = CheckpointPolicy {
        key: key.map(Path::to_path_buf),
        every_events: 0,
        every: None,
    };
    c
}

fn open(dir: &Path, key: Option<&Path>) -> Engine {
    Engine::open(config(dir, key)).expect("open the engine")
}

fn run(engine: &mut Engine, command: Command) {
    engine
        .execute(&Actor::admin("test"), &command)
        .unwrap_or_else(|e| panic!("{command:?}: {e}"));
}

/// One batch of `jobs` jobs taken a few steps along; returns its id.
fn batch(engine: &mut Engine, jobs: u64, label: &str) -> Bid {
    let bid = engine.state().next_bid();
    run(
        engine,
        Command::SubmitBatch {
            uuid: Uuid::new_v4(),
            submission: Submission {
                profile_name: "demo_content".into(),
                submitter: "alice".into(),
                payload_url: format!("https://example.org/{label}/manifest.checkm"),
                payload_type: PayloadType::ContainerBatchManifest,
                response_type: "json".into(),
                submission_mode: SubmissionMode::Add,
                manifest: vec![],
                erc: Erc::default(),
                digest: None,
                extra: Default::default(),
            },
        },
    );
    let first = engine.state().next_jid();
    run(
        engine,
        Command::AcquireBatch {
            bid,
            jobs: (0..jobs)
                .map(|i| JobSpec {
                    payload_url: format!("https://example.org/{label}/{i}.zip"),
                    payload_type: PayloadType::Container,
                    identifiers: Identifiers {
                        primary_id: None,
                        local_ids: vec![format!("{label}-{i}")],
                    },
                    metadata: Erc::default(),
                    digest: None,
                    priority: None,
                })
                .collect(),
        },
    );
    for j in 0..jobs {
        let jid = ingest_events::Jid(first.0 + j);
        run(engine, Command::StartJob { jid });
        run(
            engine,
            Command::SetJobStatus {
                jid,
                target: Target::Success,
                message: "estimated".into(),
                priority: None,
            },
        );
    }
    bid
}

#[test]
fn a_snapshot_round_trips_and_start_up_folds_only_the_tail() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (state, frontier, path) = {
        let mut engine = open(dir.path(), None);
        batch(&mut engine, 3, "a");
        let path = engine.snapshot_now().expect("snapshot");
        let state = engine.state().clone();
        let frontier = engine.frontier().clone();
        (state, frontier, path)
    };
    let read = snapshot::read(&path).expect("read the snapshot back");
    assert_eq!(read.state, state);
    assert_eq!(read.frontier, frontier);

    let mut engine = open(dir.path(), None);
    assert_eq!(engine.startup.snapshot, Some(state.position));
    assert_eq!(engine.startup.events, 0, "nothing after the snapshot");
    assert_eq!(engine.state(), &state);
    batch(&mut engine, 2, "b");
    let after = engine.state().clone();
    drop(engine);
    let engine = open(dir.path(), None);
    assert_eq!(engine.startup.snapshot, Some(state.position));
    assert_eq!(engine.startup.events, after.position - state.position);
    assert_eq!(engine.state(), &after);
}

#[test]
fn start_up_from_any_snapshot_gives_the_state_of_the_full_fold() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let mut engine = open(dir.path(), None);
        for (n, label) in ["a", "b", "c", "d"].iter().enumerate() {
            batch(&mut engine, n as u64 + 1, label);
            engine.snapshot_now().expect("snapshot");
        }
        run(
            &mut engine,
            Command::PauseQueue {
                reason: "tail".into(),
            },
        );
    }
    let snaps = snapshot::list(&snapshot::snapshot_dir(dir.path())).expect("list");
    assert_eq!(snaps.len(), 4);
    // The full fold, with no snapshot at all.
    let aside = dir.path().join("aside");
    std::fs::rename(snapshot::snapshot_dir(dir.path()), &aside).expect("move aside");
    let (full_state, full_frontier) = {
        let engine = open(dir.path(), None);
        assert_eq!(engine.startup.snapshot, None);
        (engine.state().clone(), engine.frontier().clone())
    };
    for (position, path) in &snaps {
        let sdir = snapshot::snapshot_dir(dir.path());
        std::fs::create_dir_all(&sdir).expect("mkdir");
        let name = path.file_name().expect("name");
        std::fs::copy(aside.join(name), sdir.join(name)).expect("copy");
        let engine = open(dir.path(), None);
        assert_eq!(engine.startup.snapshot, Some(*position));
        assert_eq!(
            engine.state(),
            &full_state,
            "from the snapshot at {position}"
        );
        assert_eq!(engine.frontier(), &full_frontier);
        drop(engine);
        std::fs::remove_dir_all(&sdir).expect("clear");
    }
}

#[test]
fn a_corrupt_or_foreign_snapshot_is_ignored_and_the_fold_starts_earlier() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (older, full) = {
        let mut engine = open(dir.path(), None);
        batch(&mut engine, 2, "a");
        engine.snapshot_now().expect("older snapshot");
        let older = engine.state().position;
        batch(&mut engine, 2, "b");
        let newest = engine.snapshot_now().expect("newest snapshot");
        // Damage one byte of the newest snapshot's body.
        let mut bytes = std::fs::read(&newest).expect("read");
        let at = bytes.len() - 10;
        bytes[at] ^= 0x40;
        std::fs::write(&newest, bytes).expect("write");
        (older, engine.state().clone())
    };
    let engine = open(dir.path(), None);
    assert_eq!(
        engine.startup.snapshot,
        Some(older),
        "the damaged one is skipped"
    );
    assert_eq!(engine.state(), &full);
    drop(engine);

    // A snapshot of another log (same position, other hashes) does not match.
    let other = tempfile::tempdir().expect("tempdir");
    let foreign = {
        let mut engine = open(other.path(), None);
        batch(&mut engine, 2, "x");
        batch(&mut engine, 2, "y");
        assert_eq!(engine.state().position, full.position);
        engine.snapshot_now().expect("foreign snapshot")
    };
    let sdir = snapshot::snapshot_dir(dir.path());
    std::fs::remove_dir_all(&sdir).expect("clear");
    std::fs::create_dir_all(&sdir).expect("mkdir");
    std::fs::copy(&foreign, sdir.join(foreign.file_name().expect("name"))).expect("copy");
    let engine = open(dir.path(), None);
    assert_eq!(
        engine.startup.snapshot, None,
        "a foreign snapshot is not used"
    );
    assert_eq!(engine.state(), &full);
}

#[test]
fn verify_compares_every_snapshot_with_the_full_fold() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = {
        let mut engine = open(dir.path(), None);
        batch(&mut engine, 2, "a");
        engine.snapshot_now().expect("snapshot")
    };
    let engine = open(dir.path(), None);
    let report = audit::verify(engine.log(), dir.path(), None, |_| {}).expect("verify");
    assert_eq!(report.snapshots_checked, 1);
    assert!(report.log.problems.is_empty(), "{:?}", report.log.problems);
    drop(engine);

    // An intact snapshot whose state is not the fold (a bug that wrote it, or
    // a forged file): start-up trusts it, verify catches it.
    let mut s = snapshot::read(&path).expect("read");
    s.state.paused = true;
    std::fs::remove_file(&path).expect("remove");
    snapshot::write(&snapshot::snapshot_dir(dir.path()), &s).expect("write");
    let engine = open(dir.path(), None);
    let report = audit::verify(engine.log(), dir.path(), None, |_| {}).expect("verify");
    assert_eq!(report.snapshots_checked, 1);
    assert!(
        report
            .log
            .problems
            .iter()
            .any(|p| p.message.contains("differs from the full fold")),
        "{:?}",
        report.log.problems
    );
}

fn key(dir: &Path, name: &str) -> std::path::PathBuf {
    let path = dir.join(name);
    SigningKeyFile::generate(&path).expect("generate a key");
    path
}

#[test]
fn verify_checks_every_signed_checkpoint_and_the_key() {
    let keys = tempfile::tempdir().expect("tempdir");
    let k = key(keys.path(), "engine.key");
    let other = key(keys.path(), "other.key");
    let dir = tempfile::tempdir().expect("tempdir");
    let mut engine = open(dir.path(), Some(&k));
    batch(&mut engine, 2, "a");
    let first = engine.checkpoint_now().expect("checkpoint").expect("a key");
    batch(&mut engine, 1, "b");
    engine.checkpoint_now().expect("checkpoint").expect("a key");
    let head = engine.log().head().0;
    engine.wait_durable(head).expect("durable");
    let cp = &first.records[0];
    assert_eq!(cp.event.kind(), "LogCheckpointed");

    let pinned = SigningKeyFile::load(&k).expect("load").public_key_bytes();
    let report = audit::verify(engine.log(), dir.path(), Some(pinned), |_| {}).expect("verify");
    assert_eq!(report.checkpoints_checked, 2);
    assert!(report.log.problems.is_empty(), "{:?}", report.log.problems);

    let wrong = SigningKeyFile::load(&other)
        .expect("load")
        .public_key_bytes();
    let report = audit::verify(engine.log(), dir.path(), Some(wrong), |_| {}).expect("verify");
    assert_eq!(report.log.problems.len(), 2, "{:?}", report.log.problems);
    assert!(report.log.problems[0].message.contains("not the given key"));
}

/// A data directory with a signed, exported batch; returns the bundle's JSON.
fn exported(dir: &Path, k: &Path) -> (serde_json::Value, [u8; 32]) {
    let mut engine = open(dir, Some(k));
    batch(&mut engine, 1, "before");
    let bid = batch(&mut engine, 3, "audited");
    batch(&mut engine, 1, "after");
    engine.checkpoint_now().expect("checkpoint");
    let head = engine.log().head().0;
    engine.wait_durable(head).expect("durable");
    let bundle = audit::export_batch(engine.log(), engine.state(), bid).expect("export");
    let key = SigningKeyFile::load(k).expect("load").public_key_bytes();
    (serde_json::to_value(bundle).expect("json"), key)
}

fn check(value: &serde_json::Value, key: Option<[u8; 32]>) -> Result<Verified, Vec<Failure>> {
    audit::verify_file(value.to_string().as_bytes(), key)
}

/// Flips the last hex digit of a string field.
fn flip(v: &mut serde_json::Value) {
    let s = v.as_str().expect("a hex string").to_string();
    let last = s.chars().last().expect("not empty");
    let new = if last == '0' { '1' } else { '0' };
    *v = serde_json::Value::String(format!("{}{new}", &s[..s.len() - 1]));
}

#[test]
fn an_audit_bundle_verifies_and_each_kind_of_tampering_is_named() {
    let keys = tempfile::tempdir().expect("tempdir");
    let k = key(keys.path(), "engine.key");
    let dir = tempfile::tempdir().expect("tempdir");
    let (bundle, pinned) = exported(dir.path(), &k);
    match check(&bundle, Some(pinned)) {
        Ok(Verified::Bundle { events, .. }) => assert_eq!(events.len(), 2 + 3 * 3),
        other => panic!("{other:?}"),
    }

    let named = |value: &serde_json::Value, want: fn(&Failure) -> bool| {
        let failures = check(value, None).expect_err("tampering must fail");
        assert!(failures.iter().any(want), "{failures:?}");
    };
    // An event's payload.
    let mut t = bundle.clone();
    flip(&mut t["events"][3]["payload"]);
    named(&t, |f| matches!(f, Failure::Event { .. }));
    // An event's position.
    let mut t = bundle.clone();
    t["events"][3]["position"] =
        serde_json::json!(t["events"][3]["position"].as_u64().expect("n") + 1);
    named(&t, |f| matches!(f, Failure::Event { .. }));
    // A proof node.
    let mut t = bundle.clone();
    flip(&mut t["events"][2]["proof"][0]);
    named(&t, |f| matches!(f, Failure::Proof { .. }));
    // The signature.
    let mut t = bundle.clone();
    flip(&mut t["head"]["signature"]);
    named(&t, |f| matches!(f, Failure::Signature { .. }));
    // The head's root.
    let mut t = bundle.clone();
    flip(&mut t["head"]["root"]);
    named(&t, |f| matches!(f, Failure::Head { .. }));
    // Another key than the one given.
    let other = key(keys.path(), "other.key");
    let wrong = SigningKeyFile::load(&other)
        .expect("load")
        .public_key_bytes();
    let failures = check(&bundle, Some(wrong)).expect_err("wrong key");
    assert!(matches!(failures[0], Failure::Key { .. }), "{failures:?}");
    // Not a bundle.
    let failures = audit::verify_file(b"{\"format\": 7}", None).expect_err("format");
    assert!(matches!(failures[0], Failure::Format(_)), "{failures:?}");
}

#[test]
fn consistency_proofs_verify_and_fail_on_a_rewritten_log() {
    let keys = tempfile::tempdir().expect("tempdir");
    let k = key(keys.path(), "engine.key");
    let dir = tempfile::tempdir().expect("tempdir");
    let (from, to, second) = {
        let mut engine = open(dir.path(), Some(&k));
        batch(&mut engine, 2, "a");
        let from = engine.checkpoint_now().expect("cp").expect("key").records[0]
            .envelope
            .position;
        batch(&mut engine, 3, "b");
        let to = engine.checkpoint_now().expect("cp").expect("key").records[0]
            .envelope
            .position;
        let head = engine.log().head().0;
        engine.wait_durable(head).expect("durable");
        let file = audit::prove(engine.log(), from, to).expect("prove");
        (from, to, serde_json::to_value(file).expect("json"))
    };
    assert!(matches!(
        check(&second, None),
        Ok(Verified::Consistency { .. })
    ));
    let engine = open(dir.path(), Some(&k));
    assert!(audit::prove(engine.log(), to, from).is_err(), "backwards");
    assert!(
        audit::prove(engine.log(), 1, to).is_err(),
        "not a checkpoint"
    );
    drop(engine);

    // The same key signs a log whose early history was rewritten: its new
    // head cannot be proved consistent with the head the auditor kept.
    let forged = tempfile::tempdir().expect("tempdir");
    let forged_file = {
        let mut engine = open(forged.path(), Some(&k));
        batch(&mut engine, 2, "rewritten");
        let f = engine.checkpoint_now().expect("cp").expect("key").records[0]
            .envelope
            .position;
        batch(&mut engine, 3, "b");
        let t = engine.checkpoint_now().expect("cp").expect("key").records[0]
            .envelope
            .position;
        let head = engine.log().head().0;
        engine.wait_durable(head).expect("durable");
        serde_json::to_value(audit::prove(engine.log(), f, t).expect("prove")).expect("json")
    };
    let mut spliced = forged_file.clone();
    spliced["from"] = second["from"].clone();
    let failures = check(&spliced, None).expect_err("a rewritten log");
    assert!(
        failures.iter().any(|f| matches!(f, Failure::Proof { .. })),
        "{failures:?}"
    );
    // A changed proof node.
    let mut t = second.clone();
    flip(&mut t["proof"][0]);
    let failures = check(&t, None).expect_err("a changed node");
    assert!(
        failures.iter().any(|f| matches!(f, Failure::Proof { .. })),
        "{failures:?}"
    );
}

/// A job failed with an unrecoverable kind (a payload whose digest is not
/// the depositor's) stays unrequeueable across restarts: from a snapshot
/// (format 2 keeps the kind) and from the full fold of the log. Each refused
/// requeue appends nothing.
#[test]
fn an_unrecoverable_failure_is_refused_a_requeue_after_every_start_up() {
    use ingest_engine::engine::EngineError;
    use ingest_events::command::{Item, Rejection};
    use ingest_events::event::FailureKind;
    use ingest_events::lifecycle::JobState;

    let dir = tempfile::tempdir().expect("tempdir");
    let jid = {
        let mut engine = open(dir.path(), None);
        batch(&mut engine, 2, "d");
        let jid = ingest_events::Jid(1);
        for (state, success, failure) in [
            (JobState::Provisioning, true, None),
            (
                JobState::Downloading,
                false,
                Some(FailureKind::DigestMismatch),
            ),
        ] {
            let outcome = Command::outcome(jid, state, success, "sha256 mismatch", failure);
            run(&mut engine, outcome);
        }
        engine.snapshot_now().expect("snapshot");
        jid
    };
    let requeue = Command::RequeueJob {
        jid,
        reason: "try again".into(),
    };
    let refused = |engine: &mut Engine| {
        let head = engine.state().position;
        let err = engine
            .execute(&Actor::admin("test"), &requeue)
            .expect_err("an unrecoverable failure is requeued");
        assert!(
            matches!(
                err,
                EngineError::Rejected(Rejection::UnrecoverableFailure {
                    item: Item::Job(j),
                    kind: FailureKind::DigestMismatch,
                }) if j == jid
            ),
            "{err:?}"
        );
        assert!(
            err.to_string().contains("a new submission is required"),
            "{err}"
        );
        assert_eq!(engine.state().position, head, "a refusal appended");
        assert_eq!(engine.state().jobs[&jid].status, JobState::Failed);
    };
    let mut engine = open(dir.path(), None);
    assert!(
        engine.startup.snapshot.is_some(),
        "started from the snapshot"
    );
    refused(&mut engine);
    drop(engine);
    std::fs::remove_dir_all(dir.path().join(snapshot::SNAPSHOT_DIR)).expect("remove snapshots");
    let mut engine = open(dir.path(), None);
    assert_eq!(engine.startup.snapshot, None, "folded the whole log");
    refused(&mut engine);
    // The job may still be deleted.
    run(
        &mut engine,
        Command::DeleteJob {
            jid,
            reason: "resubmitted".into(),
        },
    );
}

/// The snapshot's header length and where its format and checksum are.
const HEADER_LEN: usize = 100;

/// Re-seals a snapshot file whose body was changed: the body's length and
/// BLAKE3 in the header, as an intact file of that body would have them.
fn reseal(bytes: &mut [u8]) {
    let body_len = (bytes.len() - HEADER_LEN) as u64;
    bytes[60..68].copy_from_slice(&body_len.to_le_bytes());
    let sum = blake3::hash(&bytes[HEADER_LEN..]);
    bytes[68..100].copy_from_slice(sum.as_bytes());
}

#[test]
fn a_snapshot_split_into_many_parts_round_trips() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut engine = open(dir.path(), None);
    for label in ["a", "b", "c", "d", "e"] {
        batch(&mut engine, 3, label);
    }
    let state = engine.state().clone();
    // Two entries per part: 3 parts of batches, 8 of jobs, and the rest.
    let path = snapshot::write_split(
        &snapshot::snapshot_dir(dir.path()),
        engine.state(),
        engine.frontier(),
        2,
    )
    .expect("write");
    drop(engine);
    let bytes = std::fs::read(&path).expect("read");
    assert_eq!(&bytes[16..20], &4u32.to_le_bytes(), "format 4");
    assert_eq!(
        u32::from_le_bytes(bytes[HEADER_LEN..HEADER_LEN + 4].try_into().expect("4")),
        1 + 3 + 8,
        "one part for the rest, then the batches' and the jobs' parts"
    );
    assert_eq!(snapshot::read(&path).expect("read back").state, state);
    let engine = open(dir.path(), None);
    assert_eq!(engine.startup.snapshot, Some(state.position));
    assert_eq!(engine.state(), &state);
    // Start-up says what it read (the newest snapshot, read while the log
    // opened).
    assert_eq!(engine.startup.snapshot_load.files, 1);
    assert_eq!(engine.startup.snapshot_load.bytes, bytes.len() as u64);
}

#[test]
fn a_snapshot_of_an_older_format_is_skipped_and_the_log_folded() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut engine = open(dir.path(), None);
    batch(&mut engine, 3, "a");
    let state = engine.state().clone();
    // Format 2, as written before the body was split into parts and access
    // requests kept their packaging: the header, then one bincode of the
    // state and the Merkle tree. Its state's layout is not this build's.
    let body = bincode::serde::encode_to_vec(
        (engine.state(), engine.frontier()),
        bincode::config::standard(),
    )
    .expect("encode");
    let mut bytes = Vec::new();
    bytes.extend_from_slice(b"ingest-snapshot\n");
    bytes.extend_from_slice(&2u32.to_le_bytes());
    bytes.extend_from_slice(&state.position.to_le_bytes());
    bytes.extend_from_slice(&state.head_hash);
    bytes.extend_from_slice(&[0; 40]);
    bytes.extend_from_slice(&body);
    reseal(&mut bytes);
    drop(engine);
    let sdir = snapshot::snapshot_dir(dir.path());
    std::fs::create_dir_all(&sdir).expect("mkdir");
    std::fs::write(
        sdir.join(format!("state-{:020}.snap", state.position)),
        bytes,
    )
    .expect("write");
    let engine = open(dir.path(), None);
    assert_eq!(engine.startup.snapshot, None, "format 2 skipped");
    assert!(engine.startup.events > 0, "the log was folded");
    assert_eq!(engine.state(), &state);
}

#[test]
fn a_snapshot_whose_parts_are_out_of_order_is_ignored() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut engine = open(dir.path(), None);
    batch(&mut engine, 4, "a");
    let state = engine.state().clone();
    let sdir = snapshot::snapshot_dir(dir.path());
    // One job per part: parts 0 (the rest), 1 (the batch), 2-5 (the jobs).
    let path = snapshot::write_split(&sdir, engine.state(), engine.frontier(), 1).expect("write");
    drop(engine);
    let mut bytes = std::fs::read(&path).expect("read");
    // Swap the first two jobs' parts (table entries and bytes), then
    // re-seal the checksum: an intact file whose jobs are out of order.
    let count = u32::from_le_bytes(bytes[HEADER_LEN..HEADER_LEN + 4].try_into().expect("4"));
    assert_eq!(count, 6);
    let table = HEADER_LEN + 4;
    let entry = |b: &[u8], i: usize| b[table + i * 17..table + (i + 1) * 17].to_vec();
    let stored = |e: &[u8]| u64::from_le_bytes(e[1..9].try_into().expect("8")) as usize;
    let mut at = table + count as usize * 17;
    let mut parts = Vec::new();
    for i in 0..count as usize {
        let e = entry(&bytes, i);
        parts.push((e.clone(), bytes[at..at + stored(&e)].to_vec()));
        at += stored(&e);
    }
    parts.swap(2, 3);
    let mut body = count.to_le_bytes().to_vec();
    for (e, _) in &parts {
        body.extend_from_slice(e);
    }
    for (_, p) in &parts {
        body.extend_from_slice(p);
    }
    bytes.truncate(HEADER_LEN);
    bytes.extend_from_slice(&body);
    reseal(&mut bytes);
    std::fs::write(&path, &bytes).expect("write");
    let err = snapshot::read(&path).expect_err("refused");
    assert!(err.to_string().contains("ascending order"), "{err}");
    let engine = open(dir.path(), None);
    assert_eq!(engine.startup.snapshot, None, "the fold starts earlier");
    assert_eq!(engine.state(), &state);
}

// Regression: a snapshot write killed half-way (or one that failed) left its
// temporary file for ever; after ENOSPC it held all the space that was free.
#[test]
fn a_temporary_snapshot_file_left_by_a_killed_write_is_removed_at_open() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut engine = open(dir.path(), None);
    batch(&mut engine, 2, "a");
    drop(engine);
    let sdir = snapshot::snapshot_dir(dir.path());
    std::fs::create_dir_all(&sdir).expect("snapshot dir");
    // The name a write in progress uses, as a kill would leave it.
    let left = sdir.join(".state-00000000000000000002.snap.tmp");
    std::fs::write(&left, b"half a snapshot").expect("plant");
    let other = sdir.join("notes.txt");
    std::fs::write(&other, b"not ours").expect("plant");
    let engine = open(dir.path(), None);
    assert!(!left.exists(), "the temporary file is still there");
    assert!(
        other.exists(),
        "a file that is not a snapshot's was removed"
    );
    drop(engine);
}

#[test]
fn a_failed_snapshot_write_leaves_no_temporary_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut engine = open(dir.path(), None);
    batch(&mut engine, 2, "a");
    let sdir = snapshot::snapshot_dir(dir.path());
    // A non-empty directory under the snapshot's own name: the data is
    // written and synced, then the rename fails.
    let target = sdir.join(format!("state-{:020}.snap", engine.state().position));
    std::fs::create_dir_all(target.join("blocker")).expect("blocker");
    let failed = engine.snapshot_now();
    assert!(failed.is_err(), "the write should fail: {failed:?}");
    let left: Vec<String> = std::fs::read_dir(&sdir)
        .expect("list")
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert!(left.is_empty(), "temporary files left: {left:?}");
}

/// A replica copies records from a peer (`Engine::import`, what bootstrap
/// and following do): each signed checkpoint among them must sign the
/// records before it, by this engine's key when it has one. A peer whose
/// history is a valid chain but whose heads another key signed is refused,
/// and nothing is written.
#[test]
fn imported_signed_checkpoints_must_hold_and_be_signed_by_the_groups_key() {
    let dir = tempfile::tempdir().expect("tmp");
    let ours = dir.path().join("ours.pem");
    let theirs = dir.path().join("theirs.pem");
    SigningKeyFile::generate(&ours).expect("key");
    SigningKeyFile::generate(&theirs).expect("key");

    // A peer signing with the group's key, and one signing with another.
    let frames = |key: &Path, name: &str| -> Vec<u8> {
        let mut peer = open(&dir.path().join(name), Some(key));
        batch(&mut peer, 2, name);
        peer.checkpoint_now().expect("checkpoint").expect("a key");
        batch(&mut peer, 1, name);
        let head = peer.log().head().0;
        let mut all = Vec::new();
        for f in peer.log().read_frames(1, head, usize::MAX) {
            all.extend(f.expect("frames").1);
        }
        all
    };
    let good = frames(&ours, "peer-good");
    let forged = frames(&theirs, "peer-forged");

    let mut replica = open(&dir.path().join("replica"), Some(&ours));
    let err = replica.import(&forged).expect_err("another key's heads");
    let text = err.to_string();
    assert!(text.contains("signed checkpoint was made by key"), "{text}");
    assert_eq!(replica.log().head().0, 0, "nothing of the refused frame");
    let records = replica.import(&good).expect("the group's key");
    assert_eq!(replica.log().head().0, records.len() as u64);

    // Without a key of its own a replica still checks that each head signs
    // the records before it: both peers' histories hold.
    let mut keyless = open(&dir.path().join("keyless"), None);
    keyless.import(&forged).expect("self-consistent heads");
}
