//! The CLI as an operator runs it: a batch walked to Completed, admin actions,
//! and bad input that changes nothing.

use crate::util::Ingest;

const STEPS: [&str; 8] = [
    "Estimating",
    "Provisioning",
    "Downloading",
    "Processing",
    "Storing",
    "Recording",
    "Notify",
    "Completed",
];

fn submit_three(ing: &Ingest) {
    ing.run(&[
        "submit",
        "--profile",
        "demo_content",
        "--submitter",
        "alice",
        "--payload-url",
        "https://example.org/batch.checkm",
        "--manifest",
        "file1.checkm loc001",
        "--manifest",
        "file2.checkm loc002",
        "--manifest",
        "file3.checkm loc003 ark123",
    ])
    .ok();
}

#[test]
fn a_batch_walks_through_every_state_to_completed() {
    let ing = Ingest::new();
    submit_three(&ing);
    assert_eq!(ing.batch_status("bid0000000001"), "Pending");
    let out = ing.run(&["batch", "bid0000000001", "acquire"]).ok();
    assert!(
        out.stdout.contains("Pending -> Processing (3 jobs)"),
        "{}",
        out.stdout
    );
    assert_eq!(ing.show("job", "jid0000000003")["primary_id"], "ark123");
    for j in 1..=3 {
        let jid = format!("jid000000000{j}");
        assert_eq!(ing.job_status(&jid), "Pending");
        ing.run(&["job", &jid, "start"]).ok();
        assert_eq!(ing.job_status(&jid), STEPS[0]);
        for step in &STEPS[1..] {
            ing.run(&["job", &jid, "success"]).ok();
            assert_eq!(&ing.job_status(&jid), step);
        }
        let expected = if j < 3 { "Processing" } else { "Reporting" };
        assert_eq!(ing.batch_status("bid0000000001"), expected, "after job {j}");
    }
    let out = ing.run(&["batch", "bid0000000001", "report"]).ok();
    assert!(
        out.stdout.contains("reported: 3 successful, 0 failed"),
        "{}",
        out.stdout
    );
    assert_eq!(ing.batch_status("bid0000000001"), "Completed");

    let history = ing
        .run(&["history", "--batch", "bid0000000001"])
        .ok()
        .stdout;
    // submit + acquire + 3 creates + 3×8 moves + reporting started + reported + completed.
    assert_eq!(history.lines().count() - 1, 1 + 1 + 3 + 24 + 3, "{history}");
    assert!(history.contains("Notify -> Completed"));
    assert!(history.contains("admin:tester"));
    // The same history by actor, time and collection, from the indexes.
    let by = |args: &[&str]| ing.run(args).ok().stdout.lines().count() - 1;
    assert_eq!(
        by(&[
            "history",
            "--by",
            "admin:tester",
            "--collection",
            "demo_content"
        ]),
        history
            .lines()
            .filter(|l| l.contains("admin:tester"))
            .count()
    );
    assert_eq!(by(&["history", "--collection", "other_collection"]), 0);
    assert_eq!(by(&["history", "--since", "2999-01-01"]), 0);
    assert_eq!(by(&["history", "--until", "2000-01-01"]), 0);
    assert_eq!(by(&["history", "--since", "2000-01-01", "--limit", "5"]), 5);
    let bad = ing.run(&["history", "--since", "yesterday"]).failed();
    assert!(bad.stderr.contains("not a time"), "{}", bad.stderr);

    let yaml = ing
        .run(&["history", "--job", "jid0000000003", "--format", "yaml"])
        .ok()
        .stdout;
    let rows: Vec<serde_json::Value> = serde_norway::from_str(&yaml).expect("history yaml");
    assert_eq!(rows.len(), 9);
    let positions: Vec<u64> = rows
        .iter()
        .map(|r| r["position"].as_u64().unwrap())
        .collect();
    assert!(positions.windows(2).all(|w| w[0] < w[1]), "{positions:?}");

    let verify = ing.run(&["verify"]).ok().stdout;
    assert!(verify.contains("32 events checked"), "{verify}");
    assert!(verify.contains("ok: the hash chain and the stream index verify"));

    let cleanup = ing.run(&["cleanup"]).ok().stdout;
    assert!(cleanup.contains("BatchCleanedUp"), "{cleanup}");
    let again = ing.run(&["job", "jid0000000001", "hold"]).failed();
    assert!(again.stderr.contains("was cleaned up"), "{}", again.stderr);
}

#[test]
fn admin_actions_fail_requeue_hold_pause_delete() {
    let ing = Ingest::new();
    submit_three(&ing);
    ing.run(&["batch", "bid0000000001", "acquire"]).ok();
    // Job 1 fails in Storing and is requeued at Storing with retry_count 1.
    ing.run(&["job", "jid0000000001", "start"]).ok();
    for _ in 0..4 {
        ing.run(&["job", "jid0000000001", "success"]).ok();
    }
    assert_eq!(ing.job_status("jid0000000001"), "Storing");
    ing.run(&[
        "job",
        "jid0000000001",
        "fail",
        "--message",
        "storage returned 503",
    ])
    .ok();
    ing.run(&[
        "job",
        "jid0000000001",
        "requeue",
        "--reason",
        "storage is back",
    ])
    .ok();
    let job = ing.show("job", "jid0000000001");
    assert_eq!(job["status"], "Storing");
    assert_eq!(job["retry_count"], 1);
    assert_eq!(job["last_successful_status"], "Processing");

    // A held collection parks a job that starts; releasing it releases the job.
    ing.run(&[
        "collection",
        "demo_content",
        "hold",
        "--reason",
        "migration",
    ])
    .ok();
    ing.run(&["job", "jid0000000002", "start"]).ok();
    assert_eq!(ing.job_status("jid0000000002"), "Held");
    let out = ing
        .run(&["collection", "demo_content", "release", "--reason", "done"])
        .ok();
    assert!(out.stdout.contains("Held -> Pending"), "{}", out.stdout);
    assert_eq!(ing.job_status("jid0000000002"), "Pending");

    // A paused queue keeps jobs Pending.
    ing.run(&["queue", "pause", "--reason", "maintenance"]).ok();
    let head = ing.head();
    let refused = ing.run(&["job", "jid0000000002", "start"]).failed();
    assert!(
        refused.stderr.contains("the ingest queue is paused"),
        "{}",
        refused.stderr
    );
    assert_eq!(ing.head(), head, "a refused command appends nothing");
    ing.run(&["queue", "resume"]).ok();
    ing.run(&["job", "jid0000000002", "start"]).ok();

    // Delete: refused while the job is at work, allowed once it failed.
    let refused = ing.run(&["job", "jid0000000002", "delete"]).failed();
    assert!(
        refused.stderr.contains("job jid0000000002 is Estimating; it cannot go to Deleted (allowed: Provisioning, Failed)"),
        "{}",
        refused.stderr
    );
    ing.run(&[
        "job",
        "jid0000000002",
        "fail",
        "--message",
        "HEAD returned 404",
    ])
    .ok();
    ing.run(&[
        "job",
        "jid0000000002",
        "delete",
        "--reason",
        "depositor withdrew",
    ])
    .ok();
    assert_eq!(ing.job_status("jid0000000002"), "Deleted");

    let history = ing
        .run(&["history", "--batch", "bid0000000001"])
        .ok()
        .stdout;
    for needle in [
        "Storing -> Failed: storage returned 503",
        "Failed -> Storing (requeue): storage is back",
        "Pending -> Held: collection demo_content is held",
        "Failed -> Deleted (depositor withdrew)",
    ] {
        assert!(history.contains(needle), "missing {needle:?} in\n{history}");
    }
}

#[test]
fn bad_input_is_named_and_appends_nothing() {
    let ing = Ingest::new();
    submit_three(&ing);
    let head = ing.head();

    let out = ing
        .run(&[
            "submit",
            "--submitter",
            "alice",
            "--payload-url",
            "https://x",
        ])
        .failed();
    assert!(
        out.stderr.contains("missing field `profile`"),
        "{}",
        out.stderr
    );
    let out = ing
        .run(&[
            "submit",
            "--profile",
            "a/b",
            "--submitter",
            "alice",
            "--payload-url",
            "https://x",
        ])
        .failed();
    assert!(
        out.stderr.contains("invalid profile: \"a/b\""),
        "{}",
        out.stderr
    );
    let out = ing
        .run(&[
            "submit",
            "--profile",
            "p",
            "--submitter",
            "a",
            "--payload-url",
            "u",
            "--type",
            "tarball",
        ])
        .failed();
    assert!(
        out.stderr.contains("unknown payload type \"tarball\""),
        "{}",
        out.stderr
    );
    let out = ing
        .run(&[
            "submit",
            "--profile",
            "p",
            "--submitter",
            "a",
            "--payload-url",
            "u",
            "--digest",
            "md5:xyz",
        ])
        .failed();
    assert!(
        out.stderr.contains("a md5 digest is 32 hex digits"),
        "{}",
        out.stderr
    );

    let file = ing.data_dir().join("bad.yml");
    std::fs::write(
        &file,
        "submitter: alice\nprofile: demo\npayload_url: https://x\ncolour: blue\n",
    )
    .unwrap();
    let out = ing
        .run(&["submit", "--file", file.to_str().unwrap()])
        .failed();
    assert!(
        out.stderr.contains("bad.yml")
            && out.stderr.contains("unknown field `colour`")
            && out.stderr.contains("line 4"),
        "{}",
        out.stderr
    );

    let out = ing.run(&["job", "jid12", "start"]).failed();
    assert!(
        out.stderr
            .contains("is not a job id (expected jid followed by 10 digits"),
        "{}",
        out.stderr
    );
    let out = ing.run(&["job", "jid0000000099", "start"]).failed();
    assert!(
        out.stderr.contains("job jid0000000099 does not exist"),
        "{}",
        out.stderr
    );
    let out = ing.run(&["batch", "bid0000000001", "report"]).failed();
    assert!(
        out.stderr.contains(
            "batch bid0000000001 is Pending; it cannot go to a report (allowed: Held, Processing)"
        ),
        "{}",
        out.stderr
    );

    assert_eq!(ing.head(), head, "no rejected command appended anything");
    ing.run(&["verify"]).ok();
}

#[test]
fn a_lifecycle_file_is_validated_with_lines() {
    let ing = Ingest::new();
    let states = ing.data_dir().join("states.yml");
    let builtin = ingest_events::lifecycle::BUILTIN_STATES_YML;
    std::fs::write(
        &states,
        builtin.replacen(
            "    Provisioning: {success: true}",
            "    Provisionning: {success: true}",
            1,
        ),
    )
    .unwrap();
    let out = ing
        .run(&["--states", states.to_str().unwrap(), "lifecycle"])
        .failed();
    let line = builtin
        .lines()
        .position(|l| l.contains("Provisioning: {success: true}"))
        .unwrap()
        + 1;
    assert!(
        out.stderr.contains(&format!(
            "states.yml:{line}: success marker on transition Estimating -> Provisionning"
        )),
        "{}",
        out.stderr
    );

    let table = ing.run(&["lifecycle"]).ok().stdout;
    assert!(
        table.contains("Jobs (12 states)") && table.contains("Batches (8 states)"),
        "{table}"
    );
    // D3: the table shows the admin-only moves the engine allows.
    assert!(table.contains("Deleted (admin: delete)"), "{table}");
    assert!(table.contains("Pending (admin: requeue)"), "{table}");
    // B16: one diagram per output; which one must be said.
    let none = ing.run(&["lifecycle", "--format", "mermaid"]).failed();
    assert_eq!(none.code, 2, "{}", none.stderr);
    assert!(none.stderr.contains("--of"), "{}", none.stderr);
    let mermaid = ing
        .run(&["lifecycle", "--format", "mermaid", "--of", "job"])
        .ok()
        .stdout;
    assert_eq!(mermaid.matches("stateDiagram-v2").count(), 1, "{mermaid}");
    assert!(
        mermaid.contains("Completed --> Deleted : admin delete"),
        "{mermaid}"
    );
    let lc = ingest_events::Lifecycle::builtin();
    for (s, rule) in lc.jobs.iter() {
        for t in &rule.targets {
            assert!(
                mermaid.contains(&format!("{s} --> {t}")),
                "missing {s} --> {t}"
            );
        }
    }
}

#[test]
fn a_second_process_on_the_data_dir_is_told_so() {
    let ing = Ingest::new();
    submit_three(&ing);
    let held = ingest_events::Log::open(&ing.data_dir().join("log"), &Default::default())
        .expect("open log");
    let out = ing.run(&["status"]).failed();
    assert!(
        out.stderr.contains("is in use by another process"),
        "{}",
        out.stderr
    );
    assert_eq!(out.code, 3, "a held data directory is 'cannot reach'");
    drop(held);
    ing.run(&["status"]).ok();
}

#[test]
fn a_torn_tail_refuses_appends_until_repaired() {
    let ing = Ingest::new();
    submit_three(&ing);
    ing.run(&["batch", "bid0000000001", "acquire"]).ok();
    {
        let log = ingest_events::Log::open(&ing.data_dir().join("log"), &Default::default())
            .expect("open log");
        let key = ingest_events::Log::raw_event_key(5);
        let mut bytes = log.raw_tree().get(key).unwrap().unwrap().to_vec();
        let n = bytes.len();
        bytes.truncate(n / 2);
        log.raw_tree().insert(key, bytes).unwrap();
        log.raw_tree().flush().unwrap();
    }
    let out = ing.run(&["verify"]).failed();
    assert!(out.stdout.contains("position 5:"), "{}", out.stdout);
    let out = ing.run(&["job", "jid0000000001", "start"]).failed();
    assert!(
        out.stderr.contains("fails its hash chain at position 5")
            && out.stderr.contains("ingest repair"),
        "{}",
        out.stderr
    );
    let out = ing.run(&["repair"]).failed();
    assert!(
        out.stdout.contains("would remove positions 5..=5"),
        "{}",
        out.stdout
    );
    let out = ing.run(&["repair", "--yes"]).ok();
    assert!(
        out.stdout.contains("positions 5..=5 (1 event(s))"),
        "{}",
        out.stdout
    );
    ing.run(&["verify"]).ok();
    ing.run(&["job", "jid0000000001", "start"]).ok();
}

#[test]
fn keys_are_generated_private_and_published_for_verifiers() {
    let ing = Ingest::new();
    let key = ing.data_dir().join("signing.pem");
    let key_arg = key.display().to_string();
    let made = ing.run(&["keys", "generate", &key_arg]).ok();
    let shown = ing.run(&["keys", "show", &key_arg]).ok();
    assert_eq!(
        made.stdout, shown.stdout,
        "generate and show publish the same key"
    );
    assert!(
        shown.stdout.starts_with("# fingerprint SHA256:"),
        "{}",
        shown.stdout
    );
    assert!(
        shown.stdout.contains("-----BEGIN PUBLIC KEY-----"),
        "{}",
        shown.stdout
    );
    assert!(
        !shown.stdout.contains("PRIVATE"),
        "the private key was printed"
    );
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&key).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    // The key signs what it published: a manifest signed with it verifies
    // against the printed public key.
    let signer = ingest_steps::signing::SigningKeyFile::load(&key).unwrap();
    let pem = shown.stdout.lines().skip(1).collect::<Vec<_>>().join("\n") + "\n";
    let sig = signer.sign(b"#%checkm_0.7\n#%eof\n").to_text();
    ingest_steps::signing::verify(&pem, b"#%checkm_0.7\n#%eof\n", &sig).unwrap();
    // Never overwritten; a world-readable key is refused.
    let again = ing.run(&["keys", "generate", &key_arg]).failed();
    assert!(again.stderr.contains(&key_arg), "{}", again.stderr);
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let open = ing.run(&["keys", "show", &key_arg]).failed();
    assert!(open.stderr.contains("chmod 600"), "{}", open.stderr);
}

/// Regression: `ingest tree | head -1` and `ingest history … | head -1`
/// printed a panic's backtrace and exited 101 when the reader went away.
#[test]
fn a_closed_pipe_ends_the_output_quietly() {
    let ing = Ingest::new();
    for _ in 0..20 {
        submit_three(&ing);
    }
    for args in [
        vec!["tree"],
        vec!["history", "--batch", "bid0000000001", "--format", "yaml"],
        vec!["show", "batch", "bid0000000001", "--format", "json"],
    ] {
        let mut child = std::process::Command::new(crate::util::ingest_bin())
            .arg("--data-dir")
            .arg(ing.data_dir())
            .args(&args)
            .env_remove("INGEST_DATA_DIR")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn ingest");
        // The reader goes away before the child writes (it opens the log
        // first), so every write meets a closed pipe.
        drop(child.stdout.take());
        let out = child.wait_with_output().expect("wait");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }
}

/// Regression: a typo in --data-dir opened an empty log (`status` exited 0
/// on a directory that did not exist), and every failure exited 1.
#[test]
fn exit_codes_tell_refusals_typos_and_outages_apart() {
    let ing = Ingest::new();
    let missing = ing.data_dir().join("no-such-dir");
    let run = |args: &[&str]| {
        let out = std::process::Command::new(crate::util::ingest_bin())
            .arg("--data-dir")
            .arg(&missing)
            .args(args)
            .env_remove("INGEST_DATA_DIR")
            .env_remove("INGEST_ENGINE")
            .env("INGEST_ADMIN_TOKEN", "admin-token-0123456789")
            .output()
            .expect("run ingest");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    // Usage: no data directory there, and none is created.
    let (code, stderr) = run(&["status"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("there is no data directory at"), "{stderr}");
    assert!(!missing.exists(), "status must not create the directory");
    // The first submission creates it.
    let (code, stderr) = run(&[
        "submit",
        "--profile",
        "demo",
        "--submitter",
        "a",
        "--payload-url",
        "https://example.org/a",
        "--type",
        "file",
    ]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(missing.exists());
    // Refused by the queue: an unknown job.
    let (code, stderr) = run(&["job", "jid0000000099", "hold", "--reason", "x"]);
    assert_eq!(code, Some(1), "{stderr}");
    // D17: a data directory and a server both given: refused (the data
    // directory was silently ignored), the flag or the environment alike.
    let (code, stderr) = run(&["--engine", "http://127.0.0.1:9", "status"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("both a server") && stderr.contains("no-such-dir"),
        "{stderr}"
    );
    // Cannot reach: a server that does not answer.
    let out = std::process::Command::new(crate::util::ingest_bin())
        .args(["--engine", "http://127.0.0.1:9", "status"])
        .env_remove("INGEST_DATA_DIR")
        .env_remove("INGEST_ENGINE")
        .env("INGEST_ADMIN_TOKEN", "admin-token-0123456789")
        .output()
        .expect("run ingest");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(stderr.contains("cannot reach"), "{stderr}");
    let out = std::process::Command::new(crate::util::ingest_bin())
        .args(["status"])
        .env("INGEST_DATA_DIR", &missing)
        .env("INGEST_ENGINE", "http://127.0.0.1:9")
        .env("INGEST_ADMIN_TOKEN", "admin-token-0123456789")
        .output()
        .expect("run ingest");
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    // Usage: clap's own errors.
    let (code, _) = run(&["no-such-command"]);
    assert_eq!(code, Some(2));
}

/// `ingest batches` and `ingest jobs` on the data directory: an aligned
/// table by default, filters, the cursor of the next page, and bad filters
/// refused as usage errors (exit 2) naming the option.
#[test]
fn batches_and_jobs_are_listed_as_tables_with_filters() {
    let ing = Ingest::new();
    submit_three(&ing);
    ing.run(&["batch", "bid0000000001", "acquire"]).ok();
    ing.run(&["job", "jid0000000002", "start"]).ok();
    ing.run(&[
        "job",
        "jid0000000002",
        "fail",
        "--message",
        "HEAD\nreturned 404",
    ])
    .ok();

    let out = ing.run(&["jobs", "--state", "failed"]).ok().stdout;
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].starts_with("JID "), "{out}");
    assert!(lines[1].starts_with("jid0000000002 "), "{out}");
    // The columns line up: STATUS starts at the same column on each line.
    let col = lines[0].find("STATUS").expect("STATUS");
    assert_eq!(&lines[1][col..col + 6], "Failed", "{out}");
    assert!(
        lines[1].contains("HEAD returned 404"),
        "newlines are cut out: {out}"
    );
    assert_eq!(lines[2], "1 of 1 shown", "{out}");

    let out = ing.run(&["jobs", "--limit", "2"]).ok().stdout;
    assert_eq!(out.lines().count(), 4, "{out}");
    let cursor = out
        .lines()
        .last()
        .and_then(|l| l.split("--cursor ").nth(1))
        .and_then(|l| l.split_whitespace().next())
        .unwrap_or_else(|| panic!("no cursor: {out}"));
    let next = ing
        .run(&[
            "jobs", "--limit", "2", "--cursor", cursor, "--format", "json",
        ])
        .ok()
        .stdout;
    let page: serde_json::Value = serde_json::from_str(&next).expect("json");
    assert_eq!(page["jobs"][0]["jid"], "jid0000000003", "{page}");
    assert_eq!(page["next_cursor"], serde_json::Value::Null);

    let all = ing
        .run(&["jobs", "--all", "--limit", "1", "--format", "yaml"])
        .ok();
    assert_eq!(all.stdout.matches("jid: jid").count(), 3, "{}", all.stdout);
    let out = ing
        .run(&["batches", "--has-failures", "--submitter", "alice"])
        .ok()
        .stdout;
    assert!(
        out.lines()
            .nth(1)
            .is_some_and(|l| l.starts_with("bid0000000001")),
        "{out}"
    );
    let out = ing.run(&["batches", "--has-failures", "false"]).ok().stdout;
    assert!(out.contains("0 of 0 shown"), "{out}");

    let head = ing.head();
    for (args, named) in [
        (&["jobs", "--state", "exploded"][..], "--state"),
        (&["jobs", "--limit", "0"][..], "--limit"),
        (&["jobs", "--collection", ""][..], "--collection"),
        (
            &["batches", "--modified-since", "last week"][..],
            "--modified-since",
        ),
    ] {
        let run = ing.run(args);
        assert_eq!(run.code, 2, "{args:?}: {}", run.stderr);
        assert!(run.stderr.contains(named), "{args:?}: {}", run.stderr);
    }
    let run = ing.run(&["jobs", "--cursor", "00"]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert_eq!(ing.head(), head, "a listing appended something");
}

/// `--format table` is a table for `status` and `show` (it printed YAML).
#[test]
fn format_table_prints_tables_for_status_and_show() {
    let ing = Ingest::new();
    submit_three(&ing);
    ing.run(&["batch", "bid0000000001", "acquire"]).ok();
    let status = ing.run(&["status", "--format", "table"]).ok().stdout;
    assert!(status.starts_with("FIELD "), "{status}");
    assert!(
        status
            .lines()
            .any(|l| l.starts_with("jobs_by_state.Pending ") && l.ends_with(" 3")),
        "{status}"
    );
    let batch = ing
        .run(&["show", "batch", "bid0000000001", "--format", "table"])
        .ok()
        .stdout;
    assert!(batch.contains("\njobs:\nJID "), "{batch}");
    assert_eq!(
        batch
            .lines()
            .filter(|l| l.starts_with("jid00000000"))
            .count(),
        3,
        "{batch}"
    );
    let job = ing
        .run(&["show", "job", "jid0000000001", "--format", "table"])
        .ok()
        .stdout;
    assert!(
        job.lines()
            .any(|l| l.starts_with("status ") && l.ends_with(" Pending")),
        "{job}"
    );
}

/// Shell completions and the manual page come from the clap grammar, so
/// they name every command (before, neither existed).
#[test]
fn completions_and_the_man_page_are_generated_from_the_grammar() {
    let ing = Ingest::new();
    let bash = ing.run(&["completions", "bash"]).ok().stdout;
    assert!(bash.contains("_ingest()"), "{bash}");
    for word in ["batches", "jobs", "submit", "--modified-since"] {
        assert!(bash.contains(word), "bash completion lacks {word}");
    }
    let zsh = ing.run(&["completions", "zsh"]).ok().stdout;
    assert!(zsh.starts_with("#compdef ingest"), "{zsh}");
    let man = ing.run(&["man"]).ok().stdout;
    assert!(
        man.starts_with(".ie") || man.contains(".TH ingest"),
        "{man}"
    );
    assert!(man.contains("batches"), "the man page lists the commands");
    let run = ing.run(&["completions", "cmd.exe"]);
    assert_eq!(run.code, 2, "{}", run.stderr);
}

/// `ingest batch BID show` and `ingest job JID history` are the NOUN ID VERB
/// forms of `show` and `history`, with the same output.
#[test]
fn noun_id_verb_forms_of_show_and_history_print_the_same() {
    let ing = Ingest::new();
    submit_three(&ing);
    ing.run(&["batch", "bid0000000001", "acquire"]).ok();
    for (old, new) in [
        (
            &["show", "batch", "bid0000000001", "--format", "json"][..],
            &["batch", "bid0000000001", "show", "--format", "json"][..],
        ),
        (
            &["show", "job", "jid0000000002"][..],
            &["job", "jid0000000002", "show"][..],
        ),
        (
            &["history", "--batch", "bid0000000001"][..],
            &["batch", "bid0000000001", "history"][..],
        ),
        (
            &["history", "--job", "jid0000000001", "--format", "yaml"][..],
            &["job", "jid0000000001", "history", "--format", "yaml"][..],
        ),
    ] {
        assert_eq!(
            ing.run(old).ok().stdout,
            ing.run(new).ok().stdout,
            "{new:?}"
        );
    }
}

/// `ingest access list` prints a table as `ingest batches` and `ingest
/// jobs` do (it printed YAML), and still gives JSON when asked.
#[test]
fn access_list_prints_a_table_like_the_other_listings() {
    let ing = Ingest::new();
    crate::server::seed_objects_at(
        ing.data_dir(),
        "demo",
        &[("ark:/99999/fk4tabled", 1, &[1234])],
    );
    ing.run(&["access", "request", "--ark", "ark:/99999/fk4tabled"])
        .ok();
    let out = ing.run(&["access", "list"]).ok().stdout;
    let lines: Vec<&str> = out.lines().collect();
    let header: Vec<&str> = lines[0].split_whitespace().collect();
    assert_eq!(
        header,
        [
            "QID", "QUEUE", "STATUS", "ARK", "VERSION", "FORMAT", "BYTES", "PROGRESS", "CONTENT",
            "TARGET", "EXPIRES", "URL", "REQUEUES", "MODIFIED", "MESSAGE"
        ],
        "{out}"
    );
    let row: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(
        row[..8],
        [
            "qid0000000001",
            "small",
            "Pending",
            "ark:/99999/fk4tabled",
            "1",
            "zip",
            "1234",
            "producer"
        ],
        "{out}"
    );
    assert_eq!(lines.last().copied(), Some("1 requests"), "{out}");
    let json = ing.run(&["access", "list", "--format", "json"]).ok().stdout;
    let list: serde_json::Value = serde_json::from_str(&json).expect("json");
    assert_eq!(list["items"][0]["qid"], "qid0000000001", "{json}");
}
