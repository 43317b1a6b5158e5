//! Where a chunk's bytes come from: an open segment, a sealed one in memory, or blocks of an
//! uploaded one (ranged GETs with readahead, one GET per block in flight), and the byte budget
//! of both caches with its eviction order.

use std::rc::Rc;

use bytes::Bytes;
use futures_channel::oneshot;

use crate::error::EngineError;
use crate::limits;
use crate::metrics::CoreMetrics;

use super::state::{Block, Readahead, SegmentData, Shard};
use super::stream::Chunk;

impl Shard {
    /// The frames of one chunk: a slice of a sealed segment in memory, a copy out of an open
    /// segment, or blocks of an uploaded one from the block cache (ranged GETs on a miss).
    /// The bytes, and whether they never left this process's memory (no CRC check needed).
    pub(super) async fn chunk_bytes(
        self: &Rc<Self>,
        chunk: &Chunk,
    ) -> Result<(Bytes, bool), EngineError> {
        let (start, end) = (chunk.byte_start as usize, chunk.byte_end as usize);
        let (key, size) = {
            let segments = self.segments.borrow();
            let slot = segments.get(&chunk.segment).ok_or_else(|| {
                EngineError::Storage(format!("segment {} is gone", chunk.segment))
            })?;
            match &slot.data {
                SegmentData::Memory(bytes) => return Ok((bytes.slice(start..end), true)),
                SegmentData::Open => {
                    let log = self.log.borrow();
                    let open = log
                        .iter()
                        .find(|s| s.no == chunk.segment)
                        .ok_or_else(|| EngineError::Storage("open segment vanished".into()))?;
                    return Ok((Bytes::copy_from_slice(&open.buf[start..end]), true));
                }
                SegmentData::Remote => (slot.key.clone(), slot.size),
            }
        };
        if end as u64 > size {
            return Err(EngineError::Storage(format!(
                "segment {key} is shorter ({size} bytes) than its catalog entry"
            )));
        }
        let (first, last) = (
            start / limits::CACHE_BLOCK_BYTES,
            (end - 1) / limits::CACHE_BLOCK_BYTES,
        );
        if first == last {
            let block = self.block(chunk.segment, &key, size, first as u64).await?;
            let offset = first * limits::CACHE_BLOCK_BYTES;
            return Ok((block.slice(start - offset..end - offset), false));
        }
        let mut out = bytes::BytesMut::with_capacity(end - start);
        for index in first..=last {
            let block = self.block(chunk.segment, &key, size, index as u64).await?;
            let offset = index * limits::CACHE_BLOCK_BYTES;
            let from = start.max(offset) - offset;
            let to = end.min(offset + block.len()) - offset;
            out.extend_from_slice(&block[from..to]);
        }
        Ok((out.freeze(), false))
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
        let rx = {
            let mut blocks = self.blocks.borrow_mut();
            match blocks.get_mut(&(no, index)) {
                Some(Block::Ready(bytes)) => {
                    CoreMetrics::add(&self.metrics.cache_hits, 1);
                    return Ok(bytes.clone());
                }
                Some(Block::Loading(waiters)) => {
                    let (tx, rx) = oneshot::channel();
                    waiters.push(tx);
                    rx
                }
                None => {
                    CoreMetrics::add(&self.metrics.cache_misses, 1);
                    let (tx, rx) = oneshot::channel();
                    drop(blocks);
                    self.start_fetch(no, key, size, index, Some(tx));
                    rx
                }
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
        waiter: Option<oneshot::Sender<Result<Bytes, EngineError>>>,
    ) {
        let mut blocks = self.blocks.borrow_mut();
        let mut readahead = self.readahead.borrow_mut();
        let block_count = size.div_ceil(limits::CACHE_BLOCK_BYTES as u64);
        let window = match readahead.get(&no) {
            Some(r) if r.next_block == index => {
                (r.window_blocks * 2).min(limits::READAHEAD_BLOCKS_MAX)
            }
            _ => 1,
        };
        // Fetch the absent blocks from `index` on, up to the window.
        let mut count = 1;
        while count < window
            && index + count < block_count
            && !blocks.contains_key(&(no, index + count))
        {
            count += 1;
        }
        readahead.insert(
            no,
            Readahead {
                next_block: index + count,
                window_blocks: count,
            },
        );
        blocks.insert((no, index), Block::Loading(waiter.into_iter().collect()));
        for ahead in 1..count {
            blocks.insert((no, index + ahead), Block::Loading(Vec::new()));
        }
        let start = index * limits::CACHE_BLOCK_BYTES as u64;
        let end = ((index + count) * limits::CACHE_BLOCK_BYTES as u64).min(size);
        let fetch = self.store.get_range(key, start, end);
        let this = self.clone();
        let key = key.to_string();
        // Spawned once no borrow is held (glommio may poll it right away).
        drop(readahead);
        drop(blocks);
        glommio::spawn_local(async move {
            let result = match fetch.await {
                Ok(Ok(bytes)) => Ok(bytes),
                Ok(Err(e)) => Err(EngineError::Storage(format!("reading {key}: {e}"))),
                Err(_) => Err(EngineError::ShuttingDown),
            };
            this.finish_blocks(no, index, count, result);
        })
        .detach();
    }

    /// Starts the GETs of a chunk's blocks that are neither cached nor loading, without
    /// waiting for them: a catch-up read keeps [`limits::READ_CHUNKS_AHEAD`] chunks in flight.
    pub(super) fn prefetch(self: &Rc<Self>, chunk: &Chunk) {
        let (key, size) = {
            let segments = self.segments.borrow();
            match segments.get(&chunk.segment) {
                Some(slot) if matches!(slot.data, SegmentData::Remote) => {
                    (slot.key.clone(), slot.size)
                }
                _ => return,
            }
        };
        if chunk.byte_end > size || chunk.byte_end <= chunk.byte_start {
            // chunk_bytes reports it.
            return;
        }
        let first = chunk.byte_start / limits::CACHE_BLOCK_BYTES as u64;
        let last = (chunk.byte_end - 1) / limits::CACHE_BLOCK_BYTES as u64;
        for index in first..=last {
            if !self.blocks.borrow().contains_key(&(chunk.segment, index)) {
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
        let mut wake = Vec::new();
        {
            let mut blocks = self.blocks.borrow_mut();
            let mut lru = self.block_lru.borrow_mut();
            for i in 0..count {
                let index = first + i;
                let outcome = result.as_ref().map(|bytes| {
                    let from = (i as usize * limits::CACHE_BLOCK_BYTES).min(bytes.len());
                    let to = ((i as usize + 1) * limits::CACHE_BLOCK_BYTES).min(bytes.len());
                    bytes.slice(from..to)
                });
                let waiters = match blocks.remove(&(no, index)) {
                    Some(Block::Loading(waiters)) => waiters,
                    Some(ready @ Block::Ready(_)) => {
                        blocks.insert((no, index), ready);
                        continue;
                    }
                    None => Vec::new(),
                };
                if let Ok(block) = &outcome {
                    blocks.insert((no, index), Block::Ready(block.clone()));
                    lru.push_back((no, index, block.len()));
                    self.block_bytes.set(self.block_bytes.get() + block.len());
                }
                wake.push((waiters, outcome.map_err(|e| e.clone())));
            }
        }
        self.evict_cache();
        for (waiters, outcome) in wake {
            for waiter in waiters {
                let _ = waiter.send(outcome.clone());
            }
        }
    }

    /// Keeps the read caches within `--block-cache-size` together: whole uploaded segments still
    /// held since their seal go first (oldest first), then blocks fetched from the store.
    pub(super) fn evict_cache(&self) {
        let budget = self.config.segment_cache_bytes;
        while self.cached_bytes.get() + self.block_bytes.get() > budget {
            let segment = self.cached.borrow_mut().pop_front();
            if let Some((no, len)) = segment {
                self.cached_bytes.set(self.cached_bytes.get() - len);
                if let Some(slot) = self.segments.borrow_mut().get_mut(&no) {
                    if slot.uploaded && matches!(slot.data, SegmentData::Memory(_)) {
                        slot.data = SegmentData::Remote;
                    }
                }
                continue;
            }
            let Some((no, index, len)) = self.block_lru.borrow_mut().pop_front() else {
                break;
            };
            let mut blocks = self.blocks.borrow_mut();
            if matches!(blocks.get(&(no, index)), Some(Block::Ready(_))) {
                blocks.remove(&(no, index));
            }
            self.block_bytes.set(self.block_bytes.get() - len);
        }
    }

    /// Drops the table entries (and cached bytes) of garbage-collected segments.
    pub(crate) fn forget_segments(&self, keys: &[String]) {
        let keys: std::collections::HashSet<&str> = keys.iter().map(String::as_str).collect();
        let mut segments = self.segments.borrow_mut();
        let gone: Vec<u64> = segments
            .iter()
            .filter(|(_, slot)| slot.uploaded && keys.contains(&*slot.key))
            .map(|(no, _)| *no)
            .collect();
        for no in &gone {
            segments.remove(no);
            self.readahead.borrow_mut().remove(no);
        }
        // Their cached blocks go now; the byte count follows as the FIFO reaches them.
        self.blocks
            .borrow_mut()
            .retain(|(no, _), _| !gone.contains(no));
        let mut cached = self.cached.borrow_mut();
        let before = cached.len();
        cached.retain(|(no, len)| {
            let keep = segments.contains_key(no);
            if !keep {
                self.cached_bytes.set(self.cached_bytes.get() - len);
            }
            keep
        });
        debug_assert!(cached.len() <= before);
    }

    /// Garbage collection deleted `count` segments.
    pub(crate) fn count_collected(&self, count: usize) {
        CoreMetrics::add(&self.metrics.gc_segments_deleted, count as u64);
    }
}
