//! The accept loop: connection limits and header deadlines in front of the
//! router.
//!
//! `axum::serve` keeps a connection open for as long as its client takes to
//! send the request headers, and accepts every connection offered; a client
//! that opens connections and sends headers one byte at a time holds file
//! descriptors and tasks for as long as it likes. This loop serves the same
//! router through hyper with a header read deadline and a cap on open
//! connections: a connection over the cap is closed at once (and counted in
//! a WARN line at most every ten seconds), so the connections already open
//! keep being served.
//!
//! Under the global cap each client address has a cap of its own (an IPv6
//! client by its /64, which one host usually holds whole): one client
//! holding slow connections cannot take every place from the workers'
//! reports and the probes. Every request carries its peer's address as
//! axum's `ConnectInfo<SocketAddr>` (the UI's login throttle keys on it).

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::ConnectInfo;
use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::sync::Semaphore;

use ingest_config::{
    DEFAULT_HEADER_READ_TIMEOUT_SECS, DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_CONNECTIONS_PER_CLIENT,
};

/// How often, at most, refused connections are logged.
const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// The limits [`serve`] puts on connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// How long a client may take to send a request's headers before its
    /// connection is closed (HTTP/1; HTTP/2 clients are bounded by
    /// keep-alive pings).
    pub header_read_timeout: Duration,
    /// The most connections open at once; further ones are closed at once.
    pub max_connections: usize,
    /// The most connections one client ([`client_key`]) holds open at once;
    /// further ones from it are closed at once.
    pub max_connections_per_client: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            header_read_timeout: Duration::from_secs(DEFAULT_HEADER_READ_TIMEOUT_SECS),
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_connections_per_client: DEFAULT_MAX_CONNECTIONS_PER_CLIENT,
        }
    }
}

/// Serves the router until `shutdown` completes, then finishes the requests
/// in flight.
///
/// # Errors
/// Never at present: failures to accept are logged and retried (after a
/// pause, so a process out of file descriptors does not spin).
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    limits: Limits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(Some(limits.header_read_timeout))
        .keep_alive_timeout(limits.header_read_timeout);
    let graceful = GracefulShutdown::new();
    let per_client = Arc::new(PerClient::default());
    let mut refused: u64 = 0;
    let mut refused_client: u64 = 0;
    let mut last_refusal_log: Option<Instant> = None;
    let mut last_client_refusal_log: Option<Instant> = None;
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) if is_connection_error(&e) => continue,
                Err(e) => {
                    tracing::error!(error = %e, "cannot accept a connection; trying again in a second");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let Ok(permit) = Arc::clone(&permits).try_acquire_owned() else {
            refused += 1;
            if last_refusal_log.is_none_or(|t| t.elapsed() >= REFUSAL_LOG_INTERVAL) {
                tracing::warn!(
                    refused,
                    max_connections = limits.max_connections,
                    "connections refused: the API holds its most open connections"
                );
                last_refusal_log = Some(Instant::now());
            }
            drop(stream);
            continue;
        };
        let Some(client_place) =
            PerClient::take(&per_client, peer.ip(), limits.max_connections_per_client)
        else {
            refused_client += 1;
            if last_client_refusal_log.is_none_or(|t| t.elapsed() >= REFUSAL_LOG_INTERVAL) {
                tracing::warn!(
                    client = %client_key(peer.ip()),
                    refused = refused_client,
                    max_connections_per_client = limits.max_connections_per_client,
                    "connections refused: this client holds its most open connections"
                );
                last_client_refusal_log = Some(Instant::now());
            }
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(tower::ServiceExt::map_request(
            router.clone(),
            move |mut req: axum::http::Request<_>| {
                req.extensions_mut().insert(ConnectInfo::<SocketAddr>(peer));
                req
            },
        ));
        let connection = builder
            .serve_connection_with_upgrades(TokioIo::new(stream), service)
            .into_owned();
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "connection ended with an error");
            }
            drop(client_place);
            drop(permit);
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

/// The key a client's connections are counted under: its address, or for
/// IPv6 its /64 (an IPv4-mapped address counts as the IPv4 address).
pub fn client_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let mut segments = v6.segments();
                segments[4..].fill(0);
                IpAddr::V6(segments.into())
            }
        },
    }
}

/// Open connections by client key.
#[derive(Debug, Default)]
struct PerClient(Mutex<HashMap<IpAddr, usize>>);

impl PerClient {
    /// A place for one more connection of `ip`, or `None` when it holds
    /// `max` already. The place is given back when dropped.
    fn take(this: &Arc<PerClient>, ip: IpAddr, max: usize) -> Option<ClientPlace> {
        let key = client_key(ip);
        let mut open = this.0.lock().unwrap_or_else(|e| e.into_inner());
        let count = open.entry(key).or_insert(0);
        if *count >= max.max(1) {
            return None;
        }
        *count += 1;
        Some(ClientPlace {
            counts: Arc::clone(this),
            key,
        })
    }
}

/// One open connection of a client, counted until dropped.
struct ClientPlace {
    counts: Arc<PerClient>,
    key: IpAddr,
}

impl Drop for ClientPlace {
    fn drop(&mut self) {
        let mut open = self.counts.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = open.get_mut(&self.key) {
            *count -= 1;
            // The map holds only clients with connections open.
            if *count == 0 {
                open.remove(&self.key);
            }
        }
    }
}

/// Errors that concern one connection only (the client went away before it
/// was accepted).
fn is_connection_error(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::ConnectionRefused
            | std::io::ErrorKind::ConnectionAborted
            | std::io::ErrorKind::ConnectionReset
    )
}
