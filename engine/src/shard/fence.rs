//! Fenced metadata writes (cluster): the fence of a stream's writes, and letting a stream go
//! when another node owns it now (its pending appends fail, its readers are sent on).

use std::rc::Rc;

use pico_meta::{Fence, MetaError, NodeId, SegmentRecord};

use crate::config::Durability;
use crate::error::{EngineError, NotOwnerReason};

use super::state::Shard;
use super::stream::Stream;

impl Shard {
    /// The fence of metadata writes for `stream` (cluster only).
    pub(super) fn fence(&self, stream: &Stream) -> Option<Fence> {
        self.cluster.as_ref().map(|cluster| Fence {
            node: cluster.node_id(),
            node_epoch: cluster.node_epoch(),
            epoch: stream.epoch,
        })
    }

    /// A fenced metadata write's result: when another node owns the stream now, this core
    /// lets it go, and the request is told to retry there.
    pub(super) fn meta_result<T>(
        &self,
        name: &str,
        id: u64,
        result: Result<T, MetaError>,
    ) -> Result<T, EngineError> {
        match result {
            Ok(value) => Ok(value),
            Err(MetaError::Fenced(message)) => {
                log::warn!("core {}: {name}: {message}", self.core);
                self.forget_stream(name, id, None);
                Err(NotOwnerReason::Fenced(message).into())
            }
            // The write may have committed or not: what this core holds of the stream may be
            // wrong either way (a delete that did commit leaves a stream that must take no
            // append). It lets the stream go; the next request reads the row back from the
            // catalog before anything is accepted, once the appends already on their way are
            // committed or refused. Those are answered by their own segment's commit: the
            // stream still belongs here at the same epoch, so they are stored unless the
            // catalog refuses them (a delete that did commit), never failed as not stored
            // while their commit may still land.
            Err(MetaError::Unknown(message)) => {
                log::error!("core {}: {name}: {message}", self.core);
                self.let_go(name, id, None, false);
                Err(NotOwnerReason::OutcomeUnknown(message).into())
            }
            Err(e) => Err(e.into()),
        }
    }

    /// What a request for a stream this core does not hold gets: a redirect when another node
    /// is known to serve it, else not found.
    pub(super) fn missing(&self, name: &str) -> EngineError {
        let (Some(cluster), Some(node)) = (&self.cluster, self.streams.moved_to(name)) else {
            return EngineError::NotFound;
        };
        if node == 0 {
            EngineError::NotOwner(NotOwnerReason::MovedAway)
        } else {
            cluster.moved(node)
        }
    }

    /// Drops a stream this node no longer owns (fenced, revalidated away, or handed off):
    /// its pending appends fail, its readers wake up and are sent on (`to`: the new owner when
    /// known).
    pub(super) fn forget_stream(&self, name: &str, id: u64, to: Option<NodeId>) {
        self.let_go(name, id, to, true);
    }

    /// Drops stream `name` (incarnation `id`) from this core; its readers wake up and are sent
    /// on (`to`: the new owner when known).
    ///
    /// With `fence` the stream moved on (another owner, or a newer epoch): its pending appends
    /// fail, and the catalog refuses their frames, which carry the old epoch. Without, it may
    /// still be this core's at the same epoch: each pending append is answered by its
    /// segment's commit, and a load of any stream from the catalog here first waits until the
    /// segments holding its frames are committed or refused (`adopt`). Read before, the
    /// catalog would lack those frames, and the stream loaded again would hand their offsets
    /// out a second time.
    fn let_go(&self, name: &str, id: u64, to: Option<NodeId>, fence: bool) {
        let removed = self.streams.remove(name, id);
        self.streams.remember_moved(name, to.unwrap_or(0));
        if let Some(stream) = removed {
            if fence {
                self.journal.fence_acks(id, stream.epoch);
            } else {
                let unsettled = stream
                    .chunks
                    .iter()
                    .map(|chunk| chunk.segment)
                    .filter(|&no| !self.segments.uploaded(no))
                    .max();
                if let Some(no) = unsettled {
                    self.streams.reload_after(no);
                }
            }
            for waiter in stream.waiters {
                let _ = waiter.send(());
            }
            self.release_acks();
        }
    }

    /// A sealed segment's entries for stream `id`, written at owner epoch `epoch`, were
    /// refused at commit: another node owns the stream now, or this node owns a newer
    /// incarnation of it (loaded from the catalog, without these frames). The caller has
    /// already fenced `(id, epoch)`, so none of those appends is acknowledged.
    pub(super) fn lost_at_commit(
        &self,
        id: u64,
        epoch: u64,
        name: Option<&Rc<str>>,
        record: &SegmentRecord,
    ) {
        let runs = record
            .streams
            .iter()
            .find(|e| e.stream_id == id)
            .map(|e| format!("{:?}", e.runs))
            .unwrap_or_default();
        if self.config.durability == Durability::Object {
            log::warn!(
                "core {}: the catalog refused stream {id}'s records {runs} (it moved to another \
                 node, was deleted, or they overlap committed ones); those appends failed",
                self.core
            );
        } else {
            log::error!(
                "core {}: the catalog refused stream {id}'s records in segment {} (it moved to \
                 another node or was deleted before they were stored, or they overlap committed \
                 ones): records {runs}, acknowledged with local durability, are not part of the \
                 stream (quarantined with the reason: `pico admin quarantine ls`)",
                self.core,
                record.key
            );
        }
        let Some(name) = name else { return };
        // A newer incarnation loaded here since is not the refused one: it stays.
        let refused_is_live = self
            .streams
            .get(name)
            .is_some_and(|s| s.state.id == id && s.epoch == epoch);
        if refused_is_live {
            self.forget_stream(name, id, None);
        }
    }
}
