//! The engine end to end on one core: many small segments sealed, uploaded to a real
//! `file://` bucket and indexed in a real SQLite catalog, then read back warm, and cold after
//! a restart (every read served from the object store).

mod common;

use std::rc::Rc;

use bytes::Bytes;
use common::{append_request, create_request, record, run, run_node, run_returning};
use pico_engine::{AppendRequest, CoreHandle, CreateRequest, EngineConfig, ReadFrom, ReadRequest};

const RECORDS: u64 = 3000;

fn config(dir: &std::path::Path) -> EngineConfig {
    config_sized(dir, 64 * 1024, 128 * 1024)
}

fn config_sized(dir: &std::path::Path, segment_size: usize, cache_bytes: usize) -> EngineConfig {
    EngineConfig {
        segment_size,
        segment_max_age_ms: 50,
        // Smaller than the data, so reads after eviction go to the bucket.
        segment_cache_bytes: cache_bytes,
        ..common::config(dir, 1)
    }
}

/// Creates an open, empty text stream.
fn create_text() -> CreateRequest {
    create_request("text/plain")
}

/// Appends `body` as one record (none: a bare close), closing the stream with `close`.
fn append(body: Option<Bytes>, close: bool) -> AppendRequest {
    append_request(body.into_iter().map(record).collect(), close)
}

fn body(i: u64) -> Bytes {
    Bytes::from(format!("record-{i:06}-{}", "x".repeat((i % 97) as usize)))
}

/// Runs `f` on the one-core engine of `config`; what `f` returned.
fn run_on_core<T, F, Fut>(dir: &std::path::Path, f: F) -> T
where
    T: Send + 'static,
    F: FnOnce(Rc<CoreHandle>) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = T>,
{
    run_returning(config(dir), dir, move |core, _| f(core))
}

/// Every record of `name` as `(offset, timestamp, body)`, in pages of 16 KiB.
async fn read_all(core: &CoreHandle, name: &str) -> Vec<(u64, i64, Bytes)> {
    let records = common::read_all(core, name, 16 * 1024).await;
    records
        .into_iter()
        .map(|r| (r.offset, r.timestamp_ms, r.body))
        .collect()
}

#[test]
fn segments_survive_sealing_eviction_and_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    let (warm_a, warm_b) = run_on_core(&path, move |core| async move {
        for name in ["/a", "/b"] {
            core.create(name, create_text()).await.unwrap();
        }
        for i in 0..RECORDS {
            let name = if i % 3 == 0 { "/b" } else { "/a" };
            core.append(name, append(Some(body(i)), false))
                .await
                .unwrap();
        }
        core.append("/b", append(None, true)).await.unwrap();
        // Let the age-based seal upload the last segment too.
        glommio::timer::sleep(std::time::Duration::from_millis(300)).await;
        (read_all(&core, "/a").await, read_all(&core, "/b").await)
    });
    assert_eq!(warm_a.len() as u64 + warm_b.len() as u64, RECORDS);
    let objects = std::fs::read_dir(common::segments_dir(&path))
        .unwrap()
        .count();
    assert!(objects > 5, "expected many sealed segments, got {objects}");
    for window in warm_a.windows(2) {
        assert_eq!(window[1].0, window[0].0 + 1, "offsets are dense");
        assert!(window[1].1 > window[0].1, "timestamps strictly increase");
    }

    let ((cold_a, cold_b), closed, ack) = run_on_core(&path, move |core| async move {
        let cold = (read_all(&core, "/a").await, read_all(&core, "/b").await);
        let info = core.head("/b").await.unwrap();
        let late = append(Some(Bytes::from_static(b"late")), false);
        let ack = core.append("/a", late).await.unwrap();
        (cold, info.closed, ack)
    });
    assert_eq!(cold_a, warm_a);
    assert_eq!(cold_b, warm_b);
    assert!(closed, "the close survives the restart");
    assert_eq!(ack.start_offset, Some(warm_a.len() as u64));
    assert!(ack.timestamp_ms.unwrap() > warm_a.last().unwrap().1);
}

/// Cold reads of multi-megabyte segments go through the block cache: chunks that straddle
/// 1 MiB blocks, sequential readahead, and a cache budget below one segment (evictions).
#[test]
fn cold_reads_by_blocks_with_readahead_and_eviction() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    fn record(i: u64) -> Bytes {
        Bytes::from(format!("{i:08}").repeat(1000 + (i % 7) as usize * 300))
    }
    const COUNT: u64 = 900;
    // Segments seal by size here, not by age: appends one at a time on a slow disk would
    // otherwise seal every 50 ms well below one block.
    let sealed_by_size = EngineConfig {
        segment_max_age_ms: 2_000,
        ..config_sized(&path, 4 * 1024 * 1024, 128 * 1024 * 1024)
    };
    run(sealed_by_size, &path, |core| async move {
        core.create("/big", create_text()).await.unwrap();
        for i in 0..COUNT {
            core.append("/big", append(Some(record(i)), false))
                .await
                .unwrap();
        }
        glommio::timer::sleep(std::time::Duration::from_millis(300)).await;
    });
    let sizes: Vec<u64> = std::fs::read_dir(common::segments_dir(&path))
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .collect();
    assert!(
        sizes.iter().any(|&s| s > 2 * 1024 * 1024),
        "multi-block segments expected: {sizes:?}"
    );
    // 1.5 MiB of cache for ~9 MiB of data: blocks are fetched, evicted and fetched again.
    let (first, second) = run_returning(
        config_sized(&path, 4 * 1024 * 1024, 1536 * 1024),
        &path,
        move |core, _| async move {
            let first = read_all(&core, "/big").await;
            let second = read_all(&core, "/big").await;
            (first, second)
        },
    );
    assert_eq!(first.len() as u64, COUNT);
    for (i, (offset, _, body)) in first.iter().enumerate() {
        assert_eq!(*offset, i as u64);
        assert_eq!(body, &record(i as u64), "record {i} differs");
    }
    assert_eq!(
        first, second,
        "a second pass over evicted blocks reads the same"
    );
}

/// Object durability seals a segment every few milliseconds, so a stream read after a restart
/// spans many small objects: the read keeps GETs in flight ahead of the chunk it decodes
/// instead of paying one round trip per segment.
#[test]
fn a_cold_read_over_many_small_segments_keeps_gets_in_flight() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    const COUNT: u64 = 240;
    fn record(i: u64) -> Bytes {
        Bytes::from(format!("{i:08}").repeat(256))
    }
    // Two 2 KiB records a segment (see below).
    let tiny_segments = config_sized(&path, 4 * 1024, 1024 * 1024);
    run(tiny_segments.clone(), &path, |core| async move {
        core.create("/small", create_text()).await.unwrap();
        for i in 0..COUNT {
            core.append("/small", append(Some(record(i)), false))
                .await
                .unwrap();
        }
    });
    let objects = std::fs::read_dir(common::segments_dir(&path))
        .unwrap()
        .count();
    // Two records a segment make 120; a segment grows into its slack while its core's next
    // WAL file is being made, so a busy machine makes fewer, and still many.
    assert!(objects >= 30, "many small segments expected: {objects}");
    let ((records, peak), _) = run_node(
        tiny_segments,
        &path,
        |store| {
            // Slow enough that GETs issued together are seen together, whatever the load.
            store
                .faults()
                .set_delay(std::time::Duration::from_millis(100));
            store.faults().take_peak_in_flight();
        },
        move |core, node| async move {
            let store = node.store;
            let mut records = Vec::new();
            let mut from = 0;
            while records.len() < COUNT as usize {
                let request = ReadRequest {
                    from: ReadFrom::Offset(from),
                    max_records: 10_000,
                    max_bytes: 1024 * 1024,
                    wait_ms: None,
                    with_content_type: false,
                    bound: None,
                };
                let batch = core.read("/small", &request).await.unwrap();
                assert!(!batch.records.is_empty(), "no progress at {from}");
                records.extend(batch.records.iter().map(|r| (r.offset, r.body.clone())));
                from = batch.next_offset;
            }
            (records, store.faults().take_peak_in_flight())
        },
    );
    for (i, (offset, body)) in records.iter().enumerate() {
        assert_eq!(*offset, i as u64);
        assert_eq!(body, &record(i as u64), "record {i} differs");
    }
    assert!(
        peak >= 4,
        "a cold read kept {peak} GET(s) in flight; one at a time pays a round trip per segment"
    );
}

/// PUTs run side by side but catalog commits go in seal order: while one segment's PUT is
/// slow, the segments sealed after it wait for it before entering the catalog. Otherwise a
/// node that dies (or is fenced) meanwhile leaves the stream with a hole in its offsets.
#[test]
fn a_slow_put_holds_back_the_catalog_commits_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    const COUNT: u64 = 24;
    fn record(i: u64) -> Bytes {
        Bytes::from(format!("{i:08}").repeat(256))
    }
    // Object durability: nothing is acknowledged before its segment is in the catalog, and
    // what is in the catalog survives losing the WAL.
    let config = EngineConfig {
        durability: pico_engine::Durability::Object,
        ..config_sized(&path, 4 * 1024, 1024 * 1024)
    };
    let bucket = path.clone();
    run_node(
        config.clone(),
        &path,
        |store| store.faults().hold_next_put(),
        move |core, node| async move {
            let store = node.store;
            core.create("/s", create_text()).await.unwrap();
            // Not awaited one by one: each waits for the held PUT.
            for i in 0..COUNT {
                let core = core.clone();
                glommio::spawn_local(async move {
                    let _ = core.append("/s", append(Some(record(i)), false)).await;
                })
                .detach();
            }
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
            // The first segment's PUT is held, and later segments are stored.
            loop {
                let stored =
                    std::fs::read_dir(common::segments_dir(&bucket)).map_or(0, |d| d.count());
                if store.faults().put_is_held() && stored >= 3 {
                    break;
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "segments were not sealed and stored ({stored} objects)"
                );
                glommio::timer::sleep(std::time::Duration::from_millis(20)).await;
            }
            // Room for their commits, if they did not wait.
            glommio::timer::sleep(std::time::Duration::from_millis(500)).await;
            // The node dies here: its tasks are dropped with the executor.
            store.faults().release_held_put();
        },
    );
    // And its WAL disk is lost.
    std::fs::remove_dir_all(path.join("wal")).unwrap();
    let records = run_returning(config, &path, move |core, _| async move {
        read_all(&core, "/s").await
    });
    for (i, (offset, _, _)) in records.iter().enumerate() {
        assert_eq!(
            *offset,
            i as u64,
            "offsets with a hole: {:?}",
            records.iter().map(|r| r.0).collect::<Vec<_>>()
        );
    }
}

/// Two retention changes of different limits made at once both take effect, in memory and
/// in the metadata log (each is applied to the policy in force, not to one read earlier).
#[test]
fn concurrent_retention_changes_of_different_limits_both_stick() {
    use pico_engine::RetentionChange;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    let head = |core: Rc<CoreHandle>| async move { core.head("/r").await.expect("head").retention };
    let in_memory = run_on_core(&path, move |core| async move {
        core.create("/r", create_text()).await.unwrap();
        let change = |change: RetentionChange| {
            let core = core.clone();
            glommio::spawn_local(
                async move { core.configure("/r", change).await.expect("configured") },
            )
        };
        let age = change(RetentionChange {
            age_ms: Some(Some(60_000)),
            ..Default::default()
        });
        let bytes = change(RetentionChange {
            bytes: Some(Some(4096)),
            ..Default::default()
        });
        age.await;
        bytes.await;
        head(core).await
    });
    let restarted = run_on_core(&path, head);
    let want = pico_engine::meta::Retention {
        age_ms: Some(60_000),
        bytes: Some(4096),
        delete_on_empty_ms: None,
    };
    assert_eq!(in_memory, want, "in memory");
    assert_eq!(restarted, want, "after a restart");
}
