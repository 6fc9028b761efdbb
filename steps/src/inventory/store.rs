//! The inventory's store: a sled tree, one transaction per record.

use std::ops::Bound;

use sled::transaction::{ConflictableTransactionError, TransactionError, TransactionalTree};

use super::*;

/// The inventory over one sled tree. Cheap to clone; clones share the tree.
#[derive(Debug, Clone)]
pub struct Inventory {
    tree: sled::Tree,
}

/// Why an inventory operation failed.
///
/// Logical conflicts (the first variants) are answered by re-reading the
/// inventory; [`InventoryError::is_recoverable`] tells which errors are worth
/// a retry.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InventoryError {
    /// The version is not the next one of the ark.
    ///
    /// ### Handling
    /// Not recoverable: re-read [`Inventory::latest`]; a version was
    /// skipped or recorded by someone else.
    #[error("version {version} of {ark} cannot be recorded: the next version is {expected}")]
    VersionGap {
        /// The ark.
        ark: String,
        /// The version given.
        version: u32,
        /// The version that can be recorded now (latest + 1).
        expected: u32,
    },
    /// The version is already recorded with a different content.
    ///
    /// ### Handling
    /// Not recoverable: two jobs claim the same version; compare with
    /// [`Inventory::version`].
    #[error("version {version} of {ark} is already recorded with a different content")]
    VersionConflict {
        /// The ark.
        ark: String,
        /// The version.
        version: u32,
    },
    /// A local id of the record is bound to another ark in its collection.
    ///
    /// ### Handling
    /// Not recoverable: the ark should have been looked up with
    /// [`Inventory::by_local_id`] and reused.
    #[error(
        "local id {local_id:?} of collection {collection:?} is bound to {existing_ark}, not {ark}"
    )]
    LocalIdConflict {
        /// The collection.
        collection: String,
        /// The local id.
        local_id: String,
        /// The ark the local id is bound to.
        existing_ark: String,
        /// The ark of the refused record.
        ark: String,
    },
    /// A key part is not usable: an empty ark, or a NUL in an ark or a
    /// collection name.
    ///
    /// ### Handling
    /// Not recoverable: fix the caller.
    #[error("invalid {field} {value:?}: {reason}")]
    InvalidKey {
        /// `ark` or `collection`.
        field: &'static str,
        /// The value given.
        value: String,
        /// Why it is refused.
        reason: &'static str,
    },
    /// A stored value cannot be decoded (or, never in practice, a record
    /// cannot be encoded as JSON).
    ///
    /// ### Handling
    /// Not recoverable: the tree was written by something else or damaged.
    #[error("corrupt inventory entry {key}: {detail}")]
    Corrupt {
        /// The key, escaped.
        key: String,
        /// What is wrong.
        detail: String,
    },
    /// sled failed.
    ///
    /// ### Handling
    /// Recoverable when it is an I/O error (retry a bounded number of
    /// times); not recoverable otherwise (corruption, a sled bug).
    #[error("inventory storage error: {0}")]
    Storage(#[from] sled::Error),
}

impl InventoryError {
    /// Whether retrying the same call may succeed (sled I/O errors only).
    pub fn is_recoverable(&self) -> bool {
        matches!(self, InventoryError::Storage(sled::Error::Io(_)))
    }
}

impl Inventory {
    /// An inventory over `tree`, which it owns alone (no other keys in it).
    pub fn new(tree: sled::Tree) -> Inventory {
        Inventory { tree }
    }

    /// Records one version of an object, with its local ids, atomically.
    ///
    /// Idempotent: recording a version again with the same content (all
    /// fields but `recorded_at`) returns `new: false` and keeps the first
    /// record.
    ///
    /// # Errors
    ///
    /// [`InventoryError::VersionGap`] unless `version` is latest + 1 (1 for
    /// a new ark), [`InventoryError::VersionConflict`],
    /// [`InventoryError::LocalIdConflict`], [`InventoryError::InvalidKey`],
    /// and storage errors. Nothing is written on error.
    pub fn record(&self, rec: &ObjectVersionRecord) -> Result<RecordOutcome, InventoryError> {
        check_key("ark", &rec.ark)?;
        check_key("collection", &rec.collection)?;
        let value = serde_json::to_vec(rec).map_err(|e| corrupt(&record_key(rec), e))?;
        self.tree
            .transaction(|tx| record_in(tx, rec, &value))
            .map_err(|e| match e {
                TransactionError::Abort(e) => e,
                TransactionError::Storage(e) => InventoryError::Storage(e),
            })
    }

    /// The latest recorded version of `ark`.
    ///
    /// # Errors
    ///
    /// Storage and decoding errors.
    pub fn latest(&self, ark: &str) -> Result<Option<ObjectVersionRecord>, InventoryError> {
        match self.tree.scan_prefix(versions_prefix(ark)).next_back() {
            None => Ok(None),
            Some(entry) => decode_entry(entry).map(Some),
        }
    }

    /// Version `version` of `ark`.
    ///
    /// # Errors
    ///
    /// Storage and decoding errors.
    pub fn version(
        &self,
        ark: &str,
        version: u32,
    ) -> Result<Option<ObjectVersionRecord>, InventoryError> {
        let key = version_key(ark, version);
        match self.tree.get(&key)? {
            None => Ok(None),
            Some(value) => decode(&key, &value).map(Some),
        }
    }

    /// Every recorded version of `ark`, oldest first.
    ///
    /// # Errors
    ///
    /// Storage and decoding errors.
    pub fn versions(&self, ark: &str) -> Result<Vec<ObjectVersionRecord>, InventoryError> {
        self.tree
            .scan_prefix(versions_prefix(ark))
            .map(decode_entry)
            .collect()
    }

    /// The ark bound to `local_id` in `collection`.
    ///
    /// # Errors
    ///
    /// Storage and decoding errors.
    pub fn by_local_id(
        &self,
        collection: &str,
        local_id: &str,
    ) -> Result<Option<String>, InventoryError> {
        let key = local_id_key(collection, local_id);
        match self.tree.get(&key)? {
            None => Ok(None),
            Some(ark) => decode_ark(&key, &ark).map(Some),
        }
    }

    /// Up to `limit` arks, in byte order, starting after `after` (from the
    /// first ark when `None`): pass the last ark of a page to get the next.
    ///
    /// # Errors
    ///
    /// Storage and decoding errors.
    pub fn all_arks(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<String>, InventoryError> {
        let start = match after {
            Some(ark) => Bound::Excluded(head_key(ark)),
            None => Bound::Included(HEAD_PREFIX.to_vec()),
        };
        let mut arks = Vec::new();
        for entry in self.tree.range((start, Bound::Unbounded)) {
            let (key, _) = entry?;
            let Some(ark) = key.strip_prefix(HEAD_PREFIX) else {
                break;
            };
            if arks.len() == limit {
                break;
            }
            arks.push(decode_ark(&key, ark)?);
        }
        Ok(arks)
    }
}

/// The body of the record transaction; sled may run it more than once.
fn record_in(
    tx: &TransactionalTree,
    rec: &ObjectVersionRecord,
    value: &[u8],
) -> Result<RecordOutcome, ConflictableTransactionError<InventoryError>> {
    let key = record_key(rec);
    if let Some(existing) = tx.get(&key)? {
        let existing = decode(&key, &existing).map_err(abort)?;
        return match same_content(&existing, rec) {
            true => Ok(RecordOutcome { new: false }),
            false => Err(abort(InventoryError::VersionConflict {
                ark: rec.ark.clone(),
                version: rec.version,
            })),
        };
    }
    let expected = head_in(tx, &rec.ark)? + 1;
    if rec.version != expected {
        return Err(abort(InventoryError::VersionGap {
            ark: rec.ark.clone(),
            version: rec.version,
            expected,
        }));
    }
    bind_local_ids(tx, rec)?;
    tx.insert(key, value)?;
    tx.insert(head_key(&rec.ark), &rec.version.to_be_bytes())?;
    Ok(RecordOutcome { new: true })
}

/// The ark's latest version in the transaction, 0 when none.
fn head_in(
    tx: &TransactionalTree,
    ark: &str,
) -> Result<u32, ConflictableTransactionError<InventoryError>> {
    let key = head_key(ark);
    match tx.get(&key)? {
        None => Ok(0),
        Some(bytes) => match <[u8; 4]>::try_from(bytes.as_ref()) {
            Ok(bytes) => Ok(u32::from_be_bytes(bytes)),
            Err(_) => Err(abort(corrupt(&key, "the head is not a u32"))),
        },
    }
}

fn bind_local_ids(
    tx: &TransactionalTree,
    rec: &ObjectVersionRecord,
) -> Result<(), ConflictableTransactionError<InventoryError>> {
    for local_id in &rec.local_ids {
        let key = local_id_key(&rec.collection, local_id);
        if let Some(bound) = tx.get(&key)? {
            let existing_ark = decode_ark(&key, &bound).map_err(abort)?;
            if existing_ark != rec.ark {
                return Err(abort(InventoryError::LocalIdConflict {
                    collection: rec.collection.clone(),
                    local_id: local_id.clone(),
                    existing_ark,
                    ark: rec.ark.clone(),
                }));
            }
        }
        tx.insert(key, rec.ark.as_bytes())?;
    }
    Ok(())
}

/// Two records of one version are the same unless a field other than
/// `recorded_at` differs.
fn same_content(a: &ObjectVersionRecord, b: &ObjectVersionRecord) -> bool {
    let b = ObjectVersionRecord {
        recorded_at: a.recorded_at,
        ..b.clone()
    };
    *a == b
}

const RECORD_PREFIX: &[u8] = b"o/";
const HEAD_PREFIX: &[u8] = b"h/";
const LOCAL_ID_PREFIX: &[u8] = b"l/";

fn versions_prefix(ark: &str) -> Vec<u8> {
    [RECORD_PREFIX, ark.as_bytes(), b"\0"].concat()
}

fn version_key(ark: &str, version: u32) -> Vec<u8> {
    [versions_prefix(ark).as_slice(), &version.to_be_bytes()].concat()
}

fn record_key(rec: &ObjectVersionRecord) -> Vec<u8> {
    version_key(&rec.ark, rec.version)
}

fn head_key(ark: &str) -> Vec<u8> {
    [HEAD_PREFIX, ark.as_bytes()].concat()
}

fn local_id_key(collection: &str, local_id: &str) -> Vec<u8> {
    [
        LOCAL_ID_PREFIX,
        collection.as_bytes(),
        b"\0",
        local_id.as_bytes(),
    ]
    .concat()
}

fn check_key(field: &'static str, value: &str) -> Result<(), InventoryError> {
    let reason = if value.is_empty() {
        "it is empty"
    } else if value.contains('\0') {
        "it holds a NUL, which ends key parts"
    } else {
        return Ok(());
    };
    Err(InventoryError::InvalidKey {
        field,
        value: value.to_string(),
        reason,
    })
}

fn decode_entry(
    entry: sled::Result<(sled::IVec, sled::IVec)>,
) -> Result<ObjectVersionRecord, InventoryError> {
    let (key, value) = entry?;
    decode(&key, &value)
}

fn decode(key: &[u8], value: &[u8]) -> Result<ObjectVersionRecord, InventoryError> {
    serde_json::from_slice(value).map_err(|e| corrupt(key, e))
}

fn decode_ark(key: &[u8], value: &[u8]) -> Result<String, InventoryError> {
    String::from_utf8(value.to_vec()).map_err(|e| corrupt(key, e))
}

fn corrupt(key: &[u8], detail: impl std::fmt::Display) -> InventoryError {
    InventoryError::Corrupt {
        key: String::from_utf8_lossy(key).escape_default().to_string(),
        detail: detail.to_string(),
    }
}

fn abort(error: InventoryError) -> ConflictableTransactionError<InventoryError> {
    ConflictableTransactionError::Abort(error)
}
