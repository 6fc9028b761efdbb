//! `ingest-engine`: the single writer of the event log and what reads it.
//!
//! - [`engine::Engine`] opens the log of a data directory, folds it into
//!   the current [`ingest_events::State`], and turns commands into appended
//!   events (decide, append with expected versions, flush, apply);
//! - [`service::EngineService`] runs one engine on a writer thread and
//!   groups the commands of many callers into one commit (group commit);
//!   [`service::EngineHandle`] is what the server's handlers hold;
//! - [`history`] reads one batch's or job's events as rows;
//! - [`listing`] pages through batches and jobs by filters (`GET /batches`,
//!   `GET /jobs`, `ingest batches`, `ingest jobs`);
//! - [`objects`] opens the object side-trees kept beside the log: the
//!   inventory and the ark minter ([`ezid::ArkMinter`]: NOID or EZID);
//! - [`snapshot`]: snapshots of the folded state, so start-up folds only
//!   the tail of the log;
//! - [`audit`]: signed checkpoints checked, inclusion and consistency
//!   proofs, audit bundles.
//!
//! **Architecture invariant:** only this crate (and the offline admin
//! commands of the `ingest` binary, through it) opens a log for writing;
//! workers reach the engine through the HTTP API, never through this crate.
#![deny(missing_docs)]

pub mod audit;
pub mod backup;
pub mod consistency;
pub mod engine;
pub mod ezid;
pub mod history;
pub mod listing;
pub mod objects;
pub mod service;
pub mod snapshot;
pub mod tree;
pub mod verified;

pub use engine::{Engine, EngineConfig, EngineError, Outcome, ReplicationError, Replicator};
pub use service::{EngineHandle, EngineService, ServiceError};
