//! The data directory's storage told truthfully: damaged sled files give a
//! readable error from every command that opens them, `verify` works on a
//! read-only copy and writes nothing, names the positions a truncated log
//! lost (against the ZooKeeper checkpoint), and `repair`'s preview says what
//! the repair then does.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::util::{ingest_bin, Ingest, Run};
use crate::zk_server::{shared, unique_root};

/// Tokens `ingest serve` needs before it opens the data directory.
const TOKENS: [(&str, &str); 4] = [
    ("INGEST_ADMIN_TOKEN", "admin-token-for-storage-tests"),
    ("INGEST_WORKER_TOKEN", "worker-token-for-storage-tests"),
    ("INGEST_READER_TOKEN", "reader-token-for-storage-tests"),
    (
        "INGEST_DEPOSITOR_TOKEN",
        "depositor-token-for-storage-tests",
    ),
];

/// `ingest --data-dir DIR ARGS` with `env`, nothing inherited that names
/// another data directory or ZooKeeper.
fn run_in(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Run {
    let out = Command::new(ingest_bin())
        .arg("--data-dir")
        .arg(dir)
        .args(args)
        .env("INGEST_ACTOR", "admin:tester")
        .env_remove("INGEST_DATA_DIR")
        .env_remove("INGEST_ZK")
        .env_remove("INGEST_ZK_ROOT")
        .envs(env.iter().copied())
        .output()
        .expect("run ingest");
    Run::from_output(out)
}

/// One submission: one event.
/// `len` letters and digits that do not compress (the log pages are
/// zstd-compressed, so repeated padding would hardly grow the log).
fn noise(seed: usize, len: usize) -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut x = (seed as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            char::from(ALPHABET[(x % 36) as usize])
        })
        .collect()
}

fn submit(ing: &Ingest, n: usize, padding: usize) {
    let name = format!("f{n}-{}.checkm loc{n}", noise(n, padding));
    ing.run(&[
        "submit",
        "--profile",
        "demo_content",
        "--submitter",
        "alice",
        "--payload-url",
        "https://example.org/batch.checkm",
        "--manifest",
        &name,
    ])
    .ok();
}

fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to).expect("create copy");
    for entry in fs::read_dir(from).expect("list") {
        let entry = entry.expect("entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("type").is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            fs::copy(entry.path(), &target).expect("copy");
        }
    }
}

/// Every file under `dir` with its size, content hash and mtime.
fn fingerprint(dir: &Path) -> BTreeMap<PathBuf, (u64, String, std::time::SystemTime)> {
    let mut out = BTreeMap::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(d) = pending.pop() {
        for entry in fs::read_dir(&d).expect("list") {
            let entry = entry.expect("entry");
            let meta = entry.metadata().expect("metadata");
            if meta.is_dir() {
                pending.push(entry.path());
            } else {
                let bytes = fs::read(entry.path()).expect("read");
                let hash = format!("{:x}", md5_like(&bytes));
                out.insert(
                    entry.path(),
                    (meta.len(), hash, meta.modified().expect("mtime")),
                );
            }
        }
    }
    out
}

/// A content fingerprint (FNV-1a, 64 bits): enough to see a change.
fn md5_like(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Asserts `run` failed with a readable message naming `dir`, and no panic.
#[track_caller]
fn assert_readable_failure(what: &str, run: &Run, dir: &Path) {
    let shown = dir.display().to_string();
    assert!(
        run.code != 0 && run.code != 101,
        "{what}: exit code {}\n{}",
        run.code,
        run.stderr
    );
    for bad in ["panicked", "backtrace", "RUST_BACKTRACE", "offset None"] {
        assert!(
            !run.stderr.contains(bad),
            "{what}: stderr shows {bad:?}:\n{}",
            run.stderr
        );
    }
    assert!(
        run.stderr.contains(&shown) && run.stderr.contains("Restore the data directory"),
        "{what}: the message names neither {shown} nor what to do:\n{}",
        run.stderr
    );
}

/// Flipped bytes, a file cut by 1 MiB, zeroed blocks, a missing data file:
/// verify, repair, show, history and serve each exit with an error that
/// names the data directory and what to do, never a panic.
#[test]
fn damaged_log_files_give_a_readable_error_from_every_command() {
    let ing = Ingest::new();
    // About 2 MiB of log (compressed pages), so a 1 MiB cut leaves a partial file (sled
    // panicked on such cuts).
    for n in 0..45 {
        submit(&ing, n, 60_000);
    }
    let db = ing.data_dir().join("log/db");
    let size = fs::metadata(&db).expect("db").len();
    assert!(size > 3 * 512 * 1024, "the log is {size} bytes");
    type Damage = fn(&Path);
    let damages: [(&str, Damage); 4] = [
        ("flipped bytes", |db| {
            let mut b = fs::read(db).unwrap();
            // Through the whole file: which segments hold live pages
            // depends on sled's layout (and on compression).
            for i in (100..b.len()).step_by(997) {
                b[i] ^= 0xff;
            }
            fs::write(db, b).unwrap();
        }),
        ("cut by 1 MiB", |db| {
            let f = fs::OpenOptions::new().write(true).open(db).unwrap();
            let len = f.metadata().unwrap().len();
            f.set_len(len - 1024 * 1024).unwrap();
        }),
        ("zeroed blocks", |db| {
            // 4 KiB zeroed in every 64 KiB: live pages may sit in any
            // segment (sled's layout, and compression, decide where).
            let mut b = fs::read(db).unwrap();
            for start in (0..b.len()).step_by(64 * 1024) {
                let end = (start + 4096).min(b.len());
                b[start..end].fill(0);
            }
            fs::write(db, b).unwrap();
        }),
        ("missing data file", |db| fs::remove_file(db).unwrap()),
    ];
    let work = tempfile::tempdir().unwrap();
    for (i, (name, damage)) in damages.iter().enumerate() {
        let dir = work.path().join(format!("damaged-{i}"));
        copy_dir(ing.data_dir(), &dir);
        damage(&dir.join("log/db"));
        let commands: [&[&str]; 5] = [
            &["verify"],
            &["repair"],
            &["show", "batch", "bid0000000001"],
            &["history", "--batch", "bid0000000001"],
            &["serve", "--listen", "127.0.0.1:0"],
        ];
        for args in commands {
            let run = run_in(&dir, args, &TOKENS);
            assert_readable_failure(&format!("{name}: ingest {}", args.join(" ")), &run, &dir);
        }
    }
}

/// A copy (`backup` in a temporary directory) of a data directory that
/// holds `events` submissions.
fn backup_of(events: usize) -> (tempfile::TempDir, PathBuf) {
    let ing = Ingest::new();
    for n in 0..events {
        submit(&ing, n, 0);
    }
    let work = tempfile::tempdir().expect("tempdir");
    let copy = work.path().join("backup");
    copy_dir(ing.data_dir(), &copy);
    (work, copy)
}

/// An auditor's read-only copy of a data directory verifies, and not a
/// byte or a timestamp of it changes.
#[test]
fn verify_of_a_read_only_copy_works_and_writes_nothing() {
    let (_work, copy) = backup_of(5);
    let status = Command::new("chmod")
        .args(["-R", "a-w"])
        .arg(&copy)
        .status()
        .unwrap();
    assert!(status.success());
    let before = fingerprint(&copy);

    let run = run_in(&copy, &["verify"], &[]).ok();

    assert!(run.stdout.contains("5 events checked"), "{}", run.stdout);
    assert_eq!(fingerprint(&copy), before, "verify wrote into the copy");
    let _ = Command::new("chmod")
        .args(["-R", "u+w"])
        .arg(&copy)
        .status();
}

/// A read-only bind mount, unmounted on drop (even when the test fails).
struct ReadOnlyMount(PathBuf);

impl ReadOnlyMount {
    /// Mounts `from` read-only at `at`; `None` (with a note) when this
    /// process may not mount, which fails the test under `CI=true`.
    fn of(from: &Path, at: &Path) -> Option<ReadOnlyMount> {
        fs::create_dir_all(at).expect("the mount point");
        let run = |args: &[&str]| {
            Command::new("mount")
                .args(args)
                .output()
                .map_err(|e| e.to_string())
                .and_then(|o| {
                    o.status
                        .success()
                        .then_some(())
                        .ok_or_else(|| String::from_utf8_lossy(&o.stderr).into_owned())
                })
        };
        let bound = run(&["--bind", &from.to_string_lossy(), &at.to_string_lossy()]);
        if let Err(e) = bound {
            crate::util::untested(&format!(
                "cannot make a bind mount (root and mount(8) are needed): {e}"
            ));
            return None;
        }
        let mount = ReadOnlyMount(at.to_path_buf());
        run(&["-o", "remount,ro,bind", &at.to_string_lossy()]).expect("remount read-only");
        Some(mount)
    }
}

impl Drop for ReadOnlyMount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// Issue 25, finding 10: `verify` judged a read-only directory by its
/// permission bits, so on a read-only mount whose files keep their write
/// bits it opened the log for writing and failed. It now asks the kernel
/// and verifies a private copy.
#[test]
fn verify_works_on_a_read_only_mount_whose_files_keep_their_write_bits() {
    let (work, source) = backup_of(3);
    let at = work.path().join("mnt");
    let Some(mount) = ReadOnlyMount::of(&source, &at) else {
        return;
    };
    assert!(
        !fs::metadata(at.join("log"))
            .unwrap()
            .permissions()
            .readonly(),
        "the files keep their write bits"
    );
    let before = fingerprint(&at);
    let run = run_in(&at, &["verify"], &[]).ok();
    assert!(run.stdout.contains("3 events checked"), "{}", run.stdout);
    assert!(run.stderr.contains("private copy"), "{}", run.stderr);
    assert_eq!(fingerprint(&at), before);
    drop(mount);
}

/// The preview of `ingest repair` and `ingest repair --yes` agree on torn
/// tails of several lengths, and on damage that is not a torn tail (which
/// neither offers to remove).
#[test]
fn repair_preview_and_repair_agree_on_damaged_logs() {
    // (positions damaged, of a log of 6)
    let cases: [&[u64]; 4] = [&[6], &[4, 5, 6], &[3], &[2, 5]];
    for damaged in cases {
        let ing = Ingest::new();
        for n in 0..6 {
            submit(&ing, n, 0);
        }
        {
            let log = ingest_events::Log::open(&ing.data_dir().join("log"), &Default::default())
                .expect("open log");
            for position in damaged {
                let key = ingest_events::Log::raw_event_key(*position);
                let mut bytes = log.raw_tree().get(key).unwrap().unwrap().to_vec();
                let n = bytes.len();
                bytes.truncate(n / 2);
                log.raw_tree().insert(key, bytes).unwrap();
            }
            log.raw_tree().flush().unwrap();
        }
        let preview = ing.run(&["repair"]).failed();
        let promised = removed_range(&preview.stdout);
        let repair = ing.run(&["repair", "--yes"]);
        let done = (repair.code == 0)
            .then(|| removed_range(&repair.stdout))
            .flatten();
        assert_eq!(
            promised, done,
            "damage at {damaged:?}: the preview said\n{}\nthe repair said\n{}{}",
            preview.stdout, repair.stdout, repair.stderr
        );
        let tail = (damaged[0]..=6).all(|p| damaged.contains(&p));
        if tail {
            assert_eq!(promised, Some((damaged[0], 6)), "{}", preview.stdout);
            ing.run(&["verify"]).ok();
        } else {
            assert!(
                preview.stdout.contains("cannot repair it"),
                "{}",
                preview.stdout
            );
            assert_ne!(repair.code, 0, "{}", repair.stdout);
        }
    }
}

/// `positions A..=B` in `text`, the first one.
fn removed_range(text: &str) -> Option<(u64, u64)> {
    let rest = &text[text.find("positions ")? + "positions ".len()..];
    let (a, rest) = rest.split_once("..=")?;
    let b: String = rest.chars().take_while(char::is_ascii_digit).collect();
    Some((a.parse().ok()?, b.parse().ok()?))
}

/// A data directory restored from a copy taken 9 events ago verifies OK on
/// its own (the chain is intact); with ZooKeeper configured (here through
/// INGEST_ZK, as an operator's environment has it) `verify` names the 9
/// missing positions from the projection checkpoint and fails.
#[test]
fn verify_names_the_positions_a_truncated_log_lost() {
    let server = shared();
    let root = unique_root("truncated");
    let ing = Ingest::new();
    for n in 0..5 {
        submit(&ing, n, 0);
    }
    let work = tempfile::tempdir().unwrap();
    let saved = work.path().join("at-5");
    copy_dir(ing.data_dir(), &saved);
    for n in 5..14 {
        submit(&ing, n, 0);
    }
    let hosts = server.hosts();
    ing.run(&["project", "--zk", &hosts, "--zk-root", &root])
        .ok();
    let zk_env = [
        ("INGEST_ZK", hosts.as_str()),
        ("INGEST_ZK_ROOT", root.as_str()),
    ];
    // The longer log itself agrees with the checkpoint.
    let whole = run_in(ing.data_dir(), &["verify"], &zk_env).ok();
    assert!(
        whole.stdout.contains("matches this log"),
        "{}",
        whole.stdout
    );

    // The restored copy: intact chain, 9 events short.
    run_in(&saved, &["verify"], &[]).ok();
    let run = run_in(&saved, &["verify"], &zk_env).failed();

    assert_eq!(run.code, 1, "{}", run.stderr);
    assert!(
        run.stdout.contains("positions 6..=14 are missing"),
        "{}\n{}",
        run.stdout,
        run.stderr
    );
}
