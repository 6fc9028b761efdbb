//! The grammar of the command line: `ingest [GLOBAL OPTIONS] NOUN [ID] VERB
//! [OPTIONS]` for actions on one item, plain verbs for the rest.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use ingest_config::LogFormat;
use ingest_events::{Bid, Jid, JobState};

pub use super::opts::{Format, Reason};
use super::zk;

/// `ingest`: an event-sourced ingest queue for digital-preservation repositories.
#[derive(Debug, Parser)]
#[command(
    name = "ingest",
    version,
    about = "An event-sourced ingest queue for digital-preservation repositories",
    long_about = "An event-sourced ingest queue for digital-preservation repositories.\n\n\
Every change to a batch or job is an event appended to a hash-chained log in the data \
directory (the source of truth); the ZooKeeper queue tree Merritt's workers read is \
projected from it.\n\n\
Grammar: `ingest NOUN ID VERB` acts on one item (batch, job, collection, queue); \
`submit`, `show`, `history`, `verify`, `repair`, `lifecycle`, `cleanup`, `status`, `batches` and `jobs` stand alone.",
    after_help = "Examples:\n  ingest submit --profile demo --submitter alice --payload-url https://example.org/a.zip --type container\n  ingest batch bid0000000001 acquire\n  ingest job jid0000000001 start\n  ingest job jid0000000001 success\n  ingest job jid0000000001 fail --message 'HEAD https://… returned 404'\n  ingest job jid0000000001 requeue --reason 'server fixed'\n  ingest collection demo hold --reason 'storage migration'\n  ingest history --batch bid0000000001 --format table\n  ingest jobs --state failed --collection demo --modified-since 2026-11-24\n  ingest verify\n\nExit codes: 0 done (diff: no drift; check: PASS); 1 refused by the queue, unknown item, drift found, a check WARN or FAIL, verify failed; 2 usage (bad arguments, no such data directory, bad configuration); 3 unreachable (no answer, token refused, data directory held by another process)."
)]
pub struct Cli {
    /// The data directory holding the event log.
    #[arg(
        long,
        global = true,
        env = "INGEST_DATA_DIR",
        default_value = "./ingest-data"
    )]
    pub data_dir: PathBuf,
    /// A lifecycle file (mrt-zk states.yml format) to use instead of the built-in one.
    #[arg(long, global = true, env = "INGEST_STATES", value_name = "FILE")]
    pub states: Option<PathBuf>,
    /// Who is acting: admin:NAME, worker:NAME, depositor:NAME (default admin:$USER; depositor:SUBMITTER for submit).
    #[arg(long, global = true, env = "INGEST_ACTOR")]
    pub actor: Option<String>,
    /// Run the command through the `ingest serve` at this URL (its HTTP API) instead of opening the data directory, which a running server holds. Tokens from INGEST_ADMIN_TOKEN (or INGEST_DEPOSITOR_TOKEN for submit/show/history).
    #[arg(long, global = true, env = "INGEST_ENGINE", value_name = "URL")]
    pub engine: Option<String>,
    /// Log output on stderr.
    #[arg(long, global = true, env = "INGEST_LOG_FORMAT", value_enum, default_value_t = LogFormat::Human)]
    pub log_format: LogFormat,
    /// What to do.
    #[command(subcommand)]
    pub command: Cmd,
}

/// Lifecycle output formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LifecycleFormat {
    /// The transition table.
    Table,
    /// A Mermaid state diagram generated from the table.
    Mermaid,
}

/// The kinds of items with a lifecycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LifecycleItem {
    /// Jobs.
    Job,
    /// Batches.
    Batch,
    /// Access (assembly) requests.
    Access,
}

impl From<LifecycleItem> for ingest_events::lifecycle::ItemKind {
    fn from(i: LifecycleItem) -> Self {
        match i {
            LifecycleItem::Job => Self::Job,
            LifecycleItem::Batch => Self::Batch,
            LifecycleItem::Access => Self::Access,
        }
    }
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Cmd {
    /// Submit a batch (fields as options, or --file submission.yml; options override the file).
    Submit(Box<SubmitArgs>),
    /// Show a batch or a job as the log says it is now (also `ingest batch BID show`, `ingest job JID show`).
    Show {
        /// What to show.
        #[command(subcommand)]
        what: ShowWhat,
        /// Output format.
        #[arg(long, global = true, value_enum, default_value_t = Format::Yaml)]
        format: Format,
    },
    /// Events in log order: of a batch and its jobs, of one job, or of the
    /// whole log; filtered by time, actor and collection (combined with AND).
    /// Answered from the log's indexes, never by scanning it.
    History {
        /// The batch (with its jobs).
        #[arg(long, conflicts_with = "job")]
        batch: Option<Bid>,
        /// The job.
        #[arg(long)]
        job: Option<Jid>,
        /// Only events at or after this time: RFC 3339 (2026-11-24T08:00:00Z)
        /// or a date (2026-11-24, midnight UTC).
        #[arg(long, value_parser = ingest_protocol::listing::parse_time)]
        since: Option<chrono::DateTime<chrono::Utc>>,
        /// Only events before this time (RFC 3339 or a date).
        #[arg(long, value_parser = ingest_protocol::listing::parse_time)]
        until: Option<chrono::DateTime<chrono::Utc>>,
        /// Only events caused by this actor: admin:NAME, worker:NAME,
        /// depositor:NAME or engine (`--actor` names who runs a command).
        #[arg(long, value_name = "ACTOR")]
        by: Option<ingest_events::Actor>,
        /// Only events of the batches and jobs of this collection (profile).
        #[arg(long)]
        collection: Option<String>,
        /// At most this many events (default 100000, at most 1000000); a
        /// note on stderr says when more matched.
        #[arg(long)]
        limit: Option<usize>,
        /// Output format.
        #[arg(long, value_enum, default_value_t = Format::Table)]
        format: Format,
    },
    /// Re-check the whole hash chain and every stream index entry, every signed checkpoint (tree head and signature) and every snapshot against a full fold, and that the log is not shorter than the newest snapshot or (with --zk) the ZooKeeper projection checkpoint. Read-only: a data directory this user may not write is verified through a private copy.
    Verify(super::verify::VerifyArgs),
    /// Truncate a torn tail that fails the hash chain (only the tail; never the middle).
    Repair {
        /// Do it: without this, only say what would be removed.
        #[arg(long)]
        yes: bool,
    },
    /// Print the lifecycle the engine enforces: the lifecycle file's table and the admin-only moves beside it.
    Lifecycle {
        /// Output format.
        #[arg(long, value_enum, default_value_t = LifecycleFormat::Table)]
        format: LifecycleFormat,
        /// Only this kind of item (required with --format mermaid: one diagram per output).
        #[arg(long, value_enum, required_if_eq("format", "mermaid"))]
        of: Option<LifecycleItem>,
    },
    /// Act on a batch.
    Batch {
        /// The batch id (bid0000000001).
        bid: Bid,
        /// The action.
        #[command(subcommand)]
        action: BatchAction,
    },
    /// Act on a job.
    Job {
        /// The job id (jid0000000001).
        jid: Jid,
        /// The action.
        #[command(subcommand)]
        action: JobAction,
    },
    /// Hold or release a collection.
    Collection {
        /// The collection profile.
        profile: String,
        /// The action.
        #[command(subcommand)]
        action: CollectionAction,
    },
    /// The access (assembly) queue: request, list, show, requeue, delete, pause, resume.
    Access {
        /// The action.
        #[command(subcommand)]
        action: super::access::AccessAction,
    },
    /// Pause or resume the ingest queue.
    Queue {
        /// The action.
        #[command(subcommand)]
        action: QueueAction,
    },
    /// Remove finished (Completed or Deleted) batches from the live tree; their history stays.
    Cleanup {
        /// Only batches last changed before this time (RFC 3339).
        #[arg(long)]
        before: Option<chrono::DateTime<chrono::Utc>>,
    },
    /// Print the ZooKeeper tree the log projects (or, with --live, the live one), as YAML.
    Tree(zk::TreeArgs),
    /// Project the log into ZooKeeper: catch up from the checkpoint (and, with --follow, keep going).
    Project(zk::ProjectArgs),
    /// Rebuild the live ZooKeeper tree from the log after an incident (worker locks are left alone).
    Rebuild(zk::RebuildArgs),
    /// Compare the live ZooKeeper tree with what the log says it should be (exit 1 on drift).
    Diff(zk::DiffArgs),
    /// The consistency report: Merritt's orphan rules over the live tree, stale and old locks, drift against the log, OCFL versions the inventory lacks; with --repair ID or --repair-all, apply and record repairs (exit 1 when a WARN or FAIL is found).
    Check(super::check::CheckArgs),
    /// Print the ZooKeeper digest identity (user:BASE64, what --zk-worker-identity takes) of credentials read from a file (one line user:password) or from INGEST_ZK_AUTH.
    ZkDigest {
        /// The credentials file (default: INGEST_ZK_AUTH).
        #[arg(long, value_name = "FILE")]
        auth_file: Option<std::path::PathBuf>,
    },
    /// Run the queue service: the engine, the ZooKeeper projector and the HTTP API in one process (until SIGTERM or Ctrl-C).
    Serve(Box<ingest_config::ServeArgs>),
    /// Run worker daemons (simulated steps unless --steps real) against a server's API and ZooKeeper (until SIGTERM or Ctrl-C).
    Worker(Box<ingest_worker::WorkerArgs>),
    /// An object in the inventory: by ark, or by collection and local id.
    Inventory {
        /// The ark (ark:/NAAN/NAME).
        #[arg(required_unless_present = "local_id")]
        ark: Option<String>,
        /// The collection of --local-id.
        #[arg(long, requires = "local_id")]
        collection: Option<String>,
        /// A local id (with --collection).
        #[arg(long, requires = "collection")]
        local_id: Option<String>,
        /// Output format.
        #[arg(long, value_enum, default_value_t = Format::Yaml)]
        format: Format,
    },
    /// Take a consistent copy of the log (positions 1 to the durable head) into one file, from a running engine with --engine (leader or follower, nothing stops) or from a data directory no server holds. The copy's chain is checked as it is written and its Merkle root recorded; `ingest restore` builds a data directory from it.
    Backup(super::backup::BackupArgs),
    /// Build a new data directory (--data-dir) from a backup and verify it: every record against the chain, the head and the Merkle root against the backup, then every signed checkpoint. --to-position or --at restores to an earlier point (the last whole command at or before it).
    Restore(super::backup::RestoreArgs),
    /// Export a stored object version: `export bagit ARK DIR` writes a BagIt 1.0 bag read from a storage target (storage is only read).
    Export {
        /// The format.
        #[command(subcommand)]
        what: ExportWhat,
    },
    /// Ed25519 keys (storage-manifest signing, the engine's checkpoint key): make one, or publish its public key.
    Keys {
        /// The action.
        #[command(subcommand)]
        action: KeysAction,
    },
    /// Counts of batches and jobs by state, holds, pause, log head.
    Status {
        /// Output format.
        #[arg(long, value_enum, default_value_t = Format::Yaml)]
        format: Format,
    },
    /// List batches by filters, by id (`GET /batches`): one page, or every page with --all.
    #[command(
        after_help = "Examples:\n  ingest batches --state failed --collection demo\n  ingest batches --has-failures --modified-since 2026-11-24 --format json\n  ingest batches --limit 50 --cursor CURSOR"
    )]
    Batches(ListBatchesArgs),
    /// Print a shell completion script for SHELL (e.g. `ingest completions bash > /etc/bash_completion.d/ingest`).
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the manual page, roff (e.g. `ingest man > /usr/share/man/man1/ingest.1`).
    Man,
    /// List jobs by filters, in queue order: priority, then id (`GET /jobs`).
    #[command(
        after_help = "Examples:\n  ingest jobs --state failed --collection demo --modified-since 2026-11-24 --modified-until 2026-11-25\n  ingest jobs --batch bid0000000001 --all\n  ingest jobs --state held,pending --format yaml"
    )]
    Jobs(ListJobsArgs),
    /// Audit evidence that stands on its own: bundles of a batch's events with inclusion proofs against a signed tree head, consistency proofs, and their verification.
    Audit {
        /// The action.
        #[command(subcommand)]
        action: AuditAction,
    },
}

/// Audit evidence actions.
#[derive(Debug, Subcommand)]
pub enum AuditAction {
    /// Write one self-contained file (JSON) with the batch's and its jobs' events, their inclusion proofs against the newest signed tree head, the signature and the public key.
    Export {
        /// The batch (bid0000000001).
        #[arg(long)]
        batch: Bid,
        /// Where to write it [default: standard output].
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
        /// The engine's checkpoint key (PKCS#8 PEM, mode 0600): when no signed head covers the batch yet, sign one now (appends a checkpoint event).
        #[arg(long, env = "INGEST_CHECKPOINT_KEY", value_name = "FILE")]
        checkpoint_key: Option<PathBuf>,
    },
    /// Check an audit bundle or a consistency proof file on its own, without any data directory; names what failed (format, event, proof, signature, head, key). Exit 1 when it fails.
    Verify {
        /// The file `audit export` or `audit prove` wrote.
        file: PathBuf,
        /// The engine's public key (the SPKI PEM `ingest keys show` prints): the heads must be signed by it.
        #[arg(long, value_name = "PUB")]
        key: Option<PathBuf>,
    },
    /// Write the consistency proof between two signed heads (checkpoint events), so an auditor who kept the older one can check that the log only grew.
    Prove {
        /// The log position of the older signed checkpoint.
        #[arg(long, value_name = "POS")]
        from: u64,
        /// The log position of the newer signed checkpoint.
        #[arg(long, value_name = "POS")]
        to: u64,
        /// Where to write it [default: standard output].
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
    },
}

/// The filters `ingest batches` and `ingest jobs` share.
#[derive(Debug, Clone, Args)]
pub struct ListFilters {
    /// Only this collection (profile).
    #[arg(long, value_name = "PROFILE")]
    pub collection: Option<String>,
    /// Only batches (or jobs of batches) of this submitter.
    #[arg(long)]
    pub submitter: Option<String>,
    /// Created at or after this time (RFC 3339, or a date YYYY-MM-DD meaning midnight UTC).
    #[arg(long, value_name = "TIME", value_parser = ingest_protocol::listing::parse_time)]
    pub created_since: Option<chrono::DateTime<chrono::Utc>>,
    /// Created before this time (RFC 3339 or YYYY-MM-DD).
    #[arg(long, value_name = "TIME", value_parser = ingest_protocol::listing::parse_time)]
    pub created_until: Option<chrono::DateTime<chrono::Utc>>,
    /// Last changed at or after this time (RFC 3339 or YYYY-MM-DD).
    #[arg(long, value_name = "TIME", value_parser = ingest_protocol::listing::parse_time)]
    pub modified_since: Option<chrono::DateTime<chrono::Utc>>,
    /// Last changed before this time (RFC 3339 or YYYY-MM-DD).
    #[arg(long, value_name = "TIME", value_parser = ingest_protocol::listing::parse_time)]
    pub modified_until: Option<chrono::DateTime<chrono::Utc>>,
    /// Only items with failures (a batch with a failed job or itself Failed; a job in Failed or requeued out of it before); `--has-failures false` for only those without.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    pub has_failures: Option<bool>,
    /// Items per page (1-1000, default 100).
    #[arg(long, value_name = "N")]
    pub limit: Option<usize>,
    /// Start after the page that gave this cursor (its `next_cursor`, printed under a table).
    #[arg(long, conflicts_with = "all")]
    pub cursor: Option<String>,
    /// Follow the cursors and print every page as one listing.
    #[arg(long)]
    pub all: bool,
    /// Output format: an aligned table, or the page (items, matched, next_cursor) as YAML or JSON.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
}

/// `ingest batches` options.
#[derive(Debug, Clone, Args)]
pub struct ListBatchesArgs {
    /// Only batches in these states (comma-separated: failed,held).
    #[arg(long, value_name = "STATES")]
    pub state: Option<String>,
    /// The shared filters.
    #[command(flatten)]
    pub filters: ListFilters,
}

/// `ingest jobs` options.
#[derive(Debug, Clone, Args)]
pub struct ListJobsArgs {
    /// Only jobs in these states (comma-separated: failed,held).
    #[arg(long, value_name = "STATES")]
    pub state: Option<String>,
    /// Only jobs of this batch.
    #[arg(long, value_name = "BID")]
    pub batch: Option<Bid>,
    /// The shared filters.
    #[command(flatten)]
    pub filters: ListFilters,
}

/// `ingest submit` options.
#[derive(Debug, Args)]
pub struct SubmitArgs {
    /// A submission file (YAML or JSON) with the fields below.
    #[arg(long, value_name = "FILE")]
    pub file: Option<PathBuf>,
    /// The collection profile.
    #[arg(long)]
    pub profile: Option<String>,
    /// Who submits.
    #[arg(long)]
    pub submitter: Option<String>,
    /// The payload URL.
    #[arg(long)]
    pub payload_url: Option<String>,
    /// file, container, object-manifest, single-file-batch-manifest, container-batch-manifest, batch-manifest.
    #[arg(long = "type")]
    pub payload_type: Option<String>,
    /// add or update.
    #[arg(long)]
    pub submission_mode: Option<String>,
    /// The response type (json, xml, …).
    #[arg(long)]
    pub response_type: Option<String>,
    /// An inline manifest line `URL [LOCAL_ID [ARK]]`; repeat for several.
    #[arg(long = "manifest", value_name = "LINE")]
    pub manifest: Vec<String>,
    /// ERC who.
    #[arg(long)]
    pub erc_who: Option<String>,
    /// ERC what (title).
    #[arg(long)]
    pub erc_what: Option<String>,
    /// ERC when (date).
    #[arg(long)]
    pub erc_when: Option<String>,
    /// ERC where (local id).
    #[arg(long)]
    pub erc_where: Option<String>,
    /// The depositor's digest of a single-file payload, ALGORITHM:HEX.
    #[arg(long)]
    pub digest: Option<String>,
}

/// What `show` shows.
#[derive(Debug, Subcommand)]
pub enum ShowWhat {
    /// A batch with its jobs.
    Batch {
        /// The batch id.
        bid: Bid,
    },
    /// A job.
    Job {
        /// The job id.
        jid: Jid,
    },
}

/// Actions on a batch.
#[derive(Debug, Subcommand)]
pub enum BatchAction {
    /// Acquire a pending batch: Held if its collection is held, else create its jobs (Processing).
    Acquire,
    /// Release a held batch (Held -> Pending) once its collection is no longer held.
    Release(Reason),
    /// Ask for a new report of a failed batch (Failed -> UpdateReporting).
    UpdateReporting(Reason),
    /// Report a batch in Reporting or UpdateReporting (-> Completed or Failed).
    Report {
        /// The error of sending the report, if it failed.
        #[arg(long)]
        notification_error: Option<String>,
    },
    /// Delete a Held or Failed batch and its deletable jobs (soft: status Deleted).
    Delete(Reason),
    /// Show the batch with its jobs (the same as `show batch BID`).
    Show(ShowFormat),
    /// Every event of the batch and its jobs (the same as `history --batch BID`).
    History(HistoryFormat),
}

/// Actions on a job.
#[derive(Debug, Subcommand)]
pub enum JobAction {
    /// Acquire a pending job: Held if its collection is held, else Estimating.
    Start,
    /// The current step succeeded: move to its success state.
    Success(MoveArgs),
    /// The current step failed: move to its fail state.
    Fail(MoveArgs),
    /// Move to an explicit state (an admin's force, e.g. `move failed`).
    Move {
        /// The target state.
        state: JobState,
        /// Options.
        #[command(flatten)]
        args: MoveArgs,
    },
    /// Record the space the job needs (estimating).
    Space {
        /// Bytes.
        bytes: u64,
        /// A new priority (0-99).
        #[arg(long)]
        priority: Option<u8>,
    },
    /// Record the job's ark and local ids (processing).
    Identifiers {
        /// The ark.
        #[arg(long)]
        ark: Option<String>,
        /// Local ids, `;`-separated.
        #[arg(long)]
        local_id: Option<String>,
    },
    /// Record the storage step's parameters.
    Store {
        /// The storage manifest URL.
        #[arg(long)]
        manifest_url: String,
        /// add or update.
        #[arg(long, default_value = "add")]
        mode: String,
        /// Delete files absent from the manifest.
        #[arg(long)]
        delete: bool,
    },
    /// Record the inventory step's parameters.
    Inventory {
        /// The storage manifest URL.
        #[arg(long)]
        manifest_url: String,
        /// add or update.
        #[arg(long, default_value = "add")]
        mode: String,
    },
    /// Requeue a Failed job at the step after its last successful status (retry_count + 1).
    Requeue(Reason),
    /// Hold a Pending job.
    Hold(Reason),
    /// Release a Held job (-> Pending).
    Release(Reason),
    /// Delete a Held or Failed job (soft: status Deleted).
    Delete(Reason),
    /// Show the job (the same as `show job JID`).
    Show(ShowFormat),
    /// Every event of the job (the same as `history --job JID`).
    History(HistoryFormat),
}

/// The format of `batch BID show` and `job JID show`.
#[derive(Debug, Clone, Copy, Args)]
pub struct ShowFormat {
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Yaml)]
    pub format: Format,
}

/// The format of `batch BID history` and `job JID history`.
#[derive(Debug, Clone, Copy, Args)]
pub struct HistoryFormat {
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
}

/// Options of a status move.
#[derive(Debug, Args)]
pub struct MoveArgs {
    /// Why (the step's error for a failure).
    #[arg(long, default_value = "")]
    pub message: String,
    /// A new priority (0-99) set together with the move.
    #[arg(long)]
    pub priority: Option<u8>,
}

/// Actions on a collection.
#[derive(Debug, Subcommand)]
pub enum CollectionAction {
    /// Hold the collection: its new batches and jobs park in Held.
    Hold(Reason),
    /// Release the collection and every held batch and job of it.
    Release(Reason),
    /// Release every held job of the collection (the hold stays).
    ReleaseJobs(Reason),
}

/// Signing-key actions.
#[derive(Debug, Subcommand)]
pub enum KeysAction {
    /// Make a new Ed25519 key (PKCS#8 PEM, mode 0600); refuses to overwrite.
    Generate {
        /// Where to write it.
        file: PathBuf,
    },
    /// Print the public key (SPKI PEM) and its fingerprint, for verifiers.
    Show {
        /// The key file.
        file: PathBuf,
    },
}

/// Actions on the queue.
#[derive(Debug, Subcommand)]
pub enum QueueAction {
    /// Pause: no job leaves Pending.
    Pause(Reason),
    /// Resume.
    Resume(Reason),
}

/// What `ingest export` writes.
#[derive(Debug, Clone, Subcommand)]
pub enum ExportWhat {
    /// A BagIt 1.0 bag (RFC 8493) of one version of a stored object: bagit.txt, bag-info.txt (ark, version, Source-Organization, OCFL user and message), data/ with the version's files under their logical paths, manifest-ALG.txt and tagmanifest-ALG.txt. Reads the OCFL storage root directly (the server's objects API serves no file content, so this does not go through --engine).
    Bagit {
        /// The object's ark.
        ark: String,
        /// Where the bag goes: a new or empty directory (anything else is refused).
        dir: std::path::PathBuf,
        /// The version to bag [default: the newest].
        #[arg(long, value_name = "N")]
        version: Option<u32>,
        /// The OCFL storage target to read, NAME=DIR, as `serve --storage-target` takes it; the first one given is read unless --target names another.
        #[arg(
            long = "storage-target",
            env = "INGEST_STORAGE_TARGETS",
            value_delimiter = ',',
            value_name = "NAME=DIR",
            required = true
        )]
        storage_targets: Vec<String>,
        /// Which storage target to read, by NAME.
        #[arg(long, value_name = "NAME")]
        target: Option<String>,
        /// The bag's Source-Organization.
        #[arg(long, value_name = "TEXT", default_value = "ingest")]
        source_organization: String,
        /// The manifest algorithms, comma-separated (md5, sha1, sha256, sha512).
        #[arg(
            long,
            value_delimiter = ',',
            value_name = "ALG",
            default_value = "sha256,sha512"
        )]
        digests: Vec<String>,
    },
}
