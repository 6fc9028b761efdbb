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

use crate::server::{eventually, start, Server, ADMIN, DEPOSITOR};
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
    let small = request(&server, json!({"ark": "ark:/99999/fk4s", "size": 17079})).await;
    let large = request(
        &server,
        json!({"ark": "ark:/99999/fk4l", "size": 600_000_000u64, "format": "tar", "version": 2}),
    )
    .await;
    let failing = request(
        &server,
        json!({"ark": "ark:/99999/fk4f", "size": 10, "token": "simulate-failure-1"}),
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
            Some(json!({"ark": "not an ark", "size": 1})),
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
    // No daemons: the test plays the worker.
    let server = start(dir.path(), &hosts, &root, None);
    let qid = request(&server, json!({"ark": "ark:/99999/fk4x", "size": 1})).await;
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
