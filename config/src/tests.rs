//! Tests of loading and layering the configuration.

use super::*;
use ingest_events::JobState;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

const ADMIN: &str = "admin-token-0123456789";
const DEPOSITOR: &str = "depositor-token-0123456789";
const WORKER: &str = "worker-token-0123456789";

fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let map: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |k| map.get(k).cloned()
}

fn token_env() -> impl Fn(&str) -> Option<String> {
    env_of(&[
        ("INGEST_ADMIN_TOKEN", ADMIN),
        ("INGEST_DEPOSITOR_TOKEN", DEPOSITOR),
        ("INGEST_WORKER_TOKEN", WORKER),
    ])
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).expect("write");
    p
}

fn err_text(r: Result<ServeConfig, ConfigError>) -> String {
    match r {
        Ok(c) => panic!("expected an error, got {c:?}"),
        Err(e) => e.to_string(),
    }
}

/// A directory laid out like the example files, so they load as written
/// (apart from their absolute paths, which are rewritten into it).
fn example_dir(ext: &str, text: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    std::fs::create_dir_all(root.join("etc/ingest/profiles")).expect("mkdir");
    std::fs::create_dir_all(root.join("etc/ingest/tokens")).expect("mkdir");
    write(
        &root.join("etc/ingest/profiles"),
        "demo.yaml",
        EXAMPLE_PROFILE,
    );
    write(
        &root.join("etc/ingest"),
        "states.yml",
        ingest_events::lifecycle::BUILTIN_STATES_YML,
    );
    for (role, t) in [
        ("admin", ADMIN),
        ("depositor", DEPOSITOR),
        ("worker", WORKER),
    ] {
        write(&root.join("etc/ingest/tokens"), role, &format!("{t}\n"));
    }
    let text = text.replace(
        "/etc/ingest",
        &root.join("etc/ingest").display().to_string(),
    );
    let path = write(root, &format!("serve.{ext}"), &text);
    (dir, path)
}

#[test]
fn the_example_files_load_and_agree() {
    let mut loaded = Vec::new();
    for (ext, text) in [("yaml", EXAMPLE_YAML), ("toml", EXAMPLE_TOML)] {
        let (dir, path) = example_dir(ext, text);
        let args = ServeArgs {
            config: Some(path),
            ..ServeArgs::default()
        };
        let c = ServeConfig::load_with_env(&args, &GlobalOverrides::default(), &env_of(&[]))
            .unwrap_or_else(|e| panic!("{ext}: {e}"));
        assert_eq!(c.listen.to_string(), "127.0.0.1:7878");
        assert_eq!(c.data_dir, PathBuf::from("/var/lib/ingest"));
        assert_eq!(c.log_format, LogFormat::Json);
        assert_eq!(
            c.tokens.admin.expose(),
            ADMIN,
            "the trailing newline is dropped"
        );
        assert!(c.tokens.metrics.is_none());
        assert_eq!(
            c.zookeeper.hosts.as_deref(),
            Some("zk1:2181,zk2:2181,zk3:2181")
        );
        assert_eq!(c.zookeeper.session_timeout, Duration::from_secs(6));
        assert_eq!(
            c.daemons.get(DaemonKind::Downloading),
            DaemonSettings {
                enabled: true,
                tasks: 4
            }
        );
        assert!(!c.daemons.get(DaemonKind::Recording).enabled);
        assert_eq!(c.provisioning.threshold_percent, 70.0);
        assert_eq!(c.provisioning.working_storage, PathBuf::from("/zfs/queue"));
        assert_eq!(c.max_body_bytes, 1024 * 1024);
        assert_eq!(c.header_read_timeout, Duration::from_secs(30));
        assert_eq!(c.max_connections, 1024);
        assert_eq!(c.max_connections_per_client, 512);
        assert_eq!(c.listing_items_per_second, 1_000_000);
        assert!(c.lifecycle().is_ok());
        if ext == "yaml" {
            // The sections that mirror flags, and the worker's view of the
            // same file (every key of the sample is read by someone).
            assert_eq!(c.real.storage_targets.len(), 1);
            assert_eq!(c.steps.steps, Some(StepsKind::None));
            assert_eq!(c.minter.1, "fk4");
            let w = WorkerArgs {
                config: args.config.clone(),
                ..WorkerArgs::default()
            }
            .resolve_with_env(&env_of(&[]))
            .unwrap_or_else(|e| panic!("worker: {e}"));
            assert_eq!(w.name, "worker-1");
            assert_eq!(w.token.expose(), WORKER);
            assert_eq!(w.daemons.len(), 5);
            assert_eq!(w.zk.hosts, "zk1:2181,zk2:2181,zk3:2181");
        }
        let profiles = c.profiles().expect("profiles");
        let demo = profiles
            .check("demo_content")
            .expect("known")
            .expect("settings");
        assert_eq!(demo.priority, Some(10));
        assert!(demo.notification.summary_at_queueing);
        assert!(profiles.check("other").is_err());
        loaded.push(format!(
            "{:?}",
            (
                c.listen,
                c.daemons,
                c.provisioning,
                c.max_body_bytes,
                c.header_read_timeout,
                c.max_connections
            )
        ));
        drop(dir);
    }
    assert_eq!(loaded[0], loaded[1], "YAML and TOML examples say the same");
}

#[test]
fn defaults_need_only_the_tokens() {
    let c = ServeConfig::load_with_env(
        &ServeArgs::default(),
        &GlobalOverrides::default(),
        &token_env(),
    )
    .expect("load");
    assert_eq!(c.listen.to_string(), DEFAULT_LISTEN);
    assert_eq!(c.data_dir, PathBuf::from(DEFAULT_DATA_DIR));
    assert_eq!(c.provisioning.threshold_percent, 70.0);
    assert_eq!(
        c.provisioning.working_storage,
        PathBuf::from(DEFAULT_DATA_DIR).join("work")
    );
    assert_eq!(c.zookeeper.root, "/");
    assert!(c.zookeeper.hosts.is_none());
    assert!(c
        .daemons
        .iter()
        .all(|(_, s)| s == DaemonSettings::default()));
    assert!(!c.profiles().expect("profiles").is_restricted());
}

#[test]
fn file_then_env_then_flags() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = write(
        dir.path(),
        "serve.yaml",
        "listen: 127.0.0.1:1000\ndata_dir: data\ndaemons:\n  estimating: {tasks: 3}\n  notify: {enabled: false}\nprovisioning: {threshold_percent: \"80%\"}\n",
    );
    let file_only = ServeArgs {
        config: Some(path.clone()),
        ..ServeArgs::default()
    };
    let c = ServeConfig::load_with_env(&file_only, &GlobalOverrides::default(), &token_env())
        .expect("load");
    assert_eq!(c.listen.port(), 1000);
    assert_eq!(c.data_dir, dir.path().join("data"), "relative to the file");
    assert_eq!(c.daemons.get(DaemonKind::Estimating).tasks, 3);
    assert!(!c.daemons.get(DaemonKind::Notify).enabled);
    assert_eq!(c.provisioning.threshold_percent, 80.0);

    // INGEST_DAEMONS overrides the file per daemon; --daemon overrides both.
    let env = env_of(&[
        ("INGEST_ADMIN_TOKEN", ADMIN),
        ("INGEST_DEPOSITOR_TOKEN", DEPOSITOR),
        ("INGEST_WORKER_TOKEN", WORKER),
        ("INGEST_DAEMONS", "estimating=5, notify=on ,downloading=off"),
    ]);
    let over = ServeArgs {
        config: Some(path),
        listen: Some("0.0.0.0:2000".into()),
        daemons: vec!["downloading=7".into()],
        provisioning_threshold: Some("65".into()),
        ..ServeArgs::default()
    };
    let globals = GlobalOverrides {
        data_dir: Some("/elsewhere".into()),
        log_format: Some(LogFormat::Json),
        lifecycle: None,
    };
    let c = ServeConfig::load_with_env(&over, &globals, &env).expect("load");
    assert_eq!(c.listen.port(), 2000);
    assert_eq!(c.data_dir, PathBuf::from("/elsewhere"));
    assert_eq!(c.log_format, LogFormat::Json);
    assert_eq!(c.daemons.get(DaemonKind::Estimating).tasks, 5);
    assert!(c.daemons.get(DaemonKind::Notify).enabled);
    assert_eq!(
        c.daemons.get(DaemonKind::Downloading),
        DaemonSettings {
            enabled: true,
            tasks: 7
        }
    );
    assert_eq!(c.provisioning.threshold_percent, 65.0);
}

// Each flag reads its INGEST_* variable (checked on the clap command, so
// no test has to change the process environment).
#[test]
fn flags_and_their_variables() {
    use clap::{CommandFactory, Parser};
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        serve: ServeArgs,
    }
    let cmd = Cli::command();
    let env_of = |long: &str| {
        cmd.get_arguments()
            .find(|a| a.get_long() == Some(long))
            .and_then(|a| a.get_env())
            .map(|e| e.to_string_lossy().into_owned())
    };
    for (long, env) in [
        ("config", "INGEST_CONFIG"),
        ("listen", "INGEST_LISTEN"),
        ("profiles-dir", "INGEST_PROFILES_DIR"),
        ("admin-token-file", "INGEST_ADMIN_TOKEN_FILE"),
        ("depositor-token-file", "INGEST_DEPOSITOR_TOKEN_FILE"),
        ("worker-token-file", "INGEST_WORKER_TOKEN_FILE"),
        ("metrics-token-file", "INGEST_METRICS_TOKEN_FILE"),
        ("zk", "INGEST_ZK"),
        ("zk-root", "INGEST_ZK_ROOT"),
        ("zk-session-timeout", "INGEST_ZK_SESSION_TIMEOUT"),
        ("provisioning-threshold", "INGEST_PROVISIONING_THRESHOLD"),
        ("working-storage", "INGEST_WORKING_STORAGE"),
        ("max-body-bytes", "INGEST_MAX_BODY_BYTES"),
        ("header-read-timeout", "INGEST_HEADER_READ_TIMEOUT"),
        ("max-connections", "INGEST_MAX_CONNECTIONS"),
        (
            "max-connections-per-client",
            "INGEST_MAX_CONNECTIONS_PER_CLIENT",
        ),
    ] {
        assert_eq!(env_of(long).as_deref(), Some(env), "--{long}");
    }
    // Token values and the daemon list are read by `load`, not by clap.
    assert_eq!(env_of("daemon"), None);
    let args = Cli::try_parse_from([
        "serve",
        "--listen",
        "127.0.0.1:4000",
        "--daemon",
        "notify=off",
        "--daemon",
        "estimating=3",
    ])
    .expect("parse")
    .serve;
    assert_eq!(args.listen.as_deref(), Some("127.0.0.1:4000"));
    assert_eq!(args.daemons, ["notify=off", "estimating=3"]);
}

#[test]
fn errors_name_the_file_and_the_field() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cases: &[(&str, &str, &[&str])] = &[
        (
            "bad-listen.yaml",
            "listen: nowhere\n",
            &["bad-listen.yaml", "`listen`", "nowhere"],
        ),
        ("typo.yaml", "lisen: 127.0.0.1:1\n", &["typo.yaml", "lisen"]),
        (
            "daemon.yaml",
            "daemons:\n  estimator: {tasks: 1}\n",
            &["daemon.yaml", "daemons.estimator"],
        ),
        (
            "tasks.toml",
            "[daemons.notify]\ntasks = 0\n",
            &["tasks.toml", "daemons.notify.tasks"],
        ),
        (
            "zk.yaml",
            "zookeeper: {hosts: \"zk1\"}\n",
            &["zk.yaml", "zookeeper.hosts"],
        ),
        (
            "root.yaml",
            "zookeeper: {root: \"ingest\"}\n",
            &["root.yaml", "zookeeper.root"],
        ),
        (
            "pct.yaml",
            "provisioning: {threshold_percent: 170}\n",
            &["pct.yaml", "provisioning.threshold_percent"],
        ),
        ("fmt.yaml", "log_format: xml\n", &["fmt.yaml", "log_format"]),
        (
            "body.yaml",
            "http: {max_body_bytes: 10}\n",
            &["body.yaml", "http.max_body_bytes"],
        ),
        (
            "hdr.yaml",
            "http: {header_read_timeout_secs: 0}\n",
            &["hdr.yaml", "http.header_read_timeout_secs"],
        ),
        (
            "conns.yaml",
            "http: {max_connections: 0}\n",
            &["conns.yaml", "http.max_connections"],
        ),
        (
            "prof.yaml",
            "profiles_dir: missing\n",
            &["prof.yaml", "profiles_dir"],
        ),
        (
            "states.yaml",
            "lifecycle: missing.yml\n",
            &["states.yaml", "lifecycle"],
        ),
        ("ext.json", "{}", &["ext.json", ".toml"]),
        ("broken.toml", "listen = \n", &["broken.toml"]),
    ];
    for (name, text, needles) in cases {
        let path = write(dir.path(), name, text);
        let args = ServeArgs {
            config: Some(path),
            ..ServeArgs::default()
        };
        let e = err_text(ServeConfig::load_with_env(
            &args,
            &GlobalOverrides::default(),
            &token_env(),
        ));
        for n in *needles {
            assert!(e.contains(n), "{name}: {e:?} should mention {n:?}");
        }
    }
    // The file's token file is read only when no variable or flag overrides it.
    let path = write(dir.path(), "tok.yaml", "tokens: {admin_file: missing}\n");
    let args = ServeArgs {
        config: Some(path),
        ..ServeArgs::default()
    };
    let no_admin = env_of(&[
        ("INGEST_DEPOSITOR_TOKEN", DEPOSITOR),
        ("INGEST_WORKER_TOKEN", WORKER),
    ]);
    let e = err_text(ServeConfig::load_with_env(
        &args,
        &GlobalOverrides::default(),
        &no_admin,
    ));
    assert!(
        e.contains("admin token file") && e.contains("missing"),
        "{e}"
    );
    let flag = ServeArgs {
        listen: Some("::1".into()),
        ..ServeArgs::default()
    };
    let e = err_text(ServeConfig::load_with_env(
        &flag,
        &GlobalOverrides::default(),
        &token_env(),
    ));
    assert!(
        e.contains("--listen or INGEST_LISTEN") && e.contains("`listen`"),
        "{e}"
    );
    let daemon = ServeArgs {
        daemons: vec!["nosuch=on".into()],
        ..ServeArgs::default()
    };
    let e = err_text(ServeConfig::load_with_env(
        &daemon,
        &GlobalOverrides::default(),
        &token_env(),
    ));
    assert!(e.contains("--daemon") && e.contains("nosuch"), "{e}");
}

#[test]
fn tokens_are_required_distinct_and_never_printed() {
    let e = err_text(ServeConfig::load_with_env(
        &ServeArgs::default(),
        &GlobalOverrides::default(),
        &env_of(&[
            ("INGEST_ADMIN_TOKEN", ADMIN),
            ("INGEST_DEPOSITOR_TOKEN", DEPOSITOR),
        ]),
    ));
    assert!(
        e.contains("no worker token") && e.contains("INGEST_WORKER_TOKEN"),
        "{e}"
    );

    let same = env_of(&[
        ("INGEST_ADMIN_TOKEN", ADMIN),
        ("INGEST_DEPOSITOR_TOKEN", ADMIN),
        ("INGEST_WORKER_TOKEN", WORKER),
    ]);
    let e = err_text(ServeConfig::load_with_env(
        &ServeArgs::default(),
        &GlobalOverrides::default(),
        &same,
    ));
    assert!(e.contains("admin and depositor tokens are the same"), "{e}");
    assert!(!e.contains(ADMIN), "the message must not contain the token");

    let short = env_of(&[
        ("INGEST_ADMIN_TOKEN", "short"),
        ("INGEST_DEPOSITOR_TOKEN", DEPOSITOR),
        ("INGEST_WORKER_TOKEN", WORKER),
    ]);
    let e = err_text(ServeConfig::load_with_env(
        &ServeArgs::default(),
        &GlobalOverrides::default(),
        &short,
    ));
    assert!(
        e.contains("INGEST_ADMIN_TOKEN") && e.contains("shorter"),
        "{e}"
    );
    assert!(!e.contains("short\""), "{e}");

    // A token file named by flag wins over the variable.
    let dir = tempfile::tempdir().expect("tempdir");
    let file = write(dir.path(), "admin", "file-admin-token-0123456789\n");
    let args = ServeArgs {
        admin_token_file: Some(file),
        ..ServeArgs::default()
    };
    let c =
        ServeConfig::load_with_env(&args, &GlobalOverrides::default(), &token_env()).expect("load");
    assert_eq!(c.tokens.admin.expose(), "file-admin-token-0123456789");
    let printed = format!("{c:?}");
    for t in ["file-admin-token-0123456789", DEPOSITOR, WORKER] {
        assert!(!printed.contains(t), "Debug printed a token: {printed}");
    }
}

#[test]
fn constant_time_comparison() {
    let s = Secret::new("abcdefghijklmnop");
    assert!(s.matches(b"abcdefghijklmnop"));
    assert!(!s.matches(b"abcdefghijklmnoq"));
    assert!(!s.matches(b"abcdefghijklmno"));
    assert!(!s.matches(b"abcdefghijklmnopq"));
    assert!(!s.matches(b""));
    assert!(constant_time_eq(b"", b""));
}

#[test]
fn profiles_load_and_report_bad_files() {
    let dir = tempfile::tempdir().expect("tempdir");
    write(dir.path(), "demo.yaml", EXAMPLE_PROFILE);
    write(dir.path(), "plain.yml", "name: plain\n");
    write(dir.path(), "README.txt", "not a profile");
    write(dir.path(), ".hidden.yaml", "garbage: [");
    let p = Profiles::load(dir.path()).expect("load");
    assert_eq!(p.len(), 2);
    assert_eq!(p.get("plain").map(|p| p.priority), Some(None));
    assert!(matches!(p.check("nope"), Err(UnknownProfile { .. })));

    let cases: &[(&str, &str, &str)] = &[
        ("prio.yaml", "name: x\npriority: 120\n", "priority"),
        (
            "url.yaml",
            "name: x\nnotification: {callback_url: \"ftp://a\"}\n",
            "notification.callback_url",
        ),
        (
            "mail.yaml",
            "name: x\nnotification: {emails: [nobody]}\n",
            "notification.emails",
        ),
        ("name.yaml", "name: \"a/b\"\n", "name"),
        ("typo.yaml", "name: x\nprority: 1\n", "prority"),
        ("hold.yaml", "name: x\nheld: true\n", "held"),
    ];
    for (file, text, field) in cases {
        let bad = tempfile::tempdir().expect("tempdir");
        write(bad.path(), file, text);
        let e = Profiles::load(bad.path()).expect_err(file).to_string();
        assert!(e.contains(file) && e.contains(field), "{file}: {e}");
    }

    let dup = tempfile::tempdir().expect("tempdir");
    write(dup.path(), "a.yaml", "name: same\n");
    write(dup.path(), "b.yaml", "name: same\n");
    let e = Profiles::load(dup.path())
        .expect_err("duplicate")
        .to_string();
    assert!(e.contains("a.yaml") && e.contains("b.yaml"), "{e}");

    let empty = tempfile::tempdir().expect("tempdir");
    let e = Profiles::load(empty.path()).expect_err("empty").to_string();
    assert!(e.contains("holds no profile"), "{e}");
}

#[test]
fn daemon_names_and_states() {
    for d in DaemonKind::ALL {
        assert_eq!(DaemonKind::from_name(d.name()), Some(d));
    }
    assert_eq!(
        DaemonKind::from_name("Batch-Update-Reporting"),
        Some(DaemonKind::BatchUpdateReporting)
    );
    assert_eq!(
        DaemonKind::for_job_state(JobState::Storing),
        Some(DaemonKind::Storing)
    );
    assert_eq!(DaemonKind::for_job_state(JobState::Held), None);
    assert!(
        parse_daemon_setting("notify=0").is_ok(),
        "0 is caught by validation, with a hint"
    );
    // One grammar for serve and worker: a bare name is NAME=on, a job
    // state names its daemon.
    let (kind, settings) = parse_daemon("notify").expect("bare name");
    assert_eq!((kind, settings.enabled), (DaemonKind::Notify, true));
    let (kind, settings) = parse_daemon("Downloading=3").expect("state name");
    assert_eq!((kind, settings.tasks), (DaemonKind::Downloading, 3));
    assert!(!parse_daemon("recording=off").expect("off").1.enabled);
    assert!(parse_daemon("notify=0").is_err());
    assert!(parse_daemon("nope").is_err());
    assert!(parse_daemon_setting("notify=lots").is_err());
}

mod sections {

    use super::*;
    use std::path::Path;

    const TOKENS: [(&str, &str); 3] = [
        ("INGEST_ADMIN_TOKEN", "admin-token-0123456789"),
        ("INGEST_DEPOSITOR_TOKEN", "depositor-token-0123456789"),
        ("INGEST_WORKER_TOKEN", "worker-token-0123456789"),
    ];

    fn env(k: &str) -> Option<String> {
        TOKENS
            .iter()
            .find(|(n, _)| *n == k)
            .map(|(_, v)| v.to_string())
    }

    fn load(dir: &Path, text: &str, args: ServeArgs) -> Result<ServeConfig, ConfigError> {
        let path = dir.join("serve.yaml");
        std::fs::write(&path, text).expect("write");
        let args = ServeArgs {
            config: Some(path),
            ..args
        };
        ServeConfig::load_with_env(&args, &GlobalOverrides::default(), &env)
    }

    /// Regression: the file refused `storage_targets`, the signing key, the
    /// steps, NAAN and shoulder although the README said every option can
    /// come from it.
    #[test]
    fn the_file_sets_the_real_steps_the_steps_and_the_ids() {
        let dir = tempfile::tempdir().expect("tempdir");
        let text = "steps:\n  steps: real\n  step_ms: 5\nreal_steps:\n  storage_targets: [primary=/srv/ocfl]\n  signing_key: keys/sign.pem\n  step_retries: 7\nids:\n  naan: \"13030\"\n  shoulder: m5\n";
        let c = load(dir.path(), text, ServeArgs::default()).expect("loads");
        assert_eq!(c.steps.steps, Some(StepsKind::Real));
        assert_eq!(c.steps.step_ms, Some(5));
        assert_eq!(c.real.storage_targets, ["primary=/srv/ocfl"]);
        assert_eq!(c.real.step_retries, 7);
        // A relative path in the file is relative to the file.
        assert_eq!(c.real.signing_key, Some(dir.path().join("keys/sign.pem")));
        assert_eq!(c.minter, ("13030".to_string(), "m5".to_string()));
    }

    // Issue 23: adoption mode is off unless asked for, from the file or a flag.
    #[test]
    fn foreign_writes_are_reverted_unless_adoption_is_asked_for() {
        let dir = tempfile::tempdir().expect("tempdir");
        let c = load(dir.path(), "", ServeArgs::default()).expect("loads");
        assert_eq!(c.foreign_writes, ForeignWrites::Revert);
        let text = "zookeeper:\n  foreign_writes: adopt\n";
        let c = load(dir.path(), text, ServeArgs::default()).expect("loads");
        assert_eq!(c.foreign_writes, ForeignWrites::Adopt);
        let args = ServeArgs {
            foreign_writes: Some(ForeignWrites::Revert),
            ..ServeArgs::default()
        };
        let c = load(dir.path(), text, args).expect("loads");
        assert_eq!(c.foreign_writes, ForeignWrites::Revert, "the flag wins");
        let err = load(
            dir.path(),
            "zookeeper:\n  foreign_writes: merge\n",
            ServeArgs::default(),
        )
        .expect_err("unknown mode");
        assert!(err.to_string().contains("foreign_writes"), "{err}");
    }

    #[test]
    fn the_file_sets_snapshots_and_checkpoints_and_a_flag_wins() {
        let dir = tempfile::tempdir().expect("tempdir");
        let text = "archive:\n  snapshot_every_events: 5000\n  snapshots_keep: 3\n  checkpoint_key: keys/cp.pem\n  checkpoint_every_secs: 0\n";
        let c = load(dir.path(), text, ServeArgs::default()).expect("loads");
        assert_eq!(c.archive.snapshot_every_events, 5000);
        assert_eq!(c.archive.snapshots_keep, 3);
        assert_eq!(c.archive.checkpoint_every_secs, 0);
        assert_eq!(c.archive.checkpoint_every_events, 10_000, "the default");
        assert_eq!(
            c.archive.checkpoint_key,
            Some(dir.path().join("keys/cp.pem"))
        );

        let mut args = ServeArgs::default();
        args.archive.snapshot_every_events = 7;
        args.given = ["snapshot_every_events".to_string()].into();
        let c = load(dir.path(), text, args).expect("loads");
        assert_eq!(c.archive.snapshot_every_events, 7);

        let c = load(
            dir.path(),
            "archive:\n  log_compression: 5\n",
            ServeArgs::default(),
        )
        .expect("loads");
        assert_eq!(c.archive.log_compression, 5);
        assert_eq!(
            load(dir.path(), "", ServeArgs::default())
                .expect("loads")
                .archive
                .log_compression,
            0,
            "new logs are not compressed by default"
        );
        let err = load(
            dir.path(),
            "archive:\n  log_compression: 23\n",
            ServeArgs::default(),
        )
        .expect_err("level 23");
        assert!(err.to_string().contains("archive.log_compression"), "{err}");
        let err = load(
            dir.path(),
            "archive:\n  snapshots_keep: 0\n",
            ServeArgs::default(),
        )
        .expect_err("keep 0");
        assert!(err.to_string().contains("snapshots_keep"), "{err}");
        let err = load(
            dir.path(),
            "archive:\n  snapshot_every: 5\n",
            ServeArgs::default(),
        )
        .expect_err("unknown key");
        assert!(err.to_string().contains("snapshot_every"), "{err}");
    }

    #[test]
    fn a_flag_or_variable_wins_over_the_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut args = ServeArgs::default();
        args.ids.naan = "99999".into();
        args.real.step_retries = 2;
        args.given = ["naan".to_string(), "step_retries".to_string()].into();
        let text = "real_steps:\n  step_retries: 7\n  transfers: 3\nids:\n  naan: \"13030\"\n";
        let c = load(dir.path(), text, args).expect("loads");
        assert_eq!(c.minter.0, "99999");
        assert_eq!(c.real.step_retries, 2);
        assert_eq!(c.real.transfers, 3);

        let args = ServeArgs {
            max_connections: Some(20),
            ..ServeArgs::default()
        };
        let text = "http:\n  max_connections: 10\n  header_read_timeout_secs: 5\n";
        let c = load(dir.path(), text, args).expect("loads");
        assert_eq!(c.max_connections, 20);
        assert_eq!(c.header_read_timeout, Duration::from_secs(5));
    }

    #[test]
    fn the_outbound_rules_and_transfer_limits_come_from_the_file_and_bad_rules_are_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let text = "real_steps:\n  allow_hosts: [repo.internal]\n  allow_networks: [10.1.0.0/16, \"fd00::/8\"]\n  min_transfer_rate: 4096\n  transfer_rate_window_secs: 30\n  download_deadline_secs: 600\n";
        let c = load(dir.path(), text, ServeArgs::default()).expect("loads");
        assert_eq!(c.real.allow_hosts, ["repo.internal"]);
        assert_eq!(c.real.allow_networks, ["10.1.0.0/16", "fd00::/8"]);
        assert_eq!(c.real.min_transfer_rate, 4096);
        assert_eq!(c.real.transfer_rate_window_secs, 30);
        assert_eq!(c.real.download_deadline_secs, 600);
        let policy = c.real.outbound_policy().expect("policy");
        assert!(policy.check_url("http://10.1.2.3/x").is_ok());
        assert!(policy.check_url("http://10.2.0.1/x").is_err());
        let mut args = ServeArgs::default();
        args.real.allow_networks = vec!["127.0.0.0/8".into()];
        args.given = ["allow_networks".to_string()].into();
        let c = load(dir.path(), text, args).expect("loads");
        assert_eq!(c.real.allow_networks, ["127.0.0.0/8"]);
        let e = load(
            dir.path(),
            "real_steps:\n  allow_networks: [10.0.0.0/33]\n",
            ServeArgs::default(),
        )
        .expect_err("bad network")
        .to_string();
        assert!(e.contains("allow_networks"), "{e}");
        assert!(e.contains("10.0.0.0/33"), "{e}");
    }

    #[test]
    fn unknown_and_ill_typed_section_keys_are_refused_with_file_line_and_key() {
        let dir = tempfile::tempdir().expect("tempdir");
        let e = load(
            dir.path(),
            "listen: 127.0.0.1:7878\nreal_steps:\n  file_root: /srv\n  storage_target: x=/y\n",
            ServeArgs::default(),
        )
        .expect_err("unknown key")
        .to_string();
        assert!(e.contains("serve.yaml"), "{e}");
        assert!(e.contains("real_steps.storage_target"), "{e}");
        assert!(e.contains("line 4"), "{e}");
        let e = load(
            dir.path(),
            "real_steps:\n  step_retries: many\n",
            ServeArgs::default(),
        )
        .expect_err("ill-typed")
        .to_string();
        assert!(e.contains("real_steps.step_retries"), "{e}");
        assert!(e.contains("line 2"), "{e}");
    }
}

mod worker {
    use crate::*;

    fn env(k: &str) -> Option<String> {
        (k == "INGEST_WORKER_TOKEN").then(|| "worker-token-0123456789".to_string())
    }

    fn args(daemons: &[&str]) -> WorkerArgs {
        WorkerArgs {
            engine: "http://127.0.0.1:7878".into(),
            zookeeper: ZkArgs {
                zk: Some("127.0.0.1:2181".into()),
                ..ZkArgs::default()
            },
            daemons: daemons.iter().map(|d| d.to_string()).collect(),
            ..WorkerArgs::default()
        }
    }

    #[test]
    fn daemons_take_the_serve_grammar() {
        let c = args(&["downloading", "Processing=3", "batch_pending", "notify=off"])
            .resolve_with_env(&env)
            .expect("resolves");
        assert_eq!(
            c.daemons,
            [
                (DaemonKind::Downloading, 1),
                (DaemonKind::Processing, 3),
                (DaemonKind::BatchPending, 1)
            ]
        );
        for bad in [&["nope"][..], &["notify=0"], &["notify=off"]] {
            let e = args(bad).resolve_with_env(&env).expect_err("refused");
            assert!(e.to_string().contains("worker.daemons"), "{e}");
        }
        // D12: none named runs every daemon with one task (it refused).
        let c = args(&[]).resolve_with_env(&env).expect("resolves");
        assert_eq!(c.daemons.len(), DaemonKind::ALL.len());
        assert!(c.daemons.iter().all(|(_, tasks)| *tasks == 1));
    }

    /// Regression: `ingest worker` had no configuration file at all.
    #[test]
    fn the_worker_reads_the_serve_file_and_flags_win() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("worker-token"), "file-token-0123456789\n").expect("write");
        let path = dir.path().join("ingest.yaml");
        std::fs::write(
            &path,
            "zookeeper:\n  hosts: zk1:2181\n  root: /merritt\nprovisioning:\n  threshold_percent: 80\n  working_storage: work\nworker:\n  name: w1\n  daemons: [downloading=2, storing]\n  token_file: worker-token\nsteps:\n  steps: real\nreal_steps:\n  step_retries: 9\n",
        )
        .expect("write");
        let mut a = WorkerArgs {
            config: Some(path),
            ..WorkerArgs::default()
        };
        let c = a.resolve_with_env(&|_| None).expect("resolves");
        assert_eq!(c.zk.hosts, "zk1:2181");
        assert_eq!(c.zk.root, "/merritt");
        assert_eq!(c.name, "w1");
        assert_eq!(
            c.daemons,
            [(DaemonKind::Downloading, 2), (DaemonKind::Storing, 1)]
        );
        assert_eq!(c.token.expose(), "file-token-0123456789");
        assert_eq!(c.provisioning_threshold, 80.0);
        assert_eq!(c.working_storage, dir.path().join("work"));
        assert_eq!(c.steps.steps, Some(StepsKind::Real));
        assert_eq!(c.real.step_retries, 9);
        // Flags and the environment win, key by key.
        a.zookeeper.zk = Some("zk9:2181".into());
        a.daemons = vec!["notify".into()];
        a.real.step_retries = 1;
        a.given.insert("step_retries".into());
        let c = a
            .resolve_with_env(&|k| {
                (k == "INGEST_WORKER_TOKEN").then(|| "env-token-0123456789".into())
            })
            .expect("resolves");
        assert_eq!(c.zk.hosts, "zk9:2181");
        assert_eq!(c.daemons, [(DaemonKind::Notify, 1)]);
        assert_eq!(c.real.step_retries, 1);
        assert_eq!(c.token.expose(), "env-token-0123456789");
    }

    /// Regression: a flag that is not a configuration key
    /// (`--store-pause-ms`, serde-skipped) was dropped by the layering of
    /// the file under the flags, so a test's worker never paused its
    /// stores and the kill test caught one only by luck.
    #[test]
    fn flags_that_are_not_keys_survive_the_layering() {
        let mut a = args(&[]);
        a.real.store_pause_ms = 1500;
        a.real.assembly_pause_ms = 700;
        let c = a.resolve_with_env(&env).expect("resolves");
        assert_eq!(c.real.store_pause_ms, 1500);
        assert_eq!(c.real.assembly_pause_ms, 700);
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("ingest.yaml");
        std::fs::write(&path, "real_steps:\n  step_retries: 9\n").expect("write");
        a.config = Some(path.clone());
        let c = a.resolve_with_env(&env).expect("resolves");
        assert_eq!((c.real.store_pause_ms, c.real.step_retries), (1500, 9));
        let serve = ServeArgs {
            config: Some(path),
            real: RealArgs {
                store_pause_ms: 1500,
                ..RealArgs::default()
            },
            ..ServeArgs::default()
        };
        let c =
            ServeConfig::load_with_env(&serve, &GlobalOverrides::default(), &super::token_env())
                .expect("loads");
        assert_eq!((c.real.store_pause_ms, c.real.step_retries), (1500, 9));
    }

    // `--metrics-listen` comes from the file's worker section or the flag,
    // and a bad address is refused naming the key.
    #[test]
    fn the_worker_metrics_address_is_layered_and_checked() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("ingest.yaml");
        std::fs::write(
            &path,
            "zookeeper:\n  hosts: zk1:2181\nworker:\n  daemons: [notify]\n  metrics_listen: 127.0.0.1:9187\n",
        )
        .expect("write");
        let token = |k: &str| (k == "INGEST_WORKER_TOKEN").then(|| "env-token-0123456789".into());
        let mut a = WorkerArgs {
            config: Some(path),
            ..WorkerArgs::default()
        };
        let c = a.resolve_with_env(&token).expect("resolves");
        assert_eq!(c.metrics_listen, "127.0.0.1:9187".parse().ok());
        a.metrics_listen = Some("0.0.0.0:9999".into());
        let c = a.resolve_with_env(&token).expect("resolves");
        assert_eq!(c.metrics_listen, "0.0.0.0:9999".parse().ok());
        a.metrics_listen = Some("nowhere".into());
        let e = a.resolve_with_env(&token).expect_err("refused");
        assert!(e.to_string().contains("worker.metrics_listen"), "{e}");
        assert!(e.to_string().contains("--metrics-listen"), "{e}");
    }
}

#[test]
fn admins_and_ui_settings_layer_file_under_flags() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    write(root, "admins", "alice alice-token-0123456789\n");
    write(root, "others", "bob bob-token-0123456789\n");
    let path = write(
        root,
        "serve.yaml",
        "tokens: {admins_file: admins}\nui: {secure_cookies: true, session_idle_secs: 600}\n",
    );
    let file_only = ServeArgs {
        config: Some(path.clone()),
        ..ServeArgs::default()
    };
    let c = ServeConfig::load_with_env(&file_only, &GlobalOverrides::default(), &token_env())
        .expect("load");
    assert_eq!(c.tokens.admins.len(), 1);
    assert_eq!(c.tokens.admins[0].name, "alice");
    assert!(c.ui.secure_cookies);
    assert_eq!(c.ui.session_idle, Duration::from_secs(600));
    assert_eq!(
        c.ui.session_max,
        Duration::from_secs(ui::DEFAULT_UI_SESSION_MAX_SECS)
    );
    let over = ServeArgs {
        config: Some(path.clone()),
        admins_file: Some(root.join("others")),
        ui_secure_cookies: Some(false),
        ui_session_idle_secs: Some(60),
        ..ServeArgs::default()
    };
    let c =
        ServeConfig::load_with_env(&over, &GlobalOverrides::default(), &token_env()).expect("load");
    assert_eq!(c.tokens.admins[0].name, "bob");
    assert!(!c.ui.secure_cookies);
    assert_eq!(c.ui.session_idle, Duration::from_secs(60));
    assert!(!format!("{c:?}").contains("bob-token"), "a token in Debug");

    // An admin's token may not be a role's, and messages never show it.
    write(root, "same", &format!("carol {DEPOSITOR}\n"));
    let same = ServeArgs {
        config: Some(path),
        admins_file: Some(root.join("same")),
        ..ServeArgs::default()
    };
    let e = err_text(ServeConfig::load_with_env(
        &same,
        &GlobalOverrides::default(),
        &token_env(),
    ));
    assert!(e.contains("carol") && !e.contains(DEPOSITOR), "{e}");

    // A depositor's token may be neither a role's nor an admin's.
    for (file, text, shown) in [
        ("dep-role", format!("lib-a {DEPOSITOR} demo\n"), DEPOSITOR),
        (
            "dep-admin",
            "lib-a alice-token-0123456789 demo\n".to_string(),
            "alice-token",
        ),
    ] {
        write(root, file, &text);
        let args = ServeArgs {
            config: Some(root.join("serve.yaml")),
            depositors_file: Some(root.join(file)),
            ..ServeArgs::default()
        };
        let e = err_text(ServeConfig::load_with_env(
            &args,
            &GlobalOverrides::default(),
            &token_env(),
        ));
        assert!(e.contains("lib-a") && !e.contains(shown), "{e}");
    }
    write(root, "deps", "lib-a lib-a-token-0123456789 demo other\n");
    let args = ServeArgs {
        config: Some(root.join("serve.yaml")),
        depositors_file: Some(root.join("deps")),
        ..ServeArgs::default()
    };
    let c =
        ServeConfig::load_with_env(&args, &GlobalOverrides::default(), &token_env()).expect("load");
    assert_eq!(c.tokens.depositors.len(), 1);
    assert_eq!(c.tokens.depositors[0].collections.len(), 2);
}
