//! The tail's nodes: names, and the packing of a group's frames into them.
//!
//! A node's data is a chunk of the stream of frames the leader committed
//! ([`ingest_events::frame`]). Its name says everything a reader needs
//! before reading it: its sequence number, the position of the last record
//! that ends in it, whether it ends at a command boundary (`c`) or inside a
//! command (`p`), and its length in bytes. A follower applies only up to a
//! `c` node, so a command is applied whole or not at all, even when its
//! records span several nodes.
//!
//! A node whose name ends in `-z` holds its chunk zstd-compressed (the
//! length in its name is the stored one). The leader compresses every chunk
//! that shrinks: every ZooKeeper server holds each tail byte and copies it
//! several times (request, proposal, transaction log, data tree), and every
//! follower reads it; a group of alike records keeps about a third of its
//! bytes (docs/replication.md). A follower decompresses at most
//! [`NODE_BYTES`] from a node, so a node written by anyone else cannot make
//! it allocate more.

use std::fmt;

use ingest_events::frame;

/// The most bytes one node carries (ZooKeeper's default `jute.maxbuffer` is
/// 1 MiB for a whole request).
pub const NODE_BYTES: usize = 768 * 1024;

/// The most node bytes one `multi` carries.
pub const MULTI_BYTES: usize = 900 * 1024;

/// A tail node's name, parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct NodeName {
    /// The node's sequence number (1, 2, …; never reused).
    pub seq: u64,
    /// The position of the last record ending in this node (for a `p` node
    /// that ends no record, the position before it).
    pub pos: u64,
    /// Whether the node ends at a command boundary.
    pub complete: bool,
    /// The stored data's length.
    pub len: usize,
    /// Whether the data is zstd-compressed (`-z`).
    pub compressed: bool,
}

impl fmt::Display for NodeName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "t{:020}-{:020}-{}-{}{}",
            self.seq,
            self.pos,
            if self.complete { 'c' } else { 'p' },
            self.len,
            if self.compressed { "-z" } else { "" }
        )
    }
}

impl NodeName {
    /// Parses a child name of the tail; `None` for anything else (a node
    /// someone else put there is ignored, never read).
    pub fn parse(name: &str) -> Option<NodeName> {
        let rest = name.strip_prefix('t')?;
        let mut parts = rest.splitn(5, '-');
        let seq = parts.next()?;
        let pos = parts.next()?;
        let kind = parts.next()?;
        let len = parts.next()?;
        let compressed = match parts.next() {
            None => false,
            Some("z") => true,
            Some(_) => return None,
        };
        if seq.len() != 20 || pos.len() != 20 || len.is_empty() || len.len() > 8 {
            return None;
        }
        let complete = match kind {
            "c" => true,
            "p" => false,
            _ => return None,
        };
        let len: usize = len.parse().ok()?;
        if len > NODE_BYTES {
            return None;
        }
        Some(NodeName {
            seq: seq.parse().ok()?,
            pos: pos.parse().ok()?,
            complete,
            len,
            compressed,
        })
    }
}

/// One node to create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    /// Its name.
    pub name: NodeName,
    /// Its data.
    pub data: Vec<u8>,
}

/// The zstd level of compressed nodes (the fastest: the leader compresses
/// on its write path, and records of one group are alike enough that
/// higher levels gain little).
const ZSTD_LEVEL: i32 = 1;

/// Why a node's data cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum NodeDataError {
    /// The stored length differs from the name's.
    #[error("tail node {seq} holds {held} bytes, its name says {named}")]
    Length {
        /// The node's sequence number.
        seq: u64,
        /// What it holds.
        held: usize,
        /// What its name says.
        named: usize,
    },
    /// The data does not decompress within [`NODE_BYTES`].
    #[error("tail node {seq} does not decompress to at most {NODE_BYTES} bytes: {source}")]
    Decompress {
        /// The node's sequence number.
        seq: u64,
        /// zstd's error.
        source: std::io::Error,
    },
}

impl Chunk {
    /// The chunk as it is stored: zstd-compressed when that makes it
    /// smaller (named `-z`), else as it is.
    #[must_use]
    pub fn compressed(self) -> Chunk {
        match zstd::block::compress(&self.data, ZSTD_LEVEL) {
            Ok(z) if z.len() < self.data.len() => Chunk {
                name: NodeName {
                    len: z.len(),
                    compressed: true,
                    ..self.name
                },
                data: z,
            },
            _ => self,
        }
    }
}

/// The frames a node read back holds: its data checked against its name's
/// length and decompressed (at most [`NODE_BYTES`]) when its name says so.
///
/// # Errors
/// [`NodeDataError`] when the data is not what the name describes.
pub fn payload(name: &NodeName, data: Vec<u8>) -> Result<Vec<u8>, NodeDataError> {
    if data.len() != name.len {
        return Err(NodeDataError::Length {
            seq: name.seq,
            held: data.len(),
            named: name.len,
        });
    }
    if !name.compressed {
        return Ok(data);
    }
    zstd::block::decompress(&data, NODE_BYTES).map_err(|source| NodeDataError::Decompress {
        seq: name.seq,
        source,
    })
}

/// Packs the frames of a group (one per command, in order) into nodes
/// numbered from `next_seq`, whose first record is at `head + 1`. Whole
/// frames share a node while they fit; a frame larger than a node is cut
/// over several, all but the last marked incomplete.
///
/// # Errors
/// A frame that does not split into records (the engine wrote it, so this
/// is a fault of the caller).
pub fn pack(frames: &[Vec<u8>], next_seq: u64, head: u64) -> Result<Vec<Chunk>, frame::FrameError> {
    let mut out = Vec::new();
    let mut seq = next_seq;
    let mut pos = head;
    let mut current: Vec<u8> = Vec::new();
    let mut flush = |current: &mut Vec<u8>, pos: u64, complete: bool, out: &mut Vec<Chunk>| {
        if current.is_empty() {
            return;
        }
        let data = std::mem::take(current);
        out.push(Chunk {
            name: NodeName {
                seq,
                pos,
                complete,
                len: data.len(),
                compressed: false,
            },
            data,
        });
        seq += 1;
    };
    for f in frames {
        let records = frame::split(f)?.len() as u64;
        if current.len() + f.len() > NODE_BYTES {
            flush(&mut current, pos, true, &mut out);
        }
        if f.len() <= NODE_BYTES {
            current.extend_from_slice(f);
            pos += records;
            continue;
        }
        // A command larger than a node: cut it; only its last piece ends it.
        let pieces: Vec<&[u8]> = f.chunks(NODE_BYTES).collect();
        let last = pieces.len() - 1;
        for (i, piece) in pieces.into_iter().enumerate() {
            current.extend_from_slice(piece);
            if i == last {
                pos += records;
                flush(&mut current, pos, true, &mut out);
            } else {
                flush(&mut current, pos, false, &mut out);
            }
        }
    }
    flush(&mut current, pos, true, &mut out);
    Ok(out)
}

/// Splits chunks into the runs one `multi` each carries (at most
/// [`MULTI_BYTES`] of data, at least one chunk).
pub fn multis(chunks: &[Chunk]) -> Vec<&[Chunk]> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut bytes = 0;
    for (i, c) in chunks.iter().enumerate() {
        if i > start && bytes + c.data.len() > MULTI_BYTES {
            out.push(&chunks[start..i]);
            start = i;
            bytes = 0;
        }
        bytes += c.data.len();
    }
    if start < chunks.len() {
        out.push(&chunks[start..]);
    }
    out
}

/// The tail's nodes in order, from a listing (foreign names left out).
pub fn sorted(children: &[String]) -> Vec<NodeName> {
    let mut nodes: Vec<NodeName> = children.iter().filter_map(|c| NodeName::parse(c)).collect();
    nodes.sort();
    nodes
}

/// The prefix of the tail (`nodes`, sorted by sequence) the leader may
/// delete in one transaction: nodes every remaining replica applied
/// (`pos <= applied`), at most `max` of them, ending at a complete node.
/// Returns the nodes and the last of them (the new base), or `None` when
/// there is nothing to trim. A backlog longer than `max` is trimmed `max`
/// at a time, never skipped.
pub fn trim_prefix(
    nodes: &[NodeName],
    applied: u64,
    max: usize,
) -> Option<(Vec<NodeName>, NodeName)> {
    let upto: Vec<NodeName> = nodes
        .iter()
        .copied()
        .take_while(|n| n.pos <= applied)
        .take(max)
        .collect();
    let end = upto.iter().rposition(|n| n.complete)?;
    let cut = upto[end];
    let mut doomed = upto;
    doomed.truncate(end + 1);
    Some((doomed, cut))
}

/// A node name for unit tests (one byte of data).
#[cfg(test)]
pub(crate) fn node(seq: u64, pos: u64, complete: bool) -> NodeName {
    NodeName {
        seq,
        pos,
        complete,
        len: 1,
        compressed: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A backlog of more than one transaction's worth is trimmed a
    /// transaction at a time (before, nothing was trimmed once the backlog
    /// passed 1,000 nodes, the tail grew without end and every follower was
    /// dropped); a prefix never ends inside a command, nor past what the
    /// replicas applied.
    #[test]
    fn the_tail_is_trimmed_in_prefixes_that_end_at_a_command() {
        let nodes: Vec<NodeName> = (1..=2500).map(|i| node(i, i, true)).collect();
        let (doomed, cut) = trim_prefix(&nodes, 2400, 1000).expect("a prefix");
        assert_eq!(doomed.len(), 1000);
        assert_eq!(cut.seq, 1000);
        let (doomed, cut) = trim_prefix(&nodes[1000..], 2400, 1000).expect("the next");
        assert_eq!((doomed.len(), cut.seq), (1000, 2000));
        let (doomed, cut) = trim_prefix(&nodes[2000..], 2400, 1000).expect("the rest");
        assert_eq!((doomed.len(), cut.seq), (400, 2400));
        assert!(trim_prefix(&nodes[2400..], 2400, 1000).is_none());

        // A command cut over nodes 2-4: the prefix stops before it.
        let split = [
            node(1, 1, true),
            node(2, 1, false),
            node(3, 1, false),
            node(4, 2, true),
        ];
        let (doomed, cut) = trim_prefix(&split, 2, 3).expect("a prefix");
        assert_eq!((doomed.len(), cut.seq), (1, 1));
        let (doomed, cut) = trim_prefix(&split, 2, 10).expect("all");
        assert_eq!((doomed.len(), cut.seq), (4, 4));
        assert!(
            trim_prefix(&split[1..], 1, 10).is_none(),
            "only a partial command applied"
        );
    }

    fn frame_of(sizes: &[usize]) -> Vec<u8> {
        let mut f = Vec::new();
        for s in sizes {
            frame::push(&mut f, &vec![7u8; *s]);
        }
        f
    }

    #[test]
    fn names_round_trip_and_sort_by_sequence() {
        let n = NodeName {
            seq: 12,
            pos: 3456,
            complete: true,
            len: 99,
            compressed: false,
        };
        let s = n.to_string();
        assert_eq!(s, "t00000000000000000012-00000000000000003456-c-99");
        assert_eq!(NodeName::parse(&s), Some(n));
        let z = NodeName {
            compressed: true,
            ..n
        };
        assert_eq!(z.to_string(), format!("{s}-z"));
        assert_eq!(NodeName::parse(&z.to_string()), Some(z));
        for bad in [
            "x",
            "t1-2-c-3",
            "t00000000000000000012-00000000000000003456-x-9",
            "t00000000000000000012-00000000000000003456-c-",
            "t00000000000000000012-00000000000000003456-c-9-y",
            "t00000000000000000012-00000000000000003456-c-9-z-z",
            "c-1",
        ] {
            assert_eq!(NodeName::parse(bad), None, "{bad}");
        }
        let big = format!("t{:020}-{:020}-c-{}", 1, 1, NODE_BYTES + 1);
        assert_eq!(NodeName::parse(&big), None);
    }

    /// A chunk that shrinks is stored compressed and named `-z`; the
    /// follower gets the same frames back. One that does not shrink is
    /// stored as it is.
    #[test]
    fn a_chunk_is_stored_compressed_when_that_is_smaller_and_read_back_whole() {
        let frames: Vec<Vec<u8>> = (0..32u8).map(|i| frame_of(&[200 + i as usize])).collect();
        let chunk = pack(&frames, 3, 10).unwrap().remove(0);
        let raw = chunk.data.clone();
        let stored = chunk.clone().compressed();
        assert!(stored.name.compressed);
        assert!(
            stored.data.len() < raw.len() / 4,
            "{} of {}",
            stored.data.len(),
            raw.len()
        );
        assert_eq!(stored.name.len, stored.data.len());
        assert_eq!((stored.name.seq, stored.name.pos), (3, 42));
        let name = NodeName::parse(&stored.name.to_string()).expect("its name parses");
        assert_eq!(payload(&name, stored.data).unwrap(), raw);

        // Bytes that do not compress stay as they are.
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let noise: Vec<u8> = (0..4096)
            .map(|_| {
                // xorshift64*: bytes zstd finds nothing to shorten in.
                x ^= x >> 12;
                x ^= x << 25;
                x ^= x >> 27;
                (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 56) as u8
            })
            .collect();
        let mut f = Vec::new();
        frame::push(&mut f, &noise);
        let plain = pack(&[f.clone()], 1, 0).unwrap().remove(0).compressed();
        assert!(!plain.name.compressed);
        assert_eq!(payload(&plain.name, plain.data).unwrap(), f);
    }

    /// A node whose data is not what its name says is refused, never
    /// decompressed past a node's size: a node of zeros that would expand
    /// far beyond it (written by anyone with access to the tail) fails.
    #[test]
    fn a_node_that_lies_about_its_data_is_refused() {
        let bomb = zstd::block::compress(&vec![0u8; 8 * NODE_BYTES], 1).unwrap();
        let name = NodeName {
            seq: 9,
            pos: 1,
            complete: true,
            len: bomb.len(),
            compressed: true,
        };
        let e = payload(&name, bomb.clone()).unwrap_err();
        assert!(matches!(e, NodeDataError::Decompress { seq: 9, .. }), "{e}");
        let e = payload(&NodeName { len: 3, ..name }, bomb).unwrap_err();
        assert!(
            matches!(
                e,
                NodeDataError::Length {
                    seq: 9,
                    held: _,
                    named: 3
                }
            ),
            "{e}"
        );
        let e = payload(&name, vec![1u8; name.len]).unwrap_err();
        assert!(e.to_string().contains("does not decompress"), "{e}");
    }

    #[test]
    fn small_commands_share_a_node_that_ends_at_the_last() {
        let frames = vec![frame_of(&[10, 20]), frame_of(&[5])];
        let chunks = pack(&frames, 7, 100).unwrap();
        assert_eq!(chunks.len(), 1);
        assert_eq!(chunks[0].name.seq, 7);
        assert_eq!(chunks[0].name.pos, 103);
        assert!(chunks[0].name.complete);
        assert_eq!(chunks[0].data, frames.concat());
    }

    #[test]
    fn a_command_larger_than_a_node_spans_nodes_complete_only_at_its_end() {
        let big = frame_of(&[NODE_BYTES, NODE_BYTES / 2]);
        let frames = vec![frame_of(&[10]), big.clone(), frame_of(&[3])];
        let chunks = pack(&frames, 1, 0).unwrap();
        let kinds: Vec<(u64, u64, bool)> = chunks
            .iter()
            .map(|c| (c.name.seq, c.name.pos, c.name.complete))
            .collect();
        assert_eq!(
            kinds,
            vec![(1, 1, true), (2, 1, false), (3, 3, true), (4, 4, true)]
        );
        assert!(chunks.iter().all(|c| c.data.len() <= NODE_BYTES));
        let joined: Vec<u8> = chunks.iter().flat_map(|c| c.data.clone()).collect();
        assert_eq!(joined, frames.concat());
        // Each multi stays under its budget.
        for m in multis(&chunks) {
            let bytes: usize = m.iter().map(|c| c.data.len()).sum();
            assert!(bytes <= MULTI_BYTES || m.len() == 1);
        }
    }
}
