//! Running an operation where its stream lives: on this core's shard, or across the inbox of
//! the owning core (`inbox.rs`), and the receiving end of that inbox. Each operation is its
//! own type (`ops.rs`) naming the answer it gets, so the reply crossing between cores is
//! typed by the operation that asked for it.

use std::rc::Rc;

use futures_channel::{mpsc, oneshot};
use futures_lite::StreamExt;

use crate::api::{
    AppendAck, AppendRequest, Created, ReadBatch, ReadRequest, RecordInput, RetentionChange,
    StreamInfo, StreamSummary,
};
use crate::error::{AppendError, CreateError, EngineError, ReadError, TrimError};
use crate::inbox::{Message, Peers};
use crate::ops::{
    Configure, Create, Delete, ForkAcquire, ForkRelease, Head, Sent, StreamRequest, Trim,
};
use crate::placement::owner_core;
use crate::rules::{ForkOrigin, StreamConfig};
use crate::shard::{Run, Shard};

/// This core's shard and its way to every other core's.
pub(crate) struct Router {
    pub(crate) core: usize,
    pub(crate) shard: Rc<Shard>,
    pub(crate) peers: Peers,
}

impl Router {
    pub(crate) fn cores(&self) -> usize {
        self.peers.cores()
    }

    /// The other cores of this node.
    pub(crate) fn others(&self) -> impl Iterator<Item = usize> {
        let me = self.core;
        (0..self.cores()).filter(move |&c| c != me)
    }

    /// Runs `op` on the stream's owning core.
    pub(crate) async fn run<O: Run>(&self, name: &str, op: O) -> Result<O::Answer, O::Error> {
        let owner = owner_core(name, self.cores());
        if owner == self.core {
            return self.shard.execute(name, op).await;
        }
        self.peers.call(owner, name, op).await
    }

    /// One create on the owning core, as a fork of `fork` (a fork point the source has
    /// resolved and counted) if given.
    pub(crate) async fn create(
        &self,
        name: &str,
        config: StreamConfig,
        closed: bool,
        records: Vec<RecordInput>,
        fork: Option<ForkOrigin>,
    ) -> Result<Created, CreateError> {
        let op = Create {
            config,
            closed,
            records,
            fork,
        };
        self.run(name, op).await
    }

    pub(crate) async fn append(
        &self,
        name: &str,
        request: AppendRequest,
    ) -> Result<AppendAck, AppendError> {
        self.run(name, request).await
    }

    /// One read on the owning core, as is (no stitching of forks: see `fork.rs`). A live read
    /// on another core waits for room in its queue instead of being refused
    /// (`Peers::call_live`).
    pub(crate) async fn read(
        &self,
        name: &str,
        request: ReadRequest,
    ) -> Result<ReadBatch, ReadError> {
        let owner = owner_core(name, self.cores());
        if owner == self.core {
            return self.shard.execute(name, request).await;
        }
        if request.wait_ms.is_some() {
            self.peers.call_live(owner, name, request).await
        } else {
            self.peers.call(owner, name, request).await
        }
    }

    pub(crate) async fn head(&self, name: &str) -> Result<StreamInfo, EngineError> {
        self.run(name, Head).await
    }

    /// The stream's first readable offset after the trim.
    pub(crate) async fn trim(&self, name: &str, offset: u64) -> Result<u64, TrimError> {
        self.run(name, Trim { offset }).await
    }

    pub(crate) async fn configure(
        &self,
        name: &str,
        change: RetentionChange,
    ) -> Result<StreamInfo, EngineError> {
        self.run(name, Configure { change }).await
    }

    /// Deletes `name`. A fork's reference to its source is given back before the answer, so a
    /// deleted source is gone (its name free) once its last fork's delete is answered; a
    /// release that fails goes to the retry loop (`fork::release_loop`).
    pub(crate) async fn delete(&self, name: &str) -> Result<(), EngineError> {
        let fork_source = self.run(name, Delete).await?;
        if let Some((source, source_id)) = fork_source {
            if let Err(e) = self.fork_release(&source, source_id).await {
                log::warn!("could not release a fork of {source} ({e}); trying again");
                self.shard.queue_fork_releases([(source, source_id)]);
            }
        }
        Ok(())
    }

    /// Validates a fork point with the source and counts the reference: where the fork
    /// starts, and the source's configuration.
    pub(crate) async fn fork_acquire(
        &self,
        source: &str,
        offset: u64,
        partial_bytes: u64,
    ) -> Result<(ForkOrigin, StreamConfig), CreateError> {
        let op = ForkAcquire {
            offset,
            partial_bytes,
        };
        self.run(source, op).await
    }

    /// Tells `source` that a fork of its stream `source_id` is gone (or was never created).
    pub(crate) async fn fork_release(
        &self,
        source: &str,
        source_id: u64,
    ) -> Result<(), EngineError> {
        self.run(source, ForkRelease { source_id }).await
    }

    /// Streams whose names start with `prefix` and sort after `start_after`, from every core,
    /// in name order; the flag says whether more exist past `limit`.
    pub(crate) async fn list(
        &self,
        prefix: &str,
        start_after: &str,
        limit: usize,
    ) -> Result<(Vec<StreamSummary>, bool), EngineError> {
        let mut all = self.shard.list(prefix, start_after, limit + 1);
        for core in self.others() {
            let (reply, rx) = oneshot::channel();
            self.peers.send(
                core,
                Message::List {
                    prefix: prefix.to_string(),
                    start_after: start_after.to_string(),
                    limit: limit + 1,
                    reply,
                },
            )?;
            all.extend(rx.await.map_err(|_| EngineError::ShuttingDown)?);
        }
        all.sort_by(|a, b| a.name.cmp(&b.name));
        let more = all.len() > limit;
        all.truncate(limit);
        Ok((all, more))
    }
}

/// The receiving end of this core's inbox: each message runs on the shard.
pub(crate) async fn serve_inbox(shard: Rc<Shard>, mut inbox: mpsc::Receiver<Message>) {
    while let Some(message) = inbox.next().await {
        match message {
            Message::Stream(request) => match request {
                StreamRequest::Create(sent) => spawn_run(&shard, sent),
                StreamRequest::Append(sent) => spawn_run(&shard, sent),
                StreamRequest::Read(sent) => spawn_run(&shard, sent),
                StreamRequest::Head(sent) => spawn_run(&shard, sent),
                StreamRequest::Trim(sent) => spawn_run(&shard, sent),
                StreamRequest::Configure(sent) => spawn_run(&shard, sent),
                StreamRequest::Delete(sent) => spawn_run(&shard, sent),
                StreamRequest::ForkAcquire(sent) => spawn_run(&shard, sent),
                StreamRequest::ForkRelease(sent) => spawn_run(&shard, sent),
            },
            Message::List {
                prefix,
                start_after,
                limit,
                reply,
            } => {
                let _ = reply.send(shard.list(&prefix, &start_after, limit));
            }
            Message::Forget { keys } => shard.forget_segments(&keys),
            Message::HandOff { transfer, reply } => {
                let shard = shard.clone();
                glommio::spawn_local(async move {
                    shard.hand_off(transfer).await;
                    let _ = reply.send(());
                })
                .detach();
            }
            Message::Revalidate { owned, reply } => {
                shard.revalidate(&owned);
                let _ = reply.send(());
            }
            Message::Checkpoint { timeout, reply } => {
                let shard = shard.clone();
                glommio::spawn_local(async move {
                    let _ = reply.send(shard.checkpoint(timeout).await);
                })
                .detach();
            }
        }
    }
}

/// Runs an operation another core sent, in a task of its own, and answers it.
fn spawn_run<O: Run>(shard: &Rc<Shard>, sent: Sent<O>) {
    let shard = shard.clone();
    let Sent {
        name,
        op,
        mut reply,
    } = sent;
    glommio::spawn_local(async move {
        let run = async { Some(shard.execute(&name, op).await) };
        let result = if O::CANCELLABLE {
            let gone = async {
                reply.cancellation().await;
                None
            };
            futures_lite::future::or(run, gone).await
        } else {
            run.await
        };
        if let Some(result) = result {
            let _ = reply.send(result);
        }
    })
    .detach();
}
