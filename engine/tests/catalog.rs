//! The segment catalog stays small: streams written in interleaved commit rounds (each round
//! one append per stream, so no two of a stream's runs touch) are committed as a few runs per
//! stream and segment, spans of at most `limits::SEALED_CHUNK_BYTES_MAX` bytes, both when a
//! running core seals and when recovery indexes a WAL file; after a restart every offset is
//! still read back from the cold segments.

mod common;

use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;
use common::{append_request, create_request, read_bodies, record, run_returning};
use pico_engine::limits::SEALED_CHUNK_BYTES_MAX;
use pico_engine::{CoreHandle, EngineConfig, ReadFrom, ReadRequest};
use pico_meta::{MetaStore, MetaUrl, SegmentRun};

const STREAMS: usize = 4;
/// Records per stream before the flush (sealed by the running core) and after it (left in the
/// WAL, sealed by recovery).
const SEALED_RECORDS: u64 = 700;
const RECOVERED_RECORDS: u64 = 150;
const TOTAL: u64 = SEALED_RECORDS + RECOVERED_RECORDS;
const RECORD_BYTES: usize = 1000;
/// Larger than a span, so a segment holds several spans of each stream.
const SEGMENT_BYTES: usize = 3 << 20;

fn config(dir: &std::path::Path) -> EngineConfig {
    EngineConfig {
        segment_size: SEGMENT_BYTES,
        // Segments seal by size, a flush or recovery here, never by the clock.
        segment_max_age_ms: 3_600_000,
        segment_cache_bytes: 4 << 20,
        gc_interval_ms: 3_600_000,
        ..common::config(dir, 1)
    }
}

fn name(stream: usize) -> String {
    format!("/c{stream}")
}

fn body(stream: usize, offset: u64) -> Bytes {
    let stamp = format!("{stream}:{offset:08}:");
    let mut body = stamp.into_bytes();
    body.resize(RECORD_BYTES, b'a' + (offset % 26) as u8);
    Bytes::from(body)
}

/// One writer per stream, each waiting for its ack before the next append: every commit round
/// holds one append of each stream, so their frames interleave in the segment.
async fn write_interleaved(core: &Rc<CoreHandle>, from: u64, until: u64) {
    let writers: Vec<_> = (0..STREAMS)
        .map(|stream| {
            let core = core.clone();
            glommio::spawn_local(async move {
                for offset in from..until {
                    let request = append_request(vec![record(body(stream, offset))], false);
                    let ack = core.append(&name(stream), request).await.expect("append");
                    assert_eq!(ack.start_offset, Some(offset));
                }
            })
        })
        .collect();
    for writer in writers {
        writer.await;
    }
}

async fn read_one(core: &CoreHandle, name: &str, from: u64) -> Option<(u64, Bytes)> {
    let request = ReadRequest {
        from: ReadFrom::Offset(from),
        max_records: 1,
        max_bytes: RECORD_BYTES,
        wait_ms: None,
        with_content_type: false,
        bound: None,
    };
    let batch = core.read(name, &request).await.expect("read");
    batch.records.first().map(|r| (r.offset, r.body.clone()))
}

#[test]
fn interleaved_streams_commit_a_few_runs_per_segment_and_read_back_every_offset() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    let flushed = run_returning(config(&path), &path, |core, _| async move {
        for stream in 0..STREAMS {
            core.create(&name(stream), create_request("application/octet-stream"))
                .await
                .expect("create");
        }
        write_interleaved(&core, 0, SEALED_RECORDS).await;
        let flushed = core.flush(Duration::from_secs(120)).await;
        // Acknowledged, in the WAL only: the run stops without a flush, like a crash.
        write_interleaved(&core, SEALED_RECORDS, TOTAL).await;
        flushed
    });
    assert!(flushed, "the flush stored every segment");

    // Recovery seals the WAL file; reads come from the bucket through the block cache.
    let (whole, points) = run_returning(config(&path), &path, |core, _| async move {
        let mut whole = Vec::new();
        let mut points = Vec::new();
        for stream in 0..STREAMS {
            // Pages of three records: every span and segment boundary is crossed by some read.
            whole.push(read_bodies(&core, &name(stream), 3 * RECORD_BYTES).await);
            // Single-record reads starting inside spans, at a stride prime to the span length.
            let mut found = Vec::new();
            for from in (0..TOTAL).step_by(37).chain([TOTAL - 1]) {
                found.push((from, read_one(&core, &name(stream), from).await));
            }
            points.push(found);
        }
        (whole, points)
    });
    for stream in 0..STREAMS {
        let want: Vec<_> = (0..TOTAL).map(|o| (o, body(stream, o))).collect();
        assert_eq!(whole[stream].len(), want.len(), "stream {stream}");
        assert!(
            whole[stream] == want,
            "stream {stream} reads back as written"
        );
        for (from, found) in &points[stream] {
            assert_eq!(
                found.as_ref(),
                Some(&(*from, body(stream, *from))),
                "stream {stream} from {from}"
            );
        }
    }

    let (store, snapshot) = MetaStore::open(&MetaUrl::SqliteFile(path.join("meta.db"))).unwrap();
    store.shutdown();
    let mut runs_of: BTreeMap<u64, Vec<SegmentRun>> = BTreeMap::new();
    let mut catalog_runs = 0;
    for segment in &snapshot.segments {
        for entry in &segment.streams {
            // Spans of at most the bound, each but the last too long to take in the next run:
            // two consecutive spans cover more than the bound.
            let spans_max = 2 * segment.size_bytes.div_ceil(SEALED_CHUNK_BYTES_MAX) + 1;
            assert!(
                entry.runs.len() as u64 <= spans_max,
                "{} runs of stream {} in a {}-byte segment",
                entry.runs.len(),
                entry.stream_id,
                segment.size_bytes
            );
            for run in &entry.runs {
                assert!(
                    run.byte_end - run.byte_start <= SEALED_CHUNK_BYTES_MAX,
                    "{run:?}"
                );
            }
            catalog_runs += entry.runs.len();
            runs_of
                .entry(entry.stream_id)
                .or_default()
                .extend(&entry.runs);
        }
    }
    assert!(
        snapshot.segments.len() >= 2,
        "sealed by the core and by recovery"
    );
    assert_eq!(runs_of.len(), STREAMS);
    for (id, runs) in &mut runs_of {
        runs.sort_by_key(|r| r.first_offset);
        let mut next = 0;
        for run in runs.iter() {
            assert_eq!(run.first_offset, next, "stream {id}: no gap, no overlap");
            next = run.next_offset;
        }
        assert_eq!(next, TOTAL, "stream {id}: every offset in some run");
    }
    let appends = STREAMS * TOTAL as usize;
    assert!(
        catalog_runs * 50 < appends,
        "{catalog_runs} runs in the catalog for {appends} interleaved appends"
    );
}
