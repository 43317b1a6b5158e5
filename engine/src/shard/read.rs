//! Reads: one pass over a stream's chunks within the request's budgets, long-polls parked on
//! the stream's waiters, and fork reads of what a fork inherited.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::time::{Duration, Instant};

use futures_channel::oneshot;
use pico_s3::StoreError;

use crate::api::{ReadBatch, ReadBound, ReadFrom, ReadRequest, RecordView};
use crate::error::{EngineError, ReadError, StorageFault};
use crate::frame::{self, FRAME_KIND_RECORD};
use crate::limits;
use crate::metrics::{CoreMetrics, GaugeGuard};

use super::state::Shard;
use super::stream::Chunk;

impl Shard {
    pub(super) async fn read(
        self: &Rc<Self>,
        name: &str,
        request: ReadRequest,
    ) -> Result<ReadBatch, ReadError> {
        if let Some(bound) = request.bound {
            return Box::pin(self.read_bounded(name, bound, &request)).await;
        }
        let deadline = request
            .wait_ms
            .map(|ms| self.clock.now() + Duration::from_millis(ms));
        let mut from = match request.from {
            ReadFrom::Offset(offset) => offset,
            ReadFrom::AtLeast(offset) => {
                self.live_stream_id(name, false).await?;
                let stream = self.streams.get(name).ok_or(EngineError::NotFound)?;
                offset.max(stream.state.start_offset)
            }
            ReadFrom::Tail => {
                self.live_stream_id(name, false).await?;
                let stream = self.streams.get(name).ok_or(EngineError::NotFound)?;
                stream.state.durable_offset
            }
        };
        loop {
            self.live_stream_id(name, true).await?;
            if let Some(batch) = self.inherited_below(name, from, &request) {
                return Ok(batch);
            }
            // On the heap while it runs (it may fetch from the object store): a read parked
            // at the tail then holds only this loop's few words.
            let batch = Box::pin(self.read_once(name, from, &request)).await?;
            let Some(deadline) = deadline else {
                return Ok(batch);
            };
            if !batch.records.is_empty() || batch.closed || from < batch.tail {
                return Ok(batch);
            }
            let now = self.clock.now();
            if now >= deadline || self.stopping.get() {
                return Ok(batch);
            }
            let rx = {
                let mut stream = self.streams.get_mut(name).ok_or(EngineError::NotFound)?;
                let (tx, rx) = oneshot::channel();
                let parked = park(
                    &mut stream.waiters,
                    tx,
                    limits::WAITERS_PER_STREAM_MAX,
                    |w| w.is_canceled(),
                );
                if !parked {
                    return Err(EngineError::Overloaded {
                        limit: "waiters per stream",
                        retry_after_sec: limits::OVERLOADED_RETRY_AFTER_SEC,
                    }
                    .into());
                }
                rx
            };
            let parked = GaugeGuard::enter(&self.metrics.live_reads_parked);
            let woken = futures_lite::future::or(async { rx.await.is_ok() }, async {
                glommio::timer::sleep(deadline - now).await;
                false
            })
            .await;
            drop(parked);
            if !woken {
                self.live_stream_id(name, false).await?;
                let batch = Box::pin(self.read_once(name, from, &request)).await?;
                return Ok(batch);
            }
            from = batch.next_offset;
        }
    }

    /// A fork read starting below the fork point: an empty batch naming the source, which the
    /// node reads (see `CoreHandle::read`).
    pub(super) fn inherited_below(
        &self,
        name: &str,
        from: u64,
        request: &ReadRequest,
    ) -> Option<ReadBatch> {
        let stream = self.streams.get(name)?;
        let state = &stream.state;
        let origin = state.fork().filter(|o| from < o.base())?;
        Some(ReadBatch {
            from,
            records: Vec::new(),
            next_offset: from,
            tail: state.durable_offset,
            closed: false,
            content_type: request
                .with_content_type
                .then(|| state.content_type.to_string()),
            inherit: Some(origin.clone()),
            shared_read: None,
        })
    }

    /// A fork reading what it inherited from this stream: records below `bound.until` and
    /// the first `bound.partial_bytes` of record `bound.until`, also when the stream is
    /// deleted for clients or expired (the fork keeps it).
    pub(super) async fn read_bounded(
        self: &Rc<Self>,
        name: &str,
        bound: ReadBound,
        request: &ReadRequest,
    ) -> Result<ReadBatch, ReadError> {
        let end = bound.until + u64::from(bound.partial_bytes > 0);
        let from = {
            let stream = self
                .streams
                .get(name)
                .filter(|s| s.state.id == bound.source_id)
                .ok_or(EngineError::NotFound)?;
            if end > stream.state.durable_offset {
                let source = name.to_string();
                return Err(EngineError::from(StorageFault::ForkSourceShort { source }).into());
            }
            match request.from {
                ReadFrom::Offset(offset) => offset,
                // A trim of the source also removed what its forks inherited from there;
                // past the fork point, the fork's own records come next.
                ReadFrom::AtLeast(offset) => offset.max(stream.state.start_offset.min(end)),
                ReadFrom::Tail => bound.until,
            }
        };
        if from >= end {
            return Ok(ReadBatch {
                from,
                records: Vec::new(),
                next_offset: from,
                tail: end,
                closed: false,
                content_type: None,
                inherit: None,
                shared_read: None,
            });
        }
        if let Some(batch) = self.inherited_below(name, from, request) {
            return Ok(batch);
        }
        let limited = ReadRequest {
            max_records: request.max_records.min((end - from) as usize),
            ..request.clone()
        };
        let mut batch = self.read_once(name, from, &limited).await?;
        batch.records.retain(|r| r.offset < end);
        if bound.partial_bytes > 0 {
            if let Some(last) = batch.records.last_mut().filter(|r| r.offset == bound.until) {
                let keep = (bound.partial_bytes as usize).min(last.body.len());
                last.body = last.body.slice(..keep);
            }
        }
        batch.next_offset = batch.records.last().map_or(from, |r| r.offset + 1);
        batch.tail = end;
        batch.closed = false;
        batch.content_type = None;
        Ok(batch)
    }

    /// One pass over the stored chunks from `from`, bounded by the request's budgets.
    pub(super) async fn read_once(
        self: &Rc<Self>,
        name: &str,
        from: u64,
        request: &ReadRequest,
    ) -> Result<ReadBatch, ReadError> {
        let max_records = request.max_records.clamp(1, limits::RECORDS_PER_READ_MAX);
        let max_bytes = request.max_bytes.max(1);
        let (chunks, tail, closed_durable, stream_id, content_type) = {
            let stream = self.streams.get(name).ok_or(EngineError::NotFound)?;
            stream.state.check_read(from)?;
            let tail = stream.state.durable_offset;
            let first = stream.chunks.partition_point(|c| c.next_offset <= from);
            let mut picked = Vec::new();
            let mut bytes = 0u64;
            for chunk in &stream.chunks[first..] {
                if chunk.first_offset >= tail || bytes >= max_bytes as u64 {
                    break;
                }
                bytes += chunk.byte_end - chunk.byte_start;
                picked.push(*chunk);
            }
            let content_type = request
                .with_content_type
                .then(|| stream.state.content_type.to_string());
            (
                picked,
                tail,
                stream.state.closed_durable,
                stream.state.id,
                content_type,
            )
        };
        let mut records = Vec::new();
        let mut bytes = 0usize;
        let mut next = from;
        let mut prefetched = 0;
        // Why the pass stopped short of its budgets, if it did: the records before it are
        // answered, and the error only when there are none (a reader gets everything up to
        // damaged or unreachable bytes, then the error from there on).
        let mut stopped: Option<EngineError> = None;
        'chunks: for (i, chunk) in chunks.iter().enumerate() {
            while prefetched < chunks.len().min(i + limits::READ_CHUNKS_AHEAD) {
                self.prefetch(&chunks[prefetched]);
                prefetched += 1;
            }
            // The catalog tiles a stream's records from its start (`check_read`: the read is at
            // or past it; a fork's reads below its own records go to its source), so a chunk
            // that begins past the record wanted next means a record no catalog entry places.
            if chunk.first_offset > next {
                let error = EngineError::from(StorageFault::RecordUnplaced {
                    stream_id,
                    offset: next,
                });
                self.report_damage(name, next, chunk, &error);
                stopped = Some(error);
                break 'chunks;
            }
            let got = match self.chunk_bytes(chunk).await {
                Ok(got) => got,
                Err(error) => {
                    let error = self.missing_if_still_read(name, chunk, error);
                    self.report_damage(name, next, chunk, &error);
                    stopped = Some(error);
                    break 'chunks;
                }
            };
            // A sealed segment's chunk may span other streams' frames: skip them by header.
            // Frames still in this process's memory were CRC'd when written; what came back
            // from the object store is checked, once while its blocks stay cached.
            let verify_crc = got.check_generation.is_some();
            let mut frames = frame::SplitFrames::new(&got.pieces, verify_crc);
            // The chunk holds this stream's records `first_offset..next_offset`, each once and
            // in order: the one the read wants next, and every one up to the chunk's end (or the
            // durable tail), or the catalog and the bytes disagree. Read past, such a gap would
            // answer a later record as if the missing ones had never been written.
            let chunk_end = chunk.next_offset.min(tail);
            let missing = |offset| {
                EngineError::from(StorageFault::RecordMissing {
                    key: self.segment_key(chunk.segment),
                    stream_id,
                    offset,
                })
            };
            while let Some(found) = frames.next_frame() {
                let found = match found {
                    Ok(found) => found,
                    Err(error) => {
                        let error = EngineError::from(StorageFault::CorruptFrame {
                            key: self.segment_key(chunk.segment),
                            error,
                        });
                        self.report_damage(name, next, chunk, &error);
                        stopped = Some(error);
                        break 'chunks;
                    }
                };
                let (header, len) = (found.header, found.len);
                if header.stream_id.get() != stream_id
                    || header.kind != FRAME_KIND_RECORD
                    || header.offset.get() < next
                {
                    continue;
                }
                let frame = frame::frame_at(found.buf, found.pos, &header, len);
                if frame.offset >= tail
                    || records.len() >= max_records
                    || (!records.is_empty() && bytes + len > max_bytes)
                {
                    break 'chunks;
                }
                if frame.offset > next && next < chunk_end {
                    let error = missing(next);
                    self.report_damage(name, next, chunk, &error);
                    stopped = Some(error);
                    break 'chunks;
                }
                bytes += len;
                next = frame.offset + 1;
                records.push(RecordView {
                    offset: frame.offset,
                    timestamp_ms: frame.timestamp_ms,
                    headers: frame.headers,
                    body: frame.body,
                });
            }
            if next < chunk_end {
                let error = missing(next);
                self.report_damage(name, next, chunk, &error);
                stopped = Some(error);
                break 'chunks;
            }
            if let Some(generation) = got.check_generation {
                // Every frame of the chunk passed (a read that stops inside one marks nothing).
                let (start, end) = (chunk.byte_start, chunk.byte_end);
                self.segments
                    .mark_checked(chunk.segment, start, end, generation);
            }
        }
        if records.is_empty() {
            if let Some(error) = stopped {
                return Err(error.into());
            }
            next = from;
        }
        Ok(ReadBatch {
            from,
            records,
            next_offset: next,
            tail,
            closed: closed_durable && next >= tail,
            content_type,
            inherit: None,
            shared_read: None,
        })
    }
}

/// When a core last logged damaged stored bytes, how many damaged reads it met since, and
/// when it last dropped each damaged segment's blocks from the read cache.
pub(super) struct DamageLog {
    lines: pico_meta::LogLimit,
    /// Segment number → when its blocks last left the cache for a fetch again (at most
    /// `limits::DAMAGED_SEGMENTS_MAX`).
    refetched_at: RefCell<HashMap<u64, Instant>>,
}

impl Default for DamageLog {
    fn default() -> DamageLog {
        DamageLog {
            lines: pico_meta::LogLimit::new(limits::DAMAGE_LOG_INTERVAL_MS),
            refetched_at: RefCell::default(),
        }
    }
}

impl DamageLog {
    /// Whether segment `no`, found damaged `now`, leaves the read cache to be fetched again:
    /// not within `limits::DAMAGE_REFETCH_INTERVAL_MS` of the last time it did.
    fn refetch_due(&self, no: u64, now: Instant) -> bool {
        let interval = Duration::from_millis(limits::DAMAGE_REFETCH_INTERVAL_MS);
        let mut refetched = self.refetched_at.borrow_mut();
        if refetched
            .get(&no)
            .is_some_and(|at| now.saturating_duration_since(*at) < interval)
        {
            return false;
        }
        if refetched.len() >= limits::DAMAGED_SEGMENTS_MAX {
            refetched.retain(|_, at| now.saturating_duration_since(*at) < interval);
        }
        if refetched.len() >= limits::DAMAGED_SEGMENTS_MAX {
            let oldest = refetched
                .iter()
                .min_by_key(|(_, at)| **at)
                .map(|(no, _)| *no);
            if let Some(oldest) = oldest {
                refetched.remove(&oldest);
            }
        }
        refetched.insert(no, now);
        true
    }

    /// Whether a damaged read met `now` gets a log line (none in the last
    /// `limits::DAMAGE_LOG_INTERVAL_MS`), with how many went unlogged before it; otherwise
    /// it is counted for the next line.
    fn due(&self, now: Instant) -> Option<u64> {
        self.lines.due(now)
    }
}

impl Shard {
    /// `error` as a missing object ([`StorageFault::ObjectMissing`], damage) when the bucket
    /// has no object for `chunk` while `stream` still reads from its segment. An object gone
    /// because its records are (a trim, retention, a compaction's swap racing the read) stays
    /// the store's `NotFound`.
    fn missing_if_still_read(
        &self,
        stream: &str,
        chunk: &Chunk,
        error: EngineError,
    ) -> EngineError {
        let EngineError::Storage(StorageFault::Object {
            key,
            error: StoreError::NotFound(_),
        }) = &error
        else {
            return error;
        };
        let still_read = self.streams.get(stream).is_some_and(|s| {
            s.chunks
                .iter()
                .any(|c| c.segment == chunk.segment && c.byte_start == chunk.byte_start)
        });
        if !still_read {
            return error;
        }
        StorageFault::ObjectMissing { key: key.clone() }.into()
    }

    /// The object key of segment `no`, for messages: a segment not (only) in the bucket is
    /// named by its number.
    fn segment_key(&self, no: u64) -> String {
        self.segments.remote(no).map_or_else(
            || format!("(segment {no}, in memory)"),
            |(key, _)| key.to_string(),
        )
    }

    /// A read of `stream` from `offset` stopped at `chunk` with `error`. Damage of the stored
    /// bytes is counted, logged (rate-limited) and dropped from the read cache (at most once
    /// per `limits::DAMAGE_REFETCH_INTERVAL_MS` per segment), so a later read fetches those
    /// bytes again; other errors are the caller's answer alone.
    fn report_damage(&self, stream: &str, offset: u64, chunk: &Chunk, error: &EngineError) {
        if !error.is_damage() {
            return;
        }
        CoreMetrics::add(&self.metrics.damaged_reads, 1);
        let now = self.clock.now();
        if self.damage_log.refetch_due(chunk.segment, now) {
            self.segments
                .drop_damaged(chunk.segment, chunk.byte_start, chunk.byte_end);
        }
        let Some(unlogged) = self.damage_log.due(now) else {
            return;
        };
        let key = self.segment_key(chunk.segment);
        let also = if unlogged > 0 {
            format!(" ({unlogged} more damaged reads on this core since the last such line)")
        } else {
            String::new()
        };
        log::error!(
            "core {}: stream {stream}: stored data is damaged at or after offset {offset} \
             (object {key}, bytes {}..{}): {error}; reads from there fail until the object \
             is restored{also}",
            self.core,
            chunk.byte_start,
            chunk.byte_end,
        );
    }
}

/// Adds `waiter` to a stream's waiters unless `max` live ones wait already (`false`). The
/// waiters of readers that left (`gone`) are dropped only when the list is full to its
/// capacity, and the capacity then doubles past what stays, so parking is amortized O(1):
/// pruning at every park would make 10,000 subscribers re-parking after each append cost 50
/// million checks per append.
pub(super) fn park<T>(
    waiters: &mut Vec<T>,
    waiter: T,
    max: usize,
    mut gone: impl FnMut(&T) -> bool,
) -> bool {
    if waiters.len() == waiters.capacity() || waiters.len() >= max {
        waiters.retain(|w| !gone(w));
        if waiters.len() >= max {
            return false;
        }
        // At least as many parks as the list now holds before the next prune.
        waiters.reserve(waiters.len().max(1));
    }
    waiters.push(waiter);
    true
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::park;

    #[test]
    fn parking_many_waiters_checks_each_a_bounded_number_of_times() {
        let checks = Cell::new(0u64);
        let mut waiters: Vec<(u32, bool)> = Vec::new();
        const N: u32 = 10_000;
        // Every tenth reader has left by the time the next one parks.
        for i in 0..N {
            let gone = |w: &(u32, bool)| {
                checks.set(checks.get() + 1);
                w.1
            };
            assert!(park(&mut waiters, (i, i % 10 == 0), 20_000, gone));
        }
        assert!(
            checks.get() <= 4 * u64::from(N),
            "{} checks for {N} parks",
            checks.get()
        );
        let live = waiters.iter().filter(|w| !w.1).count();
        assert_eq!(live, 9_000, "every reader still waiting is kept");
    }

    #[test]
    fn the_limit_counts_live_waiters_only() {
        let mut waiters: Vec<bool> = Vec::with_capacity(3);
        assert!(park(&mut waiters, false, 3, |gone| *gone));
        assert!(park(&mut waiters, true, 3, |gone| *gone));
        assert!(park(&mut waiters, false, 3, |gone| *gone));
        // Full, but one of the three has left: its place is taken.
        assert!(park(&mut waiters, false, 3, |gone| *gone));
        assert_eq!(waiters, vec![false, false, false]);
        assert!(
            !park(&mut waiters, false, 3, |gone| *gone),
            "three live waiters"
        );
    }
}

#[cfg(test)]
mod damage_log_tests {
    use super::*;

    #[test]
    fn a_damaged_segment_is_fetched_again_once_per_interval_and_the_map_stays_bounded() {
        let log = DamageLog::default();
        let start = Instant::now();
        let interval = Duration::from_millis(limits::DAMAGE_REFETCH_INTERVAL_MS);
        assert!(log.refetch_due(7, start));
        assert!(!log.refetch_due(7, start + interval / 2));
        assert!(log.refetch_due(8, start + interval / 2));
        assert!(log.refetch_due(7, start + interval));
        for no in 0..limits::DAMAGED_SEGMENTS_MAX as u64 + 10 {
            assert!(log.refetch_due(1_000 + no, start + interval));
            assert!(log.refetched_at.borrow().len() <= limits::DAMAGED_SEGMENTS_MAX);
        }
    }
}
