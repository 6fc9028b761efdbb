//! Assembly throughput against `tar` (issue 24): an object of four files
//! of pseudo-random bytes is stored in an OCFL target, then assembled as a
//! tar by [`ingest_steps::assemble::assemble_from_any`], as the access
//! daemon assembles (every byte checked against the inventory's SHA-512 as
//! it streams, the container hashed with SHA-256 as it is written, then
//! synced) and packed by GNU `tar -cf` (then synced) from
//! the same stored files on the same disk, alternately, three rounds each;
//! the best round of each is compared. The process's peak RSS (`VmHWM`)
//! is read after each size, to show it does not follow the object's size.
//!
//! ```text
//! cargo bench -p ingest-steps --bench assemble -- 64 256
//! ```
//!
//! The arguments are object sizes in MiB (default 64 256).

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use chrono::Utc;
use ingest_steps::assemble::{assemble_from_any, Container, Content, Request};
use ingest_steps::ocfl::{OcflTarget, VersionMeta};

#[path = "support/args.rs"]
mod args;

fn main() {
    let Some(sizes) = args::sizes::<u64>(&[64, 256]) else {
        return;
    };
    println!("mib\tassemble_mib_s\ttar_mib_s\tratio\tpeak_rss_mib");
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
    let target = OcflTarget::open_or_init("bench", &dir.path().join("ocfl")).expect("a target");
    let ark = "ark:/99999/fk4bench";
    let meta = VersionMeta {
        user_name: "bench".into(),
        user_address: None,
        message: "bench".into(),
        created: Utc::now(),
    };
    target.store_version(ark, &source, &meta).expect("stored");
    let stored: Vec<String> = target
        .version_content(ark, Some(1))
        .expect("content")
        .files
        .iter()
        .map(|f| f.path.display().to_string())
        .collect();
    let list = dir.path().join("files.txt");
    std::fs::write(&list, stored.join("\n") + "\n").expect("list");
    let out = dir.path().join("out.tar");
    let (mut ours, mut theirs) = (Duration::MAX, Duration::MAX);
    for _ in 0..3 {
        let t = Instant::now();
        let request = Request {
            ark,
            version: Some(1),
            content: Content::Producer,
            container: Container::Tar,
            bag: false,
        };
        let (done, _) = assemble_from_any([&target], &request, &out, None);
        let (done, digest) = done.expect("assembled");
        ours = ours.min(t.elapsed());
        assert!(!digest.read_back);
        assert_eq!(done.bytes, (mib << 20) / 4 * 4);
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
    let rate = |d: Duration| mib as f64 / d.as_secs_f64();
    println!(
        "{mib}\t{:.0}\t{:.0}\t{:.2}\t{:.1}",
        rate(ours),
        rate(theirs),
        rate(ours) / rate(theirs),
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
