//! Storing a new object of N one-byte files, and the reads that check it,
//! timed phase by phase at several sizes (issue 25, finding 2).
//!
//! Every file holds the same byte, the worst case for an OCFL manifest
//! (one digest, N content paths). The phases are the ones a storing step
//! runs for a new object moved into the first target
//! (`OcflTarget::store_checked_with`, `verify_structure`) and the reads
//! after it (`version_info`, the stored-manifest check's and the
//! consistency check's; `version_content`, the content route's); then the
//! same for a later version (v2: the same N paths, one file's content
//! changed, as a resubmitted object is stored), and a full fixity `verify`
//! of the two-version object (what the other targets' stores run). First,
//! both versions are copied into a second target, as every target but the
//! first stores (`moving` false: the source is copied, not moved).
//!
//! ```text
//! cargo bench -p ingest-steps --bench ocfl_store -- 10000 30000 100000
//! ```
//!
//! Prints one line per size and phase with the time per file, so the
//! curve is read as a ratio between sizes in one run. A phase that runs
//! past `OCFL_BENCH_LIMIT_SECS` (default 600) ends the run for larger
//! sizes (it is reported as not finished).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

use chrono::Utc;
use ingest_steps::ocfl::{Checks, OcflTarget, VersionMeta};
use sha2::{Digest, Sha256, Sha512};

#[path = "support/args.rs"]
mod args;

fn main() {
    // Nothing as a test target: it stores 140,000 files.
    let Some(sizes) = args::sizes::<usize>(&[10_000, 30_000, 100_000]) else {
        return;
    };
    let limit = Duration::from_secs(
        std::env::var("OCFL_BENCH_LIMIT_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(600),
    );
    println!("files\tphase\ttotal_s\tper_file_us");
    for n in sizes {
        if !run(n, limit) {
            println!("{n}\t(stopped: a phase ran past {} s)", limit.as_secs());
            break;
        }
    }
}

/// Runs every phase for `n` files; `false` when one ran past `limit`.
fn run(n: usize, limit: Duration) -> bool {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let root = dir.path().join("ocfl");
    let source = dir.path().join("source");
    let mut sha512s = BTreeMap::new();
    let mut sha256s = BTreeMap::new();
    write_source(&source, n, |_| b"x", &mut sha512s, &mut sha256s);
    let unchanged: BTreeSet<String> = sha512s.keys().cloned().collect();
    // v2: every path again, the first file's content changed.
    let source2 = dir.path().join("source2");
    let (mut sha512s2, mut sha256s2) = (BTreeMap::new(), BTreeMap::new());
    write_source(
        &source2,
        n,
        |i| if i == 0 { b"y" } else { b"x" },
        &mut sha512s2,
        &mut sha256s2,
    );
    let unchanged2: BTreeSet<String> = sha512s2.keys().cloned().collect();
    let target = OcflTarget::open_or_init("bench", &root).expect("a storage root");
    let further = OcflTarget::open_or_init("further", &dir.path().join("ocfl-further"))
        .expect("a second storage root");
    let ark = "ark:/99999/fk4bench";
    let meta = VersionMeta {
        user_name: "bench".into(),
        user_address: None,
        message: "bench".into(),
        created: Utc::now(),
    };
    let checks = Checks {
        sha512: &sha512s,
        sha256: &sha256s,
        unchanged: &unchanged,
    };
    let checks2 = Checks {
        sha512: &sha512s2,
        sha256: &sha256s2,
        unchanged: &unchanged2,
    };
    let phases: [(&str, &dyn Fn()); 11] = [
        ("store (copy v1, a further target)", &|| {
            further
                .store_checked_with(ark, &source, &meta, false, &checks)
                .expect("stored");
        }),
        ("store (copy v2, a further target)", &|| {
            let stored = further
                .store_checked_with(ark, &source2, &meta, false, &checks2)
                .expect("stored");
            assert_eq!(stored.version, 2);
        }),
        ("store (direct v1)", &|| {
            target
                .store_checked_with(ark, &source, &meta, true, &checks)
                .expect("stored");
        }),
        ("verify_structure", &|| {
            assert!(target.verify_structure(ark).expect("validated").ok);
        }),
        ("version_info", &|| {
            assert_eq!(target.version_info(ark, 1).expect("read").files.len(), n);
        }),
        ("version_content", &|| {
            assert_eq!(
                target
                    .version_content(ark, Some(1))
                    .expect("read")
                    .files
                    .len(),
                n
            );
        }),
        ("store (v2)", &|| {
            let stored = target
                .store_checked_with(ark, &source2, &meta, true, &checks2)
                .expect("stored");
            assert_eq!(stored.version, 2);
        }),
        ("verify_structure (v2)", &|| {
            assert!(target.verify_structure(ark).expect("validated").ok);
        }),
        ("version_info (v2)", &|| {
            assert_eq!(target.version_info(ark, 2).expect("read").files.len(), n);
        }),
        ("version_content (v2)", &|| {
            assert_eq!(
                target
                    .version_content(ark, Some(2))
                    .expect("read")
                    .files
                    .len(),
                n
            );
        }),
        ("verify (fixity, v1 and v2)", &|| {
            assert!(target.verify(ark).expect("validated").ok);
        }),
    ];
    let mut total = Duration::ZERO;
    for (name, phase) in phases {
        let started = Instant::now();
        phase();
        let took = started.elapsed();
        total += took;
        report(n, name, took);
        if took > limit {
            return false;
        }
    }
    report(n, "all", total);
    true
}

/// Writes `n` one-byte files under `source` (1,000 per directory, as a
/// deep object would be laid out), the content of file `i` being
/// `content(i)`, and records their digests.
fn write_source(
    source: &Path,
    n: usize,
    content: impl Fn(usize) -> &'static [u8],
    sha512s: &mut BTreeMap<String, String>,
    sha256s: &mut BTreeMap<String, String>,
) {
    for i in 0..n {
        let logical = format!("d{:04}/f{i:07}", i / 1000);
        let path = source.join(&logical);
        if i % 1000 == 0 {
            std::fs::create_dir_all(path.parent().expect("a parent")).expect("a directory");
        }
        let bytes = content(i);
        std::fs::write(&path, bytes).expect("a source file");
        sha512s.insert(logical.clone(), hex::encode(Sha512::digest(bytes)));
        sha256s.insert(logical, hex::encode(Sha256::digest(bytes)));
    }
}

fn report(n: usize, phase: &str, took: Duration) {
    println!(
        "{n}\t{phase}\t{:.2}\t{:.1}",
        took.as_secs_f64(),
        took.as_secs_f64() * 1e6 / n as f64
    );
}
