//! Converging items of the live tree to the log while the projector runs:
//! drift repair without stopping the server, and the re-projection of a
//! tree written under an older layout after an upgrade.
//!
//! A [`Converger`] is a queue of requests the running sink takes between
//! its transactions, a chunk of [`CHUNK`] items at a time, so projection
//! goes on while a large request is worked through. Each item is
//! converged by the same fenced, version-checked, recorded repair as a
//! node another client changed (see `foreign`), so a repair made this way
//! is in the item's history with the reason the request gave. A request
//! names paths (each converged as the item it belongs to, or alone when it
//! belongs to none, such as a base node) or the whole tree (every job,
//! batch, access request and pause or hold lock the log knows).
//!
//! Only the leading projector takes requests; a request made while no
//! projector leads waits until one does (callers bound the wait).

use std::collections::VecDeque;
use std::sync::Arc;

use zookeeper_client as zk;

use super::item::Item;
use super::runner::{Exit, Runner};
use super::work::{ConvergeScope, Converged, Work};
use crate::checkpoint::{LAYOUT_NODE, LAYOUT_VERSION};
use crate::layout;
use crate::zk::{call, ZkError, ZkErrorKind};

/// Items converged between two transactions of the projector.
pub(super) const CHUNK: usize = 64;

impl Runner {
    /// The items of `scope`.
    fn items_of(&self, scope: &ConvergeScope) -> VecDeque<Item> {
        let state = self.model.projector.state();
        let mut items: Vec<Item> = Vec::new();
        match scope {
            ConvergeScope::Paths(paths) => {
                for p in paths {
                    let item = Item::of(p, |uuid| {
                        uuid.parse().ok().and_then(|u| state.uuids.get(&u).copied())
                    })
                    .unwrap_or_else(|| Item::Node(p.clone()));
                    if !items.contains(&item) {
                        items.push(item);
                    }
                }
            }
            ConvergeScope::Everything => {
                items.extend(state.jobs.keys().map(|j| Item::Job(*j)));
                items.extend(state.batches.keys().map(|b| Item::Batch(*b)));
                items.extend(state.access.values().map(|a| Item::Access(a.queue, a.qid)));
                items.extend(super::foreign::queue_locks().into_iter().map(Item::Lock));
                items.extend(
                    self.model
                        .paths_under(layout::LOCKS_COLLECTIONS)
                        .into_iter()
                        .filter(|p| p != layout::LOCKS_COLLECTIONS)
                        .map(Item::Lock),
                );
            }
        }
        items.into()
    }

    /// Takes the next request when none is being worked through, then
    /// converges up to [`CHUNK`] of its items; answers it when done.
    /// Returns the checkpoint's version after the repairs.
    pub(super) async fn converge_some(
        &mut self,
        client: &zk::Client,
        mut version: i32,
    ) -> Result<i32, Exit> {
        if self.converging.is_none() {
            let Some(req) = self.cfg.converge.as_ref().and_then(|c| c.take()) else {
                return Ok(version);
            };
            let items = self.items_of(&req.scope);
            tracing::info!(
                root = %self.cfg.zk.root,
                items = items.len(),
                reason = %ingest_protocol::bounded(&req.reason),
                "converging items of the live tree to the log"
            );
            self.converging = Some(Work {
                items,
                reason: req.reason,
                done: Converged::default(),
                reply: req.reply,
                layout: None,
            });
        }
        // Between transactions, as every write of the sink.
        let gate = Arc::clone(&self.cfg.gate.lock);
        let _turn = tokio::select! {
            turn = gate.read_owned() => turn,
            _ = self.shutdown.cancelled() => return Ok(version),
        };
        for _ in 0..CHUNK {
            let Some(work) = self.converging.as_mut() else {
                break;
            };
            let Some(item) = work.items.pop_front() else {
                break;
            };
            let reason = work.reason.clone();
            // An item whose repair fails with an error is put back and
            // tried again once the sink resumes.
            let repaired = match self
                .repair_item(client, version, &item, None, &reason)
                .await
            {
                Ok(r) => r,
                Err(e) => {
                    if let Some(w) = self.converging.as_mut() {
                        w.items.push_front(item);
                    }
                    return Err(e);
                }
            };
            if let Some(w) = self.converging.as_mut() {
                w.done.items += 1;
                if repaired {
                    version += 1;
                    w.done.repaired.push(item.name());
                }
            }
        }
        let finished = self.converging.as_ref().is_some_and(|w| w.items.is_empty());
        if finished {
            if let Some(layout) = self.converging.as_ref().and_then(|w| w.layout) {
                version = self.record_layout(client, version, layout).await?;
            }
            if let Some(w) = self.converging.take() {
                tracing::info!(
                    root = %self.cfg.zk.root,
                    items = w.done.items,
                    repaired = w.done.repaired.len(),
                    "converged items of the live tree to the log"
                );
                let _ = w.reply.send(w.done);
            }
        }
        self.publish_convergence();
        Ok(version)
    }

    /// Shows the work's progress in the status.
    pub(super) fn publish_convergence(&mut self) {
        let progress = self.converging.as_ref().map(Work::progress);
        self.status.send_if_modified(|s| {
            let changed = s.converging != progress;
            s.converging = progress;
            changed
        });
    }

    /// The layout version the live tree records (1 when it records none).
    async fn tree_layout(&self, client: &zk::Client) -> Result<(u32, Option<i32>), Exit> {
        match call(
            self.deadline(),
            "get_data",
            LAYOUT_NODE,
            client.get_data(LAYOUT_NODE),
        )
        .await
        {
            Ok((data, stat)) => {
                let text = String::from_utf8_lossy(&data);
                // An unreadable version is treated as the oldest: converging
                // a tree that needs nothing only reads it.
                Ok((text.trim().parse().unwrap_or(1), Some(stat.version)))
            }
            Err(e) if e.code() == Some(&zk::Error::NoNode) => Ok((1, None)),
            Err(e) => Err(e.into()),
        }
    }

    /// When the tree was projected under an older layout than this
    /// release's, starts converging every item (recorded with the upgrade
    /// as the reason); the new version is recorded once it is done.
    pub(super) async fn upgrade_if_needed(&mut self, client: &zk::Client) -> Result<(), Exit> {
        if self.converging.is_some() {
            return Ok(());
        }
        let (found, _) = self.tree_layout(client).await?;
        if found >= LAYOUT_VERSION {
            return Ok(());
        }
        let items = self.items_of(&ConvergeScope::Everything);
        tracing::warn!(
            root = %self.cfg.zk.root,
            from = found,
            to = LAYOUT_VERSION,
            items = items.len(),
            "the tree was projected under an older layout; converging every item to this release's while serving"
        );
        // Nobody waits for the answer.
        let (reply, _) = tokio::sync::oneshot::channel();
        self.converging = Some(Work {
            items,
            reason: format!(
                "upgrade: the tree was projected under layout {found}; re-projected under layout {LAYOUT_VERSION}"
            ),
            done: Converged::default(),
            reply,
            layout: Some(LAYOUT_VERSION),
        });
        self.publish_convergence();
        Ok(())
    }

    /// Records `layout` in the tree, fenced on the checkpoint like every
    /// write of the sink. Returns the checkpoint's version after it.
    async fn record_layout(
        &mut self,
        client: &zk::Client,
        version: i32,
        layout: u32,
    ) -> Result<i32, Exit> {
        let (_, existing) = self.tree_layout(client).await?;
        let data = layout.to_string();
        let mut w = self.fenced_multi(client, version)?;
        let add = super::runner::multi_add;
        let acl = self.cfg.zk.access.acl(LAYOUT_NODE);
        match existing {
            Some(v) => add(
                w.add_set_data(LAYOUT_NODE, data.as_bytes(), Some(v)),
                LAYOUT_NODE,
            )?,
            None => add(
                w.add_create(LAYOUT_NODE, data.as_bytes(), &acl.persistent()),
                LAYOUT_NODE,
            )?,
        }
        let deadline = self.deadline();
        match tokio::time::timeout(deadline, w.commit()).await {
            Ok(Ok(_)) => {}
            Ok(Err(zk::MultiWriteError::OperationFailed { index: 0, .. })) => {
                return Err(Exit::Conflict)
            }
            // The layout node changed meanwhile: read again next turn.
            Ok(Err(zk::MultiWriteError::OperationFailed { .. })) => return Err(Exit::Retry),
            Ok(Err(zk::MultiWriteError::RequestFailed { source })) => {
                return Err(ZkError::new("multi", LAYOUT_NODE, ZkErrorKind::Server(source)).into());
            }
            Err(_) => {
                return Err(
                    ZkError::new("multi", LAYOUT_NODE, ZkErrorKind::Timeout(deadline)).into(),
                );
            }
        }
        tracing::info!(root = %self.cfg.zk.root, layout, "the tree records its layout");
        Ok(version + 1)
    }
}
