//! `ingest worker`'s configuration: the same file as `serve` (its
//! `zookeeper`, `provisioning`, `profiles_dir`, `steps`, `real_steps` and
//! `worker` keys), the environment and flags, later ones winning, key by
//! key.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use clap::Args;
use ingest_projections::ZkConfig;

use crate::file::{parse_percent, read_config_file, FileConfig, Section};
use crate::*;

/// `ingest worker`: the daemons as a separate process, reporting to a
/// server over HTTP.
#[derive(Debug, Clone, Default, Args)]
pub struct WorkerArgs {
    /// The server's base URL: the global `--engine URL` (or INGEST_ENGINE).
    #[arg(skip)]
    pub engine: String,
    /// A configuration file, YAML or TOML, the same as `serve --config` takes (its zookeeper, provisioning, profiles_dir, steps, real_steps and worker keys); flags and INGEST_* variables override it.
    #[arg(long, env = "INGEST_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Where ZooKeeper is.
    #[command(flatten)]
    pub zookeeper: ZkArgs,
    /// The daemons to run, comma-separated, as `serve --daemons` takes them: NAME, NAME=on, NAME=off or NAME=TASKS; names are job states (downloading, processing, …) or batch_pending, batch_reporting, batch_update_reporting, job_pending, access_small, access_large. Default: every daemon, one task each.
    /// (`--states` is the CLI's global lifecycle-file option, hence `--daemons`.)
    #[arg(
        long,
        env = "INGEST_WORKER_DAEMONS",
        value_delimiter = ',',
        value_name = "NAMES"
    )]
    pub daemons: Vec<String>,
    /// A file holding the worker bearer token (or set INGEST_WORKER_TOKEN).
    #[arg(long, env = "INGEST_WORKER_TOKEN_FILE", value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// This worker's name in reports [default: worker-PID].
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,
    /// Working-storage use (percent) above which provisioning holds jobs back [default: 70].
    #[arg(long, env = "INGEST_PROVISIONING_THRESHOLD", value_name = "PERCENT")]
    pub provisioning_threshold: Option<f64>,
    /// The working storage measured by provisioning (and, with real steps, where jobs download: DIR/BID/JID) [default: .].
    #[arg(long, env = "INGEST_WORKING_STORAGE", value_name = "DIR")]
    pub working_storage: Option<PathBuf>,
    /// Which steps run (simulate by default).
    #[command(flatten)]
    pub steps: StepsArgs,
    /// The collection profiles directory (callback URLs and report recipients for real steps).
    #[arg(long, env = "INGEST_PROFILES_DIR", value_name = "DIR")]
    pub profiles_dir: Option<PathBuf>,
    /// The real steps' options.
    #[command(flatten)]
    pub real: RealArgs,
    /// The largest inventory record the server accepts (its --max-record-bytes), in bytes: with real steps, an object whose record would be larger fails in Storing before anything is stored [default: 268435456, or http.max_record_bytes of the configuration file].
    #[arg(long, env = "INGEST_MAX_RECORD_BYTES", value_name = "BYTES")]
    pub max_record_bytes: Option<usize>,
    /// Serve this worker's Prometheus metrics (steps, durations, retries, refused reports) at http://ADDR/metrics, e.g. 127.0.0.1:9187 [default: not served].
    #[arg(long, env = "INGEST_WORKER_METRICS_LISTEN", value_name = "ADDR")]
    pub metrics_listen: Option<String>,
    /// The ids of the options given on the command line or in the
    /// environment, which the file does not override; `main` fills it.
    #[arg(skip)]
    pub given: BTreeSet<String>,
}

/// `ingest worker`'s resolved configuration.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// The server's base URL.
    pub engine: String,
    /// Where ZooKeeper is.
    pub zk: ZkConfig,
    /// The daemons switched on, with their task counts.
    pub daemons: Vec<(DaemonKind, u32)>,
    /// The worker bearer token.
    pub token: Secret,
    /// This worker's name in reports.
    pub name: String,
    /// Working-storage use (percent) above which provisioning waits.
    pub provisioning_threshold: f64,
    /// The working storage.
    pub working_storage: PathBuf,
    /// Which steps run.
    pub steps: StepsArgs,
    /// The collection profiles directory.
    pub profiles_dir: Option<PathBuf>,
    /// The real steps' options.
    pub real: RealArgs,
    /// Where `/metrics` is served, if anywhere.
    pub metrics_listen: Option<std::net::SocketAddr>,
}

impl WorkerArgs {
    /// Resolves the file, the environment and the flags.
    ///
    /// # Errors
    /// [`ConfigError`] naming the file, line or flag and the key.
    pub fn resolve(&self) -> Result<WorkerConfig, ConfigError> {
        self.resolve_with_env(&|name| std::env::var(name).ok())
    }

    /// As [`WorkerArgs::resolve`], reading the token variable through `env`.
    ///
    /// # Errors
    /// See [`WorkerArgs::resolve`].
    pub fn resolve_with_env(
        &self,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<WorkerConfig, ConfigError> {
        let (file, origin, base, text) = match &self.config {
            Some(path) => (
                read_config_file(path)?,
                Origin::File(path.clone()),
                path.parent().map(Path::to_path_buf),
                std::fs::read_to_string(path).unwrap_or_default(),
            ),
            None => (FileConfig::default(), Origin::Default, None, String::new()),
        };
        let rel = |p: PathBuf| match &base {
            Some(b) if p.is_relative() => b.join(p),
            _ => p,
        };
        let section = |name: &'static str| Section {
            name,
            origin: &origin,
            given: &self.given,
            text: &text,
        };
        let steps: StepsArgs = section("steps").merge(&self.steps, file.steps.as_ref())?;
        steps
            .check()
            .map_err(|r| invalid(&origin, "steps.failure_rate", r))?;
        let real = self
            .real
            .layered(&section("real_steps"), file.real_steps.as_ref())?;
        real.outbound_policy().map_err(|e| {
            invalid(
                &origin,
                "real_steps.allow_networks/allow_hosts",
                e.to_string(),
            )
        })?;
        let zk_args = ZkArgs {
            zk: self.zookeeper.zk.clone().or(file.zookeeper.hosts),
            zk_root: self.zookeeper.zk_root.clone().or(file.zookeeper.root),
            zk_session_timeout: self
                .zookeeper
                .zk_session_timeout
                .or(file.zookeeper.session_timeout_secs),
            zk_timeout: self
                .zookeeper
                .zk_timeout
                .or(file.zookeeper.request_timeout_secs),
            zk_auth_file: self
                .zookeeper
                .zk_auth_file
                .clone()
                .or(file.zookeeper.auth_file),
            zk_worker_identity: self
                .zookeeper
                .zk_worker_identity
                .clone()
                .or(file.zookeeper.worker_identity),
            zk_merritt_identity: self
                .zookeeper
                .zk_merritt_identity
                .clone()
                .or(file.zookeeper.merritt_identity),
            zk_open_object_locks: self.zookeeper.zk_open_object_locks
                || file.zookeeper.open_object_locks.unwrap_or(false),
        };
        let zk = zk_args
            .require()
            .map_err(|e| invalid(&origin, "zookeeper", e.to_string()))?;
        let names = if self.daemons.is_empty() {
            &file.worker.daemons
        } else {
            &self.daemons
        };
        let mut daemons: Vec<(DaemonKind, u32)> = Vec::new();
        let mut names = names
            .iter()
            .map(|n| n.trim())
            .filter(|n| !n.is_empty())
            .peekable();
        if names.peek().is_none() {
            // None named: every daemon with one task, as `serve` runs them
            // in process (it refused to start before).
            daemons = crate::daemons::Daemons::default()
                .iter()
                .filter(|(_, s)| s.enabled)
                .map(|(k, s)| (k, s.tasks))
                .collect();
        }
        for n in names {
            let (kind, settings) =
                parse_daemon(n).map_err(|r| invalid(&origin, "worker.daemons", r))?;
            daemons.retain(|(k, _)| *k != kind);
            if settings.enabled {
                daemons.push((kind, settings.tasks));
            }
        }
        if daemons.is_empty() {
            return Err(invalid(
                &Origin::Named("--daemons or INGEST_WORKER_DAEMONS".into()),
                "worker.daemons",
                "switches every daemon off",
            ));
        }
        let token = token(
            &TokenSpec::WORKER,
            file.worker.token_file.map(rel),
            self.token_file.clone(),
            &origin,
            env,
        )?;
        let token = required_token(token, &TokenSpec::WORKER)?;
        let provisioning_threshold = match (
            self.provisioning_threshold,
            &file.provisioning.threshold_percent,
        ) {
            (Some(t), _) => t,
            (None, Some(p)) => parse_percent(p)
                .map_err(|r| invalid(&origin, "provisioning.threshold_percent", r))?,
            (None, None) => DEFAULT_PROVISIONING_THRESHOLD,
        };
        if !(provisioning_threshold.is_finite()
            && provisioning_threshold > 0.0
            && provisioning_threshold <= 100.0)
        {
            return Err(invalid(
                &Origin::Named("--provisioning-threshold".into()),
                "provisioning.threshold_percent",
                format!("{provisioning_threshold} is outside (0, 100]"),
            ));
        }
        let metrics_listen = match crate::file::layer(
            file.worker.metrics_listen,
            self.metrics_listen.clone(),
            &origin,
            "--metrics-listen or INGEST_WORKER_METRICS_LISTEN",
        ) {
            Some(l) => Some(
                l.value
                    .trim()
                    .parse::<std::net::SocketAddr>()
                    .map_err(|e| {
                        invalid(
                            &l.origin,
                            "worker.metrics_listen",
                            format!(
                                "{:?} is not an address like 127.0.0.1:9187 ({e})",
                                ingest_protocol::cut(&l.value, 64)
                            ),
                        )
                    })?,
            ),
            None => None,
        };
        Ok(WorkerConfig {
            metrics_listen,
            engine: self.engine.clone(),
            zk,
            daemons,
            token,
            name: self
                .name
                .clone()
                .or(file.worker.name)
                .unwrap_or_else(|| format!("worker-{}", std::process::id())),
            provisioning_threshold,
            working_storage: self
                .working_storage
                .clone()
                .or(file.provisioning.working_storage.map(rel))
                .unwrap_or_else(|| PathBuf::from(".")),
            steps,
            profiles_dir: self.profiles_dir.clone().or(file.profiles_dir.map(rel)),
            real: RealArgs {
                max_record_bytes: Some(
                    self.max_record_bytes
                        .or(file.http.max_record_bytes)
                        .unwrap_or(crate::DEFAULT_MAX_RECORD_BYTES),
                ),
                ..real
            },
        })
    }
}
