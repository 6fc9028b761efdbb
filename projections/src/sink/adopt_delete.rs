//! Adoption mode: batches, jobs and access requests another client removed
//! (mrt-zk's `Batch.delete`, `deleteCompletedBatches`, `Job.delete`,
//! `deleteDeletedJobs`, `Access.delete`), offered to the engine as its
//! cleanup of a batch or its delete of a job or request; refused, put back
//! and recorded.

use std::collections::BTreeSet;

use ingest_events::event::AccessQueue;
use ingest_events::lifecycle::AccessState;
use ingest_events::Jid;
use zookeeper_client as zk;

use super::adoption::{Adoption, Deleted, ForeignDelete};
use super::item::Item;
use super::runner::{Exit, Runner};
use crate::layout;

/// How long after the last removal of a job of a finished batch that
/// stays the jobs removed are waited for the batch's own removal (mrt-zk's
/// `Batch.delete` removes the jobs one by one first, each with several
/// reads), before they are judged as jobs removed alone (`Job.delete`,
/// `deleteDeletedJobs`).
pub(super) const DEFER_DELETE: std::time::Duration = std::time::Duration::from_secs(5);

impl Runner {
    /// Offers each batch, job and access request another client removed to
    /// the engine (the caller holds the gate), once its root node is gone:
    /// a batch with the jobs it had, a job alone otherwise; a request
    /// (`access.0`) Processing whose lock another session held when it was
    /// removed (`access.1`) is refused before the engine is asked, as
    /// `DELETE /access/QID` refuses it. Adopted, the nodes still to go
    /// are left to the engine's event (the projector's deletes of nodes
    /// already gone are left out; a job deleted softly is put back
    /// silently as its event says); refused, the items are put back and
    /// recorded. Returns the checkpoint version after the repairs and the
    /// items judged here.
    pub(super) async fn adopt_deletes(
        &mut self,
        client: &zk::Client,
        mut version: i32,
        batches: &BTreeSet<ingest_events::Bid>,
        jobs: &BTreeSet<Jid>,
        access: (
            &BTreeSet<(AccessQueue, ingest_events::Qid)>,
            &BTreeSet<ingest_events::Qid>,
        ),
    ) -> Result<(i32, Vec<Item>), Exit> {
        let mut judged: Vec<Item> = Vec::new();
        let Some(adopter) = self.cfg.adopt.clone() else {
            return Ok((version, judged));
        };
        let state = self.model.projector.state();
        let mut offers: Vec<(Deleted, Vec<Item>)> = Vec::new();
        for bid in batches {
            let mut items = vec![Item::Batch(*bid)];
            if let Some(b) = state.batches.get(bid) {
                items.extend(b.jobs.iter().map(|j| Item::Job(*j)));
                for j in &b.jobs {
                    self.deferred_jobs.remove(j);
                }
                self.deleting_batches.remove(bid);
            }
            offers.push((Deleted::Batch(*bid), items));
        }
        let now = tokio::time::Instant::now();
        for jid in jobs {
            let Some(bid) = state.jobs.get(jid).map(|j| j.bid) else {
                continue;
            };
            if batches.contains(&bid) {
                self.deferred_jobs.remove(jid);
                continue;
            }
            // mrt-zk's `Batch.delete` removes its jobs one by one before
            // the batch: a job of a finished batch that is still there may
            // be one of them, and is judged with the batch once it goes,
            // or alone once no job of that batch was removed for
            // DEFER_DELETE.
            let finished = state.batches.get(&bid).is_some_and(|b| {
                matches!(
                    b.status,
                    ingest_events::lifecycle::BatchState::Completed
                        | ingest_events::lifecycle::BatchState::Deleted
                )
            });
            if finished && !self.deferred_jobs.contains(jid) {
                self.deleting_batches.insert(bid, now);
            }
            let last = self.deleting_batches.get(&bid).copied().unwrap_or(now);
            if finished
                && now < last + DEFER_DELETE
                && self.read_node(client, &layout::batch(bid)).await?.is_some()
            {
                self.deferred_jobs.insert(*jid);
                judged.push(Item::Job(*jid));
                if self.redo.len() < 65_536 {
                    self.redo
                        .push((zk::EventType::NodeDeleted, layout::job(*jid)));
                }
                continue;
            }
            self.deferred_jobs.remove(jid);
            self.deleting_batches.remove(&bid);
            offers.push((Deleted::Job(*jid), vec![Item::Job(*jid)]));
        }
        // Being assembled: Processing, its lock held when it was removed.
        let assembling: BTreeSet<ingest_events::Qid> = access
            .1
            .iter()
            .filter(|a| {
                state
                    .access
                    .get(a)
                    .is_some_and(|r| r.status == AccessState::Processing)
            })
            .copied()
            .collect();
        for (queue, qid) in access.0 {
            offers.push((
                Deleted::Access(*queue, *qid),
                vec![Item::Access(*queue, *qid)],
            ));
        }
        for (what, items) in offers {
            judged.extend(items.iter().cloned());
            let root = match what {
                Deleted::Batch(b) => layout::batch(b),
                Deleted::Job(j) => layout::job(j),
                Deleted::Access(q, a) => layout::access(q, a),
            };
            let assembling = matches!(what, Deleted::Access(_, a) if assembling.contains(&a));
            // Created again since: its nodes are judged as any others.
            let reason = if self.read_node(client, &root).await?.is_some() {
                format!("{root} was deleted and created again by another client")
            } else if assembling {
                format!(
                    "adoption refused: {root} deleted by another client while Processing and another session held its lock"
                )
            } else {
                let offered = ForeignDelete {
                    item: what,
                    actor: self.foreign_actor("zk-client"),
                };
                match tokio::time::timeout(self.deadline(), adopter.0.adopt_delete(offered)).await {
                    Ok(Adoption::Accepted(position)) => {
                        tracing::info!(root = %self.cfg.zk.root, %root, position, "adopted a deletion by another client");
                        self.deletion_adopted(client, &items, position).await?;
                        continue;
                    }
                    Ok(Adoption::Refused(why)) => format!(
                        "adoption refused: {root} deleted by another client: {}",
                        ingest_protocol::cut(&why, 300)
                    ),
                    Err(_) => {
                        format!("adoption of the deletion of {root}: the engine did not answer")
                    }
                }
            };
            for item in &items {
                if self
                    .repair_item(client, version, item, None, &reason)
                    .await?
                {
                    version += 1;
                }
            }
        }
        Ok((version, judged))
    }

    /// After an adopted deletion at `position`: until its event is in the
    /// tree, a repair of these items is silent and the projector writes
    /// each of their nodes as the tree has it (a delete of a node already
    /// gone left out, a create of a node still there a set).
    async fn deletion_adopted(
        &mut self,
        client: &zk::Client,
        items: &[Item],
        position: u64,
    ) -> Result<(), Exit> {
        for item in items {
            match item {
                Item::Batch(b) => {
                    self.adopted_batches.insert(*b, position);
                }
                Item::Job(j) => {
                    self.adopted.insert(*j, position);
                }
                Item::Access(_, q) => {
                    self.adopted_access.insert(*q, position);
                }
                _ => {}
            }
            let (expected, live) = self.item_nodes(client, item).await?;
            for p in expected {
                let exists = live.contains(&p);
                self.adopted_locks.insert(p, (position, exists));
            }
        }
        Ok(())
    }
}
