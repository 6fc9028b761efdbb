//! The inventory's records: what `POST /jobs/{jid}/object` sends, what
//! `GET /objects/{ark}` answers, and what the inventory stores (as JSON, so
//! other tools can read it).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// One version of one object, as recorded after it was stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectVersionRecord {
    /// The object's ark.
    pub ark: String,
    /// The version number, from 1.
    pub version: u32,
    /// The collection (profile name) the object was ingested into.
    pub collection: String,
    /// The depositor's local ids of the object, unique per collection.
    pub local_ids: Vec<String>,
    /// The files of the version.
    pub files: Vec<InventoryFile>,
    /// The names of the storage targets holding the version.
    pub storage_targets: Vec<String>,
    /// The job that stored the version.
    pub jid: String,
    /// The batch of that job.
    pub bid: String,
    /// When the version was recorded. Not part of a record's identity: a
    /// retry that records the same version later is a duplicate.
    pub recorded_at: DateTime<Utc>,
    /// The object's ERC metadata (`who`, `what`, `when`, `where`, …).
    pub erc: BTreeMap<String, String>,
}

/// One file of a recorded version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InventoryFile {
    /// The logical path in the object.
    pub path: String,
    /// Size in bytes.
    pub size: u64,
    /// Digests by algorithm name (`sha256`, `sha512`, `md5`…), lower-case hex.
    pub digests: BTreeMap<String, String>,
}
