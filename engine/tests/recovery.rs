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

/// The WAL files in `dir`, with the length of each one's valid prefix, largest first.
fn wal_files(dir: &Path) -> Vec<(PathBuf, usize)> {
    let mut files: Vec<_> = common::wal_files(dir)
        .into_iter()
        .map(|p| {
            let valid = frame::valid_prefix_len(&std::fs::read(&p).unwrap());
            (p, valid)
        })
        .collect();
    files.sort_by_key(|(_, valid)| std::cmp::Reverse(*valid));
    files
}

/// How a crash may leave the end of a WAL file after the last acknowledged request.
#[derive(Clone, Copy, Debug)]
enum Tail {
    /// Half of the next request's frame reached the disk.
    Torn,
    /// The next request's frame is whole but its bytes are damaged (its CRC fails).
    Garbled,
    /// The first frame of a two-frame request, without the frame that ends the request.
    Unended,
}

/// Writes the next record of stream `id` (at `offset`) after the valid prefix of the WAL file,
/// damaged as `tail` says.
fn damage(path: &Path, valid: usize, id: u64, offset: u64, tail: Tail) {
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
    data.truncate(valid);
    data.extend_from_slice(&frame_bytes);
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
    let (wal, valid) = files.first().cloned().expect("a WAL file");
    assert!(valid > 20 * 1000, "the records are in {}", wal.display());
    damage(&wal, valid, id, RECORDS, tail);
    assert_eq!(
        frame::valid_prefix_len(&std::fs::read(&wal).unwrap()),
        valid,
        "the damaged tail is not valid"
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
            .any(|line| line.contains(&format!("({valid} bytes)"))),
        "{tail:?}: the WAL file's valid prefix was recovered: {report:?}"
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
            .filter(|(_, valid)| *valid > 0)
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
