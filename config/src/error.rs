//! [`ConfigError`], and where a value came from, for its messages.

use std::fmt;
use std::path::PathBuf;

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

/// What is wrong with one value, before it is known where it came from: a
/// [`ConfigError::Invalid`] names the origin and the field around it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ValueError {
    /// A ZooKeeper connect string without hosts.
    #[error("is empty; give host:port[,host:port...]")]
    NoHosts,
    /// A ZooKeeper connect string with a chroot.
    #[error("{0:?} contains '/'; give the chroot as zookeeper.root (--zk-root)")]
    HostsWithChroot(String),
    /// One host of a connect string is not `host:port`.
    #[error("{0:?} is not host:port")]
    NotHostPort(String),
    /// A chroot that is not an absolute ZooKeeper path.
    #[error("{0:?} is not an absolute ZooKeeper path like / or /ingest")]
    NotAbsoluteRoot(String),
    /// Text that is not a percentage.
    #[error("{0:?} is not a percentage like 70 or 70%")]
    NotPercent(String),
    /// A percentage outside (0, 100].
    #[error("{0} is outside (0, 100]")]
    PercentOutOfRange(f64),
    /// A simulated failure rate outside 0-1.
    #[error("--failure-rate {0} is outside 0-1")]
    FailureRate(f64),
    /// A daemon name that names no daemon.
    #[error("{name:?} is not a daemon (known: {known})")]
    NotADaemon {
        /// The name given.
        name: String,
        /// The daemons there are.
        known: String,
    },
    /// A daemon setting that is not off, on or a number of tasks.
    #[error("{text:?}: {spec:?} is not off, on or a number of tasks")]
    NotDaemonSpec {
        /// The whole setting.
        text: String,
        /// Its value.
        spec: String,
    },
    /// A daemon's task count outside 1 to the most.
    #[error("{text:?}: the task count is outside 1-{max}")]
    TaskCount {
        /// The whole setting.
        text: String,
        /// The most tasks a daemon runs.
        max: u32,
    },
}

/// Where a value came from, for error messages.
#[derive(Debug, Clone)]
pub(crate) enum Origin {
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

pub(crate) fn invalid(origin: &Origin, field: &str, reason: impl fmt::Display) -> ConfigError {
    ConfigError::Invalid {
        origin: origin.to_string(),
        field: field.to_string(),
        reason: reason.to_string(),
    }
}
