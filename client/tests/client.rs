//! The client against real local HTTP servers (axum on loopback): what it
//! sends, how it reads each kind of answer, and how it finds the leader
//! among several engines.

use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use ingest_client::{Client, ClientError, Reply};
use ingest_events::Jid;
use ingest_protocol::api::{
    AdminBody, JobMoved, OutcomeBody, OutcomeKind, SessionId, WaitingBody, WorkerRef,
};
use ingest_protocol::endpoint::{
    AdminAction, DeleteJob, Diff, Endpoint, GetStatus, JobOutcome, JobWaiting, ListAccess, Metrics,
    StartJob, Submit, Verify,
};
use ingest_protocol::fence::{FenceSecret, FENCE_HEADER};
use ingest_protocol::submission::SubmissionInput;
use serde_json::{json, Value};

const TOKEN: &str = "client-test-token-0123456789";

/// What a server saw: (path, authorization, fence header, body).
type Seen = Arc<Mutex<Vec<(String, Option<String>, Option<String>, Value)>>>;

/// Serves `router` on a loopback port; the base URL.
async fn serve(router: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, router).await });
    base
}

fn header(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

fn error(status: StatusCode, code: &str, message: &str, leader: Option<&str>) -> Response {
    let mut error = json!({"code": code, "message": message});
    if let Some(l) = leader {
        error["leader"] = json!(l);
    }
    (status, Json(json!({ "error": error }))).into_response()
}

/// The answer of the fenced route that accepts.
fn moved() -> JobMoved {
    JobMoved {
        jid: "jid0000000007".into(),
        status: "Estimating".into(),
        batch_status: "Processing".into(),
        bid: "bid0000000003".into(),
        events: Vec::new(),
    }
}

/// Records the request (the route pattern it matched and its URI, its
/// authorization and fence headers, its JSON body or `null`) and passes it
/// on: a layer on the routes that record.
async fn record(
    State(seen): State<Seen>,
    matched: MatchedPath,
    request: Request,
    next: Next,
) -> Response {
    let (parts, body) = request.into_parts();
    let bytes = axum::body::to_bytes(body, 1 << 20)
        .await
        .unwrap_or_default();
    seen.lock().expect("lock").push((
        format!("{} {}", matched.as_str(), parts.uri),
        header(&parts.headers, "authorization"),
        header(&parts.headers, FENCE_HEADER),
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    ));
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
}

/// A server whose routes answer each kind of reply, recording requests.
/// Its routes are the endpoints' own patterns, as the server's table takes
/// them; each of the first five records the pattern it matched.
fn recording_router(seen: Seen) -> Router {
    Router::new()
        .route(
            JobWaiting::ROUTE,
            post(|| async { Json(json!({"answer": 42})) }),
        )
        .route(JobOutcome::ROUTE, post(|| async { Json(moved()) }))
        .route(
            StartJob::ROUTE,
            post(|| async {
                error(
                    StatusCode::CONFLICT,
                    "lock_not_held",
                    "the worker does not hold the lock",
                    None,
                )
            }),
        )
        .route(
            ListAccess::ROUTE,
            get(|| async { error(StatusCode::CONFLICT, "odd", "a GET is not a report", None) }),
        )
        .route(
            DeleteJob::ROUTE,
            delete(|| async { error(StatusCode::CONFLICT, "deleted", "seen", None) }),
        )
        .route_layer(middleware::from_fn_with_state(Arc::clone(&seen), record))
        .route(
            Submit::ROUTE,
            post(|| async {
                error(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "invalid_field",
                    "invalid priority: too big",
                    None,
                )
            }),
        )
        .route(
            GetStatus::ROUTE,
            get(|| async {
                error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "engine_stopped",
                    "stopped",
                    None,
                )
            }),
        )
        .route(
            Diff::ROUTE,
            get(|| async { Json(json!(["not", "an", "object"])) }),
        )
        .route(Metrics::ROUTE, get(|| async { "plain text" }))
        .with_state(seen)
}

fn waiting() -> WaitingBody {
    WaitingBody {
        state: "Provisioning".into(),
        reason: "no space".into(),
    }
}

#[tokio::test]
async fn a_call_sends_the_token_and_body_to_the_endpoints_path_and_decodes_the_answer() {
    let seen = Seen::default();
    let base = serve(recording_router(Arc::clone(&seen))).await;
    let client = Client::new(&base, TOKEN).expect("client");
    let answer: Value = client
        .call(&JobWaiting(Jid(7)), &waiting())
        .await
        .expect("answer");
    assert_eq!(answer, json!({"answer": 42}));
    let seen = seen.lock().expect("lock").clone();
    assert_eq!(seen.len(), 1);
    let (path, auth, fence, body) = &seen[0];
    assert_eq!(
        path, "/jobs/{jid}/waiting /jobs/jid0000000007/waiting",
        "the endpoint's path matched its own route pattern"
    );
    assert_eq!(auth.as_deref(), Some(&*format!("Bearer {TOKEN}")));
    assert_eq!(fence, &None, "an unfenced call sends no fence");
    assert_eq!(
        body,
        &json!({"state": "Provisioning", "reason": "no space"})
    );
    assert_eq!(client.get(&Metrics).await.expect("text"), "plain text");
}

#[tokio::test]
async fn errors_keep_the_status_and_code_and_say_whether_to_retry() {
    let base = serve(recording_router(Seen::default())).await;
    let client = Client::new(&base, TOKEN).expect("client");
    let e = client
        .call(&Submit, &SubmissionInput::default())
        .await
        .expect_err("422");
    assert_eq!(e.status(), Some(422));
    assert_eq!(e.code(), Some("invalid_field"));
    assert!(!e.is_retryable(), "{e}");
    assert!(e.to_string().contains("invalid priority: too big"), "{e}");
    let e = client.get(&GetStatus).await.expect_err("503");
    assert_eq!(e.status(), Some(503));
    assert!(e.is_retryable(), "{e}");
    let e = client.get(&Diff).await.expect_err("another shape");
    assert!(matches!(e, ClientError::Decode { .. }), "{e:?}");
    assert!(!e.is_retryable(), "{e}");
    let e = client.get(&Verify).await.expect_err("404");
    assert_eq!(e.status(), Some(404));
}

#[tokio::test]
async fn a_refused_report_is_a_reply_and_the_fence_is_sent() {
    let seen = Seen::default();
    let base = serve(recording_router(Arc::clone(&seen))).await;
    let client = Client::new(&base, TOKEN).expect("client");
    let fence = FenceSecret::from_bytes([7; 32]);
    let who = WorkerRef {
        worker: "w".into(),
        session_id: SessionId(1),
    };
    let reply = client
        .report(&StartJob(Jid(7)), &fence, &who)
        .await
        .expect("a reply");
    assert_eq!(
        reply,
        Reply::Refused {
            code: "lock_not_held".into(),
            message: "the worker does not hold the lock".into()
        }
    );
    let body = OutcomeBody {
        worker: "w".into(),
        session_id: SessionId(1),
        state: "Pending".into(),
        outcome: OutcomeKind::Success,
        message: String::new(),
        priority: None,
        space_needed: None,
        identifiers: None,
        store: None,
        inventory: None,
        failure: None,
        duration_ms: None,
    };
    let reply = client
        .report(&JobOutcome(Jid(7)), &fence, &body)
        .await
        .expect("a reply");
    assert_eq!(reply, Reply::Done(moved()));
    let seen = seen.lock().expect("lock").clone();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0].0, "/jobs/{jid}/start /jobs/jid0000000007/start");
    assert_eq!(seen[1].0, "/jobs/{jid}/outcome /jobs/jid0000000007/outcome");
    assert_eq!(seen[0].3, json!({"worker": "w", "session_id": "0x1"}));
    for (_, _, sent, _) in &seen {
        assert_eq!(sent.as_deref(), Some(&*fence.to_header()));
    }
}

#[tokio::test]
async fn every_call_is_the_endpoints_method_on_its_path_with_a_body_only_when_it_takes_one() {
    let seen = Seen::default();
    let base = serve(recording_router(Arc::clone(&seen))).await;
    let client = Client::new(&base, TOKEN).expect("client");
    let e = client.access_list().await.expect_err("409");
    assert_eq!(e.code(), Some("odd"));
    let e = client
        .admin(
            &AdminAction::DeleteJob(DeleteJob(Jid(7))),
            &AdminBody {
                actor: None,
                reason: "r".into(),
            },
        )
        .await
        .expect_err("409");
    assert_eq!(e.code(), Some("deleted"), "{e}");
    let seen = seen.lock().expect("lock").clone();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0].0, "/access /access");
    assert_eq!(seen[0].3, Value::Null, "a GET sends no body");
    assert_eq!(seen[1].0, "/jobs/{jid} /jobs/jid0000000007");
    assert_eq!(seen[1].3, json!({"reason": "r"}), "a DELETE sends its body");
}

#[tokio::test]
async fn no_answer_is_a_transport_error_that_says_nothing_was_sent() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    };
    let client = Client::new(&format!("http://127.0.0.1:{port}"), TOKEN).expect("client");
    let e = client.get(&GetStatus).await.expect_err("nobody listens");
    assert!(
        matches!(e, ClientError::Transport { connect: true, .. }),
        "{e:?}"
    );
    assert!(e.is_retryable(), "{e}");
    assert_eq!(e.status(), None);
}

#[test]
fn a_base_that_is_not_an_http_url_is_refused() {
    for base in ["ftp://127.0.0.1:1", "", " , ", "not a url"] {
        let e = Client::new(base, TOKEN).expect_err(base);
        assert!(
            matches!(e, ClientError::InvalidBase { .. }),
            "{base}: {e:?}"
        );
    }
    let client = Client::new("http://a:1/, http://b:2", TOKEN).expect("two engines");
    assert_eq!(client.bases(), ["http://a:1", "http://b:2"]);
}

/// A follower: every call is a 307 naming `leader`.
fn follower(leader: String) -> Router {
    Router::new().fallback(move || {
        let leader = leader.clone();
        async move {
            error(
                StatusCode::TEMPORARY_REDIRECT,
                "not_leader",
                "this engine follows",
                Some(&leader),
            )
        }
    })
}

#[tokio::test]
async fn calls_go_to_the_leader_a_follower_names_and_skip_an_engine_that_is_down() {
    let seen = Seen::default();
    let leader = serve(recording_router(Arc::clone(&seen))).await;
    let follower = serve(follower(leader.clone())).await;
    let down = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        format!("http://{}", l.local_addr().expect("addr"))
    };
    // Next in the list after the follower, but not the one it names.
    let other = serve(Router::new().fallback(|| async { Json(json!({"answer": 7})) })).await;
    let client =
        Client::new(&format!("{down},{follower},{other},{leader}"), TOKEN).expect("client");
    assert_eq!(client.base(), down);
    // The first engine cannot be reached: the next one is tried, which
    // follows and names the leader, which is called next.
    let answer = client
        .call(&JobWaiting(Jid(7)), &waiting())
        .await
        .expect("answered by the leader");
    assert_eq!(answer, json!({"answer": 42}));
    assert_eq!(
        client.base(),
        leader,
        "later calls go to the leader at once"
    );
    assert_eq!(seen.lock().expect("lock").len(), 1);
}

#[tokio::test]
async fn an_engine_that_does_not_lead_is_left_for_the_next() {
    let leader = serve(recording_router(Seen::default())).await;
    let not_leading = serve(Router::new().fallback(|| async {
        error(
            StatusCode::SERVICE_UNAVAILABLE,
            "not_leader",
            "no leader known",
            None,
        )
    }))
    .await;
    let client = Client::new(&format!("{not_leading},{leader}"), TOKEN).expect("client");
    let answer = client
        .call(&JobWaiting(Jid(7)), &waiting())
        .await
        .expect("answered by the leader");
    assert_eq!(answer, json!({"answer": 42}));
    assert_eq!(client.base(), leader);
    // With one engine, its 503 is the answer.
    let alone = Client::new(&not_leading, TOKEN).expect("client");
    let e = alone.get(&GetStatus).await.expect_err("503");
    assert_eq!(e.code(), Some("not_leader"));
}
