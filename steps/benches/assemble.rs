//! Assembly throughput against `tar` (issue 24): an object of four files
//! of pseudo-random bytes is stored in two OCFL targets, then assembled as
//! a tar by [`ingest_steps::assemble::assemble_from_any`], as the access
//! daemon assembles (every byte checked against the inventory as it
//! streams, the container hashed with SHA-256 as it is written, then
//! synced), and packed by GNU `tar -cf` (then synced) from the same stored
//! files on the same disk, alternately, three rounds each; the best round
//! of each is compared.
//!
//! The two targets differ in what the bytes are checked against: one is
//! stored as the worker stores (its digests given, so the inventory has
//! each file's SHA-256 as fixity, which the assembly checks: `fixity`),
//! the other through rocfl with no digests given (a manifest of SHA-512
//! only, as an object written by another tool may be: `sha512`). The
//! time `verify` takes over the first target against the second is
//! `verify_cost` (rocfl's full check reads each file once and computes
//! every digest the inventory gives it). The
//! process's peak RSS (`VmHWM`) is read after each size, to show it does
//! not follow the object's size.
//!
//! ```text
//! cargo bench -p ingest-steps --bench assemble -- 64 256
//! ```
//!
//! The arguments are object sizes in MiB (default 64 256).

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use chrono::Utc;
use ingest_steps::assemble::{assemble_from_any, Container, Content, Request};
use ingest_steps::digest::{digest_file, Algorithm};
use ingest_steps::ocfl::{Checks, OcflTarget, VersionMeta};

#[path = "support/args.rs"]
mod args;

fn main() {
    let Some(sizes) = args::sizes::<u64>(&[64, 256]) else {
        return;
    };
    println!("mib\tfixity_mib_s\tsha512_mib_s\ttar_mib_s\tratio_fixity\tratio_sha512\tverify_cost\tpeak_rss_mib");
    for mib in sizes {
        run(mib);
    }
}

fn run(mib: u64) {
    let dir = tempfile::tempdir_in(std::env::var_os("TMPDIR").unwrap_or_else(|| "/var/tmp".into()))
        .expect("a temporary directory");
    let source = dir.path().join("source");
    std::fs::create_dir_all(source.join("producer")).expect("mkdir");
    for i in 0..4 {
        pseudo_random(
            &source.join(format!("producer/f{i}.bin")),
            (mib << 20) / 4,
            i,
        );
    }
    let ark = "ark:/99999/fk4bench";
    let meta = VersionMeta {
        user_name: "bench".into(),
        user_address: None,
        message: "bench".into(),
        created: Utc::now(),
    };
    // As the worker stores: both digests of every file given.
    let (mut sha512, mut sha256) = (BTreeMap::new(), BTreeMap::new());
    for i in 0..4 {
        let logical = format!("producer/f{i}.bin");
        let (_, d) = digest_file(
            &source.join(&logical),
            &[Algorithm::Sha256, Algorithm::Sha512],
        )
        .expect("digests");
        sha256.insert(logical.clone(), d[0].1.clone());
        sha512.insert(logical, d[1].1.clone());
    }
    let unchanged = BTreeSet::new();
    let checks = Checks {
        sha512: &sha512,
        sha256: &sha256,
        unchanged: &unchanged,
    };
    let fixity = OcflTarget::open_or_init("fixity", &dir.path().join("fixity")).expect("a target");
    fixity
        .store_checked_with(ark, &source, &meta, false, &checks)
        .expect("stored");
    let plain = OcflTarget::open_or_init("sha512", &dir.path().join("sha512")).expect("a target");
    plain.store_version(ark, &source, &meta).expect("stored");
    let files = |target: &OcflTarget| target.version_content(ark, Some(1)).expect("content").files;
    assert!(files(&fixity).iter().all(|f| f.fixity_sha256.is_some()));
    assert!(files(&plain).iter().all(|f| f.fixity_sha256.is_none()));
    let stored: Vec<String> = files(&fixity)
        .iter()
        .map(|f| f.path.display().to_string())
        .collect();
    let list = dir.path().join("files.txt");
    std::fs::write(&list, stored.join("\n") + "\n").expect("list");
    let out = dir.path().join("out.tar");
    let [mut checked, mut sha512_only, mut theirs] = [Duration::MAX; 3];
    for _ in 0..3 {
        for (target, best) in [(&fixity, &mut checked), (&plain, &mut sha512_only)] {
            let t = Instant::now();
            let request = Request {
                ark,
                version: Some(1),
                content: Content::Producer,
                container: Container::Tar,
                bag: false,
            };
            let (done, _) = assemble_from_any([target], &request, &out, None);
            let (done, digest) = done.expect("assembled");
            *best = (*best).min(t.elapsed());
            assert!(!digest.read_back);
            assert_eq!(done.bytes, (mib << 20) / 4 * 4);
        }
        let t = Instant::now();
        let status = std::process::Command::new("tar")
            .args(["-cPf"])
            .arg(&out)
            .arg("-T")
            .arg(&list)
            .status()
            .expect("GNU tar");
        assert!(status.success());
        std::fs::File::open(&out)
            .and_then(|f| f.sync_all())
            .expect("sync");
        theirs = theirs.min(t.elapsed());
    }
    // What the fixity costs `verify` (rocfl checks every digest the
    // inventory gives a file: SHA-512 and, with fixity, SHA-256 too).
    let [mut verify_fixity, mut verify_plain] = [Duration::MAX; 2];
    for _ in 0..3 {
        for (target, best) in [(&fixity, &mut verify_fixity), (&plain, &mut verify_plain)] {
            let t = Instant::now();
            assert!(target.verify(ark).expect("verify").ok);
            *best = (*best).min(t.elapsed());
        }
    }
    let rate = |d: Duration| mib as f64 / d.as_secs_f64();
    println!(
        "{mib}\t{:.0}\t{:.0}\t{:.0}\t{:.2}\t{:.2}\t{:.2}\t{:.1}",
        rate(checked),
        rate(sha512_only),
        rate(theirs),
        rate(checked) / rate(theirs),
        rate(sha512_only) / rate(theirs),
        verify_fixity.as_secs_f64() / verify_plain.as_secs_f64(),
        peak_rss() as f64 / (1 << 20) as f64
    );
}

/// Pseudo-random bytes (xorshift), so nothing compresses or is sparse.
fn pseudo_random(path: &Path, bytes: u64, seed: u64) {
    let mut out = std::io::BufWriter::new(std::fs::File::create(path).expect("create"));
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15 ^ (seed + 1);
    let mut chunk = vec![0u8; 1 << 20];
    let mut left = bytes;
    while left > 0 {
        for word in chunk.chunks_exact_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            word.copy_from_slice(&x.to_le_bytes());
        }
        let n = left.min(chunk.len() as u64) as usize;
        out.write_all(&chunk[..n]).expect("write");
        left -= n as u64;
    }
    out.flush().expect("flush");
}

/// This process's peak resident set in bytes.
fn peak_rss() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .unwrap_or(0)
        * 1024
}
