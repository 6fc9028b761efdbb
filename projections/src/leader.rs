//! Leader election among projectors (and rebuild / repair) on one root: the
//! ephemeral node `/ingest-engine/leader`, whose data is the holder's
//! identity.
//!
//! Leadership is what keeps a second projector quiet: the one that does not
//! hold the node stands by and never writes. It is not, on its own, what makes
//! writes safe: a holder can lose its session (and so the node) while a write
//! of its is still in flight. Safety comes from the version-checked
//! checkpoint in every transaction (see [`crate::sink`]); leadership only
//! keeps conflicts rare.

use std::time::{Duration, Instant};

use zookeeper_client as zk;

use crate::acl::ZkAccess;
use crate::checkpoint::{ENGINE_NODE, LEADER_NODE};
use crate::zk::{call, ZkError, ZkErrorKind};

/// The outcome of an attempt to take leadership.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Leadership {
    /// This session holds the leader node.
    Held,
    /// Another session holds it; its identity.
    HeldBy(String),
}

fn is(e: &ZkError, code: zk::Error) -> bool {
    e.code() == Some(&code)
}

/// Creates `/ingest-engine` when missing.
///
/// # Errors
/// A [`ZkError`] other than `NodeExists`.
pub async fn ensure_engine_node(
    client: &zk::Client,
    access: &ZkAccess,
    deadline: Duration,
) -> Result<(), ZkError> {
    match call(
        deadline,
        "create",
        ENGINE_NODE,
        client.create(ENGINE_NODE, b"", &access.acl(ENGINE_NODE).persistent()),
    )
    .await
    {
        Ok(_) => Ok(()),
        Err(e) if is(&e, zk::Error::NodeExists) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Tries once to take leadership for `identity`.
///
/// A node left by an earlier session of the same `identity` (the caller's
/// own, expired) is deleted and taken over: identities are unique per
/// projector instance, so no one else can hold it. A create whose outcome is
/// unknown is resolved by reading the node's owner.
///
/// # Errors
/// A [`ZkError`] when the server cannot answer.
pub async fn try_acquire(
    client: &zk::Client,
    identity: &str,
    deadline: Duration,
) -> Result<Leadership, ZkError> {
    let ephemeral = crate::acl::lock_options();
    let mut last = None;
    for _ in 0..5 {
        match call(
            deadline,
            "create",
            LEADER_NODE,
            client.create(LEADER_NODE, identity.as_bytes(), &ephemeral),
        )
        .await
        {
            Ok(_) => return Ok(Leadership::Held),
            Err(e) if is(&e, zk::Error::NodeExists) || e.is_unknown_outcome() => {
                last = Some(e);
            }
            Err(e) => return Err(e),
        }
        match call(
            deadline,
            "get_data",
            LEADER_NODE,
            client.get_data(LEADER_NODE),
        )
        .await
        {
            Ok((_, stat)) if stat.ephemeral_owner == client.session_id().0 => {
                return Ok(Leadership::Held)
            }
            Ok((data, stat)) if data == identity.as_bytes() => {
                tracing::info!(
                    identity,
                    stale_session = %zk::SessionId(stat.ephemeral_owner),
                    "taking over the leader node of an earlier session of this projector"
                );
                match call(
                    deadline,
                    "delete",
                    LEADER_NODE,
                    client.delete(LEADER_NODE, Some(stat.version)),
                )
                .await
                {
                    Ok(()) => {}
                    Err(e) if e.is_conflict() => {}
                    Err(e) => return Err(e),
                }
            }
            Ok((data, _)) => {
                return Ok(Leadership::HeldBy(
                    String::from_utf8_lossy(&data).into_owned(),
                ))
            }
            Err(e) if is(&e, zk::Error::NoNode) || e.is_unknown_outcome() => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| {
        ZkError::new(
            "elect",
            LEADER_NODE,
            ZkErrorKind::Server(zk::Error::UnexpectedError(
                "the leader node kept changing".into(),
            )),
        )
    }))
}

/// Waits until the leader node changes (is deleted, typically because its
/// holder's session ended) or `wait` passes; returns whether it is absent.
///
/// # Errors
/// A [`ZkError`] when the watch cannot be set.
pub async fn wait_for_change(
    client: &zk::Client,
    deadline: Duration,
    wait: Duration,
) -> Result<bool, ZkError> {
    let (stat, watcher) = call(
        deadline,
        "exists+watch",
        LEADER_NODE,
        client.check_and_watch_stat(LEADER_NODE),
    )
    .await?;
    if stat.is_none() {
        return Ok(true);
    }
    let _ = tokio::time::timeout(wait, watcher.changed()).await;
    Ok(false)
}

/// Leadership another projector holds: its identity.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("leadership is held by {0}")]
pub struct HeldBy(pub String);

/// Takes leadership, waiting up to `wait` for the current holder to go.
///
/// # Errors
/// `Ok(Err(holder))` when another projector still holds it after `wait`; a
/// [`ZkError`] when the server cannot answer.
pub async fn acquire_within(
    client: &zk::Client,
    identity: &str,
    access: &ZkAccess,
    deadline: Duration,
    wait: Duration,
) -> Result<Result<(), HeldBy>, ZkError> {
    let until = Instant::now() + wait;
    ensure_engine_node(client, access, deadline).await?;
    loop {
        match try_acquire(client, identity, deadline).await? {
            Leadership::Held => return Ok(Ok(())),
            Leadership::HeldBy(holder) => {
                let left = until.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Ok(Err(HeldBy(holder)));
                }
                tracing::info!(%holder, wait_ms = left.as_millis() as u64, "waiting for leadership");
                wait_for_change(client, deadline, left).await?;
            }
        }
    }
}

/// Gives leadership up if this session holds it.
///
/// # Errors
/// A [`ZkError`] when the server cannot answer (the node then goes with the
/// session).
pub async fn release(client: &zk::Client, deadline: Duration) -> Result<(), ZkError> {
    match call(
        deadline,
        "get_data",
        LEADER_NODE,
        client.get_data(LEADER_NODE),
    )
    .await
    {
        Ok((_, stat)) if stat.ephemeral_owner == client.session_id().0 => {
            match call(
                deadline,
                "delete",
                LEADER_NODE,
                client.delete(LEADER_NODE, Some(stat.version)),
            )
            .await
            {
                Ok(()) => Ok(()),
                Err(e) if e.is_conflict() => Ok(()),
                Err(e) => Err(e),
            }
        }
        Ok(_) => Ok(()),
        Err(e) if is(&e, zk::Error::NoNode) => Ok(()),
        Err(e) => Err(e),
    }
}
