//! The audit-read indexes of the log: who wrote what, and which streams
//! belong to a collection, so `history --actor`/`--collection` never scan the
//! log.
//!
//! ## Layout (in the log's own sled tree, beside records and the stream index)
//! - `a` ‖ actor hash (8 bytes) ‖ first position (u64 BE) → last position
//!   (u64 BE): a *run* of consecutive positions appended by one actor. An
//!   append by the actor of the previous append extends that run (the entry
//!   is rewritten in the same batch); any other starts a new one. A worker
//!   that reports step after step, or the engine's group of commands, costs
//!   one entry, not one per event.
//! - `c` ‖ collection hash (8 bytes) ‖ stream key ([`StreamId::key`]) → the
//!   collection's name: written with the stream's first event
//!   (`BatchSubmitted`, `JobCreated`), which carries the profile.
//! - `x` ‖ `audit-index-v1` → empty: the indexes cover the whole log.
//!
//! Hashes are BLAKE3 truncated to 8 bytes. A collision only adds candidates:
//! readers compare the actor of each record read and the name stored in
//! each collection entry.
//!
//! Every entry is written in the same `sled::Batch` as the records it
//! indexes, so a crash never leaves a record without its entries.
//!
//! ## Old logs
//! A log written before these indexes has no `x` marker. [`Log::open`]
//! builds them in one pass over the log (logging progress at INFO every
//! million events) and then writes the marker; an interrupted build starts
//! over at the next open.

use std::ops::RangeInclusive;

use crate::event::{Actor, ActorKind, Event, StreamId};

pub(crate) const ACTOR: u8 = b'a';
pub(crate) const COLLECTION: u8 = b'c';
pub(crate) const MARKER: &[u8] = b"xaudit-index-v1";
/// Index entries written per sled batch while building the indexes of an old log.
const BUILD_BATCH: u64 = 50_000;
/// How often (in events) the build logs its progress.
const BUILD_PROGRESS: u64 = 1_000_000;

/// The actor run the last append wrote: extended by the next append when its
/// actor is the same and it follows directly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ActorRun {
    hash: [u8; 8],
    first: u64,
    last: u64,
}

fn hash8(parts: &[&[u8]]) -> [u8; 8] {
    let mut h = blake3::Hasher::new();
    for p in parts {
        h.update(&(p.len() as u64).to_le_bytes());
        h.update(p);
    }
    let mut out = [0u8; 8];
    out.copy_from_slice(&h.finalize().as_bytes()[..8]);
    out
}

pub(crate) fn actor_hash(actor: &Actor) -> [u8; 8] {
    let kind: &[u8] = match actor.kind {
        ActorKind::Engine => b"engine",
        ActorKind::Admin => b"admin",
        ActorKind::Worker => b"worker",
        ActorKind::Depositor => b"depositor",
    };
    hash8(&[kind, actor.name.as_bytes()])
}

pub(crate) fn collection_hash(collection: &str) -> [u8; 8] {
    hash8(&[collection.as_bytes()])
}

pub(crate) fn actor_key(hash: [u8; 8], first: u64) -> [u8; 17] {
    let mut k = [0u8; 17];
    k[0] = ACTOR;
    k[1..9].copy_from_slice(&hash);
    k[9..].copy_from_slice(&first.to_be_bytes());
    k
}

pub(crate) fn collection_key(hash: [u8; 8], stream: StreamId) -> [u8; 18] {
    let mut k = [0u8; 18];
    k[0] = COLLECTION;
    k[1..9].copy_from_slice(&hash);
    k[9..].copy_from_slice(&stream.key());
    k
}

pub(crate) fn be_u64(bytes: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(bytes.try_into().ok()?))
}

pub(crate) fn stream_of_key(k: &[u8]) -> Option<StreamId> {
    let n = be_u64(k.get(1..9)?)?;
    match k.first()? {
        b's' => Some(StreamId::System),
        b'b' => Some(StreamId::Batch(crate::ids::Bid(n))),
        b'j' => Some(StreamId::Job(crate::ids::Jid(n))),
        _ => None,
    }
}

/// The collection a stream's first event puts it in, if the event says.
pub(crate) fn collection_of(stream: StreamId, event: &Event) -> Option<&str> {
    match (stream, event) {
        (StreamId::Batch(_), Event::BatchSubmitted(e)) => Some(&e.submission.profile_name),
        (StreamId::Job(_), Event::JobCreated(e)) => Some(&e.configuration.profile_name),
        _ => None,
    }
}

/// Stages the actor entry of an append of `positions` by `actor`; returns
/// the run it now belongs to.
pub(crate) fn stage_actor(
    batch: &mut sled::Batch,
    run: Option<ActorRun>,
    actor: &Actor,
    positions: RangeInclusive<u64>,
) -> ActorRun {
    let hash = actor_hash(actor);
    let run = match run {
        Some(r) if r.hash == hash && r.last + 1 == *positions.start() => ActorRun {
            last: *positions.end(),
            ..r
        },
        _ => ActorRun {
            hash,
            first: *positions.start(),
            last: *positions.end(),
        },
    };
    batch.insert(&actor_key(run.hash, run.first), &run.last.to_be_bytes());
    run
}

/// Stages the collection entry of an event that opens a batch or job stream.
pub(crate) fn stage_collection(batch: &mut sled::Batch, stream: StreamId, event: &Event) {
    if let Some(c) = collection_of(stream, event) {
        batch.insert(&collection_key(collection_hash(c), stream), c.as_bytes());
    }
}

/// Stages the removal of every entry for positions from `first_bad` on (a
/// repair truncating the tail): runs are cut short, streams created in the
/// tail leave their collection.
pub(crate) fn stage_truncation(
    tree: &sled::Tree,
    batch: &mut sled::Batch,
    first_bad: u64,
) -> Result<(), sled::Error> {
    for item in tree.scan_prefix([ACTOR]) {
        let (k, v) = item?;
        let first = be_u64(&k[9..]).unwrap_or(0);
        let last = be_u64(&v).unwrap_or(0);
        if first >= first_bad {
            batch.remove(k);
        } else if last >= first_bad {
            batch.insert(k, &(first_bad - 1).to_be_bytes());
        }
    }
    for item in tree.scan_prefix([COLLECTION]) {
        let (k, _) = item?;
        let mut first = [0u8; 18];
        first[0] = b'i';
        first[1..10].copy_from_slice(&k[9..18]);
        first[10..].copy_from_slice(&1u64.to_be_bytes());
        let created = tree.get(first)?.and_then(|p| be_u64(&p));
        if created.is_none_or(|p| p >= first_bad) {
            batch.remove(k);
        }
    }
    Ok(())
}

/// Builds the indexes of a log written before them (no marker) from its
/// records up to `head`, then marks them built. A no-op when the marker is
/// there. `records` yields `None` for a record that does not read (a torn
/// tail ends the build there: a repair truncates it).
pub(crate) fn build_if_missing(
    tree: &sled::Tree,
    head: u64,
    records: impl Iterator<Item = Option<crate::codec::Recorded>>,
) -> Result<(), sled::Error> {
    if tree.contains_key(MARKER)? {
        return Ok(());
    }
    // Entries of an interrupted build: start over.
    let mut batch = sled::Batch::default();
    for item in tree
        .scan_prefix([ACTOR])
        .chain(tree.scan_prefix([COLLECTION]))
    {
        batch.remove(item?.0);
    }
    if head > 0 {
        tracing::info!(
            events = head,
            "building the audit-read indexes (actor, collection) of a log written before them"
        );
    }
    let mut run: Option<ActorRun> = None;
    let mut staged = 0u64;
    for r in records {
        let Some(r) = r else { break };
        let p = r.envelope.position;
        run = Some(stage_actor(&mut batch, run, &r.envelope.actor, p..=p));
        stage_collection(&mut batch, r.envelope.stream, &r.event);
        staged += 1;
        if staged % BUILD_BATCH == 0 {
            tree.apply_batch(std::mem::take(&mut batch))?;
        }
        if p % BUILD_PROGRESS == 0 {
            tracing::info!(done = p, of = head, "building the audit-read indexes");
        }
    }
    batch.insert(MARKER, &[]);
    tree.apply_batch(batch)?;
    if head > 0 {
        tracing::info!(events = staged, "the audit-read indexes are built");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_extend_only_for_the_same_actor_directly_after() {
        let mut b = sled::Batch::default();
        let alice = Actor::admin("alice");
        let r = stage_actor(&mut b, None, &alice, 1..=3);
        let r2 = stage_actor(&mut b, Some(r), &alice, 4..=4);
        assert_eq!((r2.first, r2.last), (1, 4));
        let r3 = stage_actor(&mut b, Some(r2), &Actor::worker("alice"), 5..=5);
        assert_eq!((r3.first, r3.last), (5, 5));
        let r4 = stage_actor(&mut b, Some(r2), &alice, 9..=9);
        assert_eq!((r4.first, r4.last), (9, 9));
    }

    #[test]
    fn stream_keys_read_back() {
        for s in [
            StreamId::System,
            StreamId::Batch(crate::ids::Bid(7)),
            StreamId::Job(crate::ids::Jid(u64::MAX)),
        ] {
            assert_eq!(stream_of_key(&s.key()), Some(s));
        }
    }
}
