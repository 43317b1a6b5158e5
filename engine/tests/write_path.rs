//! The engine's write path in process, without spawning `pico`: group commit (many appends
//! at once share few `fdatasync`s, every one acknowledged at a contiguous offset); recovery
//! from the WAL after a stop without a flush, of a torn last frame, and of WAL files written
//! by another core count; sealing into a `file://` bucket with reads across every segment
//! boundary; and the block cache (reads after eviction give the same bytes, a budget that
//! holds everything serves a second pass without a GET, uploaded segments kept in memory only
//! while sealed data is read).

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::{
    append_request, create_request, page_request, read_bodies, record, run_returning, wal_files,
};
use pico_engine::metrics::CoreMetrics;
use pico_engine::{AppendAck, CoreHandle, EngineConfig};

fn config(dir: &std::path::Path, segment_size: usize, cache_bytes: usize) -> EngineConfig {
    EngineConfig {
        segment_size,
        // Segments seal by size (or by a flush) here, never by the clock.
        segment_max_age_ms: 3_600_000,
        segment_cache_bytes: cache_bytes,
        gc_interval_ms: 3_600_000,
        object_puts_per_second: pico_engine::limits::OBJECT_PUTS_PER_SECOND_DEFAULT,
        ..common::config(dir, 1)
    }
}

/// An engine of `cores` cores on `dir` whose segments are too large to seal by size here.
fn on_cores(cores: usize, dir: &std::path::Path) -> EngineConfig {
    EngineConfig {
        cores,
        ..config(dir, 4 << 20, 1 << 20)
    }
}

/// After a restart: every record of `name`, and the offset the next append gets.
fn restarted(dir: &std::path::Path, name: &'static str) -> (Vec<(u64, Bytes)>, u64) {
    run_returning(on_cores(1, dir), dir, move |core, _| async move {
        let records = read_all(&core, name, 7).await;
        let next = append(&core, name, body(999, 100)).await;
        (records, next.start_offset.unwrap())
    })
}

async fn create(core: &CoreHandle, name: &str) {
    let request = create_request("application/octet-stream");
    core.create(name, request).await.expect("create");
}

async fn append(core: &CoreHandle, name: &str, body: Bytes) -> AppendAck {
    let request = append_request(vec![record(body)], false);
    core.append(name, request).await.expect("append")
}

/// Up to `max_records` records from `from`, as (offset, body).
async fn read(core: &CoreHandle, name: &str, from: u64, max_records: usize) -> Vec<(u64, Bytes)> {
    let request = page_request(from, max_records, 64 << 20);
    let batch = core.read(name, &request).await.expect("read");
    batch
        .records
        .iter()
        .map(|r| (r.offset, r.body.clone()))
        .collect()
}

/// Every record of the stream, read in pages of about `page` of this file's records (as
/// many `RECORD_BYTES`).
async fn read_all(core: &CoreHandle, name: &str, page: usize) -> Vec<(u64, Bytes)> {
    read_bodies(core, name, page * RECORD_BYTES).await
}

fn body(i: u64, len: usize) -> Bytes {
    let stamp = format!("{i:08}");
    Bytes::from(stamp.repeat(len / stamp.len()))
}

fn objects(dir: &std::path::Path) -> usize {
    std::fs::read_dir(common::segments_dir(dir)).map_or(0, |d| d.count())
}

const APPENDS: u64 = 400;

/// Appends sent all at once are acknowledged at contiguous offsets, each at the offset its
/// record is read back from, and share far fewer `fdatasync`s than there are appends.
#[test]
fn concurrent_appends_are_group_committed_at_contiguous_offsets() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    let (acks, fsyncs, records) =
        run_returning(on_cores(1, &path), &path, |core, node| async move {
            create(&core, "/g").await;
            let tasks: Vec<_> = (0..APPENDS)
                .map(|i| {
                    let core = core.clone();
                    glommio::spawn_local(async move { (i, append(&core, "/g", body(i, 64)).await) })
                })
                .collect();
            let mut acks = Vec::new();
            for task in tasks {
                acks.push(task.await);
            }
            let fsyncs = CoreMetrics::get(&node.metrics[0].wal_fsyncs);
            (acks, fsyncs, read_all(&core, "/g", 1000).await)
        });
    let mut offsets: Vec<u64> = acks
        .iter()
        .map(|(_, ack)| ack.start_offset.expect("a record was written"))
        .collect();
    offsets.sort_unstable();
    assert_eq!(
        offsets,
        (0..APPENDS).collect::<Vec<_>>(),
        "contiguous, no gap"
    );
    for (i, ack) in &acks {
        let at = ack.start_offset.unwrap();
        assert_eq!(ack.next_offset, at + 1);
        assert_eq!(records[at as usize], (at, body(*i, 64)), "append {i}");
    }
    assert!(fsyncs >= 1, "acknowledged before any fdatasync");
    assert!(
        fsyncs < APPENDS / 4,
        "{fsyncs} fdatasyncs for {APPENDS} concurrent appends: not grouped"
    );
}

/// A core stopped without a flush leaves its records in its WAL file only; the next boot
/// recovers every acknowledged one, and appends go on at the next offset.
#[test]
fn a_restart_recovers_acknowledged_appends_from_the_wal() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    let acked = run_returning(on_cores(1, &path), &path, |core, _| async move {
        create(&core, "/r").await;
        let mut acked = Vec::new();
        for i in 0..50 {
            acked.push((
                append(&core, "/r", body(i, 100))
                    .await
                    .start_offset
                    .unwrap(),
                i,
            ));
        }
        acked
    });
    assert_eq!(
        objects(&path),
        0,
        "nothing sealed: the WAL alone holds the records"
    );
    assert!(!wal_files(&path).is_empty());
    let (records, next) = restarted(&path, "/r");
    let want: Vec<_> = acked.iter().map(|&(at, i)| (at, body(i, 100))).collect();
    assert_eq!(records, want);
    assert_eq!(next, 50);
}

/// A frame torn by a crash (its last bytes never reached the disk) is dropped at recovery
/// with nothing after it, and every complete frame before it is kept.
#[test]
fn recovery_drops_a_torn_last_frame_and_keeps_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run_returning(on_cores(1, &path), &path, |core, _| async move {
        create(&core, "/t").await;
        for i in 0..20 {
            append(&core, "/t", body(i, 200)).await;
        }
    });
    // The file holding the records (the other one, if any, is the empty spare).
    let (file, data) = wal_files(&path)
        .into_iter()
        .map(|f| {
            let data = std::fs::read(&f).unwrap();
            (f, data)
        })
        .find(|(_, data)| {
            let scanned = pico_engine::wal_file::scan(data).unwrap();
            !scanned.committed.is_empty()
        })
        .expect("a WAL file with frames");
    let scanned = pico_engine::wal_file::scan(&data).unwrap();
    assert_eq!(scanned.committed.len(), 20, "one frame per append");
    let last = scanned.committed.last().unwrap();
    // Zero the second half of the last frame and its round's commit record, as a write cut
    // short would leave them.
    let mut torn = data;
    let cut = last.pos + last.len / 2;
    torn[cut..scanned.committed_end].fill(0);
    std::fs::write(&file, &torn).unwrap();
    let (records, next) = restarted(&path, "/t");
    let want: Vec<_> = (0..19).map(|i| (i, body(i, 200))).collect();
    assert_eq!(records, want);
    assert_eq!(next, 19, "the torn record's offset is given again");
}

const SEGMENT_BYTES: usize = 16 * 1024;
const RECORDS: u64 = 300;
const RECORD_BYTES: usize = 1000;

/// Writes `RECORDS` records to `/s` in small segments and flushes: every segment sealed,
/// uploaded and its WAL file gone.
fn write_sealed(path: &std::path::Path) {
    let flushed = run_returning(
        config(path, SEGMENT_BYTES, 1 << 20),
        path,
        |core, _| async move {
            create(&core, "/s").await;
            for i in 0..RECORDS {
                append(&core, "/s", body(i, RECORD_BYTES)).await;
            }
            core.flush(Duration::from_secs(120)).await
        },
    );
    assert!(flushed, "the flush stored every segment");
}

/// Small segments seal by size and go to the bucket; a read starting at any offset, crossing
/// segment boundaries, gets the records in order, warm (sealed segments still in memory) and
/// cold after a restart (from the bucket).
#[test]
fn sealed_segments_are_uploaded_and_read_across_their_boundaries() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    write_sealed(&path);
    let total = RECORDS as usize * RECORD_BYTES;
    let sealed = objects(&path);
    assert!(
        sealed >= total / SEGMENT_BYTES,
        "{sealed} objects for {total} bytes in {SEGMENT_BYTES}-byte segments"
    );
    assert!(
        wal_files(&path).len() <= 2,
        "after a flush only the empty active file and the spare are left"
    );
    let want: Vec<_> = (0..RECORDS).map(|i| (i, body(i, RECORD_BYTES))).collect();
    let (pages, whole) = run_returning(
        config(&path, SEGMENT_BYTES, 1 << 20),
        &path,
        |core, _| async move {
            // Three records from every offset: every boundary is crossed by some read.
            let mut pages = Vec::new();
            for from in 0..RECORDS {
                pages.push(read(&core, "/s", from, 3).await);
            }
            (pages, read_all(&core, "/s", 10_000).await)
        },
    );
    assert_eq!(whole, want);
    for (from, page) in pages.iter().enumerate() {
        let end = (from + 3).min(RECORDS as usize);
        assert_eq!(page[..], want[from..end], "read from {from}");
    }
}

/// Reads of uploaded segments through a cache smaller than the data: the second pass finds
/// its blocks evicted and fetches them again, with the same bytes. With a budget that holds
/// every block, the second pass is served from the cache alone.
#[test]
fn the_block_cache_evicts_within_its_budget_and_reads_back_the_same_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    write_sealed(&path);
    let want: Vec<_> = (0..RECORDS).map(|i| (i, body(i, RECORD_BYTES))).collect();
    let two_passes = |cache_bytes: usize| {
        run_returning(
            config(&path, SEGMENT_BYTES, cache_bytes),
            &path,
            |core, node| async move {
                let misses = || CoreMetrics::get(&node.metrics[0].cache_misses);
                let first = read_all(&core, "/s", 10).await;
                let after_first = misses();
                let second = read_all(&core, "/s", 10).await;
                (first, second, after_first, misses() - after_first)
            },
        )
    };
    // A budget of two segments for about twenty.
    let (first, second, cold_misses, again) = two_passes(2 * SEGMENT_BYTES);
    assert_eq!(first, want);
    assert_eq!(second, want, "evicted blocks fetched again read the same");
    assert!(cold_misses > 0, "a cold read goes to the bucket");
    assert!(
        again > 0,
        "the small budget kept every block: nothing was evicted"
    );
    let (first, second, _, again) = two_passes(64 << 20);
    assert_eq!((first, second), (want.clone(), want));
    assert_eq!(
        again, 0,
        "a budget that holds everything serves the second pass"
    );
}

/// An uploaded segment stays in memory only while readers read behind the open segments: with
/// nobody reading sealed data, the first read after the uploads goes to the bucket; once one
/// does (and keeps doing so), the segments uploaded next are served from memory.
#[test]
fn uploaded_segments_stay_in_memory_only_while_sealed_data_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    let (unread, read_behind, first, second) = run_returning(
        config(&path, SEGMENT_BYTES, 64 << 20),
        &path,
        |core, node| async move {
            let misses = || CoreMetrics::get(&node.metrics[0].cache_misses);
            create(&core, "/s").await;
            for i in 0..RECORDS {
                append(&core, "/s", body(i, RECORD_BYTES)).await;
            }
            assert!(core.flush(Duration::from_secs(120)).await, "flushed");
            let before = misses();
            let first = read_all(&core, "/s", 10).await;
            let unread = misses() - before;
            // A reader behind the tail: record 0 (sealed) read after every append.
            for i in RECORDS..2 * RECORDS {
                append(&core, "/s", body(i, RECORD_BYTES)).await;
                assert_eq!(read(&core, "/s", 0, 1).await.len(), 1);
            }
            assert!(core.flush(Duration::from_secs(120)).await, "flushed");
            let before = misses();
            let second = read_all(&core, "/s", 10).await;
            (unread, misses() - before, first, second)
        },
    );
    let want = |n: u64| -> Vec<_> { (0..n).map(|i| (i, body(i, RECORD_BYTES))).collect() };
    assert_eq!(first, want(RECORDS));
    assert_eq!(second, want(2 * RECORDS));
    assert!(
        unread > 0,
        "segments uploaded while nobody read sealed data were still held in memory"
    );
    assert_eq!(
        read_behind, 0,
        "segments uploaded while a reader read behind the tail went to the bucket"
    );
}

/// A segment damaged in the bucket is refused, not served: the read that reaches the damaged
/// frame fails, and so does the next one (a failed check marks nothing as checked), while the
/// records before the damage read back as written.
#[test]
fn a_segment_damaged_in_the_bucket_fails_the_reads_that_reach_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    write_sealed(&path);
    let mut objects: Vec<_> = std::fs::read_dir(common::segments_dir(&path))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    objects.sort();
    let victim = &objects[objects.len() / 2];
    let mut bytes = std::fs::read(victim).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x20;
    std::fs::write(victim, &bytes).unwrap();
    let (good, errors) = run_returning(
        config(&path, SEGMENT_BYTES, 64 << 20),
        &path,
        |core, _| async move {
            let mut good = Vec::new();
            let mut errors = Vec::new();
            for _attempt in 0..2 {
                let mut from = 0;
                loop {
                    let request = page_request(from, 1000, 10 * RECORD_BYTES);
                    match core.read("/s", &request).await {
                        Ok(batch) if batch.records.is_empty() => break,
                        Ok(batch) => {
                            good.extend(batch.records.iter().map(|r| (r.offset, r.body.clone())));
                            from = batch.next_offset;
                        }
                        Err(e) => {
                            errors.push(e.to_string());
                            break;
                        }
                    }
                }
            }
            (good, errors)
        },
    );
    assert_eq!(
        errors.len(),
        2,
        "both passes stopped at the damage: {errors:?}"
    );
    assert!(
        errors.iter().all(|e| e.contains("corrupt frame")),
        "{errors:?}"
    );
    for (offset, body_read) in &good {
        assert_eq!(*body_read, body(*offset, RECORD_BYTES), "record {offset}");
    }
    assert!(
        !good.is_empty(),
        "the records before the damage were served"
    );
}

const STREAMS: u64 = 8;

/// WAL files are recovered whatever core count wrote them: a node that ran on two cores and
/// stopped without a flush restarts on one, then on three, and every stream has all its
/// records, wherever its new owner core is.
#[test]
fn wal_files_of_another_core_count_are_recovered() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    let name = |s: u64| format!("/c{s}");
    run_returning(on_cores(2, &path), &path, move |core, _| async move {
        for s in 0..STREAMS {
            create(&core, &name(s)).await;
        }
        for i in 0..10 {
            for s in 0..STREAMS {
                append(&core, &name(s), body(s * 100 + i, 50)).await;
            }
        }
    });
    let cores_written: std::collections::BTreeSet<String> = wal_files(&path)
        .iter()
        .filter(|f| pico_engine::frame::valid_prefix_len(&std::fs::read(f).unwrap()) > 0)
        .map(|f| {
            f.file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .split('-')
                .nth(1)
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(
        cores_written.into_iter().collect::<Vec<_>>(),
        vec!["000", "001"],
        "both cores wrote a WAL file"
    );
    let want = |s: u64, count: u64| -> Vec<(u64, Bytes)> {
        (0..count).map(|i| (i, body(s * 100 + i, 50))).collect()
    };
    let (on_one, next) = run_returning(on_cores(1, &path), &path, move |core, _| async move {
        let mut all = Vec::new();
        let mut next = Vec::new();
        for s in 0..STREAMS {
            all.push(read_all(&core, &name(s), 1000).await);
            next.push(
                append(&core, &name(s), body(s * 100 + 10, 50))
                    .await
                    .start_offset,
            );
        }
        (all, next)
    });
    for s in 0..STREAMS {
        assert_eq!(on_one[s as usize], want(s, 10), "stream {s} on one core");
        assert_eq!(next[s as usize], Some(10));
    }
    let on_three = run_returning(on_cores(3, &path), &path, move |core, _| async move {
        let mut all = Vec::new();
        for s in 0..STREAMS {
            all.push(read_all(&core, &name(s), 1000).await);
        }
        all
    });
    for s in 0..STREAMS {
        assert_eq!(
            on_three[s as usize],
            want(s, 11),
            "stream {s} on three cores"
        );
    }
}
