//! Audit evidence as an auditor gets it: `ingest audit export` writes a
//! bundle, `ingest audit verify` (no data directory) and the independent
//! `tools/audit-verify.py` (Python, `cryptography`) check it, and each kind
//! of tampering is caught and named by both. Consistency proofs between
//! signed heads likewise.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::util::{ingest_bin, Ingest, Run};

fn python_verifier() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/audit-verify.py")
}

/// `ingest audit verify FILE [--key PUB]`, run from an empty directory
/// with no data directory configured.
fn rust_verify(file: &Path, key: Option<&Path>) -> Run {
    let empty = tempfile::tempdir().expect("tempdir");
    let mut cmd = Command::new(ingest_bin());
    cmd.current_dir(empty.path())
        .env_remove("INGEST_DATA_DIR")
        .args(["audit", "verify"])
        .arg(file);
    if let Some(k) = key {
        cmd.arg("--key").arg(k);
    }
    Run::from_output(cmd.output().expect("run ingest audit verify"))
}

pub(crate) fn python_verify(file: &Path, key: Option<&Path>) -> Run {
    let mut cmd = Command::new("python3");
    cmd.arg(python_verifier()).arg(file);
    if let Some(k) = key {
        cmd.arg("--key").arg(k);
    }
    Run::from_output(cmd.output().expect("run python3 tools/audit-verify.py"))
}

/// `ingest keys generate` beside `dir`; returns the key file and the public
/// key file (what `keys generate` prints).
pub(crate) fn generate_key(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    let key = dir.with_extension(format!("{name}.key"));
    let out = Command::new(ingest_bin())
        .args(["keys", "generate"])
        .arg(&key)
        .output()
        .expect("ingest keys generate");
    let public = dir.with_extension(format!("{name}.pub"));
    std::fs::write(&public, Run::from_output(out).ok().stdout).expect("write the public key");
    (key, public)
}

/// A data directory with three batches; the middle one walked along.
fn queue_with_key() -> (Ingest, PathBuf, PathBuf) {
    let ing = Ingest::new();
    let (key, public) = generate_key(ing.data_dir(), "engine");
    for n in 1..=3 {
        let url = format!("https://example.org/batch{n}.checkm");
        let mut args = vec![
            "submit",
            "--profile",
            "demo_content",
            "--submitter",
            "alice",
            "--payload-url",
            &url,
        ];
        // Batch 2's submission is a record of several KiB: BLAKE3 over more
        // than one 1 KiB chunk, which the Python verifier computes itself.
        let lines: Vec<String> = (0..if n == 2 { 60 } else { 2 })
            .map(|i| format!("file{i}.checkm loc{i:03}"))
            .collect();
        for line in &lines {
            args.extend(["--manifest", line.as_str()]);
        }
        ing.run(&args).ok();
    }
    ing.run(&["batch", "bid0000000002", "acquire"]).ok();
    ing.run(&["job", "jid0000000001", "start"]).ok();
    ing.run(&["job", "jid0000000001", "success"]).ok();
    (ing, key, public)
}

/// A change made to a bundle.
type Tamper = fn(&mut serde_json::Value);

fn flip_last_hex(v: &mut serde_json::Value) {
    let s = v.as_str().expect("a hex string").to_string();
    let last = if s.ends_with('0') { '1' } else { '0' };
    *v = serde_json::Value::String(format!("{}{last}", &s[..s.len() - 1]));
}

#[test]
fn a_bundle_verifies_alone_and_both_verifiers_name_each_tampering() {
    let (ing, key, public) = queue_with_key();
    let bundle = ing.data_dir().with_extension("bundle.json");
    let refused = ing.run(&["audit", "export", "--batch", "bid0000000002"]);
    assert_eq!(refused.code, 1, "no signed head yet: {refused:?}");
    assert!(
        refused.stderr.contains("no signed checkpoint"),
        "{}",
        refused.stderr
    );
    let out = ing
        .run(&[
            "audit",
            "export",
            "--batch",
            "bid0000000002",
            "--out",
            bundle.to_str().expect("utf-8"),
            "--checkpoint-key",
            key.to_str().expect("utf-8"),
        ])
        .ok();
    assert!(
        out.stderr.contains("signed a new checkpoint"),
        "{}",
        out.stderr
    );
    let verify = ing.run(&["verify"]).ok().stdout;
    assert!(verify.contains("1 signed checkpoint(s)"), "{verify}");

    let ok = rust_verify(&bundle, Some(&public)).ok();
    assert!(
        ok.stdout.contains("events of bid0000000002"),
        "{}",
        ok.stdout
    );
    assert!(ok.stdout.contains("JobCreated"), "{}", ok.stdout);
    let ok = python_verify(&bundle, Some(&public)).ok();
    assert!(ok.stdout.starts_with("ok:"), "{}", ok.stdout);

    let original: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&bundle).expect("read")).expect("json");
    let cases: Vec<(&str, Tamper)> = vec![
        ("event at position", |b| {
            flip_last_hex(&mut b["events"][2]["payload"])
        }),
        ("event at position", |b| {
            flip_last_hex(&mut b["events"][1]["header"])
        }),
        ("proof of the event at position", |b| {
            flip_last_hex(&mut b["events"][0]["proof"][0])
        }),
        ("signature of the signed head", |b| {
            flip_last_hex(&mut b["head"]["signature"])
        }),
        ("head (signed)", |b| flip_last_hex(&mut b["head"]["root"])),
    ];
    let tampered = ing.data_dir().with_extension("tampered.json");
    for (named, tamper) in &cases {
        let mut b = original.clone();
        tamper(&mut b);
        std::fs::write(&tampered, b.to_string()).expect("write");
        for (who, run) in [
            ("ingest audit verify", rust_verify(&tampered, None)),
            ("tools/audit-verify.py", python_verify(&tampered, None)),
        ] {
            assert_eq!(run.code, 1, "{who} must fail on {named}: {run:?}");
            assert!(
                run.stdout
                    .lines()
                    .next()
                    .is_some_and(|l| l.starts_with(named)),
                "{who} must name {named:?} first:\n{}",
                run.stdout
            );
        }
    }
    // The right bundle, the wrong key.
    let (_, other_pub) = generate_key(ing.data_dir(), "other");
    for run in [
        rust_verify(&bundle, Some(&other_pub)),
        python_verify(&bundle, Some(&other_pub)),
    ] {
        assert_eq!(run.code, 1, "{run:?}");
        assert!(run.stdout.starts_with("public key"), "{}", run.stdout);
    }
}

#[test]
fn consistency_proofs_verify_with_both_verifiers_and_a_changed_node_fails() {
    let (ing, key, public) = queue_with_key();
    let key = key.to_str().expect("utf-8");
    let export = |bid: &str| {
        ing.run(&[
            "audit",
            "export",
            "--batch",
            bid,
            "--checkpoint-key",
            key,
            "--out",
            "/dev/null",
        ])
        .ok()
    };
    export("bid0000000001");
    let first = ing.head();
    ing.run(&["job", "jid0000000002", "start"]).ok();
    export("bid0000000002");
    let second = ing.head();
    let proof = ing.data_dir().with_extension("proof.json");
    ing.run(&[
        "audit",
        "prove",
        "--from",
        &first.to_string(),
        "--to",
        &second.to_string(),
        "--out",
        proof.to_str().expect("utf-8"),
    ])
    .ok();
    rust_verify(&proof, Some(&public)).ok();
    python_verify(&proof, Some(&public)).ok();
    let refused = ing.run(&["audit", "prove", "--from", "1", "--to", &second.to_string()]);
    assert_eq!(refused.code, 1, "{refused:?}");
    assert!(
        refused.stderr.contains("not a signed checkpoint"),
        "{}",
        refused.stderr
    );

    let mut p: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&proof).expect("read")).expect("json");
    flip_last_hex(&mut p["proof"][0]);
    std::fs::write(&proof, p.to_string()).expect("write");
    for run in [rust_verify(&proof, None), python_verify(&proof, None)] {
        assert_eq!(run.code, 1, "{run:?}");
        assert!(
            run.stdout.starts_with("proof of consistency"),
            "{}",
            run.stdout
        );
    }
}

// D19: one edited record gave `verify` a list of problems where one is the
// cause, while `status` said `needs_repair: null` (the record was older
// than the tail start-up re-checks).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_names_the_first_cause_and_status_reports_what_it_found() {
    let (ing, key, _) = queue_with_key();
    ing.run(&["batch", "bid0000000001", "acquire"]).ok();
    ing.run(&["batch", "bid0000000003", "acquire"]).ok();
    {
        let out = ing.data_dir().with_extension("bundle.json");
        ing.run(&[
            "audit",
            "export",
            "--batch",
            "bid0000000002",
            "--out",
            out.to_str().expect("utf-8"),
            "--checkpoint-key",
            key.to_str().expect("utf-8"),
        ])
        .ok();
    }
    let head = ing.head();
    assert!(
        head > 70,
        "the damage must be older than the re-checked tail: {head}"
    );
    {
        let log = ingest_events::Log::open(&ing.data_dir().join("log"), &Default::default())
            .expect("open log");
        // Record 2 rewritten by someone with its own hash made anew: it
        // decodes, and the link of record 3 to it breaks.
        let k = ingest_events::Log::raw_event_key(2);
        let bytes = log.raw_tree().get(k).unwrap().unwrap().to_vec();
        let mut r = ingest_events::codec::decode_record(&bytes).expect("record 2");
        r.envelope.actor = "admin:mallory".parse().expect("actor");
        let (edited, _) = ingest_events::codec::encode_for_fixture(&r.envelope, &r.event);
        log.raw_tree().insert(k, edited).unwrap();
        log.raw_tree().flush().unwrap();
    }
    // Before any verify, nothing says so (start-up re-checks the tail).
    let status = ing.run(&["status", "--format", "json"]).ok().stdout;
    let status: serde_json::Value = serde_json::from_str(&status).expect("status JSON");
    assert_eq!(status["needs_repair"], serde_json::Value::Null, "{status}");

    let out = ing.run(&["verify"]).failed();
    assert!(
        out.stdout
            .starts_with("first cause, position 3: previous-hash link broken"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout
            .contains("  after it: 1 signed checkpoint problem(s), positions "),
        "{}",
        out.stdout
    );
    let status = ing.run(&["status", "--format", "json"]).ok().stdout;
    let status: serde_json::Value = serde_json::from_str(&status).expect("status JSON");
    let damage = status["needs_repair"].as_str().unwrap_or_default();
    assert!(damage.contains("at position 3:"), "{status}");
    assert_eq!(status["last_verify"]["problems"], 2, "{status}");

    // Through a running server: `GET /verify` groups the same way and
    // `GET /status` says what it found.
    let zk_server = crate::zk_server::shared();
    let root = crate::zk_server::unique_root("verify-status");
    let dir = tempfile::tempdir().expect("tempdir");
    let server =
        crate::server::start_with_data(dir.path(), ing.data_dir(), &zk_server.hosts(), &root);
    std::fs::remove_file(ing.data_dir().join("last-verify.json")).expect("remove");
    assert_eq!(
        server.get("/status").await["needs_repair"],
        serde_json::Value::Null
    );
    let verified = server.get("/verify").await;
    assert_eq!(verified["first_cause"]["position"], 3, "{verified}");
    assert_eq!(
        verified["after_first"][0]["kind"], "signed checkpoint",
        "{verified}"
    );
    let status = server.get("/status").await;
    assert!(
        status["needs_repair"]
            .as_str()
            .is_some_and(|d| d.contains("at position 3:")),
        "{status}"
    );
}

// D4: with `serve` running, `audit export` and `audit prove` on the data
// directory said "run it through the server", and through `--engine` they
// said "run it where the data directory is".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn export_and_prove_through_a_running_server_verify_independently() {
    let zk_server = crate::zk_server::shared();
    let root = crate::zk_server::unique_root("audit-serve");
    let dir = tempfile::tempdir().expect("tempdir");
    let (key, public) = generate_key(&dir.path().join("keys"), "engine");
    let args: Vec<String> = [
        "--checkpoint-key",
        key.to_str().expect("utf-8"),
        "--checkpoint-every-events",
        "1",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let server = crate::server::start_with(
        dir.path(),
        &zk_server.hosts(),
        &root,
        None,
        "simulate",
        &args,
    );
    let bid = server.submit(2).await;
    server.submit(1).await;
    let admin = [("INGEST_ADMIN_TOKEN", crate::server::ADMIN)];
    let checkpoints = crate::server::eventually("two signed checkpoints", 30, async || {
        let history = server.get("/history").await;
        let positions: Vec<u64> = history["events"]
            .as_array()?
            .iter()
            .filter(|r| r["event"] == "LogCheckpointed")
            .filter_map(|r| r["position"].as_u64())
            .collect();
        (positions.len() >= 2).then_some(positions)
    })
    .await;

    // On the data directory the server holds, the CLI says to use the server.
    let data = dir.path().join("data");
    let local = tokio::task::block_in_place(|| {
        Run::from_output(
            Command::new(ingest_bin())
                .arg("--data-dir")
                .arg(&data)
                .args(["audit", "export", "--batch", &bid])
                .env_remove("INGEST_ENGINE")
                .env_remove("INGEST_DATA_DIR")
                .output()
                .expect("run ingest"),
        )
    })
    .failed();
    assert!(
        local.stderr.contains(&format!("--engine {}", server.base)),
        "{}",
        local.stderr
    );

    let bundle = dir.path().join("bundle.json");
    let proof = dir.path().join("proof.json");
    let engine = server.base.clone();
    tokio::task::block_in_place(|| {
        let out = crate::util::ingest_remote(
            &engine,
            &admin,
            &[
                "audit",
                "export",
                "--batch",
                &bid,
                "--out",
                bundle.to_str().expect("utf-8"),
            ],
        )
        .ok();
        assert!(
            out.stderr.contains(&format!("events of {bid}")),
            "{}",
            out.stderr
        );
        crate::util::ingest_remote(
            &engine,
            &admin,
            &[
                "audit",
                "prove",
                "--from",
                &checkpoints[0].to_string(),
                "--to",
                &checkpoints[checkpoints.len() - 1].to_string(),
                "--out",
                proof.to_str().expect("utf-8"),
            ],
        )
        .ok();
        for file in [&bundle, &proof] {
            rust_verify(file, Some(&public)).ok();
            python_verify(file, Some(&public)).ok();
        }
        // A position that is no checkpoint is refused, saying so.
        let refused = crate::util::ingest_remote(
            &engine,
            &admin,
            &[
                "audit",
                "prove",
                "--from",
                "1",
                "--to",
                &checkpoints[0].to_string(),
            ],
        )
        .failed();
        assert_eq!(refused.code, 1, "{refused:?}");
        assert!(
            refused.stderr.contains("not a signed checkpoint"),
            "{}",
            refused.stderr
        );
    });
}
