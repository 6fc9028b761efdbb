//! The job a step works on ([`JobCtx`]), how it reaches the API
//! ([`ApiCtx`]) and the job's data read from its ZooKeeper nodes ([`JobData`]).

use super::error::{CallError, DataError};
use super::PROJECTION_WAIT;
use ingest_client::Reply;
use ingest_events::{Jid, JobState};
use ingest_projections::layout;
use ingest_protocol::api::{RetryBody, SessionId, WorkerRef};
use ingest_protocol::endpoint::{Fenced, JobRetry};
use ingest_protocol::fence::FenceSecret;
use ingest_protocol::node::{
    decode, ConfigurationNode, IdentifiersNode, JobStatusNode, MetadataNode,
};

/// The job a step works on.
#[derive(Debug, Clone)]
pub struct JobCtx {
    /// The job.
    pub jid: Jid,
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
    pub fn detached(jid: Jid, state: JobState, priority: u8) -> JobCtx {
        JobCtx {
            jid,
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
        let jid = self.jid;
        let nodes: [(&str, String); 5] = [
            ("bid", layout::job_bid(jid)),
            ("configuration", layout::job_configuration(jid)),
            ("identifiers", layout::job_identifiers(jid)),
            ("metadata", layout::job_metadata(jid)),
            ("space_needed", layout::job_space_needed(jid)),
        ];
        let mut reader = zk.new_multi_reader();
        for (_, path) in &nodes {
            reader
                .add_get_data(path)
                .map_err(|e| DataError::Read(format!("cannot read {path}: {e}")))?;
        }
        let job = layout::job(jid);
        let results = reader
            .commit()
            .await
            .map_err(|e| DataError::Read(format!("cannot read the nodes of {job}: {e}")))?;
        if results.len() != nodes.len() {
            return Err(DataError::Read(format!(
                "reading the nodes of {job} gave {} results for {} reads",
                results.len(),
                nodes.len()
            )));
        }
        let mut read = nodes.iter().zip(results).map(|((node, path), result)| {
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
            read.next()
                .unwrap_or_else(|| Err(DataError::Read("a job node was not read".into())))
        };
        let required = |bytes: Option<Vec<u8>>, node: &str| {
            bytes.ok_or_else(|| DataError::Read(format!("{job}/{node} is missing")))
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
        let path = layout::job_space_needed(self.jid);
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
        let path = layout::job_status(self.jid);
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
        if let Err(e) = api
            .engine
            .report(&JobRetry(self.jid), &api.fence, &body)
            .await
        {
            tracing::warn!(jid = %self.jid, error = %ingest_protocol::bounded(&e), "cannot record the retry");
        }
    }

    /// A fenced call: sends `endpoint` the body `body` builds from this
    /// worker's name and session, and reads the answer as the endpoint's
    /// reply.
    ///
    /// # Errors
    /// No API, no answer, or an answer other than 2xx and 409.
    pub async fn call<E: Fenced>(
        &self,
        endpoint: &E,
        body: impl Fn(WorkerRef) -> E::Body,
    ) -> Result<Reply<E::Reply>, CallError> {
        let api = self.api.as_ref().ok_or(CallError::NoApi)?;
        let who = WorkerRef {
            worker: api.worker.clone(),
            session_id: SessionId(api.session_id),
        };
        Ok(api.engine.report(endpoint, &api.fence, &body(who)).await?)
    }
}
