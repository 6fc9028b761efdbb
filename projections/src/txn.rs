//! Cutting a queue of projected events into ZooKeeper `multi` transactions.
//!
//! A transaction holds as many whole events as fit both caps of
//! [`TxnLimits`] (serialized bytes, grouped by [`batches_by_size`], and
//! operation count). An event too large for one transaction on its own is
//! applied in several, cut only at its [`EventOps::split_points`] (between
//! jobs, so no job is ever half-written); if one of its parts alone exceeds a
//! cap, planning fails with [`Oversized`] naming the event.
//!
//! The sink and the projection bench plan with the same function, so the
//! bench's raw baseline sends exactly the transactions the sink sends, minus
//! the checkpoint.

use std::ops::Range;

use crate::ops::{batches_by_size, EventOps, TRANSACTION_OVERHEAD};

/// Caps of one `multi` transaction.
///
/// # Cautions
/// Besides `jute.maxbuffer`, mind the server's heap: ZooKeeper keeps its
/// last committed transactions in memory (`zookeeper.commitLogCount`, 500 by
/// default, for syncing followers), each with its request, so large
/// transactions can hold up to about 500 × the byte cap. The projection
/// bench ran a server with `tools/zk`'s 256 MiB test heap out of memory with
/// 10,000 live jobs at 512 KiB (and at 128 KiB); it needed 1 GiB.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TxnLimits {
    /// Serialized bytes of the request (see [`crate::Op::serialized_size`]);
    /// keep it well under the server's `jute.maxbuffer` (1 MiB by default).
    pub max_bytes: usize,
    /// Operations in the request.
    pub max_ops: usize,
}

impl Default for TxnLimits {
    /// 512 KiB and 4096 operations.
    fn default() -> Self {
        TxnLimits {
            max_bytes: 512 * 1024,
            max_ops: 4096,
        }
    }
}

/// Room the sink keeps in every transaction for its own operation, the
/// version-checked checkpoint write.
///
/// # Cautions
/// When cleanup must delete a worker's lock together with a finished job
/// (see [`crate::sink`]), those deletions (about 40 bytes each) come on top
/// of the cap; keep the cap well under the server's `jute.maxbuffer`.
pub const RESERVED_BYTES: usize = 512;
/// Operations the sink keeps for itself in every transaction (the
/// checkpoint write; see [`RESERVED_BYTES`]).
pub const RESERVED_OPS: usize = 1;

impl TxnLimits {
    /// The caps left for the events' operations once the sink's own
    /// operations are reserved.
    pub fn for_events(self) -> TxnLimits {
        TxnLimits {
            max_bytes: self.max_bytes.saturating_sub(RESERVED_BYTES).max(1),
            max_ops: self.max_ops.saturating_sub(RESERVED_OPS).max(1),
        }
    }

    fn fits(self, bytes: usize, ops: usize) -> bool {
        TRANSACTION_OVERHEAD + bytes <= self.max_bytes && ops <= self.max_ops
    }
}

/// An event, or a part of one, too large for any transaction.
///
/// ### Handling
/// Not retryable: the same event always plans the same way. Raise the caps
/// (staying under the server's `jute.maxbuffer`) or find out why the event is
/// so large.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the event at position {position} needs {bytes} bytes in {ops} operations in one transaction \
     (the smallest part it can be cut into), over the cap of {max_bytes} bytes / {max_ops} operations"
)]
pub struct Oversized {
    /// The event's position.
    pub position: u64,
    /// Serialized bytes of its smallest indivisible part that does not fit.
    pub bytes: usize,
    /// Operations of that part.
    pub ops: usize,
    /// The byte cap.
    pub max_bytes: usize,
    /// The operation cap.
    pub max_ops: usize,
}

/// The operations of one event that go into a transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    /// Index of the event in the planned queue.
    pub event: usize,
    /// Indices into the event's `ops`.
    pub ops: Range<usize>,
    /// Parts of the event applied once this transaction commits.
    pub parts_done: usize,
    /// Whether the event is complete once this transaction commits.
    pub completes: bool,
}

/// One planned transaction.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TxnPlan {
    /// The segments, in order; only the last may leave its event incomplete.
    pub segments: Vec<Segment>,
    /// Estimated serialized bytes of the operations (without the overhead).
    pub bytes: usize,
    /// Number of operations.
    pub ops: usize,
}

impl TxnPlan {
    /// How many events from the front of the queue are complete after it.
    pub fn events_completed(&self) -> usize {
        self.segments.iter().filter(|s| s.completes).count()
    }
}

/// Where the parts of an event start, plus its length: `[0, …, len]`, the
/// same cuts as [`EventOps::parts`].
pub fn part_bounds(e: &EventOps) -> Vec<usize> {
    let mut bounds = vec![0];
    for &p in &e.split_points {
        if p > *bounds.last().unwrap_or(&0) && p < e.ops.len() {
            bounds.push(p);
        }
    }
    bounds.push(e.ops.len());
    bounds
}

/// Plans the next transaction over `events`, the queue of events not yet (or
/// not wholly) applied, in order; `first_parts_done` parts of the first one
/// are already applied. An empty queue gives an empty plan.
///
/// # Errors
/// [`Oversized`] when the first event (or its next part) cannot fit.
pub fn plan_transaction(
    events: &[EventOps],
    first_parts_done: usize,
    limits: TxnLimits,
) -> Result<TxnPlan, Oversized> {
    let Some(first) = events.first() else {
        return Ok(TxnPlan::default());
    };
    if first_parts_done > 0 {
        return plan_parts(first, first_parts_done, limits);
    }
    let range = batches_by_size(events, limits.max_bytes)
        .into_iter()
        .next()
        .unwrap_or(0..1);
    let mut plan = TxnPlan::default();
    for (i, e) in events[range].iter().enumerate() {
        let (bytes, ops) = (e.serialized_size(), e.ops.len());
        if !limits.fits(plan.bytes + bytes, plan.ops + ops) {
            if i == 0 {
                return plan_parts(first, 0, limits);
            }
            break;
        }
        plan.bytes += bytes;
        plan.ops += ops;
        plan.segments.push(Segment {
            event: i,
            ops: 0..e.ops.len(),
            parts_done: part_bounds(e).len() - 1,
            completes: true,
        });
    }
    Ok(plan)
}

/// As many parts of one event as fit, from part `done` on.
fn plan_parts(e: &EventOps, done: usize, limits: TxnLimits) -> Result<TxnPlan, Oversized> {
    let bounds = part_bounds(e);
    let parts = bounds.len() - 1;
    let start = bounds[done.min(parts)];
    let (mut bytes, mut end_part) = (0, done.min(parts));
    while end_part < parts {
        let part = &e.ops[bounds[end_part]..bounds[end_part + 1]];
        let part_bytes: usize = part.iter().map(crate::Op::serialized_size).sum();
        let ops = bounds[end_part + 1] - start;
        if !limits.fits(bytes + part_bytes, ops) {
            if end_part == done {
                return Err(Oversized {
                    position: e.position,
                    bytes: part_bytes + TRANSACTION_OVERHEAD,
                    ops: part.len(),
                    max_bytes: limits.max_bytes,
                    max_ops: limits.max_ops,
                });
            }
            break;
        }
        bytes += part_bytes;
        end_part += 1;
    }
    let end = bounds[end_part];
    Ok(TxnPlan {
        segments: vec![Segment {
            event: 0,
            ops: start..end,
            parts_done: end_part,
            completes: end_part == parts,
        }],
        bytes,
        ops: end - start,
    })
}

/// Plans every transaction for a queue of whole events (the bench and tests
/// use it; the sink plans one transaction at a time as events arrive).
///
/// # Errors
/// [`Oversized`] for the first event that cannot fit.
pub fn plan_all(events: &[EventOps], limits: TxnLimits) -> Result<Vec<TxnPlan>, Oversized> {
    let mut out = Vec::new();
    let (mut start, mut parts_done) = (0, 0);
    while start < events.len() {
        let mut plan = plan_transaction(&events[start..], parts_done, limits)?;
        let completed = plan.events_completed();
        parts_done = match plan.segments.last() {
            Some(s) if !s.completes => s.parts_done,
            _ => 0,
        };
        for s in &mut plan.segments {
            s.event += start;
        }
        start += completed;
        out.push(plan);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Op;

    fn event(position: u64, n: usize, split_every: Option<usize>) -> EventOps {
        EventOps {
            position,
            ops: (0..n).map(|i| Op::delete(format!("/n{i:04}"))).collect(),
            split_points: split_every
                .map(|k| (k..n).step_by(k).collect())
                .unwrap_or_default(),
        }
    }

    fn limits_for(ops: usize) -> TxnLimits {
        TxnLimits {
            max_bytes: TRANSACTION_OVERHEAD + event(0, ops, None).serialized_size(),
            max_ops: 10_000,
        }
    }

    #[test]
    fn whole_events_fill_a_transaction() {
        let events = vec![event(1, 2, None), event(2, 2, None), event(3, 2, None)];
        let plan = plan_transaction(&events, 0, limits_for(4)).expect("fits");
        assert_eq!(plan.events_completed(), 2);
        assert_eq!(plan.ops, 4);
    }

    #[test]
    fn the_op_cap_cuts_too() {
        let events = vec![event(1, 3, None), event(2, 3, None)];
        let limits = TxnLimits {
            max_bytes: 1 << 20,
            max_ops: 4,
        };
        let plans = plan_all(&events, limits).expect("fits");
        assert_eq!(plans.len(), 2);
    }

    #[test]
    fn a_large_event_is_cut_at_its_split_points() {
        let events = vec![event(1, 10, Some(2)), event(2, 1, None)];
        let plans = plan_all(&events, limits_for(4)).expect("fits");
        let shape: Vec<(usize, Range<usize>, usize, bool)> = plans
            .iter()
            .flat_map(|p| p.segments.iter())
            .map(|s| (s.event, s.ops.clone(), s.parts_done, s.completes))
            .collect();
        assert_eq!(
            shape,
            vec![
                (0, 0..4, 2, false),
                (0, 4..8, 4, false),
                (0, 8..10, 5, true),
                (1, 0..1, 1, true),
            ]
        );
    }

    #[test]
    fn an_indivisible_part_too_large_is_oversized() {
        let events = vec![event(7, 10, Some(5))];
        let err = plan_all(&events, limits_for(4)).expect_err("oversized");
        assert_eq!(err.position, 7);
        assert_eq!(err.ops, 5);
        let events = vec![event(8, 10, None)];
        assert_eq!(
            plan_all(&events, limits_for(4))
                .expect_err("oversized")
                .position,
            8
        );
    }

    #[test]
    fn empty_events_ride_along() {
        let events = vec![event(1, 0, None), event(2, 0, None)];
        let plans = plan_all(&events, limits_for(1)).expect("fits");
        assert_eq!(plans.len(), 1);
        assert_eq!(plans[0].events_completed(), 2);
        assert!(plan_all(&[], limits_for(1)).expect("empty").is_empty());
    }
}
