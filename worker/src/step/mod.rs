//! The work done in each job state: the [`Step`] trait, the simulated steps
//! (configurable duration, seedable failure rate, fault injection) and the
//! provisioning gate on working storage.

use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use ingest_events::event::FailureKind;
use ingest_events::JobState;
use ingest_protocol::api::{IdentifiersBody, InventoryBody, JobBody, StoreBody};

mod ctx;
mod error;
mod provision;
mod simulate;

pub use ctx::{ApiCtx, JobCtx, JobData};
pub use error::{io_is_recoverable, CallError, DataError, StepError};
pub use provision::{used_percent, DfProbe, FixedProbe, Provision, StorageProbe};
pub use simulate::{Faults, Rng, SimSettings, Simulate};

/// How long a step waits for the projection to show its job in the step's
/// state (after a chained step, the projection may lag the engine's answer
/// by a few milliseconds).
pub const PROJECTION_WAIT: Duration = Duration::from_secs(10);

/// What a step concluded about one job.
#[derive(Debug, Clone, PartialEq)]
pub enum StepResult {
    /// Report this outcome.
    Report(Outcome),
    /// Do not report: the job stays in its state and is looked at again on
    /// a later cycle (provisioning while working storage is too full).
    Wait(String),
}

/// A step's outcome, sent to `POST /jobs/{jid}/outcome`.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// Success or failure.
    pub success: bool,
    /// A human-readable message.
    pub message: String,
    /// The bytes the job needs in working storage (Estimating,
    /// Downloading).
    pub space_needed: Option<u64>,
    /// A new priority for the job (Estimating).
    pub priority: Option<u8>,
    /// The job's identifiers (Processing).
    pub identifiers: Option<IdentifiersBody>,
    /// The storage hand-off (Storing).
    pub store: Option<StoreBody>,
    /// The inventory hand-off (Recording).
    pub inventory: Option<InventoryBody>,
    /// The kind of a failure (`digest_mismatch`); `None` for an ordinary
    /// one an admin may requeue.
    pub failure: Option<FailureKind>,
}

impl Outcome {
    /// A success without data.
    pub fn success(message: impl Into<String>) -> Outcome {
        Outcome {
            success: true,
            message: message.into(),
            space_needed: None,
            priority: None,
            identifiers: None,
            store: None,
            inventory: None,
            failure: None,
        }
    }

    /// A failure.
    pub fn failure(message: impl Into<String>) -> Outcome {
        Outcome {
            success: false,
            ..Outcome::success(message)
        }
    }

    /// A failure of a kind the engine records (an unrecoverable kind
    /// refuses every later requeue).
    pub fn failure_of(kind: FailureKind, message: impl Into<String>) -> Outcome {
        Outcome {
            failure: Some(kind),
            ..Outcome::failure(message)
        }
    }

    /// With the space the job needs.
    pub fn with_space_needed(mut self, bytes: u64) -> Outcome {
        self.space_needed = Some(bytes);
        self
    }

    /// With a new priority.
    pub fn with_priority(mut self, priority: u8) -> Outcome {
        self.priority = Some(priority);
        self
    }

    /// With the job's identifiers.
    pub fn with_identifiers(mut self, identifiers: IdentifiersBody) -> Outcome {
        self.identifiers = Some(identifiers);
        self
    }

    /// With the storage hand-off.
    pub fn with_store(mut self, store: StoreBody) -> Outcome {
        self.store = Some(store);
        self
    }

    /// With the inventory hand-off.
    pub fn with_inventory(mut self, inventory: InventoryBody) -> Outcome {
        self.inventory = Some(inventory);
        self
    }
}

/// A boxed future returned by [`Step::run`].
pub type StepFuture<'a> = Pin<Box<dyn Future<Output = StepResult> + Send + 'a>>;

/// The work of one job state. Implementations must be cancel-safe: a daemon
/// drops the future when its session expires or the worker stops.
pub trait Step: Send + Sync {
    /// Does the work for `job` and says what to report.
    fn run<'a>(&'a self, job: &'a JobCtx) -> StepFuture<'a>;
}

/// A batch a batch daemon works on, with its lock held.
#[derive(Debug, Clone)]
pub struct BatchCtx {
    /// The batch.
    pub bid: ingest_events::Bid,
    /// The worker's session (the one holding `/batches/BID/lock`).
    pub zk: zookeeper_client::Client,
    /// The API.
    pub api: ApiCtx,
}

/// The outcome of expanding a batch's payload.
#[derive(Debug, Clone, PartialEq)]
pub enum Expansion {
    /// The jobs to create (`POST /batches/BID/acquire`'s `jobs`).
    Jobs(Vec<JobBody>),
    /// The payload does not expand; the batch fails with this message.
    Failed(String),
}

/// A boxed future of the batch work.
pub type BatchFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// How an access request ended, as its requester is told.
#[derive(Debug, Clone, Copy)]
pub struct AccessEnded<'a> {
    /// The request.
    pub qid: &'a str,
    /// Its token node.
    pub token: &'a ingest_protocol::node::AccessTokenNode,
    /// The container, when it is ready; `None` when the assembly failed.
    pub delivery: Option<&'a ingest_protocol::access::AccessDelivery>,
    /// The outcome's message (a failure's reason).
    pub message: &'a str,
}

/// Why an access request's requester could not be told that it ended.
#[derive(Debug, thiserror::Error)]
pub enum AccessNoticeError {
    /// The request's ark cannot be put in a URL as it is (cut).
    #[error("the ark {0:?} is not one to look up")]
    NotAnArk(String),
    /// The engine did not give the object's collection.
    #[error("cannot read the object's collection: {0}")]
    Collection(#[from] ingest_client::ClientError),
    /// The callback or the e-mail failed (each failure named).
    #[error("{0}")]
    Delivery(String),
}

/// Telling an access request's requester that it ended (the real steps'
/// [`crate::real::access_notify::AccessNotifier`]).
pub trait AccessNotice: Send + Sync {
    /// Tells whoever is to be told how the request ended; what was done,
    /// for the log, or why nobody could be told.
    fn notify<'a>(
        &'a self,
        engine: &'a ingest_client::Client,
        ended: AccessEnded<'a>,
    ) -> BatchFuture<'a, Result<String, AccessNoticeError>>;
}

/// The work of the batch daemons beyond recording: expanding a pending
/// batch's payload (fetching and parsing its manifest) and sending a
/// finished batch's report. Without it the server expands the simple
/// forms itself and reports go nowhere.
pub trait BatchWork: Send + Sync {
    /// Expands the pending batch into jobs.
    fn expand<'a>(&'a self, batch: &'a BatchCtx) -> BatchFuture<'a, Expansion>;
    /// Sends the report of a batch in Reporting or UpdateReporting; `Some`
    /// is the error of sending it (recorded with the report).
    fn report<'a>(&'a self, batch: &'a BatchCtx) -> BatchFuture<'a, Option<String>>;
    /// Notifies the depositor of a batch that failed as it was acquired
    /// (its payload did not expand), saying why (`message`, the batch's
    /// status message): such a batch never enters Reporting, so nothing
    /// else would. `Some` is the error of sending it.
    fn failed<'a>(
        &'a self,
        batch: &'a BatchCtx,
        message: &'a str,
    ) -> BatchFuture<'a, Option<String>>;
}

/// The steps of every state.
#[derive(Clone)]
pub struct Steps {
    steps: HashMap<JobState, Arc<dyn Step>>,
    /// The fault-injection handle of the simulated steps.
    pub faults: Faults,
    /// The batch daemons' work, when the steps are real.
    pub batch: Option<Arc<dyn BatchWork>>,
    /// The janitor of working storage, when the steps are real.
    pub janitor: Option<Arc<super::real::janitor::Janitor>>,
    /// The access daemons' assembler, when the steps are real (the
    /// assembly is simulated otherwise).
    pub access: Option<Arc<super::real::assembly::Assembler>>,
    /// Who is told that an access request ended, when the steps are real.
    pub access_notify: Option<Arc<dyn AccessNotice>>,
    /// How long a simulated assembly (the access daemons') takes: the
    /// simulated steps' duration (`--step-ms`).
    pub simulated_assembly: std::time::Duration,
}

impl Steps {
    /// Simulated steps for every state, each with `settings`, provisioning
    /// gated on `probe`.
    pub fn simulated(
        settings: SimSettings,
        seed: Option<u64>,
        probe: Arc<dyn StorageProbe>,
        threshold_percent: f64,
        working_storage: PathBuf,
    ) -> Steps {
        let rng = Arc::new(seed.map_or_else(Rng::from_entropy, Rng::new));
        let faults = Faults::default();
        let mut steps: HashMap<JobState, Arc<dyn Step>> = HashMap::new();
        for state in JobState::WITH_STEP {
            let sim: Arc<dyn Step> =
                Arc::new(Simulate::new(settings, Arc::clone(&rng), faults.clone()));
            let step = if state == JobState::Provisioning {
                Arc::new(Provision::new(
                    Arc::clone(&probe),
                    threshold_percent,
                    working_storage.clone(),
                    sim,
                )) as Arc<dyn Step>
            } else {
                sim
            };
            steps.insert(state, step);
        }
        Steps {
            steps,
            faults,
            batch: None,
            janitor: None,
            access: None,
            access_notify: None,
            simulated_assembly: settings.duration,
        }
    }

    /// Replaces the step of `state`.
    pub fn set(&mut self, state: JobState, step: Arc<dyn Step>) {
        self.steps.insert(state, step);
    }

    /// The step of `state`.
    pub fn get(&self, state: JobState) -> Option<Arc<dyn Step>> {
        self.steps.get(&state).cloned()
    }
}

#[cfg(test)]
mod tests;
