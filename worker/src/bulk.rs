//! Threads for bulk byte work, at a lower CPU priority than coordination.
//!
//! A worker does two kinds of work. Coordination (listing queues, taking
//! locks, fetching a manifest, reporting a step, acquiring a batch) costs
//! little CPU, but every job waits on it. Bulk work (writing and hashing
//! downloaded bytes, storing OCFL versions, unpacking containers, removing
//! working directories) costs most of the CPU, and nothing waits on one
//! byte of it in particular. On a full CPU the kernel shares the cores
//! evenly between runnable threads, so with eight hashing threads a batch
//! acquisition waited its turn behind them: under `tools/load --mode real`
//! the mean wait from submission to job creation was over a second.
//!
//! Bulk work therefore runs on the blocking threads of a runtime of its
//! own, named `ingest-bulk`, whose threads lower their own priority to
//! nice [`BULK_NICE`] when they start (`setpriority` on the thread; Linux
//! keeps a nice value per thread). They still use every idle cycle; they
//! only yield the CPU when coordination wants it. Where the priority cannot
//! be lowered, the threads run at the worker's own, and the log says so
//! once.
//!
//! ```no_run
//! # async fn demo() -> Result<(), tokio::task::JoinError> {
//! let sum = ingest_worker::bulk::spawn(|| (0u64..1000).sum::<u64>()).await?;
//! assert_eq!(sum, 499_500);
//! # Ok(())
//! # }
//! ```

use std::sync::OnceLock;

use tokio::runtime::{Builder, Runtime};
use tokio::task::JoinHandle;

/// The nice value of bulk threads: their share of a contended core is
/// about a tenth of a thread at the worker's own priority (weights 110
/// against 1024).
pub const BULK_NICE: i32 = 10;

/// The most bulk threads at once (tokio's default for blocking threads).
const MAX_THREADS: usize = 512;

static RUNTIME: OnceLock<Option<Runtime>> = OnceLock::new();

/// Starts `f` on a bulk thread at once (like
/// [`tokio::task::spawn_blocking`]); the handle yields its result, or the
/// [`JoinError`](tokio::task::JoinError) of a closure that panicked.
pub fn spawn<T, F>(f: F) -> JoinHandle<T>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    match runtime() {
        Some(rt) => rt.spawn_blocking(f),
        None => tokio::task::spawn_blocking(f),
    }
}

/// The bulk runtime, built on first use; `None` when it cannot be built
/// (bulk work then runs on the caller's runtime's blocking threads).
fn runtime() -> Option<&'static Runtime> {
    RUNTIME
        .get_or_init(|| {
            let built = Builder::new_multi_thread()
                .worker_threads(1)
                .max_blocking_threads(MAX_THREADS)
                .thread_name("ingest-bulk")
                .on_thread_start(lower_priority)
                .build();
            match built {
                Ok(rt) => Some(rt),
                Err(e) => {
                    tracing::warn!(error = %ingest_protocol::bounded(&e), "cannot start the bulk threads; bulk work shares the worker's threads");
                    None
                }
            }
        })
        .as_ref()
}

/// Lowers the calling thread's priority to [`BULK_NICE`] (never raises it).
fn lower_priority() {
    static WARNED: OnceLock<()> = OnceLock::new();
    let tid = rustix::thread::gettid();
    let now = rustix::process::getpriority_process(Some(tid)).unwrap_or(0);
    if now >= BULK_NICE {
        return;
    }
    if let Err(e) = rustix::process::setpriority_process(Some(tid), BULK_NICE) {
        WARNED.get_or_init(|| {
            tracing::warn!(error = %ingest_protocol::bounded(&e), nice = BULK_NICE, "cannot lower the priority of bulk threads; downloads and stores compete with coordination for the CPU");
        });
    }
}

/// The nice value of the calling thread (tests).
#[cfg(test)]
fn current_nice() -> i32 {
    rustix::process::getpriority_process(Some(rustix::thread::gettid())).unwrap_or(i32::MIN)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn bulk_work_runs_at_a_lower_priority_than_the_caller() {
        let caller = current_nice();
        let (nice, name) = spawn(|| {
            let name = std::thread::current().name().map(str::to_owned);
            (current_nice(), name)
        })
        .await
        .expect("the closure does not panic");
        assert_eq!(name.as_deref(), Some("ingest-bulk"));
        assert!(
            nice >= BULK_NICE.max(caller),
            "bulk nice {nice}, caller {caller}"
        );
        assert!(nice > caller || caller >= BULK_NICE);
        assert_eq!(current_nice(), caller, "the caller's priority is unchanged");
    }

    #[tokio::test]
    async fn a_panic_in_bulk_work_is_an_error_not_a_crash() {
        let r = spawn(|| -> u32 { panic!("boom") }).await;
        assert!(r.is_err());
    }
}
