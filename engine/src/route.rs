//! Running an operation where its stream lives: on this core's shard, or across the inbox of
//! the owning core (`inbox.rs`), and the receiving end of that inbox. The typed operations
//! here are the one place where a [`Reply`] is matched to its [`Op`]: a reply of another kind
//! is a bug, answered as an internal error (and logged) rather than a panic that would take
//! the core down.

use std::rc::Rc;

use futures_channel::{mpsc, oneshot};
use futures_lite::StreamExt;

use crate::api::{
    AppendAck, AppendRequest, Created, Op, ReadBatch, ReadRequest, RecordInput, Reply,
    RetentionChange, StreamInfo, StreamSummary,
};
use crate::error::EngineError;
use crate::inbox::{Message, Peers};
use crate::placement::owner_core;
use crate::shard::Shard;
use crate::state::{ForkOrigin, StreamConfig};

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

    /// Runs `op` on the stream's owning core, as is.
    pub(crate) async fn run(&self, name: &str, op: Op) -> Result<Reply, EngineError> {
        let owner = owner_core(name, self.cores());
        if owner == self.core {
            return self.shard.execute(name, op).await;
        }
        self.peers.call(owner, name, op).await
    }

    /// `op` on the owning core, its reply taken apart by `pick` (`Err`: another kind, boxed
    /// since it is only ever a bug).
    async fn ask<T>(
        &self,
        name: &str,
        op: Op,
        pick: impl FnOnce(Reply) -> Result<T, Box<Reply>>,
    ) -> Result<T, EngineError> {
        let what = op_name(&op);
        picked(what, self.run(name, op).await?, pick)
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
    ) -> Result<Created, EngineError> {
        let op = Op::Create {
            config,
            closed,
            records,
            fork,
        };
        self.ask(name, op, |reply| match reply {
            Reply::Created {
                created,
                info,
                first,
            } => Ok(Created {
                created,
                info,
                first,
            }),
            other => Err(Box::new(other)),
        })
        .await
    }

    pub(crate) async fn append(
        &self,
        name: &str,
        request: AppendRequest,
    ) -> Result<AppendAck, EngineError> {
        self.ask(name, Op::Append(request), |reply| match reply {
            Reply::Appended(ack) => Ok(ack),
            other => Err(Box::new(other)),
        })
        .await
    }

    /// One read on the owning core, as is (no stitching of forks: see `fork.rs`).
    pub(crate) async fn read(
        &self,
        name: &str,
        request: ReadRequest,
    ) -> Result<ReadBatch, EngineError> {
        let owner = owner_core(name, self.cores());
        if owner == self.core {
            return self.shard.execute_read(name, request).await;
        }
        let live = request.wait_ms.is_some();
        let op = Op::Read(request);
        let what = op_name(&op);
        let reply = if live {
            self.peers.call_live(owner, name, op).await?
        } else {
            self.peers.call(owner, name, op).await?
        };
        picked(what, reply, |reply| match reply {
            Reply::Read(batch) => Ok(batch),
            other => Err(Box::new(other)),
        })
    }

    pub(crate) async fn head(&self, name: &str) -> Result<StreamInfo, EngineError> {
        self.ask(name, Op::Head, |reply| match reply {
            Reply::Head(info) => Ok(info),
            other => Err(Box::new(other)),
        })
        .await
    }

    /// The stream's first readable offset after the trim.
    pub(crate) async fn trim(&self, name: &str, offset: u64) -> Result<u64, EngineError> {
        self.ask(name, Op::Trim { offset }, |reply| match reply {
            Reply::Trimmed { start_offset } => Ok(start_offset),
            other => Err(Box::new(other)),
        })
        .await
    }

    pub(crate) async fn configure(
        &self,
        name: &str,
        change: RetentionChange,
    ) -> Result<StreamInfo, EngineError> {
        self.ask(name, Op::Configure { change }, |reply| match reply {
            Reply::Configured(info) => Ok(info),
            other => Err(Box::new(other)),
        })
        .await
    }

    /// Deletes `name`. A fork's reference to its source is given back before the answer, so a
    /// deleted source is gone (its name free) once its last fork's delete is answered; a
    /// release that fails goes to the retry loop (`fork::release_loop`).
    pub(crate) async fn delete(&self, name: &str) -> Result<(), EngineError> {
        let fork_source = self
            .ask(name, Op::Delete, |reply| match reply {
                Reply::Deleted { fork_source } => Ok(fork_source),
                other => Err(Box::new(other)),
            })
            .await?;
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
    ) -> Result<(ForkOrigin, StreamConfig), EngineError> {
        let op = Op::ForkAcquire {
            offset,
            partial_bytes,
        };
        self.ask(source, op, |reply| match reply {
            Reply::ForkPoint { origin, config } => Ok((origin, config)),
            other => Err(Box::new(other)),
        })
        .await
    }

    /// Tells `source` that a fork of its stream `source_id` is gone (or was never created).
    pub(crate) async fn fork_release(
        &self,
        source: &str,
        source_id: u64,
    ) -> Result<(), EngineError> {
        self.ask(source, Op::ForkRelease { source_id }, |reply| match reply {
            Reply::Released => Ok(()),
            other => Err(Box::new(other)),
        })
        .await
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

/// The operation's name in a log line.
fn op_name(op: &Op) -> &'static str {
    match op {
        Op::Create { .. } => "create",
        Op::Append(_) => "append",
        Op::ForkAcquire { .. } => "fork acquire",
        Op::ForkRelease { .. } => "fork release",
        Op::Configure { .. } => "configure",
        Op::Trim { .. } => "trim",
        Op::Read(_) => "read",
        Op::Head => "head",
        Op::Delete => "delete",
    }
}

/// The receiving end of this core's inbox: each message runs on the shard.
pub(crate) async fn serve_inbox(shard: Rc<Shard>, mut inbox: mpsc::Receiver<Message>) {
    while let Some(message) = inbox.next().await {
        match message {
            Message::Op {
                name,
                op,
                mut reply,
            } => {
                let shard = shard.clone();
                // A read whose requester went away (a long-poll's client left) is dropped
                // with its waiter; any other operation runs to its end.
                let cancellable = matches!(op, Op::Read(_) | Op::Head);
                glommio::spawn_local(async move {
                    let run = async { Some(shard.execute(&name, op).await) };
                    let result = if cancellable {
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

/// A reply taken apart by `pick` (`Err`: another kind, boxed since it is only ever a bug).
fn picked<T>(
    what: &str,
    reply: Reply,
    pick: impl FnOnce(Reply) -> Result<T, Box<Reply>>,
) -> Result<T, EngineError> {
    pick(reply).map_err(|other| {
        log::error!("engine: a {what} was answered with {other:?}");
        EngineError::Storage(format!("internal error: a {what} got an unexpected reply"))
    })
}
