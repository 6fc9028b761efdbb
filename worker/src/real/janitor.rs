//! The janitor: removes the working files of jobs that no longer need them.
//!
//! The Notify step removes a job's working directory (`<work>/<bid>/<jid>`)
//! when the job completes. A Failed job keeps its files so that an admin
//! requeue can resume, and nothing else removes them; the janitor does.
//! Every `interval` it walks the job directories of working storage (only
//! names that parse as [`Bid`] / [`Jid`]: the outbox and anything else is
//! left alone), reads `/jobs/<jid>/status` through the worker's ZooKeeper
//! session and removes the directory when the job is
//!
//! - `Deleted` (an admin deleted the job or its batch),
//! - `Completed` (a leftover: e.g. a crash after the callback, before the
//!   removal), or
//! - gone from ZooKeeper (cleanup removed its finished batch);
//!
//! then removes the `<bid>` directories left empty. A job in any other state
//! (Failed, Held, active, or a status it cannot read) keeps its files.
//! Symbolic links are never followed: a link in place of a batch or job
//! directory is skipped, a link inside a removed job directory is removed
//! itself, never its target.
//!
//! [`sweep`] is the pure core (the status lookup is a closure), so that tests
//! drive it without ZooKeeper; [`Janitor::run`] runs it in a worker process
//! until shutdown.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use ingest_events::{Bid, Jid};
use ingest_projections::layout;
use tokio_util::sync::CancellationToken;
use zookeeper_client as zk;

use crate::session::Session;
use ingest_protocol::node::{decode, JobStatusNode};

/// How often the janitor of the real steps sweeps working storage.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(60);

/// The job statuses whose working files are removed.
const REMOVABLE: [&str; 2] = ["Deleted", "Completed"];

/// What one sweep did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SweepReport {
    /// The jids whose working directories were removed.
    pub removed: Vec<String>,
    /// How many job directories were kept (the job still needs them, or its
    /// status could not be read).
    pub kept: usize,
    /// The bytes the removed directories held (regular files).
    pub freed: u64,
    /// The `<bid>` directories removed because they were empty.
    pub removed_batches: Vec<String>,
    /// What went wrong (each also logged at WARN).
    pub errors: Vec<String>,
}

/// The job directories, the batch directories and the listing's errors.
type Listing = (Vec<JobDir>, Vec<String>, Vec<String>);

/// A job directory found in working storage.
#[derive(Debug, Clone)]
struct JobDir {
    bid: String,
    jid: String,
    path: PathBuf,
}

/// Sweeps `work` once: removes the directory of every job whose status
/// (`status_of(jid)`: `Ok(Some(status))`, `Ok(None)` when the job's node is
/// gone, `Err` when it cannot be read) is `Deleted` or `Completed` or that is
/// gone, then the `<bid>` directories left empty. Removals are logged at
/// INFO, errors at WARN.
pub async fn sweep<F, Fut, E>(work: &Path, status_of: F) -> SweepReport
where
    F: Fn(&str) -> Fut,
    Fut: Future<Output = Result<Option<String>, E>>,
    E: std::fmt::Display,
{
    let mut report = SweepReport::default();
    let root = work.to_path_buf();
    let listed = match tokio::task::spawn_blocking(move || list_jobs(&root)).await {
        Ok(listed) => listed.map_err(|e| e.to_string()),
        Err(e) => Err(format!("the listing of working storage failed: {e}")),
    };
    let (jobs, bids) = match listed {
        Ok((jobs, bids, errors)) => {
            for e in &errors {
                tracing::warn!(error = %ingest_protocol::bounded(&e), "janitor");
            }
            report.errors = errors;
            (jobs, bids)
        }
        Err(e) => {
            tracing::warn!(error = %ingest_protocol::bounded(&e), "janitor");
            report.errors.push(e);
            return report;
        }
    };
    for job in jobs {
        let status = match status_of(&job.jid).await {
            Ok(s) => s,
            Err(e) => {
                let e = format!("the status of {} cannot be read: {e}", job.jid);
                tracing::warn!(jid = %job.jid, error = %ingest_protocol::bounded(&e), "janitor keeps the job's files");
                report.errors.push(e);
                report.kept += 1;
                continue;
            }
        };
        let why = match status.as_deref() {
            None => "gone",
            Some(s) if REMOVABLE.contains(&s) => s,
            Some(_) => {
                report.kept += 1;
                continue;
            }
        };
        let path = job.path.clone();
        let removed = crate::bulk::spawn(move || remove_job(&path).map_err(|e| e.to_string()))
            .await
            .unwrap_or_else(|e| Err(format!("the removal failed: {e}")));
        match removed {
            Ok(bytes) => {
                tracing::info!(
                    jid = %job.jid,
                    bid = %job.bid,
                    status = why,
                    bytes,
                    dir = %job.path.display(),
                    "janitor removed a job's working files"
                );
                report.freed += bytes;
                report.removed.push(job.jid);
            }
            Err(e) => {
                let e = format!("{}: {e}", job.path.display());
                tracing::warn!(jid = %job.jid, error = %ingest_protocol::bounded(&e), "janitor cannot remove a job's working files");
                report.errors.push(e);
                report.kept += 1;
            }
        }
    }
    let root = work.to_path_buf();
    let emptied = tokio::task::spawn_blocking(move || remove_empty_batches(&root, &bids))
        .await
        .unwrap_or_else(|e| (Vec::new(), vec![format!("the batch directories: {e}")]));
    for bid in &emptied.0 {
        tracing::info!(bid = %bid, "janitor removed an empty batch directory");
    }
    for e in &emptied.1 {
        tracing::warn!(error = %ingest_protocol::bounded(&e), "janitor");
    }
    report.removed_batches = emptied.0;
    report.errors.extend(emptied.1);
    report
}

/// The job directories under `work` (real directories whose names parse as
/// ids, symlinks skipped), the batch directories seen and what could not be
/// read; `Err` when `work` cannot be listed.
fn list_jobs(work: &Path) -> Result<Listing, JanitorError> {
    let mut errors = Vec::new();
    let mut jobs = Vec::new();
    let mut bids = Vec::new();
    let entries = match std::fs::read_dir(work) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((jobs, bids, errors)),
        Err(source) => {
            return Err(JanitorError::List {
                dir: work.to_path_buf(),
                source,
            })
        }
    };
    for bid_entry in entries {
        let Some((bid, bid_path)) = id_dir::<Bid>(bid_entry, &mut errors) else {
            continue;
        };
        match std::fs::read_dir(&bid_path) {
            Ok(job_entries) => {
                for job_entry in job_entries {
                    if let Some((jid, path)) = id_dir::<Jid>(job_entry, &mut errors) {
                        jobs.push(JobDir {
                            bid: bid.clone(),
                            jid,
                            path,
                        });
                    }
                }
            }
            Err(e) => errors.push(format!("cannot list {}: {e}", bid_path.display())),
        }
        bids.push(bid);
    }
    jobs.sort_by(|a, b| a.jid.cmp(&b.jid));
    bids.sort();
    Ok((jobs, bids, errors))
}

/// The entry's name and path when it is a real directory (not a symlink)
/// named like an id of `T`.
fn id_dir<T: std::str::FromStr>(
    entry: std::io::Result<std::fs::DirEntry>,
    errors: &mut Vec<String>,
) -> Option<(String, PathBuf)> {
    let entry = match entry {
        Ok(e) => e,
        Err(e) => {
            errors.push(format!("cannot read a directory entry: {e}"));
            return None;
        }
    };
    let name = entry.file_name().to_str()?.to_string();
    name.parse::<T>().ok()?;
    // `file_type` does not follow symlinks.
    match entry.file_type() {
        Ok(t) if t.is_dir() => Some((name, entry.path())),
        Ok(_) => None,
        Err(e) => {
            errors.push(format!("cannot stat {}: {e}", entry.path().display()));
            None
        }
    }
}

/// What the janitor could not do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum JanitorError {
    /// Working storage could not be listed.
    #[error("cannot list {}: {source}", dir.display())]
    List {
        /// The directory.
        dir: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A job directory became something else.
    #[error("no longer a directory; left alone")]
    NotADirectory,
    /// A job directory could not be examined.
    #[error("cannot stat: {0}")]
    Stat(#[source] std::io::Error),
    /// A job directory could not be removed.
    #[error("cannot remove: {0}")]
    Remove(#[source] std::io::Error),
    /// A name that is not a job id (never one the sweep found).
    #[error("{0:?} is not a job id")]
    NotAJid(String),
    /// A job's status node does not decode.
    #[error("{jid}: {detail}")]
    Undecodable {
        /// The job.
        jid: Jid,
        /// Why.
        detail: String,
    },
    /// A job's status node without a status.
    #[error("{0} has no status")]
    NoStatus(String),
    /// ZooKeeper did not answer a read.
    #[error("{path}: {source}")]
    Zk {
        /// The node read.
        path: String,
        /// Why.
        source: zk::Error,
    },
    /// The tree has no `/jobs`.
    #[error("/jobs is missing: the tree is not there")]
    NoJobs,
}

/// Removes a job directory (never following symlinks) and gives the bytes
/// its regular files held.
fn remove_job(path: &Path) -> Result<u64, JanitorError> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_dir() => {}
        Ok(_) => return Err(JanitorError::NotADirectory),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(JanitorError::Stat(e)),
    }
    let bytes = tree_bytes(path);
    match std::fs::remove_dir_all(path) {
        Ok(()) => Ok(bytes),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(bytes),
        Err(e) => Err(JanitorError::Remove(e)),
    }
}

/// The bytes of the regular files under `dir`, not following symlinks;
/// unreadable parts count as nothing.
fn tree_bytes(dir: &Path) -> u64 {
    let mut total = 0u64;
    let mut pending = vec![dir.to_path_buf()];
    while let Some(d) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for entry in entries.flatten() {
            match entry.file_type() {
                Ok(t) if t.is_dir() => pending.push(entry.path()),
                Ok(t) if t.is_file() => {
                    total += entry.metadata().map(|m| m.len()).unwrap_or(0);
                }
                _ => {}
            }
        }
    }
    total
}

/// Removes the batch directories in `bids` that are empty; gives the removed
/// ones and the errors.
fn remove_empty_batches(work: &Path, bids: &[String]) -> (Vec<String>, Vec<String>) {
    let mut removed = Vec::new();
    let mut errors = Vec::new();
    for bid in bids {
        let dir = work.join(bid);
        let empty = match std::fs::read_dir(&dir) {
            Ok(mut entries) => entries.next().is_none(),
            Err(_) => false,
        };
        if !empty {
            continue;
        }
        // `remove_dir` refuses a directory that filled up in between.
        match std::fs::remove_dir(&dir) {
            Ok(()) => removed.push(bid.clone()),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::DirectoryNotEmpty
                ) => {}
            Err(e) => errors.push(format!("cannot remove {}: {e}", dir.display())),
        }
    }
    (removed, errors)
}

/// A job's status in ZooKeeper: `Ok(None)` when the job's node is gone,
/// `Ok(Some(""))` when the node is there without a status (being created or
/// removed: kept). A missing `/jobs` is an error, not "every job is gone".
///
/// # Errors
/// [`JanitorError`]: ZooKeeper errors and unreadable status nodes.
pub async fn zk_status(client: &zk::Client, jid: &str) -> Result<Option<String>, JanitorError> {
    let jid: Jid = jid
        .parse()
        .map_err(|_| JanitorError::NotAJid(ingest_protocol::cut(jid, 64).into_owned()))?;
    let status_path = layout::job_status(jid);
    match client.get_data(&status_path).await {
        Ok((data, _)) => {
            let node: JobStatusNode =
                decode("/jobs/JID/status", &data).map_err(|e| JanitorError::Undecodable {
                    jid,
                    detail: e.to_string(),
                })?;
            Some(node.status)
                .filter(|s| !s.is_empty())
                .map(Some)
                .ok_or(JanitorError::NoStatus(status_path))
        }
        Err(zk::Error::NoNode) => {
            let exists = |path: String| async move {
                client
                    .check_stat(&path)
                    .await
                    .map(|s| s.is_some())
                    .map_err(|source| JanitorError::Zk { path, source })
            };
            if exists(layout::job(jid)).await? {
                Ok(Some(String::new()))
            } else if exists(layout::JOBS.to_string()).await? {
                Ok(None)
            } else {
                Err(JanitorError::NoJobs)
            }
        }
        Err(source) => Err(JanitorError::Zk {
            path: status_path,
            source,
        }),
    }
}

/// Sweeps working storage on a timer in a worker process.
#[derive(Debug, Clone)]
pub struct Janitor {
    work_dir: PathBuf,
    interval: Duration,
    deliveries: Option<PathBuf>,
}

impl Janitor {
    /// A janitor of `work_dir` sweeping every `interval`.
    pub fn new(work_dir: PathBuf, interval: Duration) -> Janitor {
        Janitor {
            work_dir,
            interval,
            deliveries: None,
        }
    }

    /// Also removes the expired containers of the delivery area `dir`
    /// ([`super::assembly::sweep_expired`]) on every sweep.
    pub fn with_deliveries(mut self, dir: PathBuf) -> Janitor {
        self.deliveries = Some(dir);
        self
    }

    /// The working storage it sweeps.
    pub fn work_dir(&self) -> &Path {
        &self.work_dir
    }

    /// The time between sweeps.
    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// One sweep, reading statuses through `client`.
    pub async fn sweep_with(&self, client: &zk::Client) -> SweepReport {
        sweep(&self.work_dir, |jid: &str| {
            let jid = jid.to_string();
            let client = client.clone();
            async move { zk_status(&client, &jid).await }
        })
        .await
    }

    /// Sweeps every `interval` (the first right away) with the worker's
    /// session until `stop` is cancelled. No sweep runs while the session
    /// is not connected.
    pub async fn run(self: Arc<Self>, session: Arc<Session>, stop: CancellationToken) {
        tracing::debug!(dir = %self.work_dir.display(), interval = ?self.interval, "janitor started");
        while !stop.is_cancelled() {
            if let Some(dir) = &self.deliveries {
                let (removed, freed) =
                    super::assembly::sweep_expired(dir, chrono::Utc::now().timestamp());
                if removed > 0 {
                    tracing::info!(removed, freed, "janitor: expired deliveries removed");
                }
            }
            let once = async {
                match session.client().await {
                    Ok(client)
                        if matches!(
                            client.state(),
                            zk::SessionState::SyncConnected | zk::SessionState::ConnectedReadOnly
                        ) =>
                    {
                        let report = self.sweep_with(&client).await;
                        if !report.removed.is_empty() || !report.errors.is_empty() {
                            tracing::debug!(
                                removed = report.removed.len(),
                                kept = report.kept,
                                freed = report.freed,
                                errors = report.errors.len(),
                                "janitor sweep"
                            );
                        }
                    }
                    Ok(_) => tracing::debug!("janitor: the session is not connected; no sweep"),
                    Err(e) => {
                        tracing::warn!(error = %ingest_protocol::bounded(format_args!("{e:#}")), "janitor: no ZooKeeper session");
                    }
                }
            };
            tokio::select! {
                () = once => {}
                () = stop.cancelled() => break,
            }
            tokio::select! {
                () = tokio::time::sleep(self.interval) => {}
                () = stop.cancelled() => {}
            }
        }
        tracing::debug!("janitor stopped");
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Mutex;

    use super::*;

    const BID: &str = "bid0000000001";
    const OTHER_BID: &str = "bid0000000002";

    fn job(work: &Path, bid: &str, jid: &str, bytes: usize) -> PathBuf {
        let dir = work.join(bid).join(jid);
        std::fs::create_dir_all(dir.join("producer")).expect("mkdir");
        std::fs::write(dir.join("producer").join("file.txt"), vec![b'x'; bytes]).expect("write");
        dir
    }

    type Statuses = HashMap<&'static str, Result<Option<String>, String>>;

    async fn run_sweep(
        work: &Path,
        statuses: &Statuses,
        asked: &Mutex<Vec<String>>,
    ) -> SweepReport {
        sweep(work, |jid: &str| {
            asked.lock().expect("lock").push(jid.to_string());
            let s = statuses
                .get(jid)
                .cloned()
                .unwrap_or_else(|| Err(format!("unexpected {jid}")));
            async move { s }
        })
        .await
    }

    #[tokio::test]
    async fn only_deleted_completed_and_gone_jobs_lose_their_files() {
        let tmp = tempfile::tempdir().expect("tmp");
        let work = tmp.path().join("work");
        let outside = tmp.path().join("outside");
        std::fs::create_dir_all(outside.join("jid0000000099")).expect("mkdir");
        std::fs::write(outside.join("precious"), b"keep").expect("write");
        std::fs::write(outside.join("jid0000000099").join("f"), b"keep").expect("write");

        let deleted = job(&work, BID, "jid0000000001", 10);
        let completed = job(&work, BID, "jid0000000002", 20);
        let failed = job(&work, BID, "jid0000000003", 30);
        let held = job(&work, BID, "jid0000000004", 40);
        let active = job(&work, BID, "jid0000000005", 5);
        let gone = job(&work, OTHER_BID, "jid0000000006", 7);
        let unreadable = job(&work, BID, "jid0000000007", 1);
        // A symlink inside a removed job: the link goes, not its target.
        #[cfg(unix)]
        std::os::unix::fs::symlink(&outside, deleted.join("link")).expect("symlink");
        // Symlinks in place of a batch or job directory are not followed.
        #[cfg(unix)]
        {
            std::os::unix::fs::symlink(&outside, work.join("bid0000000003")).expect("symlink");
            std::os::unix::fs::symlink(
                outside.join("jid0000000099"),
                work.join(BID).join("jid0000000099"),
            )
            .expect("symlink");
        }
        // Not ids: left alone, never asked about.
        std::fs::create_dir_all(work.join("outbox").join("jid0000000010")).expect("mkdir");
        std::fs::create_dir_all(work.join(BID).join("notajob")).expect("mkdir");
        std::fs::write(work.join(BID).join("jid0000000011"), b"a file").expect("write");
        std::fs::create_dir_all(work.join("bid0000000009")).expect("empty batch dir");

        let statuses: Statuses = HashMap::from([
            ("jid0000000001", Ok(Some("Deleted".to_string()))),
            ("jid0000000002", Ok(Some("Completed".to_string()))),
            ("jid0000000003", Ok(Some("Failed".to_string()))),
            ("jid0000000004", Ok(Some("Held".to_string()))),
            ("jid0000000005", Ok(Some("Downloading".to_string()))),
            ("jid0000000006", Ok(None)),
            ("jid0000000007", Err("connection loss".to_string())),
        ]);
        let asked = Mutex::new(Vec::new());
        let report = run_sweep(&work, &statuses, &asked).await;

        assert_eq!(
            report.removed,
            ["jid0000000001", "jid0000000002", "jid0000000006"]
        );
        assert_eq!(report.kept, 4);
        assert_eq!(report.freed, 10 + 20 + 7);
        assert_eq!(report.errors.len(), 1, "{:?}", report.errors);
        assert!(report.errors[0].contains("connection loss"));
        assert_eq!(report.removed_batches, [OTHER_BID, "bid0000000009"]);
        let mut asked = asked.into_inner().expect("lock");
        asked.sort();
        assert_eq!(
            asked,
            (1..=7).map(|n| format!("jid{n:010}")).collect::<Vec<_>>()
        );

        assert!(!deleted.exists() && !completed.exists() && !gone.exists());
        for kept in [&failed, &held, &active, &unreadable] {
            assert!(
                kept.join("producer").join("file.txt").is_file(),
                "{}",
                kept.display()
            );
        }
        assert!(!work.join(OTHER_BID).exists());
        assert!(!work.join("bid0000000009").exists());
        assert!(work.join(BID).is_dir());
        assert!(work.join("outbox").join("jid0000000010").is_dir());
        assert!(work.join(BID).join("notajob").is_dir());
        assert!(work.join(BID).join("jid0000000011").is_file());
        assert!(outside.join("precious").is_file());
        assert!(outside.join("jid0000000099").join("f").is_file());
        #[cfg(unix)]
        {
            assert!(work.join("bid0000000003").is_symlink());
            assert!(work.join(BID).join("jid0000000099").is_symlink());
        }

        // A second sweep finds nothing more to remove.
        let again = run_sweep(&work, &statuses, &Mutex::new(Vec::new())).await;
        assert!(again.removed.is_empty());
        assert_eq!(again.kept, 4);
    }

    #[tokio::test]
    async fn a_missing_work_dir_is_an_empty_sweep() {
        let tmp = tempfile::tempdir().expect("tmp");
        let report = sweep(&tmp.path().join("nothing"), |_: &str| async {
            Ok::<_, String>(None)
        })
        .await;
        assert_eq!(report, SweepReport::default());
    }

    #[tokio::test]
    async fn the_janitor_stops_on_shutdown() {
        let tmp = tempfile::tempdir().expect("tmp");
        let janitor = Arc::new(Janitor::new(tmp.path().into(), Duration::from_secs(3600)));
        assert_eq!(janitor.interval(), Duration::from_secs(3600));
        assert_eq!(janitor.work_dir(), tmp.path());
        // Nothing listens there: the session never comes, and the janitor
        // must still stop when told.
        let zk = ingest_projections::ZkConfig::new("127.0.0.1:1".to_string());
        let session = Arc::new(Session::new(zk));
        let stop = CancellationToken::new();
        let task = tokio::spawn(janitor.run(session, stop.clone()));
        tokio::time::sleep(Duration::from_millis(200)).await;
        stop.cancel();
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("the janitor stops on shutdown")
            .expect("join");
    }
}
