//! Container extraction (zip, tar, tar.gz, found from the first bytes) on
//! arbitrary bytes, into a temporary directory with the real limits: never
//! a panic, and nothing is written outside the destination, whatever the
//! entries' names, links or sizes claim.
#![no_main]

use std::path::Path;

use ingest_steps::container::{extract, ExtractLimits};
use libfuzzer_sys::fuzz_target;

/// Every path under `dir`, recursively (links not followed).
fn walk(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        out.push(path.clone());
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            walk(&path, out);
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(root) = tempfile::tempdir() else {
        return;
    };
    let archive = root.path().join("payload");
    if std::fs::write(&archive, data).is_err() {
        return;
    }
    let dest = root.path().join("out");
    let limits = ExtractLimits::default();
    match extract(&archive, &dest, &limits) {
        Ok(files) => {
            assert!(files.len() as u64 <= limits.max_entries);
            let total: u64 = files.iter().map(|f| f.size).sum();
            assert!(total <= limits.max_total_bytes);
            for f in &files {
                assert!(f.path.starts_with(&dest), "{:?} outside {:?}", f.path, dest);
                assert!(!f.name.contains(".."), "{:?}", f.name);
            }
        }
        Err(e) => assert!(e.to_string().len() <= 8192, "an unbounded error"),
    }
    // Nothing beside the archive and the destination, and no link inside.
    let mut seen = Vec::new();
    walk(root.path(), &mut seen);
    for p in seen {
        assert!(
            p == archive || p.starts_with(&dest),
            "{p:?} was written outside the destination"
        );
        let meta = std::fs::symlink_metadata(&p).expect("stat");
        assert!(!meta.file_type().is_symlink(), "{p:?} is a link");
    }
});
