//! The outbound policy ([`ingest_protocol::outbound`]) where connections
//! are made: a DNS resolver that hands the HTTP client only the addresses
//! the policy allows (the check and the connection use the same addresses,
//! so a name cannot resolve to one address for the check and another for
//! the connection), and a redirect policy that applies the same rules to
//! every hop. Literal address hosts are never resolved (the client connects
//! to them directly), so [`super::fetch::Fetcher`] checks them with
//! [`OutboundPolicy::check_url`] before each request.
//!
//! A refusal is the error [`Refused`], which [`is_refused`] finds in any
//! request error; its message says "refused by outbound policy" and
//! nothing of the destination. The operator's log line (INFO) says which
//! class of address was refused.

use std::net::SocketAddr;
use std::sync::Arc;

use ingest_protocol::outbound::{refused_class, OutboundPolicy, REFUSED};
use reqwest::dns::{Addrs, Name, Resolve, Resolving};

/// A destination refused by the outbound policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{REFUSED}")]
pub struct Refused;

/// Whether `err`, or an error it wraps, is a [`Refused`].
pub fn is_refused(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(err);
    while let Some(e) = next {
        if e.downcast_ref::<Refused>().is_some() {
            return true;
        }
        next = e.source();
    }
    false
}

/// Resolves names with the system resolver and keeps only the addresses
/// the policy allows (all of them for a host of `--allow-host`); a name
/// left with none is [`Refused`].
#[derive(Debug, Clone)]
pub struct PolicyResolver {
    policy: Arc<OutboundPolicy>,
}

impl PolicyResolver {
    /// A resolver for `policy`.
    pub fn new(policy: Arc<OutboundPolicy>) -> PolicyResolver {
        PolicyResolver { policy }
    }
}

impl Resolve for PolicyResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let policy = Arc::clone(&self.policy);
        Box::pin(async move {
            let host = name.as_str().to_owned();
            let addrs: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            if policy.allows_host(&host) {
                return Ok(Box::new(addrs.into_iter()) as Addrs);
            }
            let (allowed, refused): (Vec<SocketAddr>, Vec<SocketAddr>) =
                addrs.into_iter().partition(|a| policy.allows_ip(a.ip()));
            if allowed.is_empty() {
                if let Some(first) = refused.first() {
                    tracing::info!(
                        host = %ingest_protocol::cut(&host, 256),
                        class = refused_class(first.ip()).unwrap_or("refused"),
                        "a host name refused by the outbound policy (--allow-host or --allow-network opens it)"
                    );
                    return Err(Box::new(Refused) as Box<dyn std::error::Error + Send + Sync>);
                }
            }
            Ok(Box::new(allowed.into_iter()) as Addrs)
        })
    }
}

/// Follows at most `max` redirects, each one only under the policy
/// ([`OutboundPolicy::check_redirect`]: to `http`/`https` without a
/// downgrade, a literal address by its class; names are checked when
/// resolved).
pub fn redirect_policy(policy: Arc<OutboundPolicy>, max: usize) -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(move |attempt| {
        if attempt.previous().len() > max {
            return attempt.error(TooManyRedirects(max));
        }
        let Some(from) = attempt.previous().last().cloned() else {
            return attempt.follow();
        };
        match policy.check_redirect(&from, attempt.url()) {
            Ok(()) => attempt.follow(),
            Err(_) => {
                tracing::info!(
                    to = %ingest_protocol::cut(attempt.url().as_str(), 256),
                    "a redirect refused by the outbound policy"
                );
                attempt.error(Refused)
            }
        }
    })
}

/// More redirects than allowed.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("more than {0} redirects")]
pub struct TooManyRedirects(pub usize);
