//! The log at archive scale: snapshots of the folded state and signed
//! checkpoints (`ingest serve`; file section `archive`).

use std::path::PathBuf;

use clap::Args;
use serde::{Deserialize, Serialize};

/// When the engine writes snapshots of its folded state and appends signed
/// checkpoints (Merkle tree heads signed with an Ed25519 key).
#[derive(Debug, Clone, PartialEq, Eq, Args, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ArchiveArgs {
    /// Write a snapshot of the folded state (DATA_DIR/snapshots) after this many events, so start-up folds only the tail of the log (0: never by count).
    #[arg(
        long,
        env = "INGEST_SNAPSHOT_EVERY_EVENTS",
        value_name = "N",
        default_value_t = 100_000
    )]
    pub snapshot_every_events: u64,
    /// Also write one when this many seconds passed since the last and events were appended (0: never by time).
    #[arg(
        long,
        env = "INGEST_SNAPSHOT_EVERY_SECS",
        value_name = "SECONDS",
        default_value_t = 600
    )]
    pub snapshot_every_secs: u64,
    /// How many snapshots to keep (the newest; at least 1).
    #[arg(
        long,
        env = "INGEST_SNAPSHOTS_KEEP",
        value_name = "N",
        default_value_t = 2
    )]
    pub snapshots_keep: usize,
    /// The Ed25519 key (PKCS#8 PEM, mode 0600; `ingest keys generate FILE` makes one) that signs checkpoints: Merkle tree heads over the log, appended as events. Without it, no checkpoints.
    #[arg(long, env = "INGEST_CHECKPOINT_KEY", value_name = "FILE")]
    pub checkpoint_key: Option<PathBuf>,
    /// Append a signed checkpoint after this many events (0: never by count).
    #[arg(
        long,
        env = "INGEST_CHECKPOINT_EVERY_EVENTS",
        value_name = "N",
        default_value_t = 10_000
    )]
    pub checkpoint_every_events: u64,
    /// Also append one when this many seconds passed since the last and events were appended (0: never by time).
    #[arg(
        long,
        env = "INGEST_CHECKPOINT_EVERY_SECS",
        value_name = "SECONDS",
        default_value_t = 600
    )]
    pub checkpoint_every_secs: u64,
    /// The zstd level (1-22) of sled's page compression for a NEW log, 0 for none (the default). It halves the log's bytes per event and costs the server about a third of its CPU per event on a virtual machine (each page compressed makes a zstd context, and each context asks the CPU for its features with CPUID, which the hypervisor traps). A log keeps what it was created with.
    #[arg(
        long,
        env = "INGEST_LOG_COMPRESSION",
        value_name = "LEVEL",
        default_value_t = 0,
        value_parser = clap::value_parser!(u8).range(0..=22)
    )]
    pub log_compression: u8,
}

impl Default for ArchiveArgs {
    fn default() -> Self {
        ArchiveArgs {
            snapshot_every_events: 100_000,
            snapshot_every_secs: 600,
            snapshots_keep: 2,
            checkpoint_key: None,
            checkpoint_every_events: 10_000,
            checkpoint_every_secs: 600,
            log_compression: 0,
        }
    }
}
