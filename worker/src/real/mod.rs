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
//! - [`locks`]: the object locks in Merritt's forms (local id from
//!   Processing to Recording, storage while Storing, inventory while
//!   Recording).
//! - [`notify`]: the profile's callback, then the working directory is
//!   removed (Notify).
//! - [`assembly`] and [`access_notify`]: the access daemons' work: a
//!   requested object version assembled into the delivery area, and the
//!   requester told when it is ready or failed.
//! - [`batch`]: the batch daemons' work: expanding a pending batch's
//!   payload (the five Merritt forms) and sending its report (callback and
//!   e-mail).
//!
//! Every step tells a recoverable error (retried within the step, bounded,
//! each attempt an event) from a non-recoverable one (the job fails with the
//! step's message and keeps its `last_successful_status`, so an admin
//! requeue resumes at that step).

pub mod access_notify;
pub mod assembly;
mod atomic;
pub mod batch;
pub mod download;
pub mod estimate;
pub mod fetch;
pub mod janitor;
pub mod locks;
pub mod mail;
pub mod marker;
pub mod notify;
pub mod outbound;
pub mod process;
pub mod record;
pub mod store;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use ingest_events::JobState;

use super::step::{Provision, Step, Steps, StorageProbe};
use ingest_config::Profiles;

pub use ingest_config::RealArgs;

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
    pub fn job_dir(&self, bid: &str, jid: ingest_events::Jid) -> PathBuf {
        job_dir(&self.work_dir, bid, &jid.to_string())
    }
}

/// `args` with `--content-url` defaulted to `engine`, the server's URL
/// the workers report to (which serves `GET /content/...`).
pub fn with_content_url(args: &RealArgs, engine: &str) -> RealArgs {
    let mut args = args.clone();
    if args
        .content_url
        .as_deref()
        .is_none_or(|u| u.trim().is_empty())
    {
        let local_only = reqwest::Url::parse(engine)
            .ok()
            .and_then(|u| u.host_str().map(str::to_string))
            .and_then(|h| h.trim_matches(['[', ']']).parse::<std::net::IpAddr>().ok())
            .is_some_and(|ip| ip.is_loopback() || ip.is_unspecified());
        if local_only && !args.storage_targets.is_empty() {
            tracing::warn!(
                url = %ingest_protocol::cut(engine, 200),
                "stored manifests will name their files at this URL, which other machines cannot reach: set --content-url to the server's lasting name"
            );
        }
        args.content_url = Some(engine.to_string());
    }
    args
}

/// The delivery area: `--delivery-dir`, or `deliveries` in working
/// storage (a name the janitor of job directories leaves alone).
pub fn delivery_dir(args: &RealArgs, work: &Path) -> PathBuf {
    args.delivery_dir
        .clone()
        .unwrap_or_else(|| work.join("deliveries"))
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
    let targets_for_access = targets.clone();
    let pause = std::time::Duration::from_millis(config.args.store_pause_ms);
    for target in &targets {
        target.set_build_pause(pause);
    }
    let node_id =
        store::primary_node_id(&config.args.storage_targets, &config.args.storage_node_ids)?;
    let content_url = store::content_base(config.args.content_url.as_deref())?;
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
            Arc::new(process::Process::new(Arc::clone(&config), key.clone())),
        ),
        (
            JobState::Storing,
            Arc::new(store::Store::new(
                targets.clone(),
                Arc::clone(&config),
                store::ManifestSettings {
                    node_id,
                    content_url,
                    key,
                },
            )),
        ),
        (
            JobState::Recording,
            Arc::new(record::Record::new(Arc::clone(&config), targets.clone())),
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
    let deliveries = delivery_dir(&config.args, &config.work_dir);
    let mut assembler = assembly::Assembler::new(
        targets_for_access,
        deliveries.clone(),
        config.args.content_url.as_deref().unwrap_or_default(),
        Duration::from_secs(config.args.delivery_ttl_secs),
    )
    .with_context(|| format!("cannot create the delivery area {}", deliveries.display()))?;
    assembler.set_pause(Duration::from_millis(config.args.assembly_pause_ms));
    steps.access = Some(Arc::new(assembler));
    steps.access_notify = Some(Arc::new(access_notify::AccessNotifier::new(
        Arc::clone(&fetcher),
        Arc::clone(&config),
    )?));
    let sweeper =
        janitor::Janitor::new(config.work_dir.clone(), interval).with_deliveries(deliveries);
    steps.janitor = Some(Arc::new(sweeper));
    steps.batch = Some(Arc::new(batch::Batches::new(fetcher, config)?));
    Ok(steps)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_content_url_defaults_to_the_servers() {
        let engine = "http://127.0.0.1:7878";
        let given = |url: Option<&str>| RealArgs {
            content_url: url.map(str::to_string),
            ..RealArgs::default()
        };
        for unset in [None, Some(""), Some("  ")] {
            assert_eq!(
                with_content_url(&given(unset), engine)
                    .content_url
                    .as_deref(),
                Some(engine)
            );
        }
        assert_eq!(
            with_content_url(&given(Some("https://ingest.example.org")), engine)
                .content_url
                .as_deref(),
            Some("https://ingest.example.org")
        );
    }
}
