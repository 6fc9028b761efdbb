//! Why a step or a call of it failed: [`StepError`] (what the engine does
//! with it, and the message recorded with a move to Failed), [`CallError`]
//! and [`DataError`].

use std::io;

use super::Outcome;
use ingest_events::event::FailureKind;

/// Why a fenced call got no usable answer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CallError {
    /// The step runs without an API (unit tests of pure steps).
    #[error("no API to call")]
    NoApi,
    /// The client's error, with the status it kept.
    #[error(transparent)]
    Client(#[from] ingest_client::ClientError),
}

/// Why a step's work stopped short, by what the engine and the step do
/// with it. The one error of the worker's steps.
///
/// ### Handling
/// The step reports a failure with the message in every case; the variant
/// says why: `Recoverable` may work if tried again (the step's retries try;
/// once they run out an admin may requeue after the cause is fixed),
/// `Permanent` will fail the same way again (with a [`FailureKind`] the
/// engine records, e.g. a payload whose digest is not the depositor's,
/// which no requeue may recover), and `Refused` means the engine would not
/// take the call (the lock was lost or the job moved on): the result is
/// discarded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StepError {
    /// It may have worked if tried again (a full disk, a timeout, a
    /// connection lost).
    #[error("{0}")]
    Recoverable(String),
    /// It will not work with the same input.
    #[error("{message}")]
    Permanent {
        /// What went wrong, naming the URL or file.
        message: String,
        /// The kind the engine records; `None` for an ordinary failure.
        kind: Option<FailureKind>,
    },
    /// The engine refused the call (HTTP 409) with its code.
    #[error("{message}")]
    Refused {
        /// The engine's error code (`lock_not_held`, `inventory_conflict`…).
        code: String,
        /// The message, naming the call.
        message: String,
    },
}

impl StepError {
    /// A permanent failure of no particular kind.
    pub fn permanent(message: impl Into<String>) -> StepError {
        StepError::Permanent {
            message: message.into(),
            kind: None,
        }
    }

    /// A permanent failure of `kind`.
    pub fn of(kind: FailureKind, message: impl Into<String>) -> StepError {
        StepError::Permanent {
            message: message.into(),
            kind: Some(kind),
        }
    }

    /// An I/O error while doing `what` (`write /work/…/system/erc.txt`):
    /// recoverable or permanent by its [`io::ErrorKind`] (see
    /// [`io_is_recoverable`]); a full file system says so.
    pub fn io(what: impl std::fmt::Display, e: &io::Error) -> StepError {
        let message = match e.kind() {
            io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded => {
                format!("cannot {what}: the file system is full ({e})")
            }
            _ => format!("cannot {what}: {e}"),
        };
        if io_is_recoverable(e.kind()) {
            StepError::Recoverable(message)
        } else {
            StepError::permanent(message)
        }
    }

    /// The message recorded with the failure.
    pub fn message(&self) -> &str {
        match self {
            StepError::Recoverable(m)
            | StepError::Permanent { message: m, .. }
            | StepError::Refused { message: m, .. } => m,
        }
    }

    /// The same error with `prefix: ` before its message.
    pub fn context(self, prefix: impl std::fmt::Display) -> StepError {
        match self {
            StepError::Recoverable(m) => StepError::Recoverable(format!("{prefix}: {m}")),
            StepError::Permanent { message, kind } => StepError::Permanent {
                message: format!("{prefix}: {message}"),
                kind,
            },
            StepError::Refused { code, message } => StepError::Refused {
                code,
                message: format!("{prefix}: {message}"),
            },
        }
    }

    /// The kind the engine records, if any.
    pub fn kind(&self) -> Option<FailureKind> {
        match self {
            StepError::Permanent { kind, .. } => *kind,
            _ => None,
        }
    }

    /// Whether trying again may succeed.
    pub fn is_recoverable(&self) -> bool {
        matches!(self, StepError::Recoverable(_))
    }
}

/// Whether an I/O error of `kind` may go away by itself: a full disk or
/// quota (space is freed), a timeout, an interruption, a busy resource, a
/// lost connection, memory. A missing file, a permission, an invalid name
/// or data will fail the same way again.
pub fn io_is_recoverable(kind: io::ErrorKind) -> bool {
    use io::ErrorKind as K;
    matches!(
        kind,
        K::StorageFull
            | K::QuotaExceeded
            | K::Interrupted
            | K::TimedOut
            | K::WouldBlock
            | K::ResourceBusy
            | K::OutOfMemory
            | K::ConnectionRefused
            | K::ConnectionReset
            | K::ConnectionAborted
            | K::NotConnected
            | K::BrokenPipe
            | K::HostUnreachable
            | K::NetworkUnreachable
            | K::NetworkDown
            | K::StaleNetworkFileHandle
    )
}

impl From<io::Error> for StepError {
    /// Recoverable or permanent by the error's kind: a full disk is not a
    /// bad path. Prefer [`StepError::io`], which names what was done.
    fn from(e: io::Error) -> StepError {
        StepError::io("do the file operation", &e)
    }
}

/// A message of the steps' older text errors: an ordinary permanent
/// failure, as such a message always was.
impl From<String> for StepError {
    fn from(message: String) -> StepError {
        StepError::permanent(message)
    }
}

impl From<&str> for StepError {
    fn from(message: &str) -> StepError {
        StepError::permanent(message)
    }
}

impl From<StepError> for Outcome {
    fn from(e: StepError) -> Outcome {
        match e {
            StepError::Permanent {
                message,
                kind: Some(kind),
            } => Outcome::failure_of(kind, message),
            other => Outcome::failure(other.to_string()),
        }
    }
}

impl crate::retry::Retryable for StepError {
    fn is_retryable(&self) -> bool {
        self.is_recoverable()
    }
}

/// Why a job's nodes could not be read.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum DataError {
    /// The step runs without a ZooKeeper session.
    #[error("no ZooKeeper session to read the job from")]
    NoSession,
    /// A read failed (connection loss, a node not there yet): retryable.
    #[error("{0}")]
    Read(String),
    /// A node's data is not what the projection writes: not retryable.
    #[error(transparent)]
    Invalid(#[from] ingest_protocol::node::NodeError),
}

impl From<DataError> for StepError {
    /// A read that failed may work again; a node that is not what the
    /// projection writes will not.
    fn from(e: DataError) -> StepError {
        match e {
            DataError::Read(m) => StepError::Recoverable(m),
            other => StepError::permanent(other.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // A full disk is worth another try and says what it is; a bad path is
    // not, and names the path.
    #[test]
    fn io_errors_are_recoverable_or_permanent_by_kind() {
        let full = StepError::io(
            "write /w/system/erc.txt",
            &io::Error::from(io::ErrorKind::StorageFull),
        );
        assert!(full.is_recoverable(), "{full:?}");
        assert!(full.message().contains("file system is full"), "{full}");
        let quota = StepError::from(io::Error::from(io::ErrorKind::QuotaExceeded));
        assert!(quota.is_recoverable(), "{quota:?}");
        let missing = StepError::io(
            "read /w/producer/a.txt",
            &io::Error::from(io::ErrorKind::NotFound),
        );
        assert!(!missing.is_recoverable(), "{missing:?}");
        assert!(missing.message().contains("/w/producer/a.txt"), "{missing}");
        assert!(!missing.message().contains("full"), "{missing}");
        let denied = StepError::from(io::Error::from(io::ErrorKind::PermissionDenied));
        assert!(
            matches!(denied, StepError::Permanent { kind: None, .. }),
            "{denied:?}"
        );
        let timeout = StepError::from(io::Error::from(io::ErrorKind::TimedOut));
        assert!(timeout.is_recoverable(), "{timeout:?}");
    }

    #[test]
    fn a_kind_reaches_the_outcome_and_context_keeps_the_variant() {
        let e = StepError::of(FailureKind::DigestMismatch, "digest").context("file a.txt");
        assert_eq!(e.message(), "file a.txt: digest");
        assert_eq!(
            Outcome::from(e),
            Outcome::failure_of(FailureKind::DigestMismatch, "file a.txt: digest")
        );
        let e = StepError::Recoverable("later".into()).context("target t");
        assert!(e.is_recoverable());
        assert_eq!(Outcome::from(e), Outcome::failure("target t: later"));
    }
}
