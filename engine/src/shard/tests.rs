//! Unit tests of the shard's pure parts: chunk coarsening, retention decisions, the frame
//! budget of an append, WAL file errors, the acknowledgement queue's release order, the seal
//! order of catalog commits, the memory of streams moved away, and the read cache's
//! readahead and eviction.

use std::rc::Rc;
use std::sync::Arc;

use bytes::Bytes;
use futures_channel::oneshot;
use pico_meta::{Retention, SegmentRun};

use super::append::frames_len;
use super::blocks::{Lookup, ReadCache};
use super::moves::Moves;
use super::pending::{AckQueue, PendingAck, Release};
use super::reaper::{retention_action, RetentionAction};
use super::sealed::SealQueue;
use super::stream::{coarsen, coarsen_runs, Chunk, Stream};
use crate::api::RecordInput;
use crate::error::{AppendError, EngineError};
use crate::frame::{self, FrameMeta, ProducerTuple, FRAME_KIND_CLOSE, FRAME_KIND_RECORD};
use crate::health::WalFault;
use crate::limits::{self, CACHE_BLOCK_BYTES};
use crate::rules::{StreamConfig, StreamState};

fn chunk(
    first_offset: u64,
    next_offset: u64,
    segment: u64,
    byte_start: u64,
    byte_end: u64,
) -> Chunk {
    Chunk {
        first_offset,
        next_offset,
        segment,
        byte_start,
        byte_end,
        last_timestamp_ms: 0,
    }
}

#[test]
fn coarsen_merges_within_a_segment_and_a_span() {
    let mut chunks = vec![
        chunk(0, 2, 0, 0, 100),
        chunk(2, 3, 1, 0, 50),
        chunk(3, 5, 1, 200, 300),
        chunk(5, 6, 1, 900_000, 1_100_000),
        chunk(6, 7, 2, 0, 10),
    ];
    coarsen(&mut chunks, Some(1));
    let spans: Vec<_> = chunks
        .iter()
        .map(|c| (c.first_offset, c.next_offset, c.segment))
        .collect();
    assert_eq!(spans, vec![(0, 2, 0), (2, 5, 1), (5, 6, 1), (6, 7, 2)]);
    assert_eq!((chunks[1].byte_start, chunks[1].byte_end), (0, 300));
    coarsen(&mut chunks, None);
    assert_eq!(
        chunks.len(),
        4,
        "a merge never crosses segments or the span limit"
    );
}

#[test]
fn coarsen_keeps_the_newest_timestamp_and_leaves_other_segments_alone() {
    let mut chunks = vec![chunk(0, 1, 3, 0, 10), chunk(1, 2, 3, 10, 20)];
    chunks[0].last_timestamp_ms = 50;
    chunks[1].last_timestamp_ms = 40;
    coarsen(&mut chunks, Some(9));
    assert_eq!(chunks.len(), 2, "only the named segment is coarsened");
    coarsen(&mut chunks, Some(3));
    assert_eq!(chunks.len(), 1);
    assert_eq!((chunks[0].first_offset, chunks[0].next_offset), (0, 2));
    assert_eq!(chunks[0].last_timestamp_ms, 50);
}

/// The catalog's runs of a sealing segment merge into the same spans as the stream's chunks
/// of interleaved appends.
#[test]
fn coarsen_runs_gives_the_spans_of_coarsen() {
    let interleaved: Vec<(u64, u64, u64, u64)> = (0..3000u64)
        .map(|i| (i, i + 1, i * 1100, i * 1100 + 1000))
        .chain([(3000, 3002, 3_400_000, 3_400_500)])
        .collect();
    let mut runs: Vec<SegmentRun> = interleaved
        .iter()
        .map(
            |&(first_offset, next_offset, byte_start, byte_end)| SegmentRun {
                first_offset,
                next_offset,
                byte_start,
                byte_end,
            },
        )
        .collect();
    let mut chunks: Vec<Chunk> = interleaved
        .iter()
        .map(|&(first, next, start, end)| chunk(first, next, 4, start, end))
        .collect();
    coarsen_runs(&mut runs);
    coarsen(&mut chunks, Some(4));
    let of_runs: Vec<_> = runs
        .iter()
        .map(|r| (r.first_offset, r.next_offset, r.byte_start, r.byte_end))
        .collect();
    let of_chunks: Vec<_> = chunks
        .iter()
        .map(|c| (c.first_offset, c.next_offset, c.byte_start, c.byte_end))
        .collect();
    assert_eq!(of_runs, of_chunks);
    // 3.3 MB of segment in spans of at most 1 MiB, and nothing lost at their seams.
    assert_eq!(runs.len(), 4);
    assert_eq!((runs[0].first_offset, runs[3].next_offset), (0, 3002));
    for pair in runs.windows(2) {
        assert_eq!(pair[0].next_offset, pair[1].first_offset);
    }
    for run in &runs {
        assert!(run.byte_end - run.byte_start <= crate::limits::SEALED_CHUNK_BYTES_MAX);
    }
}

#[test]
fn coarsen_runs_keeps_an_offset_gap_apart() {
    let run = |first_offset, next_offset, byte_start, byte_end| SegmentRun {
        first_offset,
        next_offset,
        byte_start,
        byte_end,
    };
    let mut runs = vec![run(0, 2, 0, 100), run(5, 6, 200, 300), run(6, 7, 400, 500)];
    coarsen_runs(&mut runs);
    assert_eq!(runs, vec![run(0, 2, 0, 100), run(5, 7, 200, 500)]);
}

// ---------------------------------------------------------------- retention

const NOW_MS: i64 = 1_000_000;

/// A stream of `chunks`, each of `bytes` bytes and one record, durable through
/// `durable` records, written at the timestamps `stamps`.
fn stream(retention: Retention, stamps: &[i64], bytes: u64, durable: u64) -> Stream {
    let config = StreamConfig {
        content_type: "text/plain".into(),
        ttl_sec: None,
        expires_at_ms: None,
        retention,
    };
    let mut state = StreamState::new(7, config, false, 0);
    state.next_offset = stamps.len() as u64;
    state.durable_offset = durable;
    state.last_timestamp_ms = stamps.last().copied().unwrap_or(0);
    let chunks = stamps
        .iter()
        .enumerate()
        .map(|(i, &stamp)| {
            let i = i as u64;
            Chunk {
                last_timestamp_ms: stamp,
                ..chunk(i, i + 1, i, 0, bytes)
            }
        })
        .collect();
    Stream {
        state,
        chunks,
        waiters: Vec::new(),
        recorded_access_ms: 0,
        epoch: 0,
        retiring: false,
    }
}

fn trim_to(action: Option<RetentionAction>) -> Option<(u64, u64)> {
    match action {
        Some(RetentionAction::Trim { from, to, .. }) => Some((from, to)),
        Some(RetentionAction::Delete { name }) => panic!("a delete of {name}"),
        None => None,
    }
}

#[test]
fn retention_by_age_trims_the_old_durable_chunks_only() {
    let name: Rc<str> = Rc::from("/r");
    let by_age = Retention {
        age_ms: Some(1000),
        ..Default::default()
    };
    let old = NOW_MS - 5000;
    let s = stream(by_age, &[old, old, NOW_MS, old], 10, 4);
    assert_eq!(
        trim_to(retention_action(&name, &s, NOW_MS)),
        Some((0, 2)),
        "up to the first chunk young enough, not past it"
    );
    let s = stream(by_age, &[old, old, old], 10, 1);
    assert_eq!(
        trim_to(retention_action(&name, &s, NOW_MS)),
        Some((0, 1)),
        "records not yet durable stay"
    );
    let s = stream(by_age, &[NOW_MS - 999], 10, 1);
    assert_eq!(trim_to(retention_action(&name, &s, NOW_MS)), None);
}

#[test]
fn retention_by_bytes_keeps_the_newest_chunk() {
    let name: Rc<str> = Rc::from("/r");
    let by_bytes = |bytes| Retention {
        bytes: Some(bytes),
        ..Default::default()
    };
    let s = stream(by_bytes(25), &[1, 2, 3, 4], 10, 4);
    assert_eq!(
        trim_to(retention_action(&name, &s, NOW_MS)),
        Some((0, 2)),
        "40 bytes stored, 25 allowed: the two oldest chunks go"
    );
    let s = stream(by_bytes(1), &[1, 2, 3], 10, 3);
    assert_eq!(
        trim_to(retention_action(&name, &s, NOW_MS)),
        Some((0, 2)),
        "a byte limit never empties a stream by itself"
    );
    let s = stream(by_bytes(40), &[1, 2, 3, 4], 10, 4);
    assert_eq!(trim_to(retention_action(&name, &s, NOW_MS)), None);
}

#[test]
fn retention_leaves_forks_their_sources_and_deleted_streams_alone() {
    let name: Rc<str> = Rc::from("/r");
    let tiny = Retention {
        bytes: Some(1),
        age_ms: Some(1),
        delete_on_empty_ms: Some(1),
    };
    let mut source = stream(tiny, &[1, 2, 3], 10, 3);
    source.state.extras_mut().fork_refs = 1;
    assert!(retention_action(&name, &source, NOW_MS).is_none());
    let mut deleted = stream(tiny, &[1, 2, 3], 10, 3);
    deleted.state.soft_deleted = true;
    assert!(retention_action(&name, &deleted, NOW_MS).is_none());
    let mut fork = stream(tiny, &[1, 2, 3], 10, 3);
    fork.state.extras_mut().fork = Some(crate::rules::ForkOrigin {
        row: pico_meta::ForkRow {
            source: "/src".into(),
            source_id: 1,
            offset: 0,
            partial_bytes: 0,
        },
        depth: 1,
    });
    assert!(retention_action(&name, &fork, NOW_MS).is_none());
}

#[test]
fn delete_on_empty_waits_for_the_idle_time() {
    let name: Rc<str> = Rc::from("/r");
    let policy = Retention {
        delete_on_empty_ms: Some(1000),
        ..Default::default()
    };
    let empty = stream(policy, &[], 10, 0);
    assert!(matches!(
        retention_action(&name, &empty, NOW_MS),
        Some(RetentionAction::Delete { .. })
    ));
    let mut recent = stream(policy, &[], 10, 0);
    recent.state.created_ms = NOW_MS - 999;
    assert!(retention_action(&name, &recent, NOW_MS).is_none());
    let holding = stream(policy, &[1], 10, 1);
    assert!(
        retention_action(&name, &holding, NOW_MS).is_none(),
        "a stream with records is not empty"
    );
}

// ---------------------------------------------------------------- the frame budget

/// What `write_frames` writes for one request, encoded the same way.
fn encoded_len(
    records: &[RecordInput],
    close: bool,
    producer: Option<&ProducerTuple>,
    writer_seq: Option<&str>,
) -> usize {
    let mut out = Vec::new();
    for (i, record) in records.iter().enumerate() {
        let last = i + 1 == records.len() && !close;
        let meta = FrameMeta {
            kind: FRAME_KIND_RECORD,
            stream_id: 1,
            offset: i as u64,
            timestamp_ms: 1,
            request_end: last,
            producer: if last { producer } else { None },
            writer_seq: if last { writer_seq } else { None },
        };
        frame::encode_frame(&mut out, meta, &record.headers, &record.body);
    }
    if close {
        let meta = FrameMeta {
            kind: FRAME_KIND_CLOSE,
            stream_id: 1,
            offset: records.len() as u64,
            timestamp_ms: 1,
            request_end: true,
            producer,
            writer_seq,
        };
        frame::encode_frame(&mut out, meta, &[], &[]);
    }
    out.len()
}

#[test]
fn the_frame_budget_of_an_append_bounds_what_it_writes() {
    let producer = ProducerTuple {
        id: "writer-1".into(),
        epoch: 2,
        seq: 9,
    };
    let records: Vec<RecordInput> = (0..5)
        .map(|i| RecordInput {
            headers: vec![(Bytes::from("k"), Bytes::from(format!("v{i}")))],
            body: Bytes::from(vec![b'x'; 100 * i]),
        })
        .collect();
    for (producer, writer_seq) in [(None, None), (Some(&producer), Some("0042"))] {
        let budget = frames_len(&records, producer, writer_seq);
        let closing = encoded_len(&records, true, producer, writer_seq);
        assert_eq!(budget, closing, "a closing append takes its budget exactly");
        let open = encoded_len(&records, false, producer, writer_seq);
        assert_eq!(
            budget - open,
            frame::FRAME_HEADER_LEN,
            "one close frame to spare"
        );
    }
    assert_eq!(frames_len(&[], None, None), frame::FRAME_HEADER_LEN);
}

#[test]
fn a_wal_fault_tells_a_full_disk_from_other_failures() {
    let create = |errno| WalFault::Create {
        path: "/wal/x.wal".into(),
        source: Arc::new(std::io::Error::from_raw_os_error(errno)),
    };
    let full = create(libc::ENOSPC);
    assert!(full.out_of_space());
    let shown = full.to_string();
    assert!(
        shown.starts_with("cannot create WAL file /wal/x.wal: "),
        "{shown}"
    );
    assert_eq!(
        full.io_error().and_then(|e| e.raw_os_error()),
        Some(libc::ENOSPC)
    );
    assert!(create(libc::EDQUOT).out_of_space());
    assert!(!create(libc::EIO).out_of_space());
    // Out of space only says why the next file cannot be made.
    let sync = WalFault::Fdatasync {
        path: "/wal/x.wal".into(),
        source: Arc::new(std::io::Error::from_raw_os_error(libc::ENOSPC)),
    };
    assert!(!sync.out_of_space());
}

// ---------------------------------------------------------------- acknowledgements

/// An append of `body_bytes` to stream `id` at owner epoch `epoch`, whose frames end at
/// byte `end` of segment `segment`.
fn ack(
    segment: u64,
    end: usize,
    id: u64,
    epoch: u64,
    body_bytes: usize,
) -> (PendingAck, oneshot::Receiver<Result<(), AppendError>>) {
    let (reply, rx) = oneshot::channel();
    let pending = PendingAck {
        segment,
        end,
        name: Rc::from("/s"),
        stream_id: id,
        epoch,
        next_offset: end as u64,
        closed: false,
        body_bytes,
        reply,
    };
    (pending, rx)
}

/// (segment, end, release) of what a release round takes.
fn released(taken: Vec<(PendingAck, Release)>) -> Vec<(u64, usize, Release)> {
    taken
        .into_iter()
        .map(|(ack, release)| (ack.segment, ack.end, release))
        .collect()
}

#[test]
fn acks_leave_in_order_and_never_before_their_bytes_are_durable() {
    let mut queue = AckQueue::default();
    let mut replies = Vec::new();
    for (segment, end) in [(0, 10), (0, 20), (1, 5), (1, 9)] {
        let (pending, rx) = ack(segment, end, 1, 0, 100);
        queue.push(pending);
        replies.push(rx);
    }
    assert_eq!(queue.in_flight_bytes(), 400);
    // Segment 0 is durable through byte 15, segment 1 entirely: the second ack waits, and
    // so do those behind it although their own bytes are durable.
    let durable = |ack: &PendingAck| ack.segment == 1 || ack.end <= 15;
    let first = released(queue.take_released(false, durable));
    assert_eq!(first, vec![(0, 10, Release::Durable)]);
    assert_eq!(queue.in_flight_bytes(), 300);
    let rest = released(queue.take_released(false, |_| true));
    assert_eq!(
        rest,
        vec![
            (0, 20, Release::Durable),
            (1, 5, Release::Durable),
            (1, 9, Release::Durable)
        ]
    );
    assert!(queue.is_empty());
    assert_eq!(queue.in_flight_bytes(), 0);
}

#[test]
fn a_held_queue_still_fails_its_fenced_front_and_forgets_fences_no_ack_names() {
    let mut queue = AckQueue::default();
    let (a, _ra) = ack(0, 10, 1, 3, 10);
    let (b, _rb) = ack(0, 20, 2, 0, 20);
    let (c, _rc) = ack(0, 30, 1, 3, 30);
    queue.push(a);
    queue.push(b);
    queue.push(c);
    queue.fence(1, 3);
    queue.fence(9, 9);
    // A lapsed lease holds every durable ack, but the fenced front fails now.
    let held = released(queue.take_released(true, |_| true));
    assert_eq!(held, vec![(0, 10, Release::Fenced)]);
    assert_eq!(queue.in_flight_bytes(), 50);
    // The lease is back: the unfenced ack is released, the fenced one behind it fails.
    let later = released(queue.take_released(false, |_| true));
    assert_eq!(
        later,
        vec![(0, 20, Release::Durable), (0, 30, Release::Fenced)]
    );
    // Stream 1 loaded again at the same epoch: with the fence pruned its new appends pass.
    let (d, _rd) = ack(1, 5, 1, 3, 5);
    queue.push(d);
    let again = released(queue.take_released(false, |_| true));
    assert_eq!(again, vec![(1, 5, Release::Durable)]);
}

#[test]
fn a_failed_wal_drains_the_queue_and_keeps_its_bytes_counted() {
    let mut queue = AckQueue::default();
    let (a, _ra) = ack(0, 10, 1, 0, 10);
    queue.push(a);
    assert_eq!(queue.drain().len(), 1);
    assert!(queue.is_empty());
    assert_eq!(queue.in_flight_bytes(), 10);
}

// ---------------------------------------------------------------- the read cache

fn block_of(byte: u8) -> Bytes {
    Bytes::from(vec![byte; 100])
}

/// Fetches block `index` of segment `no` as a reader would: the count one GET brings, its
/// blocks filed (each `100` bytes of `index + i`).
fn fetch(cache: &mut ReadCache, no: u64, index: u64, block_count: u64) -> u64 {
    let count = cache.start_loading(no, index, block_count, None);
    let mut bytes = Vec::new();
    for i in 0..count {
        let mut block = vec![(index + i) as u8; 100];
        if i + 1 < count {
            block.resize(CACHE_BLOCK_BYTES, (index + i) as u8);
        }
        bytes.extend(block);
    }
    cache.finish(no, index, count, &Ok(Bytes::from(bytes)));
    count
}

#[test]
fn readahead_doubles_for_a_sequential_reader_up_to_its_cap() {
    let mut cache = ReadCache::default();
    let mut windows = Vec::new();
    let mut next = 0;
    while next < 40 {
        let count = fetch(&mut cache, 1, next, 40);
        windows.push(count);
        next += count;
    }
    assert_eq!(windows, vec![1, 2, 4, 8, 8, 8, 8, 1]);
    // A jump resets the window; a block already present and the segment's end stop it.
    let mut cache = ReadCache::default();
    fetch(&mut cache, 2, 0, 10);
    fetch(&mut cache, 2, 1, 10);
    fetch(&mut cache, 2, 5, 10);
    assert_eq!(
        fetch(&mut cache, 2, 3, 10),
        1,
        "not where the last GET ended"
    );
    assert_eq!(fetch(&mut cache, 2, 4, 10), 1, "block 5 is cached already");
    assert_eq!(
        fetch(&mut cache, 2, 6, 10),
        1,
        "block 5 was not read from here"
    );
    assert_eq!(fetch(&mut cache, 2, 7, 10), 2);
    assert_eq!(
        fetch(&mut cache, 2, 9, 10),
        1,
        "one block left in the segment"
    );
}

#[test]
fn one_get_per_block_its_readers_wait_for() {
    let mut cache = ReadCache::default();
    assert!(matches!(cache.lookup(1, 0), Lookup::Miss));
    let (tx, mut first) = oneshot::channel();
    cache.start_loading(1, 0, 1, Some(tx));
    assert!(cache.has_block(1, 0));
    let Lookup::Wait(mut second) = cache.lookup(1, 0) else {
        panic!("a second reader joins the GET in flight")
    };
    for (waiters, outcome) in cache.finish(1, 0, 1, &Ok(block_of(7))) {
        for waiter in waiters {
            let _ = waiter.send(outcome.clone());
        }
    }
    for rx in [&mut first, &mut second] {
        let got = rx
            .try_recv()
            .unwrap()
            .expect("answered")
            .expect("the bytes");
        assert_eq!(got, block_of(7));
    }
    assert!(matches!(cache.lookup(1, 0), Lookup::Hit(b) if b == block_of(7)));
    assert_eq!(cache.memory_bytes(), 100);
}

#[test]
fn a_failed_get_caches_nothing_and_fails_its_readers() {
    let mut cache = ReadCache::default();
    let (tx, mut rx) = oneshot::channel();
    cache.start_loading(1, 0, 1, Some(tx));
    let failed = crate::error::StorageFault::SegmentGone { segment: 1 };
    let wakes = cache.finish(1, 0, 1, &Err(EngineError::Storage(failed)));
    for (waiters, outcome) in wakes {
        for waiter in waiters {
            let _ = waiter.send(outcome.clone());
        }
    }
    assert!(matches!(
        rx.try_recv(),
        Ok(Some(Err(EngineError::Storage(_))))
    ));
    assert!(
        matches!(cache.lookup(1, 0), Lookup::Miss),
        "tried again next read"
    );
    assert_eq!(cache.memory_bytes(), 0);
}

#[test]
fn eviction_drops_held_segments_oldest_first_then_blocks_first_filed_first() {
    let mut cache = ReadCache::default();
    cache.hold_segment(10, 300);
    cache.hold_segment(11, 300);
    for no in [1, 2, 3] {
        cache.start_loading(no, 0, 1, None);
        cache.finish(no, 0, 1, &Ok(block_of(no as u8)));
    }
    assert_eq!(cache.memory_bytes(), 900);
    assert_eq!(cache.evict(900), Vec::<u64>::new(), "within budget");
    assert_eq!(cache.evict(600), vec![10]);
    assert_eq!(cache.evict(250), vec![11], "then the blocks");
    assert!(
        matches!(cache.lookup(1, 0), Lookup::Miss),
        "the first block filed went"
    );
    assert!(matches!(cache.lookup(2, 0), Lookup::Hit(_)));
    assert_eq!(cache.memory_bytes(), 200);
    // A block being fetched again keeps its GET's entry; its old bytes leave the count.
    cache.forget(&[2], |_| true);
    cache.start_loading(2, 0, 1, None);
    assert_eq!(cache.evict(100), Vec::<u64>::new());
    assert!(cache.has_block(2, 0), "the GET in flight is not dropped");
    assert_eq!(cache.memory_bytes(), 100);
    assert!(matches!(cache.lookup(3, 0), Lookup::Hit(_)));
}

#[test]
fn uploaded_segments_are_kept_only_while_sealed_data_is_read() {
    let mut cache = ReadCache::default();
    let start = std::time::Instant::now();
    let recent = std::time::Duration::from_millis(limits::SEALED_READ_RECENT_MS);
    assert!(!cache.keep_uploaded(start), "nothing was ever read");
    cache.note_sealed_read(start);
    let late = start + recent * 2;
    assert!(cache.keep_uploaded(late), "read since the last upload");
    assert!(
        !cache.keep_uploaded(late),
        "long ago, and not since that upload"
    );
    cache.note_sealed_read(late);
    assert!(cache.keep_uploaded(late));
    assert!(cache.keep_uploaded(late + recent / 2), "read lately");
    assert!(!cache.keep_uploaded(late + recent));
}

#[test]
fn checked_ranges_merge_and_go_with_their_blocks() {
    let mut cache = ReadCache::default();
    for no in [1, 2] {
        cache.start_loading(no, 0, 1, None);
        cache.finish(no, 0, 1, &Ok(block_of(no as u8)));
    }
    let at = cache.generation();
    assert!(!cache.is_checked(1, 0, 10), "nothing checked yet");
    cache.mark_checked(1, 10, 20, at);
    cache.mark_checked(1, 30, 40, at);
    assert!(cache.is_checked(1, 10, 20) && cache.is_checked(1, 32, 40));
    assert!(!cache.is_checked(1, 15, 35), "a gap between two checks");
    assert!(!cache.is_checked(2, 10, 20), "another segment");
    cache.mark_checked(1, 20, 30, at);
    assert!(cache.is_checked(1, 10, 40), "touching ranges merge");
    cache.mark_checked(2, 0, 8, at);
    // A block leaving the cache: its segment is unchecked, and a check begun before counts
    // for nothing (the block may come back with other bytes).
    let before = cache.generation();
    assert_eq!(cache.evict(100), Vec::<u64>::new());
    assert!(!cache.is_checked(1, 10, 20));
    assert!(cache.is_checked(2, 0, 8), "segment 2 kept its block");
    cache.mark_checked(1, 10, 20, before);
    assert!(!cache.is_checked(1, 10, 20), "a stale check is refused");
    cache.forget(&[2], |_| true);
    assert!(!cache.is_checked(2, 0, 8));
}

#[test]
fn checked_ranges_per_segment_are_bounded() {
    let mut cache = ReadCache::default();
    let at = cache.generation();
    let max = limits::CHECKED_RANGES_PER_SEGMENT_MAX as u64;
    for i in 0..max + 10 {
        cache.mark_checked(7, i * 10, i * 10 + 5, at);
    }
    let kept = (0..max + 10)
        .filter(|i| cache.is_checked(7, i * 10, i * 10 + 5))
        .count();
    assert_eq!(kept as u64, max);
}

#[test]
fn forgotten_segments_leave_the_cache() {
    let mut cache = ReadCache::default();
    cache.hold_segment(1, 50);
    cache.hold_segment(2, 70);
    cache.start_loading(1, 0, 1, None);
    cache.finish(1, 0, 1, &Ok(block_of(1)));
    cache.forget(&[1], |no| no != 1);
    assert!(!cache.has_block(1, 0));
    // The block's bytes stay counted until eviction reaches its entry.
    assert_eq!(cache.memory_bytes(), 170);
    assert_eq!(cache.evict(0), vec![2]);
    assert_eq!(cache.memory_bytes(), 0);
}

// ---------------------------------------------------------------- seal order

#[test]
fn catalog_commits_take_turns_in_seal_order() {
    let mut queue = SealQueue::default();
    for (no, len) in [(4, 100), (5, 200), (6, 300)] {
        queue.sealed(no, len);
    }
    assert_eq!(queue.unuploaded_bytes(), 600);
    // Segment 5's PUT finished first: it waits for 4.
    let mut five = queue.turn(5).expect("5 waits for 4");
    let mut six = queue.turn(6).expect("6 waits too");
    queue.stored(200);
    assert!(queue.turn(4).is_none(), "the oldest commits at once");
    assert_eq!(five.try_recv(), Ok(None), "not woken before 4 is committed");
    for waiter in queue.end_turn(4) {
        let _ = waiter.send(());
    }
    assert_eq!(five.try_recv(), Ok(Some(())));
    assert_eq!(six.try_recv(), Ok(Some(())));
    assert!(queue.turn(5).is_none(), "5 is the front now");
    assert!(queue.turn(6).is_some(), "6 still waits for 5");
    queue.stored(100);
    assert_eq!(queue.unuploaded_bytes(), 300);
}

// ---------------------------------------------------------------- streams moved away

#[test]
fn the_memory_of_streams_moved_away_is_bounded() {
    let mut moves = Moves::default();
    moves.remember("/first", 7);
    assert_eq!(moves.moved_to("/first"), Some(7));
    for i in 1..crate::limits::REMOTE_STREAMS_PER_CORE_MAX {
        moves.remember(&format!("/s{i}"), 2);
    }
    assert_eq!(moves.moved_to("/first"), Some(7), "full, not past it");
    moves.remember("/last", 3);
    assert_eq!(moves.moved_to("/first"), None, "cleared when full");
    assert_eq!(moves.moved_to("/last"), Some(3));
    moves.forget("/last");
    assert_eq!(moves.moved_to("/last"), None);
    moves.begin_hand_off(Rc::from("/h"));
    assert!(moves.handing_off("/h") && !moves.handing_off("/last"));
    moves.end_hand_off("/h");
    assert!(!moves.handing_off("/h"));
}

#[test]
fn an_idle_stream_stays_small() {
    // A core holds one `Stream` per stream it owns, in a B-tree of 11 per node: this is most
    // of what an idle stream costs (384 bytes before the rarely set fields were boxed).
    assert!(
        std::mem::size_of::<Stream>() <= 160,
        "Stream is {} bytes",
        std::mem::size_of::<Stream>()
    );
    let plain = stream(Retention::default(), &[], 0, 0);
    assert_eq!(
        plain.state,
        StreamState::new(7, plain.state.config(), false, 0),
        "a plain stream's config survives the round trip"
    );
}

#[test]
fn rarely_set_fields_read_as_defaults_until_set() {
    let mut state = stream(Retention::default(), &[], 0, 0).state;
    assert!(state.extras().producers.is_empty() && state.fork().is_none());
    let producer = ProducerTuple {
        id: "p".into(),
        epoch: 0,
        seq: 0,
    };
    let append = crate::rules::AppendCommand {
        records: 1,
        close: true,
        match_offset: None,
        producer: Some(&producer),
        content_type: None,
        writer_seq: Some("a"),
        producer_limits: &crate::producers::ProducerLimits::default(),
    };
    state.apply_append(append, 5).expect("first append");
    assert_eq!(
        state.extras().producers.get("p").map(|p| (p.epoch, p.seq)),
        Some((0, 0))
    );
    assert_eq!(state.extras().closed_by.as_ref(), Some(&producer));
    assert_eq!(state.extras().writer_seq.as_deref(), Some("a"));
    // A retry of the same request is a duplicate, as before the fields moved.
    let outcome = state.apply_append(append, 6).expect("retry");
    assert!(matches!(
        outcome,
        crate::rules::AppendOutcome::Duplicate { last_seq: 0, .. }
    ));
    let expiring = StreamState::new(
        8,
        StreamConfig {
            content_type: "text/plain".into(),
            ttl_sec: Some(60),
            expires_at_ms: None,
            retention: Retention::default(),
        },
        false,
        0,
    );
    assert_eq!(expiring.config().ttl_sec, Some(60));
    assert_eq!(expiring.deadline_ms(), Some(60_000));
}

#[test]
fn content_types_are_shared_up_to_a_bound() {
    use std::sync::Arc;
    let mut known = Vec::new();
    let first = super::streams::intern(&mut known, "application/json");
    let second = super::streams::intern(&mut known, &String::from("application/json"));
    assert!(Arc::ptr_eq(&first, &second), "one copy for one type");
    for i in 0..crate::limits::INTERNED_CONTENT_TYPES_MAX * 2 {
        let fresh = format!("x/{i}");
        let got = super::streams::intern(&mut known, &fresh);
        assert_eq!(&*got, fresh.as_str());
    }
    assert_eq!(
        known.len(),
        crate::limits::INTERNED_CONTENT_TYPES_MAX,
        "a client sending new types cannot grow the table"
    );
    assert!(Arc::ptr_eq(
        &super::streams::intern(&mut known, "application/json"),
        &first
    ));
}

#[test]
fn the_reaper_looks_at_a_bounded_number_of_streams_per_round_and_at_all_of_them_over_rounds() {
    use std::collections::BTreeMap;

    use super::reaper::reapable_round;
    use crate::limits::REAPER_SCAN_STREAMS_PER_ROUND;

    let count = REAPER_SCAN_STREAMS_PER_ROUND * 5 / 2;
    let mut streams: BTreeMap<Rc<str>, Stream> = BTreeMap::new();
    for i in 0..count {
        let mut stream = stream(Retention::default(), &[], 0, 0);
        stream.state.id = i as u64;
        if i % 1000 == 0 {
            stream.state.extras_mut().expires_at_ms = Some(NOW_MS - 1);
        }
        if i == 5000 {
            // Expired, but a fork still reads it: it stays.
            stream.state.extras_mut().fork_refs = 1;
        }
        if i == 7001 || i == 7002 {
            // Deleted while forks read it: it goes once none does.
            stream.state.soft_deleted = true;
            stream.state.extras_mut().fork_refs = u64::from(i == 7002);
        }
        streams.insert(Rc::from(format!("/s/{i:06}").as_str()), stream);
    }
    let mut after: Option<Rc<str>> = None;
    let mut reaped = Vec::new();
    let mut rounds = 0;
    loop {
        rounds += 1;
        let (expired, next) = reapable_round(&streams, after.as_deref(), NOW_MS);
        reaped.extend(expired.into_iter().map(|(_, id)| id));
        match next {
            Some(name) => after = Some(name),
            None => break,
        }
        assert!(rounds < 10, "the rounds end");
    }
    assert_eq!(
        rounds, 3,
        "{count} streams, {REAPER_SCAN_STREAMS_PER_ROUND} a round"
    );
    let expected: Vec<u64> = (0..count as u64)
        .filter(|i| (i % 1000 == 0 && *i != 5000) || *i == 7001)
        .collect();
    reaped.sort_unstable();
    assert_eq!(reaped, expected);
}
