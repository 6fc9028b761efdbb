//! The object side-trees kept beside the log in the data directory: the
//! inventory of stored object versions and the ark minter.

use anyhow::{Context, Result};
use ingest_events::log::Log;
use ingest_steps::inventory::Inventory;
use ingest_steps::noid::Minter;

use crate::ezid::{ArkMinter, Ezid, EzidSettings};

/// The blade length of minted arks: 29^8 (about 5 * 10^11) names per shoulder.
pub const MINTED_BLADE_LEN: usize = 8;

/// Where arks come from.
#[derive(Debug, Clone)]
pub struct MinterSettings {
    /// The Name Assigning Authority Number of minted arks.
    pub naan: String,
    /// The shoulder of minted arks.
    pub shoulder: String,
    /// EZID, when arks come from it instead of the built-in NOID minter.
    pub ezid: Option<EzidSettings>,
}

/// Opens the inventory in its tree beside `log` (alone, for readers such
/// as `ingest check`).
///
/// # Errors
/// When the tree cannot be opened.
pub fn open_inventory(log: &Log) -> Result<Inventory> {
    Ok(Inventory::new(
        log.side_tree("inventory")
            .context("cannot open the inventory")?,
    ))
}

/// Opens the inventory and the ark minter in trees beside `log`.
///
/// # Errors
/// When a tree cannot be opened or the minter's settings are unusable; the
/// message names which.
pub fn open(log: &Log, settings: &MinterSettings) -> Result<(Inventory, ArkMinter)> {
    let inventory = open_inventory(log)?;
    let minter = match &settings.ezid {
        Some(ezid) => ArkMinter::Ezid(Ezid::new(ezid.clone()).context("the EZID settings")?),
        None => {
            let (naan, shoulder) = (&settings.naan, &settings.shoulder);
            ArkMinter::Noid(
                Minter::open(
                    log.side_tree("minter").context("cannot open the minter")?,
                    naan,
                    shoulder,
                    MINTED_BLADE_LEN,
                )
                .with_context(|| format!("the ark minter (--naan {naan} --shoulder {shoulder})"))?,
            )
        }
    };
    tracing::info!(source = %minter.describe(), "arks");
    Ok((inventory, minter))
}

/// The most bytes of a requested ark quoted in a refusal.
const ARK_SHOWN: usize = 128;

/// The stored version an access request names, as the inventory has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestedVersion {
    /// The version number (the latest's when the request asked for 0).
    pub version: u32,
    /// The bytes of the version's files (every file of its state, those
    /// deduplicated into earlier versions included: the container holds
    /// them all), which pick the small or the large queue.
    pub size: u64,
}

/// Why an access request's object cannot be assembled.
///
/// ### Handling
/// The server answers 404 `not_found` naming the ark (and version) for the
/// first two, 500 for the third; nothing is queued.
#[derive(Debug, thiserror::Error)]
pub enum RequestedVersionError {
    /// The inventory has no version of the ark.
    #[error("no object {ark} in the inventory: only stored objects can be assembled")]
    UnknownArk {
        /// The ark (cut).
        ark: String,
    },
    /// The ark has versions, but not this one.
    #[error("object {ark} has no version {version} (its latest is {latest})")]
    UnknownVersion {
        /// The ark (cut).
        ark: String,
        /// The version asked for.
        version: u32,
        /// The object's latest version.
        latest: u32,
    },
    /// A version was named for the whole object, which has every version.
    #[error("the whole object of {ark} (content object) has every version: leave the version out")]
    VersionOfWholeObject {
        /// The ark (cut).
        ark: String,
    },
    /// The inventory could not be read.
    #[error("the inventory failed: {0}")]
    Inventory(#[from] ingest_steps::inventory::InventoryError),
}

impl RequestedVersionError {
    /// The error for an ark the inventory does not know (cut as every
    /// other message of this type); the server gives it too for an object
    /// a depositor may not see, so the two cannot be told apart.
    pub fn unknown_ark(ark: &str) -> RequestedVersionError {
        RequestedVersionError::UnknownArk {
            ark: ingest_protocol::cut(ark, ARK_SHOWN).into_owned(),
        }
    }
}

/// The version `version` (0: the latest) of `ark` and its size, from the
/// inventory.
///
/// # Errors
/// [`RequestedVersionError`]: an ark or version the inventory does not know
/// (named, cut to 128 bytes), or an inventory that cannot be read.
pub fn requested_version(
    inventory: &Inventory,
    ark: &str,
    version: u32,
) -> Result<RequestedVersion, RequestedVersionError> {
    let shown = || ingest_protocol::cut(ark, ARK_SHOWN).into_owned();
    let Some(latest) = inventory.latest(ark)? else {
        return Err(RequestedVersionError::unknown_ark(ark));
    };
    let record = if version == 0 || version == latest.version {
        latest
    } else {
        inventory
            .version(ark, version)?
            .ok_or_else(|| RequestedVersionError::UnknownVersion {
                ark: shown(),
                version,
                latest: latest.version,
            })?
    };
    Ok(RequestedVersion {
        version: record.version,
        size: record
            .files
            .iter()
            .fold(0u64, |sum, f| sum.saturating_add(f.size)),
    })
}

/// What an access request assembles of `ark`: the version `version` (0:
/// the latest), or with `whole` the whole object, whose size is the sum of
/// every version's (the container holds each version's files) and whose
/// version is the latest.
///
/// # Errors
/// As [`requested_version`], and
/// [`RequestedVersionError::VersionOfWholeObject`] for a version named with
/// `whole`.
pub fn requested(
    inventory: &Inventory,
    ark: &str,
    version: u32,
    whole: bool,
) -> Result<RequestedVersion, RequestedVersionError> {
    if !whole {
        return requested_version(inventory, ark, version);
    }
    if version != 0 {
        return Err(RequestedVersionError::VersionOfWholeObject {
            ark: ingest_protocol::cut(ark, ARK_SHOWN).into_owned(),
        });
    }
    let versions = inventory.versions(ark)?;
    let Some(latest) = versions.last() else {
        return Err(RequestedVersionError::unknown_ark(ark));
    };
    Ok(RequestedVersion {
        version: latest.version,
        size: versions
            .iter()
            .flat_map(|v| &v.files)
            .fold(0u64, |sum, f| sum.saturating_add(f.size)),
    })
}
