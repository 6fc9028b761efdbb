//! The CLI against a running `ingest serve` (`--engine URL`), and the
//! admin's fault injection over the API.

use std::path::Path;
use std::process::Command;

use reqwest::Method;
use serde_json::{json, Value};

use crate::server::{eventually, start, Server, ADMIN, DEPOSITOR};
use crate::util::{ingest_bin, Run};
use crate::zk_server::{shared, unique_root};

/// Runs `ingest ARGS` with `env` set (and nothing inherited that would
/// point it elsewhere): on the data directory `data`, or through the
/// server when `env` names one (`INGEST_ENGINE`; both at once are refused).
fn ingest(data: &Path, env: &[(&str, &str)], args: &[&str]) -> Run {
    let mut cmd = Command::new(ingest_bin());
    if !env.iter().any(|(k, _)| *k == "INGEST_ENGINE") {
        cmd.arg("--data-dir").arg(data);
    }
    cmd.args(args)
        .env("INGEST_ACTOR", "admin:tester")
        .env_remove("INGEST_ENGINE")
        .env_remove("INGEST_ADMIN_TOKEN")
        .env_remove("INGEST_ADMIN_TOKEN_FILE")
        .env_remove("INGEST_DEPOSITOR_TOKEN")
        .env_remove("INGEST_DEPOSITOR_TOKEN_FILE")
        .env_remove("INGEST_DATA_DIR");
    for (k, v) in env {
        cmd.env(k, v);
    }
    Run::from_output(cmd.output().expect("run ingest"))
}

async fn head(server: &Server) -> u64 {
    server.get("/status").await["head_position"]
        .as_u64()
        .expect("head_position")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_works_through_a_running_server_and_says_how_to_reach_it() {
    let zk_server = shared();
    let hosts = zk_server.hosts();
    let root = unique_root("remote");
    let dir = tempfile::tempdir().expect("tempdir");
    let server = start(dir.path(), &hosts, &root, None);
    let data = dir.path().join("data");
    let engine = server.base.clone();
    let admin = [
        ("INGEST_ENGINE", engine.as_str()),
        ("INGEST_ADMIN_TOKEN", ADMIN),
    ];

    // Without --engine the data directory is locked; the error says where the server is.
    let locked = tokio::task::block_in_place(|| ingest(&data, &[], &["status"])).failed();
    assert!(
        locked.stderr.contains(&format!("--engine {engine}")),
        "{}",
        locked.stderr
    );
    assert!(
        locked.stderr.contains("in use by another process"),
        "{}",
        locked.stderr
    );

    // A depositor token submits; the admin token acts.
    let submitted = tokio::task::block_in_place(|| {
        ingest(
            &data,
            &[
                ("INGEST_ENGINE", &engine),
                ("INGEST_DEPOSITOR_TOKEN", DEPOSITOR),
            ],
            &[
                "submit",
                "--profile",
                "demo",
                "--submitter",
                "alice",
                "--type",
                "file",
                "--payload-url",
                "https://example.org/a.txt",
            ],
        )
    })
    .ok();
    let bid = submitted
        .stdout
        .split_whitespace()
        .find(|w| w.starts_with("bid"))
        .expect("a bid in the output")
        .to_string();
    assert_eq!(
        server.get(&format!("/batches/{bid}")).await["status"],
        "Pending"
    );

    let held = tokio::task::block_in_place(|| {
        ingest(
            &data,
            &admin,
            &[
                "collection",
                "demo",
                "hold",
                "--reason",
                "storage migration",
            ],
        )
    })
    .ok();
    assert!(held.stdout.contains("CollectionHeld"), "{}", held.stdout);
    let history = tokio::task::block_in_place(|| {
        ingest(
            &data,
            &admin,
            &["history", "--batch", &bid, "--format", "json"],
        )
    })
    .ok();
    let rows: Value = serde_json::from_str(&history.stdout).expect("history json");
    assert_eq!(rows[0]["event"], "BatchSubmitted", "{rows}");
    let shown = tokio::task::block_in_place(|| {
        ingest(&data, &admin, &["show", "batch", &bid, "--format", "json"])
    })
    .ok();
    let shown: Value = serde_json::from_str(&shown.stdout).expect("show json");
    assert_eq!(shown["bid"], bid.as_str());

    let status =
        tokio::task::block_in_place(|| ingest(&data, &admin, &["status", "--format", "json"])).ok();
    let status: Value = serde_json::from_str(&status.stdout).expect("status json");
    assert_eq!(status["held_collections"], json!(["demo"]), "{status}");

    let verified = tokio::task::block_in_place(|| ingest(&data, &admin, &["verify"])).ok();
    assert!(
        verified
            .stdout
            .contains("ok: the hash chain and the stream index verify"),
        "{}",
        verified.stdout
    );
    let tree = tokio::task::block_in_place(|| {
        ingest(
            &data,
            &admin,
            &["tree", "--path", &format!("/batches/{bid}")],
        )
    })
    .ok();
    assert!(
        tree.stdout.contains(&format!("/batches/{bid}/status")),
        "{}",
        tree.stdout
    );

    // The projector catches up; then the live tree matches the log.
    eventually("no drift", 30, async || {
        let run = tokio::task::block_in_place(|| ingest(&data, &admin, &["diff"]));
        (run.code == 0 && run.stdout.contains("no differences")).then_some(())
    })
    .await;

    // Refusals append nothing: a wrong token, a worker's report, an illegal move.
    let before = head(&server).await;
    let wrong = tokio::task::block_in_place(|| {
        ingest(
            &data,
            &[
                ("INGEST_ENGINE", &engine),
                ("INGEST_ADMIN_TOKEN", "not-the-admin-token-at-all"),
            ],
            &["queue", "pause", "--reason", "x"],
        )
    })
    .failed();
    assert!(
        wrong.stderr.contains("refused the token"),
        "{}",
        wrong.stderr
    );
    let worker_move =
        tokio::task::block_in_place(|| ingest(&data, &admin, &["batch", &bid, "acquire"])).failed();
    assert!(
        worker_move.stderr.contains("worker's report"),
        "{}",
        worker_move.stderr
    );
    let illegal = tokio::task::block_in_place(|| {
        ingest(
            &data,
            &admin,
            &["batch", &bid, "update-reporting", "--reason", "why not"],
        )
    })
    .failed();
    assert!(illegal.stderr.contains("refused:"), "{}", illegal.stderr);
    let repair = tokio::task::block_in_place(|| ingest(&data, &admin, &["repair"])).failed();
    assert!(
        repair.stderr.contains("stop the server"),
        "{}",
        repair.stderr
    );
    assert_eq!(head(&server).await, before, "a refusal appended events");

    // The address file the hint came from.
    assert!(data.join("serve.json").exists());
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_armed_fault_fails_the_next_job_of_a_step_and_requeue_resumes_there() {
    let zk_server = shared();
    let hosts = zk_server.hosts();
    let root = unique_root("faults");
    let dir = tempfile::tempdir().expect("tempdir");
    // The queue is paused until the fault is armed, so no job passes Storing first.
    let server = start(dir.path(), &hosts, &root, Some(&[]));
    let (status, body) = server
        .call(
            Method::POST,
            "/queue/pause",
            ADMIN,
            Some(json!({"reason": "arm a fault first"})),
        )
        .await;
    assert_eq!(status, 200, "{body}");

    // Bad fault requests are refused with the field named.
    for (bad, field) in [
        (json!({"state": "Pending", "reason": "x"}), "state"),
        (json!({"state": "Nowhere", "reason": "x"}), "state"),
        (
            json!({"state": "Storing", "count": 0, "reason": "x"}),
            "count",
        ),
        (json!({"state": "Storing", "reason": ""}), "reason"),
    ] {
        let (status, body) = server.call(Method::POST, "/faults", ADMIN, Some(bad)).await;
        assert_eq!(status, 422, "{body}");
        assert_eq!(body["error"]["field"], field, "{body}");
    }
    let (status, body) = server
        .call(
            Method::POST,
            "/faults",
            DEPOSITOR,
            Some(json!({"state": "Storing", "reason": "x"})),
        )
        .await;
    assert_eq!(status, 401, "{body}");

    let (status, body) = server
        .call(
            Method::POST,
            "/faults",
            ADMIN,
            Some(json!({"state": "storing", "actor": "carol", "reason": "disk test"})),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["armed"], json!({"Storing": 1}));

    // Armed faults are events: a restart keeps them armed.
    let mut server = server;
    server.terminate(30).await;
    let server = start(dir.path(), &hosts, &root, Some(&[]));
    assert_eq!(server.get("/faults").await["armed"], json!({"Storing": 1}));

    let bid = server.submit(2).await;
    server
        .call(
            Method::POST,
            "/queue/resume",
            ADMIN,
            Some(json!({"reason": "go"})),
        )
        .await;
    let jobs = eventually("both jobs finished", 60, async || {
        let b = server.get(&format!("/batches/{bid}")).await;
        let jobs = b["jobs"].as_array()?.clone();
        let done = jobs.len() == 2
            && jobs
                .iter()
                .all(|j| j["status"] == "Completed" || j["status"] == "Failed");
        done.then_some(jobs)
    })
    .await;
    let failed: Vec<&Value> = jobs.iter().filter(|j| j["status"] == "Failed").collect();
    assert_eq!(failed.len(), 1, "exactly one job takes the fault: {jobs:?}");
    let jid = failed[0]["jid"].as_str().expect("jid").to_string();
    let job = server.get(&format!("/jobs/{jid}")).await;
    assert_eq!(job["last_successful_status"], "Processing", "{job}");
    assert!(
        job["message"]
            .as_str()
            .is_some_and(|m| m.contains("fault injected into Storing by admin:admin: disk test")),
        "{job}"
    );
    assert_eq!(server.get("/faults").await["armed"], json!({}));

    // A requeue waits for the batch's report (a requeue during Reporting is
    // refused), then resumes at Storing, and the job completes.
    eventually("the batch reported", 60, async || {
        let b = server.get(&format!("/batches/{bid}")).await;
        (b["status"] != "Reporting").then_some(())
    })
    .await;
    let (status, body) = server
        .call(
            Method::POST,
            &format!("/jobs/{jid}/requeue"),
            ADMIN,
            Some(json!({"reason": "fault cleared"})),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    eventually("the requeued job completed", 60, async || {
        let j = server.get(&format!("/jobs/{jid}")).await;
        (j["status"] == "Completed").then_some(())
    })
    .await;
    let job = server.get(&format!("/jobs/{jid}")).await;
    assert_eq!(job["retry_count"], 1, "{job}");
    let history = server.get(&format!("/jobs/{jid}/history")).await;
    let moves: Vec<&str> = history["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter(|r| r["event"] == "JobStatusChanged")
        .filter_map(|r| r["detail"].as_str())
        .collect();
    assert!(
        moves.iter().any(|d| d.starts_with("Storing -> Failed")),
        "{moves:?}"
    );
    assert!(
        moves.iter().any(|d| d.starts_with("Failed -> Storing")),
        "{moves:?}"
    );
    assert_eq!(
        moves
            .iter()
            .filter(|d| d.starts_with("Processing -> "))
            .count(),
        1,
        "the requeue must not redo Processing: {moves:?}"
    );

    // The batch stays Failed, its depositor's report saying so: an update
    // report is offered, in the batch's data and by `show batch` (issue 26).
    let batch = server.get(&format!("/batches/{bid}")).await;
    assert_eq!(batch["status"], "Failed", "{batch}");
    assert_eq!(batch["update_report_due"], true, "{batch}");
    let engine = server.base.clone();
    let shown = tokio::task::block_in_place(|| {
        crate::util::ingest_remote(
            &engine,
            &[("INGEST_ADMIN_TOKEN", ADMIN)],
            &["show", "batch", &bid],
        )
    })
    .ok();
    assert!(
        shown
            .stderr
            .contains(&format!("ingest batch {bid} update-reporting")),
        "{}",
        shown.stderr
    );
    let (status, body) = server
        .call(
            Method::POST,
            &format!("/batches/{bid}/update-reporting"),
            ADMIN,
            Some(json!({"reason": "the job completed"})),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let batch = eventually("the update report", 60, async || {
        let b = server.get(&format!("/batches/{bid}")).await;
        (b["status"] == "Completed").then_some(b)
    })
    .await;
    assert_eq!(batch["update_report_due"], false, "{batch}");
}

/// `status`, `show batch`, `show job`, `history`, `batches` and `jobs`
/// print the same shape on the data directory and through a server (before
/// the backend trait, `show batch` and `status` printed different fields
/// each way), and `--format table` prints the same table both ways.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_and_remote_commands_print_the_same_shape() {
    let zk_server = shared();
    let dir = tempfile::tempdir().expect("tempdir");
    // Every daemon runs simulated steps, so the batch has jobs, history and
    // timings to compare.
    let server = start(
        dir.path(),
        &zk_server.hosts(),
        &unique_root("shape"),
        Some(&[]),
    );
    let data = dir.path().join("data");
    let bid = server.submit(3).await;
    let batch = eventually("the batch completes", 60, async || {
        let b = server.get(&format!("/batches/{bid}")).await;
        (b["status"] == "Completed").then_some(b)
    })
    .await;
    let jid = batch["jobs"][0]["jid"]
        .as_str()
        .map(str::to_string)
        .unwrap_or_else(|| panic!("no job in {batch}"));
    let commands: Vec<Vec<String>> = vec![
        vec!["status".into()],
        vec!["show".into(), "batch".into(), bid.clone()],
        vec!["show".into(), "job".into(), jid.clone()],
        vec!["history".into(), "--batch".into(), bid.clone()],
        vec!["history".into(), "--job".into(), jid.clone()],
        vec!["batches".into(), "--collection".into(), "demo".into()],
        vec![
            "jobs".into(),
            "--batch".into(),
            bid.clone(),
            "--limit".into(),
            "2".into(),
        ],
        vec![
            "jobs".into(),
            "--state".into(),
            "completed".into(),
            "--all".into(),
        ],
    ];
    let engine = server.base.clone();
    let env = [
        ("INGEST_ENGINE", engine.as_str()),
        ("INGEST_ADMIN_TOKEN", ADMIN),
    ];
    let remote: Vec<Value> = commands
        .iter()
        .map(|c| {
            let mut args: Vec<&str> = c.iter().map(String::as_str).collect();
            args.extend(["--format", "json"]);
            let out = tokio::task::block_in_place(|| ingest(&data, &env, &args)).ok();
            serde_json::from_str(&out.stdout)
                .unwrap_or_else(|e| panic!("{c:?}: {e}: {}", out.stdout))
        })
        .collect();
    // Tables too (status aside: its fold time differs).
    let table = |env: &[(&str, &str)], c: &[String]| {
        let mut args: Vec<&str> = c.iter().map(String::as_str).collect();
        args.extend(["--format", "table"]);
        tokio::task::block_in_place(|| ingest(&data, env, &args))
            .ok()
            .stdout
    };
    let remote_tables: Vec<String> = commands[1..].iter().map(|c| table(&env, c)).collect();
    // The server lets go of the data directory; the same commands run on it.
    drop(server);
    for (c, remote) in commands.iter().zip(remote) {
        let mut args: Vec<&str> = c.iter().map(String::as_str).collect();
        args.extend(["--format", "json"]);
        let out = tokio::task::block_in_place(|| ingest(&data, &[], &args)).ok();
        let mut local: Value = serde_json::from_str(&out.stdout)
            .unwrap_or_else(|e| panic!("{c:?}: {e}: {}", out.stdout));
        let mut remote = remote;
        // How long the fold took at start-up is the one field that may differ.
        for v in [&mut local, &mut remote] {
            if let Some(o) = v.as_object_mut() {
                o.remove("startup_fold_ms");
            }
        }
        assert_eq!(
            local, remote,
            "{c:?} differs locally and through the server"
        );
    }
    for (c, remote) in commands[1..].iter().zip(remote_tables) {
        let local = table(&[], c);
        assert_eq!(local, remote, "{c:?} tables differ");
        let header = local.lines().next().unwrap_or("");
        assert!(
            !header.is_empty() && !header.contains(':') && !header.contains('{'),
            "{c:?} --format table is not YAML or JSON: {local}"
        );
    }
}

// D15: a listed job's message was cut from its end, in JSON too, which cut
// what it says to do; it is now cut from the middle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listed_messages_keep_their_end() {
    let zk_server = shared();
    let root = unique_root("listed-messages");
    let dir = tempfile::tempdir().expect("tempdir");
    let server = start(dir.path(), &zk_server.hosts(), &root, Some(&[]));
    let admin = |path: &'static str, body: Value| {
        let server = &server;
        async move {
            let (status, reply) = server.call(Method::POST, path, ADMIN, Some(body)).await;
            assert!(status < 300, "{path}: {reply}");
        }
    };
    admin("/queue/pause", json!({"reason": "arm a fault first"})).await;
    let reason = format!("{} then ask the depositor again", "x".repeat(600));
    admin("/faults", json!({"state": "Storing", "reason": reason})).await;
    let bid = server.submit(1).await;
    admin("/queue/resume", json!({"reason": "go"})).await;
    let listed = eventually("the job failed", 60, async || {
        let page = server.get(&format!("/jobs?batch={bid}")).await;
        let job = page["jobs"].get(0)?.clone();
        (job["status"] == "Failed").then_some(job)
    })
    .await;
    let message = listed["message"].as_str().expect("message");
    assert!(
        message.ends_with("then ask the depositor again"),
        "{message}"
    );
    assert!(message.contains("bytes cut]"), "{message}");
    assert!(message.len() < 400, "{message}");
    // The full message is in the job itself.
    let jid = listed["jid"].as_str().expect("jid");
    let full = server.get(&format!("/jobs/{jid}")).await;
    assert!(
        full["message"]
            .as_str()
            .is_some_and(|m| m.contains(&reason)),
        "{full}"
    );
}

// Issue 26 (D18's token reader): the CLI read INGEST_ADMIN_TOKEN before
// INGEST_ADMIN_TOKEN_FILE, the opposite of the server, and without its
// checks; it now reads tokens with the server's own reader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_reads_tokens_as_the_server_does() {
    let zk_server = shared();
    let root = unique_root("cli-tokens");
    let dir = tempfile::tempdir().expect("tempdir");
    let server = start(dir.path(), &zk_server.hosts(), &root, None);
    let file = dir.path().join("admin-token");
    std::fs::write(&file, format!("{ADMIN}\n")).expect("token file");
    let file = file.to_str().expect("utf-8").to_string();
    let engine = server.base.clone();
    tokio::task::block_in_place(|| {
        // The file wins over a stale value, as in `serve`.
        crate::util::ingest_remote(
            &engine,
            &[
                ("INGEST_ADMIN_TOKEN", "stale-token-0123456789"),
                ("INGEST_ADMIN_TOKEN_FILE", &file),
            ],
            &["status"],
        )
        .ok();
        // A token the server could never have is refused before any request.
        let short =
            crate::util::ingest_remote(&engine, &[("INGEST_ADMIN_TOKEN", "short")], &["status"])
                .failed();
        assert!(short.stderr.contains("shorter than"), "{}", short.stderr);
        assert!(!short.stderr.contains("short\""), "{}", short.stderr);
    });
}
