//! Identities per depositor (`--depositors-file`) on a real `ingest serve`
//! over a real ZooKeeper: each depositor's token submits to, lists and
//! reads only its own collections, an item of another's is answered as one
//! that does not exist, and the shared depositor token keeps seeing
//! everything.

use std::process::Command;

use reqwest::Method;
use serde_json::{json, Value};

use crate::server::{self, eventually, Server, ADMIN, DEPOSITOR};
use crate::util::ingest_bin;
use crate::zk_server::{shared, unique_root};

const LIB_A: &str = "lib-a-token-0123456789";
const LIB_B: &str = "lib-b-token-0123456789";
const ARK_A: &str = "ark:/99999/fk4deposita";
const ARK_B: &str = "ark:/99999/fk4depositb";

async fn submit(s: &Server, token: &str, collection: &str) -> (u16, Value) {
    let body = json!({
        "submitter": "whoever",
        "profile": collection,
        "type": "object-manifest",
        "payload_url": "https://example.org/batch.checkm",
        "manifest": ["https://example.org/0.txt loc0"],
    });
    s.call(Method::POST, "/batches", token, Some(body)).await
}

async fn listed(s: &Server, token: &str, path: &str, key: &str, id: &str) -> Vec<String> {
    let (code, page) = s.call(Method::GET, path, token, None).await;
    assert_eq!(code, 200, "{path}: {page}");
    page[key]
        .as_array()
        .unwrap_or_else(|| panic!("{path}: {page}"))
        .iter()
        .filter_map(|i| i[id].as_str().map(str::to_string))
        .collect()
}

/// The answer to `path` for `token`, with its status.
async fn get(s: &Server, token: &str, path: &str) -> (u16, Value) {
    s.call(Method::GET, path, token, None).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn depositors_see_and_submit_to_their_own_collections_only() {
    let zk = shared();
    let dir = tempfile::tempdir().expect("tempdir");
    server::seed_objects_in(dir.path(), "coll-a", &[(ARK_A, 1, &[10])]);
    server::seed_objects_in(dir.path(), "coll-b", &[(ARK_B, 1, &[10])]);
    let file = dir.path().join("depositors");
    std::fs::write(
        &file,
        format!("# name token collections\nlib-a {LIB_A} coll-a\nlib-b {LIB_B} coll-b coll-c\n"),
    )
    .expect("depositors file");
    let s = server::start_with(
        dir.path(),
        &zk.hosts(),
        &unique_root("depositors"),
        Some(&[]),
        "simulate",
        &["--depositors-file".into(), file.display().to_string()],
    );

    // Each submits to its own collections only.
    let (code, a) = submit(&s, LIB_A, "coll-a").await;
    assert_eq!(code, 201, "{a}");
    let bid_a = a["bid"].as_str().expect("bid").to_string();
    let (code, refused) = submit(&s, LIB_A, "coll-b").await;
    assert_eq!(code, 403, "{refused}");
    assert_eq!(
        refused["error"]["code"], "forbidden_collection",
        "{refused}"
    );
    let (code, b) = submit(&s, LIB_B, "coll-b").await;
    assert_eq!(code, 201, "{b}");
    let bid_b = b["bid"].as_str().expect("bid").to_string();
    // The shared token still submits anywhere.
    let (code, shared_sub) = submit(&s, DEPOSITOR, "coll-b").await;
    assert_eq!(code, 201, "{shared_sub}");
    let bid_shared = shared_sub["bid"].as_str().expect("bid").to_string();

    // What A submitted is recorded as A, from its token, not the body.
    let (code, hist) = get(&s, LIB_A, &format!("/batches/{bid_a}/history")).await;
    assert_eq!(code, 200, "{hist}");
    assert!(
        hist["events"]
            .as_array()
            .expect("events")
            .iter()
            .any(|e| e["actor"] == "depositor:lib-a"),
        "{hist}"
    );

    // Listings: each depositor its own; the shared token and admins all.
    assert_eq!(
        listed(&s, LIB_A, "/batches", "batches", "bid").await,
        vec![bid_a.clone()]
    );
    assert_eq!(
        listed(&s, LIB_B, "/batches", "batches", "bid").await,
        [bid_b.clone(), bid_shared.clone()]
    );
    let (code, other) = get(&s, LIB_A, "/batches?collection=coll-b").await;
    assert_eq!((code, other["matched"].as_u64()), (200, Some(0)), "{other}");
    for token in [DEPOSITOR, ADMIN] {
        assert_eq!(
            listed(&s, token, "/batches", "batches", "bid").await.len(),
            3
        );
    }
    // Jobs appear as the batch-pending daemon expands the batches.
    let jobs_of = async |bid: &str| -> String {
        eventually("the batch's job", 60, async || {
            let (_, page) = get(&s, ADMIN, &format!("/jobs?batch={bid}")).await;
            page["jobs"][0]["jid"].as_str().map(str::to_string)
        })
        .await
    };
    let jid_a = jobs_of(&bid_a).await;
    let jid_b = jobs_of(&bid_b).await;
    assert_eq!(
        listed(&s, LIB_A, "/jobs", "jobs", "jid").await,
        vec![jid_a.clone()]
    );
    assert!(
        listed(&s, LIB_A, &format!("/jobs?batch={bid_b}"), "jobs", "jid")
            .await
            .is_empty()
    );
    assert!(listed(&s, DEPOSITOR, "/jobs", "jobs", "jid")
        .await
        .contains(&jid_b));

    // Another's batch or job is answered as one that does not exist.
    let missing_bid = "bid9999999999";
    let (code, missing) = get(&s, LIB_A, &format!("/batches/{missing_bid}")).await;
    assert_eq!(code, 404, "{missing}");
    for path in [
        format!("/batches/{bid_b}"),
        format!("/batches/{bid_b}/report"),
        format!("/batches/{bid_b}/history"),
        format!("/jobs/{jid_b}"),
        format!("/jobs/{jid_b}/history"),
        format!("/history?batch={bid_b}"),
        format!("/history?job={jid_b}"),
        format!("/batch-uuids/{}", b["uuid"].as_str().expect("uuid")),
    ] {
        let (code, body) = get(&s, LIB_A, &path).await;
        assert_eq!(code, 404, "{path}: {body}");
        assert_eq!(
            body["error"]["code"], missing["error"]["code"],
            "{path}: {body}"
        );
        let (code, body) = get(&s, LIB_B, &path).await;
        assert_eq!(code, 200, "{path} for its owner: {body}");
    }
    // The whole log's history: only its collection's events.
    let (code, log) = get(&s, LIB_A, "/history").await;
    assert_eq!(code, 200, "{log}");
    let text = log.to_string();
    assert!(text.contains(&bid_a) && !text.contains(&bid_b), "{log}");
    let (code, other) = get(&s, LIB_A, "/history?collection=coll-b").await;
    assert_eq!(code, 400, "{other}");
    // B has two collections: it names one.
    let (code, _) = get(&s, LIB_B, "/history").await;
    assert_eq!(code, 400);
    let (code, _) = get(&s, LIB_B, "/history?collection=coll-c").await;
    assert_eq!(code, 200);

    // Objects and access requests: only those of its collections; another
    // depositor's object is answered word for word as an unknown ark.
    let request = async |token: &str, ark: &str| {
        s.call(Method::POST, "/access", token, Some(json!({"ark": ark})))
            .await
    };
    let (code, unknown) = request(LIB_A, "ark:/99999/fk4nosuch").await;
    assert_eq!(code, 404, "{unknown}");
    let (code, theirs) = request(LIB_A, ARK_B).await;
    assert_eq!(code, 404, "{theirs}");
    assert_eq!(
        theirs["error"]["message"]
            .as_str()
            .map(|m| m.replace(ARK_B, "ARK")),
        unknown["error"]["message"]
            .as_str()
            .map(|m| m.replace("ark:/99999/fk4nosuch", "ARK")),
        "{theirs} / {unknown}"
    );
    let (code, mine) = request(LIB_A, ARK_A).await;
    assert_eq!(code, 201, "{mine}");
    let qid_a = mine["request"]["qid"].as_str().expect("qid").to_string();
    let (code, mine_b) = request(LIB_B, ARK_B).await;
    assert_eq!(code, 201, "{mine_b}");
    let qid_b = mine_b["request"]["qid"].as_str().expect("qid").to_string();
    assert_eq!(
        listed(&s, LIB_A, "/access", "items", "qid").await,
        vec![qid_a.clone()]
    );
    assert_eq!(
        listed(&s, LIB_B, "/access", "items", "qid").await,
        vec![qid_b.clone()]
    );
    assert_eq!(
        listed(&s, DEPOSITOR, "/access", "items", "qid").await.len(),
        2
    );
    let (code, body) = get(&s, LIB_A, &format!("/access/{qid_b}")).await;
    assert_eq!(code, 404, "{body}");
    let (code, body) = get(&s, LIB_B, &format!("/access/{qid_b}")).await;
    assert_eq!(code, 200, "{body}");
    let (code, body) = get(&s, LIB_A, &format!("/objects/{ARK_B}")).await;
    assert_eq!(code, 404, "{body}");
    let (code, body) = get(&s, LIB_A, &format!("/objects/{ARK_A}")).await;
    assert_eq!(code, 200, "{body}");
    let (code, body) = get(&s, DEPOSITOR, &format!("/objects/{ARK_B}")).await;
    assert_eq!(code, 200, "{body}");
}

#[test]
fn a_bad_depositors_file_stops_serve_naming_the_line_not_the_token() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("depositors");
    std::fs::write(
        &file,
        format!("lib-a {LIB_A} coll-a\nlib-b {LIB_B} coll/b\n"),
    )
    .expect("depositors file");
    let out = Command::new(ingest_bin())
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .args(["serve", "--listen", "127.0.0.1:0", "--depositors-file"])
        .arg(&file)
        .env("INGEST_ADMIN_TOKEN", ADMIN)
        .env("INGEST_DEPOSITOR_TOKEN", DEPOSITOR)
        .env("INGEST_WORKER_TOKEN", server::WORKER)
        .env_remove("INGEST_CONFIG")
        .output()
        .expect("run ingest serve");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("depositors_file line 2"), "{err}");
    assert!(!err.contains(LIB_B) && !err.contains(LIB_A), "{err}");
}
