//! The access (assembly) queue end to end (issue 12): `ingest serve` with
//! the in-process access daemons against a real ZooKeeper; requests through
//! the API and the CLI (`--engine`), the projection in mrt-zk's layout, the
//! per-queue pause, the simulated failure, requeue and delete, and the
//! fence on `/access/<queue>/QID/lock`.

use std::process::Command;

use ingest_protocol::fence::FenceSecret;
use reqwest::Method;
use serde_json::{json, Value};
use zookeeper_client as zk;

use crate::server::{eventually, seed_objects, start, Server, ADMIN, DEPOSITOR};
use crate::util::ingest_bin;
use crate::zk_server::{shared, unique_root};

async fn request(server: &Server, body: Value) -> String {
    let (code, answer) = server
        .call(Method::POST, "/access", DEPOSITOR, Some(body))
        .await;
    assert_eq!(code, 201, "{answer}");
    answer["request"]["qid"].as_str().expect("qid").to_string()
}

async fn status_of(server: &Server, qid: &str) -> Value {
    server.get(&format!("/access/{qid}")).await
}

async fn admin(server: &Server, method: Method, path: &str) -> Value {
    let (code, body) = server
        .call(method, path, ADMIN, Some(json!({"reason": "test"})))
        .await;
    assert_eq!(code, 200, "{path}: {body}");
    body
}

async fn node_status(client: &zk::Client, path: &str) -> Option<String> {
    let (data, _) = client.get_data(&format!("{path}/status")).await.ok()?;
    let v: Value = serde_json::from_slice(&data).ok()?;
    v["status"].as_str().map(str::to_string)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_access_daemons_assemble_fail_when_asked_and_honour_each_pause() {
    let zk_server = shared();
    let hosts = zk_server.hosts();
    let root = unique_root("access");
    let dir = tempfile::tempdir().expect("tempdir");
    seed_objects(
        dir.path(),
        &[
            ("ark:/99999/fk4s", 1, &[17_000, 79]),
            ("ark:/99999/fk4l", 1, &[1]),
            ("ark:/99999/fk4l", 2, &[400_000_000, 200_000_000]),
            ("ark:/99999/fk4f", 1, &[10]),
        ],
    );
    let server = start(
        dir.path(),
        &hosts,
        &root,
        Some(&["access_small=1", "access_large=1"]),
    );
    let client = zk::Client::connect(&format!("{hosts}{root}"))
        .await
        .expect("zookeeper");

    // The large queue is paused before anything is requested.
    admin(&server, Method::POST, "/access-queues/large/pause").await;
    // Each queue is chosen by the version's size in the inventory.
    let small = request(&server, json!({"ark": "ark:/99999/fk4s"})).await;
    let large = request(
        &server,
        json!({"ark": "ark:/99999/fk4l", "format": "tar", "version": 2}),
    )
    .await;
    let failing = request(
        &server,
        json!({"ark": "ark:/99999/fk4f", "token": "simulate-failure-1"}),
    )
    .await;

    eventually("the small request assembled", 60, async || {
        (status_of(&server, &small).await["status"] == "Completed").then_some(())
    })
    .await;
    let failed = eventually("the failing request failed", 60, async || {
        let v = status_of(&server, &failing).await;
        (v["status"] == "Failed").then_some(v)
    })
    .await;
    assert!(
        failed["message"]
            .as_str()
            .is_some_and(|m| m.contains("simulated")),
        "{failed}"
    );
    // Both small requests are done; the large one waits on its paused queue.
    let waiting = status_of(&server, &large).await;
    assert_eq!(waiting["status"], "Pending", "{waiting}");
    assert_eq!(waiting["queue"], "large", "{waiting}");
    assert!(client
        .check_stat("/locks/queue/accessLarge")
        .await
        .expect("stat")
        .is_some());
    let large_path = format!("/access/large/{large}");
    let token: Value = serde_json::from_slice(
        &client
            .get_data(&format!("{large_path}/token"))
            .await
            .expect("token node")
            .0,
    )
    .expect("token JSON");
    assert_eq!(token["cloud-content-byte"], 600_000_000u64, "{token}");
    assert_eq!(token["format"], "tar", "{token}");

    // Resumed, the large queue is taken too.
    admin(&server, Method::POST, "/access-queues/large/resume").await;
    eventually("the large request assembled", 60, async || {
        (node_status(&client, &large_path).await.as_deref() == Some("Completed")).then_some(())
    })
    .await;

    // Requeued, the failing request is taken again (and fails again).
    admin(&server, Method::POST, &format!("/access/{failing}/requeue")).await;
    let again = eventually("the requeued request failed again", 60, async || {
        let v = status_of(&server, &failing).await;
        (v["status"] == "Failed" && v["retry_count"] == 1).then_some(v)
    })
    .await;
    assert_eq!(again["queue"], "small", "{again}");
    admin(&server, Method::DELETE, &format!("/access/{failing}")).await;
    let small_path = format!("/access/small/{failing}");
    eventually("the deleted request in ZooKeeper", 30, async || {
        (node_status(&client, &small_path).await.as_deref() == Some("Deleted")).then_some(())
    })
    .await;

    // The CLI through the server shows the same list.
    let out = tokio::task::block_in_place(|| {
        Command::new(ingest_bin())
            .args([
                "--engine",
                &server.base,
                "access",
                "list",
                "--format",
                "json",
            ])
            .env("INGEST_ADMIN_TOKEN", ADMIN)
            .output()
            .expect("run ingest")
    });
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let list: Value = serde_json::from_slice(&out.stdout).expect("the list as JSON");
    let states: Vec<(String, String)> = list["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|i| {
            (
                i["qid"].as_str().unwrap_or_default().to_string(),
                i["status"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    assert_eq!(
        states,
        [
            (small.clone(), "Completed".to_string()),
            (failing.clone(), "Deleted".to_string()),
            (large.clone(), "Completed".to_string()),
        ]
    );
    // A bad request is refused naming the field, and appends nothing.
    let (code, body) = server
        .call(
            Method::POST,
            "/access",
            DEPOSITOR,
            Some(json!({"ark": "not an ark"})),
        )
        .await;
    assert_eq!(code, 422, "{body}");
    assert_eq!(body["error"]["field"], "ark", "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_access_report_without_the_lock_is_refused() {
    let zk_server = shared();
    let hosts = zk_server.hosts();
    let root = unique_root("access-fence");
    let dir = tempfile::tempdir().expect("tempdir");
    seed_objects(dir.path(), &[("ark:/99999/fk4x", 1, &[1])]);
    // No daemons: the test plays the worker.
    let server = start(dir.path(), &hosts, &root, None);
    let qid = request(&server, json!({"ark": "ark:/99999/fk4x"})).await;
    let (code, body) = server
        .call_fenced(
            &format!("/access/{qid}/start"),
            &FenceSecret::from_bytes([9; 32]),
            json!({"worker": "w1", "session_id": 1}),
        )
        .await;
    assert_eq!(code, 409, "{body}");
    assert_eq!(body["error"]["code"], "lock_not_held", "{body}");
    assert_eq!(status_of(&server, &qid).await["status"], "Pending");
}

/// Runs `ingest ARGS` (blocking, off the runtime's worker).
fn ingest(args: &[&str]) -> std::process::Output {
    tokio::task::block_in_place(|| {
        Command::new(ingest_bin())
            .args(args)
            .env("INGEST_ADMIN_TOKEN", ADMIN)
            .env_remove("INGEST_DATA_DIR")
            .env_remove("INGEST_CONFIG")
            .output()
            .expect("run ingest")
    })
}

/// The `access-without-lock` findings of a JSON consistency report.
fn stuck_in(out: &std::process::Output) -> Vec<String> {
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "the report as JSON: {e}; stderr {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    report["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .filter(|f| f["rule"] == "access-without-lock")
        .map(|f| f["subject"].as_str().unwrap_or_default().to_string())
        .collect()
}

/// Issue 24: `ingest serve` killed while a request is Processing (its
/// in-process daemon holding the lock) left it there for good: no daemon
/// took a Processing request and `ingest check` said PASS. Now, with serve
/// down, `ingest check` names it once its lock is gone for longer than the
/// bound, and the restarted serve's daemon takes it again and completes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_access_request_left_processing_by_a_killed_serve_completes_after_restart() {
    let zk_server = shared();
    let hosts = zk_server.hosts();
    let root = unique_root("access-killed");
    let dir = tempfile::tempdir().expect("tempdir");
    seed_objects(dir.path(), &[("ark:/99999/fk4k", 1, &[10])]);
    // The simulated assembly takes a minute, so the request is caught
    // Processing under its lock; the restart below assembles at once.
    let slow = ["--step-ms".to_string(), "60000".to_string()];
    let server = crate::server::start_with(
        dir.path(),
        &hosts,
        &root,
        Some(&["access_small=1"]),
        "simulate",
        &slow,
    );
    let client = zk::Client::connect(&format!("{hosts}{root}"))
        .await
        .expect("zookeeper");
    let qid = request(&server, json!({"ark": "ark:/99999/fk4k"})).await;
    let path = format!("/access/small/{qid}");
    let lock = format!("{path}/lock");
    eventually("the request Processing under its lock", 60, async || {
        let locked = client.check_stat(&lock).await.ok().flatten().is_some();
        (locked && node_status(&client, &path).await.as_deref() == Some("Processing")).then_some(())
    })
    .await;
    drop(server); // SIGKILL: the daemon dies holding the lock.

    // The lock goes with the killed session; the request stays Processing,
    // and the check (on the data directory, serve being down) names it.
    let data = dir.path().join("data");
    let data = data.to_str().expect("utf-8 path");
    eventually("ingest check names the stuck request", 90, async || {
        let out = ingest(&[
            "--data-dir",
            data,
            "check",
            "--zk",
            &hosts,
            "--zk-root",
            &root,
            "--stuck-after",
            "1",
            "--format",
            "json",
        ]);
        (out.status.code() == Some(1) && stuck_in(&out) == [qid.clone()]).then_some(())
    })
    .await;
    assert_eq!(
        node_status(&client, &path).await.as_deref(),
        Some("Processing")
    );

    // Restarted, serve's daemon takes it again and completes it.
    let server = start(dir.path(), &hosts, &root, Some(&["access_small=1"]));
    eventually("the request completed after the restart", 90, async || {
        (status_of(&server, &qid).await["status"] == "Completed").then_some(())
    })
    .await;
    let out = ingest(&[
        "--engine",
        &server.base,
        "check",
        "--stuck-after",
        "1",
        "--format",
        "json",
    ]);
    assert_eq!(stuck_in(&out), Vec::<String>::new(), "{out:?}");
}

/// Issue 24: an admin may requeue or delete a Processing request whose
/// worker died (its lock gone), and is refused (409 `being_assembled`)
/// while a worker holds its lock. Before, both were refused for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lockless_processing_request_is_requeued_or_deleted_but_not_while_locked() {
    let zk_server = shared();
    let hosts = zk_server.hosts();
    let root = unique_root("access-lockless");
    let dir = tempfile::tempdir().expect("tempdir");
    seed_objects(
        dir.path(),
        &[("ark:/99999/fk4d0", 1, &[1]), ("ark:/99999/fk4d1", 1, &[1])],
    );
    // No daemons: the test plays the worker, whose death is its session's
    // close.
    let server = start(dir.path(), &hosts, &root, None);
    let admin_call = async |method: Method, path: &str| {
        server
            .call(
                method,
                path,
                ADMIN,
                Some(json!({"reason": "its worker died"})),
            )
            .await
    };
    for (n, (method, then)) in [(Method::POST, "Pending"), (Method::DELETE, "Deleted")]
        .into_iter()
        .enumerate()
    {
        let qid = request(&server, json!({"ark": format!("ark:/99999/fk4d{n}")})).await;
        let lock = format!("/access/small/{qid}/lock");
        let worker = zk::Client::connect(&format!("{hosts}{root}"))
            .await
            .expect("zookeeper");
        eventually("the request's node projected", 30, async || {
            worker
                .check_stat(&format!("/access/small/{qid}"))
                .await
                .ok()
                .flatten()
        })
        .await;
        let secret = FenceSecret::from_bytes([n as u8 + 1; 32]);
        worker
            .create(
                &lock,
                &ingest_protocol::fence::LockNode::new("w1", &secret).to_bytes(),
                &zk::CreateMode::Ephemeral.with_acls(zk::Acls::anyone_all()),
            )
            .await
            .expect("the lock");
        let (code, body) = server
            .call_fenced(
                &format!("/access/{qid}/start"),
                &secret,
                json!({"worker": "w1", "session_id": worker.session_id().0}),
            )
            .await;
        assert_eq!(code, 200, "{body}");
        assert_eq!(status_of(&server, &qid).await["status"], "Processing");

        let path = if method == Method::POST {
            format!("/access/{qid}/requeue")
        } else {
            format!("/access/{qid}")
        };
        let (code, body) = admin_call(method.clone(), &path).await;
        assert_eq!(code, 409, "{body}");
        assert_eq!(body["error"]["code"], "being_assembled", "{body}");
        assert_eq!(status_of(&server, &qid).await["status"], "Processing");

        drop(worker); // The worker dies: its session and lock go.
        let probe = zk::Client::connect(&format!("{hosts}{root}"))
            .await
            .expect("zookeeper");
        eventually("the lock gone with its session", 60, async || {
            probe
                .check_stat(&lock)
                .await
                .ok()
                .flatten()
                .is_none()
                .then_some(())
        })
        .await;
        let (code, body) = admin_call(method, &path).await;
        assert_eq!(code, 200, "{body}");
        let now = status_of(&server, &qid).await;
        assert_eq!(now["status"], then, "{now}");
    }
}

/// Issue 24: a request names a stored object. The engine sizes it from the
/// inventory (the version asked for, or the latest, which the request
/// records), refuses an ark or version the inventory does not know (404
/// naming it, cut), and takes a size only as an admin's override. Before,
/// any ark was queued with whatever size the caller typed, and "assembled".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_access_request_is_sized_from_the_inventory_and_an_unknown_ark_refused() {
    let zk_server = shared();
    let hosts = zk_server.hosts();
    let root = unique_root("access-sized");
    let dir = tempfile::tempdir().expect("tempdir");
    seed_objects(
        dir.path(),
        &[
            ("ark:/99999/fk4v", 1, &[100, 20]),
            ("ark:/99999/fk4v", 2, &[300_000_000, 300_000_000, 5]),
        ],
    );
    let server = start(dir.path(), &hosts, &root, None);

    let latest = request(&server, json!({"ark": "ark:/99999/fk4v"})).await;
    let first = request(&server, json!({"ark": "ark:/99999/fk4v", "version": 1})).await;
    let view = status_of(&server, &latest).await;
    assert_eq!(
        (
            view["queue"].as_str(),
            view["version"].as_u64(),
            view["size"].as_u64()
        ),
        (Some("large"), Some(2), Some(600_000_005)),
        "{view}"
    );
    let view = status_of(&server, &first).await;
    assert_eq!(
        (
            view["queue"].as_str(),
            view["version"].as_u64(),
            view["size"].as_u64()
        ),
        (Some("small"), Some(1), Some(120)),
        "{view}"
    );

    let refused = async |token: &str, body: Value| {
        let (code, answer) = server
            .call(Method::POST, "/access", token, Some(body))
            .await;
        (code, answer)
    };
    let (code, body) = refused(DEPOSITOR, json!({"ark": "ark:/99999/fk4nope"})).await;
    assert_eq!(code, 404, "{body}");
    assert_eq!(body["error"]["id"], "ark:/99999/fk4nope", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("ark:/99999/fk4nope")),
        "{body}"
    );
    let (code, body) = refused(DEPOSITOR, json!({"ark": "ark:/99999/fk4v", "version": 3})).await;
    assert_eq!(code, 404, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("no version 3") && m.contains("latest is 2")),
        "{body}"
    );
    // A long unknown ark is named, cut.
    let long = format!("ark:/99999/{}", "x".repeat(1000));
    let (code, body) = refused(DEPOSITOR, json!({"ark": long})).await;
    assert_eq!(code, 404, "{body}");
    assert!(body.to_string().len() < 1000, "{body}");
    // The size is an admin's override only.
    let (code, body) = refused(DEPOSITOR, json!({"ark": "ark:/99999/fk4v", "size": 1})).await;
    assert_eq!(code, 422, "{body}");
    assert_eq!(body["error"]["field"], "size", "{body}");
    let (code, body) = refused(
        ADMIN,
        json!({"ark": "ark:/99999/fk4v", "version": 1, "size": 700_000_000u64}),
    )
    .await;
    assert_eq!(code, 201, "{body}");
    assert_eq!(body["request"]["queue"], "large", "{body}");
    // Nothing was queued by a refusal.
    let list = server.get("/access").await;
    assert_eq!(list["items"].as_array().map(Vec::len), Some(3), "{list}");

    // The CLI through the server says the same.
    let out = ingest(&[
        "--engine",
        &server.base,
        "access",
        "request",
        "--ark",
        "ark:/99999/fk4nope",
    ]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("ark:/99999/fk4nope"),
        "{out:?}"
    );
}
