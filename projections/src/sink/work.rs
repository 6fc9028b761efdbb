//! Requests the running sink works through between its transactions:
//! converging items of the live tree to the log (see `converge`).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use tokio::sync::{oneshot, Notify};

use super::item::Item;

/// What to converge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConvergeScope {
    /// The items these paths belong to (a path of no item alone).
    Paths(Vec<String>),
    /// Every item the log knows.
    Everything,
}

/// What a request converged.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Converged {
    /// Items looked at.
    pub items: usize,
    /// The items whose nodes were rewritten, by name (`job jid…`).
    pub repaired: Vec<String>,
}

/// A request could not be answered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConvergeError {
    /// The projector stopped (or shut down) before it answered.
    #[error("the projector stopped before it converged the tree")]
    Stopped,
}

pub(super) struct Request {
    pub(super) scope: ConvergeScope,
    pub(super) reason: String,
    pub(super) reply: oneshot::Sender<Converged>,
}

/// Hands convergence requests to the running sink.
#[derive(Clone, Default)]
pub struct Converger {
    queue: Arc<Mutex<VecDeque<Request>>>,
    notify: Arc<Notify>,
}

impl std::fmt::Debug for Converger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Converger")
    }
}

impl Converger {
    /// A queue nobody has asked anything of.
    pub fn new() -> Converger {
        Converger::default()
    }

    /// Asks the leading projector to converge `scope`, recording each
    /// repaired item with `reason`; answers once it is done.
    ///
    /// # Errors
    /// [`ConvergeError::Stopped`] when the sink ends first.
    pub async fn converge(
        &self,
        scope: ConvergeScope,
        reason: impl Into<String>,
    ) -> Result<Converged, ConvergeError> {
        let (reply, answer) = oneshot::channel();
        self.lock().push_back(Request {
            scope,
            reason: reason.into(),
            reply,
        });
        self.notify.notify_one();
        answer.await.map_err(|_| ConvergeError::Stopped)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Request>> {
        self.queue
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(super) fn take(&self) -> Option<Request> {
        self.lock().pop_front()
    }

    /// Completes when a request may have come.
    pub(super) async fn wait(&self) {
        self.notify.notified().await;
    }
}

/// A request being worked through.
pub(super) struct Work {
    pub(super) items: VecDeque<Item>,
    pub(super) reason: String,
    pub(super) done: Converged,
    pub(super) reply: oneshot::Sender<Converged>,
    /// An upgrade's re-projection: the layout version recorded in the tree
    /// once every item is converged.
    pub(super) layout: Option<u32>,
}

impl Work {
    /// (done, total) for the status.
    pub(super) fn progress(&self) -> (usize, usize) {
        (self.done.items, self.done.items + self.items.len())
    }
}
