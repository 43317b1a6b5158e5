//! The hop between cores: the messages a core's inbox takes and the bounded channels that carry
//! them. A request parsed on core A for a stream of core B crosses over to B's inbox; its body
//! `Bytes` move, they are not copied; the reply comes back on a oneshot. The receiving end
//! (`route::serve_inbox`) runs each message on the core's shard.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;

use futures_channel::{mpsc, oneshot};

use crate::api::StreamSummary;
use crate::error::EngineError;
use crate::limits;
use crate::ops::{Sent, StreamOp, StreamRequest};

pub(crate) enum Message {
    /// An operation on one stream this core owns.
    Stream(StreamRequest),
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
    /// A backup's checkpoint: store and commit everything this core held when the message
    /// arrived; `true` once done within `timeout`.
    Checkpoint {
        timeout: std::time::Duration,
        reply: oneshot::Sender<bool>,
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

    /// A live read (long-poll or SSE) on another core (`owner`): it waits for room in the
    /// owner's queue instead of being refused. Each subscriber has at most one read in flight,
    /// and their number is bounded where they are admitted (connections per core, waiters per
    /// stream), so this cannot grow the queue without bound; refusing them would turn a burst
    /// of subscribers re-parking after an append (10,000 on one stream, half on another core)
    /// into `429`s the clients have to retry (docs/decisions/2026-12-shared-live-reads.md).
    pub(crate) async fn call_live<O: StreamOp>(
        &self,
        owner: usize,
        name: &str,
        op: O,
    ) -> Result<O::Answer, O::Error> {
        // A clone has a slot of its own in a bounded `mpsc` channel (capacity = buffer +
        // senders), so it waits only while the queue holds more than that.
        let mut sender = self.senders.borrow()[owner].clone();
        std::future::poll_fn(|cx| sender.poll_ready(cx))
            .await
            .map_err(|_| EngineError::ShuttingDown)?;
        let (message, answer) = op_message(name, op);
        sender
            .start_send(message)
            .map_err(|_| EngineError::ShuttingDown)?;
        answer.await.map_err(|_| EngineError::ShuttingDown)?
    }

    /// `op` on another core (`owner`), answered through a one-shot.
    pub(crate) async fn call<O: StreamOp>(
        &self,
        owner: usize,
        name: &str,
        op: O,
    ) -> Result<O::Answer, O::Error> {
        let (message, answer) = op_message(name, op);
        self.send(owner, message)?;
        answer.await.map_err(|_| EngineError::ShuttingDown)?
    }
}

type Answer<O> = oneshot::Receiver<Result<<O as StreamOp>::Answer, <O as StreamOp>::Error>>;

/// The message that runs `op` on `name`'s core, and where its reply arrives.
fn op_message<O: StreamOp>(name: &str, op: O) -> (Message, Answer<O>) {
    let (reply, answer) = oneshot::channel();
    let sent = Sent {
        name: name.to_string(),
        op,
        reply,
    };
    (Message::Stream(O::message(sent)), answer)
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::pin::pin;
    use std::task::{Context, Poll};

    use futures_lite::future::block_on;
    use futures_lite::StreamExt;

    use super::*;
    use crate::ops::Head;

    #[test]
    fn a_live_read_waits_for_room_where_a_request_is_refused() {
        let (sender, mut inbox) = mpsc::channel(0);
        let peers = Peers::new(vec![sender]);
        // The queue's one slot (buffer 0 + one sender) is taken.
        let (first, _first_answer) = op_message("/a", Head);
        peers.send(0, first).unwrap();
        assert!(matches!(
            block_on(peers.call(0, "/a", Head)),
            Err(EngineError::Overloaded { .. })
        ));
        let mut live = pin!(peers.call_live(0, "/live", Head));
        let mut cx = Context::from_waker(std::task::Waker::noop());
        assert!(live.as_mut().poll(&mut cx).is_pending(), "it waits");
        // The core takes the first message and the live read's, then answers the live read.
        block_on(async {
            let Some(Message::Stream(StreamRequest::Head(sent))) = inbox.next().await else {
                panic!("the first message")
            };
            assert_eq!(sent.name, "/a");
        });
        assert!(
            live.as_mut().poll(&mut cx).is_pending(),
            "queued, not answered"
        );
        let Some(Message::Stream(StreamRequest::Head(sent))) = block_on(inbox.next()) else {
            panic!("the live read's message")
        };
        assert_eq!(sent.name, "/live");
        sent.reply.send(Err(EngineError::NotFound)).unwrap();
        assert!(matches!(
            live.as_mut().poll(&mut cx),
            Poll::Ready(Err(EngineError::NotFound))
        ));
    }
}
