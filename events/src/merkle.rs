//! A Merkle tree over the log, hashed as RFC 9162 (Certificate Transparency
//! version 2.0) hashes its trees, with SHA-256.
//!
//! The leaf of the record at position `p` is its index `p - 1`, and the leaf
//! input is the record's own 32-byte hash ([`crate::codec::Envelope::hash`],
//! BLAKE3 over the record's content): `leaf = SHA-256(0x00 ‖ record hash)`,
//! `node = SHA-256(0x01 ‖ left ‖ right)`, and the tree over `n` leaves splits
//! at the largest power of two below `n` (RFC 9162 §2.1.1). SHA-256 rather
//! than BLAKE3 because it is what RFC 9162 specifies and what any verifier
//! has: a head, an inclusion proof or a consistency proof can be checked with
//! nothing but a standard library.
//!
//! - [`Frontier`]: the tree grown one leaf at a time in O(log n) memory, for
//!   the engine, which signs its root at each checkpoint;
//! - [`Tree`]: every leaf of a prefix of the log, to compute roots of
//!   smaller trees, inclusion proofs (§2.1.3) and consistency proofs
//!   (§2.1.4);
//! - [`verify_inclusion`], [`verify_consistency`]: the checks a verifier runs.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// A SHA-256 value: a leaf, a node or a root.
pub type Node = [u8; 32];

/// The leaf hash of a record whose own hash is `record_hash`.
pub fn leaf_hash(record_hash: &[u8; 32]) -> Node {
    let mut h = Sha256::new();
    h.update([0u8]);
    h.update(record_hash);
    h.finalize().into()
}

/// The hash of an inner node.
pub fn node_hash(left: &Node, right: &Node) -> Node {
    let mut h = Sha256::new();
    h.update([1u8]);
    h.update(left);
    h.update(right);
    h.finalize().into()
}

/// The root of the empty tree: SHA-256 of nothing.
pub fn empty_root() -> Node {
    Sha256::digest([]).into()
}

/// The largest power of two strictly below `n` (`n` ≥ 2).
fn split(n: u64) -> u64 {
    debug_assert!(n >= 2);
    1 << (63 - (n - 1).leading_zeros())
}

/// The tree grown leaf by leaf: the roots of its perfect subtrees, largest
/// (leftmost) first, one per bit set in the size.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Frontier {
    size: u64,
    /// Roots of the perfect subtrees, largest first.
    peaks: Vec<Node>,
}

impl Frontier {
    /// The empty tree.
    pub fn new() -> Frontier {
        Frontier::default()
    }

    /// How many leaves the tree has.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Adds the leaf of a record with hash `record_hash`.
    pub fn push(&mut self, record_hash: &[u8; 32]) {
        let mut node = leaf_hash(record_hash);
        // Each trailing one bit of the old size is a peak of the same height
        // as the new node: merge them.
        let mut size = self.size;
        while size & 1 == 1 {
            let left = self.peaks.pop().unwrap_or_default();
            node = node_hash(&left, &node);
            size >>= 1;
        }
        self.peaks.push(node);
        self.size += 1;
    }

    /// The tree head: RFC 9162's MTH over every leaf pushed.
    pub fn root(&self) -> Node {
        let mut peaks = self.peaks.iter().rev();
        match peaks.next() {
            None => empty_root(),
            Some(last) => peaks.fold(*last, |acc, left| node_hash(left, &acc)),
        }
    }
}

/// Every leaf of a tree, for roots of its prefixes and for proofs.
///
/// It keeps each level of the tree (about two hashes per leaf): a million
/// leaves take 64 MiB, and each root or proof then takes O(log² n) lookups.
#[derive(Debug, Clone, Default)]
pub struct Tree {
    /// `levels[0]` are the leaves; `levels[i + 1][j]` is the node over
    /// `levels[i][2j]` and `levels[i][2j + 1]` (only pairs that exist).
    levels: Vec<Vec<Node>>,
}

/// A proof was asked for that the tree cannot give.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ProofError(pub String);

impl Tree {
    /// The empty tree.
    pub fn new() -> Tree {
        Tree {
            levels: vec![Vec::new()],
        }
    }

    /// How many leaves it has.
    pub fn size(&self) -> u64 {
        self.levels.first().map_or(0, |l| l.len() as u64)
    }

    /// Adds the leaf of a record with hash `record_hash`.
    pub fn push(&mut self, record_hash: &[u8; 32]) {
        if self.levels.is_empty() {
            self.levels.push(Vec::new());
        }
        let mut node = leaf_hash(record_hash);
        let mut level = 0;
        loop {
            self.levels[level].push(node);
            let len = self.levels[level].len();
            if len % 2 == 1 {
                return;
            }
            node = node_hash(&self.levels[level][len - 2], &self.levels[level][len - 1]);
            level += 1;
            if self.levels.len() == level {
                self.levels.push(Vec::new());
            }
        }
    }

    /// MTH of the leaves `lo..hi` (a range the RFC's recursion visits).
    fn mth(&self, lo: u64, hi: u64) -> Node {
        let n = hi - lo;
        if n == 0 {
            return empty_root();
        }
        if n.is_power_of_two() && lo % n == 0 {
            let level = n.trailing_zeros() as usize;
            return self.levels[level][(lo / n) as usize];
        }
        let k = split(n);
        node_hash(&self.mth(lo, lo + k), &self.mth(lo + k, hi))
    }

    /// The root of the tree over the first `size` leaves.
    ///
    /// # Errors
    /// `size` is larger than the tree.
    pub fn root(&self, size: u64) -> Result<Node, ProofError> {
        self.check_size(size)?;
        Ok(self.mth(0, size))
    }

    fn check_size(&self, size: u64) -> Result<(), ProofError> {
        if size > self.size() {
            return Err(ProofError(format!(
                "a tree of {size} leaves was asked for; the log has {}",
                self.size()
            )));
        }
        Ok(())
    }

    /// The audit path of leaf `index` in the tree of the first `size`
    /// leaves (RFC 9162 §2.1.3.1), bottom up.
    ///
    /// # Errors
    /// `index` is not below `size` or `size` is larger than the tree.
    pub fn inclusion_proof(&self, index: u64, size: u64) -> Result<Vec<Node>, ProofError> {
        self.check_size(size)?;
        if index >= size {
            return Err(ProofError(format!(
                "leaf {index} is not in a tree of {size} leaves"
            )));
        }
        let mut path = Vec::new();
        self.path(index, 0, size, &mut path);
        Ok(path)
    }

    fn path(&self, m: u64, lo: u64, hi: u64, out: &mut Vec<Node>) {
        let n = hi - lo;
        if n <= 1 {
            return;
        }
        let k = split(n);
        if m < lo + k {
            self.path(m, lo, lo + k, out);
            out.push(self.mth(lo + k, hi));
        } else {
            self.path(m, lo + k, hi, out);
            out.push(self.mth(lo, lo + k));
        }
    }

    /// The consistency proof between the trees of the first `first` and the
    /// first `second` leaves (RFC 9162 §2.1.4.1).
    ///
    /// # Errors
    /// `first` is larger than `second` or `second` larger than the tree.
    pub fn consistency_proof(&self, first: u64, second: u64) -> Result<Vec<Node>, ProofError> {
        self.check_size(second)?;
        if first > second {
            return Err(ProofError(format!(
                "the old tree ({first} leaves) is larger than the new one ({second})"
            )));
        }
        let mut proof = Vec::new();
        if first > 0 && first < second {
            self.subproof(first, 0, second, true, &mut proof);
        }
        Ok(proof)
    }

    fn subproof(&self, m: u64, lo: u64, hi: u64, whole: bool, out: &mut Vec<Node>) {
        let n = hi - lo;
        if m == n {
            if !whole {
                out.push(self.mth(lo, hi));
            }
            return;
        }
        let k = split(n);
        if m <= k {
            self.subproof(m, lo, lo + k, whole, out);
            out.push(self.mth(lo + k, hi));
        } else {
            self.subproof(m - k, lo + k, hi, false, out);
            out.push(self.mth(lo, lo + k));
        }
    }
}

/// Why a proof does not verify.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProofFailure {
    /// The proof has the wrong number of nodes for the sizes given.
    #[error("the proof has the wrong length for these tree sizes")]
    Length,
    /// The index or sizes are impossible (a leaf past the end, a tree that shrank).
    #[error("{0}")]
    Sizes(String),
    /// The nodes lead to another root.
    #[error("the proof leads to root {computed}, not {expected}")]
    Root {
        /// What the proof computes, hex.
        computed: String,
        /// The root it should reach, hex.
        expected: String,
    },
    /// A consistency proof's nodes do not lead to the old root.
    #[error("the proof leads to old root {computed}, not {expected}")]
    OldRoot {
        /// What the proof computes, hex.
        computed: String,
        /// The old root, hex.
        expected: String,
    },
}

fn shift_while_odd(fnode: &mut u64, snode: &mut u64) {
    while *fnode & 1 == 1 {
        *fnode >>= 1;
        *snode >>= 1;
    }
}

/// Checks that `leaf` is leaf `index` of the tree of `size` leaves with
/// root `root` (RFC 9162 §2.1.3.2).
///
/// # Errors
/// [`ProofFailure`] naming what does not hold.
pub fn verify_inclusion(
    leaf: &Node,
    index: u64,
    size: u64,
    proof: &[Node],
    root: &Node,
) -> Result<(), ProofFailure> {
    if index >= size {
        return Err(ProofFailure::Sizes(format!(
            "leaf {index} is not in a tree of {size} leaves"
        )));
    }
    let (mut fnode, mut snode) = (index, size - 1);
    let mut r = *leaf;
    for p in proof {
        if snode == 0 {
            return Err(ProofFailure::Length);
        }
        if fnode & 1 == 1 || fnode == snode {
            r = node_hash(p, &r);
            while fnode & 1 == 0 && fnode != 0 {
                fnode >>= 1;
                snode >>= 1;
            }
        } else {
            r = node_hash(&r, p);
        }
        fnode >>= 1;
        snode >>= 1;
    }
    if snode != 0 {
        return Err(ProofFailure::Length);
    }
    if &r != root {
        return Err(ProofFailure::Root {
            computed: hex::encode(r),
            expected: hex::encode(root),
        });
    }
    Ok(())
}

/// Checks that the tree of `first` leaves with root `first_root` is a prefix
/// of the tree of `second` leaves with root `second_root` (RFC 9162 §2.1.4.2).
///
/// # Errors
/// [`ProofFailure`] naming what does not hold.
pub fn verify_consistency(
    first: u64,
    second: u64,
    first_root: &Node,
    second_root: &Node,
    proof: &[Node],
) -> Result<(), ProofFailure> {
    if first > second {
        return Err(ProofFailure::Sizes(format!(
            "the old tree ({first} leaves) is larger than the new one ({second})"
        )));
    }
    if first == second {
        if !proof.is_empty() {
            return Err(ProofFailure::Length);
        }
        if first_root != second_root {
            return Err(ProofFailure::Root {
                computed: hex::encode(first_root),
                expected: hex::encode(second_root),
            });
        }
        return Ok(());
    }
    if first == 0 {
        // Every tree extends the empty one.
        return if proof.is_empty() {
            Ok(())
        } else {
            Err(ProofFailure::Length)
        };
    }
    if proof.is_empty() {
        return Err(ProofFailure::Length);
    }
    let mut path: Vec<Node> = Vec::with_capacity(proof.len() + 1);
    if first.is_power_of_two() {
        path.push(*first_root);
    }
    path.extend_from_slice(proof);
    let (mut fnode, mut snode) = (first - 1, second - 1);
    shift_while_odd(&mut fnode, &mut snode);
    let (mut fr, mut sr) = (path[0], path[0]);
    for c in &path[1..] {
        if snode == 0 {
            return Err(ProofFailure::Length);
        }
        if fnode & 1 == 1 || fnode == snode {
            fr = node_hash(c, &fr);
            sr = node_hash(c, &sr);
            while fnode & 1 == 0 && fnode != 0 {
                fnode >>= 1;
                snode >>= 1;
            }
        } else {
            sr = node_hash(&sr, c);
        }
        fnode >>= 1;
        snode >>= 1;
    }
    if snode != 0 {
        return Err(ProofFailure::Length);
    }
    if &fr != first_root {
        return Err(ProofFailure::OldRoot {
            computed: hex::encode(fr),
            expected: hex::encode(first_root),
        });
    }
    if &sr != second_root {
        return Err(ProofFailure::Root {
            computed: hex::encode(sr),
            expected: hex::encode(second_root),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(i: u64) -> [u8; 32] {
        *blake3::hash(&i.to_le_bytes()).as_bytes()
    }

    /// RFC 9162's MTH, straight from its definition.
    fn mth(leaves: &[[u8; 32]]) -> Node {
        match leaves.len() {
            0 => empty_root(),
            1 => leaf_hash(&leaves[0]),
            n => {
                let k = split(n as u64) as usize;
                node_hash(&mth(&leaves[..k]), &mth(&leaves[k..]))
            }
        }
    }

    #[test]
    fn the_empty_root_is_sha256_of_nothing() {
        assert_eq!(
            hex::encode(empty_root()),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    #[test]
    fn frontier_and_tree_give_the_rfc_root_at_every_size() {
        let leaves: Vec<[u8; 32]> = (0..70).map(record).collect();
        let mut frontier = Frontier::new();
        let mut tree = Tree::new();
        assert_eq!(frontier.root(), empty_root());
        for (i, l) in leaves.iter().enumerate() {
            frontier.push(l);
            tree.push(l);
            let want = mth(&leaves[..=i]);
            assert_eq!(frontier.root(), want, "frontier at size {}", i + 1);
            assert_eq!(tree.root(i as u64 + 1), Ok(want), "tree at size {}", i + 1);
        }
        for size in 0..=70 {
            assert_eq!(tree.root(size), Ok(mth(&leaves[..size as usize])));
        }
    }

    #[test]
    fn every_inclusion_proof_verifies_and_a_changed_node_does_not() {
        let leaves: Vec<[u8; 32]> = (0..37).map(record).collect();
        let mut tree = Tree::new();
        leaves.iter().for_each(|l| tree.push(l));
        for size in 1..=37u64 {
            let root = tree.root(size).expect("root");
            for index in 0..size {
                let proof = tree.inclusion_proof(index, size).expect("proof");
                let leaf = leaf_hash(&leaves[index as usize]);
                assert_eq!(verify_inclusion(&leaf, index, size, &proof, &root), Ok(()));
                if let Some(first) = proof.first() {
                    let mut bad = proof.clone();
                    bad[0] = node_hash(first, first);
                    assert!(verify_inclusion(&leaf, index, size, &bad, &root).is_err());
                    assert!(
                        verify_inclusion(&leaf, index, size, &proof[1..], &root).is_err(),
                        "a short proof must fail"
                    );
                }
                let other = leaf_hash(&record(1000));
                assert!(verify_inclusion(&other, index, size, &proof, &root).is_err());
            }
        }
    }

    #[test]
    fn every_consistency_proof_verifies_and_a_rewritten_log_does_not() {
        let leaves: Vec<[u8; 32]> = (0..33).map(record).collect();
        let mut tree = Tree::new();
        leaves.iter().for_each(|l| tree.push(l));
        // The same log with one early record rewritten.
        let mut forged = Tree::new();
        for (i, l) in leaves.iter().enumerate() {
            forged.push(if i == 2 { &[7u8; 32] } else { l });
        }
        for second in 0..=33u64 {
            for first in 0..=second {
                let proof = tree.consistency_proof(first, second).expect("proof");
                let (a, b) = (tree.root(first).expect("a"), tree.root(second).expect("b"));
                assert_eq!(
                    verify_consistency(first, second, &a, &b, &proof),
                    Ok(()),
                    "{first} -> {second}"
                );
                if first > 2 && first < second {
                    let proof = forged.consistency_proof(first, second).expect("forged");
                    let b = forged.root(second).expect("forged root");
                    assert!(
                        verify_consistency(first, second, &a, &b, &proof).is_err(),
                        "a rewritten record under the old head must fail {first} -> {second}"
                    );
                }
            }
        }
    }
}
