//! The simulated steps: configurable duration, a seedable failure rate
//! ([`Rng`]) and fault injection ([`Faults`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::ctx::JobCtx;
use super::{Outcome, Step, StepFuture, StepResult};
use ingest_events::JobState;
use ingest_protocol::api::{InventoryBody, StoreBody};

/// A shared random-number generator: `fastrand`'s (wyrand), seeded for a
/// reproducible simulation or from entropy, behind a lock so every task of
/// a worker draws from one stream.
#[derive(Debug)]
pub struct Rng(Mutex<fastrand::Rng>);

impl Rng {
    /// A generator from `seed` (the same seed gives the same numbers).
    pub fn new(seed: u64) -> Rng {
        Rng(Mutex::new(fastrand::Rng::with_seed(seed)))
    }

    /// A generator seeded from entropy.
    pub fn from_entropy() -> Rng {
        Rng(Mutex::new(fastrand::Rng::new()))
    }

    fn with<T>(&self, f: impl FnOnce(&mut fastrand::Rng) -> T) -> T {
        f(&mut self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// The next 64 random bits.
    pub fn next_u64(&self) -> u64 {
        self.with(|r| r.u64(..))
    }

    /// A number in `[0, 1)`.
    pub fn unit(&self) -> f64 {
        self.with(|r| r.f64())
    }

    /// A number in `[0, n)` (0 when `n` is 0).
    pub fn below(&self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            self.with(|r| r.usize(..n))
        }
    }
}

/// Fault injection: "force the next job of step S to fail". Cloning gives
/// another handle on the same faults.
#[derive(Debug, Clone, Default)]
pub struct Faults(Arc<Mutex<HashMap<JobState, u32>>>);

impl Faults {
    /// Makes the next job run in `state` fail (calls add up).
    pub fn fail_next(&self, state: JobState) {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        *m.entry(state).or_default() += 1;
    }

    /// Takes one pending fault for `state`, if any.
    pub fn take(&self, state: JobState) -> bool {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match m.get_mut(&state) {
            Some(n) if *n > 0 => {
                *n -= 1;
                true
            }
            _ => false,
        }
    }

    /// How many faults are still pending for `state`.
    pub fn pending(&self, state: JobState) -> u32 {
        let m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        m.get(&state).copied().unwrap_or(0)
    }
}

/// How one simulated step behaves.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SimSettings {
    /// How long the step takes.
    pub duration: Duration,
    /// The probability, in `[0, 1]`, that it fails.
    pub failure_rate: f64,
}

impl Default for SimSettings {
    fn default() -> SimSettings {
        SimSettings {
            duration: Duration::ZERO,
            failure_rate: 0.0,
        }
    }
}

/// A simulated step: it sleeps, then succeeds or fails at random (or when a
/// fault was injected), with plausible data for its state.
#[derive(Debug, Clone)]
pub struct Simulate {
    settings: SimSettings,
    rng: Arc<Rng>,
    faults: Faults,
}

impl Simulate {
    /// A simulated step sharing `rng` and `faults` with the others.
    pub fn new(settings: SimSettings, rng: Arc<Rng>, faults: Faults) -> Simulate {
        Simulate {
            settings,
            rng,
            faults,
        }
    }

    fn conclude(&self, job: &JobCtx) -> Outcome {
        if self.faults.take(job.state) {
            return Outcome::failure(format!("simulated {} failure (injected)", job.state));
        }
        if self.settings.failure_rate > 0.0 && self.rng.unit() < self.settings.failure_rate {
            return Outcome::failure(format!("simulated {} failure", job.state));
        }
        let done = Outcome::success(format!("simulated {}", job.state));
        let manifest = format!(
            "https://example.invalid/simulate/{}/manifest.checkm",
            job.jid
        );
        match job.state {
            JobState::Estimating | JobState::Downloading => {
                done.with_space_needed(1024 + self.rng.below(1 << 20) as u64)
            }
            JobState::Storing => done.with_store(StoreBody {
                manifest_url: manifest,
                mode: "add".into(),
                delete: false,
            }),
            JobState::Recording => done.with_inventory(InventoryBody {
                manifest_url: manifest,
                mode: "add".into(),
            }),
            _ => done,
        }
    }
}

impl Step for Simulate {
    fn run<'a>(&'a self, job: &'a JobCtx) -> StepFuture<'a> {
        Box::pin(async move {
            if !self.settings.duration.is_zero() {
                tokio::time::sleep(self.settings.duration).await;
            }
            StepResult::Report(self.conclude(job))
        })
    }
}
