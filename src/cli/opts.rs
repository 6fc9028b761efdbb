//! Options several commands share: the output format of a listing and the
//! reason recorded with an admin action. They live apart from `args.rs`
//! (the whole command line) so that the commands using them do not import
//! the module that names every command.

use clap::{Args, ValueEnum};

/// Output formats of listings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// YAML.
    Yaml,
    /// JSON.
    Json,
    /// An aligned text table.
    Table,
}

/// A reason recorded with an admin action.
#[derive(Debug, Args)]
pub struct Reason {
    /// Why; recorded with the event.
    #[arg(long, default_value = "")]
    pub reason: String,
}
