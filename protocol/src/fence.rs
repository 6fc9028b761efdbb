//! Fencing a worker's reports with a secret only the lock's holder knows.
//!
//! A worker that takes an item's lock (`/jobs/JID/lock`,
//! `/batches/BID/lock`, ephemeral) draws a random [`FenceSecret`] and writes
//! the lock node's data as a [`LockNode`] holding only the secret's
//! [`FenceSecret::digest`]. Every fenced report then carries the secret in
//! the [`FENCE_HEADER`] header; the engine reads the lock node and accepts
//! the report only when the node is an ephemeral of the session the report
//! names AND the secret's digest is the one in the node.
//!
//! Knowing the lock's session id (anyone can read a node's stat) is not
//! enough to forge a report, and the digest in the node does not give the
//! secret. Merritt's own workers still see an ordinary ephemeral lock node;
//! its data is opaque to them.

use serde::{Deserialize, Serialize};

/// The HTTP header that carries the lock holder's secret on fenced reports.
pub const FENCE_HEADER: &str = "ingest-fence";

/// The most bytes of a lock node's data the engine reads as a [`LockNode`].
pub const MAX_LOCK_NODE_BYTES: usize = 1024;

/// The domain of the digest, so the same bytes hashed for another purpose
/// never give a lock digest.
const DIGEST_CONTEXT: &str = "ingest 2026 lock fence v1";

/// A lock holder's secret: 32 random bytes, written as 64 lowercase hex
/// digits. `Debug` does not show it.
#[derive(Clone, PartialEq, Eq)]
pub struct FenceSecret([u8; 32]);

impl std::fmt::Debug for FenceSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FenceSecret(..)")
    }
}

/// A fence secret that is not 64 hex digits.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the fence secret must be 64 hexadecimal digits")]
pub struct BadFence;

impl FenceSecret {
    /// The secret of these random bytes (the caller draws them from the
    /// operating system's generator).
    pub fn from_bytes(bytes: [u8; 32]) -> FenceSecret {
        FenceSecret(bytes)
    }

    /// Reads the header form (64 hex digits).
    ///
    /// # Errors
    /// [`BadFence`] for anything else.
    pub fn parse(text: &str) -> Result<FenceSecret, BadFence> {
        let text = text.trim();
        if text.len() != 64 {
            return Err(BadFence);
        }
        let mut bytes = [0u8; 32];
        for (i, pair) in text.as_bytes().chunks(2).enumerate() {
            let hex = std::str::from_utf8(pair).map_err(|_| BadFence)?;
            bytes[i] = u8::from_str_radix(hex, 16).map_err(|_| BadFence)?;
        }
        Ok(FenceSecret(bytes))
    }

    /// The header form: 64 lowercase hex digits.
    pub fn to_header(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The digest written into the lock node (64 hex digits, BLAKE3 keyed
    /// by a context of its own).
    pub fn digest(&self) -> String {
        blake3::derive_key(DIGEST_CONTEXT, &self.0)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    /// Whether this secret is the one whose digest `node` holds, compared
    /// in constant time.
    pub fn opens(&self, node: &LockNode) -> bool {
        let mine = self.digest();
        let theirs = node.fence.as_bytes();
        // Constant time over the digest's length: no early exit.
        mine.len() == theirs.len()
            && mine
                .as_bytes()
                .iter()
                .zip(theirs)
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0
    }
}

/// The data of a lock node an `ingest` worker takes: who holds it and the
/// digest of its secret. Written as JSON, fields in this order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockNode {
    /// The worker's name (for people reading the tree).
    pub worker: String,
    /// [`FenceSecret::digest`] of the holder's secret.
    pub fence: String,
}

impl LockNode {
    /// The node for `worker` holding `secret`.
    pub fn new(worker: &str, secret: &FenceSecret) -> LockNode {
        LockNode {
            worker: crate::cut(worker, 256).into_owned(),
            fence: secret.digest(),
        }
    }

    /// The node's bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Reads a lock node's data, `None` when it is not one an `ingest`
    /// worker wrote (another tool's lock, damaged or oversized data).
    pub fn read(data: &[u8]) -> Option<LockNode> {
        if data.len() > MAX_LOCK_NODE_BYTES {
            return None;
        }
        serde_json::from_slice(data).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_opens_only_its_own_lock() {
        let a = FenceSecret::from_bytes([7; 32]);
        let b = FenceSecret::from_bytes([8; 32]);
        let node = LockNode::new("w1", &a);
        assert!(a.opens(&node));
        assert!(!b.opens(&node));
        let read = LockNode::read(&node.to_bytes()).expect("reads back");
        assert_eq!(read, node);
        assert!(a.opens(&read));
        // The digest does not open the lock in the secret's place.
        let digest_as_secret = FenceSecret::parse(&node.fence).expect("hex");
        assert!(!digest_as_secret.opens(&node));
        assert_eq!(
            read.to_bytes(),
            format!(r#"{{"worker":"w1","fence":"{}"}}"#, a.digest()).into_bytes()
        );
    }

    #[test]
    fn the_header_form_round_trips_and_bad_forms_are_refused() {
        let a = FenceSecret::from_bytes(core::array::from_fn(|i| i as u8));
        assert_eq!(FenceSecret::parse(&a.to_header()), Ok(a.clone()));
        assert_eq!(a.to_header().len(), 64);
        for bad in ["", "00", &"g".repeat(64), &"0".repeat(63), &"é".repeat(32)] {
            assert_eq!(FenceSecret::parse(bad), Err(BadFence), "{bad:?}");
        }
        assert!(!format!("{a:?}").contains(&a.to_header()));
    }

    #[test]
    fn foreign_lock_data_is_not_a_lock_node() {
        assert_eq!(LockNode::read(b"w1"), None);
        assert_eq!(LockNode::read(b""), None);
        let huge = format!(r#"{{"worker":"{}","fence":"x"}}"#, "w".repeat(4096));
        assert_eq!(LockNode::read(huge.as_bytes()), None);
    }
}
