//! Grouping the differences into units that change together (a job's
//! nodes, a batch's, the rest) and packing them into transactions.

use std::collections::{BTreeMap, BTreeSet};

use ingest_events::Bid;

use crate::layout;
use crate::ops::{Op, TRANSACTION_OVERHEAD};
use crate::tree::{Tree, TreeDiff};
use crate::txn::TxnLimits;
use crate::zk::LiveTree;

/// What a node belongs to, for keeping its changes together.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Group {
    /// Base nodes, queue directories, admin locks.
    Other,
    /// A batch's own nodes (and its `/batch-uuids` entry).
    Batch(String),
    /// A job's nodes, queue reference and batch set child.
    Job(String),
}

pub(super) fn group_of(path: &str, data: Option<&[u8]>) -> Group {
    let parts: Vec<&str> = path.split('/').collect();
    match parts.as_slice() {
        ["", "jobs", "states", _, name] => match name.split_once('-') {
            Some((_, jid)) => Group::Job(jid.to_string()),
            None => Group::Other,
        },
        ["", "jobs", "states", ..] => Group::Other,
        ["", "jobs", jid, ..] => Group::Job(jid.to_string()),
        ["", "batches", _, "states", _, jid] => Group::Job(jid.to_string()),
        ["", "batches", bid, ..] => Group::Batch(bid.to_string()),
        ["", "batch-uuids", _] => match data
            .and_then(|d| std::str::from_utf8(d).ok())
            .and_then(|t| t.parse::<Bid>().ok())
        {
            Some(bid) => Group::Batch(bid.to_string()),
            None => Group::Other,
        },
        _ => Group::Other,
    }
}

/// The operations of one group, applied together.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Unit {
    pub(super) ops: Vec<Op>,
}

/// Turns a diff into ordered units (see the module docs).
pub(super) fn plan_units(diff: &TreeDiff, expected: &Tree, live: &LiveTree) -> Vec<Unit> {
    #[derive(Default)]
    struct Changes {
        creates: BTreeMap<String, Vec<u8>>,
        sets: BTreeMap<String, Vec<u8>>,
        deletes: BTreeSet<String>,
    }
    let mut groups: BTreeMap<Group, Changes> = BTreeMap::new();
    for p in &diff.missing {
        let data = expected.get(p).unwrap_or_default().to_vec();
        let g = group_of(p, Some(&data));
        groups.entry(g).or_default().creates.insert(p.clone(), data);
    }
    for d in &diff.differing {
        let g = group_of(&d.path, Some(&d.expected));
        groups
            .entry(g)
            .or_default()
            .sets
            .insert(d.path.clone(), d.expected.clone());
    }
    let doomed: BTreeSet<&str> = diff.unexpected.iter().map(String::as_str).collect();
    for p in &diff.unexpected {
        let g = group_of(p, live.tree.get(p));
        let c = groups.entry(g).or_default();
        c.deletes.insert(p.clone());
        // A worker's lock under a node that must go goes with it.
        let lock = format!("{p}/lock");
        if layout::is_ephemeral_lock(&lock)
            && live.tree.contains(&lock)
            && !doomed.contains(lock.as_str())
        {
            c.deletes.insert(lock);
        }
    }
    let creates_and_sets = |c: &Changes| -> Vec<Op> {
        let mut ops: Vec<Op> = c
            .creates
            .iter()
            .map(|(p, d)| Op::create(p.clone(), d.clone()))
            .collect();
        ops.extend(c.sets.iter().map(|(p, d)| Op::set(p.clone(), d.clone())));
        ops
    };
    // Children sort after their parents: deleting in reverse order goes
    // children first.
    let deletes = |c: &Changes| -> Vec<Op> {
        c.deletes
            .iter()
            .rev()
            .map(|p| Op::delete(p.clone()))
            .collect()
    };
    let mut first = Vec::new();
    let mut jobs = Vec::new();
    let mut last = Vec::new();
    for (g, c) in &groups {
        match g {
            Group::Job(_) => {
                let mut ops = deletes(c);
                ops.extend(creates_and_sets(c));
                jobs.push(Unit { ops });
            }
            Group::Other | Group::Batch(_) => {
                let ops = creates_and_sets(c);
                if !ops.is_empty() {
                    first.push(Unit { ops });
                }
                let ops = deletes(c);
                if !ops.is_empty() {
                    last.push(Unit { ops });
                }
            }
        }
    }
    // Groups come in the order Other, batches, jobs: base nodes are created
    // before the batches that need `/batches`; deletions go the other way.
    let mut out = first;
    out.extend(jobs);
    out.extend(last.into_iter().rev());
    out
}

/// Packs units into transactions within `limits`, never splitting a unit
/// that fits in one transaction.
pub(super) fn pack(units: Vec<Unit>, limits: TxnLimits) -> Vec<Vec<Op>> {
    let fits = |bytes: usize, ops: usize| {
        TRANSACTION_OVERHEAD + bytes <= limits.max_bytes && ops <= limits.max_ops
    };
    let mut out: Vec<Vec<Op>> = Vec::new();
    let mut cur: Vec<Op> = Vec::new();
    let mut cur_bytes = 0;
    for unit in units {
        let bytes: usize = unit.ops.iter().map(Op::serialized_size).sum();
        if !cur.is_empty() && !fits(cur_bytes + bytes, cur.len() + unit.ops.len()) {
            out.push(std::mem::take(&mut cur));
            cur_bytes = 0;
        }
        if fits(bytes, unit.ops.len()) {
            cur_bytes += bytes;
            cur.extend(unit.ops);
            continue;
        }
        // Larger than a transaction (a huge set of base or batch changes):
        // cut it, in order.
        tracing::warn!(
            ops = unit.ops.len(),
            bytes,
            "a unit of changes is larger than one transaction; applying it in several"
        );
        for op in unit.ops {
            let b = op.serialized_size();
            if !cur.is_empty() && !fits(cur_bytes + b, cur.len() + 1) {
                out.push(std::mem::take(&mut cur));
                cur_bytes = 0;
            }
            cur_bytes += b;
            cur.push(op);
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}
