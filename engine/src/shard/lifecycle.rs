//! A stream's life apart from its records: lookup with lazy expiry, head, trim, retention
//! changes, delete (soft while forks read it), fork references, listing and shutdown.

use crate::api::{StreamInfo, StreamSummary};
use crate::error::{CreateError, EngineError, InvalidCreate, TrimError};
use crate::limits;
use crate::metrics::CoreMetrics;
use crate::rules::{ForkOrigin, StreamConfig};
use pico_meta::ForkRow;

use super::state::Shard;
use super::stream::{info_of, Stream};

impl Shard {
    /// Looks a stream up, deleting it first if it expired (lazy expiry). An expired stream
    /// that forks still read is kept for them but is gone for clients.
    pub(super) async fn live_stream_id(&self, name: &str, touch: bool) -> Result<u64, EngineError> {
        let now = self.clock.now_ms();
        let (id, expired) = {
            let Some(mut stream) = self.streams.get_mut(name) else {
                return Err(self.missing(name));
            };
            if stream.state.soft_deleted {
                return Err(EngineError::Gone);
            }
            let expired = stream.state.is_expired(now);
            if expired && stream.state.extras().fork_refs > 0 {
                return Err(EngineError::NotFound);
            }
            if touch && !expired {
                stream.state.touch(now);
                self.record_access(&mut stream);
            }
            (stream.state.id, expired)
        };
        if expired {
            // Rare, and boxed so that it does not size every read's future.
            Box::pin(self.remove_stream(name, id)).await?;
            return Err(EngineError::NotFound);
        }
        Ok(id)
    }

    /// Writes a sliding-TTL stream's idle clock to the metadata log once it moved by a tenth
    /// of the TTL (at least 1 s), so a restart neither revives an expired stream nor
    /// forgets recent reads; far fewer writes than reads.
    pub(super) fn record_access(&self, stream: &mut Stream) {
        let Some(ttl_sec) = stream.state.extras().ttl_sec else {
            return;
        };
        let step_ms = i64::try_from(ttl_sec.saturating_mul(100))
            .unwrap_or(i64::MAX)
            .max(1000);
        if stream.state.last_access_ms - stream.recorded_access_ms >= step_ms {
            stream.recorded_access_ms = stream.state.last_access_ms;
            drop(self.meta.touch_stream_fenced(
                stream.state.id,
                stream.state.last_access_ms,
                self.fence(stream),
            ));
        }
    }

    pub(super) async fn head(&self, name: &str) -> Result<StreamInfo, EngineError> {
        self.live_stream_id(name, false).await?;
        let stream = self.streams.get(name).ok_or(EngineError::NotFound)?;
        Ok(info_of(&stream.state))
    }

    /// Trim: readers see the new start at once; the catalog records it before the answer.
    pub(super) async fn trim(&self, name: &str, offset: u64) -> Result<u64, TrimError> {
        self.trim_to(name, offset, true).await
    }

    /// A trim; `touch`: it counts as an access for a sliding TTL (a client's trim does, the
    /// retention pass's does not).
    pub(super) async fn trim_to(
        &self,
        name: &str,
        offset: u64,
        touch: bool,
    ) -> Result<u64, TrimError> {
        let id = self.live_stream_id(name, touch).await?;
        // The metadata log first, then memory: a start readers saw must be the one a restart
        // finds (a kill between the two brought trimmed records back).
        let (start, fence) = {
            let stream = self.streams.get(name).ok_or(EngineError::NotFound)?;
            let start = stream.state.trimmed_start(offset);
            // Forks read this stream's records below their fork points, through this core's
            // index and from its segments: a trim would take them away (and the garbage
            // collector their objects). Retention skips such a stream for the same reason.
            let forks = stream.state.extras().fork_refs;
            if forks > 0 && start > stream.state.start_offset {
                return Err(TrimError::ReadByForks { forks });
            }
            (start, self.fence(&stream))
        };
        let trimmed = self
            .meta
            .trim_stream_fenced(id, start, fence)
            .await
            .map_err(|_| EngineError::ShuttingDown)?;
        self.meta_result(name, id, trimmed)?;
        let mut stream = self
            .streams
            .get_mut(name)
            .filter(|s| s.state.id == id)
            .ok_or(EngineError::NotFound)?;
        // Trims only move the start forward, so two that cross apply in either order.
        let start = stream.state.trim(start);
        stream.chunks.retain(|c| c.next_offset > start);
        Ok(start)
    }

    /// Changes the stream's retention policy. The change is applied to the policy in memory
    /// and the result sent to the metadata log in one step, so concurrent changes build on
    /// each other and reach the log in the order they were made (its commands run in order);
    /// answered once the log has it. A change the log refuses is taken back, unless another
    /// one was made on top of it meanwhile (that one's write carries it).
    pub(super) async fn configure(
        &self,
        name: &str,
        change: crate::api::RetentionChange,
    ) -> Result<StreamInfo, EngineError> {
        let id = self.live_stream_id(name, false).await?;
        let (before, after, fence) = {
            let mut stream = self.streams.get_mut(name).ok_or(EngineError::NotFound)?;
            let before = stream.state.extras().retention;
            let after = change.apply(before);
            stream.state.extras_mut().retention = after;
            (before, after, self.fence(&stream))
        };
        let configured = self
            .meta
            .configure_stream_fenced(id, after, fence)
            .await
            .map_err(|_| EngineError::ShuttingDown);
        let outcome = configured.and_then(|answer| self.meta_result(name, id, answer));
        let stream = self.streams.get_mut(name).filter(|s| s.state.id == id);
        match (outcome, stream) {
            (Ok(()), Some(stream)) => Ok(info_of(&stream.state)),
            (Ok(()), None) => Err(EngineError::NotFound),
            (Err(e), stream) => {
                if let Some(mut stream) = stream.filter(|s| s.state.extras().retention == after) {
                    stream.state.extras_mut().retention = before;
                }
                Err(e)
            }
        }
    }

    /// Deletes a stream; one that forks still read is only deleted for clients (soft
    /// delete): `410` from then on, its name stays taken, its records stay for the forks.
    /// Deletes `name`; for a fork, the source it read (its reference is the caller's to give
    /// back, so the source's name is free once the delete is answered).
    pub(super) async fn delete(&self, name: &str) -> Result<Option<(String, u64)>, EngineError> {
        let id = self.live_stream_id(name, false).await?;
        let has_forks = self
            .streams
            .get(name)
            .is_some_and(|s| s.state.extras().fork_refs > 0);
        if !has_forks {
            return self.remove_stream_keeping_release(name, id).await;
        }
        let fence = self.streams.get(name).and_then(|s| self.fence(&s));
        let deleted = self
            .meta
            .soft_delete_stream_fenced(id, fence)
            .await
            .map_err(|_| EngineError::ShuttingDown)?;
        self.meta_result(name, id, deleted)?;
        if let Some(mut stream) = self.streams.get_mut(name) {
            stream.state.soft_deleted = true;
            for waiter in stream.waiters.drain(..) {
                let _ = waiter.send(());
            }
        }
        Ok(None)
    }

    /// Validates a fork point on this (source) stream and counts the fork's reference.
    pub(super) async fn fork_acquire(
        &self,
        name: &str,
        offset: u64,
        partial_bytes: u64,
    ) -> Result<(ForkOrigin, StreamConfig), CreateError> {
        match self.live_stream_id(name, false).await {
            Err(EngineError::Gone) => return Err(CreateError::SourceGone),
            other => other?,
        };
        let mut stream = self.streams.get_mut(name).ok_or(EngineError::NotFound)?;
        let source_depth = stream.state.fork().map_or(0, |f| f.depth);
        if source_depth >= limits::FORK_DEPTH_MAX {
            let max = limits::FORK_DEPTH_MAX;
            return Err(CreateError::Invalid(InvalidCreate::ForkTooDeep { max }));
        }
        let end = offset.saturating_add(u64::from(partial_bytes > 0));
        if end > stream.state.durable_offset {
            let tail = stream.state.durable_offset;
            return Err(CreateError::Invalid(InvalidCreate::ForkPastTail { tail }));
        }
        stream.state.extras_mut().fork_refs += 1;
        let origin = ForkOrigin {
            row: ForkRow {
                source: name.to_string(),
                source_id: stream.state.id,
                offset,
                partial_bytes,
            },
            depth: source_depth + 1,
        };
        Ok((origin, stream.state.config()))
    }

    /// A fork of this stream is gone: the last one takes a deleted or expired source with it.
    pub(super) async fn fork_release(&self, name: &str, source_id: u64) -> Result<(), EngineError> {
        let remove = {
            let Some(mut stream) = self
                .streams
                .get_mut(name)
                .filter(|s| s.state.id == source_id)
            else {
                return Ok(());
            };
            let extras = stream.state.extras_mut();
            extras.fork_refs = extras.fork_refs.saturating_sub(1);
            extras.fork_refs == 0
                && (stream.state.soft_deleted || stream.state.is_expired(self.clock.now_ms()))
        };
        if remove {
            self.remove_stream(name, source_id).await?;
        }
        Ok(())
    }

    /// Sources to tell that one of their forks is gone (drained by the node's release task).
    pub(crate) fn take_fork_releases(&self) -> Vec<(String, u64)> {
        std::mem::take(&mut *self.fork_releases.borrow_mut())
    }

    /// Releases for the node's release task to make: new ones, or ones that failed and are
    /// tried again.
    pub(crate) fn queue_fork_releases(&self, releases: impl IntoIterator<Item = (String, u64)>) {
        let mut queued = self.fork_releases.borrow_mut();
        let before = queued.len();
        queued.extend(releases);
        if queued.len() > before {
            self.fork_released.notify();
        }
    }

    /// Removes the stream; a fork's reference to its source is given back by the release loop.
    pub(super) async fn remove_stream(&self, name: &str, id: u64) -> Result<(), EngineError> {
        let release = self.remove_stream_keeping_release(name, id).await?;
        self.queue_fork_releases(release);
        Ok(())
    }

    /// Removes the stream; a fork's source and source id are returned for the caller to
    /// release.
    async fn remove_stream_keeping_release(
        &self,
        name: &str,
        id: u64,
    ) -> Result<Option<(String, u64)>, EngineError> {
        let fence = self
            .streams
            .get(name)
            .filter(|s| s.state.id == id)
            .and_then(|s| self.fence(&s));
        let deleted = self
            .meta
            .delete_stream_fenced(id, fence)
            .await
            .map_err(|_| EngineError::ShuttingDown)?;
        self.meta_result(name, id, deleted)?;
        if let Some(stream) = self.streams.remove(name, id) {
            for waiter in stream.waiters {
                let _ = waiter.send(());
            }
            if let Some(origin) = stream.state.fork().cloned() {
                return Ok(Some((origin.row.source, origin.row.source_id)));
            }
        }
        Ok(None)
    }

    pub(crate) fn list(&self, prefix: &str, start_after: &str, limit: usize) -> Vec<StreamSummary> {
        let now = self.clock.now_ms();
        let lower = if start_after >= prefix {
            start_after
        } else {
            prefix
        };
        self.streams.scan(|streams| {
            streams
                .range::<str, _>((std::ops::Bound::Included(lower), std::ops::Bound::Unbounded))
                .filter(|(name, _)| &***name != start_after)
                .take_while(|(name, _)| name.starts_with(prefix))
                .filter(|(_, stream)| !stream.state.is_expired(now))
                .take(limit)
                .map(|(name, stream)| StreamSummary {
                    name: name.to_string(),
                    info: info_of(&stream.state),
                })
                .collect()
        })
    }

    /// Graceful shutdown: parked readers get their (possibly empty) answer now, and no read
    /// waits from here on.
    pub(crate) fn begin_shutdown(&self) {
        self.stopping.set(true);
        self.streams.for_each_mut(|stream| {
            for waiter in stream.waiters.drain(..) {
                let _ = waiter.send(());
            }
        });
    }

    pub(crate) fn is_stopping(&self) -> bool {
        self.stopping.get()
    }

    /// What this core counts.
    pub(crate) fn metrics(&self) -> &CoreMetrics {
        &self.metrics
    }
}
