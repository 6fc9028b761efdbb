//! `ingest verify` on a data directory: the log alone (not the engine, so a
//! damaged or truncated log is reported, not refused), read-only copies
//! verified through a private temporary copy, and the log's end compared
//! with the last checkpoint it can see outside itself (the ZooKeeper
//! checkpoint, the newest snapshot).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::Args;
use ingest_config::zk::ZkArgs;
use ingest_engine::engine::log_dir;
use ingest_engine::EngineConfig;
use ingest_events::Log;
use ingest_protocol::api::{ProblemView, Verified};

use super::output::print_verified;

/// `ingest verify`'s options.
#[derive(Debug, Clone, Args)]
pub struct VerifyArgs {
    /// Where ZooKeeper is: when given (or INGEST_ZK is set), the log's end is
    /// also compared with the projection checkpoint (`/ingest-engine/checkpoint`),
    /// which names the last position the live tree holds; a log shorter than
    /// it has lost events.
    #[command(flatten)]
    pub zk: ZkArgs,
}

/// Runs `ingest verify` on `data_dir`; the exit code (0 verifies, 1 problems).
///
/// # Errors
/// A log that cannot be opened at all (damaged files: the message names the
/// directory and what to do), or a read-only log that cannot be copied.
pub fn run(data_dir: &Path, args: &VerifyArgs) -> Result<i32> {
    let config = EngineConfig::new(data_dir);
    let dir = log_dir(data_dir);
    // sled writes while it opens; a data directory this process may not
    // write (an auditor's read-only copy of a backup) is verified through a
    // private copy, and the original is never written.
    let copy = if read_only(&dir) {
        let copy = PrivateCopy::of(&dir).with_context(|| {
            format!(
                "the event log in {} is read-only and cannot be copied to verify it",
                dir.display()
            )
        })?;
        eprintln!(
            "note: {} is read-only; verifying a private copy (nothing is written to it)",
            dir.display()
        );
        Some(copy)
    } else {
        None
    };
    let opened = copy.as_ref().map_or(dir.as_path(), |c| c.log.as_path());
    let log = Log::open(opened, &config.log)
        .with_context(|| format!("cannot verify the data directory {}", data_dir.display()))?;
    let (head, _) = log.head();
    let bar = indicatif::ProgressBar::new(head);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "verifying {bar:40} {pos}/{len} events, {per_sec}, {eta} left",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let full = ingest_engine::audit::verify(&log, data_dir, None, |p| {
        if p % 4096 == 0 {
            bar.set_position(p);
        }
    })
    .with_context(|| format!("cannot verify the data directory {}", data_dir.display()))?;
    bar.finish_and_clear();
    let mut verified = super::backend::verified(full);
    // The audit-read indexes (history by actor and collection): checked
    // here, where the log is opened alone, not by `GET /verify`, whose
    // appends go on while it reads.
    // Only over a chain that verified: over a damaged one the records the
    // check reads are the problem already reported.
    let index_problems = if verified.problems.is_empty() {
        log.audit_index_problems()
            .unwrap_or_else(|e| vec![format!("could not be checked: {e}")])
    } else {
        Vec::new()
    };
    let shown = index_problems.len().min(20);
    for message in &index_problems[..shown] {
        verified.problems.push(ingest_protocol::api::ProblemView {
            position: 0,
            message: format!("audit index: {}", ingest_protocol::cut(message, 400)),
        });
    }
    if index_problems.len() > shown {
        verified.problems.push(ingest_protocol::api::ProblemView {
            position: 0,
            message: format!(
                "audit index: {} more problem(s) not shown",
                index_problems.len() - shown
            ),
        });
    }
    if args.zk.zk.is_some() {
        compare_with_zookeeper(&log, &args.zk, &mut verified);
    }
    verified.problems.sort_by_key(|p| p.position);
    if verified.first_cause.is_none() {
        verified.first_cause = verified.problems.first().cloned();
    }
    drop(log);
    // Kept for `status`, which says what the last verify found; not for a
    // private copy of a read-only directory, which is never written.
    if copy.is_none() {
        if let Err(e) = ingest_engine::verified::remember(data_dir, &verified, chrono::Utc::now()) {
            eprintln!("note: the result is not kept for `ingest status`: {e}");
        }
    }
    drop(copy);
    Ok(print_verified(&verified))
}

/// Adds a problem when the ZooKeeper checkpoint is past the log's end, or
/// names a record this log holds with another hash.
fn compare_with_zookeeper(log: &Log, zk: &ZkArgs, verified: &mut Verified) {
    let config = match zk.require() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("note: not compared with the ZooKeeper checkpoint: {e}");
            return;
        }
    };
    let read = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
        .and_then(|rt| {
            rt.block_on(async {
                let client = ingest_projections::zk::connect(&config).await?;
                let checkpoint =
                    ingest_projections::sink::read_checkpoint(&client, &config).await?;
                anyhow::Ok(checkpoint)
            })
        });
    let where_ = format!("{} on {}", config.root, config.hosts);
    let checkpoint = match read {
        Ok(Some((checkpoint, _))) => checkpoint,
        Ok(None) => {
            println!("note: no projection checkpoint under {where_}; nothing to compare");
            return;
        }
        Err(e) => {
            eprintln!("note: not compared with the ZooKeeper checkpoint under {where_}: {e:#}");
            return;
        }
    };
    let (head, _) = log.head();
    let at = checkpoint.position;
    if at > head {
        verified.problems.push(ProblemView {
            position: head + 1,
            message: format!(
                "positions {}..={at} are missing: the log ends at {head}, but the ZooKeeper checkpoint under {where_} says the live tree holds the log up to {at} (a truncated log, or a data directory restored from an older copy)",
                head + 1
            ),
        });
        return;
    }
    if at == 0 {
        return;
    }
    match log.read_one(at) {
        Ok(record) if record.envelope.hash == checkpoint.hash => println!(
            "ok: the ZooKeeper checkpoint under {where_} (position {at}) matches this log"
        ),
        Ok(record) => verified.problems.push(ProblemView {
            position: at,
            message: format!(
                "the ZooKeeper checkpoint under {where_} holds position {at} with hash {}, but this log's record {at} hashes to {}: the live tree was projected from another log",
                hex::encode(checkpoint.hash),
                hex::encode(record.envelope.hash)
            ),
        }),
        // The chain check already names an unreadable record.
        Err(_) => {}
    }
}

/// Whether the log's directory or a file in it is not to be written: its
/// permission bits say read-only (an auditor's copy; root would write it
/// anyway), or the kernel refuses this process a write (`access(W_OK)`: a
/// read-only mount, whose files keep their write bits, answers `EROFS`).
/// Nothing is opened for writing to find out.
fn read_only(dir: &Path) -> bool {
    let Ok(entries) = fs::read_dir(dir) else {
        return false;
    };
    let unwritable = |path: &Path| {
        fs::metadata(path).is_ok_and(|m| m.permissions().readonly())
            || rustix::fs::access(path, rustix::fs::Access::WRITE_OK).is_err()
    };
    unwritable(dir) || entries.flatten().any(|e| unwritable(&e.path()))
}

/// A writable copy of a log directory in the temporary directory, removed
/// on drop.
struct PrivateCopy {
    root: PathBuf,
    log: PathBuf,
}

impl PrivateCopy {
    fn of(dir: &Path) -> io::Result<PrivateCopy> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let root =
            std::env::temp_dir().join(format!("ingest-verify-{}-{nanos}", std::process::id()));
        let log = root.join("log");
        let copy = PrivateCopy { root, log };
        copy_tree(dir, &copy.log)?;
        Ok(copy)
    }
}

impl Drop for PrivateCopy {
    fn drop(&mut self) {
        if let Err(e) = fs::remove_dir_all(&self.root) {
            eprintln!(
                "note: could not remove the private copy {}: {e}",
                self.root.display()
            );
        }
    }
}

/// Copies `from` into `to` (created), every copy writable by this process.
fn copy_tree(from: &Path, to: &Path) -> io::Result<()> {
    fs::create_dir_all(to)?;
    for entry in fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_tree(&entry.path(), &target)?;
        } else {
            fs::copy(entry.path(), &target)?;
            let mut permissions = fs::metadata(&target)?.permissions();
            #[allow(clippy::permissions_set_readonly_false)]
            permissions.set_readonly(false);
            fs::set_permissions(&target, permissions)?;
        }
    }
    Ok(())
}
