//! Shared helpers: running the `ingest` binary against a temporary data directory.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A temporary data directory and a way to run `ingest` against it.
pub struct Ingest {
    /// Keeps the directory alive.
    pub dir: tempfile::TempDir,
}

/// What a run printed and how it ended.
#[derive(Debug)]
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    /// What a finished process printed.
    pub fn from_output(out: Output) -> Run {
        Run::from(out)
    }

    fn from(out: Output) -> Run {
        Run {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// Panics with the whole output unless the run succeeded.
    #[track_caller]
    pub fn ok(self) -> Run {
        assert_eq!(
            self.code, 0,
            "expected success\nstdout:\n{}\nstderr:\n{}",
            self.stdout, self.stderr
        );
        self
    }

    /// Panics with the whole output unless the run failed.
    #[track_caller]
    pub fn failed(self) -> Run {
        assert_ne!(
            self.code, 0,
            "expected failure\nstdout:\n{}\nstderr:\n{}",
            self.stdout, self.stderr
        );
        self
    }
}

/// The path of the `ingest` binary under test.
pub fn ingest_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_ingest"))
}

impl Ingest {
    pub fn new() -> Ingest {
        Ingest {
            dir: tempfile::tempdir().expect("tempdir"),
        }
    }

    pub fn data_dir(&self) -> &Path {
        self.dir.path()
    }

    /// Runs `ingest ARGS` with this data directory.
    pub fn run(&self, args: &[&str]) -> Run {
        let out = Command::new(ingest_bin())
            .arg("--data-dir")
            .arg(self.data_dir())
            .args(args)
            .env("INGEST_ACTOR", "admin:tester")
            .env_remove("INGEST_DATA_DIR")
            .env_remove("INGEST_STATES")
            .output()
            .expect("run ingest");
        Run::from(out)
    }

    /// The log's head position, read through `ingest status`.
    pub fn head(&self) -> u64 {
        let out = self.run(&["status", "--format", "json"]).ok();
        let v: serde_json::Value = serde_json::from_str(&out.stdout).expect("status json");
        v["head_position"].as_u64().expect("head_position")
    }

    /// A job's status through `ingest show job`.
    pub fn job_status(&self, jid: &str) -> String {
        self.show("job", jid)["status"]
            .as_str()
            .expect("status")
            .to_string()
    }

    /// A batch's status through `ingest show batch`.
    pub fn batch_status(&self, bid: &str) -> String {
        self.show("batch", bid)["status"]
            .as_str()
            .expect("status")
            .to_string()
    }

    /// `ingest show KIND ID --format json`, parsed.
    pub fn show(&self, kind: &str, id: &str) -> serde_json::Value {
        let out = self.run(&["show", kind, id, "--format", "json"]).ok();
        serde_json::from_str(&out.stdout).expect("show json")
    }
}

/// Whether this run is CI's (`CI` set, and not to `false`, as `tools/test`
/// reads it).
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false")
}

/// A test cannot run because an outside tool is missing (`why`): in CI
/// that FAILS the test (panics), so no check passes by skipping; locally it
/// says so on stderr and the caller returns.
pub fn untested(why: &str) {
    assert!(
        !in_ci(),
        "an outside tool this test needs is missing, and CI is set: {why}"
    );
    eprintln!("SKIPPED (fails in CI): {why}");
}

/// A Python that can import `module`, in a virtual environment `name` kept
/// under the test target's temporary directory (made once, `pip install
/// SPEC` into it); `None` when pip cannot reach the package index: the
/// test then fails in CI ([`untested`]) and is skipped locally, saying so.
///
/// Tests run in parallel processes, so the environment is built under a
/// name of this process's own and renamed into place whole: a test never
/// sees another's half-made environment (on a fresh machine one test's
/// `pip` vanished while another made the same directory again).
pub fn venv_python(name: &str, spec: &str, module: &str) -> Option<PathBuf> {
    let venv = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let python = venv.join("bin/python");
    let importable = |py: &Path| {
        Command::new(py)
            .args(["-c", &format!("import {module}")])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if importable(&python) {
        return Some(python);
    }
    let building = venv.with_file_name(format!(
        ".{name}.building-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos())
    ));
    let made = Command::new("python3")
        .args(["-m", "venv"])
        .arg(&building)
        .output()
        .unwrap_or_else(|e| panic!("python3 -m venv: {e} (python3 is needed for this test)"));
    assert!(
        made.status.success(),
        "python3 -m venv {}: {}",
        building.display(),
        String::from_utf8_lossy(&made.stderr)
    );
    // `python -m pip`, not `bin/pip`: the script's first line names the
    // directory it was made in, which is renamed below.
    let pip = Command::new(building.join("bin/python"))
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            spec,
        ])
        .output()
        .expect("run pip");
    if !pip.status.success() {
        let _ = std::fs::remove_dir_all(&building);
        untested(&format!(
            "pip could not install {spec} (is the package index reachable?): {}",
            String::from_utf8_lossy(&pip.stderr)
        ));
        return None;
    }
    if std::fs::rename(&building, &venv).is_err() {
        // Another test's environment got there first; or a broken one is
        // in the way, which goes.
        if !importable(&python) {
            let _ = std::fs::remove_dir_all(&venv);
            let _ = std::fs::rename(&building, &venv);
        }
        let _ = std::fs::remove_dir_all(&building);
    }
    assert!(
        importable(&python),
        "{spec} installed but {module} not importable from {}",
        python.display()
    );
    Some(python)
}

/// Runs `ingest ARGS` through the server at `engine` (`INGEST_ENGINE`) with
/// `env` set, no data directory and nothing inherited that would point it
/// elsewhere.
pub fn ingest_remote(engine: &str, env: &[(&str, &str)], args: &[&str]) -> Run {
    let mut cmd = Command::new(ingest_bin());
    cmd.args(args)
        .env("INGEST_ENGINE", engine)
        .env_remove("INGEST_ADMIN_TOKEN")
        .env_remove("INGEST_ADMIN_TOKEN_FILE")
        .env_remove("INGEST_DEPOSITOR_TOKEN")
        .env_remove("INGEST_DEPOSITOR_TOKEN_FILE")
        .env_remove("INGEST_DATA_DIR")
        .env_remove("INGEST_CONFIG");
    for (k, v) in env {
        cmd.env(k, v);
    }
    Run::from(cmd.output().expect("run ingest"))
}
