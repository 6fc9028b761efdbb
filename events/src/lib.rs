//! `ingest-events`: the domain and the event log of the ingest queue.
//!
//! Everything that happens to a batch or a job is an [`event::Event`]
//! appended to the log (`log::Log`), an append-only, hash-chained log in sled that
//! is the source of truth. The current state is a fold of the log
//! ([`state::State`]); a [`command::Command`] is checked against that state
//! and the [`lifecycle::Lifecycle`] by [`command::decide`], which either
//! rejects it or returns the events to append.
//!
//! This crate knows nothing of ZooKeeper or HTTP.
//!
//! The log and its storage (sled) are the default feature `log`. Without it
//! the crate is the domain alone (ids, lifecycle, events, codec, fold,
//! decisions): what a process that must never touch the log (a worker, a
//! client) depends on.
//!
//! ```
//! use ingest_events::command::{decide, Command};
//! use ingest_events::event::{Actor, Erc, PayloadType, Submission, SubmissionMode};
//! use ingest_events::lifecycle::Lifecycle;
//! use ingest_events::log::{AppendRequest, Log, LogConfig};
//! use ingest_events::state::State;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dir = tempfile::tempdir()?;
//! let log = Log::open(dir.path(), &LogConfig::default())?;
//! let lifecycle = Lifecycle::builtin();
//! let mut state = State::new();
//!
//! let submission = Submission {
//!     profile_name: "demo_content".into(),
//!     submitter: "alice".into(),
//!     payload_url: "https://example.org/object.zip".into(),
//!     payload_type: PayloadType::Container,
//!     response_type: "json".into(),
//!     submission_mode: SubmissionMode::Add,
//!     manifest: vec![],
//!     erc: Erc::default(),
//!     digest: None,
//!     extra: Default::default(),
//! };
//! let command = Command::SubmitBatch { uuid: uuid::Uuid::new_v4(), submission };
//! let decision = decide(&state, &lifecycle, &command)?;
//! let appended = log
//!     .append(&AppendRequest {
//!         actor: Actor::depositor("alice"),
//!         correlation_id: uuid::Uuid::new_v4(),
//!         timestamp: chrono::Utc::now(),
//!         expectations: decision.expectations,
//!         events: decision.events,
//!     })?
//!     .expect("no concurrent writer");
//! for record in &appended.records {
//!     state.apply(record)?;
//! }
//! assert_eq!(state.batches.len(), 1);
//! assert_eq!(log.durable_position(), 1);
//! # Ok(())
//! # }
//! ```
#![deny(missing_docs)]

pub mod append;
#[cfg(feature = "log")]
pub mod audit_index;
#[cfg(feature = "log")]
mod audit_keys;
pub mod codec;
pub mod command;
pub mod event;
pub mod frame;
pub mod ids;
pub mod lifecycle;
#[cfg(feature = "log")]
pub mod log;
pub mod merkle;
pub mod state;
mod wire;

pub use append::AppendRequest;
pub use codec::{Envelope, Hash, Recorded};
pub use command::{decide, Command, Decision, Rejection};
pub use event::{Actor, Event, StreamId};
pub use ids::{Bid, Jid, Qid};
pub use lifecycle::{AccessState, BatchState, JobState, Lifecycle};
#[cfg(feature = "log")]
pub use log::{Log, LogConfig, LogError};
pub use state::State;
