//! What one token's listing pages may walk of the engine's state.
//!
//! A listing page walks the published state under its read lock: the first
//! page of a listing walks every batch or job once to count what matches,
//! a later page walks its own length (the cursor carries the count). Any
//! depositor token may list, so without a bound one token paging in a
//! loop would take the state, and the CPU, from every other caller. Each
//! token gets a bucket of items refilled at `per_second` and holding
//! [`BURST_SECONDS`] of it. A page is let in while its token's bucket is
//! not empty, and charged what it walked once it is done (its cost is
//! known only then), so a bucket may go below zero and the token then
//! waits until it is refilled; other tokens are not slowed.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How many seconds of walking a bucket holds.
pub(crate) const BURST_SECONDS: f64 = 5.0;

/// The most buckets kept. Only authenticated tokens reach a listing, so
/// there are as many as tokens configured; full buckets are forgotten
/// first when there are more.
const MAX_BUCKETS: usize = 4096;

/// Per-token buckets of listing work.
#[derive(Debug)]
pub(crate) struct ListingBudget {
    per_second: f64,
    hasher: RandomState,
    buckets: Mutex<HashMap<u64, Bucket>>,
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    items: f64,
    at: Instant,
}

/// A page let in: charge it with [`ListingBudget::charge`] when done.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Admitted(u64);

impl ListingBudget {
    /// Buckets refilled at `per_second` items (at least one).
    pub(crate) fn new(per_second: u64) -> ListingBudget {
        ListingBudget {
            per_second: per_second.max(1) as f64,
            hasher: RandomState::new(),
            buckets: Mutex::new(HashMap::new()),
        }
    }

    fn capacity(&self) -> f64 {
        self.per_second * BURST_SECONDS
    }

    fn refilled(&self, b: Bucket, now: Instant) -> Bucket {
        let gained = now.saturating_duration_since(b.at).as_secs_f64() * self.per_second;
        Bucket {
            items: (b.items + gained).min(self.capacity()),
            at: now,
        }
    }

    /// Lets a page of `token` in, or says how long the token must wait.
    ///
    /// # Errors
    /// The time until the token's bucket is no longer empty.
    pub(crate) fn admit(&self, token: &[u8], now: Instant) -> Result<Admitted, Duration> {
        let key = self.hasher.hash_one(token);
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        let full = Bucket {
            items: self.capacity(),
            at: now,
        };
        let b = buckets.get(&key).map_or(full, |b| self.refilled(*b, now));
        if b.items <= 0.0 {
            buckets.insert(key, b);
            return Err(Duration::from_secs_f64((1.0 - b.items) / self.per_second));
        }
        if buckets.len() >= MAX_BUCKETS && !buckets.contains_key(&key) {
            let cap = self.capacity();
            buckets.retain(|_, b| self.refilled(*b, now).items < cap);
        }
        buckets.insert(key, b);
        Ok(Admitted(key))
    }

    /// Charges an admitted page what it walked.
    pub(crate) fn charge(&self, page: Admitted, walked: usize, now: Instant) {
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        let b = buckets.get(&page.0).copied().unwrap_or(Bucket {
            items: self.capacity(),
            at: now,
        });
        let mut b = self.refilled(b, now);
        b.items -= walked as f64;
        buckets.insert(page.0, b);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_over_its_budget_waits_and_others_do_not() {
        let budget = ListingBudget::new(100);
        let t0 = Instant::now();
        // A burst of five seconds' worth, then one walk past it.
        let a = budget.admit(b"alice", t0).expect("first page");
        budget.charge(a, 600, t0);
        let wait = budget.admit(b"alice", t0).expect_err("over budget");
        assert!(wait >= Duration::from_secs(1), "{wait:?}");
        assert!(wait <= Duration::from_secs(2), "{wait:?}");
        // Another token is not slowed.
        assert!(budget.admit(b"bob", t0).is_ok());
        // Refilled: once the debt is paid the token is let in again.
        assert!(budget
            .admit(b"alice", t0 + Duration::from_millis(900))
            .is_err());
        assert!(budget.admit(b"alice", t0 + wait).is_ok());
        // Never more than the burst is saved up.
        let later = t0 + Duration::from_secs(3600);
        let a = budget.admit(b"alice", later).expect("refilled");
        budget.charge(a, 501, later);
        assert!(budget.admit(b"alice", later).is_err());
    }

    #[test]
    fn buckets_stay_bounded() {
        let budget = ListingBudget::new(10);
        let now = Instant::now();
        for i in 0..(MAX_BUCKETS + 100) {
            let _ = budget.admit(&i.to_le_bytes(), now);
        }
        let n = budget.buckets.lock().map(|b| b.len()).unwrap_or(0);
        assert!(n <= MAX_BUCKETS, "{n}");
    }
}
