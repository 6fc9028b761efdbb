//! The Prometheus metrics of an `ingest worker` process, served at
//! `http://ADDR/metrics` with `--metrics-listen ADDR`.
//!
//! They are counted from the worker's own calls to the API (an
//! [`ingest_client::Observer`] on its client), so each report is counted
//! once, as the server answered it:
//!
//! | series | type | labels | what |
//! |---|---|---|---|
//! | `ingest_worker_steps` | counter | `state`, `outcome` | step outcomes reported (`ingest_worker_steps_total`) |
//! | `ingest_worker_step_duration_seconds` | histogram | `state`, `outcome` | how long each reported step ran |
//! | `ingest_worker_step_retries` | counter | `state` | recoverable errors retried within a step |
//! | `ingest_worker_jobs_started` | counter | | jobs taken out of Pending |
//! | `ingest_worker_reports_accepted` | counter | | fenced reports the API recorded |
//! | `ingest_worker_reports_refused` | counter | `code` | fenced reports refused (409: `lock_not_held`, `stale_report`, …): the lock was lost and the result discarded |
//! | `ingest_worker_api_unanswered` | counter | | calls that got no answer (the server unreachable) |
//! | `ingest_worker_tasks` | gauge | | daemon tasks running |
//! | `ingest_worker_build_info` | gauge | `version`, `worker` | always 1 |
//!
//! Labels are bounded: states are the lifecycle's, codes the API's stable
//! ones (anything else is `other`).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ingest_client::{Call, Method, Observer};
use ingest_events::lifecycle::StateKind;
use ingest_events::JobState;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

/// The content type of the page.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The most bytes of a request's head read before answering.
const MAX_REQUEST_HEAD: usize = 8 * 1024;
/// How long a scraper has to send its request.
const READ_DEADLINE: Duration = Duration::from_secs(5);
/// The most scrapes answered at once; more connections wait.
const MAX_CONNECTIONS: usize = 32;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StepLabels {
    state: String,
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CodeLabel {
    code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: String,
    worker: String,
}

type Histograms = Family<StepLabels, Histogram, fn() -> Histogram>;

fn step_histogram() -> Histogram {
    // 50 ms to about 27 minutes, as the server's.
    Histogram::new(exponential_buckets(0.05, 2.0, 16))
}

/// A worker's metrics; share it as `Arc<WorkerMetrics>`.
pub struct WorkerMetrics {
    registry: Mutex<Registry>,
    steps: Family<StepLabels, Counter>,
    durations: Histograms,
    retries: Family<StateLabel, Counter>,
    started: Counter,
    accepted: Counter,
    refused: Family<CodeLabel, Counter>,
    unanswered: Counter,
    tasks: Gauge,
    /// The dispatch counters, read when the page is rendered.
    dispatch: Mutex<Option<Arc<crate::daemon::Stats>>>,
    in_flight: Gauge,
    waiting: Gauge,
    job_locks: Counter,
    lock_busy: Counter,
    chained: Counter,
    handoffs: Counter,
    busy_handoffs: Counter,
    spare_runs: Counter,
}

/// Why `/metrics` could not be served.
///
/// ### Handling
/// The address is taken or not ours: fix `--metrics-listen`.
#[derive(Debug, thiserror::Error)]
#[error("cannot serve worker metrics on {addr}: {source}")]
pub struct ListenError {
    /// The address.
    pub addr: SocketAddr,
    /// Why.
    #[source]
    pub source: std::io::Error,
}

fn state_label(v: Option<&serde_json::Value>) -> String {
    v.and_then(|v| v.as_str())
        .and_then(|s| s.parse::<JobState>().ok())
        .map_or_else(|| "other".to_string(), |s| s.name().to_string())
}

fn code_label(code: Option<&str>) -> String {
    const KNOWN: [&str; 8] = [
        "lock_not_held",
        "stale_report",
        "queue_paused",
        "illegal_transition",
        "no_change",
        "collection_held",
        "cleaned_up",
        "conflict",
    ];
    code.filter(|c| KNOWN.contains(c))
        .unwrap_or("other")
        .to_string()
}

impl WorkerMetrics {
    /// Empty metrics of the worker `name`.
    pub fn new(name: &str) -> WorkerMetrics {
        let m = WorkerMetrics {
            registry: Mutex::new(Registry::default()),
            steps: Family::default(),
            durations: Family::new_with_constructor(step_histogram as fn() -> Histogram),
            retries: Family::default(),
            started: Counter::default(),
            accepted: Counter::default(),
            refused: Family::default(),
            unanswered: Counter::default(),
            tasks: Gauge::default(),
            dispatch: Mutex::new(None),
            in_flight: Gauge::default(),
            waiting: Gauge::default(),
            job_locks: Counter::default(),
            lock_busy: Counter::default(),
            chained: Counter::default(),
            handoffs: Counter::default(),
            busy_handoffs: Counter::default(),
            spare_runs: Counter::default(),
        };
        let mut r = Registry::default();
        r.register(
            "ingest_worker_steps",
            "Job step outcomes this worker reported, by state and outcome",
            m.steps.clone(),
        );
        r.register(
            "ingest_worker_step_duration_seconds",
            "How long this worker's reported steps ran, by state and outcome",
            m.durations.clone(),
        );
        r.register(
            "ingest_worker_step_retries",
            "Recoverable errors retried within a step, by state",
            m.retries.clone(),
        );
        r.register(
            "ingest_worker_jobs_started",
            "Jobs this worker took out of Pending",
            m.started.clone(),
        );
        r.register(
            "ingest_worker_reports_accepted",
            "Fenced reports the API recorded",
            m.accepted.clone(),
        );
        r.register(
            "ingest_worker_reports_refused",
            "Fenced reports the API refused (the lock was lost; the result was discarded), by code",
            m.refused.clone(),
        );
        r.register(
            "ingest_worker_api_unanswered",
            "Calls to the API that got no answer",
            m.unanswered.clone(),
        );
        r.register(
            "ingest_worker_tasks",
            "Daemon tasks this worker runs",
            m.tasks.clone(),
        );
        r.register(
            "ingest_worker_steps_in_flight",
            "Job steps this worker runs now",
            m.in_flight.clone(),
        );
        r.register(
            "ingest_worker_jobs_waiting",
            "Jobs a step of this worker asked to wait (provisioning: working storage too full or too small for the job)",
            m.waiting.clone(),
        );
        r.register(
            "ingest_worker_job_locks",
            "Job locks this worker took",
            m.job_locks.clone(),
        );
        r.register(
            "ingest_worker_lock_busy",
            "Job lock creations that found the lock held by another worker",
            m.lock_busy.clone(),
        );
        r.register(
            "ingest_worker_steps_chained",
            "Steps run under the lock taken for an earlier step of the same job",
            m.chained.clone(),
        );
        r.register(
            "ingest_worker_steps_handed_off",
            "Chained steps handed, lock held, to a task of the next step's daemon",
            m.handoffs.clone(),
        );
        r.register(
            "ingest_worker_steps_run_in_place",
            "Chained steps run in the task of the step before because the next step's daemon had no room: its inbox full, or every task on one job for over 5 s (a long store holds none of the jobs behind it)",
            m.busy_handoffs.clone(),
        );
        r.register(
            "ingest_worker_steps_run_by_spare",
            "Chained steps run by a daemon's spare: handed to the daemon before every task of it went on a long step",
            m.spare_runs.clone(),
        );
        let build: Family<BuildLabels, Gauge> = Family::default();
        build
            .get_or_create(&BuildLabels {
                version: env!("CARGO_PKG_VERSION").to_string(),
                worker: ingest_protocol::cut(name, 100).into_owned(),
            })
            .set(1);
        r.register(
            "ingest_worker_build_info",
            "The version and name of this worker",
            build,
        );
        *m.registry.lock().unwrap_or_else(|e| e.into_inner()) = r;
        m
    }

    /// Reads the dispatch counters of `stats` whenever the page is rendered.
    pub fn attach_dispatch(&self, stats: Arc<crate::daemon::Stats>) {
        *self.dispatch.lock().unwrap_or_else(|e| e.into_inner()) = Some(stats);
    }

    /// Copies the dispatch counters into their series.
    fn sync_dispatch(&self) {
        use std::sync::atomic::Ordering::Relaxed;
        let Some(s) = self
            .dispatch
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
        else {
            return;
        };
        self.in_flight.set(s.in_flight.load(Relaxed));
        self.waiting.set(s.waiting.load(Relaxed));
        // Counters only grow: add what is new since the last page.
        for (counter, now) in [
            (&self.job_locks, s.job_locks.load(Relaxed)),
            (&self.lock_busy, s.lock_busy.load(Relaxed)),
            (&self.chained, s.chained.load(Relaxed)),
            (&self.handoffs, s.handoffs.load(Relaxed)),
            (&self.busy_handoffs, s.busy_handoffs.load(Relaxed)),
            (&self.spare_runs, s.spare_runs.load(Relaxed)),
        ] {
            let shown = counter.get();
            if now > shown {
                counter.inc_by(now - shown);
            }
        }
    }

    /// Sets how many daemon tasks run.
    pub fn set_tasks(&self, n: usize) {
        self.tasks.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// The page, in the OpenMetrics text format.
    ///
    /// # Errors
    /// When the page cannot be encoded.
    pub fn render(&self) -> Result<String, std::fmt::Error> {
        self.sync_dispatch();
        let mut out = String::new();
        let r = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        prometheus_client::encoding::text::encode(&mut out, &r)?;
        Ok(out)
    }

    /// Serves `GET /metrics` on `addr` until `stop`; every other request
    /// is 404. Returns the bound address (for port 0).
    ///
    /// # Errors
    /// [`ListenError`] when the address cannot be bound.
    pub async fn serve(
        self: Arc<Self>,
        addr: SocketAddr,
        stop: CancellationToken,
    ) -> Result<SocketAddr, ListenError> {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| ListenError { addr, source })?;
        let bound = listener
            .local_addr()
            .map_err(|source| ListenError { addr, source })?;
        let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    () = stop.cancelled() => break,
                    a = listener.accept() => a,
                };
                let Ok((stream, _)) = accepted else {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                let Ok(permit) = Arc::clone(&slots).acquire_owned().await else {
                    break;
                };
                let metrics = Arc::clone(&self);
                tokio::spawn(async move {
                    let _ = tokio::time::timeout(READ_DEADLINE * 2, answer(&metrics, stream)).await;
                    drop(permit);
                });
            }
        });
        Ok(bound)
    }
}

/// Reads one request head (bounded, with a deadline) and answers it.
async fn answer(metrics: &WorkerMetrics, mut stream: tokio::net::TcpStream) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    let read = tokio::time::timeout(READ_DEADLINE, async {
        while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < MAX_REQUEST_HEAD {
            let n = stream.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            head.extend_from_slice(&buf[..n]);
        }
        Ok::<_, std::io::Error>(())
    })
    .await;
    if !matches!(read, Ok(Ok(()))) {
        return Ok(());
    }
    let line = head.split(|b| *b == b'\n').next().unwrap_or_default();
    let mut parts = line.split(|b| *b == b' ');
    let (method, target) = (parts.next(), parts.next());
    let (status, content_type, body) = match (method, target) {
        (Some(b"GET"), Some(b"/metrics")) => match metrics.render() {
            Ok(page) => ("200 OK", CONTENT_TYPE, page),
            Err(e) => (
                "500 Internal Server Error",
                "text/plain; charset=utf-8",
                format!("cannot encode the metrics: {e}\n"),
            ),
        },
        _ => (
            "404 Not Found",
            "text/plain; charset=utf-8",
            "only GET /metrics is served here\n".to_string(),
        ),
    };
    let response = format!(
        "HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(response.as_bytes()).await?;
    stream.shutdown().await
}

/// What a call's path names: the last segment of `/jobs/JID/…` or
/// `/batches/BID/…`.
fn action(path: &str) -> Option<(&str, &str)> {
    let path = path.split('?').next().unwrap_or(path);
    let mut parts = path.trim_start_matches('/').split('/');
    match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some(kind @ ("jobs" | "batches")), Some(_), Some(verb), None) => Some((kind, verb)),
        _ => None,
    }
}

impl Observer for WorkerMetrics {
    fn observe(&self, call: &Call<'_>) {
        let Some(status) = call.status else {
            self.unanswered.inc();
            return;
        };
        if *call.method != Method::POST {
            return;
        }
        let Some((kind, verb)) = action(call.path) else {
            return;
        };
        let ok = (200..300).contains(&status);
        let fenced = matches!(
            (kind, verb),
            (
                "jobs",
                "start" | "outcome" | "retries" | "ark" | "lookup" | "object"
            ) | ("batches", "acquire" | "report")
        );
        if fenced && ok {
            self.accepted.inc();
        }
        if fenced && status == 409 {
            self.refused
                .get_or_create(&CodeLabel {
                    code: code_label(call.code),
                })
                .inc();
        }
        if !ok {
            return;
        }
        let field = |name: &str| call.body.and_then(|b| b.get(name));
        match (kind, verb) {
            ("jobs", "start") => {
                self.started.inc();
            }
            ("jobs", "retries") => {
                self.retries
                    .get_or_create(&StateLabel {
                        state: state_label(field("state")),
                    })
                    .inc();
            }
            ("jobs", "outcome") => {
                let outcome = match field("outcome").and_then(|v| v.as_str()) {
                    Some("success") => "success",
                    Some("failure") => "failure",
                    _ => "other",
                };
                let labels = StepLabels {
                    state: state_label(field("state")),
                    outcome: outcome.to_string(),
                };
                self.steps.get_or_create(&labels).inc();
                if let Some(ms) = field("duration_ms").and_then(|v| v.as_u64()) {
                    self.durations
                        .get_or_create(&labels)
                        .observe(ms as f64 / 1000.0);
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call<'a>(
        path: &'a str,
        body: Option<&'a serde_json::Value>,
        status: Option<u16>,
        code: Option<&'a str>,
    ) -> Call<'a> {
        static POST: Method = Method::POST;
        Call {
            method: &POST,
            path,
            body,
            status,
            code,
            elapsed: Duration::from_millis(1),
        }
    }

    /// The dispatch figures (steps in flight, jobs waiting, locks taken,
    /// busy, chained) are on the page, as the daemons count them.
    #[test]
    fn dispatch_counters_are_served() {
        use std::sync::atomic::Ordering::Relaxed;
        let m = WorkerMetrics::new("w1");
        let stats = Arc::new(crate::daemon::Stats::default());
        m.attach_dispatch(Arc::clone(&stats));
        stats.in_flight.store(3, Relaxed);
        stats.waiting.store(2, Relaxed);
        stats.job_locks.store(7, Relaxed);
        stats.chained.store(5, Relaxed);
        stats.handoffs.store(4, Relaxed);
        stats.busy_handoffs.store(6, Relaxed);
        stats.spare_runs.store(8, Relaxed);
        let page = m.render().expect("render");
        for line in [
            "ingest_worker_steps_in_flight 3",
            "ingest_worker_jobs_waiting 2",
            "ingest_worker_job_locks_total 7",
            "ingest_worker_steps_chained_total 5",
            "ingest_worker_steps_handed_off_total 4",
            "ingest_worker_steps_run_in_place_total 6",
            "ingest_worker_steps_run_by_spare_total 8",
            "ingest_worker_lock_busy_total 0",
        ] {
            assert!(page.contains(line), "{line} not in\n{page}");
        }
        stats.job_locks.store(9, Relaxed);
        assert!(m
            .render()
            .expect("render")
            .contains("ingest_worker_job_locks_total 9"));
    }

    #[test]
    fn calls_become_bounded_series() {
        let m = WorkerMetrics::new("w1");
        let outcome =
            serde_json::json!({"state": "Downloading", "outcome": "success", "duration_ms": 1500});
        m.observe(&call(
            "/jobs/jid0000000001/outcome",
            Some(&outcome),
            Some(200),
            None,
        ));
        let evil = serde_json::json!({"state": "x".repeat(10_000), "outcome": "maybe"});
        m.observe(&call(
            "/jobs/jid0000000001/outcome",
            Some(&evil),
            Some(200),
            None,
        ));
        let retry = serde_json::json!({"state": "storing", "attempt": 2});
        m.observe(&call(
            "/jobs/jid0000000001/retries",
            Some(&retry),
            Some(200),
            None,
        ));
        m.observe(&call("/jobs/jid0000000002/start", None, Some(200), None));
        m.observe(&call(
            "/jobs/jid0000000002/outcome",
            Some(&outcome),
            Some(409),
            Some("lock_not_held"),
        ));
        m.observe(&call(
            "/batches/bid0000000001/report",
            None,
            Some(409),
            Some("¿new?"),
        ));
        m.observe(&call("/jobs/jid0000000002/outcome", None, None, None));
        m.set_tasks(3);
        let page = m.render().expect("render");
        for expected in [
            "ingest_worker_steps_total{state=\"Downloading\",outcome=\"success\"} 1",
            "ingest_worker_steps_total{state=\"other\",outcome=\"other\"} 1",
            "ingest_worker_step_duration_seconds_sum{state=\"Downloading\",outcome=\"success\"} 1.5",
            "ingest_worker_step_retries_total{state=\"Storing\"} 1",
            "ingest_worker_jobs_started_total 1",
            "ingest_worker_reports_accepted_total 4",
            "ingest_worker_reports_refused_total{code=\"lock_not_held\"} 1",
            "ingest_worker_reports_refused_total{code=\"other\"} 1",
            "ingest_worker_api_unanswered_total 1",
            "ingest_worker_tasks 3",
            "ingest_worker_build_info{version=",
        ] {
            assert!(page.contains(expected), "missing {expected:?} in\n{page}");
        }
        assert!(!page.contains("xxxx"), "unbounded input became a label");
    }

    #[tokio::test]
    async fn metrics_are_served_over_http_and_nothing_else() {
        let m = Arc::new(WorkerMetrics::new("w1"));
        let stop = CancellationToken::new();
        let addr = Arc::clone(&m)
            .serve("127.0.0.1:0".parse().expect("addr"), stop.clone())
            .await
            .expect("serve");
        let get = |path: &'static str| async move {
            let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
            s.write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\n\r\n").as_bytes())
                .await
                .expect("write");
            let mut out = String::new();
            s.read_to_string(&mut out).await.expect("read");
            out
        };
        let page = get("/metrics").await;
        assert!(page.starts_with("HTTP/1.1 200 OK"), "{page}");
        assert!(page.contains("ingest_worker_tasks 0"), "{page}");
        assert!(get("/other").await.starts_with("HTTP/1.1 404"));
        // A second bind of the same address is refused with the address.
        let e = Arc::clone(&m)
            .serve(addr, stop.clone())
            .await
            .expect_err("taken");
        assert!(e.to_string().contains(&addr.to_string()), "{e}");
        stop.cancel();
    }
}
