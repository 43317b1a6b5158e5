//! Recovery in process, on a real SQLite catalog and a `file://` bucket: an engine is stopped
//! with its data in WAL files, the files are damaged the way a crash leaves them (a torn or
//! garbled tail), or the next run has another core count, and the next boot must serve every
//! acknowledged record and nothing of the torn part. The process-level versions (a killed
//! `pico serve`) are in `cli/tests/`.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use common::{append_request, create_request, record, run, run_node, run_returning};
use pico_engine::frame::{self, FrameMeta, FRAME_KIND_RECORD};
use pico_engine::wal_file::{self, WalEnd};
use pico_engine::{CoreHandle, EngineConfig};

/// Segments seal by size only: what is not sealed stays in the WAL at the stop.
fn config(dir: &Path, cores: usize) -> EngineConfig {
    EngineConfig {
        segment_max_age_ms: 600_000,
        ..common::config(dir, cores)
    }
}

fn create() -> pico_engine::CreateRequest {
    create_request("application/octet-stream")
}

fn append(body: Bytes) -> pico_engine::AppendRequest {
    append_request(vec![record(body)], false)
}

/// One core, segments of 64 KiB: some are sealed, stored and committed, the rest stay in the
/// WAL.
fn small_segments(dir: &Path) -> EngineConfig {
    EngineConfig {
        segment_size: 64 * 1024,
        ..config(dir, 1)
    }
}

/// Every record of `name`, as `(offset, body)`.
async fn read_all(core: &CoreHandle, name: &str) -> Vec<(u64, Bytes)> {
    common::read_bodies(core, name, 256 * 1024).await
}

fn body(stream: usize, i: u64) -> Bytes {
    Bytes::from(format!(
        "{stream}:{i:05}:{}",
        "x".repeat(1000 + (i % 13) as usize)
    ))
}

/// The WAL files in `dir`, each with where its last whole round ends and the bytes of the
/// segment its rounds hold, fullest first.
fn wal_files(dir: &Path) -> Vec<(PathBuf, usize, usize)> {
    let mut files: Vec<_> = common::wal_files(dir)
        .into_iter()
        .map(|p| {
            let data = std::fs::read(&p).unwrap();
            let scanned = wal_file::scan(&data).unwrap();
            assert_eq!(scanned.end, WalEnd::Clean, "{}", p.display());
            let segment_len = scanned.segment_bytes(&data).len();
            (p, scanned.committed_end, segment_len)
        })
        .collect();
    files.sort_by_key(|(_, _, segment_len)| std::cmp::Reverse(*segment_len));
    files
}

/// How a crash may leave the end of a WAL file after the last acknowledged round.
#[derive(Clone, Copy, Debug)]
enum Tail {
    /// Half of the next round's frame reached the disk.
    Torn,
    /// The next round's frame is whole but its bytes are damaged (its CRC fails), and its
    /// commit record did not reach the disk.
    Garbled,
    /// The next round's frames are whole (the first of a two-frame request, even) but its
    /// commit record did not reach the disk.
    Unended,
}

/// Writes the next record of stream `id` (at `offset`) after the last whole round of the WAL
/// file, as `tail` says.
fn damage(path: &Path, end: usize, id: u64, offset: u64, tail: Tail) {
    let mut frame_bytes = Vec::new();
    let meta = FrameMeta {
        kind: FRAME_KIND_RECORD,
        stream_id: id,
        offset,
        timestamp_ms: pico_engine::now_ms(),
        request_end: !matches!(tail, Tail::Unended),
        producer: None,
        writer_seq: None,
    };
    frame::encode_frame(&mut frame_bytes, meta, &[], b"never acknowledged");
    match tail {
        Tail::Torn => frame_bytes.truncate(frame_bytes.len() / 2),
        Tail::Garbled => {
            let last = frame_bytes.len() - 1;
            frame_bytes[last] ^= 0xff;
        }
        Tail::Unended => {}
    }
    let mut data = std::fs::read(path).unwrap();
    data[end..end + frame_bytes.len()].copy_from_slice(&frame_bytes);
    std::fs::write(path, data).unwrap();
}

fn a_damaged_wal_tail_loses_only_what_was_never_acknowledged(tail: Tail) {
    const RECORDS: u64 = 20;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    let id = run_returning(config(&path, 1), &path, move |core, _| async move {
        core.create("/s", create()).await.unwrap();
        for i in 0..RECORDS {
            let ack = core.append("/s", append(body(0, i))).await.unwrap();
            assert_eq!(ack.start_offset, Some(i));
        }
        core.head("/s").await.unwrap().id
    });
    // Twenty 1 KiB records fit one segment: they are all in the active WAL file.
    let files = wal_files(&path);
    let (wal, end, segment_len) = files.first().cloned().expect("a WAL file");
    assert!(
        segment_len > 20 * 1000,
        "the records are in {}",
        wal.display()
    );
    damage(&wal, end, id, RECORDS, tail);
    let scanned = wal_file::scan(&std::fs::read(&wal).unwrap()).unwrap();
    assert!(
        matches!(scanned.end, WalEnd::Torn { .. }),
        "{tail:?}: a torn end, not damage: {:?}",
        scanned.end
    );

    let restarted = run_node(
        config(&path, 1),
        &path,
        |_| {},
        move |core, _| async move {
            let records = read_all(&core, "/s").await;
            let next = core.head("/s").await.unwrap().next_offset;
            // The torn record's offset is free again: the next append takes it.
            let ack = core.append("/s", append(body(0, 99))).await.unwrap();
            (records, next, ack.start_offset)
        },
    );
    let ((records, next, appended_at), report) = restarted;
    let want: Vec<_> = (0..RECORDS).map(|i| (i, body(0, i))).collect();
    assert_eq!(
        records, want,
        "{tail:?}: every acknowledged record, nothing else"
    );
    assert_eq!(next, RECORDS, "{tail:?}");
    assert_eq!(appended_at, Some(RECORDS), "{tail:?}");
    assert!(
        report
            .iter()
            .any(|line| line.contains(&format!("({segment_len} bytes, format 2)"))),
        "{tail:?}: the WAL file's whole rounds were recovered: {report:?}"
    );
    assert!(!wal.exists(), "a recovered WAL file is removed");
}

#[test]
fn a_torn_wal_tail_loses_only_what_was_never_acknowledged() {
    a_damaged_wal_tail_loses_only_what_was_never_acknowledged(Tail::Torn);
}

#[test]
fn a_garbled_wal_tail_loses_only_what_was_never_acknowledged() {
    a_damaged_wal_tail_loses_only_what_was_never_acknowledged(Tail::Garbled);
}

#[test]
fn a_request_cut_before_its_end_frame_is_dropped_whole() {
    a_damaged_wal_tail_loses_only_what_was_never_acknowledged(Tail::Unended);
}

/// Data written by three cores (some in sealed segments, the rest in each core's WAL) is all
/// served by two cores after a restart, then by one; appends after each recount continue the
/// offsets.
#[test]
fn streams_and_records_survive_a_change_of_core_count() {
    const STREAMS: usize = 12;
    const RECORDS: u64 = 40;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    let names: Vec<String> = (0..STREAMS).map(|s| format!("/cores/{s}")).collect();
    let written = names.clone();
    run(config(&path, 3), &path, move |core| async move {
        for name in &written {
            core.create(name, create()).await.unwrap();
        }
        for i in 0..RECORDS {
            for (s, name) in written.iter().enumerate() {
                core.append(name, append(body(s, i))).await.unwrap();
            }
        }
        // Give the sealed segments' uploads a moment; whatever is left is in the WAL.
        glommio::timer::sleep(Duration::from_millis(200)).await;
    });
    assert!(
        wal_files(&path)
            .iter()
            .filter(|(_, _, segment_len)| *segment_len > 0)
            .count()
            >= 3,
        "every core left data in its WAL"
    );
    let expected = |extra: u64| -> Vec<Vec<(u64, Bytes)>> {
        (0..STREAMS)
            .map(|s| {
                let mut records: Vec<_> = (0..RECORDS).map(|i| (i, body(s, i))).collect();
                records.extend((0..extra).map(|e| (RECORDS + e, body(s, 1000 + e))));
                records
            })
            .collect()
    };
    for (cores, extra) in [(2, 0), (1, 1)] {
        let read = names.clone();
        let config = config(&path, cores);
        let found = run_returning(config, &path, move |core, _| async move {
            let (listed, more) = core.list("/cores/", "", 100).await.unwrap();
            let mut found = Vec::new();
            for name in &read {
                found.push(read_all(&core, name).await);
            }
            // One more record per stream, at the offset after the recovered tail.
            let mut offsets = Vec::new();
            for (s, name) in read.iter().enumerate() {
                let ack = core
                    .append(name, append(body(s, 1000 + extra)))
                    .await
                    .unwrap();
                offsets.push(ack.start_offset);
            }
            (listed.len(), more, found, offsets)
        });
        let (listed, more, found, offsets) = found;
        assert_eq!(
            (listed, more),
            (STREAMS, false),
            "{cores} cores list every stream"
        );
        assert_eq!(found, expected(extra), "{cores} cores read every record");
        assert!(
            offsets.iter().all(|&o| o == Some(RECORDS + extra)),
            "{cores} cores append after the tail: {offsets:?}"
        );
    }
}

/// Two streams' records interleaved, one round each (every append waits for its ack), left
/// in the WAL; returns the streams' ids.
fn interleaved_in_the_wal(path: &Path, records: u64) -> (u64, u64) {
    run_returning(config(path, 1), path, move |core, _| async move {
        for name in ["/s", "/t"] {
            core.create(name, create()).await.unwrap();
        }
        for i in 0..records {
            for (s, name) in ["/s", "/t"].iter().enumerate() {
                let ack = core.append(name, append(body(s, i))).await.unwrap();
                assert_eq!(ack.start_offset, Some(i));
            }
        }
        (
            core.head("/s").await.unwrap().id,
            core.head("/t").await.unwrap().id,
        )
    })
}

/// [`interleaved_in_the_wal`], then a start that stores the WAL file's segment and removes
/// the file: the file's path and the bytes it had, to put back as a crash would have left it.
fn stored_with_a_copy_of_its_wal_file(path: &Path, records: u64) -> (PathBuf, Vec<u8>) {
    interleaved_in_the_wal(path, records);
    let (wal, _, _) = wal_files(path).first().cloned().expect("a WAL file");
    let data = std::fs::read(&wal).unwrap();
    run(config(path, 1), path, |_| async {});
    assert!(!wal.exists(), "recovered and removed");
    (wal, data)
}

/// A stream's records as `(offset, body)`.
type Records = Vec<(u64, Bytes)>;

/// Every record of `/s` and `/t` after a start, and the start's report.
fn both_streams(path: &Path) -> ((Records, Records), Vec<String>) {
    run_node(
        config(path, 1),
        path,
        |_| {},
        |core, _| async move { (read_all(&core, "/s").await, read_all(&core, "/t").await) },
    )
}

fn boot_error(path: &Path, config: EngineConfig) -> pico_engine::BootError {
    let meta = format!("sqlite:{}", path.join("meta.db").display());
    let storage = format!("-2@file://{}", path.join("objects").display());
    match pico_engine::boot(config, &meta, &storage, None) {
        Ok(_) => panic!("the boot went ahead"),
        Err(e) => e,
    }
}

/// A flipped byte in an acknowledged record, with acknowledged records after it: the node
/// does not start (nothing is dropped, no offset handed out again, the file untouched); with
/// `wal_salvage` it keeps what reads in order, closes the stream that lost records at its
/// first lost offset, keeps the file and a report of the loss, and starts again without the
/// flag afterwards.
#[test]
fn damage_before_acknowledged_records_stops_the_boot_and_a_salvage_closes_the_stream_at_the_loss() {
    const RECORDS: u64 = 10;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    let (s, t) = interleaved_in_the_wal(&path, RECORDS);
    let (wal, _, _) = wal_files(&path).first().cloned().expect("a WAL file");
    let mut data = std::fs::read(&wal).unwrap();
    let scanned = wal_file::scan(&data).unwrap();
    let hit = scanned
        .committed
        .iter()
        .find(|f| f.stream_id == s && f.offset == 4)
        .copied()
        .expect("record 4 of /s");
    data[hit.pos + hit.len - 10] ^= 0x20;
    std::fs::write(&wal, &data).unwrap();

    let error = boot_error(&path, config(&path, 1));
    assert!(
        matches!(
            error,
            pico_engine::BootError::Recovery(pico_engine::RecoveryError::Damaged { .. })
        ),
        "{error:?}"
    );
    let error = error.to_string();
    for needed in [
        &wal.display().to_string(),
        "damaged",
        "/s",
        "offset 4",
        "--wal-salvage",
    ] {
        assert!(error.contains(needed), "{needed:?} in: {error}");
    }
    assert_eq!(std::fs::read(&wal).unwrap(), data, "the file is untouched");

    let salvage = EngineConfig {
        wal_salvage: true,
        ..config(&path, 1)
    };
    let ((s_records, s_info, refused, t_records, t_ack), report) = run_node(
        salvage,
        &path,
        |_| {},
        move |core, _| async move {
            let refused = core.append("/s", append(body(0, 99))).await.is_err();
            let t_ack = core.append("/t", append(body(1, 99))).await.unwrap();
            (
                read_all(&core, "/s").await,
                core.head("/s").await.unwrap(),
                refused,
                read_all(&core, "/t").await,
                t_ack.start_offset,
            )
        },
    );
    let want_s: Vec<_> = (0..4).map(|i| (i, body(0, i))).collect();
    assert_eq!(s_records, want_s, "/s keeps what precedes the damage");
    assert!(s_info.closed, "/s is closed at its first lost offset");
    assert_eq!(s_info.next_offset, 4);
    assert!(refused, "no append takes a lost offset");
    let mut want_t: Vec<_> = (0..RECORDS).map(|i| (i, body(1, i))).collect();
    want_t.push((RECORDS, body(1, 99)));
    assert_eq!(t_records, want_t, "/t lost nothing and goes on");
    assert_eq!(t_ack, Some(RECORDS));
    let line = report
        .iter()
        .find(|l| l.contains("salvaged damaged WAL file"))
        .unwrap_or_else(|| panic!("a salvage line in {report:?}"));
    assert!(
        line.contains("/s") && line.contains("lost offsets 4..=9"),
        "{line}"
    );
    assert!(!wal.exists(), "the damaged file left the WAL directory");
    let kept = path.join("wal/damaged").join(wal.file_name().unwrap());
    assert_eq!(std::fs::read(&kept).unwrap(), data, "kept as it was found");
    let mut report_path = kept.into_os_string();
    report_path.push(".txt");
    let written = std::fs::read_to_string(report_path).unwrap();
    assert!(written.contains("lost offsets 4..=9"), "{written}");
    let _ = t;

    // Started again without the flag: the salvage is done and the stream stays closed.
    let (again, _) = run_node(
        config(&path, 1),
        &path,
        |_| {},
        |core, _| async move { core.head("/s").await.unwrap() },
    );
    assert!(again.closed);
    assert_eq!(again.next_offset, 4);
}

/// A crash after a segment was stored and committed but before its WAL file was removed,
/// with the leftover file damaged: the stored object is what counts; the file does not
/// replace it with fewer records, and is kept aside.
#[test]
fn a_damaged_leftover_of_a_stored_segment_never_replaces_it() {
    const RECORDS: u64 = 6;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    // Recovery stores the WAL's rounds; the file is copied first, to put it back afterwards.
    let (wal, mut data) = stored_with_a_copy_of_its_wal_file(&path, RECORDS);
    let scanned = wal_file::scan(&data).unwrap();
    // A record in the middle: what follows it would be lost if the file were recovered.
    let hit = scanned.committed[scanned.committed.len() / 2];
    data[hit.pos + hit.len - 3] ^= 0x01;
    std::fs::write(&wal, &data).unwrap();

    let (records, report) = both_streams(&path);
    let want = |s: usize| (0..RECORDS).map(|i| (i, body(s, i))).collect::<Vec<_>>();
    assert_eq!(records, (want(0), want(1)), "every record, from the object");
    assert!(
        report.iter().any(|l| l.contains("was already stored")),
        "{report:?}"
    );
    assert!(path
        .join("wal/damaged")
        .join(wal.file_name().unwrap())
        .exists());
}

/// A segment object stored by an earlier run that crashed before its catalog commit (an
/// orphan: no catalog entry names it, so garbage collection never would) is deleted at the
/// next start; committed objects stay, and so does an object of an epoch this node never used
/// (another writer's, on a shared prefix).
#[test]
fn objects_an_earlier_run_stored_but_never_committed_are_deleted_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    let small = || small_segments(&path);
    run(small(), &path, |core| async move {
        core.create("/o", create()).await.unwrap();
        for i in 0..100 {
            core.append("/o", append(body(0, i))).await.unwrap();
        }
        glommio::timer::sleep(Duration::from_millis(300)).await;
    });
    let segments = common::segments_dir(&path);
    let stored: Vec<String> = std::fs::read_dir(&segments)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    let epoch = stored.first().expect("a stored segment")[..16].to_string();
    let orphan = segments.join(format!("{epoch}-000-0000009999.seg"));
    let foreign = segments.join("0000000000001234-000-0000000001.seg");
    std::fs::write(&orphan, b"stored, never committed").unwrap();
    std::fs::write(&foreign, b"someone else's").unwrap();

    let (records, report) = run_node(
        small(),
        &path,
        |_| {},
        |core, _| async move { read_all(&core, "/o").await },
    );
    assert_eq!(records.len(), 100, "every record is still served");
    assert!(!orphan.exists(), "the orphan was deleted");
    assert!(
        foreign.exists(),
        "an object of an epoch this node never used stays"
    );
    for name in &stored {
        assert!(
            segments.join(name).exists(),
            "{name} is committed and stays"
        );
    }
    assert!(
        report
            .iter()
            .any(|l| l.contains("deleted 1 segment objects")),
        "{report:?}"
    );
}

/// The names of the segment objects in the bucket at `path`, sorted.
fn stored_segments(path: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(common::segments_dir(path))
        .map(|dir| {
            dir.map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// Every WAL file in `dir` with its bytes.
fn wal_contents(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    common::wal_files(dir)
        .into_iter()
        .map(|p| {
            let data = std::fs::read(&p).unwrap();
            (p, data)
        })
        .collect()
}

/// A bucket holding none of the catalog's newest segments (another `--storage`, a volume not
/// mounted) is refused before recovery stores anything there; a bucket whose newest objects
/// only the collector's crash window removed (rows of a deleted stream left behind) is not,
/// nor the catalog's own bucket that lost every segment (its marker tells it apart);
/// `wal_salvage` starts on an empty bucket and reports it.
#[test]
fn a_bucket_without_the_catalogs_segments_is_refused_unless_only_garbage_is_gone() {
    const RECORDS: u64 = 400;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    let small = || small_segments(&path);
    run(small(), &path, |core| async move {
        core.create("/live", create()).await.unwrap();
        for i in 0..RECORDS {
            core.append("/live", append(body(0, i))).await.unwrap();
        }
        glommio::timer::sleep(Duration::from_millis(300)).await;
    });
    let live_segments = stored_segments(&path);
    assert!(live_segments.len() >= 4, "{live_segments:?}");
    run(small(), &path, |core| async move {
        core.create("/gone", create()).await.unwrap();
        for i in 0..RECORDS {
            core.append("/gone", append(body(1, i))).await.unwrap();
        }
        glommio::timer::sleep(Duration::from_millis(300)).await;
        core.delete("/gone").await.unwrap();
    });
    // The collector deletes a garbage segment's object before its row: a crash in between
    // leaves the newest rows without objects. The first run's (epoch's) segments hold
    // `/live`, its WAL tail stored by the second run's recovery included.
    let first_epoch = &live_segments[0][..16];
    let gone_segments: Vec<String> = stored_segments(&path)
        .into_iter()
        .filter(|name| !name.starts_with(first_epoch))
        .collect();
    assert!(gone_segments.len() >= 4, "{gone_segments:?}");
    for name in &gone_segments {
        std::fs::remove_file(common::segments_dir(&path).join(name)).unwrap();
    }
    let records = run_returning(small(), &path, |core, _| async move {
        read_all(&core, "/live").await
    });
    assert_eq!(
        records.len() as u64,
        RECORDS,
        "the right bucket, short of garbage only"
    );

    // Another bucket: refused, naming the newest segments it lacks, and nothing changes.
    let objects = path.join("objects");
    let moved = path.join("objects.moved");
    std::fs::rename(&objects, &moved).unwrap();
    let wal_before = wal_contents(&path);
    assert!(!wal_before.is_empty());
    let error = boot_error(&path, small());
    assert!(
        matches!(error, pico_engine::BootError::ForeignBucket(_)),
        "{error:?}"
    );
    let error = error.to_string();
    let newest = live_segments.last().unwrap();
    for needed in [newest.as_str(), "holds none", "--storage", "--wal-salvage"] {
        assert!(error.contains(needed), "{needed:?} in: {error}");
    }
    assert_eq!(wal_contents(&path), wal_before, "the WAL is untouched");
    assert!(
        stored_segments(&path).is_empty(),
        "nothing was stored there"
    );

    // Back on its bucket every record reads.
    std::fs::remove_dir_all(&objects).unwrap();
    std::fs::rename(&moved, &objects).unwrap();
    let records = run_returning(small(), &path, |core, _| async move {
        read_all(&core, "/live").await
    });
    assert_eq!(records.len() as u64, RECORDS);
    for (i, (offset, record)) in records.iter().enumerate() {
        assert_eq!((*offset, record), (i as u64, &body(0, i as u64)));
    }

    // The same bucket with every segment object lost (its marker left): damaged, not another
    // bucket. The node starts and says what it lost; reads fail rather than come back empty.
    for name in stored_segments(&path) {
        std::fs::remove_file(common::segments_dir(&path).join(name)).unwrap();
    }
    let (read, report) = common::run_node(
        small(),
        &path,
        |_| {},
        |core, _| async move {
            core.read("/live", &common::page_request(0, 1000, 1 << 20))
                .await
                .is_err()
        },
    );
    assert!(read, "a read of a lost object fails");
    assert!(
        report.iter().any(|l| l.contains("lost from it")),
        "{report:?}"
    );

    // Salvaged: the node starts on an empty bucket and says what it lacks.
    std::fs::rename(&objects, &moved).unwrap();
    let report = run(
        EngineConfig {
            wal_salvage: true,
            ..small()
        },
        &path,
        |_| async {},
    );
    assert!(
        report
            .iter()
            .any(|l| l.contains("lacks the catalog's segments") && l.contains(newest.as_str())),
        "{report:?}"
    );
}

/// Two single nodes, each with a catalog of its own, share one bucket and start in the same
/// millisecond, so their runs have one node epoch and their WAL files the same names: each
/// stores its segments under its catalog's id, and neither overwrites nor sweeps the other's
/// objects. Before, both wrote `segments/<epoch>-000-<n>.seg`, each over the other's.
#[test]
fn catalogs_sharing_a_bucket_keep_their_segments_apart_in_one_epoch() {
    const RECORDS: u64 = 300;
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (a, b) = (a.path().to_path_buf(), b.path().to_path_buf());
    std::fs::create_dir_all(a.join("objects")).unwrap();
    std::os::unix::fs::symlink(a.join("objects"), b.join("objects")).unwrap();
    let epoch = pico_engine::now_ms() as u64;
    let in_epoch = |path: &Path| EngineConfig {
        node_epoch_ms: epoch,
        ..small_segments(path)
    };
    for (node, path) in [(0, &a), (1, &b)] {
        run(in_epoch(path), path, move |core| async move {
            core.create("/s", create()).await.unwrap();
            for i in 0..RECORDS {
                core.append("/s", append(body(node, i))).await.unwrap();
            }
        });
    }
    // Each restart recovers its WAL files into the bucket and sweeps it; then each reads its own.
    for (node, path) in [(0, &a), (1, &b)] {
        let records = run_returning(small_segments(path), path, |core, _| async move {
            read_all(&core, "/s").await
        });
        let want: Vec<_> = (0..RECORDS).map(|i| (i, body(node, i))).collect();
        let not_its_own = records
            .iter()
            .zip(&want)
            .position(|(got, want)| got != want);
        assert!(
            records.len() == want.len() && not_its_own.is_none(),
            "node {node} reads {} records; the first that is not its own: {not_its_own:?}",
            records.len()
        );
    }
    let directories: Vec<_> = std::fs::read_dir(a.join("objects/segments"))
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(directories.len(), 2, "one per catalog: {directories:?}");
    for node in [&a, &b] {
        let records = run_returning(small_segments(node), node, |core, _| async move {
            read_all(&core, "/s").await.len() as u64
        });
        assert_eq!(
            records, RECORDS,
            "the other node's restart swept nothing of this one's"
        );
    }
}

/// An earlier build stored segments under `segments/<stem>.seg`, without the catalog's id. A
/// WAL file it committed but had not yet removed at a crash is found stored under that key, not
/// stored and committed a second time; an object it stored under that key without committing
/// it is swept; its committed objects stay and are read.
#[test]
fn segments_stored_under_the_earlier_key_are_recognised_and_swept() {
    const RECORDS: u64 = 6;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    let (wal, data) = stored_with_a_copy_of_its_wal_file(&path, RECORDS);
    let stem = wal.file_stem().unwrap().to_str().unwrap().to_string();
    // Made what the earlier build left: the object and its row under the key without the
    // catalog's id, the WAL file back (a crash between the commit and the removal), and an
    // object of the same run stored but never committed.
    let objects = path.join("objects");
    let new_key = format!(
        "segments/{}/{stem}.seg",
        common::segments_dir(&path)
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
    );
    let old_key = format!("segments/{stem}.seg");
    std::fs::rename(objects.join(&new_key), objects.join(&old_key)).unwrap();
    pico_meta::use_page_checksums().expect("the checksummed SQLite VFS");
    let db = rusqlite::Connection::open(path.join("meta.db")).unwrap();
    let renamed = db
        .execute(
            "UPDATE segments SET key = ?1 WHERE key = ?2",
            [&old_key, &new_key],
        )
        .unwrap();
    assert_eq!(renamed, 1);
    drop(db);
    std::fs::write(&wal, &data).unwrap();
    let epoch = &stem[..16];
    let orphan = objects.join(format!("segments/{epoch}-000-0000009999.seg"));
    std::fs::write(&orphan, b"stored, never committed").unwrap();

    let (records, report) = both_streams(&path);
    let want = |s: usize| (0..RECORDS).map(|i| (i, body(s, i))).collect::<Vec<_>>();
    assert_eq!(
        records,
        (want(0), want(1)),
        "every record once, from the object"
    );
    assert!(
        report
            .iter()
            .any(|l| l.contains(&format!("was already stored as {old_key}"))),
        "{report:?}"
    );
    assert!(!wal.exists(), "the leftover WAL file was removed");
    assert!(!objects.join(&new_key).exists(), "not stored a second time");
    assert!(
        !orphan.exists(),
        "the earlier build's uncommitted object was swept"
    );
    assert!(
        objects.join(&old_key).exists(),
        "its committed object stays"
    );
}
