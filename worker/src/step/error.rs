//! Why a step or a call of it failed: [`StepFailure`] (the message and kind
//! recorded with a move to Failed), [`CallError`], [`StepError`] and
//! [`DataError`].

use super::Outcome;
use ingest_events::event::FailureKind;

/// Why a step failed: the message recorded with the move to Failed, and
/// the kind of the failure when it is one the engine records
/// ([`FailureKind`]: a payload whose digest does not match the
/// depositor's, which no requeue may recover).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepFailure {
    /// What went wrong, naming the URL or file.
    pub message: String,
    /// The kind; `None` for an ordinary failure.
    pub kind: Option<FailureKind>,
}

impl StepFailure {
    /// A failure of `kind`.
    pub fn of(kind: FailureKind, message: impl Into<String>) -> StepFailure {
        StepFailure {
            message: message.into(),
            kind: Some(kind),
        }
    }
}

impl From<String> for StepFailure {
    fn from(message: String) -> StepFailure {
        StepFailure {
            message,
            kind: None,
        }
    }
}

impl From<&str> for StepFailure {
    fn from(message: &str) -> StepFailure {
        StepFailure::from(message.to_string())
    }
}

impl std::fmt::Display for StepFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl From<StepFailure> for Outcome {
    fn from(f: StepFailure) -> Outcome {
        match f.kind {
            Some(kind) => Outcome::failure_of(kind, f.message),
            None => Outcome::failure(f.message),
        }
    }
}

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

/// Why a step's work stopped short, by what a caller can do about it.
///
/// ### Handling
/// The step reports a failure with the message in every case; the kind
/// says why: `Recoverable` ran out of retries (an admin may requeue once
/// the cause is fixed), `Permanent` will fail the same way again, and
/// `Refused` means the engine would not take the call (the lock was lost or
/// the job moved on): the result is discarded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StepError {
    /// It may have worked if tried again; the retries ran out.
    #[error("{0}")]
    Recoverable(String),
    /// It will not work with the same input.
    #[error("{0}")]
    Permanent(String),
    /// The engine refused the call (HTTP 409) with its code.
    #[error("{message}")]
    Refused {
        /// The engine's error code (`lock_not_held`, `inventory_conflict`…).
        code: String,
        /// The message, naming the call.
        message: String,
    },
}

impl From<StepError> for String {
    fn from(e: StepError) -> String {
        e.to_string()
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

impl From<DataError> for String {
    fn from(e: DataError) -> String {
        e.to_string()
    }
}

impl From<DataError> for StepFailure {
    fn from(e: DataError) -> StepFailure {
        StepFailure::from(e.to_string())
    }
}
