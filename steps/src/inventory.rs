//! The object inventory: every version of every object the engine stored,
//! kept in a `sled::Tree` of the engine's data directory.
//!
//! Values are JSON ([`ObjectVersionRecord`]), so other tools can read them.
//! Keys, in the one tree the caller gives:
//!
//! | key | value |
//! |---|---|
//! | `o/<ark>\0<version, u32 big-endian>` | the record, JSON |
//! | `h/<ark>` | the latest version, u32 big-endian |
//! | `l/<collection>\0<local id>` | the ark bound to the local id |
//!
//! The `\0` ends the ark and the collection, so one ark's keys never mix
//! with another's (`ark:/1/a` and `ark:/1/a/b`); arks and collections with a
//! NUL are refused. [`Inventory::record`] writes a record, the head and the
//! local-id entries in one sled transaction.
//!
//! The store itself ([`Inventory`], a sled tree) is the `store` feature;
//! the record types are always here.
//!
//! ```
//! use ingest_steps::inventory::{Inventory, ObjectVersionRecord};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let db = sled::Config::new().temporary(true).open()?;
//! let inventory = Inventory::new(db.open_tree("inventory")?);
//! let record = ObjectVersionRecord {
//!     ark: "ark:/99999/fk4abc".into(),
//!     version: 1,
//!     collection: "demo_content".into(),
//!     local_ids: vec!["item-1".into()],
//!     files: vec![],
//!     storage_targets: vec!["local".into()],
//!     jid: "jid0000000001".into(),
//!     bid: "bid0000000001".into(),
//!     recorded_at: chrono::Utc::now(),
//!     erc: Default::default(),
//! };
//! assert!(inventory.record(&record)?.new);
//! assert_eq!(inventory.by_local_id("demo_content", "item-1")?.as_deref(), Some("ark:/99999/fk4abc"));
//! # Ok(())
//! # }
//! ```
#![warn(missing_docs)]

#[cfg(feature = "store")]
mod store;
#[cfg(feature = "store")]
pub use store::{Inventory, InventoryError};

pub use ingest_protocol::inventory::{InventoryFile, ObjectVersionRecord};

/// What [`Inventory::record`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordOutcome {
    /// `true` when the record was written; `false` when the same record was
    /// already there.
    pub new: bool,
}
