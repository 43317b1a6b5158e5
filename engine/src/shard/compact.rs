//! Background compaction under object durability: a core merges consecutive small segments it
//! stored (a lone writer's flushes make one object per append) into segment-size objects, so a
//! catch-up of cold data reads a few objects, not hundreds. Its PUTs take slots of the node's
//! PUT budget like flushes do.
//!
//! ```text
//!   pick ─▶ GET the old objects (CRC-checked) ─▶ PUT their bytes end to end under a NEW key
//!   (the core's next segment key) ─▶ catalog swap (meta `compact.rs`: one transaction,
//!   idempotent, retried until answered) ─▶ chunks move to the merged object ─▶ the old
//!   objects are retired: the collector deletes them after `COMPACT_RETIRE_GRACE_MS`, the
//!   table entries go then too
//! ```
//!
//! Why every step is safe to stop at: the merged object overwrites nothing, so until the swap
//! the catalog is right as it stands, whoever else compacts the same segments (an owner that
//! lost the stream while paused, and the next owner); a refused swap deletes the merged
//! object, and one a crash left is deleted by the next start's sweep (an object of this node's
//! that no row names); the swap moves every entry at once or nothing;
//! a swap whose answer is lost is asked again (answered `AlreadySwapped` if it had
//! committed); the old objects outlive the swap by the grace, so a read that picked its chunks
//! before it still finds them, and are deleted by the collector (a crash there is a row found
//! again next round). What is picked: a run of this core's stored segments of one stream in
//! seal order (so a merged object is garbage when that stream's records are), each smaller
//! than `--segment-size`; `COMPACT_FANOUT` of one size class side by side (or as many
//! of them as fill `COMPACT_ACTIVE_BYTES_MAX`), or, once the core stored nothing for
//! `COMPACT_IDLE_MS`, any such run up to `--segment-size`. Each byte is rewritten about once per size class (a factor of `COMPACT_FANOUT`
//! each) between the smallest objects and `--segment-size`.

use std::collections::{HashMap, HashSet};
use std::rc::Rc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use pico_meta::{CompactOutcome, CompactRequest, MetaError};
use pico_s3::StoreError;

use crate::clock::now_ms;
use crate::config::Durability;
use crate::frame::{first_damage, FrameError};
use crate::limits;
use crate::metrics::CoreMetrics;

use super::state::Shard;
use super::stream::coarsen;
use super::table::{SegmentData, SegmentSlot};

/// A picked segment: table number, key, size.
type Picked = (u64, Rc<str>, u64);

/// Why a compaction stopped: logged, and the core tries again after a pause.
#[derive(Debug)]
enum CompactError {
    /// A crash test's fault (`faults::CompactStep`).
    Injected(&'static str),
    /// The object store is stopping.
    StoreClosed,
    /// The metadata store is stopping.
    MetaClosed,
    /// Object `key` could not be stored (`put`) or read.
    Store {
        put: bool,
        key: Rc<str>,
        source: StoreError,
    },
    /// The catalog could not be asked for the swap (asked again; this only reaches the log).
    Meta(MetaError),
    /// Segment `key` is neither held here nor readable from the store.
    NothingToRead { key: Rc<str> },
    /// The catalog is not what the swap expects (its account).
    Refused(String),
    /// Segment `key` is damaged: never merged.
    Damaged { key: Rc<str>, damage: Damage },
}

/// How a picked segment is damaged.
#[derive(Debug)]
enum Damage {
    /// It has `len` bytes where the catalog says `size`.
    Size {
        len: usize,
        size: u64,
    },
    Frame(FrameError),
}

impl std::fmt::Display for CompactError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CompactError::Injected(what) => f.write_str(what),
            CompactError::StoreClosed => f.write_str("object store is shut down"),
            CompactError::MetaClosed => f.write_str("metadata store is shut down"),
            CompactError::Store { put, key, source } => {
                let doing = if *put { "storing" } else { "reading" };
                write!(f, "{doing} {key}: {source}")
            }
            CompactError::Meta(e) => e.fmt(f),
            CompactError::NothingToRead { key } => write!(f, "{key}: nothing to read"),
            CompactError::Refused(why) => write!(f, "the catalog refused the swap: {why}"),
            CompactError::Damaged { key, damage } => {
                write!(f, "{key} {damage}")
            }
        }
    }
}

impl std::fmt::Display for Damage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Damage::Size { len, size } => write!(f, "has {len} bytes, the catalog says {size}"),
            Damage::Frame(e) => write!(f, "holds a damaged frame ({e:?})"),
        }
    }
}

#[cfg(feature = "fault-injection")]
use crate::faults::CompactStep;

/// The steps a crash test may stop the compactor at (`faults::CompactStep`).
#[cfg(not(feature = "fault-injection"))]
#[derive(Clone, Copy)]
enum CompactStep {
    FailPut,
    AfterPut,
    LoseSwapAnswer,
    AfterSwap,
}

/// Whether a crash test stops the compactor at `step` (never without fault injection).
fn stop_at(shard: &Shard, step: CompactStep) -> bool {
    #[cfg(feature = "fault-injection")]
    return crate::faults::take_compact(&shard.config.wal_dir, step);
    #[cfg(not(feature = "fault-injection"))]
    {
        let _ = (shard, step);
        false
    }
}

fn retire_grace(shard: &Shard) -> u64 {
    #[cfg(feature = "fault-injection")]
    if let Some(ms) = crate::faults::retire_grace_ms(&shard.config.wal_dir) {
        return ms;
    }
    let _ = shard;
    limits::COMPACT_RETIRE_GRACE_MS
}

/// The size class of an object of `size` bytes.
fn tier(size: u64) -> u32 {
    let mut tier = 0;
    let mut limit = limits::COMPACT_TIER_BASE_BYTES;
    while size >= limit {
        tier += 1;
        limit = limit.saturating_mul(limits::COMPACT_FANOUT as u64);
    }
    tier
}

/// The segments to merge among `run` (consecutive small segments in seal order): the first
/// `COMPACT_FANOUT` of one size class side by side, or fewer of them that fill `target`; with
/// `idle`, the longest prefix of at least two that fits in `target`.
fn choose(run: &[Picked], target: u64, idle: bool) -> Option<std::ops::Range<usize>> {
    let max = limits::COMPACT_SEGMENTS_MAX;
    if idle {
        for start in 0..run.len() {
            let mut sum = 0;
            let count = run[start..]
                .iter()
                .take(max)
                .take_while(|(_, _, size)| {
                    sum += size;
                    sum <= target
                })
                .count();
            if count >= 2 {
                return Some(start..start + count);
            }
        }
        return None;
    }
    for start in 0..run.len() {
        let class = tier(run[start].2);
        let mut sum = 0;
        let mut end = start;
        while end < run.len() && end - start < max && tier(run[end].2) == class {
            if sum + run[end].2 > target {
                break;
            }
            sum += run[end].2;
            end += 1;
        }
        let count = end - start;
        let fills = end < run.len() && tier(run[end].2) == class && sum + run[end].2 > target;
        if count >= limits::COMPACT_FANOUT || (fills && count >= 2) {
            return Some(start..end);
        }
    }
    None
}

impl Shard {
    /// A segment of this core is stored: compacts if a run is due (or arms the idle timer).
    pub(super) fn compact_after_upload(self: &Rc<Self>) {
        if self.config.durability != Durability::Object {
            return;
        }
        let now = self.clock.now();
        let gap = self
            .compaction
            .last_upload
            .get()
            .map(|at| now.saturating_duration_since(at));
        self.compaction
            .busy
            .set(gap.is_some_and(|gap| gap < Duration::from_millis(limits::COMPACT_BUSY_GAP_MS)));
        self.compaction.last_upload.set(Some(now));
        self.compact_when_due();
        if !self.compaction.timer_armed.get() {
            self.compaction.timer_armed.set(true);
            let this = self.clone();
            glommio::spawn_local(async move {
                let idle = Duration::from_millis(limits::COMPACT_IDLE_MS);
                loop {
                    // Wakes when the core has been idle for the period since its last upload.
                    let now = this.clock.now();
                    let since = this
                        .compaction
                        .last_upload
                        .get()
                        .map(|at| now.saturating_duration_since(at));
                    let paused = this
                        .compaction
                        .not_before
                        .get()
                        .map(|at| at.saturating_duration_since(now));
                    let wait = idle
                        .saturating_sub(since.unwrap_or_default())
                        .max(paused.unwrap_or_default());
                    glommio::timer::sleep(wait.max(Duration::from_millis(100))).await;
                    if this.stopping.get() {
                        break;
                    }
                    this.compact_when_due();
                    if !this.compaction.running.get() && this.pick(true).is_none() {
                        break;
                    }
                }
                this.compaction.timer_armed.set(false);
            })
            .detach();
        }
    }

    fn compact_when_due(self: &Rc<Self>) {
        let waiting = self
            .compaction
            .not_before
            .get()
            .is_some_and(|at| self.clock.now() < at);
        if self.compaction.running.get() || waiting {
            return;
        }
        let idle = self.compaction.last_upload.get().is_none_or(|at| {
            self.clock.now().saturating_duration_since(at)
                >= Duration::from_millis(limits::COMPACT_IDLE_MS)
        });
        // A busy core's flushes already reach the store at a PUT per flush's worth of bytes;
        // merging beside them would take their metadata commits and PUT slots.
        if !idle && self.compaction.busy.get() {
            return;
        }
        let Some(picked) = self.pick(idle) else {
            return;
        };
        self.compaction.running.set(true);
        let this = self.clone();
        glommio::spawn_local(async move {
            let result = this.compact(&picked).await;
            this.compaction.running.set(false);
            match result {
                // More may be due (a long run, or segments stored meanwhile).
                Ok(()) => {
                    this.compaction.not_before.set(None);
                    this.compact_when_due();
                }
                Err(why) => {
                    let pause = Duration::from_millis(limits::COMPACT_IDLE_MS);
                    this.compaction
                        .not_before
                        .set(Some(this.clock.now() + pause));
                    CoreMetrics::add(&this.metrics.compaction_failures, 1);
                    if matches!(why, CompactError::Damaged { .. }) {
                        // Stored data is damaged: the operator's signal, as a read's is.
                        CoreMetrics::add(&this.metrics.damaged_reads, 1);
                        log::error!(
                            "core {}: compaction found stored data damaged: {why}; the object \
                             is left out of every merge, and reads of it fail until it is \
                             restored",
                            this.core
                        );
                    } else {
                        log::warn!(
                            "core {}: compaction of {} segments: {why}",
                            this.core,
                            picked.len()
                        );
                    }
                }
            }
        })
        .detach();
    }

    /// Segment `no` was sealed holding the streams of `ids`.
    pub(super) fn note_sealed(&self, no: u64, mut ids: impl Iterator<Item = u64>) {
        if self.config.durability != Durability::Object {
            return;
        }
        let one = match (ids.next(), ids.next()) {
            (Some(id), None) => Some(id),
            _ => None,
        };
        self.compaction.owner.borrow_mut().insert(no, one);
    }

    /// Learns the stream of every stored segment not noted at its seal (those loaded at
    /// start-up): one pass over the streams' chunks, once after a restart.
    fn learn_owners(&self) {
        let segments = self.segments.slots();
        let mut owner = self.compaction.owner.borrow_mut();
        owner.retain(|no, _| segments.contains_key(no));
        let unknown = |no: &u64| !owner.contains_key(no);
        if !segments
            .iter()
            .any(|(no, slot)| slot.uploaded && unknown(no))
        {
            return;
        }
        let mut seen: HashMap<u64, Option<u64>> = HashMap::new();
        self.streams.scan(|streams| {
            for stream in streams.values() {
                for chunk in &stream.chunks {
                    seen.entry(chunk.segment)
                        .and_modify(|one| {
                            if *one != Some(stream.state.id) {
                                *one = None;
                            }
                        })
                        .or_insert(Some(stream.state.id));
                }
            }
        });
        for (no, _) in segments.iter().filter(|(_, slot)| slot.uploaded) {
            owner
                .entry(*no)
                .or_insert_with(|| seen.get(no).copied().flatten());
        }
    }

    /// The segments to merge now, in seal order, if any: consecutive segments of one stream.
    fn pick(&self, idle: bool) -> Option<Vec<Picked>> {
        self.learn_owners();
        let target = self.config.segment_size as u64;
        // While the core is busy, only small merges (see `COMPACT_ACTIVE_BYTES_MAX`).
        let cap = match idle {
            true => target,
            false => target.min(limits::COMPACT_ACTIVE_BYTES_MAX),
        };
        let segments = self.segments.slots();
        let retired = self.compaction.retired.borrow();
        let refused = self.compaction.refused.borrow();
        let order = self.compaction.order.borrow();
        let owner = self.compaction.owner.borrow();
        let mut all: Vec<(u64, u64, &SegmentSlot)> = segments
            .iter()
            .filter(|(no, _)| !retired.contains(no))
            .map(|(no, slot)| (order.get(no).copied().unwrap_or(*no), *no, slot))
            .collect();
        all.sort_unstable_by_key(|(place, ..)| *place);
        // Each stream's run of small segments; another stream's segment between two of
        // them does not end it (the catalog holds nothing of this stream there), a segment
        // of several streams (or unknown ones) ends every run, as one of the stream's own
        // that is not small ends its run.
        let mut runs: HashMap<u64, Vec<Picked>> = HashMap::new();
        let mut due = None;
        let mut close = |run: &mut Vec<Picked>| {
            if due.is_none() {
                due = choose(run, cap, idle).map(|range| run[range].to_vec());
            }
            run.clear();
        };
        for (_, no, slot) in all {
            let small = slot.uploaded
                && !matches!(slot.data, SegmentData::Open)
                && slot.size > 0
                && slot.size < target
                && !refused.contains(&no);
            match owner.get(&no).copied().flatten() {
                Some(of) if small => {
                    runs.entry(of)
                        .or_default()
                        .push((no, slot.key.clone(), slot.size))
                }
                Some(of) => {
                    if let Some(run) = runs.get_mut(&of) {
                        close(run);
                    }
                }
                None => runs.values_mut().for_each(&mut close),
            }
        }
        runs.values_mut().for_each(&mut close);
        due
    }

    /// Merges `picked` (see the module comment); `Err` leaves the catalog as it was or as
    /// the swap made it, and this core's chunks on objects that hold their bytes either way.
    async fn compact(self: &Rc<Self>, picked: &[Picked]) -> Result<(), CompactError> {
        let merged = self.read_picked(picked).await?;
        let (_, key) = self.wal_path(self.journal.next_counter());
        let key: Rc<str> = Rc::from(key.as_str());
        let total = merged.len() as u64;
        let wait = self.put_budget.take();
        if !wait.is_zero() {
            glommio::timer::sleep(wait).await;
        }
        if stop_at(self, CompactStep::FailPut) {
            return Err(CompactError::Injected("injected PUT failure"));
        }
        self.store
            .put(&key, merged)
            .await
            .map_err(|_| CompactError::StoreClosed)?
            .map_err(|source| CompactError::Store {
                put: true,
                key: key.clone(),
                source,
            })?;
        CoreMetrics::add(&self.metrics.compaction_puts, 1);
        if stop_at(self, CompactStep::AfterPut) {
            // A crash test: this compactor does nothing more, as if the process died here.
            std::future::pending::<()>().await;
        }
        let grace = retire_grace(self);
        let mut backoff_ms = limits::UPLOAD_RETRY_FIRST_MS;
        let outcome = loop {
            let request = CompactRequest {
                olds: picked.iter().map(|(_, k, s)| (k.to_string(), *s)).collect(),
                merged_key: key.to_string(),
                streams: self.streams_in(picked),
                node: self.cluster.as_ref().map(|c| (c.node_id(), c.node_epoch())),
                retire_at_ms: now_ms() + grace as i64,
                now_ms: now_ms(),
            };
            let answer = self
                .meta
                .compact_segments(request)
                .await
                .map_err(|_| CompactError::MetaClosed)?;
            let answer = match answer {
                Ok(_) if stop_at(self, CompactStep::LoseSwapAnswer) => {
                    Err(CompactError::Injected("injected loss of the swap's answer"))
                }
                Ok(outcome) => Ok(outcome),
                Err(MetaError::Closed) => return Err(CompactError::MetaClosed),
                Err(e) => Err(CompactError::Meta(e)),
            };
            match answer {
                Ok(outcome) => break outcome,
                Err(why) => {
                    // The swap is idempotent: asked again, it answers as the catalog has it.
                    log::warn!("core {}: compaction swap, asking again: {why}", self.core);
                    glommio::timer::sleep(Duration::from_millis(backoff_ms)).await;
                    backoff_ms = (backoff_ms * 2).min(limits::UPLOAD_RETRY_MAX_MS);
                }
            }
        };
        match outcome {
            CompactOutcome::Swapped | CompactOutcome::AlreadySwapped => {}
            CompactOutcome::Refused(why) => {
                self.compaction
                    .refused
                    .borrow_mut()
                    .extend(picked.iter().map(|(no, ..)| *no));
                // No row names the merged object: nothing reads it. One left by a failed
                // delete goes with the next start's sweep.
                if let Ok(Err(e)) = self.store.delete(&key).await {
                    log::warn!(
                        "core {}: deleting unused merged object {key}: {e}",
                        self.core
                    );
                }
                return Err(CompactError::Refused(why));
            }
        }
        if stop_at(self, CompactStep::AfterSwap) {
            std::future::pending::<()>().await;
        }
        self.switch_to_merged(picked, key, total, grace);
        CoreMetrics::add(&self.metrics.compactions, 1);
        CoreMetrics::add(&self.metrics.compacted_segments, picked.len() as u64);
        CoreMetrics::add(&self.metrics.compacted_bytes, total);
        Ok(())
    }

    /// The picked segments' bytes end to end, each CRC-checked frame by frame: a damaged
    /// object is never copied into a merged one.
    async fn read_picked(self: &Rc<Self>, picked: &[Picked]) -> Result<Bytes, CompactError> {
        let total: u64 = picked.iter().map(|p| p.2).sum();
        let mut merged = BytesMut::with_capacity(total as usize);
        for group in picked.chunks(limits::COMPACT_GETS_IN_FLIGHT) {
            let mut replies = Vec::with_capacity(group.len());
            for (no, key, size) in group {
                let held = self.segments.held(*no, *size);
                let reply = held.is_none().then(|| self.store.get_range(key, 0, *size));
                replies.push((*no, key, *size, held, reply));
            }
            for (no, key, size, held, reply) in replies {
                let bytes = match (held, reply) {
                    (Some(bytes), _) => Ok(bytes),
                    (None, None) => {
                        let key = key.clone();
                        return Err(CompactError::NothingToRead { key });
                    }
                    (None, Some(reply)) => {
                        match reply.await.map_err(|_| CompactError::StoreClosed)? {
                            Ok(bytes) => Ok(bytes),
                            // The object ends before its catalog size: damage, as reads see it.
                            Err(StoreError::Short { size: len, .. }) => Err(Damage::Size {
                                len: len as usize,
                                size,
                            }),
                            Err(source) => {
                                let key = key.clone();
                                return Err(CompactError::Store {
                                    put: false,
                                    key,
                                    source,
                                });
                            }
                        }
                    }
                };
                let (bytes, damaged) = match bytes {
                    Err(damage) => (Bytes::new(), Some(damage)),
                    Ok(bytes) if bytes.len() as u64 != size => {
                        let len = bytes.len();
                        (bytes, Some(Damage::Size { len, size }))
                    }
                    Ok(bytes) => {
                        let damaged = first_damage(&bytes).map(|(_, error)| Damage::Frame(error));
                        (bytes, damaged)
                    }
                };
                if let Some(damage) = damaged {
                    // Never merged (reads report the damage); the segments beside it are
                    // merged by the next compactions, around it.
                    self.compaction.refused.borrow_mut().insert(no);
                    let key = key.clone();
                    return Err(CompactError::Damaged { key, damage });
                }
                merged.extend_from_slice(&bytes);
            }
        }
        Ok(merged.freeze())
    }

    /// Every stream of this core with chunks in `picked`, with its owner epoch.
    fn streams_in(&self, picked: &[Picked]) -> HashMap<u64, u64> {
        let nos: HashSet<u64> = picked.iter().map(|(no, ..)| *no).collect();
        self.streams.scan(|streams| {
            streams
                .values()
                .filter(|s| s.chunks.iter().any(|c| nos.contains(&c.segment)))
                .map(|s| (s.state.id, s.epoch))
                .collect()
        })
    }

    /// The swap committed: this core's chunks move to the merged object (a new table entry),
    /// and the old entries stay for reads under way until the grace is over.
    fn switch_to_merged(self: &Rc<Self>, picked: &[Picked], key: Rc<str>, total: u64, grace: u64) {
        let no = self.segments.add(SegmentSlot {
            key,
            data: SegmentData::Remote,
            uploaded: true,
            size: total,
        });
        let mut base = HashMap::with_capacity(picked.len());
        let mut offset = 0;
        for (old, _, size) in picked {
            base.insert(*old, offset);
            offset += size;
        }
        self.streams.for_each_mut(|stream| {
            let mut moved = false;
            for chunk in &mut stream.chunks {
                if let Some(&at) = base.get(&chunk.segment) {
                    chunk.segment = no;
                    chunk.byte_start += at;
                    chunk.byte_end += at;
                    moved = true;
                }
            }
            if moved {
                coarsen(&mut stream.chunks, Some(no));
            }
        });
        {
            let mut owner = self.compaction.owner.borrow_mut();
            let one = owner.get(&picked[0].0).copied().flatten();
            for (old, ..) in picked {
                owner.remove(old);
            }
            owner.insert(no, one);
        }
        {
            let first = picked[0].0;
            let mut order = self.compaction.order.borrow_mut();
            let place = order.get(&first).copied().unwrap_or(first);
            for (old, ..) in picked {
                order.remove(old);
            }
            order.insert(no, place);
        }
        let olds: Vec<u64> = picked.iter().map(|(old, ..)| *old).collect();
        self.compaction.retired.borrow_mut().extend(&olds);
        let this = self.clone();
        glommio::spawn_local(async move {
            glommio::timer::sleep(Duration::from_millis(grace)).await;
            this.segments.forget(&olds);
            let mut retired = this.compaction.retired.borrow_mut();
            for old in &olds {
                retired.remove(old);
            }
        })
        .detach();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(sizes: &[u64]) -> Vec<Picked> {
        sizes
            .iter()
            .enumerate()
            .map(|(i, s)| (i as u64, Rc::from("k"), *s))
            .collect()
    }

    #[test]
    fn a_size_class_merges_once_it_has_a_fanout_side_by_side() {
        let target = 8 << 20;
        let small = vec![2_000; limits::COMPACT_FANOUT - 1];
        assert_eq!(choose(&run(&small), target, false), None);
        let mut enough = small.clone();
        enough.push(3_000);
        assert_eq!(
            choose(&run(&enough), target, false),
            Some(0..limits::COMPACT_FANOUT)
        );
        // A larger object ahead of them does not join their class.
        let mut mixed = vec![500_000];
        mixed.extend(&enough);
        assert_eq!(
            choose(&run(&mixed), target, false),
            Some(1..1 + limits::COMPACT_FANOUT)
        );
    }

    #[test]
    fn a_class_that_would_overfill_a_segment_merges_what_fits() {
        let target = 8 << 20;
        // Three of 3 MiB: two fit in 8 MiB, the third would overflow.
        assert_eq!(
            choose(&run(&[3 << 20, 3 << 20, 3 << 20]), target, false),
            Some(0..2)
        );
    }

    #[test]
    fn an_idle_core_merges_any_run_that_fits() {
        let target = 1_000;
        assert_eq!(choose(&run(&[100, 900, 50]), target, true), Some(0..2));
        assert_eq!(choose(&run(&[100]), target, true), None);
        assert_eq!(choose(&run(&[900, 200]), target, true), None);
        // A merged object that cannot take its neighbour does not hold up the ones after it.
        assert_eq!(choose(&run(&[900, 200, 300]), target, true), Some(1..3));
    }

    #[test]
    fn size_classes_grow_by_the_fanout() {
        assert_eq!(tier(0), 0);
        assert_eq!(tier(limits::COMPACT_TIER_BASE_BYTES - 1), 0);
        assert_eq!(tier(limits::COMPACT_TIER_BASE_BYTES), 1);
        let next = limits::COMPACT_TIER_BASE_BYTES * limits::COMPACT_FANOUT as u64;
        assert_eq!(tier(next - 1), 1);
        assert_eq!(tier(next), 2);
    }
}
