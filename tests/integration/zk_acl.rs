//! ZooKeeper digest authentication and ACLs against a real ZooKeeper: an
//! anonymous client reads everything and writes nothing, a worker identity
//! takes and releases locks and writes nothing else, the engine projects,
//! and `rebuild` keeps the ACLs and takes an open tree over.

use ingest_projections::{Credentials, ZkAccess};

use super::*;

pub(super) fn credentials(text: &str) -> Credentials {
    Credentials::parse(text).expect("credentials")
}

/// The engine's access: its own credentials, the workers' identity.
pub(super) fn engine_access() -> ZkAccess {
    ZkAccess {
        credentials: Some(credentials("engine:engine-secret")),
        worker: Some(credentials("worker:worker-secret").id()),
        open_object_locks: false,
        merritt: None,
    }
}

fn worker_access() -> ZkAccess {
    ZkAccess {
        credentials: Some(credentials("worker:worker-secret")),
        ..ZkAccess::default()
    }
}

async fn client(zk: &ZkConfig) -> zk::Client {
    zkio::connect(zk).await.expect("connect")
}

#[track_caller]
fn refused<T: std::fmt::Debug>(what: &str, r: Result<T, zk::Error>) {
    assert_eq!(r.err(), Some(zk::Error::NoAuth), "{what} must be refused");
}

/// Regression (seen once in a full suite run): every session created a
/// missing root with its own ACL, so a worker with credentials that
/// connected before the engine made the root "worker ALL, anyone READ",
/// and the engine's projector could never create `/ingest-engine` under it
/// ("not authorized"). A worker's session now waits for the engine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_connects_first_leaves_the_root_to_the_engine() {
    let server = shared();
    let root = unique_root("acl-first");
    let anon_zk = zk_config(&server.hosts(), &root);
    let engine_zk = anon_zk.clone().with_access(engine_access());
    let worker_zk = anon_zk.clone().with_access(worker_access());
    let session = ingest_worker::session::Session::new(worker_zk);
    assert!(
        session.client().await.is_err(),
        "a worker session made the missing root"
    );
    let mut f = Fixture::new();
    f.walk_batches(1, 2, false);
    catch_up(f.log(), &engine_zk, "engine").await;
    assert_same_tree(
        &log_tree(&f.log()),
        &live_tree(&anon_zk).await,
        "the engine's tree",
    );
    session
        .client()
        .await
        .expect("the worker connects once the root exists");
}

/// What anonymous and worker sessions may do to a tree the engine projected
/// with credentials.
async fn assert_guarded(anon: &zk::Client, worker: &zk::Client, jid: &str, bid: &str) {
    let status = format!("/jobs/{jid}/status");
    let lock = format!("/jobs/{jid}/lock");
    let ephemeral = ingest_projections::acl::lock_options();
    // Anonymous: reads, never writes.
    anon.get_data(&status).await.expect("anyone reads a status");
    anon.get_data(CHECKPOINT_NODE)
        .await
        .expect("anyone reads the checkpoint");
    refused(
        "an anonymous checkpoint write",
        anon.set_data(CHECKPOINT_NODE, b"{}", None).await,
    );
    refused(
        "an anonymous status write",
        anon.set_data(&status, b"{}", None).await,
    );
    refused(
        "an anonymous status delete",
        anon.delete(&status, None).await,
    );
    refused(
        "an anonymous job lock",
        anon.create(&lock, b"", &ephemeral).await,
    );
    refused(
        "an anonymous batch lock",
        anon.create(&format!("/batches/{bid}/lock"), b"", &ephemeral)
            .await,
    );
    refused(
        "an anonymous storage lock",
        anon.create("/locks/storage/ark_1_x", b"", &ephemeral).await,
    );
    refused(
        "an anonymous queue pause",
        anon.create("/locks/queue/ingest", b"", &zkio::open_acl())
            .await,
    );
    // The worker: its locks, nothing else.
    worker
        .create(&lock, b"fence", &ephemeral)
        .await
        .expect("a worker takes a job lock");
    refused(
        "a worker's write to its lock",
        worker.set_data(&lock, b"other", None).await,
    );
    refused(
        "an anonymous delete of a worker's lock",
        anon.delete(&lock, None).await,
    );
    worker
        .delete(&lock, None)
        .await
        .expect("a worker releases its lock");
    let batch_lock = format!("/batches/{bid}/lock");
    worker
        .create(&batch_lock, b"", &ephemeral)
        .await
        .expect("a worker takes a batch lock");
    worker
        .delete(&batch_lock, None)
        .await
        .expect("and releases it");
    for parent in ["/locks/storage", "/locks/inventory", "/locks/localid"] {
        let l = format!("{parent}/ark_99999_fk4x");
        worker
            .create(&l, jid.as_bytes(), &ephemeral)
            .await
            .expect("a worker takes an object lock");
        worker.delete(&l, None).await.expect("and releases it");
    }
    refused(
        "a worker's status write",
        worker.set_data(&status, b"{}", None).await,
    );
    refused(
        "a worker's checkpoint write",
        worker.set_data(CHECKPOINT_NODE, b"{}", None).await,
    );
    refused(
        "a worker's queue pause",
        worker
            .create("/locks/queue/ingest", b"", &zkio::open_acl())
            .await,
    );
    refused(
        "a worker's new job",
        worker
            .create("/jobs/jid9999999999", b"", &zkio::open_acl())
            .await,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_credentials_anyone_reads_only_the_engine_writes_and_workers_lock() {
    let server = shared();
    let root = unique_root("acl");
    let anon_zk = zk_config(&server.hosts(), &root);
    let engine_zk = anon_zk.clone().with_access(engine_access());
    let worker_zk = anon_zk.clone().with_access(worker_access());
    let mut f = Fixture::new();
    let bids = f.walk_batches(2, 2, false);
    catch_up(f.log(), &engine_zk, "engine").await;
    // Everything is readable by anyone: the anonymous tree is the log's.
    assert_same_tree(
        &log_tree(&f.log()),
        &live_tree(&anon_zk).await,
        "anonymous read",
    );
    let anon = client(&anon_zk).await;
    let worker = client(&worker_zk).await;
    assert_guarded(&anon, &worker, "jid0000000001", &bids[0].to_string()).await;

    // The engine goes on projecting; a rebuild that has to recreate nodes
    // gives them the same ACLs.
    f.walk_batches(1, 1, false);
    catch_up(f.log(), &engine_zk, "engine").await;
    let engine = client(&engine_zk).await;
    engine
        .delete("/jobs/jid0000000005/status", None)
        .await
        .expect("the engine deletes a node");
    drop(engine);
    let log = f.log();
    let report = rebuild::rebuild(
        &log,
        &AdminConfig::new(engine_zk.clone(), "admin"),
        &mut |_| {},
    )
    .await
    .expect("rebuild");
    assert_eq!(report.converge.created, 1, "{report:?}");
    assert!(report.secured >= report.expected_nodes, "{report:?}");
    assert_same_tree(&log_tree(&log), &live_tree(&anon_zk).await, "after rebuild");
    assert_guarded(&anon, &worker, "jid0000000005", &bids[1].to_string()).await;
}

/// Issue 23, item 3: with `--zk-merritt-identity`, a client authenticated
/// as Merritt's services writes the queue as mrt-zk does (a status, a
/// queue reference, a job lock, a queue pause, a new batch node, a
/// deletion) and nothing of the engine's; an anonymous client still only
/// reads, and the workers' rights are unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_merritt_identity_writes_the_queue_and_anonymous_clients_still_only_read() {
    let server = shared();
    let root = unique_root("acl-merritt");
    let anon_zk = zk_config(&server.hosts(), &root);
    let access = ZkAccess {
        merritt: Some(credentials("merritt:merritt-secret").id()),
        ..engine_access()
    };
    let engine_zk = anon_zk.clone().with_access(access);
    let merritt_zk = anon_zk.clone().with_access(ZkAccess {
        credentials: Some(credentials("merritt:merritt-secret")),
        ..ZkAccess::default()
    });
    let mut f = Fixture::new();
    let bids = f.walk_batches(2, 2, false);
    catch_up(f.log(), &engine_zk, "engine").await;
    let anon = client(&anon_zk).await;
    let worker = client(&anon_zk.clone().with_access(worker_access())).await;
    assert_guarded(&anon, &worker, "jid0000000001", &bids[0].to_string()).await;

    let merritt = client(&merritt_zk).await;
    let open = zkio::open_acl();
    let status = "/jobs/jid0000000002/status";
    let (data, _) = merritt.get_data(status).await.expect("Merritt reads");
    merritt
        .set_data(status, &data, None)
        .await
        .expect("Merritt sets a job's status");
    merritt
        .create("/jobs/states/estimating/05-jid0000000002", b"", &open)
        .await
        .expect("Merritt adds a queue reference");
    merritt
        .delete("/jobs/states/estimating/05-jid0000000002", None)
        .await
        .expect("Merritt removes a queue reference");
    merritt
        .create(
            "/jobs/jid0000000002/lock",
            b"",
            &ingest_projections::acl::lock_options(),
        )
        .await
        .expect("Merritt takes a job lock");
    merritt
        .create("/locks/queue/ingest", b"", &open)
        .await
        .expect("Merritt pauses the queue");
    merritt
        .delete("/locks/queue/ingest", None)
        .await
        .expect("Merritt resumes the queue");
    merritt
        .create("/batches/bid9999999999", b"", &open)
        .await
        .expect("Merritt creates a batch node");
    merritt
        .delete("/batches/bid9999999999", None)
        .await
        .expect("Merritt deletes a batch node");
    // Never the engine's nodes, nor the root, nor the ACLs.
    refused(
        "Merritt's checkpoint write",
        merritt.set_data(CHECKPOINT_NODE, b"{}", None).await,
    );
    refused(
        "Merritt's node under the root",
        merritt.create("/elsewhere", b"", &open).await,
    );
    refused(
        "Merritt's ACL change",
        merritt.set_acl(status, &zk::Acls::anyone_all(), None).await,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rebuild_with_credentials_takes_an_open_tree_over() {
    let server = shared();
    let root = unique_root("acl-migrate");
    let anon_zk = zk_config(&server.hosts(), &root);
    let engine_zk = anon_zk.clone().with_access(engine_access());
    let mut f = Fixture::new();
    let bids = f.walk_batches(1, 2, false);
    // Projected without credentials: open to anyone, as before.
    catch_up(f.log(), &anon_zk, "open").await;
    let anon = client(&anon_zk).await;
    let (acl, _) = anon
        .get_acl("/jobs/jid0000000001/status")
        .await
        .expect("acl");
    assert_eq!(acl, zk::Acls::anyone_all().to_vec());
    let log = f.log();
    rebuild::rebuild(
        &log,
        &AdminConfig::new(engine_zk.clone(), "admin"),
        &mut |_| {},
    )
    .await
    .expect("rebuild");
    let worker = client(&anon_zk.clone().with_access(worker_access())).await;
    assert_guarded(&anon, &worker, "jid0000000001", &bids[0].to_string()).await;
    // Every node the projection owns now carries the engine's ACL (read
    // by the engine: ZooKeeper hides digests from sessions without ADMIN).
    let engine = client(&engine_zk).await;
    let live = zkio::read_tree(
        &anon,
        &anon_zk,
        ReadOptions {
            include_engine: true,
        },
    )
    .await
    .expect("read");
    let engine_id = zk::AuthId::new(
        "digest",
        engine_access().credentials.expect("set").id().as_str(),
    );
    for (path, _) in live.tree.iter() {
        if live.ephemeral.contains_key(path) {
            continue;
        }
        let (acl, _) = engine.get_acl(path).await.expect("acl");
        assert!(
            acl.iter()
                .any(|a| a.auth_id() == &engine_id && a.permission() == zk::Permission::ALL)
                && !acl.iter().any(|a| a.auth_id() == &zk::AuthId::anyone()
                    && a.permission().has(zk::Permission::WRITE)),
            "{path}: {acl:?}"
        );
    }
    // And the engine projects on with its credentials.
    f.walk_batches(1, 1, false);
    catch_up(f.log(), &engine_zk, "engine").await;
    assert_same_tree(
        &log_tree(&f.log()),
        &live_tree(&anon_zk).await,
        "after the takeover",
    );
}

use crate::worker::ALL_DAEMONS;

fn worker_process(
    s: &crate::server::Server,
    hosts: &str,
    root: &str,
    name: &str,
    work: &Path,
    auth_file: Option<&Path>,
) -> std::process::Child {
    let mut cmd = std::process::Command::new(crate::util::ingest_bin());
    cmd.args([
        "worker",
        "--engine",
        &s.base,
        "--zk",
        hosts,
        "--zk-root",
        root,
    ])
    .args([
        "--daemons",
        ALL_DAEMONS,
        "--name",
        name,
        "--provisioning-threshold",
        "100",
    ])
    .arg("--working-storage")
    .arg(work);
    if let Some(f) = auth_file {
        cmd.arg("--zk-auth-file").arg(f);
    }
    cmd.env("INGEST_WORKER_TOKEN", crate::server::WORKER)
        .env_remove("INGEST_DATA_DIR")
        .env_remove("INGEST_ZK_AUTH")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start ingest worker")
}

/// The real binaries: `serve` with the engine's credentials and the
/// workers' identity (from `ingest zk-digest`), an `ingest worker` with the
/// worker credentials that does every job, and an anonymous one beside it
/// that can take no lock and so does none.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_process_with_the_worker_credentials_does_whole_jobs() {
    let zk_server = shared();
    let hosts = zk_server.hosts();
    let root = unique_root("acl-worker");
    let dir = tempfile::tempdir().expect("tempdir");
    crate::server::seed_objects(dir.path(), &[("ark:/99999/fk4acl", 1, &[10])]);
    let engine_auth = dir.path().join("engine.auth");
    let worker_auth = dir.path().join("worker.auth");
    std::fs::write(&engine_auth, "engine:engine-secret\n").expect("write");
    std::fs::write(&worker_auth, "worker:worker-secret\n").expect("write");
    let out = std::process::Command::new(crate::util::ingest_bin())
        .arg("zk-digest")
        .arg("--auth-file")
        .arg(&worker_auth)
        .output()
        .expect("zk-digest");
    assert!(out.status.success(), "{out:?}");
    let identity = String::from_utf8(out.stdout)
        .expect("utf-8")
        .trim()
        .to_string();
    assert_eq!(identity, credentials("worker:worker-secret").id().as_str());
    assert!(!identity.contains("worker-secret"));

    let off: Vec<String> = ALL_DAEMONS.split(',').map(|d| format!("{d}=off")).collect();
    let off: Vec<&str> = off.iter().map(String::as_str).collect();
    let args = vec![
        "--zk-auth-file".to_string(),
        engine_auth.display().to_string(),
        "--zk-worker-identity".to_string(),
        identity,
    ];
    let mut s = crate::server::start_with(dir.path(), &hosts, &root, Some(&off), "simulate", &args);
    let work = dir.path().join("work");
    let mut anonymous = worker_process(&s, &hosts, &root, "anonymous", &work, None);
    let mut worker = worker_process(&s, &hosts, &root, "authed", &work, Some(&worker_auth));
    let bid = s.submit(6).await;
    let batch = crate::server::eventually("the batch to complete", 60, async || {
        let batch = s.get(&format!("/batches/{bid}")).await;
        (batch["status"] == "Completed").then_some(batch)
    })
    .await;
    let done = batch["successful_jobs"]
        .as_array()
        .expect("successful_jobs");
    assert_eq!(done.len(), 6, "{batch}");
    let actors = s.worker_actors(done).await;
    assert!(
        !actors.is_empty() && actors.iter().all(|a| a.contains("authed")),
        "{actors:?}"
    );
    // The access queue's daemons lock `/access/<q>/QID/lock`: the worker
    // identity may, the anonymous worker may not.
    let (code, answer) = s
        .call(
            reqwest::Method::POST,
            "/access",
            crate::server::DEPOSITOR,
            Some(serde_json::json!({"ark": "ark:/99999/fk4acl"})),
        )
        .await;
    assert_eq!(code, 201, "{answer}");
    let qid = answer["request"]["qid"].as_str().expect("qid").to_string();
    crate::server::eventually("the assembly request to complete", 60, async || {
        let r = s.get(&format!("/access/{qid}")).await;
        (r["status"] == "Completed").then_some(())
    })
    .await;
    let history = s.get("/history").await;
    let assemblers: Vec<String> = history["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter(|r| r.to_string().contains(&qid))
        .filter_map(|r| r["actor"].as_str().filter(|a| a.starts_with("worker:")))
        .map(str::to_string)
        .collect();
    assert!(
        !assemblers.is_empty() && assemblers.iter().all(|a| a.contains("authed")),
        "{qid} assembled by {assemblers:?}"
    );
    for w in [&mut anonymous, &mut worker] {
        let _ = w.kill();
        let _ = w.wait();
    }
    s.terminate(30).await;
}
