//! `ingest serve`'s configuration: its flags ([`ServeArgs`]), the file
//! (YAML or TOML) and the layering file < environment < flags, key by key.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, ValueEnum};
use ingest_events::Lifecycle;
use serde::{Deserialize, Serialize};

use crate::file::*;
use crate::*;

/// A complete configuration file in YAML, listing every key: the file
/// `config/ingest.example.yaml` of the repository.
pub const EXAMPLE_YAML: &str = include_str!("../ingest.example.yaml");

/// The same configuration as [`EXAMPLE_YAML`], in TOML.
pub const EXAMPLE_TOML: &str = r#"# ingest serve configuration. Flags and INGEST_* variables override it.
data_dir = "/var/lib/ingest"
listen = "127.0.0.1:7878"
lifecycle = "/etc/ingest/states.yml"
log_format = "json"
profiles_dir = "/etc/ingest/profiles"

[tokens]
admin_file = "/etc/ingest/tokens/admin"
depositor_file = "/etc/ingest/tokens/depositor"
worker_file = "/etc/ingest/tokens/worker"
# admins_file = "/etc/ingest/tokens/admins"
# depositors_file = "/etc/ingest/tokens/depositors"

[zookeeper]
hosts = "zk1:2181,zk2:2181,zk3:2181"
root = "/"
session_timeout_secs = 6

[daemons]
batch_pending = { enabled = true, tasks = 1 }
batch_reporting = { enabled = true, tasks = 1 }
batch_update_reporting = { enabled = true, tasks = 1 }
job_pending = { enabled = true, tasks = 1 }
estimating = { enabled = true, tasks = 2 }
provisioning = { enabled = true, tasks = 1 }
downloading = { enabled = true, tasks = 4 }
processing = { enabled = true, tasks = 2 }
storing = { enabled = true, tasks = 2 }
recording = { enabled = false }
notify = { enabled = true, tasks = 1 }

[provisioning]
threshold_percent = 70
working_storage = "/zfs/queue"

[http]
max_body_bytes = 1048576
max_record_bytes = 268435456
header_read_timeout_secs = 30
max_connections = 1024
max_connections_per_client = 512
listing_items_per_second = 1000000

[ui]
secure_cookies = false
session_idle_secs = 1800
session_max_secs = 43200
"#;

/// An example collection profile (one file per profile in the profiles directory).
pub const EXAMPLE_PROFILE: &str = r#"name: demo_content
priority: 10                     # optional; overrides the batch-size priority
notification:
  callback_url: https://example.org/ingest-callback   # optional
  emails: [curator@example.org]
  summary_at_queueing: true      # e-mail a summary when the batch's jobs are queued
"#;

/// The flags of `ingest serve`, each also read from its `INGEST_*`
/// environment variable. Unset options fall back to the configuration file,
/// then to the defaults.
///
/// Token values are not flags: set `INGEST_ADMIN_TOKEN`,
/// `INGEST_DEPOSITOR_TOKEN`, `INGEST_WORKER_TOKEN` (and optionally
/// `INGEST_METRICS_TOKEN`), or name files holding them.
#[derive(Debug, Clone, Default, Args)]
pub struct ServeArgs {
    /// A configuration file, YAML (.yaml, .yml) or TOML (.toml); flags and INGEST_* variables override it.
    #[arg(long, env = "INGEST_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// The address to listen on [default: 127.0.0.1:7878].
    #[arg(long, env = "INGEST_LISTEN", value_name = "ADDR")]
    pub listen: Option<String>,
    /// The directory of collection profiles, one YAML file per profile (without it, any profile name is accepted).
    #[arg(long, env = "INGEST_PROFILES_DIR", value_name = "DIR")]
    pub profiles_dir: Option<PathBuf>,
    /// A file holding the admin bearer token (or set INGEST_ADMIN_TOKEN).
    #[arg(long, env = "INGEST_ADMIN_TOKEN_FILE", value_name = "FILE")]
    pub admin_token_file: Option<PathBuf>,
    /// A file holding the depositor bearer token (or set INGEST_DEPOSITOR_TOKEN).
    #[arg(long, env = "INGEST_DEPOSITOR_TOKEN_FILE", value_name = "FILE")]
    pub depositor_token_file: Option<PathBuf>,
    /// A file holding the worker bearer token (or set INGEST_WORKER_TOKEN).
    #[arg(long, env = "INGEST_WORKER_TOKEN_FILE", value_name = "FILE")]
    pub worker_token_file: Option<PathBuf>,
    /// A file holding a token that /metrics then requires (or set INGEST_METRICS_TOKEN); without one, scraping needs no token.
    #[arg(long, env = "INGEST_METRICS_TOKEN_FILE", value_name = "FILE")]
    pub metrics_token_file: Option<PathBuf>,
    /// A file of admins with tokens of their own, one `NAME TOKEN` a line: their actions are recorded as admin:NAME (the shared admin token stays, recorded as admin:admin).
    #[arg(long, env = "INGEST_ADMINS_FILE", value_name = "FILE")]
    pub admins_file: Option<PathBuf>,
    /// A file of depositors with tokens of their own, one `NAME TOKEN COLLECTION…` a line: each sees and submits to its own collections only, recorded as depositor:NAME (the shared depositor token stays and sees every collection).
    #[arg(long, env = "INGEST_DEPOSITORS_FILE", value_name = "FILE")]
    pub depositors_file: Option<PathBuf>,
    /// Mark the admin web UI's session cookie Secure (set it when the server is reached over https) [default: false].
    #[arg(long, env = "INGEST_UI_SECURE_COOKIES", value_name = "BOOL")]
    pub ui_secure_cookies: Option<bool>,
    /// Seconds of inactivity after which an admin web UI session ends [default: 1800].
    #[arg(long, env = "INGEST_UI_SESSION_IDLE_SECS", value_name = "SECONDS")]
    pub ui_session_idle_secs: Option<u64>,
    /// Seconds after login at which an admin web UI session ends, used or not [default: 43200].
    #[arg(long, env = "INGEST_UI_SESSION_MAX_SECS", value_name = "SECONDS")]
    pub ui_session_max_secs: Option<u64>,
    /// Where ZooKeeper is.
    #[command(flatten)]
    pub zookeeper: ZkArgs,
    /// A daemon's switch and concurrency: NAME=off, NAME=on or NAME=TASKS; comma-separated or repeated (`--daemon` is the old spelling; also INGEST_DAEMONS, which these override). Names: batch_pending, batch_reporting, batch_update_reporting, job_pending, estimating, provisioning, downloading, processing, storing, recording, notify.
    #[arg(
        long = "daemons",
        alias = "daemon",
        value_delimiter = ',',
        value_name = "NAME=off|on|TASKS"
    )]
    pub daemons: Vec<String>,
    /// Working-storage use, in percent, above which provisioning holds jobs back [default: 70].
    #[arg(long, env = "INGEST_PROVISIONING_THRESHOLD", value_name = "PERCENT")]
    pub provisioning_threshold: Option<String>,
    /// The working storage jobs download into [default: DATA_DIR/work].
    #[arg(long, env = "INGEST_WORKING_STORAGE", value_name = "DIR")]
    pub working_storage: Option<PathBuf>,
    /// The largest request body the API reads, in bytes [default: 1048576].
    #[arg(long, env = "INGEST_MAX_BODY_BYTES", value_name = "BYTES")]
    pub max_body_bytes: Option<usize>,
    /// The largest inventory record a worker may send (`POST /jobs/JID/object`), in bytes: a version of an object with many files is recorded in one request [default: 268435456, 256 MiB].
    #[arg(long, env = "INGEST_MAX_RECORD_BYTES", value_name = "BYTES")]
    pub max_record_bytes: Option<usize>,
    /// Seconds a client may take to send a request's headers before its connection is closed [default: 30].
    #[arg(long, env = "INGEST_HEADER_READ_TIMEOUT", value_name = "SECONDS")]
    pub header_read_timeout: Option<u64>,
    /// The most connections the API keeps open; further ones are closed at once [default: 1024].
    #[arg(long, env = "INGEST_MAX_CONNECTIONS", value_name = "N")]
    pub max_connections: Option<usize>,
    /// The most connections one client address keeps open (IPv6: one /64), under --max-connections; further ones from it are closed at once, so one client cannot take every connection from workers and probes [default: 512].
    #[arg(long, env = "INGEST_MAX_CONNECTIONS_PER_CLIENT", value_name = "N")]
    pub max_connections_per_client: Option<usize>,
    /// How many batches or jobs one token's listing pages (`GET /batches`, `GET /jobs`) may walk per second, with five seconds' worth as a burst: a first page walks the whole state once to count what matches, a later page only its own length. A token over its budget gets 429 with Retry-After, other tokens are not slowed [default: 1000000].
    #[arg(long, env = "INGEST_LISTING_ITEMS_PER_SECOND", value_name = "N")]
    pub listing_items_per_second: Option<u64>,
    /// Where arks come from.
    #[command(flatten)]
    pub ids: IdArgs,
    /// Which steps the in-process workers run.
    #[command(flatten)]
    pub steps: StepsArgs,
    /// The real steps' options (with --steps real).
    #[command(flatten)]
    pub real: RealArgs,
    /// What the projector does with a job status another ZooKeeper client (a Merritt service through mrt-zk) writes: `revert` puts the log's back and records it; `adopt` turns a legal status change into the same command an API call would be (decided by the engine, recorded with the ZooKeeper client as actor) and reverts an illegal one [default: revert]. See docs/merritt.md.
    #[arg(long, env = "INGEST_FOREIGN_WRITES", value_name = "revert|adopt")]
    pub foreign_writes: Option<ForeignWrites>,
    /// Snapshots and signed checkpoints of the log.
    #[command(flatten)]
    pub archive: crate::ArchiveArgs,
    /// Several engines on one root.
    #[command(flatten)]
    pub replication: crate::ReplicationArgs,
    /// The ids of the options given on the command line or in the
    /// environment (clap's), which the configuration file does not
    /// override; `main` fills it from the parsed matches.
    #[arg(skip)]
    pub given: std::collections::BTreeSet<String>,
}

/// Where arks come from: the NOID minter's NAAN and shoulder, or EZID.
#[derive(Debug, Clone, Default, PartialEq, Args, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct IdArgs {
    /// The Name Assigning Authority Number of minted arks (99999 is the test NAAN).
    #[arg(
        long,
        env = "INGEST_NAAN",
        value_name = "NAAN",
        default_value = "99999"
    )]
    pub naan: String,
    /// The shoulder of minted arks (fk4: a "fake" shoulder for tests and demos).
    #[arg(
        long,
        env = "INGEST_SHOULDER",
        value_name = "SHOULDER",
        default_value = "fk4"
    )]
    pub shoulder: String,
    /// Mint arks through the EZID API at this URL (`https://ezid.cdlib.org`) instead of the built-in NOID minter.
    #[arg(long, env = "INGEST_EZID_URL", value_name = "URL")]
    pub ezid_url: Option<String>,
    /// The EZID account (the password comes from INGEST_EZID_PASSWORD or --ezid-password-file).
    #[arg(long, env = "INGEST_EZID_USER", value_name = "USER")]
    pub ezid_user: Option<String>,
    /// A file holding the EZID password.
    #[arg(long, env = "INGEST_EZID_PASSWORD_FILE", value_name = "FILE")]
    pub ezid_password_file: Option<PathBuf>,
}

/// The CLI's global options that `serve` shares: `--data-dir`, `--states`,
/// `--log-format` (with their environment variables). Give `None` for an
/// option the user did not set, so the configuration file can set it.
#[derive(Debug, Clone, Default)]
pub struct GlobalOverrides {
    /// `--data-dir` / `INGEST_DATA_DIR`.
    pub data_dir: Option<PathBuf>,
    /// `--states` / `INGEST_STATES`.
    pub lifecycle: Option<PathBuf>,
    /// `--log-format` / `INGEST_LOG_FORMAT`.
    pub log_format: Option<LogFormat>,
}

/// The resolved configuration of `ingest serve`.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// The configuration file read, if any.
    pub file: Option<PathBuf>,
    /// The data directory (the log lives in `<data_dir>/log`).
    pub data_dir: PathBuf,
    /// Where the HTTP API listens.
    pub listen: SocketAddr,
    /// The bearer tokens.
    pub tokens: Tokens,
    /// The admin web UI's settings.
    pub ui: crate::UiSettings,
    /// Where ZooKeeper is.
    pub zookeeper: ZooKeeperSettings,
    /// A lifecycle file (mrt-zk `states.yml` format); the built-in one when `None`.
    pub lifecycle: Option<PathBuf>,
    /// Log output on stderr.
    pub log_format: LogFormat,
    /// Each daemon's switch and concurrency.
    pub daemons: Daemons,
    /// The provisioning step's settings.
    pub provisioning: Provisioning,
    /// The collection profiles directory; `None` accepts any profile name.
    pub profiles_dir: Option<PathBuf>,
    /// The largest request body the API reads.
    pub max_body_bytes: usize,
    /// The largest inventory record body (`POST /jobs/JID/object`).
    pub max_record_bytes: usize,
    /// How long a client may take to send a request's headers.
    pub header_read_timeout: Duration,
    /// The most connections the API keeps open at once.
    pub max_connections: usize,
    /// The most connections one client address keeps open at once (at
    /// most `max_connections`).
    pub max_connections_per_client: usize,
    /// How many items of the state one token's listing pages may walk per
    /// second.
    pub listing_items_per_second: u64,
    /// The NAAN and shoulder of minted arks.
    pub minter: (String, String),
    /// EZID, when arks come from it.
    pub ezid: Option<EzidSettings>,
    /// Which steps the in-process workers run.
    pub steps: StepsArgs,
    /// The real steps' options.
    pub real: RealArgs,
    /// Snapshots and signed checkpoints of the log.
    pub archive: crate::ArchiveArgs,
    /// Several engines on one root.
    pub replication: crate::ReplicationArgs,
    /// What the projector does with a job status another ZooKeeper client writes.
    pub foreign_writes: ForeignWrites,
}

/// What the projector does with a job status another ZooKeeper client
/// writes (`--foreign-writes`, `zookeeper.foreign_writes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ForeignWrites {
    /// The log wins: the item's nodes are put back and the change recorded.
    #[default]
    Revert,
    /// A legal status change becomes the command it means (decided by the
    /// engine, recorded with the client as actor); an illegal one is reverted.
    Adopt,
}

/// The provisioning step's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct Provisioning {
    /// Working-storage use, in percent (0–100], above which jobs wait in Provisioning.
    pub threshold_percent: f64,
    /// The working storage jobs download into.
    pub working_storage: PathBuf,
}

impl ServeConfig {
    /// Resolves the configuration: the file named by `args.config`, then the
    /// environment, then the flags; validates every value.
    ///
    /// # Errors
    /// [`ConfigError`] naming the file or flag and the field.
    pub fn load(args: &ServeArgs, globals: &GlobalOverrides) -> Result<ServeConfig, ConfigError> {
        Self::load_with_env(args, globals, &|name| std::env::var(name).ok())
    }

    /// As [`ServeConfig::load`], reading the variables that are not flags
    /// (tokens, `INGEST_DAEMONS`) through `env` (tests pass a map).
    ///
    /// # Errors
    /// See [`ServeConfig::load`].
    pub fn load_with_env(
        args: &ServeArgs,
        globals: &GlobalOverrides,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<ServeConfig, ConfigError> {
        let (file, file_origin, base) = match &args.config {
            Some(path) => {
                let parsed = read_config_file(path)?;
                let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
                (parsed, Origin::File(path.clone()), Some(base))
            }
            None => (FileConfig::default(), Origin::Default, None),
        };
        let rel = |p: PathBuf| match &base {
            Some(b) if p.is_relative() => b.join(p),
            _ => p,
        };
        // The sections that mirror a group of flags: the file sets what the
        // command line and the environment leave unset.
        let text = args
            .config
            .as_ref()
            .and_then(|p| std::fs::read_to_string(p).ok())
            .unwrap_or_default();
        let section = |name: &'static str| Section {
            name,
            origin: &file_origin,
            given: &args.given,
            text: &text,
        };
        let steps: StepsArgs = section("steps").merge(&args.steps, file.steps.as_ref())?;
        let mut real = args
            .real
            .layered(&section("real_steps"), file.real_steps.as_ref())?;
        let ids: IdArgs = section("ids").merge(&args.ids, file.ids.as_ref())?;
        // Paths in the file are relative to the file.
        let from_file = |key: &str| {
            !args.given.contains(key) && file.real_steps.as_ref().and_then(|v| v.get(key)).is_some()
        };
        if from_file("file_root") {
            real.file_root = real.file_root.map(rel);
        }
        if from_file("signing_key") {
            real.signing_key = real.signing_key.map(rel);
        }
        if from_file("outbox") {
            real.outbox = real.outbox.map(rel);
        }
        real.outbound_policy().map_err(|e| {
            invalid(
                &file_origin,
                "real_steps.allow_networks/allow_hosts",
                e.to_string(),
            )
        })?;
        let mut archive: crate::ArchiveArgs =
            section("archive").merge(&args.archive, file.archive.as_ref())?;
        if !args.given.contains("checkpoint_key")
            && file
                .archive
                .as_ref()
                .and_then(|v| v.get("checkpoint_key"))
                .is_some()
        {
            archive.checkpoint_key = archive.checkpoint_key.map(rel);
        }
        let replication: crate::ReplicationArgs =
            section("replication").merge(&args.replication, file.replication.as_ref())?;
        if replication.replicas == 0 {
            return Err(invalid(
                &file_origin,
                "replication.replicas",
                "must be at least 1".to_string(),
            ));
        }
        if let Some(id) = &replication.engine_id {
            let ok = !id.is_empty()
                && id.len() <= 64
                && id != "."
                && id != ".."
                && id
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
            if !ok {
                return Err(invalid(
                    &file_origin,
                    "replication.engine_id",
                    "must be 1 to 64 letters, digits, '-', '_' or '.'".to_string(),
                ));
            }
        }
        if archive.snapshots_keep == 0 {
            return Err(invalid(
                &file_origin,
                "archive.snapshots_keep",
                "must be at least 1",
            ));
        }
        if archive.log_compression > 22 {
            return Err(invalid(
                &file_origin,
                "archive.log_compression",
                "must be a zstd level from 1 to 22, or 0 for none",
            ));
        }

        let data_dir = layer(
            file.data_dir.map(rel),
            globals.data_dir.clone(),
            &file_origin,
            "--data-dir or INGEST_DATA_DIR",
        )
        .map_or_else(|| PathBuf::from(DEFAULT_DATA_DIR), |l| l.value);
        if data_dir.as_os_str().is_empty() {
            return Err(invalid(&file_origin, "data_dir", "is empty"));
        }

        let listen = match layer(
            file.listen,
            args.listen.clone(),
            &file_origin,
            "--listen or INGEST_LISTEN",
        ) {
            Some(l) => l.value.trim().parse::<SocketAddr>().map_err(|e| {
                invalid(
                    &l.origin,
                    "listen",
                    format!("{:?} is not an address like 127.0.0.1:7878 ({e})", l.value),
                )
            })?,
            None => DEFAULT_LISTEN.parse().map_err(|e| {
                invalid(&Origin::Default, "listen", format!("{DEFAULT_LISTEN}: {e}"))
            })?,
        };

        let lifecycle = layer(
            file.lifecycle.map(rel),
            globals.lifecycle.clone(),
            &file_origin,
            "--states or INGEST_STATES",
        );
        if let Some(l) = &lifecycle {
            if !l.value.is_file() {
                return Err(invalid(
                    &l.origin,
                    "lifecycle",
                    format!("{} is not a file", l.value.display()),
                ));
            }
        }

        let log_format = match (globals.log_format, file.log_format) {
            (Some(f), _) => f,
            (None, Some(text)) => LogFormat::from_str(&text, true).map_err(|_| {
                invalid(
                    &file_origin,
                    "log_format",
                    format!("{text:?} is not one of human, json"),
                )
            })?,
            (None, None) => LogFormat::Human,
        };

        let profiles_dir = layer(
            file.profiles_dir.map(rel),
            args.profiles_dir.clone(),
            &file_origin,
            "--profiles-dir or INGEST_PROFILES_DIR",
        );
        if let Some(l) = &profiles_dir {
            if !l.value.is_dir() {
                return Err(invalid(
                    &l.origin,
                    "profiles_dir",
                    format!("{} is not a directory", l.value.display()),
                ));
            }
        }

        let tokens = Tokens {
            admin: required_token(
                token(
                    &TokenSpec::ADMIN,
                    file.tokens.admin_file.map(&rel),
                    args.admin_token_file.clone(),
                    &file_origin,
                    env,
                )?,
                &TokenSpec::ADMIN,
            )?,
            depositor: required_token(
                token(
                    &TokenSpec::DEPOSITOR,
                    file.tokens.depositor_file.map(&rel),
                    args.depositor_token_file.clone(),
                    &file_origin,
                    env,
                )?,
                &TokenSpec::DEPOSITOR,
            )?,
            worker: required_token(
                token(
                    &TokenSpec::WORKER,
                    file.tokens.worker_file.map(&rel),
                    args.worker_token_file.clone(),
                    &file_origin,
                    env,
                )?,
                &TokenSpec::WORKER,
            )?,
            metrics: token(
                &TokenSpec::METRICS,
                file.tokens.metrics_file.map(&rel),
                args.metrics_token_file.clone(),
                &file_origin,
                env,
            )?,
            admins: match layer(
                file.tokens.admins_file.map(&rel),
                args.admins_file.clone(),
                &file_origin,
                "--admins-file or INGEST_ADMINS_FILE",
            ) {
                Some(l) => crate::admins::read_admins(&l.value, &l.origin)?,
                None => Vec::new(),
            },
            depositors: match layer(
                file.tokens.depositors_file.map(&rel),
                args.depositors_file.clone(),
                &file_origin,
                "--depositors-file or INGEST_DEPOSITORS_FILE",
            ) {
                Some(l) => crate::depositors::read_depositors(&l.value, &l.origin)?,
                None => Vec::new(),
            },
        };
        tokens.check_distinct()?;
        let ui = crate::UiSettings {
            secure_cookies: layer(
                file.ui.secure_cookies,
                args.ui_secure_cookies,
                &file_origin,
                "--ui-secure-cookies or INGEST_UI_SECURE_COOKIES",
            )
            .is_some_and(|l| l.value),
            session_idle: Duration::from_secs(layer_in(
                (file.ui.session_idle_secs, args.ui_session_idle_secs),
                &file_origin,
                (
                    "--ui-session-idle-secs or INGEST_UI_SESSION_IDLE_SECS",
                    "ui.session_idle_secs",
                ),
                crate::ui::DEFAULT_UI_SESSION_IDLE_SECS,
                10..=7 * 24 * 3600,
                "seconds",
            )?),
            session_max: Duration::from_secs(layer_in(
                (file.ui.session_max_secs, args.ui_session_max_secs),
                &file_origin,
                (
                    "--ui-session-max-secs or INGEST_UI_SESSION_MAX_SECS",
                    "ui.session_max_secs",
                ),
                crate::ui::DEFAULT_UI_SESSION_MAX_SECS,
                10..=30 * 24 * 3600,
                "seconds",
            )?),
        };
        let roles = [
            ("admin", Some(&tokens.admin)),
            ("depositor", Some(&tokens.depositor)),
            ("worker", Some(&tokens.worker)),
            ("metrics", tokens.metrics.as_ref()),
        ];
        for (i, (a, ta)) in roles.iter().enumerate() {
            for (b, tb) in &roles[i + 1..] {
                if let (Some(ta), Some(tb)) = (ta, tb) {
                    if ta == tb {
                        return Err(invalid(
                            &Origin::Override("the tokens"),
                            &format!("tokens.{a}"),
                            format!("the {a} and {b} tokens are the same; each role needs its own token"),
                        ));
                    }
                }
            }
        }

        let zk_hosts = layer(
            file.zookeeper.hosts,
            args.zookeeper.zk.clone(),
            &file_origin,
            "--zk or INGEST_ZK",
        );
        if let Some(l) = &zk_hosts {
            check_zk_hosts(&l.value).map_err(|r| invalid(&l.origin, "zookeeper.hosts", r))?;
        }
        let zk_root = layer(
            file.zookeeper.root,
            args.zookeeper.zk_root.clone(),
            &file_origin,
            "--zk-root or INGEST_ZK_ROOT",
        )
        .unwrap_or(Layered {
            value: "/".into(),
            origin: Origin::Default,
        });
        if !zk_root.value.starts_with('/')
            || (zk_root.value.len() > 1 && zk_root.value.ends_with('/'))
            || zk_root.value.contains("//")
        {
            return Err(invalid(
                &zk_root.origin,
                "zookeeper.root",
                format!(
                    "{:?} is not an absolute ZooKeeper path like / or /ingest",
                    zk_root.value
                ),
            ));
        }
        let timeout = layer(
            file.zookeeper.session_timeout_secs,
            args.zookeeper.zk_session_timeout,
            &file_origin,
            "--zk-session-timeout or INGEST_ZK_SESSION_TIMEOUT",
        )
        .unwrap_or(Layered {
            value: DEFAULT_ZK_SESSION_TIMEOUT_SECS,
            origin: Origin::Default,
        });
        if !(timeout.value.is_finite() && timeout.value > 0.0 && timeout.value <= 600.0) {
            return Err(invalid(
                &timeout.origin,
                "zookeeper.session_timeout_secs",
                format!("{} is not a number of seconds in (0, 600]", timeout.value),
            ));
        }

        let daemons = daemons(&file.daemons, &file_origin, env, &args.daemons)?;

        let threshold = match layer(
            file.provisioning.threshold_percent,
            args.provisioning_threshold.clone().map(Percent::Text),
            &file_origin,
            "--provisioning-threshold or INGEST_PROVISIONING_THRESHOLD",
        ) {
            Some(l) => parse_percent(&l.value)
                .map_err(|r| invalid(&l.origin, "provisioning.threshold_percent", r))?,
            None => DEFAULT_PROVISIONING_THRESHOLD,
        };
        let working_storage = layer(
            file.provisioning.working_storage.map(&rel),
            args.working_storage.clone(),
            &file_origin,
            "--working-storage or INGEST_WORKING_STORAGE",
        )
        .map_or_else(|| data_dir.join("work"), |l| l.value);

        let max_body = layer_in(
            (file.http.max_body_bytes, args.max_body_bytes),
            &file_origin,
            (
                "--max-body-bytes or INGEST_MAX_BODY_BYTES",
                "http.max_body_bytes",
            ),
            DEFAULT_MAX_BODY_BYTES,
            1024..=64 * 1024 * 1024,
            "",
        )?;
        let max_record = layer_in(
            (file.http.max_record_bytes, args.max_record_bytes),
            &file_origin,
            (
                "--max-record-bytes or INGEST_MAX_RECORD_BYTES",
                "http.max_record_bytes",
            ),
            crate::DEFAULT_MAX_RECORD_BYTES,
            1024..=4 * 1024 * 1024 * 1024,
            "",
        )?;
        let header_timeout = layer_in(
            (file.http.header_read_timeout_secs, args.header_read_timeout),
            &file_origin,
            (
                "--header-read-timeout or INGEST_HEADER_READ_TIMEOUT",
                "http.header_read_timeout_secs",
            ),
            DEFAULT_HEADER_READ_TIMEOUT_SECS,
            1..=3600,
            "seconds",
        )?;
        let max_connections = layer_in(
            (file.http.max_connections, args.max_connections),
            &file_origin,
            (
                "--max-connections or INGEST_MAX_CONNECTIONS",
                "http.max_connections",
            ),
            DEFAULT_MAX_CONNECTIONS,
            1..=1_000_000,
            "",
        )?;
        let max_connections_per_client = layer_in(
            (
                file.http.max_connections_per_client,
                args.max_connections_per_client,
            ),
            &file_origin,
            (
                "--max-connections-per-client or INGEST_MAX_CONNECTIONS_PER_CLIENT",
                "http.max_connections_per_client",
            ),
            DEFAULT_MAX_CONNECTIONS_PER_CLIENT,
            1..=1_000_000,
            "",
        )?
        .min(max_connections);
        let listing_items_per_second = layer_in(
            (
                file.http.listing_items_per_second,
                args.listing_items_per_second,
            ),
            &file_origin,
            (
                "--listing-items-per-second or INGEST_LISTING_ITEMS_PER_SECOND",
                "http.listing_items_per_second",
            ),
            crate::DEFAULT_LISTING_ITEMS_PER_SECOND,
            1..=1_000_000_000,
            "",
        )?;

        let request_timeout = args
            .zookeeper
            .zk_timeout
            .or(file.zookeeper.request_timeout_secs)
            .unwrap_or(zk::DEFAULT_REQUEST_TIMEOUT_SECS);
        if !(request_timeout.is_finite() && request_timeout > 0.0 && request_timeout <= 86_400.0) {
            return Err(invalid(
                &file_origin,
                "zookeeper.request_timeout_secs",
                format!("{request_timeout} is outside (0, 86400] seconds"),
            ));
        }
        let zk_access = zk::access(
            args.zookeeper
                .zk_auth_file
                .as_deref()
                .or(file.zookeeper.auth_file.as_deref()),
            zk::Identities {
                worker: args
                    .zookeeper
                    .zk_worker_identity
                    .as_deref()
                    .or(file.zookeeper.worker_identity.as_deref()),
                merritt: args
                    .zookeeper
                    .zk_merritt_identity
                    .as_deref()
                    .or(file.zookeeper.merritt_identity.as_deref()),
            },
            args.zookeeper.zk_open_object_locks
                || file.zookeeper.open_object_locks.unwrap_or(false),
        )
        .map_err(|e| invalid(&file_origin, "zookeeper.auth_file", e.to_string()))?;
        Ok(ServeConfig {
            file: args.config.clone(),
            data_dir,
            listen,
            tokens,
            ui,
            zookeeper: ZooKeeperSettings {
                hosts: zk_hosts.map(|l| l.value.trim().to_string()),
                root: zk_root.value,
                session_timeout: Duration::from_secs_f64(timeout.value),
                request_timeout: Duration::from_secs_f64(request_timeout),
                access: zk_access,
            },
            lifecycle: lifecycle.map(|l| l.value),
            log_format,
            daemons,
            provisioning: Provisioning {
                threshold_percent: threshold,
                working_storage,
            },
            profiles_dir: profiles_dir.map(|l| l.value),
            max_body_bytes: max_body,
            max_record_bytes: max_record.max(max_body),
            header_read_timeout: Duration::from_secs(header_timeout),
            max_connections,
            max_connections_per_client,
            listing_items_per_second,
            minter: (ids.naan.clone(), ids.shoulder.clone()),
            ezid: ezid_settings(&ids)?,
            steps,
            real: RealArgs {
                // The in-process workers refuse what this server would.
                max_record_bytes: Some(max_record.max(max_body)),
                ..real
            },
            archive,
            replication,
            foreign_writes: args
                .foreign_writes
                .or(file.zookeeper.foreign_writes)
                .unwrap_or_default(),
        })
    }

    /// The lifecycle to enforce: the configured file, or the built-in one.
    ///
    /// # Errors
    /// [`ConfigError::Parse`] listing the file's problems with their lines.
    pub fn lifecycle(&self) -> Result<Lifecycle, ConfigError> {
        match &self.lifecycle {
            None => Ok(Lifecycle::builtin()),
            Some(path) => Lifecycle::load(path).map_err(|e| ConfigError::Parse {
                what: "lifecycle file",
                path: path.clone(),
                message: e.to_string(),
            }),
        }
    }

    /// The collection profiles: loaded from the profiles directory, or
    /// [`Profiles::unrestricted`] when none is configured.
    ///
    /// # Errors
    /// See [`Profiles::load`].
    pub fn profiles(&self) -> Result<Profiles, ConfigError> {
        match &self.profiles_dir {
            Some(dir) => Profiles::load(dir),
            None => Ok(Profiles::unrestricted()),
        }
    }
}

/// The EZID API settings.
#[derive(Debug, Clone)]
pub struct EzidSettings {
    /// The API base, `https://ezid.cdlib.org`.
    pub base: String,
    /// The shoulder to mint under, `ark:/99999/fk4`.
    pub shoulder: String,
    /// The account.
    pub user: String,
    /// Its password.
    pub password: String,
}

/// The EZID settings `--ezid-url` asks for, with the password from
/// `INGEST_EZID_PASSWORD` or `--ezid-password-file`.
pub(crate) fn ezid_settings(args: &IdArgs) -> Result<Option<EzidSettings>, ConfigError> {
    let Some(base) = &args.ezid_url else {
        return Ok(None);
    };
    let origin = Origin::Named("--ezid-url".into());
    let user = args.ezid_user.clone().ok_or_else(|| {
        invalid(
            &origin,
            "ezid_user",
            "--ezid-url needs --ezid-user (or INGEST_EZID_USER)",
        )
    })?;
    let password = match (
        &args.ezid_password_file,
        std::env::var("INGEST_EZID_PASSWORD"),
    ) {
        (Some(file), _) => std::fs::read_to_string(file)
            .map_err(|e| {
                invalid(
                    &origin,
                    "ezid_password_file",
                    format!("cannot read {}: {e}", file.display()),
                )
            })?
            .trim()
            .to_string(),
        (None, Ok(p)) if !p.is_empty() => p,
        _ => {
            return Err(invalid(
                &origin,
                "ezid_password",
                "--ezid-url needs a password: INGEST_EZID_PASSWORD or --ezid-password-file",
            ))
        }
    };
    Ok(Some(EzidSettings {
        base: base.clone(),
        shoulder: format!("ark:/{}/{}", args.naan, args.shoulder),
        user,
        password,
    }))
}
