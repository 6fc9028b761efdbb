//! One retry loop for every step: an operation is tried again while its
//! error says it may go away ([`Retryable`]), at most `policy.retries`
//! times, waiting [`RetryPolicy::backoff`] between tries, and each retry is
//! recorded on the job (`POST /jobs/JID/retries`, so the history shows it)
//! or logged when there is no job.
//!
//! The decision to retry reads the error's kind, never its wording.

use std::fmt;
use std::future::Future;
use std::sync::OnceLock;
use std::time::Duration;

use crate::step::{CallError, DataError, JobCtx, Rng};

/// How a step retries recoverable errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Tries after the first.
    pub retries: u32,
    /// The first backoff (doubling, with jitter).
    pub first_backoff: Duration,
    /// The longest backoff.
    pub max_backoff: Duration,
}

impl RetryPolicy {
    /// The pause before retry number `attempt` (1 for the first retry):
    /// `first_backoff × 2^(attempt-1)`, capped at `max_backoff`, of which
    /// the upper half is random ("equal jitter"), so that workers that
    /// failed together do not all come back at the same moment. The one
    /// back-off calculator of the worker: steps' retries and idle queues'
    /// waits both use it.
    pub fn backoff(&self, attempt: u32) -> Duration {
        let doublings = attempt.saturating_sub(1).min(31);
        let capped = self
            .first_backoff
            .saturating_mul(1u32 << doublings)
            .min(self.max_backoff);
        let half = capped / 2;
        let span = u64::try_from((capped - half).as_nanos()).unwrap_or(u64::MAX);
        let random = match span {
            0 => 0,
            _ => jitter().next_u64() % span.saturating_add(1),
        };
        half + Duration::from_nanos(random)
    }
}

fn jitter() -> &'static Rng {
    static RNG: OnceLock<Rng> = OnceLock::new();
    RNG.get_or_init(Rng::from_entropy)
}

/// An error that knows whether the same call may succeed later.
pub trait Retryable: fmt::Display {
    /// `true` when trying again may succeed (no answer, a timeout, 5xx,
    /// 429, a lock held by someone else for now…).
    fn is_retryable(&self) -> bool;
}

impl Retryable for CallError {
    /// No answer, 408, 429 and 5xx are worth another try; the decision
    /// reads the client error's status, never its wording.
    fn is_retryable(&self) -> bool {
        match self {
            CallError::NoApi => false,
            CallError::Client(e) => e.is_retryable(),
        }
    }
}

impl Retryable for DataError {
    fn is_retryable(&self) -> bool {
        matches!(self, DataError::Read(_))
    }
}

/// How a retried operation ended without success.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GaveUp<E> {
    /// The last error.
    pub error: E,
    /// How many times the operation ran (1 when it failed for good at once).
    pub attempts: u32,
}

impl<E: fmt::Display> GaveUp<E> {
    /// The error's message, with the attempts when there was more than one.
    pub fn message(&self) -> String {
        match self.attempts {
            0 | 1 => self.error.to_string(),
            n => format!("{} (gave up after {n} attempts)", self.error),
        }
    }
}

/// Runs `op` until it succeeds, fails with an error that is not
/// [`Retryable::is_retryable`], or has been retried `policy.retries` times.
/// `what` names the operation in the recorded retries.
///
/// # Errors
/// [`GaveUp`] with the last error and the number of attempts.
pub async fn retry<T, E, F, Fut>(
    policy: &RetryPolicy,
    job: Option<&JobCtx>,
    what: &str,
    mut op: F,
) -> Result<T, GaveUp<E>>
where
    E: Retryable,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let mut attempt: u32 = 1;
    loop {
        match op().await {
            Ok(value) => return Ok(value),
            Err(error) if error.is_retryable() && attempt <= policy.retries => {
                let message = format!("{what}: {error}");
                match job {
                    Some(job) => job.record_retry(attempt + 1, &message).await,
                    None => {
                        tracing::warn!(attempt = attempt + 1, message = %ingest_protocol::bounded(&message), "recoverable error; retrying")
                    }
                }
                tokio::time::sleep(policy.backoff(attempt)).await;
                attempt += 1;
            }
            Err(error) => {
                return Err(GaveUp {
                    error,
                    attempts: attempt,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Duration;

    use super::*;

    #[derive(Debug, Clone, PartialEq, Eq)]
    struct E(bool);

    impl fmt::Display for E {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(if self.0 { "busy" } else { "refused" })
        }
    }

    impl Retryable for E {
        fn is_retryable(&self) -> bool {
            self.0
        }
    }

    fn policy(retries: u32) -> RetryPolicy {
        RetryPolicy {
            retries,
            first_backoff: Duration::from_millis(1),
            max_backoff: Duration::from_millis(2),
        }
    }

    #[tokio::test]
    async fn retries_only_what_may_go_away_and_counts_attempts() {
        let calls = AtomicU32::new(0);
        let r = retry(&policy(3), None, "op", || async {
            match calls.fetch_add(1, Ordering::SeqCst) {
                0 | 1 => Err(E(true)),
                _ => Ok(7),
            }
        })
        .await;
        assert_eq!(r, Ok(7));
        assert_eq!(calls.load(Ordering::SeqCst), 3);

        let calls = AtomicU32::new(0);
        let r: Result<(), _> = retry(&policy(3), None, "op", || async {
            calls.fetch_add(1, Ordering::SeqCst);
            Err(E(false))
        })
        .await;
        assert_eq!(
            r,
            Err(GaveUp {
                error: E(false),
                attempts: 1
            })
        );
        assert_eq!(calls.load(Ordering::SeqCst), 1, "a refusal is not retried");

        let r: Result<(), _> = retry(&policy(2), None, "op", || async { Err(E(true)) }).await;
        let gave_up = r.expect_err("always busy");
        assert_eq!(gave_up.attempts, 3);
        assert_eq!(gave_up.message(), "busy (gave up after 3 attempts)");
    }
}
