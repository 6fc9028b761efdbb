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

pub(crate) fn invalid(origin: &Origin, field: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        origin: origin.to_string(),
        field: field.to_string(),
        reason: reason.into(),
    }
}
