//! The exit codes of `ingest`, one meaning each, so scripts can tell a
//! refusal from a typo from an outage:
//!
//! `ingest --help` lists them too.
//!
//! | code | meaning |
//! |---|---|
//! | 0 | done; `diff`: no drift; `check`: PASS; `verify`: the chain verifies |
//! | 1 | the queue said no: a refused command, an unknown item, drift found by `diff`, a WARN or FAIL found by `check`, a log that fails `verify` |
//! | 2 | usage: bad arguments, a data directory that does not exist, an unusable configuration |
//! | 3 | cannot reach: a server that does not answer or refuses the token, a data directory another process holds |

/// The queue refused, or `diff`/`verify` found something.
pub const REFUSED: i32 = 1;
/// The command itself cannot be run as given.
pub const USAGE: i32 = 2;
/// The engine or the server cannot be reached.
pub const UNREACHABLE: i32 = 3;

/// An error that means exit code [`USAGE`].
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Usage(pub String);

/// An error that means exit code [`UNREACHABLE`].
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Unreachable(pub String);

/// The exit code of an error that reached `main`.
pub fn code_of(e: &anyhow::Error) -> i32 {
    if e.chain()
        .any(|c| c.is::<Usage>() || c.is::<ingest_config::ConfigError>())
    {
        USAGE
    } else if e.chain().any(|c| {
        c.is::<Unreachable>()
            || matches!(
                c.downcast_ref::<ingest_client::ClientError>(),
                Some(ingest_client::ClientError::Transport { .. })
            )
            || matches!(
                c.downcast_ref::<ingest_events::LogError>(),
                Some(ingest_events::LogError::Locked { .. })
            )
            || matches!(
                c.downcast_ref::<ingest_engine::EngineError>(),
                Some(ingest_engine::EngineError::Log(
                    ingest_events::LogError::Locked { .. }
                ))
            )
    }) {
        UNREACHABLE
    } else {
        REFUSED
    }
}
