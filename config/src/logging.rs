//! Logging on stderr for every `ingest` process: human-readable or JSON
//! lines, filtered by `INGEST_LOG` (or `RUST_LOG`).

use clap::ValueEnum;
use serde::{Deserialize, Serialize};
use tracing_subscriber::EnvFilter;

/// Log output formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Readable lines.
    Human,
    /// One JSON object per line.
    Json,
}

/// The filter when neither `INGEST_LOG` nor `RUST_LOG` is set: `info` for
/// `ingest`'s crates, `warn` for the rest.
pub const DEFAULT_FILTER: &str = "warn,ingest=info,ingest_events=info,ingest_projections=info,ingest_engine=info,ingest_server=info,ingest_worker=info,ingest_config=info,ingest_client=info";

/// Sets up tracing on stderr in `format`. A second call does nothing.
pub fn init_tracing(format: LogFormat) {
    let filter = std::env::var("INGEST_LOG")
        .or_else(|_| std::env::var("RUST_LOG"))
        .unwrap_or_else(|_| DEFAULT_FILTER.into());
    // Colour only on a terminal: a log file should be greppable as written.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::new(filter))
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Human => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}
