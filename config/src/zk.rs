//! Where ZooKeeper is: one declaration of the `--zk*` options, flattened
//! into `serve`, `worker` and the CLI's ZooKeeper commands, and one place
//! that turns settings into a [`ZkConfig`].

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use ingest_projections::{Credentials, DigestId, ZkAccess, ZkConfig};

use crate::ValueError;
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
    /// A file holding this process's ZooKeeper digest credentials, one line user:password (or set INGEST_ZK_AUTH to user:password). With credentials, every node the engine creates is writable by this identity only and readable by anyone; without, the tree is open to anyone who reaches ZooKeeper.
    #[arg(
        long = "zk-auth-file",
        env = "INGEST_ZK_AUTH_FILE",
        value_name = "FILE"
    )]
    pub zk_auth_file: Option<PathBuf>,
    /// The workers' digest identity, user:BASE64 (`ingest zk-digest` prints it from their credentials): given the right to create and delete lock nodes under jobs, batches and /locks/{localid,storage,inventory}, and nothing else. Needed by the engine when workers run as other processes.
    #[arg(
        long = "zk-worker-identity",
        env = "INGEST_ZK_WORKER_IDENTITY",
        value_name = "USER:DIGEST"
    )]
    pub zk_worker_identity: Option<String>,
    /// With credentials: let anyone (also unauthenticated Merritt services) create and delete object locks under /locks/localid, /locks/storage and /locks/inventory, for a deployment beside Merritt's storage and inventory services.
    #[arg(long = "zk-open-object-locks", env = "INGEST_ZK_OPEN_OBJECT_LOCKS")]
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub zk_open_object_locks: bool,
    /// Merritt's services' digest identity, user:BASE64 (`ingest zk-digest` prints it from their credentials): given read, write, create and delete (not admin) on /jobs, /batches, /access and /locks and everything under them, so that mrt-zk clients authenticated as it can write what adoption mode (--foreign-writes adopt) takes; anonymous clients stay read-only. Needs --zk-auth-file.
    #[arg(
        long = "zk-merritt-identity",
        env = "INGEST_ZK_MERRITT_IDENTITY",
        value_name = "USER:DIGEST"
    )]
    pub zk_merritt_identity: Option<String>,
}

/// The variable that may hold `user:password` instead of a file.
pub const AUTH_ENV: &str = "INGEST_ZK_AUTH";

/// Reads credentials from `file`, else from [`AUTH_ENV`]; `None` when
/// neither is set. The secret is never quoted in an error.
///
/// # Errors
/// The file cannot be read or does not hold `user:password`.
pub fn read_credentials(file: Option<&Path>) -> Result<Option<Credentials>, ZkSettingsError> {
    let (text, from) = match file {
        Some(path) => {
            let meta = std::fs::metadata(path).map_err(|e| {
                ZkSettingsError::Invalid(format!(
                    "cannot read the ZooKeeper credentials file {}: {e}",
                    path.display()
                ))
            })?;
            if meta.len() > 4096 {
                return Err(ZkSettingsError::Invalid(format!(
                    "the ZooKeeper credentials file {} is larger than 4096 bytes",
                    path.display()
                )));
            }
            let text = std::fs::read_to_string(path).map_err(|e| {
                ZkSettingsError::Invalid(format!(
                    "cannot read the ZooKeeper credentials file {}: {e}",
                    path.display()
                ))
            })?;
            (text, format!("the file {}", path.display()))
        }
        None => match std::env::var(AUTH_ENV) {
            Ok(text) if !text.is_empty() => (text, AUTH_ENV.to_string()),
            _ => return Ok(None),
        },
    };
    Credentials::parse(&text).map(Some).map_err(|reason| {
        ZkSettingsError::Invalid(format!("ZooKeeper credentials in {from}: {reason}"))
    })
}

/// Builds the access settings: credentials from `auth_file` (or the
/// environment), the workers' identity, and the object-lock opening.
///
/// # Errors
/// Unreadable or malformed credentials, a malformed identity, or options
/// that need credentials given without them.
pub fn access(
    auth_file: Option<&Path>,
    identities: Identities<'_>,
    open_object_locks: bool,
) -> Result<ZkAccess, ZkSettingsError> {
    let credentials = read_credentials(auth_file)?;
    let parse = |text: Option<&str>, flag: &str| {
        text.map(str::trim)
            .filter(|w| !w.is_empty())
            .map(|w| {
                DigestId::parse(w).map_err(|r| ZkSettingsError::Invalid(format!("{flag}: {r}")))
            })
            .transpose()
    };
    let worker = parse(identities.worker, "--zk-worker-identity")?;
    let merritt = parse(identities.merritt, "--zk-merritt-identity")?;
    if credentials.is_none() && (worker.is_some() || merritt.is_some() || open_object_locks) {
        return Err(ZkSettingsError::Invalid(
            "--zk-worker-identity, --zk-merritt-identity and --zk-open-object-locks need ZooKeeper credentials (--zk-auth-file or INGEST_ZK_AUTH): without them every node is open to anyone".into(),
        ));
    }
    Ok(ZkAccess {
        credentials,
        worker,
        open_object_locks,
        merritt,
    })
}

/// The digest identities other than this process's that the nodes it
/// creates let in (`user:BASE64` each, as given).
#[derive(Debug, Clone, Copy, Default)]
pub struct Identities<'a> {
    /// The workers' (`--zk-worker-identity`).
    pub worker: Option<&'a str>,
    /// Merritt's services' (`--zk-merritt-identity`).
    pub merritt: Option<&'a str>,
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
    /// Credentials and node ACLs.
    pub access: ZkAccess,
}

impl ZooKeeperSettings {
    /// The client configuration, or `None` without hosts. This is the one
    /// place a [`ZkConfig`] is built from settings.
    pub fn zk_config(&self) -> Option<ZkConfig> {
        let hosts = self.hosts.as_ref()?;
        let mut c = ZkConfig::new(hosts.clone())
            .with_root(self.root.clone())
            .with_access(self.access.clone());
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
        check_root(&root).map_err(|e| ZkSettingsError::Invalid(e.to_string()))?;
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
            access: access(
                self.zk_auth_file.as_deref(),
                Identities {
                    worker: self.zk_worker_identity.as_deref(),
                    merritt: self.zk_merritt_identity.as_deref(),
                },
                self.zk_open_object_locks,
            )?,
        };
        if let Some(c) = settings.zk_config() {
            c.validate()
                .map_err(|e| ZkSettingsError::Invalid(e.to_string()))?;
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

/// Logs at WARN that the tree is open to anyone, when it is: once at the
/// start of `serve` and `worker`.
pub fn warn_if_open(access: &ZkAccess) {
    if access.is_open() {
        tracing::warn!("ZooKeeper access is open: no credentials are configured (--zk-auth-file or INGEST_ZK_AUTH), so every node is created world:anyone ALL and anyone who reaches ZooKeeper can change the queue or stop the projection; see docs/security.md, \"ZooKeeper access control\"");
    } else if let Some(c) = &access.credentials {
        tracing::info!(
            user = c.user(),
            "ZooKeeper digest authentication on; nodes created with ACLs"
        );
    }
}

/// Checks a chroot: absolute, no trailing or double slash.
///
/// # Errors
/// What is wrong with it.
pub fn check_root(root: &str) -> Result<(), ValueError> {
    if !root.starts_with('/') || (root.len() > 1 && root.ends_with('/')) || root.contains("//") {
        return Err(ValueError::NotAbsoluteRoot(root.to_string()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn worker_only(worker: &str) -> Identities<'_> {
        Identities {
            worker: Some(worker),
            merritt: None,
        }
    }

    #[test]
    fn a_merritt_identity_is_parsed_and_needs_credentials() {
        let dir = tempfile::tempdir().expect("tempdir");
        let good = dir.path().join("engine");
        std::fs::write(&good, "engine:s3cret-value\n").expect("write");
        let merritt = ingest_projections::Credentials::parse("merritt:m")
            .expect("valid")
            .id();
        let both = Identities {
            worker: None,
            merritt: Some(merritt.as_str()),
        };
        let a = access(Some(&good), both, false).expect("valid");
        assert_eq!(a.merritt.as_ref(), Some(&merritt));
        let e = access(None, both, false).expect_err("no credentials");
        assert!(e.to_string().contains("--zk-merritt-identity"), "{e}");
        let bad = Identities {
            worker: None,
            merritt: Some("merritt:not-a-digest"),
        };
        let e = access(Some(&good), bad, false).expect_err("bad id");
        assert!(e.to_string().starts_with("--zk-merritt-identity"), "{e}");
    }

    #[test]
    fn credentials_come_from_a_file_and_are_never_quoted() {
        let dir = tempfile::tempdir().expect("tempdir");
        let good = dir.path().join("engine");
        std::fs::write(&good, "engine:s3cret-value\n").expect("write");
        let worker = ingest_projections::Credentials::parse("worker:w")
            .expect("valid")
            .id();
        let a = access(Some(&good), worker_only(worker.as_str()), true).expect("valid");
        assert_eq!(a.credentials.as_ref().map(|c| c.user()), Some("engine"));
        assert_eq!(a.worker.as_ref(), Some(&worker));
        assert!(!format!("{a:?}").contains("s3cret"));

        let bad = dir.path().join("bad");
        std::fs::write(&bad, "no-colon-s3cret").expect("write");
        let e = access(Some(&bad), Identities::default(), false).expect_err("malformed");
        assert!(!e.to_string().contains("s3cret"), "{e}");
        assert!(e.to_string().contains("user:password"), "{e}");
        let e = access(
            Some(&dir.path().join("missing")),
            Identities::default(),
            false,
        )
        .expect_err("missing");
        assert!(e.to_string().contains("cannot read"), "{e}");
        let e = access(Some(&good), worker_only("worker:not-a-digest"), false).expect_err("bad id");
        assert!(e.to_string().contains("--zk-worker-identity"), "{e}");
        if std::env::var_os(AUTH_ENV).is_none() {
            let e = access(None, worker_only(worker.as_str()), false).expect_err("no credentials");
            assert!(e.to_string().contains("need ZooKeeper credentials"), "{e}");
            assert!(access(None, Identities::default(), false)
                .expect("open")
                .is_open());
        }
    }
}
