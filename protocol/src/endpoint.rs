//! The routes of the HTTP API as part of the contract: one type per
//! endpoint, naming its method, its route pattern, its request body and its
//! reply.
//!
//! The server's route table takes each pattern from [`Endpoint::ROUTE`];
//! the client (`ingest_client::Client::call`, and `report` for the
//! [`Fenced`] ones) and the workers call an endpoint through its value, whose [`Endpoint::path`] fills the
//! pattern with typed parameters ([`Jid`], [`Bid`], [`Qid`], an
//! [`AccessQueue`]). So a path, a body and a reply that do not belong
//! together no longer compile, and a test checks that every path is its
//! route pattern filled in.
//!
//! ```
//! use ingest_events::Jid;
//! use ingest_protocol::endpoint::{Endpoint, JobOutcome, Method};
//!
//! assert_eq!(JobOutcome::METHOD, Method::Post);
//! assert_eq!(JobOutcome::ROUTE, "/jobs/{jid}/outcome");
//! assert_eq!(JobOutcome(Jid(7)).path(), "/jobs/jid0000000007/outcome");
//! ```

use ingest_events::event::AccessQueue;
use ingest_events::{Bid, Jid, Qid};
use serde::Serialize;

use crate::access::{
    AccessList, AccessMoved, AccessOutcomeBody, AccessProgress, AccessProgressBody,
    AccessRequestBody, AccessView,
};
use crate::api::{
    AcquireBody, Acquired, AdminBody, Appended, ArkAssigned, ArkBody, CleanedUp, CleanupBody,
    DiffRepairBody, DiffRepaired, Diffed, History, JobMoved, LookedUp, LookupBody, ObjectBody,
    ObjectQuery, ObjectRecorded, ObjectView, OutcomeBody, ReportBody, Reported, ReportingBatches,
    RetryBody, Submitted, TreeQuery, Verified, WaitingBody, WorkerRef,
};
use crate::consistency::{ConsistencyReport, RepairBody, RepairDone};
use crate::history::HistoryQuery;
use crate::listing::{encode_query, BatchPage, BatchQuery, JobPage, JobQuery};
use crate::report::BatchView;
use crate::submission::SubmissionInput;
use crate::view::{JobView, StatusView};

/// The HTTP method of an endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Method {
    /// `GET`.
    Get,
    /// `POST`.
    Post,
    /// `DELETE`.
    Delete,
}

impl Method {
    /// The method's name on the wire (`GET`, `POST`, `DELETE`).
    pub const fn as_str(self) -> &'static str {
        match self {
            Method::Get => "GET",
            Method::Post => "POST",
            Method::Delete => "DELETE",
        }
    }
}

impl std::fmt::Display for Method {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The body of an endpoint that sends none (a `GET`): nothing is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct NoBody;

/// One endpoint of the API: a value of it names one resource (its path
/// parameters); the type names the method, the route pattern, the body and
/// the reply.
pub trait Endpoint {
    /// The method.
    const METHOD: Method;
    /// The route pattern, in the server router's syntax: `{name}` for a
    /// path parameter, `{*name}` for one that takes the rest of the path
    /// (`/jobs/{jid}/outcome`, `/objects/{*ark}`). No query.
    const ROUTE: &'static str;
    /// Whether a body is sent (false when [`Endpoint::Body`] is
    /// [`NoBody`]).
    const HAS_BODY: bool;
    /// What is sent, as JSON.
    type Body: Serialize;
    /// What a 2xx answer carries.
    type Reply;
    /// The path (and query, for the endpoints that take one) of this
    /// value: [`Endpoint::ROUTE`] with its parameters filled in.
    fn path(&self) -> String;
    /// Reads a 2xx answer's text as [`Endpoint::Reply`].
    ///
    /// # Errors
    /// The text is not the reply's JSON.
    fn reply(text: &str) -> Result<Self::Reply, serde_json::Error>;
}

/// An endpoint a worker calls under its ZooKeeper lock: sent with the
/// lock's secret in the fence header, and a 409 answer is a refusal (the
/// result is discarded) rather than an error.
pub trait Fenced: Endpoint {}

macro_rules! body_type {
    (NoBody) => {
        NoBody
    };
    (Json($t:ty)) => {
        $t
    };
}

macro_rules! has_body {
    (NoBody) => {
        false
    };
    (Json($t:ty)) => {
        true
    };
}

macro_rules! reply_type {
    (Text) => {
        String
    };
    (Json($t:ty)) => {
        $t
    };
}

macro_rules! read_reply {
    (Text, $text:ident) => {
        Ok($text.to_string())
    };
    (Json($t:ty), $text:ident) => {
        serde_json::from_str($text)
    };
}

/// `endpoint!(Type: METHOD "/route/{param}", Body -> Reply, |e| path)`:
/// the [`Endpoint`] impl of `Type`. Body is `NoBody` or `Json(T)`, Reply
/// `Text` or `Json(T)`.
macro_rules! endpoint {
    ($name:ident : $method:ident $route:literal, $bk:ident $(($bt:ty))? -> $rk:ident $(($rt:ty))?, |$e:ident| $path:expr) => {
        impl Endpoint for $name {
            const METHOD: Method = Method::$method;
            const ROUTE: &'static str = $route;
            const HAS_BODY: bool = has_body!($bk $(($bt))?);
            type Body = body_type!($bk $(($bt))?);
            type Reply = reply_type!($rk $(($rt))?);
            fn path(&self) -> String {
                let $e = self;
                $path
            }
            fn reply(text: &str) -> Result<Self::Reply, serde_json::Error> {
                read_reply!($rk $(($rt))?, text)
            }
        }
    };
}

/// `?` and the pairs, form-encoded as a browser does (`+` for a space), or
/// nothing when there are none.
fn form_query(path: &str, pairs: &[(&str, &str)]) -> String {
    if pairs.is_empty() {
        return path.to_string();
    }
    let mut query = url::form_urlencoded::Serializer::new(String::new());
    for (k, v) in pairs {
        query.append_pair(k, v);
    }
    format!("{path}?{}", query.finish())
}

// ---- depositors

/// `POST /batches`: submits a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Submit;
endpoint!(Submit: Post "/batches", Json(SubmissionInput) -> Json(Submitted), |_e| "/batches".into());

/// `GET /batches/{bid}`: a batch's report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GetBatch(pub Bid);
endpoint!(GetBatch: Get "/batches/{bid}", NoBody -> Json(BatchView), |e| format!("/batches/{}", e.0));

/// `GET /batches/{bid}/history`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchHistory(pub Bid);
endpoint!(BatchHistory: Get "/batches/{bid}/history", NoBody -> Json(History), |e| format!("/batches/{}/history", e.0));

/// `GET /jobs/{jid}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GetJob(pub Jid);
endpoint!(GetJob: Get "/jobs/{jid}", NoBody -> Json(JobView), |e| format!("/jobs/{}", e.0));

/// `GET /jobs/{jid}/history`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobHistory(pub Jid);
endpoint!(JobHistory: Get "/jobs/{jid}/history", NoBody -> Json(History), |e| format!("/jobs/{}/history", e.0));

/// `GET /batches?…`: one page of the batches the query asks for.
#[derive(Debug, Clone, PartialEq)]
pub struct ListBatches(pub BatchQuery);
endpoint!(ListBatches: Get "/batches", NoBody -> Json(BatchPage), |e| format!("/batches?{}", encode_query(&e.0.to_pairs())));

/// `GET /jobs?…`: one page of the jobs the query asks for.
#[derive(Debug, Clone, PartialEq)]
pub struct ListJobs(pub JobQuery);
endpoint!(ListJobs: Get "/jobs", NoBody -> Json(JobPage), |e| format!("/jobs?{}", encode_query(&e.0.to_pairs())));

/// `GET /history?…`: the events the query asks for.
#[derive(Debug, Clone, PartialEq)]
pub struct SearchHistory(pub HistoryQuery);
endpoint!(SearchHistory: Get "/history", NoBody -> Json(History), |e| format!("/history?{}", encode_query(&e.0.to_pairs())));

// ---- the access (assembly) queue

/// `POST /access`: queues an assembly request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestAccess;
endpoint!(RequestAccess: Post "/access", Json(AccessRequestBody) -> Json(AccessMoved), |_e| "/access".into());

/// `GET /access`: every assembly request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListAccess;
endpoint!(ListAccess: Get "/access", NoBody -> Json(AccessList), |_e| "/access".into());

/// `GET /access/{qid}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GetAccess(pub Qid);
endpoint!(GetAccess: Get "/access/{qid}", NoBody -> Json(AccessView), |e| format!("/access/{}", e.0));

// ---- objects

/// `GET /objects/{ark}`: an object's versions. The ark goes into the path
/// as it is (`/objects/ark:/99999/fk4x`; the route takes the rest of the
/// path).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GetObject(pub String);
endpoint!(GetObject: Get "/objects/{*ark}", NoBody -> Json(ObjectView), |e| format!("/objects/{}", e.0));

/// `GET /objects?collection=…&local_id=…`: the object a local id of a
/// collection names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FindObject(pub ObjectQuery);
endpoint!(FindObject: Get "/objects", NoBody -> Json(ObjectView), |e| form_query("/objects", &[("collection", &e.0.collection), ("local_id", &e.0.local_id)]));

// ---- workers

/// `POST /batches/{bid}/acquire`: a batch acquired, with its jobs or why
/// its payload did not expand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AcquireBatch(pub Bid);
endpoint!(AcquireBatch: Post "/batches/{bid}/acquire", Json(AcquireBody) -> Json(Acquired), |e| format!("/batches/{}/acquire", e.0));
impl Fenced for AcquireBatch {}

/// `POST /batches/{bid}/report`: a batch's report was sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReportBatch(pub Bid);
endpoint!(ReportBatch: Post "/batches/{bid}/report", Json(ReportBody) -> Json(Reported), |e| format!("/batches/{}/report", e.0));
impl Fenced for ReportBatch {}

/// `GET /reporting-batches?status=…`: the batches in a reporting status
/// (`Reporting`, `UpdateReporting`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListReporting(pub String);
endpoint!(ListReporting: Get "/reporting-batches", NoBody -> Json(ReportingBatches), |e| format!("/reporting-batches?{}", encode_query(&[("status", e.0.clone())])));

/// `POST /jobs/{jid}/start`: a Pending job started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StartJob(pub Jid);
endpoint!(StartJob: Post "/jobs/{jid}/start", Json(WorkerRef) -> Json(JobMoved), |e| format!("/jobs/{}/start", e.0));
impl Fenced for StartJob {}

/// `POST /jobs/{jid}/waiting`: why a worker keeps a job waiting (not
/// fenced: it changes no state).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobWaiting(pub Jid);
endpoint!(JobWaiting: Post "/jobs/{jid}/waiting", Json(WaitingBody) -> Json(serde_json::Value), |e| format!("/jobs/{}/waiting", e.0));

/// `POST /jobs/{jid}/outcome`: a step's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobOutcome(pub Jid);
endpoint!(JobOutcome: Post "/jobs/{jid}/outcome", Json(OutcomeBody) -> Json(JobMoved), |e| format!("/jobs/{}/outcome", e.0));
impl Fenced for JobOutcome {}

/// `POST /jobs/{jid}/retries`: a recoverable error and the retry after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobRetry(pub Jid);
endpoint!(JobRetry: Post "/jobs/{jid}/retries", Json(RetryBody) -> Json(JobMoved), |e| format!("/jobs/{}/retries", e.0));
impl Fenced for JobRetry {}

/// `POST /jobs/{jid}/ark`: the job's ark, minted when it has none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AssignArk(pub Jid);
endpoint!(AssignArk: Post "/jobs/{jid}/ark", Json(ArkBody) -> Json(ArkAssigned), |e| format!("/jobs/{}/ark", e.0));
impl Fenced for AssignArk {}

/// `POST /jobs/{jid}/lookup`: the arks the inventory binds local ids to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LookupArks(pub Jid);
endpoint!(LookupArks: Post "/jobs/{jid}/lookup", Json(LookupBody) -> Json(LookedUp), |e| format!("/jobs/{}/lookup", e.0));
impl Fenced for LookupArks {}

/// `POST /jobs/{jid}/object`: an object version's inventory record (the
/// route with its own, larger body limit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordObject(pub Jid);
endpoint!(RecordObject: Post "/jobs/{jid}/object", Json(ObjectBody) -> Json(ObjectRecorded), |e| format!("/jobs/{}/object", e.0));
impl Fenced for RecordObject {}

/// `POST /access/{qid}/start`: an assembly started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StartAccess(pub Qid);
endpoint!(StartAccess: Post "/access/{qid}/start", Json(WorkerRef) -> Json(AccessMoved), |e| format!("/access/{}/start", e.0));
impl Fenced for StartAccess {}

/// `POST /access/{qid}/outcome`: an assembly's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AccessOutcome(pub Qid);
endpoint!(AccessOutcome: Post "/access/{qid}/outcome", Json(AccessOutcomeBody) -> Json(AccessMoved), |e| format!("/access/{}/outcome", e.0));
impl Fenced for AccessOutcome {}

/// `POST /access/{qid}/progress`: how far an assembly got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReportProgress(pub Qid);
endpoint!(ReportProgress: Post "/access/{qid}/progress", Json(AccessProgressBody) -> Json(AccessProgress), |e| format!("/access/{}/progress", e.0));
impl Fenced for ReportProgress {}

// ---- admins: every action takes an [`AdminBody`] and answers [`Appended`]

/// `POST /jobs/{jid}/hold`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HoldJob(pub Jid);
endpoint!(HoldJob: Post "/jobs/{jid}/hold", Json(AdminBody) -> Json(Appended), |e| format!("/jobs/{}/hold", e.0));

/// `POST /jobs/{jid}/release`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReleaseJob(pub Jid);
endpoint!(ReleaseJob: Post "/jobs/{jid}/release", Json(AdminBody) -> Json(Appended), |e| format!("/jobs/{}/release", e.0));

/// `POST /jobs/{jid}/requeue`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequeueJob(pub Jid);
endpoint!(RequeueJob: Post "/jobs/{jid}/requeue", Json(AdminBody) -> Json(Appended), |e| format!("/jobs/{}/requeue", e.0));

/// `POST /jobs/{jid}/fail`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FailJob(pub Jid);
endpoint!(FailJob: Post "/jobs/{jid}/fail", Json(AdminBody) -> Json(Appended), |e| format!("/jobs/{}/fail", e.0));

/// `DELETE /jobs/{jid}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeleteJob(pub Jid);
endpoint!(DeleteJob: Delete "/jobs/{jid}", Json(AdminBody) -> Json(Appended), |e| format!("/jobs/{}", e.0));

/// `POST /batches/{bid}/release`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReleaseBatch(pub Bid);
endpoint!(ReleaseBatch: Post "/batches/{bid}/release", Json(AdminBody) -> Json(Appended), |e| format!("/batches/{}/release", e.0));

/// `POST /batches/{bid}/update-reporting`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UpdateReporting(pub Bid);
endpoint!(UpdateReporting: Post "/batches/{bid}/update-reporting", Json(AdminBody) -> Json(Appended), |e| format!("/batches/{}/update-reporting", e.0));

/// `DELETE /batches/{bid}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeleteBatch(pub Bid);
endpoint!(DeleteBatch: Delete "/batches/{bid}", Json(AdminBody) -> Json(Appended), |e| format!("/batches/{}", e.0));

/// `POST /collections/{profile}/hold`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HoldCollection(pub String);
endpoint!(HoldCollection: Post "/collections/{profile}/hold", Json(AdminBody) -> Json(Appended), |e| format!("/collections/{}/hold", crate::encode_segment(&e.0)));

/// `POST /collections/{profile}/release`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReleaseCollection(pub String);
endpoint!(ReleaseCollection: Post "/collections/{profile}/release", Json(AdminBody) -> Json(Appended), |e| format!("/collections/{}/release", crate::encode_segment(&e.0)));

/// `POST /collections/{profile}/release-jobs`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReleaseCollectionJobs(pub String);
endpoint!(ReleaseCollectionJobs: Post "/collections/{profile}/release-jobs", Json(AdminBody) -> Json(Appended), |e| format!("/collections/{}/release-jobs", crate::encode_segment(&e.0)));

/// `POST /queue/pause`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PauseQueue;
endpoint!(PauseQueue: Post "/queue/pause", Json(AdminBody) -> Json(Appended), |_e| "/queue/pause".into());

/// `POST /queue/resume`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResumeQueue;
endpoint!(ResumeQueue: Post "/queue/resume", Json(AdminBody) -> Json(Appended), |_e| "/queue/resume".into());

/// `POST /access/{qid}/requeue`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequeueAccess(pub Qid);
endpoint!(RequeueAccess: Post "/access/{qid}/requeue", Json(AdminBody) -> Json(Appended), |e| format!("/access/{}/requeue", e.0));

/// `DELETE /access/{qid}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeleteAccess(pub Qid);
endpoint!(DeleteAccess: Delete "/access/{qid}", Json(AdminBody) -> Json(Appended), |e| format!("/access/{}", e.0));

/// `POST /access-queues/{queue}/pause`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PauseAccessQueue(pub AccessQueue);
endpoint!(PauseAccessQueue: Post "/access-queues/{queue}/pause", Json(AdminBody) -> Json(Appended), |e| format!("/access-queues/{}/pause", e.0));

/// `POST /access-queues/{queue}/resume`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResumeAccessQueue(pub AccessQueue);
endpoint!(ResumeAccessQueue: Post "/access-queues/{queue}/resume", Json(AdminBody) -> Json(Appended), |e| format!("/access-queues/{}/resume", e.0));

/// An admin action of the CLI: one of the endpoints that take an
/// [`AdminBody`] and answer [`Appended`], chosen at run time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdminAction {
    /// [`HoldJob`].
    HoldJob(HoldJob),
    /// [`ReleaseJob`].
    ReleaseJob(ReleaseJob),
    /// [`RequeueJob`].
    RequeueJob(RequeueJob),
    /// [`FailJob`].
    FailJob(FailJob),
    /// [`DeleteJob`].
    DeleteJob(DeleteJob),
    /// [`ReleaseBatch`].
    ReleaseBatch(ReleaseBatch),
    /// [`UpdateReporting`].
    UpdateReporting(UpdateReporting),
    /// [`DeleteBatch`].
    DeleteBatch(DeleteBatch),
    /// [`HoldCollection`].
    HoldCollection(HoldCollection),
    /// [`ReleaseCollection`].
    ReleaseCollection(ReleaseCollection),
    /// [`ReleaseCollectionJobs`].
    ReleaseCollectionJobs(ReleaseCollectionJobs),
    /// [`PauseQueue`].
    PauseQueue(PauseQueue),
    /// [`ResumeQueue`].
    ResumeQueue(ResumeQueue),
    /// [`RequeueAccess`].
    RequeueAccess(RequeueAccess),
    /// [`DeleteAccess`].
    DeleteAccess(DeleteAccess),
    /// [`PauseAccessQueue`].
    PauseAccessQueue(PauseAccessQueue),
    /// [`ResumeAccessQueue`].
    ResumeAccessQueue(ResumeAccessQueue),
}

// ---- operations

/// `POST /cleanup`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cleanup;
endpoint!(Cleanup: Post "/cleanup", Json(CleanupBody) -> Json(CleanedUp), |_e| "/cleanup".into());

/// `GET /status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GetStatus;
endpoint!(GetStatus: Get "/status", NoBody -> Json(StatusView), |_e| "/status".into());

/// `GET /verify`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verify;
endpoint!(Verify: Get "/verify", NoBody -> Json(Verified), |_e| "/verify".into());

/// `GET /audit/bundle?batch=BID`: a batch's audit bundle, as JSON text.
/// The batch goes into the query as given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditBundle(pub String);
endpoint!(AuditBundle: Get "/audit/bundle", NoBody -> Text, |e| format!("/audit/bundle?batch={}", e.0));

/// `GET /audit/proof?from=POS&to=POS`: a consistency proof between two
/// signed checkpoints, as JSON text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuditProof {
    /// The older checkpoint's position.
    pub from: u64,
    /// The newer checkpoint's position.
    pub to: u64,
}
endpoint!(AuditProof: Get "/audit/proof", NoBody -> Text, |e| format!("/audit/proof?from={}&to={}", e.from, e.to));

/// `GET /tree[?at=…&path=…]`: the tree the log gives, as YAML text.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GetTree(pub TreeQuery);
endpoint!(GetTree: Get "/tree", NoBody -> Text, |e| {
    let mut pairs = Vec::new();
    if let Some(at) = &e.0.at {
        pairs.push(("at", at.as_str()));
    }
    if let Some(p) = &e.0.path {
        pairs.push(("path", p.as_str()));
    }
    form_query("/tree", &pairs)
});

/// `GET /diff`: the live tree against the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Diff;
endpoint!(Diff: Get "/diff", NoBody -> Json(Diffed), |_e| "/diff".into());

/// `POST /diff/repair`: the running projector converges every drifted item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiffRepair;
endpoint!(DiffRepair: Post "/diff/repair", Json(DiffRepairBody) -> Json(DiffRepaired), |_e| "/diff/repair".into());

/// `GET /consistency?stuck_after=SECS`: the consistency report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Consistency {
    /// Seconds after which a job in one state counts as stuck.
    pub stuck_after: u64,
}
endpoint!(Consistency: Get "/consistency", NoBody -> Json(ConsistencyReport), |e| format!("/consistency?stuck_after={}", e.stuck_after));

/// `POST /consistency/repair`: repairs one finding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConsistencyRepair;
endpoint!(ConsistencyRepair: Post "/consistency/repair", Json(RepairBody) -> Json(RepairDone), |_e| "/consistency/repair".into());

/// `GET /metrics`: the Prometheus text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Metrics;
endpoint!(Metrics: Get "/metrics", NoBody -> Text, |_e| "/metrics".into());

/// One endpoint as the route table and the tests see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Described {
    /// [`Endpoint::METHOD`].
    pub method: Method,
    /// [`Endpoint::ROUTE`].
    pub route: &'static str,
    /// [`Endpoint::path`] of a sample value.
    pub sample: String,
}

fn described<E: Endpoint>(e: E) -> Described {
    Described {
        method: E::METHOD,
        route: E::ROUTE,
        sample: e.path(),
    }
}

/// Every endpoint defined here, each with the path of a sample value
/// (parameters: `jid0000000007`, `bid0000000003`, `qid0000000005`,
/// `small`, `ark:/99999/fk4x`, `demo`).
pub fn every() -> Vec<Described> {
    let (jid, bid, qid) = (Jid(7), Bid(3), Qid(5));
    let ark = String::from("ark:/99999/fk4x");
    let profile = String::from("demo");
    let queue = AccessQueue::Small;
    vec![
        described(Submit),
        described(GetBatch(bid)),
        described(BatchHistory(bid)),
        described(GetJob(jid)),
        described(JobHistory(jid)),
        described(ListBatches(BatchQuery::default())),
        described(ListJobs(JobQuery::default())),
        described(SearchHistory(HistoryQuery::default())),
        described(RequestAccess),
        described(ListAccess),
        described(GetAccess(qid)),
        described(GetObject(ark)),
        described(FindObject(ObjectQuery {
            collection: profile.clone(),
            local_id: "a b/c".into(),
        })),
        described(AcquireBatch(bid)),
        described(ReportBatch(bid)),
        described(ListReporting("Reporting".into())),
        described(StartJob(jid)),
        described(JobWaiting(jid)),
        described(JobOutcome(jid)),
        described(JobRetry(jid)),
        described(AssignArk(jid)),
        described(LookupArks(jid)),
        described(RecordObject(jid)),
        described(StartAccess(qid)),
        described(AccessOutcome(qid)),
        described(ReportProgress(qid)),
        described(HoldJob(jid)),
        described(ReleaseJob(jid)),
        described(RequeueJob(jid)),
        described(FailJob(jid)),
        described(DeleteJob(jid)),
        described(ReleaseBatch(bid)),
        described(UpdateReporting(bid)),
        described(DeleteBatch(bid)),
        described(HoldCollection(profile.clone())),
        described(ReleaseCollection(profile.clone())),
        described(ReleaseCollectionJobs(profile)),
        described(PauseQueue),
        described(ResumeQueue),
        described(RequeueAccess(qid)),
        described(DeleteAccess(qid)),
        described(PauseAccessQueue(queue)),
        described(ResumeAccessQueue(queue)),
        described(Cleanup),
        described(GetStatus),
        described(Verify),
        described(AuditBundle(bid.to_string())),
        described(AuditProof { from: 1, to: 2 }),
        described(GetTree(TreeQuery {
            at: Some("3".into()),
            path: Some("/jobs".into()),
        })),
        described(Diff),
        described(DiffRepair),
        described(Consistency { stuck_after: 60 }),
        described(ConsistencyRepair),
        described(Metrics),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `route` with every `{name}` / `{*name}` replaced by the sample value
    /// [`every`] uses for that parameter.
    fn filled(route: &str) -> String {
        route
            .replace("{jid}", "jid0000000007")
            .replace("{bid}", "bid0000000003")
            .replace("{qid}", "qid0000000005")
            .replace("{queue}", "small")
            .replace("{*ark}", "ark:/99999/fk4x")
            .replace("{profile}", "demo")
    }

    #[test]
    fn every_path_is_its_route_pattern_filled_in() {
        let all = every();
        assert!(all.len() > 50, "{}", all.len());
        for d in &all {
            let path = d
                .sample
                .split_once('?')
                .map_or(d.sample.as_str(), |(p, _)| p);
            assert_eq!(path, filled(d.route), "{} {}", d.method, d.route);
            assert!(
                !filled(d.route).contains('{'),
                "{}: a parameter without a sample",
                d.route
            );
        }
    }

    #[test]
    fn no_two_endpoints_share_a_method_and_route() {
        let all = every();
        let mut seen = std::collections::HashSet::new();
        for d in &all {
            assert!(
                seen.insert((d.method, d.route)),
                "{} {} twice",
                d.method,
                d.route
            );
        }
    }

    #[test]
    fn queries_are_encoded_and_bodies_follow_the_method() {
        let d = described(FindObject(ObjectQuery {
            collection: "demo".into(),
            local_id: "a b/c".into(),
        }));
        assert_eq!(d.sample, "/objects?collection=demo&local_id=a+b%2Fc");
        assert_eq!(GetTree::default().path(), "/tree");
        assert_eq!(
            ListReporting("Reporting".into()).path(),
            "/reporting-batches?status=Reporting"
        );
        const { assert!(!GetStatus::HAS_BODY && JobOutcome::HAS_BODY && DeleteJob::HAS_BODY) };
        assert_eq!(Metrics::reply("a 1\n").ok().as_deref(), Some("a 1\n"));
        assert!(GetStatus::reply("not json").is_err());
    }
}
