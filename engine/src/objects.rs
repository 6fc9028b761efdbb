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
