//! Audit evidence: signed checkpoints checked, snapshots checked against a
//! full fold, audit bundles with inclusion proofs, consistency proofs.
//!
//! The Merkle tree and its hashing are [`ingest_events::merkle`]'s (RFC 9162
//! with SHA-256; a leaf is `SHA-256(0x00 ‖ record hash)`). A signed tree
//! head is a [`LogCheckpointed`] record: the engine's Ed25519 signature over
//! [`LogCheckpointed::signed_bytes`] (`ingest tree head v1\n`, the tree size
//! as 8 bytes big-endian, the 32-byte root) for the tree over every record
//! before it.
//!
//! ## Audit bundle (`ingest audit export`)
//! One JSON file, `"format": "ingest-audit-bundle-1"`, that stands alone:
//!
//! ```text
//! { "format": "ingest-audit-bundle-1",
//!   "batch": "bid0000000001",
//!   "head": { "checkpoint_position": P, "tree_size": N, "root": HEX,
//!             "public_key": HEX (32 bytes), "signature": HEX (64 bytes) },
//!   "events": [ { "position": p, "header": HEX, "kind": "JobCreated",
//!                 "payload": HEX, "hash": HEX, "proof": [HEX, …] }, … ] }
//! ```
//!
//! Each event carries the bytes its record hash covers (see
//! [`RecordParts`]): `hash = BLAKE3(header ‖ len(kind) u64 LE ‖ kind ‖
//! payload)`, and the header's second field (a bincode varint after the
//! schema version) is its position. Its proof is the RFC 9162 audit path of
//! leaf `p - 1` in the tree of `N` leaves. A verifier checks the signature,
//! each event's hash and position, and each proof against the signed root.
//! Inclusion shows the events are in the signed log; it cannot show that no
//! other event of the batch was left out.
//!
//! ## Consistency proof (`ingest audit prove`)
//! `"format": "ingest-consistency-proof-1"`, two signed heads (`from`, `to`,
//! as above) and the RFC 9162 consistency proof between their trees: an
//! auditor who kept the old head checks that the new log only grew.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use ingest_events::codec::RecordParts;
use ingest_events::event::{Event, LogCheckpointed, StreamId};
use ingest_events::log::{Log, LogError, VerifyProblem, VerifyReport};
use ingest_events::merkle::{self, Frontier, Node, Tree};
use ingest_events::{Bid, Jid, Recorded, State};
use ingest_steps::signing;
use serde::{Deserialize, Serialize};

use crate::snapshot;

/// The format name of an audit bundle.
pub const BUNDLE_FORMAT: &str = "ingest-audit-bundle-1";
/// The format name of a consistency proof file.
pub const CONSISTENCY_FORMAT: &str = "ingest-consistency-proof-1";
/// The largest audit file `verify_file` reads.
pub const MAX_AUDIT_FILE_BYTES: u64 = 256 * 1024 * 1024;
/// The longest proof accepted (a tree of 2^64 leaves has 64 levels).
const MAX_PROOF_NODES: usize = 64;

/// What `ingest verify` found beyond the hash chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FullReport {
    /// The hash chain and the stream index ([`Log::verify`]).
    pub log: VerifyReport,
    /// Signed checkpoints whose root and signature were checked.
    pub checkpoints_checked: u64,
    /// Snapshots compared with the full fold.
    pub snapshots_checked: u64,
    /// The kind of each problem of `log.problems`, in the same order.
    pub kinds: Vec<ProblemKind>,
}

/// What a problem `verify` found is about: what the record or the
/// structure checked was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProblemKind {
    /// The hash chain, a record, or the stream index.
    Chain,
    /// A signed checkpoint (its tree size, root or signature).
    Checkpoint,
    /// The full fold of the log into the state.
    Fold,
    /// A snapshot in the data directory.
    Snapshot,
}

impl ProblemKind {
    /// The name shown in grouped problems.
    pub fn name(self) -> &'static str {
        match self {
            ProblemKind::Chain => "hash chain and index",
            ProblemKind::Checkpoint => "signed checkpoint",
            ProblemKind::Fold => "fold",
            ProblemKind::Snapshot => "snapshot",
        }
    }
}

/// Re-checks the whole log in one pass: the hash chain and the index, every
/// signed checkpoint (its tree size, its root recomputed from the records,
/// its signature, and, with `pinned`, that this key made it), and every
/// snapshot in the data directory against the full fold at its position
/// (the log is folded only when there are snapshots).
/// Read-only.
///
/// # Errors
/// [`LogError::Storage`] on I/O errors; everything else is a problem in the
/// report.
pub fn verify(
    log: &Log,
    data_dir: &Path,
    pinned: Option<[u8; 32]>,
    progress: impl FnMut(u64),
) -> Result<FullReport, LogError> {
    let mut snapshots: Vec<(u64, PathBuf)> = snapshot::list(&snapshot::snapshot_dir(data_dir))
        .unwrap_or_default()
        .into_iter()
        .filter(|(p, _)| *p > 0)
        .collect();
    snapshots.sort();
    let mut checker = Checker {
        frontier: Frontier::new(),
        state: State::new(),
        // The full fold costs as much again as the chain check: only when
        // there are snapshots to compare it with.
        fold_ok: !snapshots.is_empty(),
        pinned,
        snapshots: snapshots.into_iter().peekable(),
        problems: Vec::new(),
        checkpoints: 0,
        snapshots_checked: 0,
    };
    let mut report = log.verify_with(progress, |r| checker.record(r))?;
    let end = report.head_position;
    let past: Vec<(u64, PathBuf)> = checker.snapshots.by_ref().collect();
    for (position, path) in past {
        checker.push(ProblemKind::Snapshot, VerifyProblem {
            position,
            message: format!(
                "snapshot {} was taken at position {position}, past the end of the verified log ({end}): positions {}..={position} are missing (a truncated log, or a data directory restored from an older copy; start-up ignores the snapshot)",
                path.display(),
                end + 1
            ),
        });
    }
    let mut tagged: Vec<(ProblemKind, VerifyProblem)> = report
        .problems
        .drain(..)
        .map(|p| (ProblemKind::Chain, p))
        .chain(checker.problems.drain(..))
        .collect();
    tagged.sort_by_key(|(_, p)| p.position);
    let (kinds, problems) = tagged.into_iter().unzip();
    report.problems = problems;
    Ok(FullReport {
        log: report,
        checkpoints_checked: checker.checkpoints,
        snapshots_checked: checker.snapshots_checked,
        kinds,
    })
}

struct Checker {
    frontier: Frontier,
    state: State,
    fold_ok: bool,
    pinned: Option<[u8; 32]>,
    snapshots: std::iter::Peekable<std::vec::IntoIter<(u64, PathBuf)>>,
    problems: Vec<(ProblemKind, VerifyProblem)>,
    checkpoints: u64,
    snapshots_checked: u64,
}

impl Checker {
    fn push(&mut self, kind: ProblemKind, problem: VerifyProblem) {
        self.problems.push((kind, problem));
    }

    fn record(&mut self, r: &Recorded) {
        let position = r.envelope.position;
        if let Event::LogCheckpointed(c) = &r.event {
            self.checkpoints += 1;
            if let Some(problem) = check_checkpoint(c, &self.frontier, self.pinned) {
                self.push(
                    ProblemKind::Checkpoint,
                    VerifyProblem {
                        position,
                        message: problem,
                    },
                );
            }
        }
        self.frontier.push(&r.envelope.hash);
        if self.fold_ok {
            if let Err(e) = self.state.apply(r) {
                self.fold_ok = false;
                self.push(
                    ProblemKind::Fold,
                    VerifyProblem {
                        position,
                        message: format!("the fold stops here: {e}"),
                    },
                );
            }
        }
        while let Some((p, path)) = self.snapshots.next_if(|(p, _)| *p <= position) {
            self.snapshots_checked += 1;
            let message = match snapshot::read(&path) {
                Err(e) => Some(e.to_string()),
                Ok(_) if p < position || !self.fold_ok => Some(format!(
                    "snapshot {} could not be compared: the log has no readable record at its position",
                    path.display()
                )),
                Ok(s) if s.state != self.state => Some(format!(
                    "snapshot {} differs from the full fold at its position",
                    path.display()
                )),
                Ok(s) if s.frontier != self.frontier => Some(format!(
                    "snapshot {}: its Merkle tree differs from the log's",
                    path.display()
                )),
                Ok(_) => None,
            };
            if let Some(message) = message {
                self.push(
                    ProblemKind::Snapshot,
                    VerifyProblem {
                        position: p,
                        message,
                    },
                );
            }
        }
    }
}

/// Checks one signed checkpoint against the tree of the records before it.
/// A copied signed checkpoint that does not hold for the records before
/// it: what [`check_checkpoint`] found.
#[derive(Debug, thiserror::Error)]
#[error("it does not hold: {0}")]
pub(crate) struct Unheld(pub(crate) String);

pub(crate) fn check_checkpoint(
    c: &LogCheckpointed,
    tree: &Frontier,
    pinned: Option<[u8; 32]>,
) -> Option<String> {
    if c.tree_size != tree.size() {
        return Some(format!(
            "signed checkpoint covers {} records; {} precede it",
            c.tree_size,
            tree.size()
        ));
    }
    let root = tree.root();
    if c.root != root {
        return Some(format!(
            "signed checkpoint root {} is not the root of the records before it ({})",
            hex::encode(c.root),
            hex::encode(root)
        ));
    }
    if let Some(key) = pinned {
        if key != c.public_key {
            return Some(format!(
                "signed checkpoint was made by key {}, not the given key {}",
                signing::fingerprint_raw(&c.public_key),
                signing::fingerprint_raw(&key)
            ));
        }
    }
    signing::verify_raw(
        &c.public_key,
        &LogCheckpointed::signed_bytes(c.tree_size, &c.root),
        &c.signature,
    )
    .err()
    .map(|e| format!("signed checkpoint: {e}"))
}

/// A signed tree head as audit files carry it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignedHead {
    /// The position of the checkpoint record in the log.
    pub checkpoint_position: u64,
    /// How many records the tree covers (positions 1 to `tree_size`).
    pub tree_size: u64,
    /// The tree's root, hex.
    pub root: String,
    /// The raw Ed25519 public key, hex (32 bytes).
    pub public_key: String,
    /// The Ed25519 signature over the signed bytes, hex (64 bytes).
    pub signature: String,
}

impl SignedHead {
    fn of(position: u64, c: &LogCheckpointed) -> SignedHead {
        SignedHead {
            checkpoint_position: position,
            tree_size: c.tree_size,
            root: hex::encode(c.root),
            public_key: hex::encode(c.public_key),
            signature: hex::encode(&c.signature),
        }
    }
}

/// One event of a bundle: the bytes its hash covers and its inclusion proof.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BundleEvent {
    /// Its position in the log (leaf `position - 1`).
    pub position: u64,
    /// The encoded envelope header, hex.
    pub header: String,
    /// The event kind.
    pub kind: String,
    /// The payload as stored, hex.
    pub payload: String,
    /// The record hash, hex.
    pub hash: String,
    /// The audit path, bottom up, hex.
    pub proof: Vec<String>,
}

/// An audit bundle: one batch's and its jobs' events, provable on their own.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Bundle {
    /// [`BUNDLE_FORMAT`].
    pub format: String,
    /// The batch.
    pub batch: String,
    /// The signed tree head the proofs lead to.
    pub head: SignedHead,
    /// The events, by position.
    pub events: Vec<BundleEvent>,
}

/// A consistency proof between two signed heads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConsistencyFile {
    /// [`CONSISTENCY_FORMAT`].
    pub format: String,
    /// The older head.
    pub from: SignedHead,
    /// The newer head.
    pub to: SignedHead,
    /// The RFC 9162 consistency proof, hex.
    pub proof: Vec<String>,
}

/// Why evidence could not be produced.
///
/// ### Handling
/// A usage problem (an unknown batch, no signed checkpoint covering it, a
/// position that is not a checkpoint) or a log that cannot be read; the
/// message says which.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExportError {
    /// The log failed.
    #[error(transparent)]
    Log(#[from] LogError),
    /// The request cannot be met.
    #[error("{0}")]
    Refused(String),
}

/// The newest signed checkpoint, with its position.
///
/// # Errors
/// [`ExportError::Log`].
pub fn latest_checkpoint(log: &Log) -> Result<Option<(u64, LogCheckpointed)>, ExportError> {
    let records = log.read_stream(StreamId::System)?;
    Ok(records.into_iter().rev().find_map(|r| match r.event {
        Event::LogCheckpointed(c) => Some((r.envelope.position, c)),
        _ => None,
    }))
}

fn checkpoint_at(log: &Log, position: u64) -> Result<LogCheckpointed, ExportError> {
    match log.read_one(position)?.event {
        Event::LogCheckpointed(c) => Ok(c),
        other => Err(ExportError::Refused(format!(
            "position {position} is a {} record, not a signed checkpoint",
            other.kind()
        ))),
    }
}

/// The Merkle tree over the first `size` records of the log.
fn tree_of(log: &Log, size: u64) -> Result<Tree, ExportError> {
    let mut tree = Tree::new();
    for r in log.read_range(1, size) {
        tree.push(&r?.envelope.hash);
    }
    if tree.size() != size {
        return Err(ExportError::Refused(format!(
            "the log has {} records, fewer than the {size} the head covers",
            tree.size()
        )));
    }
    Ok(tree)
}

/// Builds the audit bundle of a batch: its events and its jobs', with
/// inclusion proofs against the newest signed checkpoint.
///
/// # Errors
/// [`ExportError::Refused`] when the batch is unknown or no signed
/// checkpoint covers its last event; [`ExportError::Log`].
pub fn export_batch(log: &Log, state: &State, bid: Bid) -> Result<Bundle, ExportError> {
    let batch = state
        .batches
        .get(&bid)
        .ok_or_else(|| ExportError::Refused(format!("batch {bid} does not exist")))?;
    export_batch_jobs(log, bid, &batch.jobs)
}

/// [`export_batch`] of batch `bid` whose jobs are `jobs` (read from the
/// state beforehand, so a server does not hold its state while it reads
/// the log).
///
/// # Errors
/// As [`export_batch`].
pub fn export_batch_jobs(log: &Log, bid: Bid, jobs: &[Jid]) -> Result<Bundle, ExportError> {
    let mut records = log.read_stream(StreamId::Batch(bid))?;
    for jid in jobs {
        records.extend(log.read_stream(StreamId::Job(*jid))?);
    }
    records.sort_by_key(|r| r.envelope.position);
    let last = records.last().map_or(0, |r| r.envelope.position);
    let Some((checkpoint_position, head)) = latest_checkpoint(log)? else {
        return Err(ExportError::Refused(
            "the log has no signed checkpoint yet: configure a checkpoint key (--checkpoint-key)"
                .into(),
        ));
    };
    if head.tree_size < last {
        return Err(ExportError::Refused(format!(
            "the newest signed checkpoint (position {checkpoint_position}) covers records up to {}; batch {bid} has events up to {last}: give --checkpoint-key to sign a new one",
            head.tree_size
        )));
    }
    let tree = tree_of(log, head.tree_size)?;
    let mut events = Vec::with_capacity(records.len());
    for r in &records {
        let position = r.envelope.position;
        let parts = RecordParts::of(&log.read_raw(position)?).map_err(|e| LogError::Corrupt {
            position,
            reason: e.to_string(),
        })?;
        let proof = tree
            .inclusion_proof(position - 1, head.tree_size)
            .map_err(|e| ExportError::Refused(e.to_string()))?;
        events.push(BundleEvent {
            position,
            header: hex::encode(&parts.header),
            kind: parts.kind,
            payload: hex::encode(&parts.payload),
            hash: hex::encode(parts.hash),
            proof: proof.iter().map(hex::encode).collect(),
        });
    }
    Ok(Bundle {
        format: BUNDLE_FORMAT.into(),
        batch: bid.to_string(),
        head: SignedHead::of(checkpoint_position, &head),
        events,
    })
}

/// Builds the consistency proof between the signed checkpoints at positions
/// `from` and `to`.
///
/// # Errors
/// [`ExportError::Refused`] when a position is not a signed checkpoint or
/// `from` comes after `to`; [`ExportError::Log`].
pub fn prove(log: &Log, from: u64, to: u64) -> Result<ConsistencyFile, ExportError> {
    if from > to {
        return Err(ExportError::Refused(format!(
            "--from {from} comes after --to {to}"
        )));
    }
    let old = checkpoint_at(log, from)?;
    let new = checkpoint_at(log, to)?;
    let tree = tree_of(log, new.tree_size)?;
    let proof = tree
        .consistency_proof(old.tree_size, new.tree_size)
        .map_err(|e| ExportError::Refused(e.to_string()))?;
    Ok(ConsistencyFile {
        format: CONSISTENCY_FORMAT.into(),
        from: SignedHead::of(from, &old),
        to: SignedHead::of(to, &new),
        proof: proof.iter().map(hex::encode).collect(),
    })
}

/// What failed in an audit file. Each names the part: the file's form, an
/// event (its bytes), a proof (its nodes), the signature, the head, the key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Failure {
    /// The file is not an audit file of a known format.
    #[error("format: {0}")]
    Format(String),
    /// An event's bytes do not hash to its hash, or do not decode.
    #[error("event at position {position}: {reason}")]
    Event {
        /// The position the bundle gives.
        position: u64,
        /// What does not hold.
        reason: String,
    },
    /// A proof does not lead to the signed root.
    #[error("proof of {what}: {reason}")]
    Proof {
        /// Which proof (`the event at position N`, `consistency`).
        what: String,
        /// What does not hold.
        reason: String,
    },
    /// The signature does not verify over an intact head.
    #[error("signature of the {which} head: {reason}")]
    Signature {
        /// `signed`, `from` or `to`.
        which: &'static str,
        /// What does not hold.
        reason: String,
    },
    /// The signed head itself was changed: its signature fails and the
    /// proofs do not reach its root.
    #[error("head ({which}): {reason}")]
    Head {
        /// `signed`, `from` or `to`.
        which: &'static str,
        /// What does not hold.
        reason: String,
    },
    /// The head was signed by another key than the one given.
    #[error("public key of the {which} head: {reason}")]
    Key {
        /// `signed`, `from` or `to`.
        which: &'static str,
        /// What does not hold.
        reason: String,
    },
}

/// What a verified audit file holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verified {
    /// A bundle: its batch, head and decoded events.
    Bundle {
        /// The batch.
        batch: String,
        /// The signed head.
        head: SignedHead,
        /// The events, decoded.
        events: Vec<Recorded>,
        /// The signer's fingerprint.
        fingerprint: String,
    },
    /// A consistency proof between two heads.
    Consistency {
        /// The older head.
        from: SignedHead,
        /// The newer head.
        to: SignedHead,
        /// The signer's fingerprint.
        fingerprint: String,
    },
}

/// A hex field of an audit file that does not decode.
#[derive(Debug, thiserror::Error)]
enum Undecoded {
    /// Not hex.
    #[error("{what} is not hex: {source}")]
    NotHex {
        what: String,
        source: hex::FromHexError,
    },
    /// Not a 32-byte node or key.
    #[error("{what} is {len} bytes, expected 32")]
    NotANode { what: String, len: usize },
    /// A proof longer than any tree's.
    #[error("{0} nodes, more than any tree has")]
    TooManyNodes(usize),
    /// A proof's nodes that do not prove it.
    #[error(transparent)]
    Proof(#[from] merkle::ProofFailure),
}

fn bytes_of(hex_text: &str, what: &str) -> Result<Vec<u8>, Undecoded> {
    hex::decode(hex_text).map_err(|source| Undecoded::NotHex {
        what: what.to_string(),
        source,
    })
}

fn node_of(hex_text: &str, what: &str) -> Result<Node, Undecoded> {
    let bytes = bytes_of(hex_text, what)?;
    <[u8; 32]>::try_from(bytes.as_slice()).map_err(|_| Undecoded::NotANode {
        what: what.to_string(),
        len: bytes.len(),
    })
}

/// A proof's nodes, bounded and decoded.
fn nodes_of(proof: &[String]) -> Result<Vec<Node>, Undecoded> {
    if proof.len() > MAX_PROOF_NODES {
        return Err(Undecoded::TooManyNodes(proof.len()));
    }
    proof
        .iter()
        .enumerate()
        .map(|(i, n)| node_of(n, &format!("node {i}")))
        .collect()
}

/// A head's parts, decoded; `Err` is a `Format` failure.
struct Head {
    tree_size: u64,
    root: Node,
    key: [u8; 32],
    signature: Vec<u8>,
}

fn decode_head(h: &SignedHead) -> Result<Head, Undecoded> {
    Ok(Head {
        tree_size: h.tree_size,
        root: node_of(&h.root, "the head's root")?,
        key: node_of(&h.public_key, "the head's public key")?,
        signature: bytes_of(&h.signature, "the head's signature")?,
    })
}

/// Checks a head's key and signature; `Ok(false)` when the signature fails.
fn signature_holds(
    head: &Head,
    which: &'static str,
    pinned: Option<[u8; 32]>,
) -> Result<bool, Failure> {
    if let Some(key) = pinned {
        if key != head.key {
            return Err(Failure::Key {
                which,
                reason: format!(
                    "signed by {}, not by the given key {}",
                    signing::fingerprint_raw(&head.key),
                    signing::fingerprint_raw(&key)
                ),
            });
        }
    }
    Ok(signing::verify_raw(
        &head.key,
        &LogCheckpointed::signed_bytes(head.tree_size, &head.root),
        &head.signature,
    )
    .is_ok())
}

/// Checks an audit file (a bundle or a consistency proof) on its own, with
/// no data directory; `pinned` is the raw public key the heads must be
/// signed with.
///
/// # Errors
/// Every [`Failure`] found (at least one).
pub fn verify_file(text: &[u8], pinned: Option<[u8; 32]>) -> Result<Verified, Vec<Failure>> {
    let value: serde_json::Value = serde_json::from_slice(text).map_err(|e| {
        vec![Failure::Format(format!(
            "not JSON: {}",
            ingest_protocol::cut(&e.to_string(), 200)
        ))]
    })?;
    let format = value.get("format").and_then(|f| f.as_str()).unwrap_or("");
    match format {
        BUNDLE_FORMAT => {
            let bundle: Bundle = serde_json::from_value(value).map_err(|e| {
                vec![Failure::Format(
                    ingest_protocol::cut(&e.to_string(), 200).to_string(),
                )]
            })?;
            verify_bundle(&bundle, pinned)
        }
        CONSISTENCY_FORMAT => {
            let file: ConsistencyFile = serde_json::from_value(value).map_err(|e| {
                vec![Failure::Format(
                    ingest_protocol::cut(&e.to_string(), 200).to_string(),
                )]
            })?;
            verify_consistency_file(&file, pinned)
        }
        other => Err(vec![Failure::Format(format!(
            "unknown format {:?}; expected {BUNDLE_FORMAT} or {CONSISTENCY_FORMAT}",
            ingest_protocol::cut(other, 60)
        ))]),
    }
}

fn verify_bundle(bundle: &Bundle, pinned: Option<[u8; 32]>) -> Result<Verified, Vec<Failure>> {
    let head = decode_head(&bundle.head).map_err(|e| vec![Failure::Format(e.to_string())])?;
    let signed = signature_holds(&head, "signed", pinned).map_err(|e| vec![e])?;
    let mut failures = Vec::new();
    let mut events = Vec::with_capacity(bundle.events.len());
    let mut proofs_failed = 0usize;
    let mut previous = 0u64;
    for e in &bundle.events {
        let position = e.position;
        let event_failure = |reason: String| Failure::Event { position, reason };
        if position <= previous {
            failures.push(event_failure(format!(
                "positions must rise; it follows {previous}"
            )));
            continue;
        }
        previous = position;
        let parts = (|| {
            Ok::<_, Undecoded>(RecordParts {
                header: bytes_of(&e.header, "the header")?,
                kind: e.kind.clone(),
                payload: bytes_of(&e.payload, "the payload")?,
                hash: node_of(&e.hash, "the hash")?,
            })
        })();
        let parts = match parts {
            Ok(p) => p,
            Err(reason) => {
                failures.push(event_failure(reason.to_string()));
                continue;
            }
        };
        let computed = parts.computed_hash();
        if computed != parts.hash {
            failures.push(event_failure(format!(
                "its bytes hash to {}, the bundle says {}",
                hex::encode(computed),
                e.hash
            )));
            continue;
        }
        match parts.decode() {
            Ok(r) if r.envelope.position == position => events.push(r),
            Ok(r) => {
                failures.push(event_failure(format!(
                    "its header says position {}",
                    r.envelope.position
                )));
                continue;
            }
            Err(err) => {
                failures.push(event_failure(format!("does not decode: {err}")));
                continue;
            }
        }
        let checked = nodes_of(&e.proof).and_then(|proof| {
            merkle::verify_inclusion(
                &merkle::leaf_hash(&parts.hash),
                position - 1,
                head.tree_size,
                &proof,
                &head.root,
            )
            .map_err(Undecoded::from)
        });
        if let Err(reason) = checked {
            proofs_failed += 1;
            failures.push(Failure::Proof {
                what: format!("the event at position {position}"),
                reason: reason.to_string(),
            });
        }
    }
    if !signed {
        // A changed head breaks its signature and (nearly always) every
        // proof; a changed signature or key breaks the signature alone.
        let all_proofs_failed = proofs_failed > 0 && proofs_failed == bundle.events.len();
        if all_proofs_failed {
            failures.retain(|f| !matches!(f, Failure::Proof { .. }));
            failures.insert(
                0,
                Failure::Head {
                    which: "signed",
                    reason: "the signature does not cover this tree size and root, and no proof reaches the root: the head was changed".into(),
                },
            );
        } else {
            failures.insert(
                0,
                Failure::Signature {
                    which: "signed",
                    reason: format!(
                        "does not verify with key {} over tree size {} and root {}",
                        signing::fingerprint_raw(&head.key),
                        head.tree_size,
                        bundle.head.root
                    ),
                },
            );
        }
    }
    if bundle.events.is_empty() {
        failures.push(Failure::Format("the bundle has no events".into()));
    }
    if failures.is_empty() {
        Ok(Verified::Bundle {
            batch: bundle.batch.clone(),
            head: bundle.head.clone(),
            events,
            fingerprint: signing::fingerprint_raw(&head.key),
        })
    } else {
        Err(failures)
    }
}

fn verify_consistency_file(
    file: &ConsistencyFile,
    pinned: Option<[u8; 32]>,
) -> Result<Verified, Vec<Failure>> {
    let from = decode_head(&file.from).map_err(|e| vec![Failure::Format(e.to_string())])?;
    let to = decode_head(&file.to).map_err(|e| vec![Failure::Format(e.to_string())])?;
    let mut failures = Vec::new();
    for (head, which) in [(&from, "from"), (&to, "to")] {
        match signature_holds(head, which, pinned) {
            Ok(true) => {}
            Ok(false) => failures.push(Failure::Signature {
                which,
                reason: format!(
                    "does not verify with key {} over tree size {}",
                    signing::fingerprint_raw(&head.key),
                    head.tree_size
                ),
            }),
            Err(f) => failures.push(f),
        }
    }
    if from.key != to.key {
        failures.push(Failure::Key {
            which: "to",
            reason: "the two heads were signed by different keys".into(),
        });
    }
    let checked = nodes_of(&file.proof).and_then(|proof| {
        merkle::verify_consistency(from.tree_size, to.tree_size, &from.root, &to.root, &proof)
            .map_err(Undecoded::from)
    });
    if let Err(reason) = checked {
        failures.push(Failure::Proof {
            what: "consistency".into(),
            reason: reason.to_string(),
        });
    }
    if failures.is_empty() {
        Ok(Verified::Consistency {
            from: file.from.clone(),
            to: file.to.clone(),
            fingerprint: signing::fingerprint_raw(&to.key),
        })
    } else {
        Err(failures)
    }
}

/// Kinds of events in a bundle, counted (for a one-line summary).
pub fn kinds(events: &[Recorded]) -> BTreeMap<&'static str, usize> {
    let mut out = BTreeMap::new();
    for r in events {
        *out.entry(r.event.kind()).or_insert(0) += 1;
    }
    out
}
