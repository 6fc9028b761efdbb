//! Copying the log from a peer over HTTP: how a new, wiped, dropped or
//! lagging engine (re)joins, and what `ingest backup` reads.
//!
//! `GET /replication/frames?from=P` on any engine streams its durable
//! records from position `P` as one frame ([`ingest_events::frame`]). The
//! copy is imported record by record through the engine's writer, which
//! checks each against the local chain ([`ingest_events::log::Log::import`]):
//! a peer cannot make this engine take a record that does not continue its
//! log.

use std::time::Duration;

use ingest_engine::EngineHandle;
use ingest_events::codec::MAX_RECORD_BYTES;

/// How many bytes of records one import takes at most.
const IMPORT_BYTES: usize = 4 * 1024 * 1024;

/// Why a copy from a peer failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CopyError {
    /// The peer could not be reached or answered with an error.
    #[error("peer {url}: {reason}")]
    Peer {
        /// The peer.
        url: String,
        /// What went wrong (bounded).
        reason: String,
    },
    /// The peer sent bytes that are not records continuing this log.
    #[error("peer {url} sent records this log refuses: {reason}")]
    Refused {
        /// The peer.
        url: String,
        /// Why (bounded).
        reason: String,
    },
    /// No peer is known.
    #[error("no peer to copy the log from is registered")]
    NoPeer,
}

fn bounded(s: impl std::fmt::Display) -> String {
    crate::status::reason(s).unwrap_or_default()
}

/// The URL of `peer`'s frames from `from` on.
pub fn frames_url(peer: &str, from: u64) -> String {
    format!(
        "{}/replication/frames?from={from}",
        peer.trim_end_matches('/')
    )
}

/// Copies `peer`'s records after this engine's head into it; returns the
/// position reached.
///
/// # Errors
/// [`CopyError`]; what was imported before the error stays (it verified).
pub async fn copy_from(
    http: &reqwest::Client,
    peer: &str,
    token: Option<&str>,
    engine: &EngineHandle,
) -> Result<u64, CopyError> {
    let from = engine.log().head().0 + 1;
    let url = frames_url(peer, from);
    let peer_err = |reason: String| CopyError::Peer {
        url: peer.chars().take(200).collect(),
        reason,
    };
    let mut request = http.get(&url);
    if let Some(t) = token {
        request = request.bearer_auth(t);
    }
    let mut response = request.send().await.map_err(|e| peer_err(bounded(e)))?;
    if !response.status().is_success() {
        return Err(peer_err(format!("answered {}", response.status())));
    }
    let mut buffer: Vec<u8> = Vec::new();
    let mut reached = engine.log().head().0;
    loop {
        let chunk = response.chunk().await.map_err(|e| peer_err(bounded(e)))?;
        let done = chunk.is_none();
        if let Some(c) = chunk {
            buffer.extend_from_slice(&c);
        }
        // Import every whole record buffered once enough is there (or at the end).
        if buffer.len() >= IMPORT_BYTES || done {
            let whole = whole_records(&buffer).map_err(|e| CopyError::Refused {
                url: peer.chars().take(200).collect(),
                reason: e.to_string(),
            })?;
            if whole > 0 {
                let rest = buffer.split_off(whole);
                let frame = std::mem::replace(&mut buffer, rest);
                reached = engine.import(frame).await.map_err(|e| CopyError::Refused {
                    url: peer.chars().take(200).collect(),
                    reason: bounded(e),
                })?;
            }
        }
        if done {
            if !buffer.is_empty() {
                return Err(peer_err(format!(
                    "the answer ended inside a record ({} bytes left)",
                    buffer.len()
                )));
            }
            return Ok(reached);
        }
    }
}

/// A copied record longer than any record a log holds.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a record of {len} bytes (at most {MAX_RECORD_BYTES})")]
struct TooLong {
    len: usize,
}

/// The length of the longest prefix of `buffer` made of whole records.
fn whole_records(buffer: &[u8]) -> Result<usize, TooLong> {
    let mut at = 0;
    while let Some(prefix) = buffer.get(at..at + 4) {
        let len = u32::from_be_bytes([prefix[0], prefix[1], prefix[2], prefix[3]]) as usize;
        if len > MAX_RECORD_BYTES {
            return Err(TooLong { len });
        }
        if buffer.len() < at + 4 + len {
            break;
        }
        at += 4 + len;
    }
    Ok(at)
}

/// Copies from the first of `peers` that answers; returns the position
/// reached.
///
/// # Errors
/// [`CopyError::NoPeer`] without peers, else the last peer's error.
pub async fn from_peers(
    peers: &[String],
    token: Option<&str>,
    engine: &EngineHandle,
) -> Result<u64, CopyError> {
    let http = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(5))
        .build()
        .map_err(|e| CopyError::Peer {
            url: String::new(),
            reason: bounded(e),
        })?;
    let mut last = CopyError::NoPeer;
    for peer in peers {
        match copy_from(&http, peer, token, engine).await {
            Ok(p) => return Ok(p),
            Err(e) => {
                tracing::warn!(error = %e, "copying the log from a peer failed; trying the next");
                last = e;
            }
        }
    }
    Err(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_whole_records_are_taken() {
        let mut f = Vec::new();
        ingest_events::frame::push(&mut f, b"abc");
        ingest_events::frame::push(&mut f, b"defgh");
        assert_eq!(whole_records(&f), Ok(f.len()));
        assert_eq!(whole_records(&f[..f.len() - 1]), Ok(7));
        assert_eq!(whole_records(&f[..5]), Ok(0));
        assert!(whole_records(&u32::MAX.to_be_bytes()).is_err());
    }
}
