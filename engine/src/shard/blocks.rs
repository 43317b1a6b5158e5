//! The read cache of uploaded segments, as one owned part: whole segments still in memory
//! since their seal (only while readers read behind the open segments), blocks fetched by
//! ranged GETs (one GET per block in flight, its readers waiting for it), sequential readahead,
//! the byte ranges whose CRCs a read already checked, and eviction within one byte budget. It
//! decides; `cache.rs` does the I/O.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_channel::oneshot;

use crate::error::EngineError;
use crate::limits;

/// A reader waiting for a block's GET.
pub(super) type BlockWaiter = oneshot::Sender<Result<Bytes, EngineError>>;

/// A block of an uploaded segment in the block cache.
enum Block {
    Ready(Bytes),
    /// One ranged GET is in flight for it; these readers wait for that GET.
    Loading(Vec<BlockWaiter>),
}

/// Sequential-read detection per segment: the block a reader continuing from the last fetch
/// would ask for next, and how many blocks the last GET fetched.
#[derive(Clone, Copy)]
struct Readahead {
    next_block: u64,
    window_blocks: u64,
}

/// What the cache has of one block.
pub(super) enum Lookup {
    Hit(Bytes),
    /// Its GET is in flight: the receiver learns the outcome.
    Wait(oneshot::Receiver<Result<Bytes, EngineError>>),
    /// Neither cached nor loading: the caller starts its GET.
    Miss,
}

/// The blocks one GET brought, each with the readers that waited for it.
pub(super) type Wakes = Vec<(Vec<BlockWaiter>, Result<Bytes, EngineError>)>;

/// Invariants: `segment_bytes` is the sum of `segments`' lengths; `block_bytes` is the sum
/// of `block_fifo`'s lengths; a block is `Ready` only once its bytes are counted.
#[derive(Default)]
pub(super) struct ReadCache {
    /// Uploaded segments still held in memory since their seal, oldest first.
    segments: VecDeque<(u64, usize)>,
    segment_bytes: usize,
    /// Blocks of uploaded segments, by (segment, block index).
    blocks: HashMap<(u64, u64), Block>,
    /// Blocks in the order they were filed, for FIFO eviction. An entry may name a block
    /// already dropped (its segment collected): its bytes stay counted until it is reached.
    block_fifo: VecDeque<(u64, u64, usize)>,
    block_bytes: usize,
    readahead: HashMap<u64, Readahead>,
    /// When a read last took frames of a sealed segment (in memory or uploaded), and whether
    /// one did since the last upload: [`ReadCache::keep_uploaded`] asks.
    sealed_read_at: Option<Instant>,
    sealed_read_since_upload: bool,
    /// Byte ranges of segments whose frames a read CRC-checked in the blocks cached now
    /// (sorted, disjoint, at most `limits::CHECKED_RANGES_PER_SEGMENT_MAX` per segment): later
    /// reads of them skip the check, as reads of bytes that never left memory do. Without it,
    /// checking every frame on every read costs a quarter of a repeated catch-up read's rate.
    checked: HashMap<u64, Vec<(u64, u64)>>,
    /// Counts the blocks that left the cache: a check begun before one left cannot vouch for
    /// what is cached now (a block fetched again may differ).
    generation: u64,
}

impl ReadCache {
    /// Bytes both caches hold.
    pub(super) fn memory_bytes(&self) -> usize {
        self.segment_bytes + self.block_bytes
    }

    /// A read took frames of a sealed segment.
    pub(super) fn note_sealed_read(&mut self, now: Instant) {
        self.sealed_read_at = Some(now);
        self.sealed_read_since_upload = true;
    }

    /// Whether the segment uploaded `now` stays in memory ([`ReadCache::hold_segment`]): only
    /// while readers read behind the open segments (one did since the last upload, or within
    /// `limits::SEALED_READ_RECENT_MS`), as they will reach it next. Readers at the tail read
    /// open segments; with none behind it a held copy is memory only eviction frees (measured:
    /// half of a 64 KiB-append run's peak), and a later reader's GETs fill the block cache.
    pub(super) fn keep_uploaded(&mut self, now: Instant) -> bool {
        let recent = Duration::from_millis(limits::SEALED_READ_RECENT_MS);
        let keep = self.sealed_read_since_upload
            || self
                .sealed_read_at
                .is_some_and(|at| now.saturating_duration_since(at) < recent);
        self.sealed_read_since_upload = false;
        keep
    }

    /// What a check of cached blocks begun now passes to [`ReadCache::mark_checked`].
    pub(super) fn generation(&self) -> u64 {
        self.generation
    }

    /// Whether a read CRC-checked every frame of bytes `start..end` of segment `no` as cached.
    pub(super) fn is_checked(&self, no: u64, start: u64, end: u64) -> bool {
        self.checked.get(&no).is_some_and(|ranges| {
            let at = ranges.partition_point(|&(_, e)| e < end);
            ranges.get(at).is_some_and(|&(s, e)| s <= start && end <= e)
        })
    }

    /// A read CRC-checked every frame of `start..end` of segment `no` (frame-aligned, as a
    /// chunk is), in blocks it took from the cache at `generation`. Ranges that touch merge:
    /// frames lie end to end, so a union of aligned ranges is aligned.
    pub(super) fn mark_checked(&mut self, no: u64, start: u64, end: u64, generation: u64) {
        if generation != self.generation || start >= end {
            return;
        }
        let ranges = self.checked.entry(no).or_default();
        let (mut start, mut end) = (start, end);
        ranges.retain(|&(s, e)| {
            let touches = s <= end && start <= e;
            if touches {
                start = start.min(s);
                end = end.max(e);
            }
            !touches
        });
        if ranges.len() >= limits::CHECKED_RANGES_PER_SEGMENT_MAX {
            return;
        }
        let at = ranges.partition_point(|&(s, _)| s < start);
        ranges.insert(at, (start, end));
    }

    /// Block(s) of segment `no` left the cache: nothing of it counts as checked.
    fn unchecked(&mut self, no: u64) {
        self.checked.remove(&no);
        self.generation += 1;
    }

    /// Segment `no`, just uploaded, stays in memory (`len` bytes) until evicted.
    pub(super) fn hold_segment(&mut self, no: u64, len: usize) {
        self.segments.push_back((no, len));
        self.segment_bytes += len;
    }

    /// Block `index` of segment `no`; a reader of a block being fetched joins its GET.
    pub(super) fn lookup(&mut self, no: u64, index: u64) -> Lookup {
        match self.blocks.get_mut(&(no, index)) {
            Some(Block::Ready(bytes)) => Lookup::Hit(bytes.clone()),
            Some(Block::Loading(waiters)) => {
                let (tx, rx) = oneshot::channel();
                waiters.push(tx);
                Lookup::Wait(rx)
            }
            None => Lookup::Miss,
        }
    }

    /// Whether block `index` of segment `no` is cached or being fetched.
    pub(super) fn has_block(&self, no: u64, index: u64) -> bool {
        self.blocks.contains_key(&(no, index))
    }

    /// Marks the blocks one GET from block `index` (neither cached nor loading) fetches as
    /// loading, and returns how many: one, or when the reader moves sequentially, double the
    /// last GET's up to `limits::READAHEAD_BLOCKS_MAX`, stopping before a block already
    /// present and at the segment's `block_count`. `waiter` learns block `index`'s outcome.
    pub(super) fn start_loading(
        &mut self,
        no: u64,
        index: u64,
        block_count: u64,
        waiter: Option<BlockWaiter>,
    ) -> u64 {
        let window = match self.readahead.get(&no) {
            Some(r) if r.next_block == index => {
                (r.window_blocks * 2).min(limits::READAHEAD_BLOCKS_MAX)
            }
            _ => 1,
        };
        // Fetch the absent blocks from `index` on, up to the window.
        let mut count = 1;
        while count < window
            && index + count < block_count
            && !self.blocks.contains_key(&(no, index + count))
        {
            count += 1;
        }
        self.readahead.insert(
            no,
            Readahead {
                next_block: index + count,
                window_blocks: count,
            },
        );
        self.blocks
            .insert((no, index), Block::Loading(waiter.into_iter().collect()));
        for ahead in 1..count {
            self.blocks
                .insert((no, index + ahead), Block::Loading(Vec::new()));
        }
        count
    }

    /// Files the `count` blocks from `first` that one GET brought (`result`: their bytes
    /// back to back), or fails their waiters; returns the readers to wake. Call
    /// [`ReadCache::evict`] next.
    pub(super) fn finish(
        &mut self,
        no: u64,
        first: u64,
        count: u64,
        result: &Result<Bytes, EngineError>,
    ) -> Wakes {
        let mut wake = Vec::new();
        for i in 0..count {
            let index = first + i;
            let outcome = result.as_ref().map(|bytes| {
                let from = (i as usize * limits::CACHE_BLOCK_BYTES).min(bytes.len());
                let to = ((i as usize + 1) * limits::CACHE_BLOCK_BYTES).min(bytes.len());
                bytes.slice(from..to)
            });
            let waiters = match self.blocks.remove(&(no, index)) {
                Some(Block::Loading(waiters)) => waiters,
                Some(ready @ Block::Ready(_)) => {
                    self.blocks.insert((no, index), ready);
                    continue;
                }
                None => Vec::new(),
            };
            if let Ok(block) = &outcome {
                self.blocks.insert((no, index), Block::Ready(block.clone()));
                self.block_fifo.push_back((no, index, block.len()));
                self.block_bytes += block.len();
            }
            wake.push((waiters, outcome.map_err(|e| e.clone())));
        }
        wake
    }

    /// Brings both caches within `budget` bytes together: whole segments go first (oldest
    /// first), then blocks (first filed first; one being fetched again stays). Returns the
    /// segments whose in-memory copy the caller drops, in eviction order.
    pub(super) fn evict(&mut self, budget: usize) -> Vec<u64> {
        let mut dropped = Vec::new();
        while self.memory_bytes() > budget {
            if let Some((no, len)) = self.segments.pop_front() {
                self.segment_bytes -= len;
                dropped.push(no);
                continue;
            }
            let Some((no, index, len)) = self.block_fifo.pop_front() else {
                break;
            };
            if matches!(self.blocks.get(&(no, index)), Some(Block::Ready(_))) {
                self.blocks.remove(&(no, index));
                self.unchecked(no);
            }
            self.block_bytes -= len;
        }
        dropped
    }

    /// Drops the cached blocks holding bytes `start..end` of segment `no` (`start < end`),
    /// which a read found damaged: the next read fetches them again, so bytes damaged on
    /// their way from the store are not served from the cache for as long as it keeps them.
    /// Blocks being fetched stay; the dropped ones' bytes stay counted until the FIFO
    /// reaches them, as a collected segment's do.
    pub(super) fn drop_blocks(&mut self, no: u64, start: u64, end: u64) {
        let block = limits::CACHE_BLOCK_BYTES as u64;
        for index in start / block..=end.saturating_sub(1) / block {
            if matches!(self.blocks.get(&(no, index)), Some(Block::Ready(_))) {
                self.blocks.remove(&(no, index));
            }
        }
        self.unchecked(no);
    }

    /// Forgets the garbage-collected segments `gone`: their blocks and readahead go now
    /// (their bytes as the FIFO reaches them), and the held segments `kept` refuses.
    pub(super) fn forget(&mut self, gone: &[u64], kept: impl Fn(u64) -> bool) {
        for no in gone {
            self.readahead.remove(no);
            self.unchecked(*no);
        }
        self.blocks.retain(|(no, _), _| !gone.contains(no));
        let mut freed = 0;
        self.segments.retain(|&(no, len)| {
            let keep = kept(no);
            if !keep {
                freed += len;
            }
            keep
        });
        self.segment_bytes -= freed;
    }
}
