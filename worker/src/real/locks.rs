//! Object-level coordination, in the lock forms Merritt's own services use,
//! so an `ingest` worker, another `ingest` worker and a Merritt worker never
//! write one object at once:
//!
//! - `/locks/localid/<lid>_<collection>`: taken by Processing before the
//!   ark is chosen and held through Storing to the end of Recording, so the
//!   submissions of one local id are ingested one after the other and the
//!   second finds the first's ark (a new version, not a second object);
//! - `/locks/storage/ark_a_b`: held while Storing writes the object;
//! - `/locks/inventory/ark_a_b`: held while Recording records it.
//!
//! Every lock is an ephemeral node (it goes with the session that made it)
//! whose data is the holding job's id. A step that finds a lock held by
//! another waits: it watches the node for a while, records one retry on its
//! job saying what it waits for, and, if the lock is still held, leaves the
//! job in its state ([`StepResult::Wait`]) to be looked at again; it never
//! fails the job for it. A local-id lock whose holder job is no longer in
//! Processing, Storing or Recording (it failed, was deleted, or its worker
//! lost its report) is stale and is taken over; a lock whose data is not a
//! job id (Merritt's own, empty) is always waited for.

use std::time::Duration;

use ingest_events::Jid;
use ingest_projections::layout;
use ingest_protocol::node::{decode, JobStatusNode};
use zookeeper_client as zk;

use super::fetch::RetryPolicy;
use crate::step::{JobCtx, StepResult};

/// The states in which a job may hold its local-id lock.
const HOLDING_STATES: [&str; 3] = ["Processing", "Storing", "Recording"];

/// Why a lock could not be taken now.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LockError {
    /// Someone else holds it: wait.
    #[error("{path} is held by {holder}")]
    Held {
        /// The lock node.
        path: String,
        /// Who holds it (a job id, or `another service` for a lock without
        /// one).
        holder: String,
    },
    /// The lock's parent is missing (the projection creates it at start):
    /// wait.
    #[error("{path} cannot be taken yet: its parent does not exist")]
    NoParent {
        /// The lock node.
        path: String,
    },
    /// ZooKeeper did not answer as expected: wait and try again.
    #[error("cannot take {path}: {message}")]
    Zk {
        /// The lock node.
        path: String,
        /// The client's message.
        message: String,
    },
}

/// Whether a held lock may be stale.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holder {
    /// A lock held across steps (local id): stale when its holder job has
    /// left the holding states.
    AcrossSteps,
    /// A lock held within one step (storage, inventory): never stale while
    /// its ephemeral node exists.
    WithinStep,
}

/// The local-id locks of a job, sorted (every taker takes them in the same
/// order, so two jobs never wait for each other).
pub fn localid_locks(collection: &str, local_ids: &[String]) -> Vec<String> {
    let mut paths: Vec<String> = local_ids
        .iter()
        .map(|lid| layout::localid_lock(lid, collection))
        .collect();
    paths.sort();
    paths.dedup();
    paths
}

/// Takes `path` for `jid` once.
///
/// # Errors
/// [`LockError`]: held by another, no parent, or a ZooKeeper error.
pub async fn take(
    client: &zk::Client,
    path: &str,
    jid: &str,
    holder: Holder,
) -> Result<(), LockError> {
    let zk_error = |e: zk::Error| LockError::Zk {
        path: path.to_string(),
        message: e.to_string(),
    };
    let ephemeral = ingest_projections::acl::lock_options();
    // A stale lock removed, or a lock released between create and read,
    // costs a round.
    for _ in 0..3 {
        match client.create(path, jid.as_bytes(), &ephemeral).await {
            Ok(_) => return Ok(()),
            Err(zk::Error::NoNode) => {
                return Err(LockError::NoParent {
                    path: path.to_string(),
                })
            }
            Err(zk::Error::NodeExists) => {}
            Err(e) => return Err(zk_error(e)),
        }
        let (data, stat) = match client.get_data(path).await {
            Ok(found) => found,
            Err(zk::Error::NoNode) => continue,
            Err(e) => return Err(zk_error(e)),
        };
        let owner = String::from_utf8_lossy(&data).trim().to_string();
        if owner == jid {
            return Ok(());
        }
        let is_jid = owner.len() <= 32
            && owner.starts_with("jid")
            && owner[3..].chars().all(|c| c.is_ascii_digit());
        if !is_jid {
            return Err(LockError::Held {
                path: path.to_string(),
                holder: "another service".to_string(),
            });
        }
        // A holder that is no job id has no status node (the projection
        // writes only ids): it moved on, as one whose node is gone.
        let moved_on = holder == Holder::AcrossSteps
            && match owner.parse::<Jid>() {
                Ok(owner) => !holds(client, owner).await.map_err(zk_error)?,
                Err(_) => true,
            };
        if moved_on {
            tracing::info!(%path, holder = %owner, %jid, "the lock's holder job has moved on; the stale lock is taken over");
            match client.delete(path, Some(stat.version)).await {
                Ok(()) | Err(zk::Error::NoNode | zk::Error::BadVersion) => continue,
                Err(e) => return Err(zk_error(e)),
            }
        }
        return Err(LockError::Held {
            path: path.to_string(),
            holder: owner,
        });
    }
    Err(LockError::Held {
        path: path.to_string(),
        holder: "others, in turn".to_string(),
    })
}

/// Whether job `jid` is in a state that holds its local-id lock.
async fn holds(client: &zk::Client, jid: Jid) -> Result<bool, zk::Error> {
    match client.get_data(&layout::job_status(jid)).await {
        Ok((data, _)) => Ok(decode::<JobStatusNode>("/jobs/JID/status", &data)
            .map(|s| HOLDING_STATES.contains(&s.status.as_str()))
            // A status no one can read is not ours to judge: keep waiting.
            .unwrap_or(true)),
        Err(zk::Error::NoNode) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Releases `path` if `jid` holds it; anything else is left alone. Errors
/// are logged: the ephemeral node goes with the session anyway.
pub async fn release(client: &zk::Client, path: &str, jid: &str) {
    let found = match client.get_data(path).await {
        Ok(found) => found,
        Err(zk::Error::NoNode) => return,
        Err(e) => {
            tracing::warn!(%path, %jid, error = %ingest_protocol::bounded(&e), "cannot read the lock to release it");
            return;
        }
    };
    if String::from_utf8_lossy(&found.0).trim() != jid {
        return;
    }
    match client.delete(path, Some(found.1.version)).await {
        Ok(()) | Err(zk::Error::NoNode | zk::Error::BadVersion) => {}
        Err(e) => {
            tracing::warn!(%path, %jid, error = %ingest_protocol::bounded(&e), "cannot release the lock")
        }
    }
}

/// Takes every lock of `paths` in order for the job, waiting a while for
/// each one held by another (watching its node, at most `policy.retries`
/// back-offs, one retry recorded on the job). Without a ZooKeeper session
/// (unit tests) there is nothing to take.
///
/// # Errors
/// The job must wait: `Err(StepResult::Wait)` naming the lock; the locks
/// this call took are released again.
pub async fn acquire(
    job: &JobCtx,
    paths: &[String],
    holder: Holder,
    policy: RetryPolicy,
) -> Result<(), StepResult> {
    let Some(client) = &job.zk else {
        return Ok(());
    };
    let mut taken: Vec<&String> = Vec::new();
    for path in paths {
        let mut attempt = 0u32;
        loop {
            let error = match take(client, path, &job.jid.to_string(), holder).await {
                Ok(()) => break,
                Err(e) => e,
            };
            attempt += 1;
            if attempt == 1 {
                job.record_retry(2, &format!("waiting: {error}")).await;
            }
            if attempt > policy.retries {
                for p in taken {
                    release(client, p, &job.jid.to_string()).await;
                }
                return Err(StepResult::Wait(format!("waiting: {error}")));
            }
            let pause = policy.backoff(attempt).max(Duration::from_millis(50));
            match client.check_and_watch_stat(path).await {
                Ok((Some(_), watcher)) => {
                    let _ = tokio::time::timeout(pause, watcher.changed()).await;
                }
                Ok((None, _)) => {}
                Err(_) => tokio::time::sleep(pause).await,
            }
        }
        taken.push(path);
    }
    Ok(())
}

/// Releases every lock of `paths` the job holds.
pub async fn release_all(job: &JobCtx, paths: &[String]) {
    if let Some(client) = &job.zk {
        for path in paths {
            release(client, path, &job.jid.to_string()).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_id_locks_are_sorted_unique_and_in_merritts_form() {
        let ids = ["b/2".to_string(), "a".to_string(), "b/2".to_string()];
        assert_eq!(
            localid_locks("demo", &ids),
            vec!["/locks/localid/a_demo", "/locks/localid/b_2_demo"]
        );
        assert!(localid_locks("demo", &[]).is_empty());
    }
}
