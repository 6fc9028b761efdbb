//! The ZooKeeper commands of the CLI: `tree`, `project`, `rebuild`, `diff`.
//! (Placeholder; filled in with the live sink.)

use anyhow::{bail, Result};
use clap::Args;
use ingest_events::Actor;

use crate::engine::Engine;

/// `ingest tree` options.
#[derive(Debug, Args)]
pub struct TreeArgs {}
/// `ingest project` options.
#[derive(Debug, Args)]
pub struct ProjectArgs {}
/// `ingest rebuild` options.
#[derive(Debug, Args)]
pub struct RebuildArgs {}
/// `ingest diff` options.
#[derive(Debug, Args)]
pub struct DiffArgs {}

/// Runs `ingest tree`.
///
/// # Errors
/// Not implemented yet.
pub fn tree(_engine: &mut Engine, _args: TreeArgs) -> Result<i32> {
    bail!("not implemented yet")
}
/// Runs `ingest project`.
///
/// # Errors
/// Not implemented yet.
pub fn project(_engine: &mut Engine, _args: ProjectArgs) -> Result<i32> {
    bail!("not implemented yet")
}
/// Runs `ingest rebuild`.
///
/// # Errors
/// Not implemented yet.
pub fn rebuild(_engine: &mut Engine, _args: RebuildArgs) -> Result<i32> {
    bail!("not implemented yet")
}
/// Runs `ingest diff`.
///
/// # Errors
/// Not implemented yet.
pub fn diff(_engine: &mut Engine, _actor: &Actor, _args: DiffArgs) -> Result<i32> {
    bail!("not implemented yet")
}
