//! Adoption mode: access request statuses another client wrote (mrt-zk's
//! `Access.setStatus`), offered to the engine as the assembler's or the
//! admin's command, the request's lock followed as a job's.

use std::collections::BTreeMap;

use zookeeper_client as zk;

use super::adopt::{answered, lock_refusal, status_of, LockSeen};
use super::adoption::ForeignAccessStatus;
use super::item::Item;
use super::runner::{Exit, Runner};
use crate::layout;

impl Runner {
    /// Offers each access request's foreign status change to the engine
    /// (the caller holds the gate), with the request's lock as the write
    /// saw it (`None`: read with the status), as [`Runner::adopt_statuses`]
    /// does for jobs: an assembler's move (taking the request, its
    /// outcome) written while nobody held the lock, or under an `ingest
    /// worker`'s, is refused before the engine is asked. Returns the
    /// checkpoint version after the repairs.
    pub(super) async fn adopt_access_statuses(
        &mut self,
        client: &zk::Client,
        mut version: i32,
        requests: BTreeMap<ingest_events::Qid, Option<LockSeen>>,
    ) -> Result<i32, Exit> {
        use ingest_events::lifecycle::AccessState;
        let Some(adopter) = self.cfg.adopt.clone() else {
            return Ok(version);
        };
        for (qid, seen) in requests {
            let Some(queue) = self
                .model
                .projector
                .state()
                .access
                .get(&qid)
                .map(|a| a.queue)
            else {
                continue;
            };
            let status = layout::access_status(queue, qid);
            let lock = layout::access_lock(queue, qid);
            let Some((data, stat, seen, applied)) =
                self.read_with_lock(client, &status, &lock, seen).await?
            else {
                continue;
            };
            let reason = match (
                status_of::<AccessState>(&applied),
                status_of::<AccessState>(&data),
            ) {
                (Some((from, _)), Some((to, message))) if from != to => {
                    let change = ForeignAccessStatus {
                        qid,
                        queue,
                        from,
                        to,
                        message,
                        actor: self.writer(seen, &stat),
                    };
                    let worker = ForeignAccessStatus::by_worker(from, to);
                    match lock_refusal(seen, worker, &lock, &from, &to, "the request's") {
                        Some(why) => why,
                        None => {
                            let answer = tokio::time::timeout(
                                self.deadline(),
                                adopter.0.adopt_access_status(change),
                            )
                            .await;
                            match answered(answer, &from, &to) {
                                Ok(position) => {
                                    tracing::info!(root = %self.cfg.zk.root, %qid, %from, %to, position, "adopted a foreign access status change");
                                    self.adopted_access.insert(qid, position);
                                    continue;
                                }
                                Err(why) => why.to_string(),
                            }
                        }
                    }
                }
                _ => "adoption: not an access status change the engine can adopt".to_string(),
            };
            if self
                .repair_item(client, version, &Item::Access(queue, qid), None, &reason)
                .await?
            {
                version += 1;
            }
        }
        Ok(version)
    }
}
