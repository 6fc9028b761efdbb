//! The configuration of `ingest serve`: a file, the environment and flags.
//!
//! Every option can come from three layers, later ones winning:
//! **the configuration file < `INGEST_*` environment variables < flags**.
//! The file is YAML (`.yaml`, `.yml`) or TOML (`.toml`), chosen by its
//! extension; relative paths in it are taken relative to the file's
//! directory. [`ServeArgs`] holds the flags (each with its environment
//! variable); the data directory, the lifecycle file and the log format are
//! the CLI's global options (`--data-dir`, `--states`, `--log-format`) and
//! come in through [`GlobalOverrides`].
//!
//! Bearer tokens are never taken as flag values (a flag shows in `ps`): each
//! comes from a file (`tokens.admin_file`, `--admin-token-file`,
//! `INGEST_ADMIN_TOKEN_FILE`) or from the environment (`INGEST_ADMIN_TOKEN`).
//! They are held as [`Secret`]s, which never print.
//!
//! Collection profiles are one YAML file per profile in the profiles
//! directory ([`Profiles::load`]). A collection's *hold* is not part of its
//! profile: it is an event in the log.
//!
//! [`EXAMPLE_YAML`] and [`EXAMPLE_TOML`] are complete example files (a unit
//! test keeps them loadable).
//!
//! ```no_run
//! use ingest_config::{GlobalOverrides, ServeArgs, ServeConfig};
//!
//! let args = ServeArgs {
//!     config: Some("/etc/ingest/serve.yaml".into()),
//!     ..ServeArgs::default()
//! };
//! let config = ServeConfig::load(&args, &GlobalOverrides::default())?;
//! let profiles = config.profiles()?;
//! println!("listening on {} with {} profiles", config.listen, profiles.len());
//! # Ok::<(), ingest_config::ConfigError>(())
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, ValueEnum};
use ingest_events::{JobState, Lifecycle};
use serde::{Deserialize, Serialize};

pub use crate::logging::{init_tracing, LogFormat};
pub use crate::steps::{RealArgs, StepsArgs, StepsKind};
pub use crate::zk::{ZkArgs, ZooKeeperSettings};

pub mod logging;
pub mod server_file;
pub mod shutdown;
pub mod steps;
pub mod zk;

/// The address `ingest serve` listens on by default.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7878";
/// The data directory used when none is configured (the CLI's default).
pub const DEFAULT_DATA_DIR: &str = "./ingest-data";
/// The working-storage use (percent) above which provisioning holds jobs back.
pub const DEFAULT_PROVISIONING_THRESHOLD: f64 = 70.0;
/// The largest request body the API reads, in bytes.
pub const DEFAULT_MAX_BODY_BYTES: usize = 1024 * 1024;
/// The ZooKeeper session timeout used when none is configured.
pub const DEFAULT_ZK_SESSION_TIMEOUT_SECS: f64 = 6.0;
/// The shortest bearer token accepted.
pub const MIN_TOKEN_CHARS: usize = 16;
/// The most tasks one daemon may run.
pub const MAX_DAEMON_TASKS: u32 = 1024;

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
    /// Where arks come from.
    #[command(flatten)]
    pub ids: IdArgs,
    /// Which steps the in-process workers run.
    #[command(flatten)]
    pub steps: StepsArgs,
    /// The real steps' options (with --steps real).
    #[command(flatten)]
    pub real: RealArgs,
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
    /// The NAAN and shoulder of minted arks.
    pub minter: (String, String),
    /// EZID, when arks come from it.
    pub ezid: Option<EzidSettings>,
    /// Which steps the in-process workers run.
    pub steps: StepsArgs,
    /// The real steps' options.
    pub real: RealArgs,
}

/// The provisioning step's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct Provisioning {
    /// Working-storage use, in percent (0–100], above which jobs wait in Provisioning.
    pub threshold_percent: f64,
    /// The working storage jobs download into.
    pub working_storage: PathBuf,
}

/// A secret (a bearer token). Its `Debug` output is redacted and it has no
/// `Display`, so it cannot end up in a log line by accident.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret value.
    pub fn new(value: impl Into<String>) -> Secret {
        Secret(value.into())
    }

    /// The value, for the one place that must compare or send it.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether `presented` equals the secret, in time that depends only on
    /// the secret's length (not on where the first difference is).
    pub fn matches(&self, presented: &[u8]) -> bool {
        constant_time_eq(self.0.as_bytes(), presented)
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// Compares `expected` with `presented` in time that depends only on
/// `expected.len()`.
pub fn constant_time_eq(expected: &[u8], presented: &[u8]) -> bool {
    let mut diff: usize = expected.len() ^ presented.len();
    for (i, e) in expected.iter().enumerate() {
        let p = presented.get(i).copied().unwrap_or(0);
        diff |= usize::from(e ^ p);
    }
    std::hint::black_box(diff) == 0
}

/// The API's bearer tokens, one per role.
#[derive(Debug, Clone)]
pub struct Tokens {
    /// Admin routes (and depositor routes).
    pub admin: Secret,
    /// Depositor routes.
    pub depositor: Secret,
    /// Worker routes.
    pub worker: Secret,
    /// `/metrics`, when set; without it scraping needs no token.
    pub metrics: Option<Secret>,
}

/// The daemons `ingest serve` can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, ValueEnum)]
pub enum DaemonKind {
    /// Acquires pending batches and expands them into jobs.
    BatchPending,
    /// Reports batches whose jobs have all finished.
    BatchReporting,
    /// Sends update reports of failed batches.
    BatchUpdateReporting,
    /// Starts pending jobs (Pending → Estimating).
    JobPending,
    /// The Estimating step.
    Estimating,
    /// The Provisioning step.
    Provisioning,
    /// The Downloading step.
    Downloading,
    /// The Processing step.
    Processing,
    /// The Storing step.
    Storing,
    /// The Recording step.
    Recording,
    /// The Notify step.
    Notify,
}

impl DaemonKind {
    /// Every daemon.
    pub const ALL: [DaemonKind; 11] = [
        DaemonKind::BatchPending,
        DaemonKind::BatchReporting,
        DaemonKind::BatchUpdateReporting,
        DaemonKind::JobPending,
        DaemonKind::Estimating,
        DaemonKind::Provisioning,
        DaemonKind::Downloading,
        DaemonKind::Processing,
        DaemonKind::Storing,
        DaemonKind::Recording,
        DaemonKind::Notify,
    ];

    /// The name used in the file, in `--daemon` and in `INGEST_DAEMONS`.
    pub fn name(self) -> &'static str {
        match self {
            DaemonKind::BatchPending => "batch_pending",
            DaemonKind::BatchReporting => "batch_reporting",
            DaemonKind::BatchUpdateReporting => "batch_update_reporting",
            DaemonKind::JobPending => "job_pending",
            DaemonKind::Estimating => "estimating",
            DaemonKind::Provisioning => "provisioning",
            DaemonKind::Downloading => "downloading",
            DaemonKind::Processing => "processing",
            DaemonKind::Storing => "storing",
            DaemonKind::Recording => "recording",
            DaemonKind::Notify => "notify",
        }
    }

    /// Looks a daemon up by name (`-` and `_` alike, any case).
    pub fn from_name(name: &str) -> Option<DaemonKind> {
        let folded = name.trim().to_ascii_lowercase().replace('-', "_");
        Self::ALL.into_iter().find(|d| d.name() == folded)
    }

    /// The daemon that works on jobs in `state`, if one does.
    pub fn for_job_state(state: JobState) -> Option<DaemonKind> {
        match state {
            JobState::Pending => Some(DaemonKind::JobPending),
            JobState::Estimating => Some(DaemonKind::Estimating),
            JobState::Provisioning => Some(DaemonKind::Provisioning),
            JobState::Downloading => Some(DaemonKind::Downloading),
            JobState::Processing => Some(DaemonKind::Processing),
            JobState::Storing => Some(DaemonKind::Storing),
            JobState::Recording => Some(DaemonKind::Recording),
            JobState::Notify => Some(DaemonKind::Notify),
            _ => None,
        }
    }

    fn names() -> String {
        Self::ALL.map(DaemonKind::name).join(", ")
    }
}

impl fmt::Display for DaemonKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One daemon's switch and concurrency.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct DaemonSettings {
    /// Whether it runs.
    pub enabled: bool,
    /// How many tasks it runs at once (at least 1).
    pub tasks: u32,
}

impl Default for DaemonSettings {
    fn default() -> DaemonSettings {
        DaemonSettings {
            enabled: true,
            tasks: 1,
        }
    }
}

/// Every daemon's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Daemons(BTreeMap<DaemonKind, DaemonSettings>);

impl Default for Daemons {
    fn default() -> Daemons {
        Daemons(
            DaemonKind::ALL
                .into_iter()
                .map(|d| (d, DaemonSettings::default()))
                .collect(),
        )
    }
}

impl Daemons {
    /// One daemon's settings.
    pub fn get(&self, kind: DaemonKind) -> DaemonSettings {
        self.0.get(&kind).copied().unwrap_or_default()
    }

    /// Every daemon with its settings.
    pub fn iter(&self) -> impl Iterator<Item = (DaemonKind, DaemonSettings)> + '_ {
        self.0.iter().map(|(k, v)| (*k, *v))
    }
}

/// A configuration problem. The message names where the value came from
/// (the file, the flag or the variable) and the field.
///
/// ### Handling
/// Fatal at start-up: print it and exit; nothing has been opened yet.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A file could not be read.
    #[error("cannot read {what} {}: {source}", path.display())]
    Read {
        /// What the file is (`configuration file`, `admin token file`, …).
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A file could not be parsed.
    #[error("{what} {}: {message}", path.display())]
    Parse {
        /// What the file is.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The parser's message (with the line where it has one).
        message: String,
    },
    /// A value is invalid.
    #[error("{origin}: field `{field}`: {reason}")]
    Invalid {
        /// Where the value came from (`configuration file /etc/…`, `--listen or INGEST_LISTEN`).
        origin: String,
        /// The field, as named in the file.
        field: String,
        /// What is wrong.
        reason: String,
    },
}

/// Where a value came from, for error messages.
#[derive(Debug, Clone)]
enum Origin {
    Default,
    File(PathBuf),
    Override(&'static str),
    Env(&'static str),
    Named(String),
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::Default => f.write_str("the default"),
            Origin::File(p) => write!(f, "configuration file {}", p.display()),
            Origin::Override(s) | Origin::Env(s) => f.write_str(s),
            Origin::Named(s) => f.write_str(s),
        }
    }
}

fn invalid(origin: &Origin, field: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        origin: origin.to_string(),
        field: field.to_string(),
        reason: reason.into(),
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    data_dir: Option<PathBuf>,
    listen: Option<String>,
    lifecycle: Option<PathBuf>,
    log_format: Option<String>,
    profiles_dir: Option<PathBuf>,
    #[serde(default)]
    tokens: FileTokens,
    #[serde(default)]
    zookeeper: FileZooKeeper,
    #[serde(default)]
    daemons: BTreeMap<String, FileDaemon>,
    #[serde(default)]
    provisioning: FileProvisioning,
    #[serde(default)]
    http: FileHttp,
    /// `--steps`, `--step-ms`, `--failure-rate`, `--seed` ([`StepsArgs`]).
    steps: Option<serde_json::Value>,
    /// The real steps' options ([`RealArgs`]).
    real_steps: Option<serde_json::Value>,
    /// `--naan`, `--shoulder`, `--ezid-*` ([`IdArgs`]).
    ids: Option<serde_json::Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileTokens {
    admin_file: Option<PathBuf>,
    depositor_file: Option<PathBuf>,
    worker_file: Option<PathBuf>,
    metrics_file: Option<PathBuf>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileZooKeeper {
    hosts: Option<String>,
    root: Option<String>,
    session_timeout_secs: Option<f64>,
    request_timeout_secs: Option<f64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileDaemon {
    enabled: Option<bool>,
    tasks: Option<u32>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileProvisioning {
    threshold_percent: Option<Percent>,
    working_storage: Option<PathBuf>,
}

/// `70`, `70.5` or `"70%"`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Percent {
    Number(f64),
    Text(String),
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileHttp {
    max_body_bytes: Option<usize>,
}

/// A value and where it came from.
struct Layered<T> {
    value: T,
    origin: Origin,
}

/// The flag (or its variable, which clap merged into it) wins over the file.
fn layer<T>(
    file: Option<T>,
    over: Option<T>,
    file_origin: &Origin,
    flag: &'static str,
) -> Option<Layered<T>> {
    match (over, file) {
        (Some(value), _) => Some(Layered {
            value,
            origin: Origin::Override(flag),
        }),
        (None, Some(value)) => Some(Layered {
            value,
            origin: file_origin.clone(),
        }),
        (None, None) => None,
    }
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
        let mut real: RealArgs =
            section("real_steps").merge(&args.real, file.real_steps.as_ref())?;
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

        let max_body = layer(
            file.http.max_body_bytes,
            args.max_body_bytes,
            &file_origin,
            "--max-body-bytes or INGEST_MAX_BODY_BYTES",
        )
        .unwrap_or(Layered {
            value: DEFAULT_MAX_BODY_BYTES,
            origin: Origin::Default,
        });
        if !(1024..=64 * 1024 * 1024).contains(&max_body.value) {
            return Err(invalid(
                &max_body.origin,
                "http.max_body_bytes",
                format!("{} is outside 1024-67108864", max_body.value),
            ));
        }

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
        Ok(ServeConfig {
            file: args.config.clone(),
            data_dir,
            listen,
            tokens,
            zookeeper: ZooKeeperSettings {
                hosts: zk_hosts.map(|l| l.value.trim().to_string()),
                root: zk_root.value,
                session_timeout: Duration::from_secs_f64(timeout.value),
                request_timeout: Duration::from_secs_f64(request_timeout),
            },
            lifecycle: lifecycle.map(|l| l.value),
            log_format,
            daemons,
            provisioning: Provisioning {
                threshold_percent: threshold,
                working_storage,
            },
            profiles_dir: profiles_dir.map(|l| l.value),
            max_body_bytes: max_body.value,
            minter: (ids.naan.clone(), ids.shoulder.clone()),
            ezid: ezid_settings(&ids)?,
            steps,
            real,
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

/// A section of the configuration file that mirrors a group of flags
/// (`steps`, `real_steps`, `ids`): one parser for each setting, clap's, and
/// the file's keys are the flags' names with `_` for `-`.
struct Section<'a> {
    name: &'static str,
    origin: &'a Origin,
    given: &'a std::collections::BTreeSet<String>,
    /// The file's text, to say on which line a key is.
    text: &'a str,
}

impl Section<'_> {
    /// The line of `key` inside this section (YAML `key:` or TOML `key =`),
    /// counted from 1.
    fn line_of(&self, key: &str) -> Option<usize> {
        let lines: Vec<&str> = self.text.lines().collect();
        let start = lines.iter().position(|l| {
            let t = l.trim();
            t.starts_with(&format!("{}:", self.name)) || t == format!("[{}]", self.name)
        })?;
        lines[start + 1..]
            .iter()
            .position(|l| {
                let t = l.trim_start();
                t.strip_prefix(key)
                    .is_some_and(|rest| rest.trim_start().starts_with([':', '=']))
            })
            .map(|i| start + 2 + i)
    }

    /// The flags' values, with every key of the file's section that the
    /// command line and the environment did not set.
    ///
    /// # Errors
    /// An unknown key or a value of the wrong type, naming the section and
    /// the key.
    fn merge<T: Serialize + serde::de::DeserializeOwned>(
        &self,
        flags: &T,
        section: Option<&serde_json::Value>,
    ) -> Result<T, ConfigError> {
        let Some(section) = section else {
            return serde_json::to_value(flags)
                .and_then(serde_json::from_value)
                .map_err(|e| invalid(self.origin, self.name, e.to_string()));
        };
        let serde_json::Value::Object(entries) = section else {
            return Err(invalid(
                self.origin,
                self.name,
                "is a section: give it keys, one per option",
            ));
        };
        let mut merged = serde_json::to_value(flags)
            .map_err(|e| invalid(self.origin, self.name, e.to_string()))?;
        let known: Vec<String> = merged
            .as_object()
            .map(|o| o.keys().cloned().collect())
            .unwrap_or_default();
        for (key, value) in entries {
            let field = format!("{}.{key}", self.name);
            let at = |reason: String| match self.line_of(key) {
                Some(line) => format!("line {line}: {reason}"),
                None => reason,
            };
            if !known.contains(key) {
                return Err(invalid(
                    self.origin,
                    &field,
                    at(format!(
                        "unknown key; the keys of `{}` are {}",
                        self.name,
                        known.join(", ")
                    )),
                ));
            }
            if self.given.contains(key) {
                continue;
            }
            let mut next = merged.clone();
            if let Some(o) = next.as_object_mut() {
                o.insert(key.clone(), value.clone());
            }
            // Checked key by key, so a wrong type names its key.
            serde_json::from_value::<T>(next.clone())
                .map_err(|e| invalid(self.origin, &field, at(e.to_string())))?;
            merged = next;
        }
        serde_json::from_value(merged).map_err(|e| invalid(self.origin, self.name, e.to_string()))
    }
}

fn read_config_file(path: &Path) -> Result<FileConfig, ConfigError> {
    let what = "configuration file";
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        what,
        path: path.to_path_buf(),
        source,
    })?;
    let parse_err = |message: String| ConfigError::Parse {
        what,
        path: path.to_path_buf(),
        message,
    };
    match ext.as_deref() {
        Some("yaml" | "yml") => {
            if text.trim().is_empty() {
                return Ok(FileConfig::default());
            }
            serde_norway::from_str(&text).map_err(|e| parse_err(e.to_string()))
        }
        Some("toml") => toml::from_str(&text).map_err(|e| parse_err(e.to_string())),
        _ => Err(parse_err(
            "the format is chosen by the extension: .yaml, .yml or .toml".into(),
        )),
    }
}

/// How one role's token is configured.
struct TokenSpec {
    role: &'static str,
    env: &'static str,
    file_flag: &'static str,
    what: &'static str,
}

impl TokenSpec {
    const ADMIN: TokenSpec = TokenSpec {
        role: "admin",
        env: "INGEST_ADMIN_TOKEN",
        file_flag: "--admin-token-file or INGEST_ADMIN_TOKEN_FILE",
        what: "admin token file",
    };
    const DEPOSITOR: TokenSpec = TokenSpec {
        role: "depositor",
        env: "INGEST_DEPOSITOR_TOKEN",
        file_flag: "--depositor-token-file or INGEST_DEPOSITOR_TOKEN_FILE",
        what: "depositor token file",
    };
    const WORKER: TokenSpec = TokenSpec {
        role: "worker",
        env: "INGEST_WORKER_TOKEN",
        file_flag: "--worker-token-file or INGEST_WORKER_TOKEN_FILE",
        what: "worker token file",
    };
    const METRICS: TokenSpec = TokenSpec {
        role: "metrics",
        env: "INGEST_METRICS_TOKEN",
        file_flag: "--metrics-token-file or INGEST_METRICS_TOKEN_FILE",
        what: "metrics token file",
    };
}

/// One role's token: `--X-token-file` (or `INGEST_X_TOKEN_FILE`) wins over
/// `INGEST_X_TOKEN`, which wins over the file's `tokens.X_file`.
fn token(
    spec: &TokenSpec,
    file_path: Option<PathBuf>,
    flag_path: Option<PathBuf>,
    file_origin: &Origin,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<Secret>, ConfigError> {
    let field = format!("tokens.{}_file", spec.role);
    let from_file = |path: &Path, origin: &Origin| -> Result<Secret, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            what: spec.what,
            path: path.to_path_buf(),
            source,
        })?;
        check_token(text.trim_end_matches(['\n', '\r']).trim(), origin, &field)
    };
    if let Some(path) = flag_path {
        return from_file(&path, &Origin::Override(spec.file_flag)).map(Some);
    }
    if let Some(value) = env(spec.env) {
        return check_token(value.trim(), &Origin::Env(spec.env), &field).map(Some);
    }
    match file_path {
        Some(path) => from_file(&path, file_origin).map(Some),
        None => Ok(None),
    }
}

fn required_token(t: Option<Secret>, spec: &TokenSpec) -> Result<Secret, ConfigError> {
    t.ok_or_else(|| {
        invalid(
            &Origin::Named("the configuration".into()),
            &format!("tokens.{}_file", spec.role),
            format!(
                "no {} token: set {}, or name a file holding it with {} or tokens.{}_file",
                spec.role, spec.env, spec.file_flag, spec.role
            ),
        )
    })
}

fn check_token(value: &str, origin: &Origin, field: &str) -> Result<Secret, ConfigError> {
    // The messages never include the token itself.
    if value.chars().count() < MIN_TOKEN_CHARS {
        return Err(invalid(
            origin,
            field,
            format!("the token is shorter than {MIN_TOKEN_CHARS} characters"),
        ));
    }
    if value
        .chars()
        .any(|c| c.is_whitespace() || c.is_control() || !c.is_ascii())
    {
        return Err(invalid(
            origin,
            field,
            "the token must be printable ASCII without spaces (it is sent in an HTTP header)",
        ));
    }
    Ok(Secret::new(value))
}

fn check_zk_hosts(hosts: &str) -> Result<(), String> {
    let hosts = hosts.trim();
    if hosts.is_empty() {
        return Err("is empty; give host:port[,host:port...]".into());
    }
    // A chroot belongs in zookeeper.root, not in the connect string.
    if hosts.contains('/') {
        return Err(format!(
            "{hosts:?} contains '/'; give the chroot as zookeeper.root (--zk-root)"
        ));
    }
    for h in hosts.split(',') {
        let h = h.trim();
        let Some((host, port)) = h.rsplit_once(':') else {
            return Err(format!("{h:?} is not host:port"));
        };
        if host.is_empty() || port.parse::<u16>().map_or(true, |p| p == 0) {
            return Err(format!("{h:?} is not host:port"));
        }
    }
    Ok(())
}

fn parse_percent(p: &Percent) -> Result<f64, String> {
    let v = match p {
        Percent::Number(n) => *n,
        Percent::Text(t) => t
            .trim()
            .trim_end_matches('%')
            .trim()
            .parse::<f64>()
            .map_err(|_| format!("{t:?} is not a percentage like 70 or 70%"))?,
    };
    if !(v.is_finite() && v > 0.0 && v <= 100.0) {
        return Err(format!("{v} is outside (0, 100]"));
    }
    Ok(v)
}

/// Parses one `NAME=off|on|TASKS` setting, the one grammar of `serve
/// --daemons`, `worker --daemons` and `INGEST_DAEMONS`. A bare `NAME` is
/// `NAME=on`; a job state's name (`downloading`) names its daemon.
///
/// # Errors
/// What is wrong with the setting.
pub fn parse_daemon(text: &str) -> Result<(DaemonKind, DaemonSettings), String> {
    let (kind, spec) = parse_daemon_setting(text)?;
    let mut settings = DaemonSettings::default();
    if let Some(e) = spec.enabled {
        settings.enabled = e;
    }
    if let Some(t) = spec.tasks {
        if t == 0 || t > MAX_DAEMON_TASKS {
            return Err(format!(
                "{text:?}: the task count is outside 1-{MAX_DAEMON_TASKS}"
            ));
        }
        settings.tasks = t;
    }
    Ok((kind, settings))
}

fn parse_daemon_setting(text: &str) -> Result<(DaemonKind, DaemonSpec), String> {
    let text = text.trim();
    let (name, spec) = text.split_once('=').unwrap_or((text, "on"));
    let lower = name.trim().to_ascii_lowercase();
    let kind = DaemonKind::from_name(&lower)
        .or_else(|| {
            lower
                .parse::<JobState>()
                .ok()
                .and_then(DaemonKind::for_job_state)
        })
        .ok_or_else(|| format!("{name:?} is not a daemon (known: {})", DaemonKind::names()))?;
    let spec = match spec.trim().to_ascii_lowercase().as_str() {
        "off" | "false" | "no" => DaemonSpec {
            enabled: Some(false),
            tasks: None,
        },
        "on" | "true" | "yes" => DaemonSpec {
            enabled: Some(true),
            tasks: None,
        },
        n => {
            let tasks = n
                .parse::<u32>()
                .map_err(|_| format!("{text:?}: {spec:?} is not off, on or a number of tasks"))?;
            DaemonSpec {
                enabled: Some(true),
                tasks: Some(tasks),
            }
        }
    };
    Ok((kind, spec))
}

struct DaemonSpec {
    enabled: Option<bool>,
    tasks: Option<u32>,
}

fn daemons(
    file: &BTreeMap<String, FileDaemon>,
    file_origin: &Origin,
    env: &dyn Fn(&str) -> Option<String>,
    flags: &[String],
) -> Result<Daemons, ConfigError> {
    let mut out = Daemons::default();
    let mut origins: BTreeMap<DaemonKind, Origin> = BTreeMap::new();
    let mut apply = |kind: DaemonKind, spec: DaemonSpec, origin: Origin| {
        let s = out.0.entry(kind).or_default();
        if let Some(e) = spec.enabled {
            s.enabled = e;
        }
        if let Some(t) = spec.tasks {
            s.tasks = t;
        }
        origins.insert(kind, origin);
    };
    for (name, d) in file {
        let kind = DaemonKind::from_name(name).ok_or_else(|| {
            invalid(
                file_origin,
                &format!("daemons.{name}"),
                format!("not a daemon (known: {})", DaemonKind::names()),
            )
        })?;
        apply(
            kind,
            DaemonSpec {
                enabled: d.enabled,
                tasks: d.tasks,
            },
            file_origin.clone(),
        );
    }
    if let Some(list) = env("INGEST_DAEMONS") {
        for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (kind, spec) = parse_daemon_setting(item)
                .map_err(|r| invalid(&Origin::Env("INGEST_DAEMONS"), "daemons", r))?;
            apply(kind, spec, Origin::Env("INGEST_DAEMONS"));
        }
    }
    for item in flags {
        let (kind, spec) = parse_daemon_setting(item)
            .map_err(|r| invalid(&Origin::Override("--daemon"), "daemons", r))?;
        apply(kind, spec, Origin::Override("--daemon"));
    }
    for (kind, s) in &out.0 {
        if s.tasks == 0 || s.tasks > MAX_DAEMON_TASKS {
            let origin = origins.get(kind).cloned().unwrap_or(Origin::Default);
            return Err(invalid(
                &origin,
                &format!("daemons.{kind}.tasks"),
                format!(
                    "{} is outside 1-{MAX_DAEMON_TASKS} (use enabled: false or {kind}=off to switch it off)",
                    s.tasks
                ),
            ));
        }
    }
    Ok(out)
}

pub use ingest_protocol::profile::{Notification, Profile};

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

/// The collection profiles the server knows.
#[derive(Debug, Clone, Default)]
pub struct Profiles {
    dir: Option<PathBuf>,
    by_name: BTreeMap<String, Profile>,
}

/// A submission named a profile the profiles directory does not have.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown profile {name:?}: the profiles directory {dir} has no such profile")]
pub struct UnknownProfile {
    /// The name given.
    pub name: String,
    /// The profiles directory.
    pub dir: String,
}

impl Profiles {
    /// No profiles directory: any profile name is accepted, none has settings.
    pub fn unrestricted() -> Profiles {
        Profiles::default()
    }

    /// Exactly these profiles (tests, embedding).
    pub fn from_profiles(profiles: impl IntoIterator<Item = Profile>) -> Profiles {
        Profiles {
            dir: Some(PathBuf::from("<in memory>")),
            by_name: profiles.into_iter().map(|p| (p.name.clone(), p)).collect(),
        }
    }

    /// Loads every `*.yaml` / `*.yml` file of `dir` (hidden files skipped),
    /// one profile each.
    ///
    /// # Errors
    /// [`ConfigError`] naming the file and the field: unreadable or
    /// malformed files, invalid values, two files with the same name, or a
    /// directory with no profile at all.
    pub fn load(dir: &Path) -> Result<Profiles, ConfigError> {
        let entries = std::fs::read_dir(dir).map_err(|source| ConfigError::Read {
            what: "profiles directory",
            path: dir.to_path_buf(),
            source,
        })?;
        let mut files = Vec::new();
        for entry in entries {
            let path = entry
                .map_err(|source| ConfigError::Read {
                    what: "profiles directory",
                    path: dir.to_path_buf(),
                    source,
                })?
                .path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            let yaml = matches!(
                path.extension().and_then(|e| e.to_str()),
                Some("yaml" | "yml")
            );
            if yaml && !name.starts_with('.') && path.is_file() {
                files.push(path);
            }
        }
        files.sort();
        let mut by_name: BTreeMap<String, Profile> = BTreeMap::new();
        let mut sources: BTreeMap<String, PathBuf> = BTreeMap::new();
        for path in files {
            let profile = load_profile(&path)?;
            if let Some(first) = sources.get(&profile.name) {
                return Err(invalid(
                    &Origin::Named(format!("profiles directory {}", dir.display())),
                    "name",
                    format!(
                        "profile files {} and {} both define {:?}",
                        first.display(),
                        path.display(),
                        profile.name
                    ),
                ));
            }
            sources.insert(profile.name.clone(), path);
            by_name.insert(profile.name.clone(), profile);
        }
        if by_name.is_empty() {
            return Err(invalid(
                &Origin::Named(format!("profiles directory {}", dir.display())),
                "profiles_dir",
                format!(
                    "{} holds no profile (*.yaml, *.yml); every submission would be refused",
                    dir.display()
                ),
            ));
        }
        Ok(Profiles {
            dir: Some(dir.to_path_buf()),
            by_name,
        })
    }

    /// Whether only the listed profiles are accepted.
    pub fn is_restricted(&self) -> bool {
        self.dir.is_some()
    }

    /// A profile's settings.
    pub fn get(&self, name: &str) -> Option<&Profile> {
        self.by_name.get(name)
    }

    /// Checks a profile name a submission gives.
    ///
    /// # Errors
    /// [`UnknownProfile`] when the set is restricted and has no such profile.
    pub fn check(&self, name: &str) -> Result<Option<&Profile>, UnknownProfile> {
        match (&self.dir, self.by_name.get(name)) {
            (_, Some(p)) => Ok(Some(p)),
            (None, None) => Ok(None),
            (Some(dir), None) => Err(UnknownProfile {
                name: name.to_string(),
                dir: dir.display().to_string(),
            }),
        }
    }

    /// Every profile, by name.
    pub fn iter(&self) -> impl Iterator<Item = &Profile> {
        self.by_name.values()
    }

    /// How many profiles there are.
    pub fn len(&self) -> usize {
        self.by_name.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }
}

fn load_profile(path: &Path) -> Result<Profile, ConfigError> {
    let what = "profile file";
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        what,
        path: path.to_path_buf(),
        source,
    })?;
    let p: Profile = serde_norway::from_str(&text).map_err(|e| ConfigError::Parse {
        what,
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    let origin = Origin::Named(format!("profile file {}", path.display()));
    validate_profile(&p).map_err(|(field, reason)| invalid(&origin, field, reason))?;
    Ok(p)
}

fn validate_profile(p: &Profile) -> Result<(), (&'static str, String)> {
    let n = &p.name;
    if n.trim().is_empty() {
        return Err(("name", "is empty".into()));
    }
    if n.len() > 200
        || n == "."
        || n == ".."
        || n.contains('/')
        || n.chars().any(|c| c.is_control() || c.is_whitespace())
    {
        return Err((
            "name",
            format!("{n:?} must be one ZooKeeper path segment: no '/', spaces or control characters, not '.' or '..', at most 200 bytes"),
        ));
    }
    if let Some(pr) = p.priority {
        if pr > ingest_events::command::MAX_PRIORITY {
            return Err(("priority", format!("{pr} is outside 0-99")));
        }
    }
    if let Some(url) = &p.notification.callback_url {
        match reqwest::Url::parse(url) {
            Ok(u) if matches!(u.scheme(), "http" | "https") => {}
            Ok(u) => {
                return Err((
                    "notification.callback_url",
                    format!("{url:?} has scheme {:?}; use http or https", u.scheme()),
                ))
            }
            Err(e) => {
                return Err((
                    "notification.callback_url",
                    format!("{url:?} is not a URL ({e})"),
                ))
            }
        }
    }
    for e in &p.notification.emails {
        let ok = match e.split_once('@') {
            Some((user, domain)) => {
                !user.is_empty()
                    && domain.contains('.')
                    && !domain.contains('@')
                    && !e.chars().any(|c| c.is_whitespace() || c.is_control())
            }
            None => false,
        };
        if !ok {
            return Err((
                "notification.emails",
                format!("{e:?} is not an e-mail address"),
            ));
        }
    }
    Ok(())
}

/// The EZID settings `--ezid-url` asks for, with the password from
/// `INGEST_EZID_PASSWORD` or `--ezid-password-file`.
fn ezid_settings(args: &IdArgs) -> Result<Option<EzidSettings>, ConfigError> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

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
            assert!(c.lifecycle().is_ok());
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
                (c.listen, c.daemons, c.provisioning, c.max_body_bytes)
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
        let c = ServeConfig::load_with_env(&args, &GlobalOverrides::default(), &token_env())
            .expect("load");
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
}

#[cfg(test)]
mod section_tests {
    use super::*;

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
