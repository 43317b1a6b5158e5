//! One stream as a core holds it: its state machine, where its records lie (`Chunk`s of
//! segments), its parked readers, and the seed a stream is loaded from at startup or adoption.

use std::collections::BTreeMap;
use std::rc::Rc;

use futures_channel::oneshot;
use pico_meta::SegmentRun;

use crate::api::StreamInfo;
use crate::frame::ProducerTuple;
use crate::limits;
use crate::rules::{ForkOrigin, StreamConfig, StreamState};

/// Where one stream's records `first_offset..next_offset` lie: bytes `byte_start..byte_end`
/// of local segment `segment`.
#[derive(Clone, Copy, Debug)]
pub(super) struct Chunk {
    pub(super) first_offset: u64,
    pub(super) next_offset: u64,
    pub(super) segment: u64,
    pub(super) byte_start: u64,
    pub(super) byte_end: u64,
    /// The newest record's timestamp: retention by age drops a chunk once this is too old.
    pub(super) last_timestamp_ms: i64,
}

impl Chunk {
    /// Where `run` of local segment `segment` lies, its newest record written at
    /// `last_timestamp_ms`: the one place a catalog run becomes a chunk.
    pub(super) fn new(run: SegmentRun, segment: u64, last_timestamp_ms: i64) -> Chunk {
        Chunk {
            first_offset: run.first_offset,
            next_offset: run.next_offset,
            segment,
            byte_start: run.byte_start,
            byte_end: run.byte_end,
            last_timestamp_ms,
        }
    }
}

pub(super) struct Stream {
    pub(super) state: StreamState,
    /// Sorted by offset, contiguous.
    pub(super) chunks: Vec<Chunk>,
    /// Readers parked until the durable tail moves.
    pub(super) waiters: Vec<oneshot::Sender<()>>,
    /// The idle clock last written to the metadata log (sliding TTL only).
    pub(super) recorded_access_ms: i64,
    /// The owner epoch this node holds the stream at (cluster; 0 on a single node): every
    /// metadata write for the stream is fenced by it.
    pub(super) epoch: u64,
    /// Retention is deleting it (empty past its delete-on-empty time): appends are refused
    /// until the delete is done or failed, so none is acknowledged into a deleted stream.
    pub(super) retiring: bool,
}

/// A recovered stream handed to its core at startup.
#[derive(Clone, Debug)]
pub struct StreamSeed {
    pub name: String,
    pub id: u64,
    pub config: StreamConfig,
    pub created_ms: i64,
    pub closed: bool,
    pub next_offset: u64,
    pub last_timestamp_ms: i64,
    /// `(segment key, segment size, run, newest timestamp of the stream in that segment)`
    /// sorted by offset.
    pub runs: Vec<(std::sync::Arc<str>, u64, SegmentRun, i64)>,
    /// First readable offset (raised by trims).
    pub start_offset: u64,
    /// The idle clock as last recorded in the metadata log.
    pub last_access_ms: i64,
    /// With the newest timestamp of the last segment each wrote to as its activity.
    pub producers: BTreeMap<String, crate::producers::Producer>,
    pub closed_by: Option<ProducerTuple>,
    pub fork: Option<ForkOrigin>,
    /// Forks (live or soft-deleted) whose origin is this stream.
    pub fork_refs: u64,
    pub soft_deleted: bool,
    pub writer_seq: Option<String>,
    /// The owner epoch (cluster), see `Stream::epoch`.
    pub epoch: u64,
}

/// Per-stream index of a segment being built.
#[derive(Default)]
pub(super) struct IndexEntry {
    pub(super) runs: Vec<SegmentRun>,
    pub(super) last_timestamp_ms: i64,
    pub(super) closed: bool,
    pub(super) producers: BTreeMap<String, (u64, u64)>,
    pub(super) closed_by: Option<ProducerTuple>,
    pub(super) writer_seq: Option<String>,
    /// The stream's name, to find its chunks when the segment seals.
    pub(super) name: Option<Rc<str>>,
    /// The owner epoch the frames were written at (cluster), fencing the segment's commit.
    pub(super) epoch: u64,
}

pub(super) fn info_of(state: &StreamState) -> StreamInfo {
    StreamInfo {
        id: state.id,
        content_type: state.content_type.to_string(),
        ttl_sec: state.extras().ttl_sec,
        expires_at_ms: state.extras().expires_at_ms,
        start_offset: state.start_offset,
        next_offset: state.durable_offset,
        closed: state.closed_durable,
        retention: state.extras().retention,
    }
}

/// Whether a sealed segment's span `first_offset..`, bytes `byte_start..`, may take in the next
/// span of the same stream and segment (`next_first_offset`, ending at `next_byte_end`): the
/// offsets must follow on, and the merged span stays within `limits::SEALED_CHUNK_BYTES_MAX`
/// bytes, the most a read scans by header to find its first record.
fn span_extends(
    next_offset: u64,
    byte_start: u64,
    next_first_offset: u64,
    next_byte_end: u64,
) -> bool {
    next_offset == next_first_offset
        && next_byte_end > byte_start
        && next_byte_end - byte_start <= limits::SEALED_CHUNK_BYTES_MAX
}

/// A sealing segment's runs of one stream (sorted, as the append path builds them) merged into
/// the same spans `coarsen` gives its chunks: the catalog keeps one run per span, a few per
/// segment, instead of one per commit round (each round interleaves the streams' frames, so
/// their runs never touch). A restart, which coarsens the loaded runs by the same rule, rebuilds
/// the chunks it built from per-round runs.
pub(crate) fn coarsen_runs(runs: &mut Vec<SegmentRun>) {
    let mut merged: Vec<SegmentRun> = Vec::with_capacity(runs.len());
    for run in runs.drain(..) {
        match merged.last_mut() {
            Some(last)
                if span_extends(
                    last.next_offset,
                    last.byte_start,
                    run.first_offset,
                    run.byte_end,
                ) =>
            {
                last.next_offset = run.next_offset;
                last.byte_end = run.byte_end;
            }
            _ => merged.push(run),
        }
    }
    *runs = merged;
}

/// Merges consecutive chunks of one sealed segment (only `segment`'s, or all with `None`) into
/// spans of at most `limits::SEALED_CHUNK_BYTES_MAX` bytes.
pub(super) fn coarsen(chunks: &mut Vec<Chunk>, segment: Option<u64>) {
    let start = match segment {
        Some(no) => match chunks.iter().position(|c| c.segment == no) {
            Some(start) => start,
            None => return,
        },
        None => 0,
    };
    let mut merged: Vec<Chunk> = Vec::with_capacity(chunks.len() - start);
    for chunk in chunks.drain(start..) {
        match merged.last_mut() {
            Some(last)
                if segment.is_none_or(|s| s == chunk.segment)
                    && last.segment == chunk.segment
                    && span_extends(
                        last.next_offset,
                        last.byte_start,
                        chunk.first_offset,
                        chunk.byte_end,
                    ) =>
            {
                last.next_offset = chunk.next_offset;
                last.byte_end = chunk.byte_end;
                last.last_timestamp_ms = last.last_timestamp_ms.max(chunk.last_timestamp_ms);
            }
            _ => merged.push(chunk),
        }
    }
    chunks.extend(merged);
}
