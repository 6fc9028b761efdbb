//! Storing at the size `--max-object-files` allows by default (issue 25,
//! finding 2): 100,000 one-byte files, one content, the worst case for an
//! OCFL manifest, stored as a new object and again as a later version,
//! each with the structure check the storing step runs after it, within
//! [`BOUND`] each.
//!
//! Ignored by default (it writes 200,000 files); `tools/store-scale` runs
//! it, with the bench that gives the per-file curve:
//!
//! ```text
//! cargo test -p ingest-steps --test scale -- --ignored
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

use chrono::Utc;
use ingest_steps::ocfl::{Checks, OcflTarget, VersionMeta};
use sha2::{Digest, Sha256, Sha512};

/// What storing 100,000 files and checking the result may take, per
/// version, on this project's 2-core machine in a debug build (a release
/// build takes a few seconds: docs/performance.md). Before issue 25 a new
/// object of 100,000 files was not read back after 22 minutes, and a later
/// version through rocfl grew with the square of the file count.
const BOUND: Duration = Duration::from_secs(60);

const FILES: usize = 100_000;

#[test]
#[ignore = "writes 200,000 files; run by tools/store-scale"]
fn storing_100_000_one_byte_files_stays_within_the_bound() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let target = OcflTarget::open_or_init("scale", &dir.path().join("ocfl")).expect("a root");
    let ark = "ark:/99999/fk4scale";
    for (version, changed) in [(1, None), (2, Some(0))] {
        let source = dir.path().join(format!("v{version}"));
        let (sha512, sha256) = write_source(&source, changed);
        let unchanged: BTreeSet<String> = sha512.keys().cloned().collect();
        let checks = Checks {
            sha512: &sha512,
            sha256: &sha256,
            unchanged: &unchanged,
        };
        let meta = VersionMeta {
            user_name: "scale".into(),
            user_address: None,
            message: format!("v{version}"),
            created: Utc::now(),
        };
        let started = Instant::now();
        let stored = target
            .store_checked_with(ark, &source, &meta, true, &checks)
            .expect("stored");
        let report = target.verify_structure(ark).expect("validated");
        let took = started.elapsed();
        assert_eq!(stored.version, version);
        assert!(report.ok, "{:?}", report.problems);
        assert_eq!(
            target.version_info(ark, version).expect("read").files.len(),
            FILES
        );
        println!("v{version}: {FILES} files stored and checked in {took:?}");
        assert!(
            took <= BOUND,
            "v{version}: {FILES} files took {took:?}, over the stated {BOUND:?}"
        );
    }
}

/// [`FILES`] one-byte files under `source`, 1,000 per directory, all `x`
/// but file `changed`; their SHA-512 and SHA-256 by logical path.
fn write_source(
    source: &Path,
    changed: Option<usize>,
) -> (BTreeMap<String, String>, BTreeMap<String, String>) {
    let (mut sha512, mut sha256) = (BTreeMap::new(), BTreeMap::new());
    let digests = |bytes: &[u8]| {
        (
            hex::encode(Sha512::digest(bytes)),
            hex::encode(Sha256::digest(bytes)),
        )
    };
    let (x, y) = (digests(b"x"), digests(b"y"));
    for i in 0..FILES {
        let logical = format!("d{:03}/f{i:06}", i / 1000);
        let path = source.join(&logical);
        if i % 1000 == 0 {
            std::fs::create_dir_all(path.parent().expect("a parent")).expect("a directory");
        }
        let (bytes, (d512, d256)): (&[u8], _) = if changed == Some(i) {
            (b"y", &y)
        } else {
            (b"x", &x)
        };
        std::fs::write(&path, bytes).expect("a source file");
        sha512.insert(logical.clone(), d512.clone());
        sha256.insert(logical, d256.clone());
    }
    (sha512, sha256)
}
