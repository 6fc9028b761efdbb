//! The provisioning gate on working storage: a [`StorageProbe`] over statvfs
//! ([`DfProbe`]) or fixed ([`FixedProbe`]), and the [`Provision`] step.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::ctx::JobCtx;
use super::{Outcome, Step, StepFuture, StepResult};

/// How full a file system is.
pub trait StorageProbe: Send + Sync {
    /// The used share of the file system holding `path`, in percent.
    ///
    /// # Errors
    /// When it cannot be measured.
    fn used_percent(&self, path: &Path) -> std::io::Result<f64>;

    /// The bytes an unprivileged writer can still write on the file system
    /// holding `path` (unbounded when the probe does not know).
    ///
    /// # Errors
    /// When it cannot be measured.
    fn available_bytes(&self, _path: &Path) -> std::io::Result<u64> {
        Ok(u64::MAX)
    }

    /// The most bytes an unprivileged writer could ever have on the file
    /// system holding `path`: what is available when everything written is
    /// removed (unbounded when the probe does not know).
    ///
    /// # Errors
    /// When it cannot be measured.
    fn capacity_bytes(&self, _path: &Path) -> std::io::Result<u64> {
        Ok(u64::MAX)
    }
}

/// Measures with `statvfs(2)` (through `rustix`), as `df` does: used
/// blocks over the blocks an unprivileged writer can use
/// (`used / (used + available)`), so reserved blocks count as full.
#[derive(Debug, Clone, Copy, Default)]
pub struct DfProbe;

impl StorageProbe for DfProbe {
    fn used_percent(&self, path: &Path) -> std::io::Result<f64> {
        let st = rustix::fs::statvfs(path).map_err(std::io::Error::from)?;
        Ok(used_percent(st.f_blocks, st.f_bfree, st.f_bavail))
    }

    fn available_bytes(&self, path: &Path) -> std::io::Result<u64> {
        let st = rustix::fs::statvfs(path).map_err(std::io::Error::from)?;
        Ok(st.f_bavail.saturating_mul(st.f_frsize))
    }

    fn capacity_bytes(&self, path: &Path) -> std::io::Result<u64> {
        let st = rustix::fs::statvfs(path).map_err(std::io::Error::from)?;
        // The blocks reserved for root are never an unprivileged writer's.
        let reserved = st.f_bfree.saturating_sub(st.f_bavail);
        Ok(st
            .f_blocks
            .saturating_sub(reserved)
            .saturating_mul(st.f_frsize))
    }
}

/// `df`'s capacity from block counts: used over used plus available, in
/// percent (0 for an empty file system).
pub fn used_percent(blocks: u64, free: u64, available: u64) -> f64 {
    let used = blocks.saturating_sub(free);
    let usable = used.saturating_add(available);
    if usable == 0 {
        return 0.0;
    }
    used as f64 * 100.0 / usable as f64
}

/// A probe that answers what it is told (for tests): a fill level, the
/// bytes available and the capacity (unbounded unless set).
#[derive(Debug, Clone, Default)]
pub struct FixedProbe(Arc<Mutex<(f64, Option<u64>)>>, Arc<Mutex<Option<u64>>>);

impl FixedProbe {
    /// A probe answering `percent`.
    pub fn new(percent: f64) -> FixedProbe {
        FixedProbe(Arc::new(Mutex::new((percent, None))), Arc::default())
    }

    /// Changes the capacity.
    pub fn set_capacity(&self, bytes: u64) {
        *self.1.lock().unwrap_or_else(|e| e.into_inner()) = Some(bytes);
    }

    /// Changes the fill level.
    pub fn set(&self, percent: f64) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).0 = percent;
    }

    /// Changes the bytes available.
    pub fn set_available(&self, bytes: u64) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).1 = Some(bytes);
    }
}

impl StorageProbe for FixedProbe {
    fn used_percent(&self, _: &Path) -> std::io::Result<f64> {
        Ok(self.0.lock().unwrap_or_else(|e| e.into_inner()).0)
    }

    fn available_bytes(&self, _: &Path) -> std::io::Result<u64> {
        Ok(self
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .1
            .unwrap_or(u64::MAX))
    }

    fn capacity_bytes(&self, _: &Path) -> std::io::Result<u64> {
        Ok(self
            .1
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .unwrap_or(u64::MAX))
    }
}

/// Provisioning: keeps jobs waiting while working storage is fuller than the
/// threshold, or has less room than the job's `space_needed` (its
/// estimate), then runs the inner step.
pub struct Provision {
    probe: Arc<dyn StorageProbe>,
    threshold_percent: f64,
    working_storage: PathBuf,
    inner: Arc<dyn Step>,
}

impl Provision {
    /// A gate on `working_storage` in front of `inner`.
    pub fn new(
        probe: Arc<dyn StorageProbe>,
        threshold_percent: f64,
        working_storage: PathBuf,
        inner: Arc<dyn Step>,
    ) -> Provision {
        Provision {
            probe,
            threshold_percent,
            working_storage,
            inner,
        }
    }
}

impl Step for Provision {
    fn run<'a>(&'a self, job: &'a JobCtx) -> StepFuture<'a> {
        Box::pin(async move {
            let probe = Arc::clone(&self.probe);
            let path = self.working_storage.clone();
            let used = tokio::task::spawn_blocking(move || {
                Ok::<_, std::io::Error>((
                    probe.used_percent(&path)?,
                    probe.available_bytes(&path)?,
                    probe.capacity_bytes(&path)?,
                ))
            })
            .await;
            let needed = match job.space_needed().await {
                Ok(n) => n,
                Err(e) => {
                    return StepResult::Wait(format!("cannot read the job's space_needed: {e}"))
                }
            };
            match used {
                // Before, only the fill level counted: a 30 MB job passed on
                // an empty 20 MiB working storage and failed in Downloading.
                // Waiting would never end: the job is larger than the whole
                // working storage (it waited for ever).
                Ok(Ok((_, _, capacity))) if needed > capacity => {
                    StepResult::Report(Outcome::failure(format!(
                        "the job needs {needed} bytes of working storage, more than {} can ever hold ({capacity} bytes when empty): give the workers a larger --working-storage, then requeue the job",
                        self.working_storage.display()
                    )))
                }
                Ok(Ok((_, available, _))) if needed > available => StepResult::Wait(format!(
                    "working storage {} has {available} bytes free; the job needs {needed}",
                    self.working_storage.display()
                )),
                Ok(Ok((used, _, _))) if used <= self.threshold_percent => {
                    self.inner.run(job).await
                }
                Ok(Ok((used, _, _))) => StepResult::Wait(format!(
                    "working storage {} is {used:.1}% full (threshold {}%)",
                    self.working_storage.display(),
                    self.threshold_percent
                )),
                Ok(Err(e)) => StepResult::Wait(format!(
                    "cannot measure working storage {}: {e}",
                    self.working_storage.display()
                )),
                Err(e) => StepResult::Wait(format!("the storage probe failed: {e}")),
            }
        })
    }
}
