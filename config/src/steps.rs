//! The options of the real steps, shared by `ingest serve` (in-process
//! workers) and `ingest worker`: one declaration, flattened into both.

use std::path::PathBuf;

use clap::Args;
use serde::{Deserialize, Serialize};

/// Options of the real steps (`ingest serve` and `ingest worker`).
#[derive(Debug, Clone, Default, Args, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RealArgs {
    /// The largest inventory record the server accepts, in bytes: not an
    /// option of its own but `--max-record-bytes` (`http.max_record_bytes`,
    /// `INGEST_MAX_RECORD_BYTES`) as `serve` and `worker` resolve it; the
    /// storing step refuses, before storing anything, an object whose
    /// record would be larger. `None`: no check.
    #[arg(skip)]
    #[serde(skip)]
    pub max_record_bytes: Option<usize>,
    /// Tests only: every new object written directly into a storage target
    /// waits this long half built in the target's staging, so that a test
    /// can kill the process in the middle of a store. Not a configuration
    /// key.
    #[arg(long, hide = true, value_name = "MS", default_value_t = 0,
          value_parser = clap::value_parser!(u64).range(0..=60_000))]
    #[serde(skip)]
    pub store_pause_ms: u64,
    /// Tests only: every assembly of an access request waits this long
    /// once its first file is packed, so that a test sees it in progress.
    /// Not a configuration key.
    #[arg(long, hide = true, value_name = "MS", default_value_t = 0,
          value_parser = clap::value_parser!(u64).range(0..=60_000))]
    #[serde(skip)]
    pub assembly_pause_ms: u64,
    /// The root that `file://` payload URLs must lie under (without it, file:// URLs are refused).
    #[arg(long, env = "INGEST_FILE_ROOT", value_name = "DIR")]
    pub file_root: Option<PathBuf>,
    /// An OCFL storage target, NAME=DIR; repeat for several (each object version goes to every target).
    #[arg(
        long = "storage-target",
        env = "INGEST_STORAGE_TARGETS",
        value_delimiter = ',',
        value_name = "NAME=DIR"
    )]
    pub storage_targets: Vec<String>,
    /// The Ed25519 key (PKCS#8 PEM, mode 0600) that signs storage manifests; `ingest keys generate FILE` makes one.
    #[arg(long, env = "INGEST_SIGNING_KEY", value_name = "FILE")]
    pub signing_key: Option<PathBuf>,
    /// Where e-mails are written when no SMTP server is configured (one .eml file per message).
    #[arg(long, env = "INGEST_OUTBOX", value_name = "DIR")]
    pub outbox: Option<PathBuf>,
    /// The SMTP server for batch reports: `smtp://HOST[:PORT]` (plain, a local relay), `smtps://HOST[:PORT]` (TLS) or `smtp+starttls://HOST[:PORT]`, with `USER:PASSWORD@` to log in; without it, mail goes to the outbox.
    #[arg(long, env = "INGEST_SMTP_URL", value_name = "URL")]
    pub smtp_url: Option<String>,
    /// The sender of batch report e-mails.
    #[arg(
        long,
        env = "INGEST_MAIL_FROM",
        value_name = "ADDRESS",
        default_value = "ingest@localhost"
    )]
    pub mail_from: String,
    /// The OCFL `user.address` of stored versions (a URI, e.g. `mailto:curators@example.org`) when the collection profile names no report recipient; without either, `mailto:` and --mail-from.
    #[arg(long, env = "INGEST_OCFL_USER_ADDRESS", value_name = "URI")]
    pub ocfl_user_address: Option<String>,
    /// How many times a recoverable error is tried again within a step.
    #[arg(
        long,
        env = "INGEST_STEP_RETRIES",
        value_name = "N",
        default_value_t = 3
    )]
    pub step_retries: u32,
    /// The first backoff between retries, in milliseconds (doubling, with jitter, capped at 30 s).
    #[arg(
        long,
        env = "INGEST_RETRY_BACKOFF_MS",
        value_name = "MS",
        default_value_t = 500
    )]
    pub retry_backoff_ms: u64,
    /// The largest object (sum of its files) a job may download, in bytes.
    #[arg(long, env = "INGEST_MAX_OBJECT_BYTES", value_name = "BYTES", default_value_t = 100 * 1024 * 1024 * 1024)]
    pub max_object_bytes: u64,
    /// The most files one object may have (manifest lines or container entries). Storing grows linearly with the file count: a version (new or later) of the default 100,000 files is stored and checked within 60 s on two cores, 15–18 s measured in a debug build (steps/tests/scale.rs; docs/performance.md).
    #[arg(
        long,
        env = "INGEST_MAX_OBJECT_FILES",
        value_name = "N",
        default_value_t = 100_000
    )]
    pub max_object_files: usize,
    /// Concurrent transfers per job.
    #[arg(
        long,
        env = "INGEST_TRANSFERS_PER_JOB",
        value_name = "N",
        default_value_t = 4
    )]
    pub transfers_per_job: usize,
    /// Seconds between sweeps that remove the working files of deleted, completed and cleaned-up jobs (0: the default, 60).
    #[arg(
        long,
        env = "INGEST_JANITOR_INTERVAL_SECS",
        value_name = "SECS",
        default_value_t = 60
    )]
    pub janitor_interval_secs: u64,
    /// The delivery area: where the access daemons put finished containers and `ingest serve` serves them from (`GET /deliveries/NAME`); the server and every worker that assembles must see the same directory [default: WORKING_STORAGE/deliveries].
    #[arg(long, env = "INGEST_DELIVERY_DIR", value_name = "DIR")]
    pub delivery_dir: Option<PathBuf>,
    /// How long a finished container can be downloaded, in seconds; after that its URL answers 410 and the janitor removes it.
    #[arg(
        long,
        env = "INGEST_DELIVERY_TTL_SECS",
        value_name = "SECS",
        default_value_t = 7 * 24 * 3600
    )]
    pub delivery_ttl_secs: u64,
    /// Concurrent transfers per worker process, over all its jobs.
    #[arg(long, env = "INGEST_TRANSFERS", value_name = "N", default_value_t = 16)]
    pub transfers: usize,
    /// The Merritt storage node id of a storage target, NAME=NUMBER; repeat for several (default: the target's position, from 1). The first target's is written in `/jobs/JID/store`'s mode (`add/NODE/ark`), as mrt-store reads it.
    #[arg(
        long = "storage-node-id",
        env = "INGEST_STORAGE_NODE_IDS",
        value_delimiter = ',',
        value_name = "NAME=NUMBER"
    )]
    pub storage_node_ids: Vec<String>,
    /// The base URL of the URLs in stored storage manifests: each file of a stored version is named `URL/content/NODE/ARK/VERSION/FILE` (Merritt's storage form, served by `ingest serve`'s `GET /content/...` from its storage targets), so the manifest stays usable after Notify removes the working files [default: the server's own URL: `http://LISTEN` for serve, --engine for worker].
    #[arg(long, env = "INGEST_CONTENT_URL", value_name = "URL")]
    pub content_url: Option<String>,
    /// A host whose addresses payload and callback URLs may reach although the outbound policy refuses their class (loopback, private, link-local, ...): NAME, or *.DOMAIN for every name under DOMAIN; repeat for several.
    #[arg(
        long = "allow-host",
        env = "INGEST_ALLOW_HOSTS",
        value_delimiter = ',',
        value_name = "HOST"
    )]
    pub allow_hosts: Vec<String>,
    /// A network (ADDRESS/PREFIX or ADDRESS, with an optional :PORT that then is the only port opened: 10.1.0.0/16, 127.0.0.1:8080, [::1]:8080) that payload and callback URLs may reach although the outbound policy refuses its class; repeat for several. By default loopback, private, link-local, multicast, unspecified, CGNAT, broadcast and reserved addresses are refused, after DNS resolution and on every redirect.
    #[arg(
        long = "allow-network",
        env = "INGEST_ALLOW_NETWORKS",
        value_delimiter = ',',
        value_name = "CIDR[:PORT]"
    )]
    pub allow_networks: Vec<String>,
    /// The slowest a transfer may be, in bytes per second averaged over --transfer-rate-window-secs; a slower one is cut and retried (0: no minimum).
    #[arg(
        long,
        env = "INGEST_MIN_TRANSFER_RATE",
        value_name = "BYTES_PER_SEC",
        default_value_t = 1024
    )]
    pub min_transfer_rate: u64,
    /// The window, in seconds, over which --min-transfer-rate is averaged (a shorter stall is fine; 0: the default, 60).
    #[arg(
        long,
        env = "INGEST_TRANSFER_RATE_WINDOW_SECS",
        value_name = "SECS",
        default_value_t = 60
    )]
    pub transfer_rate_window_secs: u64,
    /// The longest a job's Downloading step may take, in seconds, retries included; then the job fails naming the URLs still downloading (0: no deadline).
    #[arg(
        long,
        env = "INGEST_DOWNLOAD_DEADLINE_SECS",
        value_name = "SECS",
        default_value_t = 24 * 3600
    )]
    pub download_deadline_secs: u64,
}

impl RealArgs {
    /// Layers the configuration file's `real_steps` section (`section`)
    /// under these flags. The layering goes through the keys a file may
    /// set, which the flags that are not configuration keys (serde-skipped)
    /// are not: they are carried over from the flags here, where they were
    /// lost before (`--store-pause-ms` never reached a worker).
    pub(crate) fn layered(
        &self,
        section: &crate::file::Section<'_>,
        file: Option<&serde_json::Value>,
    ) -> Result<RealArgs, crate::ConfigError> {
        let mut real: RealArgs = section.merge(self, file)?;
        real.store_pause_ms = self.store_pause_ms;
        real.assembly_pause_ms = self.assembly_pause_ms;
        Ok(real)
    }

    /// The outbound policy of these options: `--allow-host`,
    /// `--allow-network` and `--file-root`.
    ///
    /// # Errors
    /// A rule that does not parse, naming it.
    pub fn outbound_policy(
        &self,
    ) -> Result<ingest_protocol::outbound::OutboundPolicy, ingest_protocol::outbound::PolicyError>
    {
        ingest_protocol::outbound::OutboundPolicy::new(
            &self.allow_hosts,
            &self.allow_networks,
            self.file_root.as_deref(),
        )
    }
}

/// Which steps a worker runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StepsKind {
    /// No in-process workers (`ingest serve` only; the default there).
    #[default]
    None,
    /// Zero-work steps, for load tests and demos.
    Simulate,
    /// Download, identify, store, record, notify.
    Real,
}

/// Which steps run and how simulated steps behave, for `ingest serve`'s
/// in-process workers and for `ingest worker`.
#[derive(Debug, Clone, Default, PartialEq, Args, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StepsArgs {
    /// The steps workers run: none (serve: no in-process workers), simulate (zero-work steps for load tests and demos) or real (download, identify, store, record, notify) [default: serve none, worker simulate].
    #[arg(
        long = "steps",
        env = "INGEST_WORKER_STEPS",
        value_enum,
        value_name = "KIND"
    )]
    pub steps: Option<StepsKind>,
    /// How long each simulated step takes, in milliseconds [default: 0].
    #[arg(
        long = "step-ms",
        env = "INGEST_SIMULATE_DURATION_MS",
        value_name = "MS"
    )]
    pub step_ms: Option<u64>,
    /// The probability (0-1) that a simulated step fails [default: 0].
    #[arg(
        long = "failure-rate",
        env = "INGEST_SIMULATE_FAILURE_RATE",
        value_name = "P"
    )]
    pub failure_rate: Option<f64>,
    /// The simulation's seed (random without it).
    #[arg(long = "seed", env = "INGEST_SIMULATE_SEED", value_name = "N")]
    pub seed: Option<u64>,
}

impl StepsArgs {
    /// The kind, with the default of the process asking.
    pub fn kind_or(&self, default: StepsKind) -> StepsKind {
        self.steps.unwrap_or(default)
    }

    /// Checks the simulation's values.
    ///
    /// # Errors
    /// A failure rate outside 0-1, naming the option.
    pub fn check(&self) -> Result<(), crate::ValueError> {
        if let Some(r) = self.failure_rate {
            if !(0.0..=1.0).contains(&r) {
                return Err(crate::ValueError::FailureRate(r));
            }
        }
        Ok(())
    }
}
