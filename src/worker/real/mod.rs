//! The real steps: what a preservation repository does in each state, so
//! that a depositor's submission ends as a stored, inventoried, verifiable
//! object. Each state has its own file:
//!
//! - [`fetch`]: HTTP(S) and `file://` reads with bounded retries and
//!   backoff (each retry recorded as an event), streaming digests, size
//!   limits.
//! - [`estimate`]: HEAD every file; `space_needed` is the sum (Estimating).
//! - provisioning: the working-storage gate of [`super::step::Provision`].
//! - [`download`]: GET every file into `<work>/<bid>/<jid>/producer/`,
//!   verifying supplied digests, unpacking containers (Downloading).
//! - [`process`]: identifiers (inventory lookup by local id, minting), ERC
//!   and Dublin Core, the signed storage manifest (Processing).
//! - [`store`]: an OCFL version per storage target, fixity verified
//!   (Storing).
//! - [`record`]: the object in the server's inventory (Recording).
//! - [`notify`]: the profile's callback, then the working directory is
//!   removed (Notify).
//! - [`batch`]: the batch daemons' work: expanding a pending batch's
//!   payload (the five Merritt forms) and sending its report (callback and
//!   e-mail).
//!
//! Every step tells a recoverable error (retried within the step, bounded,
//! each attempt an event) from a non-recoverable one (the job fails with the
//! step's message and keeps its `last_successful_status`, so an admin
//! requeue resumes at that step).

pub mod batch;
pub mod download;
pub mod estimate;
pub mod fetch;
pub mod janitor;
pub mod mail;
pub mod notify;
pub mod process;
pub mod record;
pub mod store;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use ingest_events::JobState;

use super::step::{Provision, Step, Steps, StorageProbe};
use crate::config::Profiles;

/// Options of the real steps (`ingest serve` and `ingest worker`).
#[derive(Debug, Clone, Default, Args)]
pub struct RealArgs {
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
    /// The SMTP server for batch reports: smtp://HOST[:PORT] (plain, a local relay), smtps://HOST[:PORT] (TLS) or smtp+starttls://HOST[:PORT], with USER:PASSWORD@ to log in; without it, mail goes to the outbox.
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
    /// The most files one object may have (manifest lines or container entries).
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
    /// Concurrent transfers per worker process, over all its jobs.
    #[arg(long, env = "INGEST_TRANSFERS", value_name = "N", default_value_t = 16)]
    pub transfers: usize,
}

/// Everything the real steps share, built from [`RealArgs`].
#[derive(Debug, Clone)]
pub struct RealConfig {
    /// Working storage: `<work>/<bid>/<jid>/`.
    pub work_dir: PathBuf,
    /// The parsed options.
    pub args: RealArgs,
    /// The collection profiles (callback URLs, report recipients).
    pub profiles: Profiles,
}

impl RealConfig {
    /// The retry policy of every step.
    pub fn retry(&self) -> fetch::RetryPolicy {
        fetch::RetryPolicy {
            retries: self.args.step_retries,
            first_backoff: Duration::from_millis(self.args.retry_backoff_ms),
            max_backoff: Duration::from_secs(30),
        }
    }

    /// A job's working directory.
    pub fn job_dir(&self, bid: &str, jid: &str) -> PathBuf {
        job_dir(&self.work_dir, bid, jid)
    }
}

/// A job's working directory under `work`.
pub fn job_dir(work: &Path, bid: &str, jid: &str) -> PathBuf {
    work.join(bid).join(jid)
}

/// The real steps of every state, provisioning gated on `probe`.
///
/// # Errors
/// A storage target that cannot be opened, an unreadable signing key, an
/// unusable working directory or a bad option; the message names it.
pub fn steps(
    config: RealConfig,
    probe: Arc<dyn StorageProbe>,
    threshold_percent: f64,
) -> Result<Steps> {
    std::fs::create_dir_all(&config.work_dir).with_context(|| {
        format!(
            "cannot create the working directory {}",
            config.work_dir.display()
        )
    })?;
    let fetcher = Arc::new(fetch::Fetcher::new(&config).context("the HTTP client")?);
    let targets = store::open_targets(&config.args.storage_targets)?;
    let key = match &config.args.signing_key {
        Some(path) => Some(Arc::new(
            ingest_steps::signing::SigningKeyFile::load(path)
                .with_context(|| format!("the signing key {}", path.display()))?,
        )),
        None => None,
    };
    let config = Arc::new(config);
    let mut steps = Steps::simulated(
        super::step::SimSettings::default(),
        None,
        Arc::clone(&probe),
        threshold_percent,
        config.work_dir.clone(),
    );
    let pass: Arc<dyn Step> = Arc::new(estimate::Pass);
    let real: [(JobState, Arc<dyn Step>); 7] = [
        (
            JobState::Estimating,
            Arc::new(estimate::Estimate::new(
                Arc::clone(&fetcher),
                Arc::clone(&config),
            )),
        ),
        (
            JobState::Provisioning,
            Arc::new(Provision::new(
                probe,
                threshold_percent,
                config.work_dir.clone(),
                pass,
            )),
        ),
        (
            JobState::Downloading,
            Arc::new(download::Download::new(
                Arc::clone(&fetcher),
                Arc::clone(&config),
            )),
        ),
        (
            JobState::Processing,
            Arc::new(process::Process::new(Arc::clone(&config), key)),
        ),
        (
            JobState::Storing,
            Arc::new(store::Store::new(targets, Arc::clone(&config))),
        ),
        (
            JobState::Recording,
            Arc::new(record::Record::new(Arc::clone(&config))),
        ),
        (
            JobState::Notify,
            Arc::new(notify::Notify::new(
                Arc::clone(&fetcher),
                Arc::clone(&config),
            )),
        ),
    ];
    for (state, step) in real {
        steps.set(state, step);
    }
    let interval = match config.args.janitor_interval_secs {
        0 => janitor::DEFAULT_INTERVAL,
        secs => Duration::from_secs(secs),
    };
    let sweeper = janitor::Janitor::new(config.work_dir.clone(), interval);
    steps.janitor = Some(Arc::new(sweeper));
    steps.batch = Some(Arc::new(batch::Batches::new(fetcher, config)?));
    Ok(steps)
}
