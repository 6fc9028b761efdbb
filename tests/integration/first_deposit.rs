//! The newcomer's path: the README's "A first real deposit" runs as written.
//!
//! The test reads the shell blocks between the README's `first-deposit`
//! markers and runs them, unchanged, in one `bash -euo pipefail` from the
//! repository's root, with the `ingest` under test first on `PATH`: a real
//! ZooKeeper from `tools/zk`, a real HTTP file server (Python's), a real
//! `ingest serve --steps real`. Then it runs the README's clean-up block.
//! Edit the README's commands and this test runs the new ones; if they stop
//! working, it fails.

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::util::ingest_bin;

const BEGIN: &str = "<!-- first-deposit:begin";
const END: &str = "<!-- first-deposit:end -->";

/// The bodies of the ```sh blocks of `text`, in order.
fn sh_blocks(text: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        match (&mut current, line.trim_end()) {
            (None, "```sh") => current = Some(String::new()),
            (Some(_), "```") => blocks.extend(current.take()),
            (Some(body), _) => {
                body.push_str(line);
                body.push('\n');
            }
            (None, _) => {}
        }
    }
    blocks
}

/// The walk-through's blocks and the clean-up block that follows them.
fn readme_walk_through(readme: &str) -> (Vec<String>, String) {
    let begin = readme
        .find(BEGIN)
        .expect("the README has lost its first-deposit:begin marker");
    let end = readme[begin..]
        .find(END)
        .map(|i| begin + i)
        .expect("the README has lost its first-deposit:end marker");
    let walk = sh_blocks(&readme[begin..end]);
    let after = sh_blocks(&readme[end..]);
    let cleanup = after
        .into_iter()
        .next()
        .expect("the README's walk-through has no clean-up block after it");
    (walk, cleanup)
}

#[test]
fn the_readme_walk_through_runs_as_written() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("README.md")).expect("read README.md");
    let (walk, cleanup) = readme_walk_through(&readme);
    assert!(
        walk.len() >= 2,
        "the walk-through has {} blocks",
        walk.len()
    );
    let walk = walk.concat();
    // The rule a newcomer could not find: without it the submission is 422.
    assert!(
        walk.contains("--allow-network"),
        "the walk-through must show the allow rule its loopback file server needs"
    );
    assert!(
        cleanup.contains("tools/zk stop"),
        "the clean-up block stops ZooKeeper"
    );

    // What the walk-through must have produced, checked before the README's
    // own clean-up removes it; the trap stops whatever a failure left.
    let script = format!(
        r#"set -euo pipefail
stop_all() {{
  kill $(jobs -p) 2>/dev/null || true
  if [ -n "${{work:-}}" ] && [ -d "$work" ]; then
    tools/zk stop --dir "$work/zk" >/dev/null 2>&1 || true
    rm -rf "$work"
  fi
}}
trap stop_all EXIT
{walk}
echo "== checks"
find "$work/ocfl" -path '*/v1/inventory.json' | grep -q .
ls "$work/outbox"/*.eml > /dev/null
ingest show batch bid0000000001 --format json | grep '"status": "Completed"'
echo "== clean-up"
{cleanup}
[ ! -e "$work" ]
echo "== walked"
"#
    );
    let bin_dir = ingest_bin().parent().unwrap().to_path_buf();
    let path = std::env::join_paths(std::iter::once(bin_dir).chain(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    )))
    .unwrap();
    let mut cmd = Command::new("bash");
    cmd.arg("-c")
        .arg(&script)
        .current_dir(root)
        .env("PATH", path)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // The walk-through must start from nothing of this shell's: an engine
    // URL or data directory set here would be used instead of its own.
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("INGEST_") {
            cmd.env_remove(key);
        }
    }
    // Its own process group, so a hung walk-through is stopped whole:
    // bash and everything it left running in the background.
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let mut child = cmd.spawn().expect("run bash");
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    // A bound against a hang (a README loop that never ends), not a
    // performance assertion: the walk takes seconds.
    let deadline = Instant::now() + Duration::from_secs(600);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for bash") {
            break Some(status);
        }
        if Instant::now() > deadline {
            let _ = Command::new("kill")
                .args(["-KILL", "--", &format!("-{}", child.id())])
                .status();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let (stdout, stderr) = (out.join().unwrap(), err.join().unwrap());
    let ok = status.is_some_and(|s| s.success());
    assert!(
        ok,
        "the README's first deposit failed ({status:?})\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
    );
    assert!(stdout.contains("producer/hello.txt"), "{stdout}");
    assert!(stdout.contains("ark:/"), "{stdout}");
    assert!(stdout.trim_end().ends_with("== walked"), "{stdout}");
}

#[test]
fn sh_blocks_reads_fenced_shell_only() {
    let text = "a\n```sh\necho 1\n```\n```yaml\nx: 1\n```\n```sh\necho 2\necho 3\n```\n";
    assert_eq!(sh_blocks(text), vec!["echo 1\n", "echo 2\necho 3\n"]);
}
