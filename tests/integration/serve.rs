//! `ingest serve` as an operator runs it: one process with the engine, the
//! ZooKeeper projector and the HTTP API, fencing worker reports on real
//! ZooKeeper lock nodes, and stopping cleanly on SIGTERM.

use std::process::Command;

use ingest_protocol::fence::{FenceSecret, LockNode};
use reqwest::Method;
use serde_json::json;
use zookeeper_client as zk;

use crate::server::{eventually, start, ADMIN, DEPOSITOR, WORKER};
use crate::util::ingest_bin;
use crate::zk_server::{shared, unique_root};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_projects_fences_on_real_locks_and_stops_cleanly() {
    let zk_server = shared();
    let hosts = zk_server.hosts();
    let root = unique_root("serve");
    let dir = tempfile::tempdir().expect("tempdir");
    // No in-process daemons: the test itself plays the worker.
    let mut server = start(dir.path(), &hosts, &root, None);

    // A depositor submits; the projector puts the batch into ZooKeeper.
    let submission = json!({"profile": "demo", "submitter": "alice", "type": "file", "payload_url": "https://example.org/a.txt"});
    let (status, body) = server
        .call(Method::POST, "/batches", DEPOSITOR, Some(submission))
        .await;
    assert_eq!(status, 201, "{body}");
    let bid = body["bid"].as_str().expect("bid").to_string();
    let client = zk::Client::connect(&format!("{hosts}{root}"))
        .await
        .expect("zookeeper");
    let status_path = format!("/batches/{bid}/status");
    eventually("the batch in ZooKeeper", 30, async || {
        client.get_data(&status_path).await.ok()
    })
    .await;

    // A report from a session that holds no lock is refused; nothing changes.
    let acquire = format!("/batches/{bid}/acquire");
    let (status, body) = server
        .call(
            Method::POST,
            &acquire,
            WORKER,
            Some(json!({"worker": "w1", "session_id": 12345})),
        )
        .await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"]["code"], "lock_not_held", "{body}");

    // The same report from the session that holds the batch's lock node goes through.
    let lock = format!("/batches/{bid}/lock");
    let ephemeral = zk::CreateMode::Ephemeral.with_acls(zk::Acls::anyone_all());
    let secret = FenceSecret::from_bytes([5; 32]);
    client
        .create(&lock, &LockNode::new("w1", &secret).to_bytes(), &ephemeral)
        .await
        .expect("create the lock");
    let session = client.session_id().0;
    let (status, body) = server
        .call_fenced(
            &acquire,
            &secret,
            json!({"worker": "w1", "session_id": session}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    client.delete(&lock, None).await.expect("release the lock");
    let jobs: Vec<String> = eventually("the job's queue reference", 30, async || {
        let jobs = client.list_children("/jobs/states/pending").await.ok()?;
        (!jobs.is_empty()).then_some(jobs)
    })
    .await;
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    let (data, _) = client.get_data(&status_path).await.expect("batch status");
    let status: serde_json::Value = serde_json::from_slice(&data).expect("status JSON");
    assert_eq!(status["status"], "Processing");

    // An admin pauses the queue: the lock node appears in ZooKeeper.
    let (code, body) = server
        .call(
            Method::POST,
            "/queue/pause",
            ADMIN,
            Some(json!({"reason": "maintenance"})),
        )
        .await;
    assert_eq!(code, 200, "{body}");
    eventually("the pause lock", 30, async || {
        client
            .check_stat("/locks/queue/ingest")
            .await
            .ok()
            .flatten()
    })
    .await;

    // Ready: the writer takes commands and the projector leads, caught up.
    eventually("readiness with a connected projector", 30, async || {
        let (code, body) = server.call(Method::GET, "/readyz", "", None).await;
        (code == 200 && body["projector"] == "connected").then_some(())
    })
    .await;

    // SIGTERM: the server finishes and exits 0; the log verifies afterwards.
    server.terminate(30).await;
    let verify = Command::new(ingest_bin())
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .arg("verify")
        .output()
        .expect("verify");
    assert!(
        verify.status.success(),
        "{}",
        String::from_utf8_lossy(&verify.stdout)
    );
}

/// A new log is not compressed unless `--log-compression` says so (sled's
/// zstd pages cost the server a third of its CPU per event on a virtual
/// machine); a log keeps what it was created with when served again with
/// another setting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_log_is_compressed_only_when_asked_and_keeps_its_setting() {
    let zk_server = shared();
    let hosts = zk_server.hosts();
    let conf = |dir: &std::path::Path| {
        let bytes = std::fs::read(dir.join("data").join("log").join("conf")).expect("sled's conf");
        String::from_utf8_lossy(&bytes).into_owned()
    };
    let plain = tempfile::tempdir().expect("tempdir");
    let s = start(plain.path(), &hosts, &unique_root("log-plain"), None);
    s.submit(1).await;
    drop(s);
    assert!(
        conf(plain.path()).contains("use_compression: false"),
        "{}",
        conf(plain.path())
    );

    let zstd = tempfile::tempdir().expect("tempdir");
    let root = unique_root("log-zstd");
    let args = ["--log-compression".to_string(), "3".to_string()];
    let s = crate::server::start_with(zstd.path(), &hosts, &root, None, "simulate", &args);
    let bid = s.submit(1).await;
    drop(s);
    assert!(
        conf(zstd.path()).contains("use_compression: true"),
        "{}",
        conf(zstd.path())
    );
    // Served again without the option: the log stays compressed and opens.
    let s = start(zstd.path(), &hosts, &root, None);
    assert_eq!(s.get(&format!("/batches/{bid}")).await["bid"], bid.as_str());
    drop(s);
    assert!(conf(zstd.path()).contains("use_compression: true"));

    let out = Command::new(ingest_bin())
        .args(["serve", "--log-compression", "23"])
        .env_remove("INGEST_CONFIG")
        .output()
        .expect("run ingest serve");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--log-compression"), "{err}");
}

/// Waits until `/readyz` says ready, the projector connected and caught up.
async fn caught_up(server: &crate::server::Server) {
    eventually(
        "ready, the projector connected and caught up",
        60,
        async || {
            let (code, body) = server.call(Method::GET, "/readyz", "", None).await;
            (code == 200 && body["projector"] == "connected" && body["events_behind"] == 0)
                .then_some(())
        },
    )
    .await;
}

/// Issue 25, finding 6: with nothing to project, `/readyz` said ready for as
/// long as ZooKeeper was down (the idle projector never noticed), and every
/// 503 it did answer was an ERROR line (one per probe per second in an
/// outage). It now says not ready, naming ZooKeeper, and logs once per
/// change; when ZooKeeper is back it is ready again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_names_a_zookeeper_down_while_idle_and_logs_it_once() {
    let zk_server = crate::zk_server::ZkServer::dedicated();
    let dir = tempfile::tempdir().expect("tempdir");
    let server = start(dir.path(), &zk_server.hosts(), &unique_root("readyz"), None);
    server.submit(1).await;
    caught_up(&server).await;
    let not_ready = || {
        std::fs::read_to_string(&server.log)
            .expect("log")
            .lines()
            .filter(|l| l.contains("not ready"))
            .count()
    };
    // Not ready at start (the projector starting) is a change of its own.
    let before = not_ready();
    zk_server.stop();
    let body = eventually("not ready while ZooKeeper is down", 60, async || {
        let (code, body) = server.call(Method::GET, "/readyz", "", None).await;
        (code == 503).then_some(body)
    })
    .await;
    let reasons = body["reasons"].to_string();
    assert!(reasons.contains("ZooKeeper"), "{body}");
    // More probes during the outage: still not ready, still one log line.
    for _ in 0..5 {
        let (code, body) = server.call(Method::GET, "/readyz", "", None).await;
        assert_eq!(code, 503, "{body}");
    }
    assert_eq!(
        not_ready() - before,
        1,
        "one line per change, not per probe"
    );
    zk_server.start();
    eventually("ready again once ZooKeeper is back", 120, async || {
        let (code, _) = server.call(Method::GET, "/readyz", "", None).await;
        (code == 200).then_some(())
    })
    .await;
    let text = std::fs::read_to_string(&server.log).expect("log");
    assert!(text.contains("ready again"), "the recovery is logged");
}

/// Reports, for every TCP socket of process PID connected to PORT, whether
/// it has TCP_NODELAY: it takes a copy of each socket with pidfd_getfd
/// (Linux 5.6; the same user may take another process's descriptors), so it
/// sees the sockets as the process holds them.
const NODELAY_OF: &str = r#"
import ctypes, json, os, socket, sys
pid, port = int(sys.argv[1]), int(sys.argv[2])
libc = ctypes.CDLL(None, use_errno=True)
SYS_PIDFD_GETFD = 438
pidfd = os.pidfd_open(pid)
found = []
for name in os.listdir(f"/proc/{pid}/fd"):
    try:
        if not os.readlink(f"/proc/{pid}/fd/{name}").startswith("socket:"):
            continue
    except OSError:
        continue
    fd = libc.syscall(SYS_PIDFD_GETFD, pidfd, int(name), 0)
    if fd < 0:
        sys.exit(f"pidfd_getfd: {os.strerror(ctypes.get_errno())}")
    s = socket.socket(fileno=fd)
    try:
        if s.family in (socket.AF_INET, socket.AF_INET6) and s.type == socket.SOCK_STREAM:
            try:
                peer = s.getpeername()
            except OSError:
                continue
            if peer[1] == port:
                found.append(s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
    finally:
        s.close()
print(json.dumps(found))
"#;

/// Issue 22: the ZooKeeper client left Nagle's algorithm on, so a request
/// written while an earlier one on the same session was unacknowledged
/// waited for that acknowledgement; a replicated group with one submission
/// in flight took 1.15–1.22 times the batches/s with the option set
/// (docs/performance.md).
/// Every connection `serve` holds to ZooKeeper (the projector's, the worker
/// daemons') now sets TCP_NODELAY; without the patched client
/// (vendor/zookeeper-client) each reports 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_connection_serve_holds_to_zookeeper_sends_without_delay() {
    let zk_server = shared();
    let hosts = zk_server.hosts();
    let port: u16 = hosts
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("the server's port");
    let dir = tempfile::tempdir().expect("tempdir");
    let server = start(dir.path(), &hosts, &unique_root("nodelay"), Some(&[]));
    server.submit(1).await;
    caught_up(&server).await;
    let out = Command::new("python3")
        .args(["-c", NODELAY_OF])
        .arg(server.child.id().to_string())
        .arg(port.to_string())
        .output()
        .expect("python3 (needed by this test)");
    assert!(
        out.status.success(),
        "the socket reader failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let nodelay: Vec<i32> = serde_json::from_slice(&out.stdout).expect("the reader's JSON");
    assert!(
        nodelay.len() >= 2,
        "the projector's and the daemons' sessions: {nodelay:?}"
    );
    assert!(
        nodelay.iter().all(|&n| n != 0),
        "every connection to ZooKeeper sets TCP_NODELAY: {nodelay:?}"
    );
}

/// A TCP connection to `base` (`http://HOST:PORT`) from the source address
/// `from`.
async fn connect_from(from: &str, base: &str) -> tokio::net::TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket
        .bind(format!("{from}:0").parse().expect("source address"))
        .expect("bind the source address");
    let to = base.trim_start_matches("http://").parse().expect("address");
    socket.connect(to).await.expect("connect")
}

/// Issue 25, finding 5: the connection limit was global, so one client
/// holding slow connections (1,024 of them by default) refused every other
/// request, worker reports and `/readyz` included. Each client address now
/// has a budget of its own under the global one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_holding_its_connection_budget_does_not_starve_others() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let zk_server = shared();
    let dir = tempfile::tempdir().expect("tempdir");
    let server = crate::server::start_with(
        dir.path(),
        &zk_server.hosts(),
        &unique_root("per-client"),
        None,
        "simulate",
        &[
            "--max-connections".into(),
            "6".into(),
            "--max-connections-per-client".into(),
            "3".into(),
        ],
    );
    // 127.0.0.2 opens connections and sends nothing (a slow client) until
    // the server closes one at once: it holds its budget, not the server's.
    let mut held = Vec::new();
    let refused = loop {
        let mut s = connect_from("127.0.0.2", &server.base).await;
        let _ = s.write_all(b"GET /healthz HTTP/1.1\r\n").await;
        let mut buf = [0u8; 64];
        // A refused connection is closed at once (read gives 0 or an
        // error); a held one stays open with nothing to read.
        match tokio::time::timeout(std::time::Duration::from_millis(500), s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break held.len(),
            Ok(Ok(_)) => panic!("an unfinished request was answered"),
            Err(_) => held.push(s),
        }
        assert!(
            held.len() <= 6,
            "no per-client limit: the client took every connection"
        );
    };
    assert_eq!(refused, 3, "the client's budget");
    // Another client is still served: a probe and a worker's read.
    let (code, _) = server.call(Method::GET, "/readyz", "", None).await;
    assert!(code == 200 || code == 503, "{code}");
    let (code, body) = server
        .call(
            Method::GET,
            "/reporting-batches?status=Reporting",
            WORKER,
            None,
        )
        .await;
    assert_eq!(code, 200, "{body}");
    let log = std::fs::read_to_string(&server.log).expect("log");
    assert!(
        log.lines().any(
            |l| l.contains("this client holds its most open connections")
                && l.contains("127.0.0.2")
        ),
        "the refusal names the client"
    );
    drop(held);
}

// B15: an unknown field in a JSON submission was refused with a list of
// the accepted fields that left out `uuid` (taken out of the body before
// the rest was parsed); the uuid itself still works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_submission_field_is_refused_listing_uuid_among_the_accepted() {
    let zk_server = shared();
    let root = unique_root("submission-fields");
    let dir = tempfile::tempdir().expect("tempdir");
    let s = start(dir.path(), &zk_server.hosts(), &root, None);
    let body = |extra: (&str, serde_json::Value)| {
        let mut b = json!({
            "submitter": "alice", "profile": "demo", "type": "file",
            "payload_url": "https://example.org/a.txt",
        });
        b[extra.0] = extra.1;
        b
    };
    let (status, reply) = s
        .call(
            Method::POST,
            "/batches",
            DEPOSITOR,
            Some(body(("colour", json!("blue")))),
        )
        .await;
    assert_eq!(status, 422, "{reply}");
    let message = reply["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("colour") && message.contains("`uuid`"),
        "{reply}"
    );
    let uuid = "9b2d5f0e-3c41-4c55-9a51-0d6c2b0f7a11";
    let (status, first) = s
        .call(
            Method::POST,
            "/batches",
            DEPOSITOR,
            Some(body(("uuid", json!(uuid)))),
        )
        .await;
    assert_eq!(status, 201, "{first}");
    let (_, again) = s
        .call(
            Method::POST,
            "/batches",
            DEPOSITOR,
            Some(body(("uuid", json!(uuid)))),
        )
        .await;
    assert_eq!(again["bid"], first["bid"], "{again}");
    let (status, reply) = s
        .call(
            Method::POST,
            "/batches",
            DEPOSITOR,
            Some(body(("uuid", json!(7)))),
        )
        .await;
    assert_eq!(status, 422, "{reply}");
    assert_eq!(reply["error"]["field"], "uuid", "{reply}");
}

/// Issue 25, finding 13: any depositor token could start listings that
/// walk the whole state, page after page. Each token now has a budget of
/// items walked per second: over it, its listings get 429 with
/// Retry-After, while another token still lists; a page with a cursor
/// walks only its own length (the cursor carries the first page's count).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_over_its_listing_budget_waits_and_another_token_still_lists() {
    let zk_server = shared();
    let dir = tempfile::tempdir().expect("tempdir");
    let server = crate::server::start_with(
        dir.path(),
        &zk_server.hosts(),
        &unique_root("listing-budget"),
        None,
        "simulate",
        &["--listing-items-per-second".into(), "4".into()],
    );
    for n in 0..6 {
        let (code, body) = server
            .call(
                Method::POST,
                "/batches",
                DEPOSITOR,
                Some(json!({
                    "submitter": "alice", "profile": "demo", "type": "file",
                    "payload_url": format!("https://example.org/{n}.txt"),
                })),
            )
            .await;
        assert_eq!(code, 201, "{body}");
    }
    let client = reqwest::Client::new();
    let list = |token: &'static str, query: String| {
        let req = client
            .get(format!("{}/batches?{query}", server.base))
            .bearer_auth(token);
        async move {
            let res = req.send().await.expect("list");
            let code = res.status().as_u16();
            let retry = res
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u64>().ok());
            let body: serde_json::Value = res.json().await.expect("json");
            (code, retry, body)
        }
    };
    // The burst is 20 items: each first page walks all 6 batches to count,
    // and 2 more for the page; the fourth comes too soon.
    let mut refused = None;
    for attempt in 0..10 {
        let (code, retry, body) = list(DEPOSITOR, "limit=1".into()).await;
        if code == 429 {
            refused = Some((attempt, retry, body));
            break;
        }
        assert_eq!(code, 200, "{body}");
        assert_eq!(body["matched"], 6, "{body}");
    }
    let (attempt, retry, body) = refused.expect("no listing was refused over the budget");
    assert!(attempt >= 2, "refused after {attempt} pages");
    assert_eq!(body["error"]["code"], "listing_budget", "{body}");
    assert!(retry.is_some_and(|s| s >= 1), "Retry-After: {retry:?}");
    // Another token is not slowed.
    let (code, _, body) = list(ADMIN, "limit=2".into()).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["matched"], 6);
    // The admin pages on: a page with a cursor keeps the first page's
    // count and walks its own length, so all six come in three pages
    // within the admin's burst (20 items: 8 + 3 + 3 + 2).
    let mut seen: Vec<String> = body["batches"]
        .as_array()
        .map(|b| b.iter().map(|b| b["bid"].to_string()).collect())
        .unwrap_or_default();
    let mut cursor = body["next_cursor"].as_str().map(str::to_string);
    while let Some(c) = cursor {
        let (code, _, body) = list(ADMIN, format!("limit=2&cursor={c}")).await;
        assert_eq!(code, 200, "{body}");
        assert_eq!(body["matched"], 6);
        seen.extend(
            body["batches"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|b| b["bid"].to_string()),
        );
        cursor = body["next_cursor"].as_str().map(str::to_string);
    }
    assert_eq!(seen.len(), 6, "{seen:?}");
}
