//! OCFL storage targets and the object inventory.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;

use chrono::{TimeZone, Utc};
use ingest_steps::inventory::{
    Inventory, InventoryError, InventoryFile, ObjectVersionRecord, RecordOutcome,
};
use ingest_steps::ocfl::{Checks, OcflTarget, StorageError, StoredVersion, VersionMeta};
use sha2::{Digest, Sha512};
use tempfile::TempDir;

// ---------------------------------------------------------------- helpers

/// Writes `files` (logical path, content) under `dir`.
fn write_tree(dir: &Path, files: &[(&str, &str)]) {
    for (path, content) in files {
        let path = dir.join(path);
        fs::create_dir_all(path.parent().expect("a parent")).expect("create dirs");
        fs::write(&path, content).expect("write file");
    }
}

/// A fresh source directory holding `files`.
fn source(files: &[(&str, &str)]) -> TempDir {
    let dir = TempDir::new().expect("temp dir");
    write_tree(dir.path(), files);
    dir
}

fn meta(message: &str) -> VersionMeta {
    VersionMeta {
        user_name: "Ingest Tester".into(),
        user_address: Some("mailto:tester@example.org".into()),
        message: message.into(),
        created: Utc
            .with_ymd_and_hms(2024, 5, 6, 7, 8, 9)
            .single()
            .expect("a valid time"),
    }
}

fn sha512(content: &str) -> String {
    hex::encode(Sha512::digest(content.as_bytes()))
}

/// The stored version's files as (path, size, sha512 of the expected content).
fn listing(stored: &StoredVersion) -> Vec<(String, u64, String)> {
    stored
        .files
        .iter()
        .map(|f| (f.logical_path.clone(), f.size, f.sha512.clone()))
        .collect()
}

fn expected_listing(files: &[(&str, &str)]) -> Vec<(String, u64, String)> {
    let mut listing: Vec<_> = files
        .iter()
        .map(|(p, c)| (p.to_string(), c.len() as u64, sha512(c)))
        .collect();
    listing.sort();
    listing
}

fn expected_sha512(files: &[(&str, &str)]) -> BTreeMap<String, String> {
    files
        .iter()
        .map(|(p, c)| (p.to_string(), sha512(c)))
        .collect()
}

fn read(target: &OcflTarget, ark: &str, version: Option<u32>, path: &str) -> String {
    let content = target
        .read_file(ark, version, path)
        .expect("read the file back");
    String::from_utf8(content).expect("UTF-8 content")
}

fn target() -> (TempDir, OcflTarget) {
    let root = TempDir::new().expect("temp dir");
    let target =
        OcflTarget::open_or_init("local", &root.path().join("ocfl")).expect("open a target");
    (root, target)
}

/// The objects with a staged (uncommitted) version, read with rocfl itself.
/// The staged objects in every target's own staging under `root`.
fn staged_objects(root: &Path) -> usize {
    let mut staged = 0;
    for entry in fs::read_dir(root.join(STAGING)).expect("list staging") {
        let entry = entry.expect("staging entry");
        let path = entry.path();
        if path.is_dir() && entry.file_name().to_string_lossy().starts_with("proc-") {
            let repo = rocfl::ocfl::OcflRepo::fs_repo(root, Some(&path)).expect("open with rocfl");
            staged += repo
                .list_staged_objects(None)
                .expect("list staged objects")
                .count();
        }
    }
    staged
}

/// The parent of every target's own staging.
const STAGING: &str = "extensions/rocfl-staging";

/// rocfl on `target`'s own staging, as another tool (or a crash) would leave it.
fn own_staging(target: &OcflTarget) -> rocfl::ocfl::OcflRepo {
    rocfl::ocfl::OcflRepo::fs_repo(target.root(), Some(&target.staging_dir()))
        .expect("open with rocfl")
}

const ARK: &str = "ark:/99999/fk4abc123";

const V1: &[(&str, &str)] = &[
    ("producer/mets.xml", "<mets/>"),
    ("producer/data/a.txt", "alpha"),
    ("producer/data/deep/b.txt", "bravo"),
    ("readme.txt", "hello"),
];

// ------------------------------------------------------------ OCFL target

#[test]
fn ocfl_target_is_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<OcflTarget>();
}

#[test]
fn v1_stores_nested_files_reads_back_and_verifies() {
    let (_root, target) = target();
    let src = source(V1);

    let stored = target.store_version(ARK, src.path(), &meta("v1")).unwrap();

    assert_eq!(stored.ark, ARK);
    assert_eq!(stored.version, 1);
    assert_eq!(listing(&stored), expected_listing(V1));
    assert!(stored.object_root.join("inventory.json").is_file());
    assert!(stored.object_root.starts_with(target.root()));
    assert_eq!(target.versions(ARK).unwrap(), vec![1]);
    assert_eq!(
        read(&target, ARK, None, "producer/data/deep/b.txt"),
        "bravo"
    );
    assert_eq!(read(&target, ARK, Some(1), "readme.txt"), "hello");
    let report = target.verify(ARK).unwrap();
    assert!(report.ok, "{report:?}");
    assert_eq!(report.problems, Vec::<String>::new());
}

#[test]
fn a_moved_version_is_the_source_files_renamed_not_copies() {
    use std::os::unix::fs::MetadataExt;
    let (root, target) = target();
    // On the root's file system, so the files can be renamed.
    let src = root.path().join("v1");
    write_tree(&src, V1);
    let inode = |path: &Path| fs::metadata(path).expect("metadata").ino();
    let before: BTreeMap<&str, u64> = V1.iter().map(|(p, _)| (*p, inode(&src.join(p)))).collect();

    let stored = target
        .store_checked(ARK, &src, &meta("v1"), true, &expected_sha512(V1))
        .unwrap();

    assert_eq!(stored.version, 1);
    assert_eq!(listing(&stored), expected_listing(V1));
    for (path, ino) in &before {
        let content = stored.object_root.join("v1/content").join(path);
        assert_eq!(inode(&content), *ino, "{path} was copied, not moved");
        assert!(!src.join(path).exists(), "{path} is still in the source");
    }
    assert!(target.verify_structure(ARK).unwrap().ok);
    assert!(target.verify(ARK).unwrap().ok);

    // A second version moves too, and the first stays readable.
    const V2: &[(&str, &str)] = &[("readme.txt", "hello again"), ("producer/new.txt", "new")];
    let src2 = root.path().join("v2");
    write_tree(&src2, V2);
    let readme = inode(&src2.join(V2[0].0));
    let stored = target
        .store_checked(ARK, &src2, &meta("v2"), true, &expected_sha512(V2))
        .unwrap();
    assert_eq!(stored.version, 2);
    assert_eq!(listing(&stored), expected_listing(V2));
    let moved = stored.object_root.join("v2/content").join(V2[0].0);
    assert_eq!(inode(&moved), readme, "v2 was copied, not moved");
    assert_eq!(read(&target, ARK, Some(1), "readme.txt"), "hello");
    assert!(target.verify(ARK).unwrap().ok);
}

#[test]
fn a_file_whose_digest_is_not_the_expected_one_is_not_committed() {
    for moving in [false, true] {
        let (root, target) = target();
        let src = root.path().join("src");
        write_tree(&src, V1);
        let mut expected = expected_sha512(V1);
        expected.insert("producer/data/a.txt".into(), sha512("alpha, as downloaded"));
        expected.insert("gone.txt".into(), sha512("gone"));
        let err = target
            .store_checked(ARK, &src, &meta("v1"), moving, &expected)
            .expect_err("a digest differs");
        let text = err.to_string();
        assert!(matches!(err, StorageError::DigestMismatch { .. }), "{text}");
        assert!(!err.is_recoverable());
        assert!(text.contains("producer/data/a.txt has SHA-512"), "{text}");
        assert!(text.contains("gone.txt is missing"), "{text}");
        assert!(!text.contains("readme.txt"), "{text}");
        assert!(matches!(
            target.versions(ARK),
            Err(StorageError::NotFound { .. })
        ));
        assert_eq!(
            staged_objects(target.root()),
            0,
            "the staged version is discarded"
        );
    }
}

#[test]
fn verify_structure_does_not_read_the_content_but_verify_does() {
    let (_root, target) = target();
    let src = source(V1);
    let stored = target.store_version(ARK, src.path(), &meta("v1")).unwrap();
    fs::write(stored.object_root.join("v1/content/readme.txt"), "HELLO").unwrap();
    assert!(target.verify_structure(ARK).unwrap().ok);
    assert!(!target.verify(ARK).unwrap().ok);
}

#[test]
fn version_meta_is_written_to_the_inventory() {
    let (_root, target) = target();
    let src = source(V1);
    let stored = target
        .store_version(ARK, src.path(), &meta("batch bid1 job jid1"))
        .unwrap();

    let inventory: serde_json::Value =
        serde_json::from_slice(&fs::read(stored.object_root.join("inventory.json")).unwrap())
            .unwrap();
    let v1 = &inventory["versions"]["v1"];
    assert_eq!(inventory["id"], ARK);
    assert_eq!(inventory["digestAlgorithm"], "sha512");
    assert_eq!(v1["message"], "batch bid1 job jid1");
    assert_eq!(v1["user"]["name"], "Ingest Tester");
    assert_eq!(v1["user"]["address"], "mailto:tester@example.org");
    let created = chrono::DateTime::parse_from_rfc3339(v1["created"].as_str().unwrap()).unwrap();
    assert_eq!(created, Utc.with_ymd_and_hms(2024, 5, 6, 7, 8, 9).unwrap());
}

#[test]
fn v2_replaces_the_state_and_keeps_v1_readable() {
    let (_root, target) = target();
    target
        .store_version(ARK, source(V1).path(), &meta("v1"))
        .unwrap();
    // a.txt changed, b.txt removed, mets.xml and readme.txt unchanged, c.txt new.
    let v2_files: &[(&str, &str)] = &[
        ("producer/mets.xml", "<mets/>"),
        ("producer/data/a.txt", "alpha, revised"),
        ("producer/data/c.txt", "charlie"),
        ("readme.txt", "hello"),
    ];

    let stored = target
        .store_version(ARK, source(v2_files).path(), &meta("v2"))
        .unwrap();

    assert_eq!(stored.version, 2);
    assert_eq!(listing(&stored), expected_listing(v2_files));
    assert_eq!(target.versions(ARK).unwrap(), vec![1, 2]);
    assert_eq!(
        read(&target, ARK, None, "producer/data/a.txt"),
        "alpha, revised"
    );
    assert_eq!(
        read(&target, ARK, Some(2), "producer/data/c.txt"),
        "charlie"
    );
    assert!(matches!(
        target.read_file(ARK, Some(2), "producer/data/deep/b.txt"),
        Err(StorageError::NotFound { .. })
    ));
    assert_eq!(read(&target, ARK, Some(1), "producer/data/a.txt"), "alpha");
    assert_eq!(
        read(&target, ARK, Some(1), "producer/data/deep/b.txt"),
        "bravo"
    );
    // Unchanged files are not copied again: v2's content holds only the new bytes.
    let v2_content = stored.object_root.join("v2/content");
    assert!(v2_content.join("producer/data/a.txt").is_file());
    assert!(!v2_content.join("readme.txt").exists());
    assert!(!v2_content.join("producer/mets.xml").exists());
    assert!(target.verify(ARK).unwrap().ok);
}

#[test]
fn tampered_content_is_reported_naming_the_file() {
    let (_root, target) = target();
    let stored = target
        .store_version(ARK, source(V1).path(), &meta("v1"))
        .unwrap();
    let content = stored.object_root.join("v1/content/producer/data/a.txt");
    fs::write(&content, "alpha, corrupted").unwrap();

    let report = target.verify(ARK).unwrap();

    assert!(!report.ok);
    assert_eq!(report.problems.len(), 1, "{:?}", report.problems);
    assert!(
        report.problems[0].contains("v1/content/producer/data/a.txt"),
        "{:?}",
        report.problems
    );
    assert!(
        report.problems[0].contains("fixity"),
        "{:?}",
        report.problems
    );
}

#[test]
fn two_targets_hold_the_same_object() {
    let root = TempDir::new().unwrap();
    let one = OcflTarget::open_or_init("one", &root.path().join("one")).unwrap();
    let two = OcflTarget::open_or_init("two", &root.path().join("two")).unwrap();
    let src = source(V1);

    let a = one.store_version(ARK, src.path(), &meta("v1")).unwrap();
    let b = two.store_version(ARK, src.path(), &meta("v1")).unwrap();

    assert_eq!(one.name(), "one");
    assert_eq!(two.name(), "two");
    assert_eq!(listing(&a), listing(&b));
    assert_ne!(a.object_root, b.object_root);
    assert_eq!(read(&two, ARK, None, "readme.txt"), "hello");
    assert!(one.verify(ARK).unwrap().ok && two.verify(ARK).unwrap().ok);
}

#[test]
fn arks_with_slashes_and_colons_are_distinct_objects() {
    let (_root, target) = target();
    let arks = [
        "ark:/99999/fk4",
        "ark:/99999/fk4/a",
        "ark:/99999/fk4:b",
        "ark:/13030/m5z",
    ];
    for ark in arks {
        let src = source(&[("id.txt", ark)]);
        target.store_version(ark, src.path(), &meta(ark)).unwrap();
    }
    for ark in arks {
        assert_eq!(read(&target, ark, None, "id.txt"), ark);
        assert_eq!(target.versions(ark).unwrap(), vec![1]);
    }
    // The layout hashes ids: no directory is named after an ark.
    let layout = fs::read_to_string(target.root().join("ocfl_layout.json")).unwrap();
    assert!(
        layout.contains("0004-hashed-n-tuple-storage-layout"),
        "{layout}"
    );
}

#[test]
fn reopening_a_root_keeps_its_objects() {
    let root = TempDir::new().unwrap();
    let dir = root.path().join("ocfl");
    OcflTarget::open_or_init("local", &dir)
        .unwrap()
        .store_version(ARK, source(V1).path(), &meta("v1"))
        .unwrap();

    let reopened = OcflTarget::open_or_init("local", &dir).unwrap();

    assert_eq!(reopened.versions(ARK).unwrap(), vec![1]);
    let stored = reopened
        .store_version(ARK, source(V1).path(), &meta("v2"))
        .unwrap();
    assert_eq!(stored.version, 2);
}

#[test]
fn an_empty_existing_directory_becomes_a_root() {
    let root = TempDir::new().unwrap();
    let target = OcflTarget::open_or_init("local", root.path()).unwrap();
    target
        .store_version(ARK, source(V1).path(), &meta("v1"))
        .unwrap();
    assert!(root.path().join("0=ocfl_1.1").is_file());
}

#[test]
fn a_non_ocfl_directory_is_refused_naming_it() {
    let root = TempDir::new().unwrap();
    fs::write(root.path().join("notes.txt"), "not OCFL").unwrap();

    let Err(error) = OcflTarget::open_or_init("local", root.path()) else {
        panic!("a non-OCFL directory was opened");
    };

    assert!(matches!(&error, StorageError::UnusableRoot { dir, .. } if dir == root.path()));
    assert!(error
        .to_string()
        .contains(&root.path().display().to_string()));
    assert!(!error.is_recoverable());
}

#[test]
fn a_file_or_an_ocfl_root_without_layout_is_refused() {
    let root = TempDir::new().unwrap();
    let file = root.path().join("a-file");
    fs::write(&file, "not a directory").unwrap();
    let no_layout = root.path().join("no-layout");
    fs::create_dir(&no_layout).unwrap();
    fs::write(no_layout.join("0=ocfl_1.1"), "ocfl_1.1\n").unwrap();

    let file_error = OcflTarget::open_or_init("local", &file).err().unwrap();
    let layout_error = OcflTarget::open_or_init("local", &no_layout).err().unwrap();

    assert!(matches!(&file_error, StorageError::UnusableRoot { dir, .. } if *dir == file));
    assert!(
        matches!(&layout_error, StorageError::UnusableRoot { dir, reason } if *dir == no_layout && reason.contains("layout")),
        "{layout_error}"
    );
}

#[test]
fn a_missing_or_empty_source_is_refused() {
    let (root, target) = target();
    let missing = root.path().join("no-such-dir");
    let empty = TempDir::new().unwrap();
    fs::create_dir(empty.path().join("only-a-dir")).unwrap();

    let missing_error = target
        .store_version(ARK, &missing, &meta("v1"))
        .unwrap_err();
    let empty_error = target
        .store_version(ARK, empty.path(), &meta("v1"))
        .unwrap_err();

    assert!(matches!(&missing_error, StorageError::SourceMissing { dir } if *dir == missing));
    assert!(!missing_error.is_recoverable());
    assert!(matches!(empty_error, StorageError::EmptySource { .. }));
    assert!(matches!(
        target.versions(ARK),
        Err(StorageError::NotFound { .. })
    ));
}

#[test]
fn a_symbolic_link_in_the_source_is_refused() {
    let (_root, target) = target();
    let src = source(V1);
    std::os::unix::fs::symlink("/etc/hostname", src.path().join("link")).unwrap();

    let error = target
        .store_version(ARK, src.path(), &meta("v1"))
        .unwrap_err();

    assert!(
        matches!(&error, StorageError::UnsupportedEntry { path, .. } if path.ends_with("link"))
    );
    assert!(matches!(
        target.versions(ARK),
        Err(StorageError::NotFound { .. })
    ));
}

#[test]
fn invalid_arks_are_refused() {
    let (_root, target) = target();
    for ark in ["", " ark:/99999/fk4x", "ark:/99999/fk4x\n"] {
        let error = target
            .store_version(ark, source(V1).path(), &meta("v1"))
            .unwrap_err();
        assert!(
            matches!(error, StorageError::InvalidArk { .. }),
            "{ark:?}: {error}"
        );
    }
}

#[test]
fn verify_and_read_of_a_missing_object_are_not_found() {
    let (_root, target) = target();
    assert!(matches!(
        target.verify(ARK),
        Err(StorageError::NotFound { .. })
    ));
    assert!(matches!(
        target.versions(ARK),
        Err(StorageError::NotFound { .. })
    ));
    assert!(matches!(
        target.read_file(ARK, None, "readme.txt"),
        Err(StorageError::NotFound { .. })
    ));
    let text = target.versions(ARK).unwrap_err().to_string();
    assert_eq!(text, format!("object {ARK} does not exist"));
}

/// A store whose commit fails halfway (the version directory is in the way)
/// leaves no staged version, and the retry writes exactly the source.
#[test]
fn a_failed_commit_discards_staging_and_the_retry_succeeds() {
    let (_root, target) = target();
    let v1 = target
        .store_version(ARK, source(V1).path(), &meta("v1"))
        .unwrap();
    let in_the_way = v1.object_root.join("v2");
    fs::create_dir(&in_the_way).unwrap();
    let v2_files: &[(&str, &str)] = &[("readme.txt", "hello again")];

    let error = target
        .store_version(ARK, source(v2_files).path(), &meta("v2"))
        .unwrap_err();

    assert!(matches!(error, StorageError::Ocfl { .. }), "{error}");
    assert_eq!(staged_objects(target.root()), 0);
    assert_eq!(target.versions(ARK).unwrap(), vec![1]);

    fs::remove_dir(&in_the_way).unwrap();
    let stored = target
        .store_version(ARK, source(v2_files).path(), &meta("v2"))
        .unwrap();
    assert_eq!(stored.version, 2);
    assert_eq!(listing(&stored), expected_listing(v2_files));
    assert!(target.verify(ARK).unwrap().ok);
}

/// A staged version left behind (an aborted store: a crash, or another tool)
/// does not leak into the next version.
#[test]
fn a_leftover_staged_version_is_discarded() {
    let (_root, target) = target();
    target
        .store_version(ARK, source(V1).path(), &meta("v1"))
        .unwrap();
    let junk = source(&[("junk.txt", "left over")]);
    let repo = own_staging(&target);
    repo.copy_files_external(ARK, &[junk.path().join("junk.txt")], "junk.txt", false)
        .unwrap();
    drop(repo);
    assert_eq!(staged_objects(target.root()), 1);

    let v2_files: &[(&str, &str)] = &[("readme.txt", "hello")];
    let stored = target
        .store_version(ARK, source(v2_files).path(), &meta("v2"))
        .unwrap();

    assert_eq!(listing(&stored), expected_listing(v2_files));
    assert!(matches!(
        target.read_file(ARK, None, "junk.txt"),
        Err(StorageError::NotFound { .. })
    ));
    assert_eq!(staged_objects(target.root()), 0);
}

/// The same for an object that was never committed: the leftover is a
/// staged version 1.
#[test]
fn a_leftover_staged_new_object_is_discarded() {
    let (_root, target) = target();
    let junk = source(&[("junk.txt", "left over")]);
    let repo = own_staging(&target);
    repo.create_object(ARK, None, rocfl::ocfl::DigestAlgorithm::Sha256, "data", 3)
        .unwrap();
    repo.copy_files_external(ARK, &[junk.path().join("junk.txt")], "junk.txt", false)
        .unwrap();
    drop(repo);
    assert_eq!(staged_objects(target.root()), 1);

    let stored = target
        .store_version(ARK, source(V1).path(), &meta("v1"))
        .unwrap();

    assert_eq!(stored.version, 1);
    assert_eq!(listing(&stored), expected_listing(V1));
    // The object is ours (sha512, `content`), not the leftover's (sha256, `data`, v001).
    assert!(stored.object_root.join("v1/content/readme.txt").is_file());
    assert!(target.verify(ARK).unwrap().ok);
    assert_eq!(staged_objects(target.root()), 0);
}

/// Opening a root clears the staging a dead process left (its staged
/// version and its stale rocfl lock, which would refuse every later change of
/// the object) and the shared staging of earlier versions, but never the
/// staging of a live target.
#[test]
fn opening_clears_a_dead_process_staging_and_keeps_a_live_one() {
    let root = TempDir::new().unwrap();
    let dir = root.path().join("ocfl");
    OcflTarget::open_or_init("local", &dir)
        .unwrap()
        .store_version(ARK, source(V1).path(), &meta("v1"))
        .unwrap();
    let junk = source(&[("junk.txt", "left over")]);
    // A live target with a staged version in progress.
    let live = OcflTarget::open_existing("live", &dir).unwrap();
    live.store_version("ark:/99999/fk4live", source(V1).path(), &meta("live"))
        .unwrap();
    own_staging(&live)
        .copy_files_external(ARK, &[junk.path().join("junk.txt")], "junk.txt", false)
        .unwrap();
    // A process that died mid-store: its staging, its unlocked owner file.
    let dead = dir.join(STAGING).join("proc-1-dead");
    let repo = rocfl::ocfl::OcflRepo::fs_repo(&dir, Some(&dead)).unwrap();
    repo.copy_files_external(ARK, &[junk.path().join("junk.txt")], "junk.txt", false)
        .unwrap();
    drop(repo);
    fs::write(dead.join("extensions/rocfl-locks/stale.lock"), "").unwrap();
    fs::write(dir.join(STAGING).join("proc-1-dead.lock"), "").unwrap();
    // The single shared staging of earlier versions.
    let legacy = dir.join(STAGING).join("extensions/rocfl-locks");
    fs::create_dir_all(&legacy).unwrap();
    fs::write(legacy.join("legacy.lock"), "").unwrap();
    assert_eq!(staged_objects(&dir), 2);

    let target = OcflTarget::open_or_init("local", &dir).unwrap();

    assert!(!dead.exists(), "the dead process's staging is removed");
    assert!(!dir.join(STAGING).join("proc-1-dead.lock").exists());
    assert!(!dir.join(STAGING).join("extensions").exists());
    assert!(live.staging_dir().is_dir(), "a live target's staging stays");
    assert_eq!(
        staged_objects(&dir),
        1,
        "only the live target's stage is left"
    );
    let stored = target
        .store_version(ARK, source(V1).path(), &meta("v2"))
        .unwrap();
    assert_eq!(listing(&stored), expected_listing(V1));
    drop(target);
    drop(live);
    assert_eq!(
        fs::read_dir(dir.join(STAGING))
            .unwrap()
            .filter(|e| !e
                .as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with("ark-locks"))
            .count(),
        0,
        "dropped targets remove their own staging"
    );
}

/// Opening a second target on a root (another process: `ingest worker`
/// beside `ingest serve`) never disturbs the first one's stores, and the two
/// store one ark in turns.
#[test]
fn two_targets_on_one_root_store_side_by_side() {
    let root = TempDir::new().unwrap();
    let dir = root.path().join("ocfl");
    let first = OcflTarget::open_or_init("first", &dir).unwrap();
    first
        .store_version(ARK, source(V1).path(), &meta("v1"))
        .unwrap();

    let second = OcflTarget::open_or_init("second", &dir).unwrap();

    let src = source(V1);
    std::thread::scope(|scope| {
        for (i, target) in [&first, &second, &first, &second].into_iter().enumerate() {
            let src = src.path();
            scope.spawn(move || {
                target
                    .store_version(ARK, src, &meta(&format!("turn {i}")))
                    .unwrap();
                target
                    .store_version(&format!("ark:/99999/fk4own{i}"), src, &meta("own"))
                    .unwrap();
            });
        }
    });
    assert_eq!(first.versions(ARK).unwrap(), vec![1, 2, 3, 4, 5]);
    assert!(second.verify(ARK).unwrap().ok);
    for i in 0..4 {
        assert!(first.verify(&format!("ark:/99999/fk4own{i}")).unwrap().ok);
    }
}

#[test]
fn different_arks_store_concurrently_and_one_ark_is_serialized() {
    let (_root, target) = target();
    let src = source(V1);
    let arks: Vec<String> = (0..6).map(|i| format!("ark:/99999/fk4t{i}")).collect();

    std::thread::scope(|scope| {
        for ark in &arks {
            let (target, src) = (&target, src.path());
            scope.spawn(move || target.store_version(ark, src, &meta(ark)).unwrap());
        }
        for _ in 0..3 {
            let (target, src) = (&target, src.path());
            scope.spawn(move || target.store_version(ARK, src, &meta("same")).unwrap());
        }
    });

    for ark in &arks {
        assert_eq!(target.versions(ark).unwrap(), vec![1]);
        assert!(target.verify(ark).unwrap().ok);
    }
    assert_eq!(target.versions(ARK).unwrap(), vec![1, 2, 3]);
    assert!(target.verify(ARK).unwrap().ok);
    assert_eq!(staged_objects(target.root()), 0);
}

// -------------------------------------------------------------- inventory

fn inventory() -> (sled::Db, Inventory) {
    let db = sled::Config::new()
        .temporary(true)
        .open()
        .expect("open sled");
    let inventory = Inventory::new(db.open_tree("inventory").expect("open the tree"));
    (db, inventory)
}

fn rec(ark: &str, version: u32, collection: &str, local_ids: &[&str]) -> ObjectVersionRecord {
    ObjectVersionRecord {
        ark: ark.into(),
        version,
        collection: collection.into(),
        local_ids: local_ids.iter().map(|s| s.to_string()).collect(),
        files: vec![InventoryFile {
            path: format!("producer/v{version}.txt"),
            size: 42,
            digests: BTreeMap::from([("sha256".to_string(), "ab".repeat(32))]),
        }],
        storage_targets: vec!["local".into()],
        jid: format!("jid000000000{version}"),
        bid: "bid0000000001".into(),
        recorded_at: Utc
            .with_ymd_and_hms(2024, 1, 2, 3, 4, 5)
            .single()
            .expect("a valid time"),
        erc: BTreeMap::from([("what".to_string(), "A title".to_string())]),
    }
}

const NEW: RecordOutcome = RecordOutcome { new: true };
const SAME: RecordOutcome = RecordOutcome { new: false };

#[test]
fn records_versions_in_order() {
    let (_db, inv) = inventory();
    let v1 = rec(ARK, 1, "demo", &["item-1"]);
    let v2 = rec(ARK, 2, "demo", &["item-1"]);

    assert_eq!(inv.record(&v1).unwrap(), NEW);
    assert_eq!(inv.record(&v2).unwrap(), NEW);

    assert_eq!(inv.latest(ARK).unwrap(), Some(v2.clone()));
    assert_eq!(inv.version(ARK, 1).unwrap(), Some(v1.clone()));
    assert_eq!(inv.version(ARK, 3).unwrap(), None);
    assert_eq!(inv.versions(ARK).unwrap(), vec![v1, v2]);
    assert_eq!(inv.latest("ark:/99999/fk4none").unwrap(), None);
    assert_eq!(inv.versions("ark:/99999/fk4none").unwrap(), vec![]);
}

#[test]
fn a_version_gap_is_refused() {
    let (_db, inv) = inventory();
    let zero = inv.record(&rec(ARK, 0, "demo", &[])).unwrap_err();
    let two = inv.record(&rec(ARK, 2, "demo", &[])).unwrap_err();
    inv.record(&rec(ARK, 1, "demo", &[])).unwrap();
    let three = inv.record(&rec(ARK, 3, "demo", &["item-9"])).unwrap_err();

    assert!(matches!(
        zero,
        InventoryError::VersionGap {
            version: 0,
            expected: 1,
            ..
        }
    ));
    assert!(matches!(
        two,
        InventoryError::VersionGap {
            version: 2,
            expected: 1,
            ..
        }
    ));
    assert!(matches!(
        three,
        InventoryError::VersionGap {
            version: 3,
            expected: 2,
            ..
        }
    ));
    assert!(!three.is_recoverable());
    // Nothing of the refused record was written.
    assert_eq!(inv.by_local_id("demo", "item-9").unwrap(), None);
    assert_eq!(inv.versions(ARK).unwrap().len(), 1);
}

#[test]
fn recording_the_same_version_again_is_idempotent() {
    let (_db, inv) = inventory();
    let v1 = rec(ARK, 1, "demo", &["item-1"]);
    inv.record(&v1).unwrap();
    let retry = ObjectVersionRecord {
        recorded_at: Utc.with_ymd_and_hms(2024, 1, 2, 9, 9, 9).unwrap(),
        ..v1.clone()
    };

    assert_eq!(inv.record(&v1).unwrap(), SAME);
    assert_eq!(inv.record(&retry).unwrap(), SAME);
    assert_eq!(inv.versions(ARK).unwrap(), vec![v1]);
}

#[test]
fn a_version_with_different_content_is_refused() {
    let (_db, inv) = inventory();
    let v1 = rec(ARK, 1, "demo", &["item-1"]);
    inv.record(&v1).unwrap();
    let other = ObjectVersionRecord {
        jid: "jid0000000099".into(),
        ..v1.clone()
    };

    let error = inv.record(&other).unwrap_err();

    assert!(matches!(error, InventoryError::VersionConflict { ref ark, version: 1 } if ark == ARK));
    assert_eq!(inv.latest(ARK).unwrap(), Some(v1));
}

#[test]
fn local_ids_are_per_collection() {
    let (_db, inv) = inventory();
    inv.record(&rec("ark:/99999/fk4a", 1, "demo", &["item-1", "item-2"]))
        .unwrap();
    inv.record(&rec("ark:/99999/fk4b", 1, "other", &["item-1"]))
        .unwrap();

    assert_eq!(
        inv.by_local_id("demo", "item-1").unwrap().as_deref(),
        Some("ark:/99999/fk4a")
    );
    assert_eq!(
        inv.by_local_id("demo", "item-2").unwrap().as_deref(),
        Some("ark:/99999/fk4a")
    );
    assert_eq!(
        inv.by_local_id("other", "item-1").unwrap().as_deref(),
        Some("ark:/99999/fk4b")
    );
    assert_eq!(inv.by_local_id("other", "item-2").unwrap(), None);
    assert_eq!(inv.by_local_id("demo", "item-3").unwrap(), None);
}

#[test]
fn a_local_id_bound_to_another_ark_is_refused() {
    let (_db, inv) = inventory();
    inv.record(&rec("ark:/99999/fk4a", 1, "demo", &["item-1"]))
        .unwrap();

    let error = inv
        .record(&rec("ark:/99999/fk4b", 1, "demo", &["item-2", "item-1"]))
        .unwrap_err();

    match error {
        InventoryError::LocalIdConflict {
            collection,
            local_id,
            existing_ark,
            ark,
        } => {
            assert_eq!(
                (
                    collection.as_str(),
                    local_id.as_str(),
                    existing_ark.as_str(),
                    ark.as_str()
                ),
                ("demo", "item-1", "ark:/99999/fk4a", "ark:/99999/fk4b")
            );
        }
        other => panic!("expected a local id conflict, got {other}"),
    }
    // The transaction wrote nothing, not even the first local id.
    assert_eq!(inv.by_local_id("demo", "item-2").unwrap(), None);
    assert_eq!(inv.latest("ark:/99999/fk4b").unwrap(), None);
}

#[test]
fn arks_that_extend_another_ark_stay_apart() {
    let (_db, inv) = inventory();
    inv.record(&rec("ark:/1/a", 1, "demo", &[])).unwrap();
    inv.record(&rec("ark:/1/a/b", 1, "demo", &[])).unwrap();
    inv.record(&rec("ark:/1/a/b", 2, "demo", &[])).unwrap();

    assert_eq!(inv.versions("ark:/1/a").unwrap().len(), 1);
    assert_eq!(inv.latest("ark:/1/a").unwrap().map(|r| r.version), Some(1));
    assert_eq!(
        inv.latest("ark:/1/a/b").unwrap().map(|r| r.version),
        Some(2)
    );
}

#[test]
fn all_arks_pages_through_every_ark_once() {
    let (_db, inv) = inventory();
    for ark in ["ark:/1/c", "ark:/1/a", "ark:/1/a/b", "ark:/1/b"] {
        inv.record(&rec(ark, 1, "demo", &[])).unwrap();
    }
    inv.record(&rec("ark:/1/a", 2, "demo", &[])).unwrap();

    let first = inv.all_arks(None, 2).unwrap();
    let second = inv.all_arks(first.last().map(String::as_str), 2).unwrap();
    let third = inv.all_arks(second.last().map(String::as_str), 2).unwrap();

    assert_eq!(first, ["ark:/1/a", "ark:/1/a/b"]);
    assert_eq!(second, ["ark:/1/b", "ark:/1/c"]);
    assert_eq!(third, Vec::<String>::new());
    assert_eq!(inv.all_arks(None, 0).unwrap(), Vec::<String>::new());
}

#[test]
fn keys_with_a_nul_are_refused() {
    let (_db, inv) = inventory();
    let bad_ark = inv.record(&rec("ark:/1/\0x", 1, "demo", &[])).unwrap_err();
    let bad_collection = inv.record(&rec("ark:/1/x", 1, "de\0mo", &[])).unwrap_err();
    assert!(matches!(
        bad_ark,
        InventoryError::InvalidKey { field: "ark", .. }
    ));
    assert!(matches!(
        bad_collection,
        InventoryError::InvalidKey {
            field: "collection",
            ..
        }
    ));
}

#[test]
fn records_are_json_readable_by_other_tools() {
    let (db, inv) = inventory();
    inv.record(&rec(ARK, 1, "demo", &["item-1"])).unwrap();

    let key = [b"o/".as_slice(), ARK.as_bytes(), b"\0", &1u32.to_be_bytes()].concat();
    let raw = db
        .open_tree("inventory")
        .unwrap()
        .get(key)
        .unwrap()
        .unwrap();
    let json: serde_json::Value = serde_json::from_slice(&raw).unwrap();

    assert_eq!(json["ark"], ARK);
    assert_eq!(json["version"], 1);
    assert_eq!(json["local_ids"][0], "item-1");
    assert_eq!(json["files"][0]["digests"]["sha256"], "ab".repeat(32));
    assert_eq!(json["recorded_at"], "2024-01-02T03:04:05Z");
}

#[test]
fn everything_survives_reopening_the_database() {
    let dir = TempDir::new().unwrap();
    let v1 = rec(ARK, 1, "demo", &["item-1"]);
    let v2 = rec(ARK, 2, "demo", &["item-1"]);
    {
        let db = sled::open(dir.path()).unwrap();
        let inv = Inventory::new(db.open_tree("inventory").unwrap());
        inv.record(&v1).unwrap();
        inv.record(&v2).unwrap();
        db.flush().unwrap();
    }

    // sled's flusher thread holds the file lock a moment after the handle goes.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let db = loop {
        match sled::open(dir.path()) {
            Ok(db) => break db,
            Err(e) if std::time::Instant::now() < deadline => {
                assert!(e.to_string().contains("could not acquire lock"), "{e}");
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            Err(e) => panic!("cannot reopen: {e}"),
        }
    };
    let inv = Inventory::new(db.open_tree("inventory").unwrap());

    assert_eq!(inv.versions(ARK).unwrap(), vec![v1, v2.clone()]);
    assert_eq!(inv.latest(ARK).unwrap(), Some(v2.clone()));
    assert_eq!(
        inv.by_local_id("demo", "item-1").unwrap().as_deref(),
        Some(ARK)
    );
    assert_eq!(inv.all_arks(None, 10).unwrap(), [ARK]);
    assert_eq!(inv.record(&v2).unwrap(), SAME);
    assert!(matches!(
        inv.record(&rec(ARK, 4, "demo", &[])),
        Err(InventoryError::VersionGap { expected: 3, .. })
    ));
}

// ------------------------------------------------- inventory model test

mod model {
    use super::*;
    use proptest::prelude::*;

    /// One attempt to record: indexes into small pools, so that arks, local
    /// ids and versions collide often.
    #[derive(Debug, Clone)]
    struct Attempt {
        ark: usize,
        version: u32,
        collection: usize,
        local_ids: Vec<usize>,
        jid: u8,
    }

    const ARKS: [&str; 3] = ["ark:/1/a", "ark:/1/a/b", "ark:/1/c"];
    const COLLECTIONS: [&str; 2] = ["demo", "other"];
    const LOCAL_IDS: [&str; 4] = ["l0", "l1", "l2", "l3"];

    fn attempt() -> impl Strategy<Value = Attempt> {
        (
            0..ARKS.len(),
            0u32..5,
            0..COLLECTIONS.len(),
            prop::collection::vec(0..LOCAL_IDS.len(), 0..3),
            0u8..2,
        )
            .prop_map(|(ark, version, collection, local_ids, jid)| Attempt {
                ark,
                version,
                collection,
                local_ids,
                jid,
            })
    }

    fn to_record(a: &Attempt) -> ObjectVersionRecord {
        let local_ids: Vec<&str> = a.local_ids.iter().map(|i| LOCAL_IDS[*i]).collect();
        ObjectVersionRecord {
            jid: format!("jid{}", a.jid),
            ..rec(
                ARKS[a.ark],
                a.version,
                COLLECTIONS[a.collection],
                &local_ids,
            )
        }
    }

    /// What the inventory should hold: the rules of `record`, written plainly.
    #[derive(Default)]
    struct Model {
        versions: BTreeMap<String, Vec<ObjectVersionRecord>>,
        local_ids: BTreeMap<(String, String), String>,
    }

    impl Model {
        /// `Ok(new)` or the name of the expected error.
        fn record(&mut self, r: &ObjectVersionRecord) -> Result<bool, &'static str> {
            let versions = self.versions.entry(r.ark.clone()).or_default();
            if let Some(existing) = versions.get(r.version.wrapping_sub(1) as usize) {
                return if existing == r {
                    Ok(false)
                } else {
                    Err("conflict")
                };
            }
            if r.version as usize != versions.len() + 1 {
                return Err("gap");
            }
            for id in &r.local_ids {
                match self.local_ids.get(&(r.collection.clone(), id.clone())) {
                    Some(bound) if *bound != r.ark => return Err("local id"),
                    _ => {}
                }
            }
            for id in &r.local_ids {
                self.local_ids
                    .insert((r.collection.clone(), id.clone()), r.ark.clone());
            }
            versions.push(r.clone());
            Ok(true)
        }
    }

    fn outcome(result: Result<RecordOutcome, InventoryError>) -> Result<bool, &'static str> {
        match result {
            Ok(outcome) => Ok(outcome.new),
            Err(InventoryError::VersionConflict { .. }) => Err("conflict"),
            Err(InventoryError::VersionGap { .. }) => Err("gap"),
            Err(InventoryError::LocalIdConflict { .. }) => Err("local id"),
            Err(other) => panic!("unexpected error {other}"),
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn by_local_id_stays_consistent_with_the_records(attempts in prop::collection::vec(attempt(), 1..40)) {
            let (_db, inv) = inventory();
            let mut model = Model::default();

            for a in &attempts {
                let r = to_record(a);
                prop_assert_eq!(outcome(inv.record(&r)), model.record(&r), "{:?}", a);
            }

            for collection in COLLECTIONS {
                for id in LOCAL_IDS {
                    let expected = model.local_ids.get(&(collection.to_string(), id.to_string()));
                    let ark = inv.by_local_id(collection, id).unwrap();
                    prop_assert_eq!(ark.as_ref(), expected, "{} {}", collection, id);
                    // Every bound ark has a record naming the local id in that collection.
                    if let Some(ark) = ark {
                        let named = inv.versions(&ark).unwrap().iter().any(|r| {
                            r.collection == collection && r.local_ids.iter().any(|l| l == id)
                        });
                        prop_assert!(named, "{} {} -> {}", collection, id, ark);
                    }
                }
            }
            let mut arks = BTreeSet::new();
            for ark in ARKS {
                let expected = model.versions.get(ark).cloned().unwrap_or_default();
                if !expected.is_empty() {
                    arks.insert(ark.to_string());
                }
                prop_assert_eq!(inv.versions(ark).unwrap(), expected);
            }
            let listed: BTreeSet<String> = inv.all_arks(None, 10).unwrap().into_iter().collect();
            prop_assert_eq!(listed, arks);
        }
    }
}

/// A reader beside the storing process (the consistency report) lists the
/// objects and reads back each version's message, time and files with
/// their sizes and digests, as stored.
#[test]
fn a_reader_lists_objects_and_reads_back_each_versions_files() {
    let (dir, target) = target();
    let files = [("producer/a.txt", "alpha"), ("system/m.txt", "manifest")];
    let src = source(&files);
    target
        .store_version(
            "ark:/99999/fk4b",
            src.path(),
            &meta("add: batch bid0000000001 job jid0000000002"),
        )
        .expect("store b");
    let one = source(&[("producer/z.txt", "zulu")]);
    target
        .store_version("ark:/99999/fk4a", one.path(), &meta("other"))
        .expect("store a");
    let reader = OcflTarget::open_existing("reader", target.root()).expect("open");
    assert_eq!(
        reader.arks().expect("arks"),
        ["ark:/99999/fk4a", "ark:/99999/fk4b"]
    );
    let info = reader.version_info("ark:/99999/fk4b", 1).expect("v1");
    assert_eq!(info.version, 1);
    assert_eq!(info.message, "add: batch bid0000000001 job jid0000000002");
    assert_eq!(info.created, meta("").created);
    assert_eq!(info.digest_algorithm, "sha512");
    let got: Vec<(String, u64, String)> = info
        .files
        .iter()
        .map(|f| (f.logical_path.clone(), f.size, f.sha512.clone()))
        .collect();
    assert_eq!(got, expected_listing(&files));
    assert!(matches!(
        reader.version_info("ark:/99999/fk4b", 2),
        Err(StorageError::NotFound { .. })
    ));
    drop(dir);
}

// ---------------------------------------------------------------- BagIt export

mod bag {
    use super::*;
    use ingest_steps::bagit::{export_bag, BagError, BagOptions};

    fn stored() -> (TempDir, OcflTarget, StoredVersion) {
        let (root, target) = target();
        let stored = target
            .store_version(ARK, source(V1).path(), &meta("v1"))
            .expect("test setup");
        (root, target, stored)
    }

    /// Every file under `dir`, relative, sorted.
    fn files_under(dir: &Path) -> Vec<String> {
        fn walk(base: &Path, dir: &Path, out: &mut Vec<String>) {
            for e in fs::read_dir(dir).expect("test setup") {
                let p = e.expect("test setup").path();
                if p.is_dir() {
                    walk(base, &p, out);
                } else {
                    out.push(
                        p.strip_prefix(base)
                            .expect("test setup")
                            .display()
                            .to_string(),
                    );
                }
            }
        }
        let mut out = Vec::new();
        walk(dir, dir, &mut out);
        out.sort();
        out
    }

    #[test]
    fn a_version_is_bagged_with_its_files_manifests_and_info() {
        let (root, target, _) = stored();
        let before = files_under(target.root());
        let dir = root.path().join("bag");
        let bag = export_bag(&target, ARK, None, &dir, &BagOptions::default()).unwrap();
        assert_eq!((bag.version, bag.files), (1, V1.len()));
        let mut want: Vec<String> = [
            "bag-info.txt",
            "bagit.txt",
            "manifest-sha256.txt",
            "manifest-sha512.txt",
            "tagmanifest-sha256.txt",
            "tagmanifest-sha512.txt",
        ]
        .iter()
        .map(|s| s.to_string())
        .chain(V1.iter().map(|(p, _)| format!("data/{p}")))
        .collect();
        want.sort();
        assert_eq!(files_under(&dir), want);
        for (path, content) in V1 {
            assert_eq!(
                fs::read_to_string(dir.join("data").join(path)).unwrap(),
                *content
            );
            let line = format!("{}  data/{path}", sha512(content));
            let manifest = fs::read_to_string(dir.join("manifest-sha512.txt")).unwrap();
            assert!(manifest.lines().any(|l| l == line), "{line} in {manifest}");
        }
        let info = fs::read_to_string(dir.join("bag-info.txt")).unwrap();
        assert!(
            info.contains(&format!("External-Identifier: {ARK}\n")),
            "{info}"
        );
        assert!(info.contains("Ingest-Version: 1\n"), "{info}");
        assert!(
            info.contains("Ingest-Version-User-Address: mailto:tester@example.org\n"),
            "{info}"
        );
        assert_eq!(
            fs::read_to_string(dir.join("bagit.txt")).unwrap(),
            "BagIt-Version: 1.0\nTag-File-Character-Encoding: UTF-8\n"
        );
        // Storage was only read.
        assert_eq!(files_under(target.root()), before);
    }

    #[test]
    fn a_destination_that_is_not_empty_is_refused_and_kept() {
        let (root, target, _) = stored();
        let dir = root.path().join("full");
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("keep.txt"), "mine").unwrap();
        let err = export_bag(&target, ARK, None, &dir, &BagOptions::default()).unwrap_err();
        assert!(matches!(err, BagError::DestinationNotEmpty { .. }), "{err}");
        assert_eq!(files_under(&dir), vec!["keep.txt".to_string()]);
        // An empty directory is fine.
        let empty = root.path().join("empty");
        fs::create_dir_all(&empty).unwrap();
        export_bag(&target, ARK, None, &empty, &BagOptions::default()).unwrap();
        // A missing version is refused and leaves nothing.
        let none = root.path().join("none");
        let err = export_bag(&target, ARK, Some(7), &none, &BagOptions::default()).unwrap_err();
        assert!(
            matches!(err, BagError::Storage(StorageError::NotFound { .. })),
            "{err}"
        );
        // D14: the message said "not found in object ARK: Object ARK
        // version v7".
        let text = err.to_string();
        assert!(
            text.contains(&format!("object {ARK} has no version v7")) && !text.contains("Object "),
            "{text}"
        );
        assert!(!none.exists());
    }

    /// Rewrites the object's inventory (and its sidecar) with `edit`.
    fn edit_inventory(stored: &StoredVersion, edit: impl Fn(String) -> String) {
        for dir in [stored.object_root.clone(), stored.object_root.join("v1")] {
            let path = dir.join("inventory.json");
            let text = edit(fs::read_to_string(&path).expect("test setup"));
            fs::write(&path, &text).expect("test setup");
            fs::write(
                dir.join("inventory.json.sha512"),
                format!("{}  inventory.json\n", sha512(&text)),
            )
            .expect("test setup");
        }
    }

    #[test]
    fn hostile_logical_paths_in_the_inventory_are_refused_writing_nothing() {
        for hostile in ["../../escaped.txt", "/tmp/absolute.txt"] {
            let (root, target, stored) = stored();
            let first = V1[0].0;
            edit_inventory(&stored, |t| {
                t.replace(&format!("\"{first}\""), &format!("\"{hostile}\""))
            });
            let dir = root.path().join("out").join("bag");
            fs::create_dir_all(dir.parent().unwrap()).unwrap();
            let err = export_bag(&target, ARK, None, &dir, &BagOptions::default()).unwrap_err();
            assert!(matches!(err, BagError::Storage(_)), "{hostile}: {err}");
            assert!(!dir.exists(), "{hostile}: a bag was left");
            assert!(!root.path().join("out/escaped.txt").exists());
            assert!(!root.path().join("escaped.txt").exists());
        }
    }

    #[test]
    fn damaged_content_is_not_bagged() {
        let (root, target, stored) = stored();
        let content = stored.object_root.join("v1/content").join(V1[0].0);
        fs::write(&content, "damaged").unwrap();
        let dir = root.path().join("bag");
        let err = export_bag(&target, ARK, None, &dir, &BagOptions::default()).unwrap_err();
        assert!(matches!(err, BagError::Fixity { .. }), "{err}");
        assert!(!dir.exists());
    }
}

// ------------------------------------------- new objects written directly

fn sha256(content: &str) -> String {
    use sha2::Sha256;
    hex::encode(Sha256::digest(content.as_bytes()))
}

fn expected_sha256(files: &[(&str, &str)]) -> BTreeMap<String, String> {
    files
        .iter()
        .map(|(p, c)| (p.to_string(), sha256(c)))
        .collect()
}

/// A fresh target and V1 written under its root (one file system, so a
/// store moves the files).
fn target_with_v1() -> (TempDir, OcflTarget, std::path::PathBuf) {
    let (root, target) = target();
    let src = root.path().join("v1");
    write_tree(&src, V1);
    (root, target, src)
}

/// A moving store of `src` as `ARK` with these digests, every file read
/// again.
fn store_direct(
    target: &OcflTarget,
    src: &Path,
    message: &str,
    sha512: &BTreeMap<String, String>,
    sha256: &BTreeMap<String, String>,
) -> Result<StoredVersion, StorageError> {
    store_vouched(target, src, message, sha512, sha256, &BTreeSet::new())
}

/// A moving store of `src` (holding [`V1`]) as version 1 of `ARK`, with
/// its right digests.
fn store_v1(target: &OcflTarget, src: &Path) -> StoredVersion {
    store_direct(
        target,
        src,
        "v1",
        &expected_sha512(V1),
        &expected_sha256(V1),
    )
    .expect("a direct store of v1")
}

/// A moving store of `src` as `ARK` in which the files of `unchanged` are
/// vouched for by the caller, not read again.
fn store_vouched(
    target: &OcflTarget,
    src: &Path,
    message: &str,
    sha512: &BTreeMap<String, String>,
    sha256: &BTreeMap<String, String>,
    unchanged: &BTreeSet<String>,
) -> Result<StoredVersion, StorageError> {
    let checks = Checks {
        sha512,
        sha256,
        unchanged,
    };
    target.store_checked_with(ARK, src, &meta(message), true, &checks)
}

/// A copying store (a further target's) of `src` as the next version of
/// `ARK`, with these digests.
fn store_copied(
    target: &OcflTarget,
    src: &Path,
    message: &str,
    sha512: &BTreeMap<String, String>,
    sha256: &BTreeMap<String, String>,
) -> Result<StoredVersion, StorageError> {
    let checks = Checks {
        sha512,
        sha256,
        unchanged: &BTreeSet::new(),
    };
    target.store_checked_with(ARK, src, &meta(message), false, &checks)
}

/// `expected_sha256(V1)` with a wrong value for each file of `wrong`.
fn sha256_wrong_for(wrong: &[&str]) -> BTreeMap<String, String> {
    let mut sha256 = expected_sha256(V1);
    for path in wrong {
        sha256.insert(
            (*path).into(),
            self::sha256(&format!("{path}, as downloaded")),
        );
    }
    sha256
}

/// Entries left in the target's own staging (rocfl's repository files
/// aside): a half-built object would show here.
fn leftovers(target: &OcflTarget) -> Vec<String> {
    fs::read_dir(target.staging_dir())
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("direct-"))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn a_new_moved_object_is_written_directly_with_the_callers_sha512() {
    use std::os::unix::fs::MetadataExt;
    let (_root, target, src) = target_with_v1();
    let inode = |path: &Path| fs::metadata(path).expect("metadata").ino();
    let before = inode(&src.join("producer/data/deep/b.txt"));

    let stored = store_v1(&target, &src);

    assert_eq!(stored.version, 1);
    assert_eq!(listing(&stored), expected_listing(V1));
    let moved = stored
        .object_root
        .join("v1/content/producer/data/deep/b.txt");
    assert_eq!(inode(&moved), before, "moved, not copied");
    assert!(!src.join("producer/data/deep/b.txt").exists());
    // rocfl finds it where its layout says, reads it and validates it,
    // content fixity included.
    assert_eq!(target.versions(ARK).unwrap(), vec![1]);
    assert_eq!(read(&target, ARK, Some(1), "producer/data/a.txt"), "alpha");
    let report = target.verify(ARK).unwrap();
    assert!(report.ok, "{:?}", report.problems);
    let info = target.version_info(ARK, 1).unwrap();
    assert_eq!(info.message, "v1");
    assert_eq!(info.digest_algorithm, "sha512");
    assert!(leftovers(&target).is_empty());
    assert_eq!(staged_objects(target.root()), 0);
}

#[test]
fn the_inventory_takes_the_sha512_computed_on_arrival_not_a_second_read() {
    // The caller's SHA-512 of one file is not its content's (as if the
    // disk changed the bytes after a download hashed them, in a way the
    // SHA-256 re-read cannot see): rocfl would compute the SHA-512 again
    // and refuse; the direct store records the digest of arrival, and the
    // fixity check reports the file.
    let (_root, target, src) = target_with_v1();
    let mut sha512 = expected_sha512(V1);
    sha512.insert("readme.txt".into(), self::sha512("hello, as it arrived"));
    let stored = store_direct(&target, &src, "v1", &sha512, &expected_sha256(V1))
        .expect("no second SHA-512 pass");
    assert_eq!(stored.version, 1);
    assert!(target.verify_structure(ARK).unwrap().ok);
    let report = target.verify(ARK).unwrap();
    assert!(!report.ok);
    assert!(
        report.problems.iter().any(|p| p.contains("readme.txt")),
        "{:?}",
        report.problems
    );
}

#[test]
fn a_file_changed_since_it_was_hashed_fails_a_direct_store_naming_it() {
    let (_root, target, src) = target_with_v1();
    let sha256 = sha256_wrong_for(&["producer/data/a.txt"]);
    let err = store_direct(&target, &src, "v1", &expected_sha512(V1), &sha256)
        .expect_err("the bytes on disk are not those hashed");
    let text = err.to_string();
    assert!(matches!(err, StorageError::DigestMismatch { .. }), "{text}");
    assert!(text.contains("producer/data/a.txt has SHA-256"), "{text}");
    assert!(!text.contains("readme.txt"), "{text}");
    assert!(matches!(
        target.versions(ARK),
        Err(StorageError::NotFound { .. })
    ));
    // Checked before anything moved: the source is whole for a retry.
    for (path, _) in V1 {
        assert!(src.join(path).is_file(), "{path} left the source");
    }
    assert!(leftovers(&target).is_empty());
}

#[test]
fn a_file_the_caller_shows_unchanged_is_not_read_again() {
    // The same wrong SHA-256 as above, for a file the caller vouches is
    // the one it hashed (its stamp kept): the store does not read it, so
    // the wrong value cannot fail it; the other files are still read.
    let (_root, target, src) = target_with_v1();
    let unchanged = BTreeSet::from(["producer/data/a.txt".to_string()]);
    let sha512 = expected_sha512(V1);
    let sha256 = sha256_wrong_for(&["producer/data/a.txt"]);
    let stored = store_vouched(&target, &src, "v1", &sha512, &sha256, &unchanged)
        .expect("a.txt is not read again");
    assert_eq!(stored.version, 1);
    // The caller's SHA-256 goes into the inventory's fixity block as
    // given: the full check reads every file and finds the wrong one.
    let report = target.verify(ARK).unwrap();
    assert!(!report.ok);
    assert_eq!(report.problems.len(), 1, "{:?}", report.problems);
    assert!(
        report.problems[0].contains("producer/data/a.txt") && report.problems[0].contains("sha256"),
        "{:?}",
        report.problems
    );

    // A file vouched for is skipped, not every file: a wrong SHA-256 of
    // another one still fails the store.
    let (_root, target, src) = target_with_v1();
    let sha256 = sha256_wrong_for(&["producer/data/a.txt", "readme.txt"]);
    let err = store_vouched(&target, &src, "v1", &sha512, &sha256, &unchanged)
        .expect_err("readme.txt is read again");
    let text = err.to_string();
    assert!(text.contains("readme.txt has SHA-256"), "{text}");
    assert!(!text.contains("a.txt has"), "{text}");
}

const V2: &[(&str, &str)] = &[
    ("readme.txt", "hello"),
    ("producer/new.txt", "new"),
    ("producer/again.txt", "new"),
];

/// A moving store of `src` (holding [`V2`]) as the next version of `ARK`,
/// with the SHA-512 of `sha512`.
fn store_v2(
    target: &OcflTarget,
    src: &Path,
    sha512: &BTreeMap<String, String>,
) -> Result<StoredVersion, StorageError> {
    store_direct(target, src, "v2", sha512, &expected_sha256(V2))
}

#[test]
fn a_later_version_is_written_directly_and_deduplicated() {
    use std::os::unix::fs::MetadataExt;
    let (root, target, src) = target_with_v1();
    store_v1(&target, &src);
    let src2 = root.path().join("v2");
    write_tree(&src2, V2);
    let inode = |path: &Path| fs::metadata(path).expect("metadata").ino();
    let before = inode(&src2.join("producer/again.txt"));

    let stored = store_v2(&target, &src2, &expected_sha512(V2)).unwrap();

    assert_eq!(stored.version, 2);
    assert_eq!(listing(&stored), expected_listing(V2));
    let object = &stored.object_root;
    assert_eq!(inode(&object.join("v2/content/producer/again.txt")), before);
    // Content the object holds (v1's readme.txt) or that the version holds
    // twice (new.txt, after again.txt) is recorded, not stored again.
    assert!(!object.join("v2/content/readme.txt").exists());
    assert!(!object.join("v2/content/producer/new.txt").exists());
    assert_eq!(read(&target, ARK, Some(1), "producer/data/a.txt"), "alpha");
    assert_eq!(read(&target, ARK, None, "producer/new.txt"), "new");
    assert_eq!(read(&target, ARK, None, "producer/again.txt"), "new");
    assert_eq!(read(&target, ARK, Some(2), "readme.txt"), "hello");
    assert_eq!(target.versions(ARK).unwrap(), vec![1, 2]);
    assert_eq!(target.version_info(ARK, 2).unwrap().message, "v2");
    // rocfl validates both versions, content fixity included.
    let report = target.verify(ARK).unwrap();
    assert!(report.ok, "{:?}", report.problems);
    assert!(report.warnings.is_empty(), "{:?}", report.warnings);
    assert!(leftovers(&target).is_empty());
    assert_eq!(staged_objects(target.root()), 0);
    // Every content path the versions added has the caller's SHA-256 as
    // fixity (what an access assembly checks), and no other path has.
    let inventory: serde_json::Value =
        serde_json::from_slice(&fs::read(object.join("inventory.json")).unwrap()).unwrap();
    let mut fixity = BTreeMap::new();
    for (digest, paths) in inventory["fixity"]["sha256"].as_object().expect("sha256") {
        for path in paths.as_array().expect("paths") {
            fixity.insert(path.as_str().expect("path").to_string(), digest.clone());
        }
    }
    let mut want: BTreeMap<String, String> = V1
        .iter()
        .map(|(p, c)| (format!("v1/content/{p}"), sha256(c)))
        .collect();
    want.insert("v2/content/producer/again.txt".into(), sha256("new"));
    assert_eq!(fixity, want);
    // And rocfl adds a third version to it.
    let src3 = source(&[("readme.txt", "third")]);
    assert_eq!(
        target
            .store_version(ARK, src3.path(), &meta("v3"))
            .unwrap()
            .version,
        3
    );
    assert!(target.verify(ARK).unwrap().ok);
}

#[test]
fn a_later_version_takes_the_sha512_computed_on_arrival_not_a_second_read() {
    // Issue 25, finding 2: rocfl's update path resolved every staged file
    // through all content paths of its digest (N² for N files sharing a
    // content) and read every byte again for its SHA-512. The direct
    // writer takes the caller's SHA-512 (rocfl would refuse this one), and
    // the fixity check reports the file.
    let (root, target, src) = target_with_v1();
    store_v1(&target, &src);
    let src2 = root.path().join("v2");
    write_tree(&src2, V2);
    let mut sha512 = expected_sha512(V2);
    sha512.insert(
        "producer/new.txt".into(),
        self::sha512("new, as it arrived"),
    );
    let stored = store_v2(&target, &src2, &sha512).expect("no second SHA-512 pass");
    assert_eq!(stored.version, 2);
    assert!(target.verify_structure(ARK).unwrap().ok);
    let report = target.verify(ARK).unwrap();
    assert!(!report.ok);
    assert!(
        report.problems.iter().any(|p| p.contains("new.txt")),
        "{:?}",
        report.problems
    );
}

#[test]
fn what_a_later_version_stopped_before_its_commit_left_is_cleaned_by_the_next_store() {
    let (root, target, src) = target_with_v1();
    let object = store_v1(&target, &src).object_root;
    // A store that stopped after moving its version into the object and
    // replacing the sidecar, before the inventory (the commit).
    fs::create_dir_all(object.join("v2/content")).unwrap();
    fs::write(object.join("v2/content/half.txt"), "half").unwrap();
    fs::write(object.join("inventory.json.sha512"), "0  inventory.json\n").unwrap();
    assert_eq!(target.versions(ARK).unwrap(), vec![1]);

    let src2 = root.path().join("v2");
    write_tree(&src2, V2);
    let stored = store_v2(&target, &src2, &expected_sha512(V2)).unwrap();

    assert_eq!(stored.version, 2);
    assert!(!object.join("v2/content/half.txt").exists());
    let report = target.verify(ARK).unwrap();
    assert!(report.ok, "{:?}", report.problems);
}

#[test]
fn a_later_version_that_fails_before_its_commit_leaves_the_object_as_it_was() {
    let (root, target, src) = target_with_v1();
    store_v1(&target, &src);
    let src2 = root.path().join("v2");
    write_tree(&src2, V2);
    let mut sha256 = expected_sha256(V2);
    sha256.insert("producer/new.txt".into(), self::sha256("changed"));
    let err = store_direct(&target, &src2, "v2", &expected_sha512(V2), &sha256)
        .expect_err("the bytes on disk are not those hashed");
    assert!(
        err.to_string().contains("producer/new.txt has SHA-256"),
        "{err}"
    );
    assert_eq!(target.versions(ARK).unwrap(), vec![1]);
    assert!(
        src2.join("producer/new.txt").is_file(),
        "checked before moving"
    );
    assert!(leftovers(&target).is_empty());
    assert!(target.verify(ARK).unwrap().ok);
}

#[test]
fn a_direct_store_refuses_a_missing_or_unexpected_file_before_moving_anything() {
    let (_root, target, src) = target_with_v1();
    let mut sha512 = expected_sha512(V1);
    sha512.insert("gone.txt".into(), self::sha512("gone"));
    let err = store_direct(&target, &src, "v1", &sha512, &expected_sha256(V1))
        .expect_err("a file is missing");
    assert!(err.to_string().contains("gone.txt is missing"), "{err}");
    assert!(src.join("readme.txt").is_file());
    assert!(target.versions(ARK).is_err());
}

#[test]
fn a_further_target_gets_copies_written_directly_and_deduplicated() {
    // Issue 25, finding 2: a copy (every target but the first) went through
    // rocfl, whose update path is quadratic in files sharing a content.
    use std::os::unix::fs::MetadataExt;
    let (root, target, src) = target_with_v1();
    let inode = |path: &Path| fs::metadata(path).expect("metadata").ino();
    let v1 = store_copied(
        &target,
        &src,
        "v1",
        &expected_sha512(V1),
        &expected_sha256(V1),
    )
    .expect("a copied v1");
    assert_eq!(v1.version, 1);
    assert_eq!(listing(&v1), expected_listing(V1));
    let copied = v1.object_root.join("v1/content/producer/data/a.txt");
    assert_ne!(inode(&copied), inode(&src.join("producer/data/a.txt")));
    // Copied, not moved: the source is whole for the next target.
    for (path, _) in V1 {
        assert!(src.join(path).is_file(), "{path} left the source");
    }

    let src2 = root.path().join("v2");
    write_tree(&src2, V2);
    let v2 = store_copied(
        &target,
        &src2,
        "v2",
        &expected_sha512(V2),
        &expected_sha256(V2),
    )
    .expect("a copied v2");
    assert_eq!(v2.version, 2);
    let object = &v2.object_root;
    assert!(!object.join("v2/content/readme.txt").exists());
    assert!(!object.join("v2/content/producer/new.txt").exists());
    assert_eq!(read(&target, ARK, None, "producer/again.txt"), "new");
    assert_eq!(read(&target, ARK, Some(2), "readme.txt"), "hello");
    assert!(src2.join("producer/again.txt").is_file());
    let report = target.verify(ARK).unwrap();
    assert!(report.ok, "{:?}", report.problems);
    assert!(report.warnings.is_empty(), "{:?}", report.warnings);
    assert!(leftovers(&target).is_empty());
    assert_eq!(staged_objects(target.root()), 0);
    // Written by the project's writer, not rocfl's (which stages an object
    // of its own and writes a pretty-printed inventory).
    let inventory = fs::read_to_string(object.join("inventory.json")).unwrap();
    assert!(!inventory.contains('\n'), "{inventory}");
}

/// A target holding [`V1`] as copied, and a source holding [`V2`].
fn copied_v1_and_source_of_v2() -> (TempDir, OcflTarget, std::path::PathBuf) {
    let (root, target, src) = target_with_v1();
    let (sha512, sha256) = (expected_sha512(V1), expected_sha256(V1));
    store_copied(&target, &src, "v1", &sha512, &sha256).expect("a copied v1");
    let src2 = root.path().join("v2");
    write_tree(&src2, V2);
    (root, target, src2)
}

#[test]
fn a_copy_whose_bytes_are_not_the_callers_sha512_commits_nothing() {
    let (_root, target, src2) = copied_v1_and_source_of_v2();
    let mut sha512 = expected_sha512(V2);
    sha512.insert(
        "producer/again.txt".into(),
        self::sha512("new, as it arrived"),
    );
    let err = store_copied(&target, &src2, "v2", &sha512, &expected_sha256(V2))
        .expect_err("the copied bytes are not those hashed at download");
    let text = err.to_string();
    assert!(matches!(err, StorageError::DigestMismatch { .. }), "{text}");
    assert!(
        text.contains("producer/again.txt has SHA-512") && text.contains("as copied"),
        "{text}"
    );
    assert_eq!(target.versions(ARK).unwrap(), vec![1]);
    assert!(target.verify(ARK).unwrap().ok);
    assert!(leftovers(&target).is_empty());
    assert!(src2.join("producer/again.txt").is_file());
}

#[test]
fn a_file_a_copy_only_records_is_checked_as_a_move_checks_it() {
    // v2's readme.txt has content v1 holds, so the copy records it without
    // reading it: its SHA-256 is checked instead, as for a move.
    let (_root, target, src2) = copied_v1_and_source_of_v2();
    let mut sha256 = expected_sha256(V2);
    sha256.insert("readme.txt".into(), self::sha256("hello, as downloaded"));
    let err = store_copied(&target, &src2, "v2", &expected_sha512(V2), &sha256)
        .expect_err("readme.txt on disk is not what was downloaded");
    assert!(err.to_string().contains("readme.txt has SHA-256"), "{err}");
    assert_eq!(target.versions(ARK).unwrap(), vec![1]);
}
