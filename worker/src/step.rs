//! The work done in each job state: the [`Step`] trait, the simulated steps
//! (configurable duration, seedable failure rate, fault injection) and the
//! provisioning gate on working storage.

use std::collections::HashMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ingest_client::Reply;
use ingest_events::event::FailureKind;
use ingest_events::JobState;
use ingest_protocol::api::{
    IdentifiersBody, InventoryBody, JobBody, JobMoved, RetryBody, SessionId, StoreBody, WorkerRef,
};
use ingest_protocol::fence::FenceSecret;
use ingest_protocol::node::{
    decode, ConfigurationNode, IdentifiersNode, JobStatusNode, MetadataNode,
};

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

/// Why a step failed: the message recorded with the move to Failed, and
/// the kind of the failure when it is one the engine records
/// ([`FailureKind`]: a payload whose digest does not match the
/// depositor's, which no requeue may recover).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepFailure {
    /// What went wrong, naming the URL or file.
    pub message: String,
    /// The kind; `None` for an ordinary failure.
    pub kind: Option<FailureKind>,
}

impl StepFailure {
    /// A failure of `kind`.
    pub fn of(kind: FailureKind, message: impl Into<String>) -> StepFailure {
        StepFailure {
            message: message.into(),
            kind: Some(kind),
        }
    }
}

impl From<String> for StepFailure {
    fn from(message: String) -> StepFailure {
        StepFailure {
            message,
            kind: None,
        }
    }
}

impl From<&str> for StepFailure {
    fn from(message: &str) -> StepFailure {
        StepFailure::from(message.to_string())
    }
}

impl std::fmt::Display for StepFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl From<StepFailure> for Outcome {
    fn from(f: StepFailure) -> Outcome {
        match f.kind {
            Some(kind) => Outcome::failure_of(kind, f.message),
            None => Outcome::failure(f.message),
        }
    }
}

/// The job a step works on.
#[derive(Debug, Clone)]
pub struct JobCtx {
    /// The job id (`jid…`).
    pub jid: String,
    /// The state it is in.
    pub state: JobState,
    /// Its queue priority.
    pub priority: u8,
    /// The worker's ZooKeeper session (the one holding the job's lock), for
    /// reading the job's nodes; `None` in unit tests.
    pub zk: Option<zookeeper_client::Client>,
    /// The API, for fenced calls made while the step runs (retries, arks,
    /// inventory); `None` in unit tests.
    pub api: Option<ApiCtx>,
    /// The bytes the job needs, when the step chained before this one
    /// reported them (else read from ZooKeeper when needed).
    pub space_needed: Option<u64>,
}

/// How a step reaches the API while it holds a job's lock.
#[derive(Debug, Clone)]
pub struct ApiCtx {
    /// The API client (worker token).
    pub engine: ingest_client::Client,
    /// The worker's name.
    pub worker: String,
    /// The session holding the lock (the fence of every call).
    pub session_id: i64,
    /// The secret whose digest the lock node holds, sent with every call.
    pub fence: FenceSecret,
}

/// A job's nodes, as the projection wrote them (`/jobs/JID/*`).
#[derive(Debug, Clone, PartialEq)]
pub struct JobData {
    /// The batch.
    pub bid: String,
    /// `/jobs/JID/configuration`.
    pub configuration: ConfigurationNode,
    /// `/jobs/JID/identifiers` (empty when the node is absent).
    pub identifiers: IdentifiersNode,
    /// `/jobs/JID/metadata` (empty when the node is absent).
    pub metadata: MetadataNode,
    /// `/jobs/JID/status`.
    pub status: JobStatusNode,
    /// `/jobs/JID/space_needed`.
    pub space_needed: u64,
}

impl JobCtx {
    /// A context without ZooKeeper or API (unit tests, simulations).
    pub fn detached(jid: impl Into<String>, state: JobState, priority: u8) -> JobCtx {
        JobCtx {
            jid: jid.into(),
            state,
            priority,
            zk: None,
            api: None,
            space_needed: None,
        }
    }

    /// Reads the job's nodes from ZooKeeper.
    ///
    /// # Errors
    /// [`DataError`]: no session, a node that cannot be read now
    /// (retryable), or one whose data is not what the projection writes;
    /// the message names the node.
    pub async fn data(&self) -> Result<JobData, DataError> {
        let zk = self.zk.as_ref().ok_or(DataError::NoSession)?;
        // A worker that chains steps runs this one as soon as the engine
        // answered the last report: wait (bounded) for the projection to
        // show the job in this state, so that what the last step recorded
        // (identifiers, storage hand-off) is read, not what was before it.
        let status = self.await_projected(zk).await?;
        // The other nodes in ONE multi-read: one request and one round
        // trip per step instead of five of each, one after another.
        const NODES: [&str; 5] = [
            "bid",
            "configuration",
            "identifiers",
            "metadata",
            "space_needed",
        ];
        let mut reader = zk.new_multi_reader();
        for node in NODES {
            let path = format!("/jobs/{}/{node}", self.jid);
            reader
                .add_get_data(&path)
                .map_err(|e| DataError::Read(format!("cannot read {path}: {e}")))?;
        }
        let results = reader.commit().await.map_err(|e| {
            DataError::Read(format!("cannot read the nodes of /jobs/{}: {e}", self.jid))
        })?;
        if results.len() != NODES.len() {
            return Err(DataError::Read(format!(
                "reading the nodes of /jobs/{} gave {} results for {} reads",
                self.jid,
                results.len(),
                NODES.len()
            )));
        }
        let mut nodes = NODES.iter().zip(results).map(|(node, result)| {
            let path = format!("/jobs/{}/{node}", self.jid);
            match result {
                zookeeper_client::MultiReadResult::Data { data, .. } => Ok(Some(data)),
                // identifiers and metadata are absent while the job has none.
                zookeeper_client::MultiReadResult::Error {
                    err: zookeeper_client::Error::NoNode,
                } if matches!(*node, "identifiers" | "metadata") => Ok(None),
                zookeeper_client::MultiReadResult::Error { err } => {
                    Err(DataError::Read(format!("cannot read {path}: {err}")))
                }
                _ => Err(DataError::Read(format!(
                    "reading {path} gave something other than its data"
                ))),
            }
        });
        let mut next = || -> Result<Option<Vec<u8>>, DataError> {
            nodes
                .next()
                .unwrap_or_else(|| Err(DataError::Read("a job node was not read".into())))
        };
        let required = |bytes: Option<Vec<u8>>, node: &str| {
            bytes.ok_or_else(|| DataError::Read(format!("/jobs/{}/{node} is missing", self.jid)))
        };
        // Nodes are read with the types the projection writes them with;
        // one written by someone else is read leniently and bounded.
        fn typed<T: serde::de::DeserializeOwned>(
            node: &'static str,
            bytes: &[u8],
        ) -> Result<T, DataError> {
            decode(node, bytes).map_err(DataError::Invalid)
        }
        let text = |bytes: Vec<u8>| String::from_utf8_lossy(&bytes).trim().to_string();
        let bid = text(required(next()?, "bid")?);
        let configuration = typed(
            "/jobs/JID/configuration",
            &required(next()?, "configuration")?,
        )?;
        let identifiers = match next()? {
            Some(b) => typed("/jobs/JID/identifiers", &b)?,
            None => IdentifiersNode::default(),
        };
        let metadata = match next()? {
            Some(b) => typed("/jobs/JID/metadata", &b)?,
            None => MetadataNode::default(),
        };
        let space_needed = text(required(next()?, "space_needed")?)
            .parse()
            .unwrap_or(0);
        Ok(JobData {
            bid,
            configuration,
            identifiers,
            metadata,
            status,
            space_needed,
        })
    }

    /// The bytes the job needs in working storage: what the step before
    /// this one reported when the same worker chained it, else
    /// `/jobs/JID/space_needed` (0 without a session, or when the node is
    /// absent or not a number).
    ///
    /// # Errors
    /// The node could not be read now (retryable).
    pub async fn space_needed(&self) -> Result<u64, DataError> {
        if let Some(n) = self.space_needed {
            return Ok(n);
        }
        let Some(zk) = &self.zk else {
            return Ok(0);
        };
        let path = format!("/jobs/{}/space_needed", self.jid);
        match zk.get_data(&path).await {
            Ok((data, _)) => Ok(String::from_utf8_lossy(&data).trim().parse().unwrap_or(0)),
            Err(zookeeper_client::Error::NoNode) => Ok(0),
            Err(e) => Err(DataError::Read(format!("cannot read {path}: {e}"))),
        }
    }

    /// Waits until `/jobs/JID/status` shows [`JobCtx::state`], at most
    /// [`PROJECTION_WAIT`]; the status node it then read.
    async fn await_projected(
        &self,
        zk: &zookeeper_client::Client,
    ) -> Result<JobStatusNode, DataError> {
        let path = format!("/jobs/{}/status", self.jid);
        let deadline = tokio::time::Instant::now() + PROJECTION_WAIT;
        let want = self.state.to_string();
        loop {
            let (data, _, watcher) = zk
                .get_and_watch_data(&path)
                .await
                .map_err(|e| DataError::Read(format!("cannot read {path}: {e}")))?;
            let node = decode::<JobStatusNode>("/jobs/JID/status", &data)?;
            let now = node.status.clone();
            if now == want {
                // The status changes again at this job's next step.
                crate::session::park(watcher);
                return Ok(node);
            }
            if tokio::time::timeout_at(deadline, watcher.changed())
                .await
                .is_err()
            {
                return Err(DataError::Read(format!(
                    "{path} still says {} rather than {want} after {PROJECTION_WAIT:?}",
                    ingest_protocol::cut(&now, 64)
                )));
            }
        }
    }

    /// Records a recoverable error and the attempt that follows it
    /// (`POST /jobs/JID/retries`), so the history shows every retry. A
    /// refusal or an unreachable API is logged: the retry goes on.
    pub async fn record_retry(&self, attempt: u32, message: &str) {
        tracing::warn!(jid = %self.jid, state = %self.state, attempt, message = %ingest_protocol::bounded(&message), "recoverable error; retrying");
        let Some(api) = &self.api else {
            return;
        };
        let body = RetryBody {
            worker: api.worker.clone(),
            session_id: SessionId(api.session_id),
            state: self.state.to_string(),
            attempt,
            message: ingest_protocol::cut(message, ingest_protocol::MAX_MESSAGE_BYTES).into_owned(),
        };
        let path = format!("/jobs/{}/retries", self.jid);
        if let Err(e) = api
            .engine
            .report::<_, JobMoved>(&path, &api.fence, &body)
            .await
        {
            tracing::warn!(jid = %self.jid, error = %ingest_protocol::bounded(&e), "cannot record the retry");
        }
    }

    /// A fenced call: POSTs the body `body` builds from this worker's name
    /// and session to `path`, and reads the answer as `R`.
    ///
    /// # Errors
    /// No API, no answer, or an answer other than 2xx and 409.
    pub async fn call<B: serde::Serialize, R: serde::de::DeserializeOwned>(
        &self,
        path: &str,
        body: impl Fn(WorkerRef) -> B,
    ) -> Result<Reply<R>, CallError> {
        let api = self.api.as_ref().ok_or(CallError::NoApi)?;
        let who = WorkerRef {
            worker: api.worker.clone(),
            session_id: SessionId(api.session_id),
        };
        Ok(api.engine.report(path, &api.fence, &body(who)).await?)
    }
}

/// Why a fenced call got no usable answer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CallError {
    /// The step runs without an API (unit tests of pure steps).
    #[error("no API to call")]
    NoApi,
    /// The client's error, with the status it kept.
    #[error(transparent)]
    Client(#[from] ingest_client::ClientError),
}

/// Why a step's work stopped short, by what a caller can do about it.
///
/// ### Handling
/// The step reports a failure with the message in every case; the kind
/// says why: `Recoverable` ran out of retries (an admin may requeue once
/// the cause is fixed), `Permanent` will fail the same way again, and
/// `Refused` means the engine would not take the call (the lock was lost or
/// the job moved on): the result is discarded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StepError {
    /// It may have worked if tried again; the retries ran out.
    #[error("{0}")]
    Recoverable(String),
    /// It will not work with the same input.
    #[error("{0}")]
    Permanent(String),
    /// The engine refused the call (HTTP 409) with its code.
    #[error("{message}")]
    Refused {
        /// The engine's error code (`lock_not_held`, `inventory_conflict`…).
        code: String,
        /// The message, naming the call.
        message: String,
    },
}

impl From<StepError> for String {
    fn from(e: StepError) -> String {
        e.to_string()
    }
}

/// Why a job's nodes could not be read.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum DataError {
    /// The step runs without a ZooKeeper session.
    #[error("no ZooKeeper session to read the job from")]
    NoSession,
    /// A read failed (connection loss, a node not there yet): retryable.
    #[error("{0}")]
    Read(String),
    /// A node's data is not what the projection writes: not retryable.
    #[error(transparent)]
    Invalid(#[from] ingest_protocol::node::NodeError),
}

impl From<DataError> for String {
    fn from(e: DataError) -> String {
        e.to_string()
    }
}

impl From<DataError> for StepFailure {
    fn from(e: DataError) -> StepFailure {
        StepFailure::from(e.to_string())
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

/// The job states that have a step (the ones a job daemon works on, besides
/// Pending which only starts jobs).
pub const STEP_STATES: [JobState; 7] = [
    JobState::Estimating,
    JobState::Provisioning,
    JobState::Downloading,
    JobState::Processing,
    JobState::Storing,
    JobState::Recording,
    JobState::Notify,
];

/// A shared random-number generator: `fastrand`'s (wyrand), seeded for a
/// reproducible simulation or from entropy, behind a lock so every task of
/// a worker draws from one stream.
#[derive(Debug)]
pub struct Rng(Mutex<fastrand::Rng>);

impl Rng {
    /// A generator from `seed` (the same seed gives the same numbers).
    pub fn new(seed: u64) -> Rng {
        Rng(Mutex::new(fastrand::Rng::with_seed(seed)))
    }

    /// A generator seeded from entropy.
    pub fn from_entropy() -> Rng {
        Rng(Mutex::new(fastrand::Rng::new()))
    }

    fn with<T>(&self, f: impl FnOnce(&mut fastrand::Rng) -> T) -> T {
        f(&mut self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// The next 64 random bits.
    pub fn next_u64(&self) -> u64 {
        self.with(|r| r.u64(..))
    }

    /// A number in `[0, 1)`.
    pub fn unit(&self) -> f64 {
        self.with(|r| r.f64())
    }

    /// A number in `[0, n)` (0 when `n` is 0).
    pub fn below(&self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            self.with(|r| r.usize(..n))
        }
    }
}

/// Fault injection: "force the next job of step S to fail". Cloning gives
/// another handle on the same faults.
#[derive(Debug, Clone, Default)]
pub struct Faults(Arc<Mutex<HashMap<JobState, u32>>>);

impl Faults {
    /// Makes the next job run in `state` fail (calls add up).
    pub fn fail_next(&self, state: JobState) {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        *m.entry(state).or_default() += 1;
    }

    /// Takes one pending fault for `state`, if any.
    pub fn take(&self, state: JobState) -> bool {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match m.get_mut(&state) {
            Some(n) if *n > 0 => {
                *n -= 1;
                true
            }
            _ => false,
        }
    }

    /// How many faults are still pending for `state`.
    pub fn pending(&self, state: JobState) -> u32 {
        let m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        m.get(&state).copied().unwrap_or(0)
    }
}

/// How one simulated step behaves.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SimSettings {
    /// How long the step takes.
    pub duration: Duration,
    /// The probability, in `[0, 1]`, that it fails.
    pub failure_rate: f64,
}

impl Default for SimSettings {
    fn default() -> SimSettings {
        SimSettings {
            duration: Duration::ZERO,
            failure_rate: 0.0,
        }
    }
}

/// A simulated step: it sleeps, then succeeds or fails at random (or when a
/// fault was injected), with plausible data for its state.
#[derive(Debug, Clone)]
pub struct Simulate {
    settings: SimSettings,
    rng: Arc<Rng>,
    faults: Faults,
}

impl Simulate {
    /// A simulated step sharing `rng` and `faults` with the others.
    pub fn new(settings: SimSettings, rng: Arc<Rng>, faults: Faults) -> Simulate {
        Simulate {
            settings,
            rng,
            faults,
        }
    }

    fn conclude(&self, job: &JobCtx) -> Outcome {
        if self.faults.take(job.state) {
            return Outcome::failure(format!("simulated {} failure (injected)", job.state));
        }
        if self.settings.failure_rate > 0.0 && self.rng.unit() < self.settings.failure_rate {
            return Outcome::failure(format!("simulated {} failure", job.state));
        }
        let done = Outcome::success(format!("simulated {}", job.state));
        let manifest = format!(
            "https://example.invalid/simulate/{}/manifest.checkm",
            job.jid
        );
        match job.state {
            JobState::Estimating | JobState::Downloading => {
                done.with_space_needed(1024 + self.rng.below(1 << 20) as u64)
            }
            JobState::Storing => done.with_store(StoreBody {
                manifest_url: manifest,
                mode: "add".into(),
                delete: false,
            }),
            JobState::Recording => done.with_inventory(InventoryBody {
                manifest_url: manifest,
                mode: "add".into(),
            }),
            _ => done,
        }
    }
}

impl Step for Simulate {
    fn run<'a>(&'a self, job: &'a JobCtx) -> StepFuture<'a> {
        Box::pin(async move {
            if !self.settings.duration.is_zero() {
                tokio::time::sleep(self.settings.duration).await;
            }
            StepResult::Report(self.conclude(job))
        })
    }
}

/// How full a file system is.
pub trait StorageProbe: Send + Sync {
    /// The used share of the file system holding `path`, in percent.
    ///
    /// # Errors
    /// When it cannot be measured.
    fn used_percent(&self, path: &Path) -> std::io::Result<f64>;

    /// The bytes an unprivileged writer can still write on the file system
    /// holding `path` (unbounded when the probe does not know).
    ///
    /// # Errors
    /// When it cannot be measured.
    fn available_bytes(&self, _path: &Path) -> std::io::Result<u64> {
        Ok(u64::MAX)
    }
}

/// Measures with `statvfs(2)` (through `rustix`), as `df` does: used
/// blocks over the blocks an unprivileged writer can use
/// (`used / (used + available)`), so reserved blocks count as full.
#[derive(Debug, Clone, Copy, Default)]
pub struct DfProbe;

impl StorageProbe for DfProbe {
    fn used_percent(&self, path: &Path) -> std::io::Result<f64> {
        let st = rustix::fs::statvfs(path).map_err(std::io::Error::from)?;
        Ok(used_percent(st.f_blocks, st.f_bfree, st.f_bavail))
    }

    fn available_bytes(&self, path: &Path) -> std::io::Result<u64> {
        let st = rustix::fs::statvfs(path).map_err(std::io::Error::from)?;
        Ok(st.f_bavail.saturating_mul(st.f_frsize))
    }
}

/// `df`'s capacity from block counts: used over used plus available, in
/// percent (0 for an empty file system).
pub fn used_percent(blocks: u64, free: u64, available: u64) -> f64 {
    let used = blocks.saturating_sub(free);
    let usable = used.saturating_add(available);
    if usable == 0 {
        return 0.0;
    }
    used as f64 * 100.0 / usable as f64
}

/// A probe that answers what it is told (for tests): a fill level and the
/// bytes available (unbounded unless set).
#[derive(Debug, Clone, Default)]
pub struct FixedProbe(Arc<Mutex<(f64, Option<u64>)>>);

impl FixedProbe {
    /// A probe answering `percent`.
    pub fn new(percent: f64) -> FixedProbe {
        FixedProbe(Arc::new(Mutex::new((percent, None))))
    }

    /// Changes the fill level.
    pub fn set(&self, percent: f64) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).0 = percent;
    }

    /// Changes the bytes available.
    pub fn set_available(&self, bytes: u64) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).1 = Some(bytes);
    }
}

impl StorageProbe for FixedProbe {
    fn used_percent(&self, _: &Path) -> std::io::Result<f64> {
        Ok(self.0.lock().unwrap_or_else(|e| e.into_inner()).0)
    }

    fn available_bytes(&self, _: &Path) -> std::io::Result<u64> {
        Ok(self
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .1
            .unwrap_or(u64::MAX))
    }
}

/// Provisioning: keeps jobs waiting while working storage is fuller than the
/// threshold, or has less room than the job's `space_needed` (its
/// estimate), then runs the inner step.
pub struct Provision {
    probe: Arc<dyn StorageProbe>,
    threshold_percent: f64,
    working_storage: PathBuf,
    inner: Arc<dyn Step>,
}

impl Provision {
    /// A gate on `working_storage` in front of `inner`.
    pub fn new(
        probe: Arc<dyn StorageProbe>,
        threshold_percent: f64,
        working_storage: PathBuf,
        inner: Arc<dyn Step>,
    ) -> Provision {
        Provision {
            probe,
            threshold_percent,
            working_storage,
            inner,
        }
    }
}

impl Step for Provision {
    fn run<'a>(&'a self, job: &'a JobCtx) -> StepFuture<'a> {
        Box::pin(async move {
            let probe = Arc::clone(&self.probe);
            let path = self.working_storage.clone();
            let used = tokio::task::spawn_blocking(move || {
                Ok::<_, std::io::Error>((probe.used_percent(&path)?, probe.available_bytes(&path)?))
            })
            .await;
            let needed = match job.space_needed().await {
                Ok(n) => n,
                Err(e) => {
                    return StepResult::Wait(format!("cannot read the job's space_needed: {e}"))
                }
            };
            match used {
                // Before, only the fill level counted: a 30 MB job passed on
                // an empty 20 MiB working storage and failed in Downloading.
                Ok(Ok((_, available))) if needed > available => StepResult::Wait(format!(
                    "working storage {} has {available} bytes free; the job needs {needed}",
                    self.working_storage.display()
                )),
                Ok(Ok((used, _))) if used <= self.threshold_percent => self.inner.run(job).await,
                Ok(Ok((used, _))) => StepResult::Wait(format!(
                    "working storage {} is {used:.1}% full (threshold {}%)",
                    self.working_storage.display(),
                    self.threshold_percent
                )),
                Ok(Err(e)) => StepResult::Wait(format!(
                    "cannot measure working storage {}: {e}",
                    self.working_storage.display()
                )),
                Err(e) => StepResult::Wait(format!("the storage probe failed: {e}")),
            }
        })
    }
}

/// A batch a batch daemon works on, with its lock held.
#[derive(Debug, Clone)]
pub struct BatchCtx {
    /// The batch id (`bid…`).
    pub bid: String,
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
        for state in STEP_STATES {
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
mod tests {
    use super::*;

    fn job(state: JobState) -> JobCtx {
        JobCtx::detached("jid0000000001", state, 5)
    }

    fn report(r: StepResult) -> Outcome {
        match r {
            StepResult::Report(o) => o,
            StepResult::Wait(w) => panic!("waits: {w}"),
        }
    }

    #[test]
    fn capacity_counts_reserved_blocks_as_df_does() {
        // 100 blocks, 42 used, nothing reserved: 42%.
        assert_eq!(used_percent(100, 58, 58), 42.0);
        // 100 blocks, 40 used, 60 free of which 20 are reserved for root:
        // df says 40 / (40 + 40) = 50%.
        assert_eq!(used_percent(100, 60, 40), 50.0);
        assert_eq!(used_percent(100, 100, 100), 0.0);
        assert_eq!(used_percent(0, 0, 0), 0.0);
        let here = DfProbe.used_percent(Path::new("/")).expect("statvfs /");
        assert!((0.0..=100.0).contains(&here), "{here}");
        assert!(DfProbe.used_percent(Path::new("/no/such/dir")).is_err());
    }

    #[test]
    fn the_rng_is_deterministic() {
        let a = Rng::new(7);
        let b = Rng::new(7);
        for _ in 0..10 {
            assert_eq!(a.next_u64(), b.next_u64());
        }
        assert!((0.0..1.0).contains(&a.unit()));
    }

    #[tokio::test]
    async fn faults_fail_the_next_job_once_and_rates_apply() {
        let probe = Arc::new(FixedProbe::new(10.0));
        let steps = Steps::simulated(SimSettings::default(), Some(1), probe, 70.0, "/".into());
        steps.faults.fail_next(JobState::Storing);
        let storing = steps.get(JobState::Storing).expect("step");
        assert!(!report(storing.run(&job(JobState::Storing)).await).success);
        let ok = report(storing.run(&job(JobState::Storing)).await);
        assert!(ok.success);
        assert!(ok.store.is_some());
        let always = Simulate::new(
            SimSettings {
                duration: Duration::ZERO,
                failure_rate: 1.0,
            },
            Arc::new(Rng::new(3)),
            Faults::default(),
        );
        assert!(!report(always.run(&job(JobState::Processing)).await).success);
    }

    /// The simulated provisioning step at a 70 % threshold, measuring with
    /// `probe`.
    fn provisioning(probe: &FixedProbe) -> Arc<dyn Step> {
        Steps::simulated(
            SimSettings::default(),
            Some(1),
            Arc::new(probe.clone()),
            70.0,
            "/".into(),
        )
        .get(JobState::Provisioning)
        .expect("step")
    }

    #[tokio::test]
    async fn provisioning_waits_while_storage_is_full() {
        let probe = FixedProbe::new(95.0);
        let step = provisioning(&probe);
        let j = job(JobState::Provisioning);
        assert!(matches!(step.run(&j).await, StepResult::Wait(_)));
        probe.set(50.0);
        assert!(report(step.run(&j).await).success);
    }

    /// Regression (issue 15 item 5): provisioning looked only at the fill
    /// level, so a 30 MB job passed on an empty 20 MiB working storage and
    /// failed in Downloading. It waits while the job needs more than there
    /// is.
    #[tokio::test]
    async fn provisioning_waits_while_the_job_needs_more_than_is_free() {
        let probe = FixedProbe::new(1.0);
        probe.set_available(20 * 1024 * 1024);
        let step = provisioning(&probe);
        let mut j = job(JobState::Provisioning);
        j.space_needed = Some(30_000_000);
        match step.run(&j).await {
            StepResult::Wait(why) => assert!(why.contains("needs 30000000"), "{why}"),
            other => panic!("a 30 MB job passed on 20 MiB: {other:?}"),
        }
        probe.set_available(64 * 1024 * 1024);
        assert!(report(step.run(&j).await).success);
    }
}
