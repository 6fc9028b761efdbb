//! Stopping stores when the process stops (issue 25): a test binary of its
//! own, because [`stop_stores`] holds for the whole process.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use chrono::Utc;
use ingest_steps::ocfl::{stop_stores, Checks, OcflTarget, StorageError, VersionMeta};
use sha2::{Digest, Sha256, Sha512};

#[test]
fn a_store_held_half_built_stops_before_its_commit_and_leaves_nothing() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let target = OcflTarget::open_or_init("stop", &dir.path().join("ocfl")).expect("a root");
    // Held half built far longer than the test waits.
    target.set_build_pause(Duration::from_secs(600));
    let source = dir.path().join("source");
    std::fs::create_dir_all(&source).expect("a source");
    std::fs::write(source.join("a.txt"), b"a").expect("a file");
    let sha512 = BTreeMap::from([("a.txt".to_string(), hex::encode(Sha512::digest(b"a")))]);
    let sha256 = BTreeMap::from([("a.txt".to_string(), hex::encode(Sha256::digest(b"a")))]);
    let unchanged = BTreeSet::new();
    let meta = VersionMeta {
        user_name: "stop".into(),
        user_address: None,
        message: "v1".into(),
        created: Utc::now(),
    };
    let ark = "ark:/99999/fk4stop";
    let staging = target.staging_dir();
    let stopped = std::thread::scope(|scope| {
        let store = scope.spawn(|| {
            let checks = Checks {
                sha512: &sha512,
                sha256: &sha256,
                unchanged: &unchanged,
            };
            target.store_checked_with(ark, &source, &meta, true, &checks)
        });
        // Once the object is half built in staging, the process stops.
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while !half_built(&staging) {
            assert!(std::time::Instant::now() < deadline, "never half built");
            std::thread::sleep(Duration::from_millis(10));
        }
        stop_stores();
        store.join().expect("the store thread")
    });
    assert!(
        matches!(stopped, Err(StorageError::Stopped { .. })),
        "{stopped:?}"
    );
    assert!(!half_built(&staging), "the half-built object was removed");
    assert!(matches!(
        target.versions(ark),
        Err(StorageError::NotFound { .. })
    ));
    // Every later store stops at once.
    let again = target.store_version(ark, &source, &meta);
    assert!(
        matches!(again, Err(StorageError::Stopped { .. })),
        "{again:?}"
    );
}

fn half_built(staging: &std::path::Path) -> bool {
    std::fs::read_dir(staging).is_ok_and(|entries| {
        entries
            .flatten()
            .any(|e| e.file_name().to_string_lossy().starts_with("direct-"))
    })
}
