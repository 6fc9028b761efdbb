//! Where ZooKeeper is: one declaration of the `--zk*` options, flattened
//! into `serve`, `worker` and the CLI's ZooKeeper commands, and one place
//! that turns settings into a [`ZkConfig`].

use std::time::Duration;

use clap::Args;
use ingest_projections::ZkConfig;
use serde::{Deserialize, Serialize};

/// The default ZooKeeper session timeout, in seconds.
pub const DEFAULT_SESSION_TIMEOUT_SECS: f64 = 6.0;
/// The default deadline of one ZooKeeper call, in seconds.
pub const DEFAULT_REQUEST_TIMEOUT_SECS: f64 = 10.0;

/// The `--zk*` options. Every field is optional so that a configuration
/// file can set what the command line does not.
#[derive(Debug, Clone, Default, PartialEq, Args, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ZkArgs {
    /// ZooKeeper connect string: host:port[,host:port...].
    #[arg(long = "zk", env = "INGEST_ZK", value_name = "HOSTS")]
    pub zk: Option<String>,
    /// The node under which the Merritt tree lives (a chroot; created when missing) [default: /].
    #[arg(long = "zk-root", env = "INGEST_ZK_ROOT", value_name = "PATH")]
    pub zk_root: Option<String>,
    /// ZooKeeper session timeout in seconds (a dead holder's locks and leadership go after at most this long) [default: 6].
    #[arg(
        long = "zk-session-timeout",
        env = "INGEST_ZK_SESSION_TIMEOUT",
        value_name = "SECS"
    )]
    pub zk_session_timeout: Option<f64>,
    /// Deadline of every ZooKeeper call, in seconds [default: 10].
    #[arg(long = "zk-timeout", env = "INGEST_ZK_TIMEOUT", value_name = "SECS")]
    pub zk_timeout: Option<f64>,
}

/// Why ZooKeeper settings cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ZkSettingsError {
    /// No connect string was given where one is needed.
    #[error("give the ZooKeeper connect string with --zk HOST:PORT (or set INGEST_ZK)")]
    MissingHosts,
    /// A value is out of range or malformed; the message names the option.
    #[error("{0}")]
    Invalid(String),
}

/// Where ZooKeeper is, resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct ZooKeeperSettings {
    /// `host:port[,host:port...]`; `None` runs without ZooKeeper (no
    /// projection, no worker fencing).
    pub hosts: Option<String>,
    /// The chroot of the Merritt tree (`/` for none).
    pub root: String,
    /// The session timeout.
    pub session_timeout: Duration,
    /// The deadline of one call.
    pub request_timeout: Duration,
}

impl ZooKeeperSettings {
    /// The client configuration, or `None` without hosts. This is the one
    /// place a [`ZkConfig`] is built from settings.
    pub fn zk_config(&self) -> Option<ZkConfig> {
        let hosts = self.hosts.as_ref()?;
        let mut c = ZkConfig::new(hosts.clone()).with_root(self.root.clone());
        c.session_timeout = self.session_timeout;
        c.request_timeout = self.request_timeout;
        c.connect_timeout = self.request_timeout;
        Some(c)
    }
}

fn seconds(value: f64, what: &str) -> Result<Duration, ZkSettingsError> {
    if !value.is_finite() || value <= 0.0 || value > 86_400.0 {
        return Err(ZkSettingsError::Invalid(format!(
            "{what} must be a number of seconds between 0 and 86400, got {value}"
        )));
    }
    Ok(Duration::from_secs_f64(value))
}

impl ZkArgs {
    /// Resolves the options with their defaults.
    ///
    /// # Errors
    /// [`ZkSettingsError::Invalid`] naming the option at fault.
    pub fn settings(&self) -> Result<ZooKeeperSettings, ZkSettingsError> {
        let root = self.zk_root.clone().unwrap_or_else(|| "/".into());
        check_root(&root).map_err(ZkSettingsError::Invalid)?;
        let settings = ZooKeeperSettings {
            hosts: self
                .zk
                .as_ref()
                .map(|h| h.trim().to_string())
                .filter(|h| !h.is_empty()),
            root,
            session_timeout: seconds(
                self.zk_session_timeout
                    .unwrap_or(DEFAULT_SESSION_TIMEOUT_SECS),
                "--zk-session-timeout",
            )?,
            request_timeout: seconds(
                self.zk_timeout.unwrap_or(DEFAULT_REQUEST_TIMEOUT_SECS),
                "--zk-timeout",
            )?,
        };
        if let Some(c) = settings.zk_config() {
            c.validate().map_err(ZkSettingsError::Invalid)?;
        }
        Ok(settings)
    }

    /// The client configuration; ZooKeeper is required here.
    ///
    /// # Errors
    /// [`ZkSettingsError::MissingHosts`] without `--zk`, or an invalid
    /// option.
    pub fn require(&self) -> Result<ZkConfig, ZkSettingsError> {
        self.settings()?
            .zk_config()
            .ok_or(ZkSettingsError::MissingHosts)
    }
}

/// Checks a chroot: absolute, no trailing or double slash.
///
/// # Errors
/// What is wrong with it.
pub fn check_root(root: &str) -> Result<(), String> {
    if !root.starts_with('/') || (root.len() > 1 && root.ends_with('/')) || root.contains("//") {
        return Err(format!(
            "{root:?} is not an absolute ZooKeeper path like / or /ingest"
        ));
    }
    Ok(())
}
