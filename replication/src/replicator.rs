//! The leader's side of the write path: each group's frames go to the tail
//! in `multi`s that check the fencing epoch, before the leader's own log
//! takes them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ingest_engine::{ReplicationError, Replicator};
use zookeeper_client as zk;

use crate::paths;
use crate::tail::{self, Chunk};

/// What the leader's writer shares with its controller: where the tail
/// ends, for trimming and lag.
#[derive(Debug, Default)]
pub(crate) struct TailEnd {
    /// The next node's sequence number.
    pub next_seq: AtomicU64,
    /// The position of the last record written to the tail.
    pub head: AtomicU64,
    /// Tail `multi`s written in this term.
    pub writes: AtomicU64,
    /// Records written to the tail in this term.
    pub records: AtomicU64,
    /// Bytes of frames written to the tail in this term, before compression.
    pub frame_bytes: AtomicU64,
    /// Bytes of node data written to the tail in this term (compressed or not).
    pub stored_bytes: AtomicU64,
}

/// Writes to the tail for a leader in one epoch.
pub(crate) struct ZkReplicator {
    pub runtime: tokio::runtime::Handle,
    pub client: zk::Client,
    /// The version of the epoch node this leader set.
    pub epoch_version: i32,
    pub acl: Vec<zk::Acl>,
    pub deadline: Duration,
    pub end: Arc<TailEnd>,
}

impl Replicator for ZkReplicator {
    fn replicate(&mut self, frames: &[Vec<u8>]) -> Result<(), ReplicationError> {
        let next_seq = self.end.next_seq.load(Ordering::Acquire);
        let head = self.end.head.load(Ordering::Acquire);
        let chunks: Vec<Chunk> = tail::pack(frames, next_seq, head)
            .map_err(|e| ReplicationError::Unknown(format!("a staged frame does not split: {e}")))?
            .into_iter()
            .map(Chunk::compressed)
            .collect();
        let runs = tail::multis(&chunks);
        let total = runs.len();
        for (i, run) in runs.into_iter().enumerate() {
            let result = self.runtime.block_on(self.write(run));
            if let Err(e) = result {
                // A group cut over several multis whose first ones went
                // through: those records are in the tail, so the outcome of
                // their commands is unknown, never "not written".
                return Err(if i > 0 && total > 1 {
                    ReplicationError::Unknown(e.to_string())
                } else {
                    e
                });
            }
            let stored: usize = run.iter().map(|c| c.data.len()).sum();
            self.end
                .stored_bytes
                .fetch_add(stored as u64, Ordering::Relaxed);
            if let Some(last) = run.last() {
                let before = self.end.head.swap(last.name.pos, Ordering::AcqRel);
                self.end
                    .next_seq
                    .store(last.name.seq + 1, Ordering::Release);
                self.end.writes.fetch_add(1, Ordering::Relaxed);
                self.end
                    .records
                    .fetch_add(last.name.pos.saturating_sub(before), Ordering::Relaxed);
            }
        }
        let frame_bytes: usize = frames.iter().map(Vec::len).sum();
        self.end
            .frame_bytes
            .fetch_add(frame_bytes as u64, Ordering::Relaxed);
        Ok(())
    }
}

impl ZkReplicator {
    async fn write(&self, run: &[Chunk]) -> Result<(), ReplicationError> {
        let options = zk::CreateMode::Persistent.with_acls(zk::Acls::new(&self.acl));
        let mut writer = self.client.new_multi_writer();
        let mut add = || -> Result<(), zk::Error> {
            writer.add_check_version(paths::EPOCH, self.epoch_version)?;
            for c in run {
                writer.add_create(&paths::tail_node(&c.name.to_string()), &c.data, &options)?;
            }
            Ok(())
        };
        add()
            .map_err(|e| ReplicationError::Unknown(format!("cannot build the tail write: {e}")))?;
        match tokio::time::timeout(self.deadline, writer.commit()).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(zk::MultiWriteError::OperationFailed { index, source })) => {
                // Nothing of the multi applied. The epoch moved (index 0) or
                // the node is there already (another leader wrote it): either
                // way another engine leads.
                Err(ReplicationError::Deposed(format!(
                    "the tail write failed at operation {index}: {source}"
                )))
            }
            Ok(Err(zk::MultiWriteError::RequestFailed { source })) => {
                Err(self.classify(format!("the tail write failed: {source}"), &source))
            }
            Err(_) => Err(self.classify(
                format!(
                    "the tail write had no answer within {} ms",
                    self.deadline.as_millis()
                ),
                &zk::Error::ConnectionLoss,
            )),
        }
    }

    /// A request that failed as a whole: a closed or expired session is a
    /// deposition, a lost connection with no server to reach is no quorum,
    /// anything else in flight is an unknown outcome.
    fn classify(&self, message: String, source: &zk::Error) -> ReplicationError {
        match source {
            zk::Error::SessionExpired | zk::Error::ClientClosed | zk::Error::SessionMoved => {
                ReplicationError::Deposed(message)
            }
            _ if !matches!(self.client.state(), zk::SessionState::SyncConnected) => {
                ReplicationError::NoQuorum(message)
            }
            _ => ReplicationError::Unknown(message),
        }
    }
}
