//! Compaction under object durability, in process on a `file://` bucket and a SQLite catalog:
//! a lone slow writer's one-object-per-append is merged into segment-size objects, and a
//! catch-up reads a handful of them, every byte as written; the compactor stopped at each
//! step (a failed PUT, a crash after the PUT, a lost swap answer, a crash after the swap)
//! loses, doubles and reorders nothing, before and after a restart; the collector deletes
//! the retired objects after their grace; and the node's PUTs stay within
//! `object_puts_per_second` whatever the append rate.

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{append_request, create_request, read_bodies, record, run_returning};
use pico_engine::faults::{self, CompactStep};
use pico_engine::metrics::{CoreMetrics, NodeMetrics};
use pico_engine::{CoreHandle, Durability, EngineConfig};
use pico_meta::{MetaStore, MetaUrl, SegmentRecord};

/// Object durability, one core, 8 MiB segments (compaction's target) that never seal by age.
fn config(dir: &Path, puts_per_second: u32) -> EngineConfig {
    EngineConfig {
        durability: Durability::Object,
        segment_size: 8 << 20,
        segment_max_age_ms: 3_600_000,
        segment_cache_bytes: 4 << 20,
        object_puts_per_second: puts_per_second,
        ..common::config(dir, 1)
    }
}

fn sum(
    metrics: &NodeMetrics,
    counter: impl Fn(&CoreMetrics) -> &std::sync::atomic::AtomicU64,
) -> u64 {
    metrics.iter().map(|m| CoreMetrics::get(counter(m))).sum()
}

/// Record `i`'s body: `len` bytes that name `i` at every position.
fn body(i: u64, len: usize) -> Bytes {
    let seed = i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (0..len)
        .map(|at| (seed >> ((at % 8) * 8)) as u8 ^ (at / 8) as u8)
        .collect::<Vec<u8>>()
        .into()
}

/// Appends records `from..to` one at a time (each its own flush: one object per append).
async fn write_slowly(core: &CoreHandle, name: &str, from: u64, to: u64, len: usize) {
    for i in from..to {
        let ack = core
            .append(name, append_request(vec![record(body(i, len))], false))
            .await
            .expect("append");
        assert_eq!(ack.start_offset, Some(i));
    }
}

/// Every record of `name` is there once, in order, as written.
async fn check_all(core: &CoreHandle, name: &str, count: u64, len: usize) {
    let records = read_bodies(core, name, 4 << 20).await;
    assert_eq!(records.len() as u64, count, "every record, once");
    for (i, (offset, got)) in records.iter().enumerate() {
        assert_eq!(*offset, i as u64, "in order, no gap");
        assert!(*got == body(i as u64, len), "record {i}'s bytes");
    }
}

/// Waits until compaction has been quiet for a while (nothing merged for an idle period and
/// 3 s) after merging at least `merged_at_least` times: a loaded machine can start the first
/// merge later than the quiet period.
async fn settle(metrics: &NodeMetrics, merged_at_least: u64) {
    let quiet = Duration::from_millis(pico_engine::limits::COMPACT_IDLE_MS + 3_000);
    let mut last = (u64::MAX, u64::MAX);
    let mut since = Instant::now();
    let deadline = Instant::now() + Duration::from_secs(120);
    while Instant::now() < deadline {
        let now = (
            sum(metrics, |m| &m.compactions),
            sum(metrics, |m| &m.compaction_failures),
        );
        if now != last {
            last = now;
            since = Instant::now();
        } else if since.elapsed() >= quiet && now.0 >= merged_at_least {
            return;
        }
        glommio::timer::sleep(Duration::from_millis(100)).await;
    }
    panic!("compaction never settled");
}

/// The catalog as a restart would read it.
fn catalog(dir: &Path) -> Vec<SegmentRecord> {
    let (store, snapshot) =
        MetaStore::open(&MetaUrl::SqliteFile(dir.join("meta.db"))).expect("open the catalog");
    store.shutdown();
    snapshot.segments
}

/// The catalog's segments holding stream `id` (by its entries), and its offsets covered: each
/// exactly once, from 0 to `count`.
fn catalog_of(dir: &Path, id: u64, count: u64) -> usize {
    let segments = catalog(dir);
    let mut covered = Vec::new();
    let mut holding = 0;
    for segment in &segments {
        for entry in segment.streams.iter().filter(|e| e.stream_id == id) {
            holding += 1;
            covered.extend(entry.runs.iter().map(|r| (r.first_offset, r.next_offset)));
        }
    }
    covered.sort_unstable();
    let mut next = 0;
    for (first, end) in covered {
        assert_eq!(
            first, next,
            "the catalog covers each offset once, without a gap"
        );
        next = end;
    }
    assert_eq!(next, count, "the catalog covers every record");
    holding
}

/// Segment objects in the bucket directory (the catalog's marker beside them left out).
fn objects(dir: &Path) -> BTreeSet<String> {
    fn walk(at: &Path, root: &Path, out: &mut BTreeSet<String>) {
        for entry in std::fs::read_dir(at).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, root, out);
            } else if !path
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(".pico-tmp"))
            {
                out.insert(
                    path.strip_prefix(root)
                        .unwrap()
                        .to_string_lossy()
                        .into_owned(),
                );
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(&common::segments_dir(dir), &dir.join("objects"), &mut out);
    out
}

async fn create(core: &CoreHandle, name: &str) -> u64 {
    core.create(name, create_request("application/octet-stream"))
        .await
        .expect("create")
        .info
        .id
}

#[test]
fn a_lone_writers_64_mib_is_read_back_from_at_most_16_objects_after_compaction() {
    const LEN: usize = 32 * 1024;
    const COUNT: u64 = 2048; // 64 MiB
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), 3_500);
    let (id, compacted, puts) =
        run_returning(config.clone(), dir.path(), |core, node| async move {
            let id = create(&core, "slow").await;
            write_slowly(&core, "slow", 0, COUNT, LEN).await;
            let puts = sum(&node.metrics, |m| &m.uploads);
            assert_eq!(puts, COUNT, "a lone writer: one object per append");
            settle(&node.metrics, 1).await;
            // Read back on the node that compacted (its chunks moved to the merged objects).
            check_all(&core, "slow", COUNT, LEN).await;
            (
                id,
                sum(&node.metrics, |m| &m.compacted_segments),
                sum(&node.metrics, |m| &m.compaction_puts),
            )
        });
    let holding = catalog_of(dir.path(), id, COUNT);
    eprintln!(
        "{COUNT} appends of {LEN} B: {COUNT} flush PUTs, {puts} compaction PUTs, \
         {compacted} segments merged, {holding} objects left"
    );
    assert!(holding <= 16, "a catch-up reads {holding} objects");
    assert!(compacted >= COUNT - 16, "{compacted} segments merged");
    // Each byte rewritten about once per size class (32 KiB → 8 MiB: a few), not per merge.
    assert!(puts <= 400, "{puts} compaction PUTs for {COUNT} objects");
    // After a restart the catalog alone says where the records are: every byte again.
    run_returning(config, dir.path(), |core, _| async move {
        check_all(&core, "slow", COUNT, LEN).await;
    });
}

/// One crash test: `COUNT` small records, the compactor stopped at `step`; the node stops
/// there (a crash: nothing flushed), and the catalog as left is checked, then a restart
/// serves every record once and compacts again.
/// Every object a catalog row with entries names is as long as the row says: a merged object
/// never went over one the catalog names.
fn objects_match_the_catalog(dir: &Path) {
    for segment in catalog(dir).iter().filter(|s| !s.streams.is_empty()) {
        let path = dir.join("objects").join(&segment.key);
        let len = std::fs::metadata(&path).map(|m| m.len());
        assert_eq!(len.ok(), Some(segment.size_bytes), "{}", segment.key);
    }
}

fn stopped_at(step: CompactStep) -> (Vec<SegmentRecord>, u64) {
    const LEN: usize = 1_000;
    const COUNT: u64 = 40;
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), 3_500);
    faults::arm_compact(&config.wal_dir, step);
    let id = run_returning(config.clone(), dir.path(), move |core, node| async move {
        let id = create(&core, "s").await;
        write_slowly(&core, "s", 0, COUNT, LEN).await;
        // The compactor may stop at its fault before a merge is counted.
        settle(&node.metrics, 0).await;
        check_all(&core, "s", COUNT, LEN).await;
        id
    });
    assert!(
        !faults::compact_armed(&config.wal_dir, step),
        "the compactor reached {step:?}"
    );
    let left = catalog(dir.path());
    objects_match_the_catalog(dir.path());
    catalog_of(dir.path(), id, COUNT);
    run_returning(config, dir.path(), move |core, node| async move {
        check_all(&core, "s", COUNT, LEN).await;
        // More appends after the restart, so the compactor runs again.
        write_slowly(&core, "s", COUNT, COUNT + 8, LEN).await;
        settle(&node.metrics, 1).await;
        check_all(&core, "s", COUNT + 8, LEN).await;
    });
    let holding = catalog_of(dir.path(), id, COUNT + 8);
    assert!(
        holding <= 2,
        "compacted after the restart: {holding} objects"
    );
    objects_match_the_catalog(dir.path());
    (left, id)
}

#[test]
fn a_failed_put_changes_nothing_and_compaction_goes_on() {
    let (left, id) = stopped_at(CompactStep::FailPut);
    // The next try merged them: one object holds the stream.
    let holding: Vec<_> = left
        .iter()
        .filter(|s| s.streams.iter().any(|e| e.stream_id == id))
        .collect();
    assert!(holding.len() <= 2, "{} objects", holding.len());
}

#[test]
fn a_crash_after_the_put_leaves_a_catalog_right_as_it_stands() {
    let (left, id) = stopped_at(CompactStep::AfterPut);
    // Nothing swapped: one object per append, none retired.
    let holding = left
        .iter()
        .filter(|s| s.streams.iter().any(|e| e.stream_id == id))
        .count();
    assert_eq!(holding, 40);
    assert!(left.iter().all(|s| !s.streams.is_empty()));
}

#[test]
fn a_lost_swap_answer_is_asked_again_and_merges_once() {
    let (left, id) = stopped_at(CompactStep::LoseSwapAnswer);
    let holding = left
        .iter()
        .filter(|s| s.streams.iter().any(|e| e.stream_id == id))
        .count();
    assert!(holding <= 2, "{holding} objects");
}

#[test]
fn a_crash_after_the_swap_is_served_from_the_merged_object_after_a_restart() {
    let (left, id) = stopped_at(CompactStep::AfterSwap);
    let holding = left
        .iter()
        .filter(|s| s.streams.iter().any(|e| e.stream_id == id))
        .count();
    assert!(holding < 40, "the swap committed: {holding} objects");
    assert!(left.iter().any(|s| s.streams.is_empty()), "retired rows");
}

#[test]
fn the_collector_deletes_retired_objects_after_their_grace() {
    const LEN: usize = 1_000;
    const COUNT: u64 = 40;
    let dir = tempfile::tempdir().unwrap();
    let config = EngineConfig {
        gc_interval_ms: 100,
        ..config(dir.path(), 3_500)
    };
    faults::set_retire_grace_ms(&config.wal_dir, 300);
    let bucket = dir.path().to_path_buf();
    let id = run_returning(config, dir.path(), move |core, node| async move {
        let id = create(&core, "g").await;
        write_slowly(&core, "g", 0, COUNT, LEN).await;
        settle(&node.metrics, 1).await;
        let deadline = Instant::now() + Duration::from_secs(30);
        while objects(&bucket).len() > 2 && Instant::now() < deadline {
            glommio::timer::sleep(Duration::from_millis(100)).await;
        }
        assert!(objects(&bucket).len() <= 2, "{:?}", objects(&bucket));
        // Reads on this node still find every record (the old entries went with the grace).
        check_all(&core, "g", COUNT, LEN).await;
        id
    });
    let segments = catalog(dir.path());
    assert!(
        segments.iter().all(|s| !s.streams.is_empty()),
        "no retired row left"
    );
    let keys: BTreeSet<String> = segments.iter().map(|s| s.key.clone()).collect();
    assert_eq!(
        keys,
        objects(dir.path()),
        "the bucket holds what the catalog names"
    );
    catalog_of(dir.path(), id, COUNT);
}

#[test]
fn puts_stay_within_the_budget_whatever_the_append_rate() {
    const PUTS_PER_SECOND: u32 = 40;
    let dir = tempfile::tempdir().unwrap();
    let config = EngineConfig {
        cores: 2,
        ..config(dir.path(), PUTS_PER_SECOND)
    };
    let (puts, appended, elapsed) = run_returning(config, dir.path(), |core, node| async move {
        let names: Vec<String> = (0..8).map(|i| format!("busy-{i}")).collect();
        for name in &names {
            create(&core, name).await;
        }
        let started = Instant::now();
        let run_for = Duration::from_secs(3);
        let writers: Vec<_> = (0..64)
            .map(|w| {
                let core = core.clone();
                let name = names[w % names.len()].clone();
                glommio::spawn_local(async move {
                    let mut done = 0u64;
                    while started.elapsed() < run_for {
                        let request = append_request(vec![record(vec![7u8; 200])], false);
                        core.append(&name, request).await.expect("append");
                        done += 1;
                    }
                    done
                })
            })
            .collect();
        let mut appended = 0;
        for writer in writers {
            appended += writer.await;
        }
        let elapsed = started.elapsed();
        let puts = sum(&node.metrics, |m| &m.uploads) + sum(&node.metrics, |m| &m.compaction_puts);
        (puts, appended, elapsed)
    });
    // One PUT per core may go at once, then one per 1/40 s, flushes and compactions alike.
    let bound = (elapsed.as_secs_f64() * f64::from(PUTS_PER_SECOND)).ceil() as u64 + 2;
    assert!(
        puts <= bound,
        "{puts} PUTs in {elapsed:?} for {appended} appends: over {PUTS_PER_SECOND}/s"
    );
    assert!(appended > puts * 4, "{appended} appends rode {puts} PUTs");
}

/// A damaged small object in the bucket is left out of every merge, counted and logged as
/// damage, and the objects beside it are still merged around it: one damaged object does not
/// keep its neighbours small. Reads answer the records before it, then `read_error`.
fn a_damaged_object_is_left_out(damage: fn(&mut Vec<u8>), read_error: &'static str) {
    const LEN: usize = 2 * 1024;
    const COUNT: u64 = 48;
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), 3_500);
    let path = dir.path().to_path_buf();
    let (merged, failures, damaged, read) =
        run_returning(config, dir.path(), move |core, node| async move {
            create(&core, "s").await;
            write_slowly(&core, "s", 0, COUNT, LEN).await;
            // One object per append, named in order: damage the middle one before the node is
            // idle enough to merge them.
            let segments: Vec<String> = objects(&path)
                .into_iter()
                .filter(|k| k.ends_with(".seg"))
                .collect();
            assert_eq!(segments.len() as u64, COUNT, "{segments:?}");
            let victim = path.join("objects").join(&segments[COUNT as usize / 2]);
            let mut bytes = std::fs::read(&victim).unwrap();
            damage(&mut bytes);
            std::fs::write(&victim, &bytes).unwrap();
            settle(&node.metrics, 2).await;
            let mut read = Vec::new();
            let mut from = 0;
            let error = loop {
                let request = common::page_request(from, 1000, 1 << 20);
                match core.read("s", &request).await {
                    Ok(batch) if batch.records.is_empty() => break None,
                    Ok(batch) => {
                        read.extend(batch.records.iter().map(|r| (r.offset, r.body.clone())));
                        from = batch.next_offset;
                    }
                    Err(error) => break Some(error.to_string()),
                }
            };
            assert!(
                error.as_deref().is_some_and(|e| e.contains(read_error)),
                "{error:?}"
            );
            (
                sum(&node.metrics, |m| &m.compacted_segments),
                sum(&node.metrics, |m| &m.compaction_failures),
                sum(&node.metrics, |m| &m.damaged_reads),
                read,
            )
        });
    assert!(failures >= 1, "the damaged object failed a compaction");
    assert!(
        damaged >= 2,
        "compaction's and the read's damage counted: {damaged}"
    );
    // Every other object was merged, on both sides of the damaged one.
    assert_eq!(
        merged,
        COUNT - 1,
        "{merged} of {} objects merged",
        COUNT - 1
    );
    assert_eq!(
        read.len() as u64,
        COUNT / 2,
        "the records before the damage"
    );
    for (offset, got) in &read {
        assert!(*got == body(*offset, LEN), "record {offset}'s bytes");
    }
}

#[test]
fn a_damaged_object_is_left_out_and_its_neighbours_are_merged_around_it() {
    // The object's last byte: its record's body, which its frame's CRC covers.
    a_damaged_object_is_left_out(|bytes| *bytes.last_mut().unwrap() ^= 0x01, "corrupt frame");
}

#[test]
fn an_object_cut_short_is_left_out_and_its_neighbours_are_merged_around_it() {
    a_damaged_object_is_left_out(|bytes| bytes.truncate(bytes.len() / 2), "past the end");
}
