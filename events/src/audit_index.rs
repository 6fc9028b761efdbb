//! Reads of the audit indexes ([`crate::audit_keys`] has their layout and
//! writes them): the time search over positions, actor runs, the streams of
//! a collection, and a whole-log check of them.

use std::ops::RangeInclusive;

use chrono::{DateTime, Utc};

use crate::audit_keys::{
    actor_hash, actor_key, be_u64, collection_hash, collection_key, collection_of, stream_of_key,
    ACTOR, COLLECTION, MARKER,
};
use crate::event::{Actor, StreamId};
use crate::log::{Log, LogError};

impl Log {
    /// The first durable position whose timestamp is at or after `t`; the
    /// durable position + 1 when there is none. A binary search over
    /// positions: the log's timestamps never go backwards.
    ///
    /// # Errors
    /// As [`Log::read_one`].
    pub fn first_position_from(&self, t: DateTime<Utc>) -> Result<u64, LogError> {
        let (mut lo, mut hi) = (1u64, self.durable_position() + 1);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if self.read_one(mid)?.envelope.timestamp < t {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        Ok(lo)
    }

    /// The runs of positions within `window` appended by `actor`, in order,
    /// from the actor index. A hash collision can add runs of another actor:
    /// compare each record's actor.
    ///
    /// # Errors
    /// [`LogError::Storage`] on I/O errors.
    pub fn actor_runs(
        &self,
        actor: &Actor,
        window: RangeInclusive<u64>,
    ) -> Result<Vec<RangeInclusive<u64>>, LogError> {
        let (start, end) = (*window.start(), *window.end());
        if start > end {
            return Ok(Vec::new());
        }
        let hash = actor_hash(actor);
        let tree = self.raw_tree();
        let mut out = Vec::new();
        // The run that starts before the window may reach into it.
        let before = tree
            .range(actor_key(hash, 0)..actor_key(hash, start))
            .next_back()
            .transpose()?;
        let inside = tree.range(actor_key(hash, start)..=actor_key(hash, end));
        for item in before.into_iter().map(Ok).chain(inside) {
            let (k, v) = item?;
            let (Some(first), Some(last)) = (be_u64(&k[9..]), be_u64(&v)) else {
                return Err(LogError::Corrupt {
                    position: 0,
                    reason: "bad actor index entry".into(),
                });
            };
            let (first, last) = (first.max(start), last.min(end));
            if first <= last {
                out.push(first..=last);
            }
        }
        Ok(out)
    }

    /// The batch and job streams of a collection, from the collection index.
    ///
    /// # Errors
    /// [`LogError::Storage`] on I/O errors.
    pub fn collection_streams(&self, collection: &str) -> Result<Vec<StreamId>, LogError> {
        let mut prefix = [0u8; 9];
        prefix[0] = COLLECTION;
        prefix[1..].copy_from_slice(&collection_hash(collection));
        let mut out = Vec::new();
        for item in self.raw_tree().scan_prefix(prefix) {
            let (k, v) = item?;
            if &*v != collection.as_bytes() {
                continue;
            }
            out.extend(stream_of_key(&k[9..]));
        }
        Ok(out)
    }

    /// The positions of one stream's events, in version order, from the
    /// stream index (no record is read).
    ///
    /// # Errors
    /// [`LogError::Corrupt`] on a bad index entry.
    pub fn stream_positions(&self, stream: StreamId) -> Result<Vec<u64>, LogError> {
        let mut prefix = [0u8; 10];
        prefix[0] = b'i';
        prefix[1..].copy_from_slice(&stream.key());
        self.raw_tree()
            .scan_prefix(prefix)
            .map(|item| {
                let (_, v) = item?;
                be_u64(&v).ok_or_else(|| LogError::Corrupt {
                    position: 0,
                    reason: format!("bad index entry for {stream}"),
                })
            })
            .collect()
    }

    /// Checks the audit indexes against the log in one pass: every record is
    /// covered by a run of its actor, every run lies within the log, and the
    /// collection entries are exactly the streams opened with a collection.
    /// Returns the problems found (empty when the indexes are whole).
    ///
    /// # Errors
    /// As [`Log::read_range`].
    pub fn audit_index_problems(&self) -> Result<Vec<String>, LogError> {
        let tree = self.raw_tree();
        let head = self.head().0;
        let mut problems = Vec::new();
        if !tree.contains_key(MARKER)? {
            problems.push("the audit indexes are not marked built".to_string());
        }
        let mut runs: std::collections::HashMap<[u8; 8], Vec<(u64, u64)>> =
            std::collections::HashMap::new();
        for item in tree.scan_prefix([ACTOR]) {
            let (k, v) = item?;
            let mut h = [0u8; 8];
            h.copy_from_slice(&k[1..9]);
            let (first, last) = (be_u64(&k[9..]).unwrap_or(0), be_u64(&v).unwrap_or(0));
            if first == 0 || last < first || last > head {
                problems.push(format!(
                    "actor run {first}..={last} is not within the log (head {head})"
                ));
            }
            runs.entry(h).or_default().push((first, last));
        }
        let mut expected_collections = std::collections::BTreeMap::new();
        for r in self.read_range(1, head) {
            let r = r?;
            let p = r.envelope.position;
            let covered = runs.get(&actor_hash(&r.envelope.actor)).is_some_and(|rs| {
                let i = rs.partition_point(|(first, _)| *first <= p);
                i > 0 && rs[i - 1].1 >= p
            });
            if !covered {
                problems.push(format!(
                    "position {p} has no actor index entry for {}",
                    r.envelope.actor
                ));
            }
            if let Some(c) = collection_of(r.envelope.stream, &r.event) {
                expected_collections.insert(
                    collection_key(collection_hash(c), r.envelope.stream).to_vec(),
                    c.as_bytes().to_vec(),
                );
            }
        }
        let mut found = std::collections::BTreeMap::new();
        for item in tree.scan_prefix([COLLECTION]) {
            let (k, v) = item?;
            found.insert(k.to_vec(), v.to_vec());
        }
        for (k, v) in &expected_collections {
            if found.get(k) != Some(v) {
                problems.push(format!(
                    "collection index has no entry for {}",
                    stream_of_key(&k[9..]).map_or("?".to_string(), |s| s.to_string())
                ));
            }
        }
        for k in found.keys() {
            if !expected_collections.contains_key(k) {
                problems.push(format!(
                    "collection index has an entry for {}, which no event opened",
                    stream_of_key(&k[9..]).map_or("?".to_string(), |s| s.to_string())
                ));
            }
        }
        Ok(problems)
    }
}
