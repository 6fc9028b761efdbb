//! Golden byte fixtures of the stored record format.
//!
//! Old logs must stay readable for as long as the archive exists, so the exact
//! bytes the log writes for each event kind are checked in under
//! `tests/fixtures/`:
//!
//! - `v2/<Kind>.bin`: one record of every kind in [`Event::KINDS`], in the
//!   current schema (2), as [`codec::encode_for_fixture`] writes it (the same
//!   path as [`ingest_events::Log::append`]). A few kinds have a second
//!   fixture, `v2/<Kind>.none.bin`, with the optional fields empty.
//! - `v1/JobStatusChanged.bin`: a schema-1 record, which is decoded through
//!   the upcaster (`retry: false`, `priority: None`).
//!
//! Each fixture is built from a fixed envelope and a fixed event value in
//! [`cases`]; the tests check that the checked-in bytes decode to exactly
//! that record, that encoding the value again gives the same bytes, and that
//! any damaged byte is detected.
//!
//! ## Creating fixtures
//! A fixture that is missing fails the tests. To create the missing ones
//! (for a new event kind, or a new schema version) run
//!
//! ```text
//! INGEST_BLESS=1 cargo test -p ingest-events --test golden
//! ```
//!
//! Blessing only ever writes files that do not exist; it never overwrites a
//! fixture, because a fixture that no longer matches is exactly what these
//! tests are for: it means old logs would no longer read back. If a payload
//! must change, add a schema version with an upcaster instead and give it
//! fixtures of its own. Commit the new files with the change.
//!
//! A new event kind needs a case in [`cases`] too; [`every_kind_has_a_v2_fixture`]
//! fails until it has one.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use chrono::{DateTime, TimeZone, Utc};
use ingest_events::codec::{self, v1, DecodeError, Envelope, SCHEMA_VERSION};
use ingest_events::event::{
    self, Actor, Digest, Erc, Event, Identifiers, InventoryParams, JobConfiguration, PayloadType,
    StoreParams, StreamId, Submission, SubmissionMode,
};
use ingest_events::lifecycle::{AccessState, JobState};
use ingest_events::{Bid, Jid, Qid, Recorded};
use uuid::Uuid;

/// One fixture: a file name under `fixtures/v2/` and the record it holds.
struct Case {
    file: String,
    envelope: Envelope,
    event: Event,
}

fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn timestamp() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2024, 5, 16, 10, 11, 12)
        .single()
        .expect("a valid fixed time")
        + chrono::Duration::microseconds(345_678)
}

/// A fixed envelope that varies with the case number, so the fixtures cover
/// one-byte and multi-byte integer encodings and every kind of actor.
fn envelope(n: u64, stream: StreamId, actor: Actor) -> Envelope {
    let mut prev_hash = [0u8; 32];
    for (k, b) in prev_hash.iter_mut().enumerate() {
        *b = (k as u64 * 31 + n * 7 + 1) as u8;
    }
    Envelope {
        position: if n % 2 == 0 { 4_000_000_000 + n } else { 2 + n },
        stream,
        version: if n % 3 == 0 { 70_000 + n } else { 1 + n },
        timestamp: timestamp() + chrono::Duration::seconds(n as i64),
        actor,
        correlation_id: Uuid::from_u128(0x0123_4567_89ab_cdef_fedc_ba98_7654_3210 + u128::from(n)),
        schema_version: SCHEMA_VERSION,
        prev_hash,
        // Filled in from the encoding (the record's own hash).
        hash: [0u8; 32],
    }
}

fn full_erc() -> Erc {
    Erc {
        who: Some("Doe, Jane; Example Library".into()),
        what: Some("Letters from Überlingen, 1901–1903".into()),
        when: Some("1901/1903".into()),
        r#where: Some("ark:/13030/m5rn35s8".into()),
    }
}

fn sha256() -> Digest {
    Digest {
        algorithm: "sha256".into(),
        value: "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08".into(),
    }
}

fn identifiers() -> Identifiers {
    Identifiers {
        primary_id: Some("ark:/13030/m5abc123".into()),
        local_ids: vec!["loc001".into(), "local id with spaces".into()],
    }
}

/// Every fixture and the record it holds.
fn cases() -> Vec<Case> {
    let bid = StreamId::Batch(Bid(7));
    let jid = StreamId::Job(Jid(1_234_567));
    let sys = StreamId::System;
    let engine = Actor::engine;
    let admin = || Actor::admin("alice");
    let worker = || Actor::worker("downloading-1@host.example.org");
    let depositor = || Actor::depositor("Jane Doe <jane@example.org>");

    let full_submission = Submission {
        profile_name: "ucb_lib_content".into(),
        submitter: "jdoe/Jane Doe".into(),
        payload_url: "https://example.org/deposits/batch-ü.checkm".into(),
        payload_type: PayloadType::BatchManifest,
        response_type: "xml".into(),
        submission_mode: SubmissionMode::Update,
        manifest: vec![
            "file1.checkm loc001".into(),
            "file3.checkm loc003 ark:/13030/m5abc123".into(),
        ],
        erc: full_erc(),
        digest: Some(sha256()),
        extra: BTreeMap::from([
            ("notification".to_string(), "jane@example.org".to_string()),
            ("title".to_string(), "Ünïcödé title".to_string()),
        ]),
    };
    let empty_submission = Submission {
        profile_name: "p".into(),
        submitter: "s".into(),
        payload_url: "https://example.org/a.zip".into(),
        payload_type: PayloadType::File,
        response_type: String::new(),
        submission_mode: SubmissionMode::Add,
        manifest: vec![],
        erc: Erc::default(),
        digest: None,
        extra: BTreeMap::new(),
    };
    let some_jobs = vec![Jid(1), Jid(2), Jid(300), Jid(9_999_999_999)];

    let list: Vec<(&str, StreamId, Actor, Event)> = vec![
        (
            "BatchSubmitted",
            bid,
            depositor(),
            event::BatchSubmitted {
                uuid: Uuid::from_u128(0x6f1c_2b3a_9d4e_4f50_8a61_7b82_c9d0_e1f2),
                submission: full_submission,
            }
            .into(),
        ),
        (
            "BatchSubmitted.none",
            bid,
            depositor(),
            event::BatchSubmitted {
                uuid: Uuid::nil(),
                submission: empty_submission,
            }
            .into(),
        ),
        (
            "BatchHeld",
            bid,
            worker(),
            event::BatchHeld {
                reason: "collection ucb_lib_content is held".into(),
            }
            .into(),
        ),
        (
            "BatchReleased",
            bid,
            admin(),
            event::BatchReleased {
                reason: "hold lifted after migration".into(),
            }
            .into(),
        ),
        (
            "BatchAcquired",
            bid,
            worker(),
            event::BatchAcquired {
                jobs: some_jobs.clone(),
            }
            .into(),
        ),
        (
            "BatchReportingStarted",
            bid,
            engine(),
            event::BatchReportingStarted {
                reason: "every job finished, some failed".into(),
            }
            .into(),
        ),
        (
            "BatchReported",
            bid,
            worker(),
            event::BatchReported {
                successful_jobs: vec![Jid(1), Jid(300)],
                failed_jobs: vec![Jid(2), Jid(9_999_999_999)],
                update: true,
            }
            .into(),
        ),
        (
            "BatchUpdateReporting",
            bid,
            admin(),
            event::BatchUpdateReporting {
                reason: "failed jobs resolved".into(),
            }
            .into(),
        ),
        (
            "BatchCompleted",
            bid,
            worker(),
            event::BatchCompleted {
                message: "4 job(s) completed".into(),
            }
            .into(),
        ),
        (
            "BatchFailed",
            bid,
            worker(),
            event::BatchFailed {
                message: "the report could not be sent: 550 mailbox unavailable".into(),
            }
            .into(),
        ),
        (
            "BatchDeleted",
            bid,
            admin(),
            event::BatchDeleted {
                reason: "duplicate deposit".into(),
            }
            .into(),
        ),
        (
            "BatchCleanedUp",
            bid,
            engine(),
            event::BatchCleanedUp {
                jobs: some_jobs.clone(),
            }
            .into(),
        ),
        (
            "JobCreated",
            jid,
            worker(),
            event::JobCreated {
                bid: Bid(7),
                priority: 7,
                configuration: JobConfiguration {
                    profile_name: "ucb_lib_content".into(),
                    submitter: "jdoe/Jane Doe".into(),
                    payload_url: "https://example.org/deposits/file1.checkm".into(),
                    payload_type: PayloadType::ObjectManifest,
                    response_type: "xml".into(),
                    submission_mode: SubmissionMode::Update,
                    digest: Some(Digest {
                        algorithm: "md5".into(),
                        value: "d41d8cd98f00b204e9800998ecf8427e".into(),
                    }),
                },
                identifiers: identifiers(),
                metadata: full_erc(),
            }
            .into(),
        ),
        (
            "JobStatusChanged",
            jid,
            admin(),
            event::JobStatusChanged {
                from: JobState::Failed,
                to: JobState::Storing,
                message: "requeued after storage outage".into(),
                retry: true,
                priority: Some(99),
            }
            .into(),
        ),
        (
            "JobStatusChanged.none",
            jid,
            worker(),
            event::JobStatusChanged {
                from: JobState::Pending,
                to: JobState::Estimating,
                message: String::new(),
                retry: false,
                priority: None,
            }
            .into(),
        ),
        (
            "JobSpaceEstimated",
            jid,
            worker(),
            event::JobSpaceEstimated {
                space_needed: 1_000_000_000_000,
                priority: Some(10),
            }
            .into(),
        ),
        (
            "JobSpaceEstimated.none",
            jid,
            worker(),
            event::JobSpaceEstimated {
                space_needed: 0,
                priority: None,
            }
            .into(),
        ),
        (
            "JobIdentifiersAssigned",
            jid,
            worker(),
            event::JobIdentifiersAssigned {
                identifiers: identifiers(),
            }
            .into(),
        ),
        (
            "JobStoreRecorded",
            jid,
            worker(),
            event::JobStoreRecorded {
                store: StoreParams {
                    manifest_url: "https://store.example.org/manifests/jid1234567.txt".into(),
                    mode: "update".into(),
                    delete: true,
                },
            }
            .into(),
        ),
        (
            "JobInventoryRecorded",
            jid,
            worker(),
            event::JobInventoryRecorded {
                inventory: InventoryParams {
                    manifest_url: "https://store.example.org/manifests/jid1234567.txt".into(),
                    mode: "add".into(),
                },
            }
            .into(),
        ),
        (
            "JobDeleted",
            jid,
            admin(),
            event::JobDeleted {
                from: JobState::Held,
                reason: "withdrawn by depositor".into(),
            }
            .into(),
        ),
        (
            "JobStepRetried",
            jid,
            worker(),
            event::JobStepRetried {
                state: JobState::Downloading,
                attempt: 300,
                message: "GET https://example.org/a.zip: connection reset".into(),
            }
            .into(),
        ),
        (
            "CollectionHeld",
            sys,
            admin(),
            event::CollectionHeld {
                profile: "ucb_lib_content".into(),
                reason: "storage migration".into(),
            }
            .into(),
        ),
        (
            "CollectionReleased",
            sys,
            admin(),
            event::CollectionReleased {
                profile: "ucb_lib_content".into(),
                reason: "migration done".into(),
            }
            .into(),
        ),
        (
            "QueuePaused",
            sys,
            admin(),
            event::QueuePaused {
                reason: "ZFS at 95%".into(),
            }
            .into(),
        ),
        (
            "QueueResumed",
            sys,
            admin(),
            event::QueueResumed {
                reason: "space freed".into(),
            }
            .into(),
        ),
        (
            "TreeRepaired",
            sys,
            admin(),
            event::TreeRepaired {
                paths: vec![
                    "/jobs/states/pending/05-jid0000000001".into(),
                    "/batches/bid0000000007/states/batch-processing/jid0000000001".into(),
                ],
            }
            .into(),
        ),
        (
            "LogCheckpointed",
            sys,
            Actor::engine(),
            event::LogCheckpointed {
                tree_size: 1_000_000,
                root: [0xab; 32],
                public_key: [0x11; 32],
                signature: vec![0x22; 64],
            }
            .into(),
        ),
        (
            "ConsistencyRepaired",
            sys,
            admin(),
            event::ConsistencyRepaired {
                finding: "stale-lock-0123456789abcdef".into(),
                rule: "stale-lock".into(),
                action: "delete-node".into(),
                paths: vec!["/jobs/jid0000000001/lock".into()],
                reason: "left by a crashed tool".into(),
            }
            .into(),
        ),
        (
            "FaultsArmed",
            sys,
            admin(),
            event::FaultsArmed {
                state: JobState::Storing,
                count: 2,
                reason: "disk test".into(),
            }
            .into(),
        ),
        (
            "FaultFired",
            sys,
            worker(),
            event::FaultFired {
                state: JobState::Storing,
                jid: Jid(1_234_567),
            }
            .into(),
        ),
        (
            "FaultsCleared",
            sys,
            admin(),
            event::FaultsCleared { disarmed: 1 }.into(),
        ),
        (
            "AccessRequested",
            StreamId::Access(Qid(42)),
            depositor(),
            event::AccessRequested {
                queue: event::AccessQueue::Large,
                token: event::AccessToken {
                    token: "bf6ef133-9b05-4fd8-a4d1-845c40125315".into(),
                    ark: "ark:/99999/fk4ü".into(),
                    version: 3,
                    format: "zip".into(),
                    size: 600_000_000,
                    delivery_node: 7001,
                },
            }
            .into(),
        ),
        (
            "AccessStatusChanged",
            StreamId::Access(Qid(42)),
            admin(),
            event::AccessStatusChanged {
                from: AccessState::Failed,
                to: AccessState::Pending,
                message: "storage node back".into(),
                requeue: true,
            }
            .into(),
        ),
        (
            "AccessQueuePaused",
            sys,
            admin(),
            event::AccessQueuePaused {
                queue: event::AccessQueue::Small,
                reason: "maintenance".into(),
            }
            .into(),
        ),
        (
            "AccessQueueResumed",
            sys,
            admin(),
            event::AccessQueueResumed {
                queue: event::AccessQueue::Large,
                reason: "done".into(),
            }
            .into(),
        ),
        // New cases go last: a case's envelope depends on its place.
        (
            "JobFailureClassified",
            jid,
            worker(),
            event::JobFailureClassified {
                kind: event::FailureKind::DigestMismatch,
            }
            .into(),
        ),
        (
            "ForeignChangeRepaired",
            jid,
            engine(),
            event::ForeignChangeRepaired {
                item: "job jid0001234567".into(),
                nodes: vec![
                    event::ForeignNode {
                        kind: event::ForeignChangeKind::Changed,
                        path: "/jobs/jid0001234567/status".into(),
                        found: r#"{"status":"Estimating"}"#.into(),
                        zxid: 0x1_0000_002a,
                        mtime: 1_700_000_000_123,
                        session: 0,
                    },
                    event::ForeignNode {
                        kind: event::ForeignChangeKind::Missing,
                        path: "/jobs/states/pending/05-jid0001234567".into(),
                        found: String::new(),
                        zxid: 0,
                        mtime: 0,
                        session: 0,
                    },
                    event::ForeignNode {
                        kind: event::ForeignChangeKind::Extra,
                        path: "/jobs/states/estimating/05-jid0001234567".into(),
                        found: String::new(),
                        zxid: 0x1_0000_002b,
                        mtime: 1_700_000_000_124,
                        session: 0x1000_0000_0000_0007,
                    },
                ],
                reason: "delete /jobs/states/pending/05-jid0001234567 failed (node not exists)"
                    .into(),
            }
            .into(),
        ),
        (
            "AccessPackagingChosen",
            StreamId::Access(Qid(42)),
            Actor::depositor("access"),
            event::AccessPackagingChosen {
                packaging: event::AccessPackaging {
                    content: event::AccessContent::Full,
                    bag: true,
                },
            }
            .into(),
        ),
        (
            "AccessDelivered",
            StreamId::Access(Qid(42)),
            Actor::worker("w1"),
            event::AccessDelivered {
                delivery: event::AccessDelivery {
                    url: "https://ingest.example.org/deliveries/1900000000-abababababababababababababababab.zip".into(),
                    size: 925,
                    sha256: "ab".repeat(32),
                    target: "primary".into(),
                    version: 2,
                    ready: chrono::DateTime::from_timestamp(1_800_000_000, 0).expect("a time"),
                    expires: chrono::DateTime::from_timestamp(1_900_000_000, 0).expect("a time"),
                },
            }
            .into(),
        ),
    ];
    list.into_iter()
        .enumerate()
        .map(|(n, (file, stream, actor, event))| {
            let mut envelope = envelope(n as u64, stream, actor);
            envelope.hash = codec::encode_for_fixture(&envelope, &event).1;
            Case {
                file: format!("{file}.bin"),
                envelope,
                event,
            }
        })
        .collect()
}

fn blessing() -> bool {
    std::env::var("INGEST_BLESS").is_ok_and(|v| v == "1")
}

/// The checked-in bytes of a fixture. Missing: written from `make` when
/// blessing (never over an existing file), else a failure that says how to
/// create it.
fn fixture(relative: &str, make: impl FnOnce() -> Vec<u8>) -> Vec<u8> {
    let path = fixtures_dir().join(relative);
    match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            assert!(
                blessing(),
                "golden fixture {} is missing; create it with \
                 `INGEST_BLESS=1 cargo test -p ingest-events --test golden` and commit it",
                path.display()
            );
            let bytes = make();
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent)
                    .unwrap_or_else(|e| panic!("create {}: {e}", parent.display()));
            }
            // `create_new` so that a fixture written concurrently by another
            // test of this file is never overwritten either.
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&path)
            {
                Ok(mut f) => {
                    use std::io::Write;
                    f.write_all(&bytes)
                        .unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
                    eprintln!("blessed new fixture {}", path.display());
                    bytes
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    std::fs::read(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
                }
                Err(e) => panic!("create {}: {e}", path.display()),
            }
        }
        Err(e) => panic!("read {}: {e}", path.display()),
    }
}

fn v2_bytes(case: &Case) -> Vec<u8> {
    fixture(&format!("v2/{}", case.file), || {
        codec::encode_for_fixture(&case.envelope, &case.event).0
    })
}

fn expected(case: &Case) -> Recorded {
    Recorded {
        envelope: case.envelope.clone(),
        event: case.event.clone(),
    }
}

/// The stored hash is the last 32 bytes of a record (bincode writes a
/// `[u8; 32]` as its 32 bytes, and the hash is the record's last field).
fn trailing_hash(bytes: &[u8]) -> [u8; 32] {
    bytes[bytes.len() - 32..]
        .try_into()
        .expect("a record is longer than 32 bytes")
}

#[test]
fn every_kind_has_a_v2_fixture() {
    let cases = cases();
    for case in &cases {
        let stem = case.file.trim_end_matches(".bin");
        let kind = stem.split('.').next().unwrap_or(stem);
        assert_eq!(
            kind,
            case.event.kind(),
            "fixture {} holds a {} event",
            case.file,
            case.event.kind()
        );
    }
    for kind in Event::KINDS {
        let file = format!("{kind}.bin");
        let case = cases.iter().find(|c| c.file == file).unwrap_or_else(|| {
            panic!(
                "event kind {kind} has no golden fixture: add a case for it to `cases()` in \
                 events/tests/golden.rs, then create the file with \
                 `INGEST_BLESS=1 cargo test -p ingest-events --test golden`"
            )
        });
        v2_bytes(case);
        assert!(fixtures_dir().join("v2").join(&file).is_file());
    }
}

#[test]
fn every_v2_fixture_file_has_a_case() {
    // A fixture file nothing checks would give false comfort.
    let known: BTreeSet<String> = cases().into_iter().map(|c| c.file).collect();
    for case in cases() {
        v2_bytes(&case);
    }
    let dir = fixtures_dir().join("v2");
    let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("read {}: {e}", dir.display()));
    for entry in entries {
        let name = entry
            .expect("a directory entry")
            .file_name()
            .to_string_lossy()
            .into_owned();
        assert!(
            known.contains(&name),
            "fixtures/v2/{name} is not checked by any case in golden.rs"
        );
    }
}

#[test]
fn v2_fixtures_decode_to_the_expected_record() {
    for case in cases() {
        let bytes = v2_bytes(&case);
        let decoded = codec::decode_record(&bytes)
            .unwrap_or_else(|e| panic!("fixture {} does not decode: {e}", case.file));
        assert_eq!(decoded, expected(&case), "fixture {}", case.file);
        assert_eq!(decoded.envelope.schema_version, 2, "fixture {}", case.file);
        assert_eq!(
            decoded.envelope.hash,
            trailing_hash(&bytes),
            "fixture {}",
            case.file
        );
    }
}

#[test]
fn v2_fixtures_reencode_byte_for_byte() {
    for case in cases() {
        let bytes = v2_bytes(&case);
        let (encoded, hash) = codec::encode_for_fixture(&case.envelope, &case.event);
        assert!(
            encoded == bytes,
            "encoding the value of fixture {} no longer gives the checked-in bytes: \
             old logs would not read back the same; add a schema version instead \
             (checked-in {} bytes, now {} bytes)",
            case.file,
            bytes.len(),
            encoded.len()
        );
        assert_eq!(hash, case.envelope.hash);
    }
}

#[test]
fn current_schema_is_the_one_the_v2_fixtures_pin() {
    // A schema bump needs its own fixtures directory and this test updated.
    assert_eq!(SCHEMA_VERSION, 2);
}

fn v1_case() -> (Envelope, v1::JobStatusChanged) {
    let mut envelope = envelope(1000, StreamId::Job(Jid(42)), Actor::worker("notify-1"));
    envelope.schema_version = 1;
    let old = v1::JobStatusChanged {
        from: JobState::Notify,
        to: JobState::Completed,
        message: "callback answered 200".into(),
    };
    (envelope, old)
}

fn v1_bytes() -> Vec<u8> {
    let (envelope, old) = v1_case();
    fixture("v1/JobStatusChanged.bin", || {
        codec::encode_v1_job_status_changed_for_fixture(&envelope, &old)
    })
}

#[test]
fn v1_job_status_changed_is_upcast() {
    let bytes = v1_bytes();
    let (mut envelope, old) = v1_case();
    let decoded = codec::decode_record(&bytes).expect("the v1 fixture decodes");
    envelope.hash = trailing_hash(&bytes);
    assert_eq!(
        decoded,
        Recorded {
            envelope,
            event: Event::JobStatusChanged(event::JobStatusChanged {
                from: JobState::Notify,
                to: JobState::Completed,
                message: "callback answered 200".into(),
                retry: false,
                priority: None,
            }),
        }
    );
    assert_eq!(decoded.envelope.schema_version, 1);

    // The schema-1 writer still produces the checked-in bytes …
    let (envelope, _) = v1_case();
    assert!(codec::encode_v1_job_status_changed_for_fixture(&envelope, &old) == bytes);
    // … and the same move written today is a different (schema 2) record.
    let mut now = envelope.clone();
    now.schema_version = SCHEMA_VERSION;
    let (v2, _) = codec::encode_for_fixture(&now, &decoded.event);
    assert!(v2 != bytes, "schema 2 must not encode like schema 1");
    let v2 = codec::decode_record(&v2).expect("the schema-2 form decodes");
    assert_eq!(v2.event, decoded.event);
    assert_eq!(v2.envelope.schema_version, SCHEMA_VERSION);
}

/// The fixtures whose every byte is flipped: the largest ones, one with
/// optional fields set, and the schema-1 record.
const FLIPPED: [&str; 4] = [
    "v2/JobCreated.bin",
    "v2/BatchSubmitted.bin",
    "v2/JobStatusChanged.bin",
    "v1/JobStatusChanged.bin",
];

/// Set in the child process that runs [`flip_sweep_child`].
const FLIP_CHILD: &str = "INGEST_GOLDEN_FLIP_CHILD";

/// Every single-byte change of `bytes` (three masks per position) must make
/// decoding fail: the hash covers the header and the payload, and damage to
/// the framing or the kind name does not parse. Each attempt is announced on
/// stderr first, so that a parent sees which one brought the process down.
fn assert_every_flip_is_detected(name: &str, bytes: &[u8]) {
    let mut undetected = Vec::new();
    let mut hash_mismatches = 0;
    for i in 0..bytes.len() {
        for mask in [0x01u8, 0x80, 0xFF] {
            let mut damaged = bytes.to_vec();
            damaged[i] ^= mask;
            eprintln!("flip {name} byte {i} ^ {mask:#04x}");
            match codec::decode_record(&damaged) {
                Ok(r) => undetected.push(format!("byte {i} ^ {mask:#04x} decodes as {r:?}")),
                Err(DecodeError::HashMismatch { .. }) => hash_mismatches += 1,
                Err(_) => {}
            }
        }
    }
    assert!(
        undetected.is_empty(),
        "{name}: {} damaged copies decode:\n{}",
        undetected.len(),
        undetected.join("\n")
    );
    // Most damage lands in the content, which only the hash can catch.
    assert!(
        hash_mismatches > bytes.len(),
        "{name}: {hash_mismatches} hash mismatches"
    );
}

/// Flips every byte of a few fixtures. Each fixture is swept in a child
/// process (this test binary run again on [`flip_sweep_child`]) because a
/// damaged record must not be able to take the process down, and if it does,
/// the report should name the byte rather than lose every other test's result.
#[test]
fn flipping_any_byte_of_a_fixture_fails_decoding() {
    // Make sure the fixtures exist (or are blessed) before the children read them.
    for case in cases() {
        v2_bytes(&case);
    }
    v1_bytes();
    let exe = std::env::current_exe().expect("the test binary's path");
    let mut failures = Vec::new();
    for name in FLIPPED {
        let out = std::process::Command::new(&exe)
            .args([
                "flip_sweep_child",
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(FLIP_CHILD, name)
            .output()
            .expect("run the test binary as a child");
        if out.status.success() {
            continue;
        }
        let stderr = String::from_utf8_lossy(&out.stderr);
        let last_attempt = stderr
            .lines()
            .rfind(|l| l.starts_with("flip "))
            .unwrap_or("before the first flip");
        let other: Vec<&str> = stderr
            .lines()
            .filter(|l| !l.starts_with("flip ") && !l.trim_start().starts_with("at "))
            .take(8)
            .collect();
        failures.push(format!(
            "{name}: the sweep exited with {} during `{last_attempt}`:\n    {}\n{}",
            out.status,
            other.join("\n    "),
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter(|l| l.contains("panicked") || l.contains("decode"))
                .take(8)
                .collect::<Vec<_>>()
                .join("\n")
        ));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// The child side of [`flipping_any_byte_of_a_fixture_fails_decoding`]; does
/// nothing when run on its own.
#[test]
fn flip_sweep_child() {
    let Ok(name) = std::env::var(FLIP_CHILD) else {
        return;
    };
    let path = fixtures_dir().join(&name);
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    assert_every_flip_is_detected(&name, &bytes);
}

#[test]
fn truncated_or_extended_fixtures_fail_decoding() {
    let cases = cases();
    let case = cases
        .iter()
        .find(|c| c.file == "JobCreated.bin")
        .expect("a JobCreated case");
    let bytes = v2_bytes(case);
    for len in 0..bytes.len() {
        assert!(
            codec::decode_record(&bytes[..len]).is_err(),
            "a record cut to {len} bytes decodes"
        );
    }
    let mut longer = bytes.clone();
    longer.push(0);
    assert!(matches!(
        codec::decode_record(&longer),
        Err(DecodeError::Malformed(_))
    ));
}

/// Replaces the kind name of an encoded record, keeping everything else.
/// bincode writes a short string as a one-byte length and its bytes.
fn with_kind(bytes: &[u8], from: &str, to: &str) -> Vec<u8> {
    let mut needle = vec![from.len() as u8];
    needle.extend_from_slice(from.as_bytes());
    let at = bytes
        .windows(needle.len())
        .position(|w| w == needle.as_slice())
        .unwrap_or_else(|| panic!("{from} not found in the record"));
    let mut out = bytes[..at].to_vec();
    out.push(to.len() as u8);
    out.extend_from_slice(to.as_bytes());
    out.extend_from_slice(&bytes[at + needle.len()..]);
    out
}

/// The record hash must cover the event kind: kinds with the same payload
/// shape (`BatchCompleted`/`BatchFailed`, `QueuePaused`/`QueueResumed`,
/// `BatchAcquired`/`BatchCleanedUp`) would otherwise be interchangeable
/// without `verify` or the hash chain noticing. Checked for records of the
/// current schema (the hash of schema-2 records cannot change any more).
#[test]
fn the_record_hash_covers_the_event_kind() {
    let pairs: [(Event, &str); 3] = [
        (
            event::BatchCompleted {
                message: "1 job(s) completed".into(),
            }
            .into(),
            "BatchFailed",
        ),
        (
            event::QueuePaused {
                reason: "maintenance".into(),
            }
            .into(),
            "QueueResumed",
        ),
        (
            event::BatchAcquired { jobs: vec![Jid(1)] }.into(),
            "BatchCleanedUp",
        ),
    ];
    for (event, other) in pairs {
        let env = envelope(3, StreamId::Batch(Bid(7)), Actor::engine());
        let (bytes, _) = codec::encode_for_fixture(&env, &event);
        let tampered = with_kind(&bytes, event.kind(), other);
        assert!(
            codec::decode_record(&tampered).is_err(),
            "a {} record renamed to {other} still decodes with a valid hash: {:?}",
            event.kind(),
            codec::decode_record(&tampered).map(|r| r.event)
        );
    }
}
