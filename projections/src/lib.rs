//! `ingest-projections`: what the event log implies for ZooKeeper and for
//! reports.
//!
//! The log of `ingest-events` is the source of truth; everything here is
//! derived from it by pure folds, so it can be rebuilt, replayed and diffed at
//! any time:
//! - the [`Projector`] turns each recorded event into ZooKeeper node
//!   operations ([`Op`]) in Merritt's queue layout (mrt-zk 2.x, see
//!   [`layout`]), valid against ZooKeeper's rules when applied in order, and
//!   the same for the same log, byte for byte;
//! - a [`Tree`] holds nodes in memory with ZooKeeper's rules, prints them
//!   ([`Tree::dump_yaml`]), compares them ([`Tree::diff`]) and can be
//!   [`materialize`]d at any earlier position or time;
//! - [`Views`] folds the same events into per-batch, per-queue and
//!   per-collection reports;
//! - the [`Sink`] applies the operations to a live ZooKeeper, many events per
//!   `multi` transaction ([`batches_by_size`], [`txn`]) together with a
//!   version-checked checkpoint, exactly once, under leader election
//!   ([`leader`]); [`rebuild`] converges a live tree back to the log, diffs
//!   it and repairs it; [`zk`] holds the client plumbing (deadlines, errors,
//!   reading a live tree back).
//!
//! ```
//! use chrono::TimeZone;
//! use ingest_events::command::{decide, Command};
//! use ingest_events::event::{Actor, Erc, PayloadType, Submission, SubmissionMode};
//! use ingest_events::log::{AppendRequest, Log, LogConfig};
//! use ingest_events::{Lifecycle, State};
//! use ingest_projections::{Op, Projector};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dir = tempfile::tempdir()?;
//! let log = Log::open(dir.path(), &LogConfig::default())?;
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
//! let uuid = uuid::Uuid::from_u128(1);
//! let command = Command::SubmitBatch { uuid, submission };
//! let decision = decide(&State::new(), &Lifecycle::builtin(), &command)?;
//! log.append(&AppendRequest {
//!     actor: Actor::depositor("alice"),
//!     correlation_id: uuid::Uuid::from_u128(2),
//!     timestamp: chrono::Utc.with_ymd_and_hms(2024, 5, 16, 10, 11, 12).unwrap(),
//!     expectations: decision.expectations,
//!     events: decision.events,
//! })?
//! .expect("no concurrent writer");
//!
//! let mut projector = Projector::new();
//! let base = projector.init()?; // /batches, /jobs/states/pending, /locks/queue, …
//! assert!(base.ops.iter().all(|op| matches!(op, Op::Create { .. })));
//! for record in log.read_from(1) {
//!     let event_ops = projector.project(&record?)?;
//!     assert_eq!(event_ops.position, 1);
//!     assert_eq!(event_ops.ops[0], Op::create("/batches/bid0000000001", ""));
//! }
//! assert_eq!(
//!     projector.tree().dump_yaml(Some("/batches/bid0000000001/status")),
//!     "/batches/bid0000000001/status:\n  \
//!        status: Pending\n  \
//!        last_modified: 2024-05-16 10:11:12 +0000\n  \
//!        message: \"\"\n"
//! );
//! # Ok(())
//! # }
//! ```
#![deny(missing_docs)]

pub mod acl;
pub mod checkpoint;
pub mod consistency;
pub mod ids;
pub mod layout;
pub mod leader;
pub mod materialize;
pub mod ops;
pub mod projector;
#[cfg(feature = "log")]
pub mod rebuild;
#[cfg(feature = "log")]
pub mod sink;
pub mod tree;
pub mod txn;
pub mod views;
pub mod zk;

pub use acl::{Credentials, CredentialsError, DigestId, ZkAccess};
pub use checkpoint::{Checkpoint, CheckpointError};
pub use materialize::{materialize, Until};
pub use ops::{batches_by_size, EventOps, Op, OpKind};
pub use projector::{PreImages, ProjectError, Projector};
#[cfg(feature = "log")]
pub use rebuild::{
    AdminConfig, DiffReport, Preview, Progress, RebuildReport, RepairReport, Resume,
};
#[cfg(feature = "log")]
pub use sink::{
    AdoptForeign, Adoption, AdoptionFuture, Deleted, ForeignAccessStatus, ForeignAdopter,
    ForeignBatch, ForeignBatchStatus, ForeignDelete, ForeignJob, ForeignLock, ForeignRecorder,
    ForeignStatus, GateGuard, LockChange, ProjectorGate, RecordForeign, ResumeRebuild, Resumer,
    RunMode, Sink, SinkConfig, SinkError, SinkReport, SinkState, SinkStatus, WrittenStatus,
};
pub use tree::{Differing, Tree, TreeDiff, TreeError};
pub use txn::TxnLimits;
pub use views::Views;
pub use zk::{LiveTree, ZkConfig, ZkConfigError, ZkError};
