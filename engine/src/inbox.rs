//! The hop between cores: the messages a core's inbox takes and the bounded channels that carry
//! them. A request parsed on core A for a stream of core B crosses over to B's inbox; its body
//! `Bytes` move, they are not copied; the reply comes back on a oneshot. The receiving end
//! (`route::serve_inbox`) runs each message on the core's shard.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;

use futures_channel::{mpsc, oneshot};

use crate::api::{Op, Reply, StreamSummary};
use crate::error::EngineError;
use crate::limits;

pub(crate) enum Message {
    Op {
        name: String,
        op: Op,
        reply: oneshot::Sender<Result<Reply, EngineError>>,
    },
    /// These segments were garbage-collected: drop what is cached of them.
    Forget { keys: Arc<Vec<String>> },
    List {
        prefix: String,
        start_after: String,
        limit: usize,
        reply: oneshot::Sender<Vec<StreamSummary>>,
    },
    /// An operator moves this stream to another node: store what we hold of it, then hand it
    /// over (cluster).
    HandOff {
        transfer: pico_meta::PendingTransfer,
        reply: oneshot::Sender<()>,
    },
    /// The lease had lapsed: keep only the streams still ours (`id → owner epoch`).
    Revalidate {
        owned: Arc<HashMap<u64, u64>>,
        reply: oneshot::Sender<()>,
    },
}

/// One core's senders to every core's inbox (its own included, unused), bounded by
/// [`limits::CROSS_CORE_QUEUE_MAX`] each.
pub(crate) struct Peers {
    // `try_send` takes `&mut`; a core is one thread, so a `RefCell` is enough.
    senders: RefCell<Vec<mpsc::Sender<Message>>>,
}

impl Peers {
    pub(crate) fn new(senders: Vec<mpsc::Sender<Message>>) -> Peers {
        Peers {
            senders: RefCell::new(senders),
        }
    }

    /// How many cores the node runs.
    pub(crate) fn cores(&self) -> usize {
        self.senders.borrow().len()
    }

    /// Queues `message` for `core`; a full queue is `429`, a closed one a core shutting down.
    pub(crate) fn send(&self, core: usize, message: Message) -> Result<(), EngineError> {
        let mut senders = self.senders.borrow_mut();
        senders[core].try_send(message).map_err(|e| {
            if e.is_full() {
                EngineError::Overloaded {
                    limit: "cross-core queue",
                    retry_after_sec: limits::OVERLOADED_RETRY_AFTER_SEC,
                }
            } else {
                EngineError::ShuttingDown
            }
        })
    }

    /// `op` on another core (`owner`), answered through a one-shot.
    pub(crate) async fn call(
        &self,
        owner: usize,
        name: &str,
        op: Op,
    ) -> Result<Reply, EngineError> {
        let (reply, rx) = oneshot::channel();
        self.send(
            owner,
            Message::Op {
                name: name.to_string(),
                op,
                reply,
            },
        )?;
        rx.await.map_err(|_| EngineError::ShuttingDown)?
    }
}
