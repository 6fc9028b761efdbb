//! `ingest`: the engine, the CLI, the HTTP API and the server of an
//! event-sourced ingest queue for digital-preservation repositories.
//!
//! The binary `ingest` is thin glue over [`cli::run`]. The [`engine::Engine`]
//! is the single writer of the event log kept by `ingest-events`.
#![deny(missing_docs)]

pub mod api;
pub mod cli;
pub mod config;
pub mod engine;
pub mod ezid;
pub mod history;
pub mod metrics;
pub mod remote;
pub mod serve;
pub mod service;
pub mod submission;
pub mod worker;
pub mod zkcmd;

/// Sets up tracing on stderr, human-readable or JSON, filtered by
/// `INGEST_LOG` (or `RUST_LOG`), default `info` for `ingest` crates and `warn`
/// for the rest.
pub fn init_tracing(format: cli::LogFormat) {
    use tracing_subscriber::EnvFilter;
    let filter = std::env::var("INGEST_LOG")
        .or_else(|_| std::env::var("RUST_LOG"))
        .unwrap_or_else(|_| "warn,ingest=info,ingest_events=info,ingest_projections=info".into());
    // Colour only on a terminal: a log file should be greppable as written.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::new(filter))
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    let _ = match format {
        cli::LogFormat::Human => builder.try_init(),
        cli::LogFormat::Json => builder.json().try_init(),
    };
}
