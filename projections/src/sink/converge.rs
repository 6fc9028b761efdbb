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
use crate::layout;

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
        let Some(converger) = self.cfg.converge.clone() else {
            return Ok(version);
        };
        if self.converging.is_none() {
            let Some(req) = converger.take() else {
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
}
