//! Where a chunk's bytes come from: an open segment (the journal's), a sealed one in memory, or
//! blocks of an uploaded one (ranged GETs with readahead, one GET per block in flight) through
//! the segment table's read cache, which keeps both caches within their byte budget.

use std::rc::Rc;

use bytes::Bytes;
use futures_channel::oneshot;

use crate::error::{EngineError, StorageFault};
use crate::limits;
use crate::metrics::CoreMetrics;

use super::blocks::{BlockWaiter, Lookup};
use super::state::Shard;
use super::stream::Chunk;
use super::table::Located;

/// A chunk's frames as [`Shard::chunk_bytes`] found them.
pub(super) struct ChunkBytes {
    pub(super) pieces: Vec<Bytes>,
    /// `Some` when their CRCs need checking: blocks from the store no read has checked yet,
    /// with the cache generation they were taken at, for `ReadCache::mark_checked` once every
    /// frame passed. `None` when the bytes never left this process's memory, or a read checked
    /// them since their blocks were fetched.
    pub(super) check_generation: Option<u64>,
}

impl ChunkBytes {
    fn in_memory(bytes: Bytes) -> ChunkBytes {
        ChunkBytes {
            pieces: vec![bytes],
            check_generation: None,
        }
    }
}

impl Shard {
    /// The frames of one chunk, as consecutive pieces (scan them with `frame::SplitFrames`): a
    /// slice of a sealed segment in memory, a copy out of an open segment, or slices of the
    /// blocks of an uploaded one from the block cache (ranged GETs on a miss), one per block so
    /// a chunk across blocks is not joined by copying.
    pub(super) async fn chunk_bytes(
        self: &Rc<Self>,
        chunk: &Chunk,
    ) -> Result<ChunkBytes, EngineError> {
        let (start, end) = (chunk.byte_start as usize, chunk.byte_end as usize);
        let located = self
            .segments
            .locate(chunk.segment, start, end, self.clock.now())?;
        let (key, size) = match located {
            Located::Memory(bytes) => return Ok(ChunkBytes::in_memory(bytes)),
            Located::Open => {
                let bytes = self
                    .journal
                    .open_slice(chunk.segment, start, end)
                    .ok_or(EngineError::Storage(StorageFault::OpenSegmentGone))?;
                return Ok(ChunkBytes::in_memory(bytes));
            }
            Located::Remote(key, size) => (key, size),
        };
        if end as u64 > size {
            let key = key.to_string();
            return Err(StorageFault::SegmentShort { key, size }.into());
        }
        let (first, last) = (
            start / limits::CACHE_BLOCK_BYTES,
            (end - 1) / limits::CACHE_BLOCK_BYTES,
        );
        let generation = self.segments.generation();
        let mut pieces = Vec::with_capacity(last + 1 - first);
        for index in first..=last {
            let block = self.block(chunk.segment, &key, size, index as u64).await?;
            let offset = index * limits::CACHE_BLOCK_BYTES;
            let from = start.max(offset) - offset;
            let to = end.min(offset + block.len()) - offset;
            if from > to {
                let key = key.to_string();
                return Err(StorageFault::BlockShort { key, index }.into());
            }
            pieces.push(block.slice(from..to));
        }
        // Checked as cached now, and by the very blocks taken above: a block that left the
        // cache while this read waited for another may be back as a fetch no read checked,
        // while the range counts as checked for it (the generation moved on).
        let checked =
            self.segments
                .checked_at(generation, chunk.segment, chunk.byte_start, chunk.byte_end);
        Ok(ChunkBytes {
            pieces,
            check_generation: (!checked).then_some(generation),
        })
    }

    /// One block of an uploaded segment: cached, being fetched (wait for that GET), or fetched
    /// now with one ranged GET that also reads ahead when the reader moves sequentially (the
    /// window doubles up to `limits::READAHEAD_BLOCKS_MAX`).
    pub(super) async fn block(
        self: &Rc<Self>,
        no: u64,
        key: &Rc<str>,
        size: u64,
        index: u64,
    ) -> Result<Bytes, EngineError> {
        let found = self.segments.lookup(no, index);
        let rx = match found {
            Lookup::Hit(bytes) => {
                CoreMetrics::add(&self.metrics.cache_hits, 1);
                return Ok(bytes);
            }
            Lookup::Wait(rx) => rx,
            Lookup::Miss => {
                CoreMetrics::add(&self.metrics.cache_misses, 1);
                let (tx, rx) = oneshot::channel();
                self.start_fetch(no, key, size, index, Some(tx));
                rx
            }
        };
        rx.await.map_err(|_| EngineError::ShuttingDown)?
    }

    /// Starts one ranged GET from block `index` of an uploaded segment, which must be
    /// neither cached nor loading, reading ahead when the reader moves sequentially (the
    /// window doubles up to `limits::READAHEAD_BLOCKS_MAX`); `waiter` learns block `index`'s outcome.
    pub(super) fn start_fetch(
        self: &Rc<Self>,
        no: u64,
        key: &Rc<str>,
        size: u64,
        index: u64,
        waiter: Option<BlockWaiter>,
    ) {
        let block_count = size.div_ceil(limits::CACHE_BLOCK_BYTES as u64);
        let count = self.segments.start_loading(no, index, block_count, waiter);
        let start = index * limits::CACHE_BLOCK_BYTES as u64;
        let end = ((index + count) * limits::CACHE_BLOCK_BYTES as u64).min(size);
        let fetch = self.store.get_range(key, start, end);
        let this = self.clone();
        let key = key.to_string();
        // Spawned once no borrow is held (glommio may poll it right away).
        glommio::spawn_local(async move {
            let result = match fetch.await {
                Ok(Ok(bytes)) => Ok(bytes),
                Ok(Err(error)) => Err(StorageFault::Object { key, error }.into()),
                Err(_) => Err(EngineError::ShuttingDown),
            };
            this.finish_blocks(no, index, count, result);
        })
        .detach();
    }

    /// Starts the GETs of a chunk's blocks that are neither cached nor loading, without
    /// waiting for them: a catch-up read keeps [`limits::READ_CHUNKS_AHEAD`] chunks in flight.
    pub(super) fn prefetch(self: &Rc<Self>, chunk: &Chunk) {
        let Some((key, size)) = self.segments.remote(chunk.segment) else {
            return;
        };
        if chunk.byte_end > size || chunk.byte_end <= chunk.byte_start {
            // chunk_bytes reports it.
            return;
        }
        let first = chunk.byte_start / limits::CACHE_BLOCK_BYTES as u64;
        let last = (chunk.byte_end - 1) / limits::CACHE_BLOCK_BYTES as u64;
        for index in first..=last {
            if !self.segments.has_block(chunk.segment, index) {
                CoreMetrics::add(&self.metrics.cache_misses, 1);
                self.start_fetch(chunk.segment, &key, size, index, None);
            }
        }
    }

    /// Files the blocks one ranged GET brought (or fails their waiters) and keeps the block
    /// cache within its byte budget, oldest first.
    pub(super) fn finish_blocks(
        &self,
        no: u64,
        first: u64,
        count: u64,
        result: Result<Bytes, EngineError>,
    ) {
        let wake =
            self.segments
                .finish_blocks(no, first, count, &result, self.config.segment_cache_bytes);
        for (waiters, outcome) in wake {
            for waiter in waiters {
                let _ = waiter.send(outcome.clone());
            }
        }
    }

    /// Drops the table entries (and cached bytes) of garbage-collected segments.
    pub(crate) fn forget_segments(&self, keys: &[String]) {
        let keys: std::collections::HashSet<&str> = keys.iter().map(String::as_str).collect();
        self.segments.forget_keys(&keys);
    }

    /// Garbage collection deleted `count` segments.
    pub(crate) fn count_collected(&self, count: usize) {
        CoreMetrics::add(&self.metrics.gc_segments_deleted, count as u64);
    }
}
