//! `ingest-config`: the configuration of `ingest`'s processes and the
//! plumbing they share.
//!
//! - [`serve`]: `ingest serve`'s flags, file and layering; [`error`]: what
//!   goes wrong, naming the file, line or flag and the key;
//! - [`zk`]: the one `--zk*` declaration; [`steps`]: `--steps` and the real
//!   steps' options, shared by `serve` and `worker`; [`daemons`]: the one
//!   daemon grammar; [`tokens`]: bearer tokens; [`profiles`]: collection
//!   profiles;
//! - [`archive`]: snapshots and signed checkpoints of the log;
//! - [`replication`]: several engines on one root;
//! - [`logging`], [`shutdown`] (one `CancellationToken` per process),
//!   [`server_file`] (where a running server can be reached).
//!
//! Every option can come from three layers, later ones winning:
//! **the configuration file < `INGEST_*` environment variables < flags**.
//! The file is YAML (`.yaml`, `.yml`) or TOML (`.toml`), chosen by its
//! extension; relative paths in it are taken relative to the file's
//! directory. [`ServeArgs`] holds the flags (each with its environment
//! variable); the data directory, the lifecycle file and the log format are
//! the CLI's global options (`--data-dir`, `--states`, `--log-format`) and
//! come in through [`GlobalOverrides`].
//!
//! Bearer tokens are never taken as flag values (a flag shows in `ps`): each
//! comes from a file (`tokens.admin_file`, `--admin-token-file`,
//! `INGEST_ADMIN_TOKEN_FILE`) or from the environment (`INGEST_ADMIN_TOKEN`).
//! They are held as [`Secret`]s, which never print.
//!
//! Collection profiles are one YAML file per profile in the profiles
//! directory ([`Profiles::load`]). A collection's *hold* is not part of its
//! profile: it is an event in the log.
//!
//! [`EXAMPLE_YAML`] (the repository's `config/ingest.example.yaml`, every
//! key) and [`EXAMPLE_TOML`] are complete example files (a unit test keeps
//! them loadable).
//!
//! ```no_run
//! use ingest_config::{GlobalOverrides, ServeArgs, ServeConfig};
//!
//! let args = ServeArgs {
//!     config: Some("/etc/ingest/serve.yaml".into()),
//!     ..ServeArgs::default()
//! };
//! let config = ServeConfig::load(&args, &GlobalOverrides::default())?;
//! let profiles = config.profiles()?;
//! println!("listening on {} with {} profiles", config.listen, profiles.len());
//! # Ok::<(), ingest_config::ConfigError>(())
//! ```

pub use crate::admins::{NamedAdmin, SHARED_ADMIN_NAME};
pub use crate::archive::ArchiveArgs;
pub use crate::depositors::{NamedDepositor, SHARED_DEPOSITOR_NAME};
pub use crate::logging::{init_tracing, LogFormat};
pub use crate::replication::ReplicationArgs;
pub use crate::steps::{RealArgs, StepsArgs, StepsKind};
pub use crate::ui::UiSettings;
pub use crate::zk::{ZkArgs, ZooKeeperSettings};
pub use daemons::*;
pub use error::*;
pub use profiles::*;
pub use serve::*;
pub use tokens::*;
pub use worker::{WorkerArgs, WorkerConfig};

pub mod admins;
pub mod archive;
pub mod daemons;
pub mod depositors;
pub mod error;
mod file;
pub mod logging;
pub mod profiles;
pub mod replication;
pub mod serve;
pub mod server_file;
pub mod shutdown;
pub mod steps;
pub mod tokens;
pub mod ui;
pub mod worker;
pub mod zk;

/// The address `ingest serve` listens on by default.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7878";
/// The data directory used when none is configured (the CLI's default).
pub const DEFAULT_DATA_DIR: &str = "./ingest-data";
/// The working-storage use (percent) above which provisioning holds jobs back.
pub const DEFAULT_PROVISIONING_THRESHOLD: f64 = 70.0;
/// The largest request body the API reads, in bytes.
pub const DEFAULT_MAX_BODY_BYTES: usize = 1024 * 1024;
/// The default largest inventory record body (`POST /jobs/JID/object`):
/// room for a version of 100,000 files (the default `--max-object-files`)
/// at up to about 2.5 KB of record per file.
pub const DEFAULT_MAX_RECORD_BYTES: usize = 256 * 1024 * 1024;

/// How long, by default, a client may take to send a request's headers.
pub const DEFAULT_HEADER_READ_TIMEOUT_SECS: u64 = 30;

/// How many connections the API keeps open at once, by default.
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;

/// The default of `--max-connections-per-client`.
pub const DEFAULT_MAX_CONNECTIONS_PER_CLIENT: usize = 512;

/// The default of `--listing-items-per-second`: how many items of the state
/// one token's listing pages may walk per second (a first page walks every
/// item once, to count; a later page walks its own length).
pub const DEFAULT_LISTING_ITEMS_PER_SECOND: u64 = 1_000_000;
/// The ZooKeeper session timeout used when none is configured.
pub const DEFAULT_ZK_SESSION_TIMEOUT_SECS: f64 = 6.0;
/// The shortest bearer token accepted.
pub const MIN_TOKEN_CHARS: usize = 16;
/// The most tasks one daemon may run.
pub const MAX_DAEMON_TASKS: u32 = 1024;

#[cfg(test)]
mod tests;
