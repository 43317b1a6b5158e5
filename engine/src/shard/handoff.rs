//! Cluster ownership moves: routing a request to the node that serves the stream, adopting a
//! stream this node now owns, handing one to another node, and revalidating after a lapsed
//! lease.

use std::collections::HashMap;
use std::rc::Rc;
use std::time::Duration;

use pico_meta::{Fence, MetaError, PendingTransfer};

use super::seeds::stream_seeds;
use crate::cluster::Cluster;
use crate::error::{EngineError, NotOwnerReason};
use crate::limits;
use crate::ops::RouteAs;

use super::state::Shard;
use super::stream::StreamSeed;

impl Shard {
    /// Before an operation on a stream this core does not hold: find who serves it. Ours but
    /// not loaded (taken over, transferred here): load it. Another live node's: redirect. A new
    /// name: create it here if placement says so.
    pub(super) async fn route(self: &Rc<Self>, name: &str, op: RouteAs) -> Result<(), EngineError> {
        let Some(cluster) = self.cluster.clone() else {
            return Ok(());
        };
        let me = cluster.node_id();
        self.streams.wait_hand_off(name).await;
        if self.streams.holds(name) || op == RouteAs::Anywhere {
            return Ok(());
        }
        let plain_create = op == RouteAs::PlainCreate;
        if plain_create && cluster.place(name).is_none_or(|n| n == me) {
            // A create this node would place here asks the metadata log once, in the create
            // itself: it registers the name, or finds it registered and by whom, and `create`
            // sends the client there (or adopts it). A look-up first would make every create
            // two metadata transactions (docs/decisions/2026-12-create-groups.md).
            self.streams.forget_moved(name);
            return Ok(());
        }
        self.resolve_owner(&cluster, name, plain_create).await
    }

    /// Where `name` lives, asked of the metadata log: `Ok` when this node serves it (adopted
    /// now if need be) or it is not registered (a new name this node would place here when
    /// `plain_create`, or not found), else the error that sends the client to its owner.
    ///
    /// Always asked of the metadata log, never answered from memory: after a transfer two
    /// nodes' memories could send a client back and forth. A client talking to the wrong node
    /// pays one indexed lookup per request, the owner's requests pay nothing. An owner whose
    /// lease lapsed is replaced by the keeper within a lease round: wait for that (bounded)
    /// rather than fail the request.
    pub(super) async fn resolve_owner(
        self: &Rc<Self>,
        cluster: &Cluster,
        name: &str,
        plain_create: bool,
    ) -> Result<(), EngineError> {
        let me = cluster.node_id();
        let deadline = self.clock.now() + Duration::from_millis(cluster.config.lease_ms * 2);
        loop {
            let found = meta_answer(self.meta.lookup_stream(name).await)?;
            let Some((row, ownership)) = found else {
                self.streams.forget_moved(name);
                // A fork is created where its source lives (this node: the source's core just
                // resolved the fork point here), so a family is never split.
                if plain_create {
                    if let Some(target) = cluster.place(name).filter(|&n| n != me) {
                        return Err(cluster.moved(target));
                    }
                }
                return Ok(()); // a new name: created here, or not found
            };
            match ownership.node {
                Some(node) if node == me => return self.adopt(name, row.id).await,
                Some(node) if cluster.live_node(node).is_some() => {
                    return Err(cluster.moved(node));
                }
                owner => {
                    if self.clock.now() >= deadline {
                        let stream = name.to_string();
                        return Err(NotOwnerReason::OwnerLapsed { stream, owner }.into());
                    }
                    glommio::timer::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }

    /// Starts serving stream `id` (named `name`), which this node owns now: its state comes
    /// from the catalog (the previous owner stored everything before handing it over, or
    /// acknowledged only what was stored, with object durability).
    pub(super) async fn adopt(self: &Rc<Self>, name: &str, id: u64) -> Result<(), EngineError> {
        let me = self.cluster.as_ref().map(|c| c.node_id());
        self.settle_let_go().await?;
        let load = meta_answer(self.meta.load_stream(id).await)?;
        let Some(load) = load else {
            return Ok(()); // deleted meanwhile: not found
        };
        if load.ownership.node != me {
            let cluster = self.cluster.as_ref().expect("adopt runs in a cluster");
            return Err(cluster.moved_to(load.ownership.node));
        }
        if self.streams.holds(name) {
            return Ok(()); // another request loaded it meanwhile
        }
        let seeds: Vec<StreamSeed> = stream_seeds(&load.snapshot)
            .into_iter()
            .map(|mut seed| {
                seed.epoch = load.ownership.epoch;
                seed.fork_refs = load.fork_refs;
                seed
            })
            .collect();
        log::info!(
            "core {}: serving {name} (stream {id}) at owner epoch {}",
            self.core,
            load.ownership.epoch
        );
        let unreleased = self.load_seeds(seeds);
        // Boxed: rare, and it would size every adoption's future.
        Box::pin(self.finish_deletes(unreleased)).await;
        Ok(())
    }

    /// Waits until the segments holding frames of streams this core let go are committed or
    /// refused ([`Streams::reload_barrier`](super::streams::Streams::reload_barrier)), so that
    /// a load from the catalog finds them; `Unsettled` (retry) when that takes longer than a
    /// hand-off's flush may.
    async fn settle_let_go(self: &Rc<Self>) -> Result<(), EngineError> {
        let Some(barrier) = self.streams.reload_barrier() else {
            return Ok(());
        };
        let timeout = Duration::from_millis(limits::HAND_OFF_FLUSH_TIMEOUT_MS);
        // A failed WAL takes no append any more, so no offset can be handed out twice here:
        // the stream is loaded for its readers.
        if !self.flush_through(barrier, timeout).await && !self.journal.failed() {
            return Err(NotOwnerReason::Unsettled.into());
        }
        self.streams.settled_through(barrier);
        Ok(())
    }

    /// Hands a stream to another node: new operations wait, what this core holds of the
    /// stream is stored (sealed, uploaded, in the catalog), then the owner changes in one
    /// fenced update and the waiting operations are redirected.
    pub(crate) async fn hand_off(self: &Rc<Self>, transfer: PendingTransfer) {
        let Some(cluster) = self.cluster.clone() else {
            return;
        };
        let name: Rc<str> = Rc::from(transfer.name.as_str());
        let held = self.streams.incarnation(&name);
        if held.is_some_and(|(id, epoch)| id != transfer.stream_id || epoch != transfer.epoch) {
            return; // not the row the transfer names: the next lease round has the news
        }
        self.streams.begin_hand_off(name.clone());
        let stored = held.is_none()
            || self
                .flush_through_active(Duration::from_millis(limits::HAND_OFF_FLUSH_TIMEOUT_MS))
                .await;
        let fence = Fence {
            node: cluster.node_id(),
            node_epoch: cluster.node_epoch(),
            epoch: transfer.epoch,
        };
        if stored {
            match self
                .meta
                .complete_transfer(transfer.stream_id, fence, transfer.to_node)
                .await
            {
                Ok(Ok(epoch)) => {
                    log::info!(
                        "core {}: handed {} to node {} (owner epoch {epoch})",
                        self.core,
                        transfer.name,
                        transfer.to_node
                    );
                    self.forget_stream(&name, transfer.stream_id, Some(transfer.to_node));
                }
                Ok(Err(e)) => log::warn!("transfer of {}: {e}", transfer.name),
                Err(_) => {}
            }
        } else {
            log::warn!(
                "transfer of {}: its data was not stored within {:?}; will retry",
                transfer.name,
                Duration::from_millis(limits::HAND_OFF_FLUSH_TIMEOUT_MS)
            );
        }
        self.streams.end_hand_off(&name);
    }

    /// After this node's lease lapsed and was renewed: keep only the streams it still owns
    /// at the same epoch (`owned`: id → owner epoch), let the others go.
    pub(crate) fn revalidate(&self, owned: &HashMap<u64, u64>) {
        let lost: Vec<(Rc<str>, u64)> = self.streams.scan(|streams| {
            streams
                .iter()
                .filter(|(_, s)| owned.get(&s.state.id) != Some(&s.epoch))
                .map(|(name, s)| (name.clone(), s.state.id))
                .collect()
        });
        for (name, id) in lost {
            log::warn!(
                "core {}: {name} (stream {id}) moved to another node while this node's lease \
                 had lapsed",
                self.core
            );
            self.forget_stream(&name, id, None);
        }
        self.release_acks();
    }
}

/// A metadata answer as the engine's result: a dropped answer means the store is stopping.
pub(super) fn meta_answer<T>(
    answer: Result<Result<T, MetaError>, futures_channel::oneshot::Canceled>,
) -> Result<T, EngineError> {
    answer
        .map_err(|_| EngineError::ShuttingDown)?
        .map_err(EngineError::from)
}
