//! Recovery after `kill -9`: every acknowledged record comes back with the same offset,
//! timestamp, headers and body; stream state (closed, deleted, recreated, TTL) survives;
//! new appends continue at the tail with larger timestamps. A torn WAL tail is cut off.

mod common;

use std::collections::BTreeMap;
use std::io::{Seek, SeekFrom, Write};
use std::path::PathBuf;
use std::time::Duration;

use common::{encode_binary_batch, read_all, BatchRecord, ReadRecord, Server};

/// Everything observable about the streams of a server, to compare across restarts.
struct Snapshot {
    records: BTreeMap<String, Vec<ReadRecord>>,
    heads: BTreeMap<String, Vec<(String, String)>>,
    listing: serde_json::Value,
}

fn snapshot(s: &Server, names: &[&str]) -> Snapshot {
    let mut records = BTreeMap::new();
    let mut heads = BTreeMap::new();
    for name in names {
        let head = s.head(name);
        head.expect(200);
        let kept: Vec<(String, String)> = head
            .headers
            .iter()
            .filter(|(n, _)| n.starts_with("pico-") || n == "content-type")
            .cloned()
            .collect();
        heads.insert(name.to_string(), kept);
        let (stream, next) = read_all(s, name, 0);
        assert_eq!(
            next,
            head.h_u64("pico-next-seq"),
            "{name}: read tail = HEAD"
        );
        assert_eq!(
            stream.iter().map(|r| r.seq).collect::<Vec<_>>(),
            (0..next).collect::<Vec<_>>(),
            "{name}: dense offsets"
        );
        records.insert(name.to_string(), stream);
    }
    let listing = s.get("/?prefix=/rec/");
    listing.expect(200);
    Snapshot {
        records,
        heads,
        listing: listing.json(),
    }
}

fn post_binary(s: &Server, name: &str, records: &[BatchRecord]) -> (u64, u64) {
    let r = s.request(
        "POST",
        name,
        &[("content-type", "application/vnd.picomq.batch")],
        &encode_binary_batch(records),
    );
    r.expect(200);
    (r.h_u64("pico-start-seq"), r.h_u64("pico-next-seq"))
}

const LIVE: &[&str] = &[
    "/rec/s0",
    "/rec/s1",
    "/rec/s2",
    "/rec/s3",
    "/rec/closed",
    "/rec/recreated",
    "/rec/ttl",
    "/rec/empty",
];

fn populate(s: &Server) {
    for (i, name) in LIVE[..4].iter().enumerate() {
        let content_type = if i % 2 == 0 {
            "text/plain"
        } else {
            "application/octet-stream"
        };
        s.put(name, content_type).expect(201);
        let mut expected_next = 0;
        for j in 0..15u64 {
            match j % 3 {
                0 => {
                    let r = s.post(name, format!("{name} single {j}").as_bytes());
                    r.expect(200);
                    assert_eq!(r.h_u64("pico-start-seq"), expected_next);
                    expected_next += 1;
                }
                1 => {
                    let body = format!("{name} batch {j}");
                    let (start, next) = post_binary(
                        s,
                        name,
                        &[
                            BatchRecord {
                                headers: &[("k", "v"), ("j", "x")],
                                body: body.as_bytes(),
                            },
                            BatchRecord {
                                headers: &[],
                                body: &[0xff, j as u8, 0],
                            },
                            BatchRecord {
                                headers: &[("only", "header")],
                                body: b"",
                            },
                        ],
                    );
                    assert_eq!((start, next), (expected_next, expected_next + 3));
                    expected_next = next;
                }
                _ => {
                    let json = format!(
                        r#"{{"records":[{{"headers":{{"n":{j}}},"body":"{name} json {j}"}},{{"body_b64":"AAEC"}}]}}"#
                    );
                    let r = s.request(
                        "POST",
                        name,
                        &[("content-type", "application/vnd.picomq.batch+json")],
                        json.as_bytes(),
                    );
                    r.expect(200);
                    assert_eq!(r.h_u64("pico-start-seq"), expected_next);
                    expected_next += 2;
                }
            }
        }
    }

    s.put("/rec/closed", "text/plain").expect(201);
    s.post("/rec/closed", b"c0").expect(200);
    s.post("/rec/closed", b"c1").expect(200);
    let r = s.request("POST", "/rec/closed", &[("pico-closed", "true")], b"");
    r.expect(200);

    s.put("/rec/deleted", "text/plain").expect(201);
    for i in 0..3 {
        s.post("/rec/deleted", format!("d{i}").as_bytes())
            .expect(200);
    }
    s.delete("/rec/deleted").expect(204);

    s.put("/rec/recreated", "text/plain").expect(201);
    s.post("/rec/recreated", b"old 0").expect(200);
    s.post("/rec/recreated", b"old 1").expect(200);
    s.delete("/rec/recreated").expect(204);
    s.put("/rec/recreated", "application/json").expect(201);
    let r = s.post("/rec/recreated", b"{\"new\":true}");
    assert_eq!(r.h_u64("pico-start-seq"), 0);

    let r = s.request(
        "PUT",
        "/rec/ttl",
        &[("content-type", "text/plain"), ("pico-ttl", "86400")],
        b"",
    );
    r.expect(201);
    s.post("/rec/ttl", b"t").expect(200);

    s.put("/rec/empty", "text/plain").expect(201);
}

#[track_caller]
fn assert_same(got: &Snapshot, want: &Snapshot, context: &str) {
    for (name, records) in &want.records {
        common::assert_records_eq(&format!("{name} {context}"), &got.records[name], records);
    }
    assert_eq!(got.heads, want.heads, "HEAD {context}");
    assert_eq!(got.listing, want.listing, "listing {context}");
}

/// After a restart: the same snapshot; closed, deleted and recreated streams as before;
/// appends continue at the tail with larger timestamps.
fn check_after_restart(s: &Server, before: &Snapshot) {
    let after = snapshot(s, LIVE);
    assert_same(&after, before, "after restart");

    let closed = s.head("/rec/closed");
    assert_eq!(closed.header("pico-closed"), Some("true"));
    let r = s.post("/rec/closed", b"late");
    let body = r.expect_error(409, "closed");
    assert_eq!(body["next_seq"], 2);
    assert_eq!(r.header("pico-closed"), Some("true"));
    let r = s.get("/rec/closed?seq=2");
    r.expect(200);
    assert_eq!(r.header("pico-closed"), Some("true"));

    s.head("/rec/deleted").expect(404);
    s.get("/rec/deleted").expect_error(404, "not_found");
    s.post("/rec/deleted", b"x").expect_error(404, "not_found");

    let r = s.get("/rec/recreated?format=raw");
    r.expect(200);
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert!(
        r.text().starts_with("{\"new\":true}"),
        "recreated stream shows old data: {}",
        r.text()
    );
    assert_eq!(s.head("/rec/ttl").header("pico-ttl"), Some("86400"));
}

/// Appends one record to every stream of `LIVE[..4]` and checks offset and timestamp.
fn append_after_restart(s: &Server, before: &Snapshot, tag: &str) {
    for name in &LIVE[..4] {
        let old = &before.records[*name];
        let last_timestamp = old.last().map(|r| r.timestamp).unwrap_or(0);
        let r = s.post(name, format!("{name} {tag}").as_bytes());
        r.expect(200);
        assert_eq!(
            r.h_u64("pico-start-seq"),
            old.len() as u64,
            "{name}: append after restart"
        );
        let timestamp = r.h_i64("pico-timestamp");
        assert!(
            timestamp > last_timestamp,
            "{name}: timestamp {timestamp} after restart is not above {last_timestamp}"
        );
    }
}

#[test]
fn kill_and_restart_keeps_every_acknowledged_record() {
    let mut s = Server::start(&["--cores", "2"]);
    populate(&s);
    let before = snapshot(&s, LIVE);
    assert_eq!(before.records["/rec/s0"].len(), 30);
    assert_eq!(
        before.listing["streams"].as_array().unwrap().len(),
        LIVE.len()
    );

    s.restart();
    check_after_restart(&s, &before);
    append_after_restart(&s, &before, "gen 2");
    let second = snapshot(&s, LIVE);

    // A second crash recovers the data of both generations.
    s.restart();
    check_after_restart(&s, &second);
    append_after_restart(&s, &second, "gen 3");
    let third = snapshot(&s, LIVE);
    for name in &LIVE[..4] {
        let records = &third.records[*name];
        assert_eq!(records.len(), before.records[*name].len() + 2);
        common::assert_records_eq(
            name,
            &records[..before.records[*name].len()],
            &before.records[*name],
        );
        let tail: Vec<&[u8]> = records[records.len() - 2..]
            .iter()
            .map(|r| r.body.as_slice())
            .collect();
        assert_eq!(
            tail,
            [
                format!("{name} gen 2").as_bytes(),
                format!("{name} gen 3").as_bytes()
            ]
        );
    }
}

/// WAL files per core (`<epoch>-<core>-<counter>.wal`), oldest first.
fn wal_files_per_core(dir: &std::path::Path) -> BTreeMap<String, Vec<PathBuf>> {
    let mut out: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
    for entry in std::fs::read_dir(dir).expect("WAL directory").flatten() {
        let path = entry.path();
        if path.extension().is_none_or(|e| e != "wal") {
            continue;
        }
        let stem = path.file_stem().unwrap().to_string_lossy().into_owned();
        let core = stem.split('-').nth(1).unwrap_or_default().to_string();
        out.entry(core).or_default().push(path);
    }
    for files in out.values_mut() {
        files.sort();
    }
    out
}

/// A frame as a write torn by the crash leaves it: a plausible header whose CRC does not
/// match, then part of a body.
fn torn_frame() -> Vec<u8> {
    let mut torn = Vec::new();
    torn.extend_from_slice(&200u32.to_le_bytes()); // len
    torn.extend_from_slice(&0xDEAD_BEEFu32.to_le_bytes()); // crc
    torn.push(1); // kind: record
    torn.extend_from_slice(&[0; 3]);
    torn.extend_from_slice(&0u32.to_le_bytes()); // headers_len
    torn.extend_from_slice(&1u64.to_le_bytes()); // stream id
    torn.extend_from_slice(&9999u64.to_le_bytes()); // offset
    torn.extend_from_slice(&i64::MAX.to_le_bytes()); // timestamp
    torn.extend_from_slice(b"half a body that never got its CRC right");
    torn
}

fn write_at(path: &std::path::Path, position: Option<u64>, bytes: &[u8]) {
    let mut file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    match position {
        Some(at) => file.seek(SeekFrom::Start(at)).unwrap(),
        None => file.seek(SeekFrom::End(0)).unwrap(),
    };
    file.write_all(bytes).unwrap();
    file.sync_all().unwrap();
}

#[test]
fn torn_wal_tail_is_cut_off() {
    // Segments never seal by age here, so the records are in the WAL when the server dies.
    let mut s = Server::start(&["--cores", "2", "--segment-max-age-ms", "600000"]);
    populate(&s);
    let before = snapshot(&s, LIVE);
    s.kill();

    // Per core: the newest file holding frames gets a torn frame right after its last good
    // one and garbage past its end; a newer, still empty (pre-allocated) file gets a torn
    // frame at its start.
    let per_core = wal_files_per_core(&s.wal_dir());
    assert!(
        !per_core.is_empty(),
        "no WAL files in {}",
        s.wal_dir().display()
    );
    let mut torn_after_data = 0;
    for files in per_core.values() {
        let lengths: Vec<usize> = files
            .iter()
            .map(|path| common::frames_prefix_len(&std::fs::read(path).unwrap()))
            .collect();
        if let Some(i) = lengths.iter().rposition(|&len| len > 0) {
            write_at(&files[i], Some(lengths[i] as u64), &torn_frame());
            write_at(&files[i], None, b"\x07garbage\xff\xfe after the end");
            torn_after_data += 1;
        }
        let newest = files.last().unwrap();
        if lengths.last() == Some(&0) {
            write_at(newest, Some(0), &torn_frame());
        }
    }
    assert!(
        torn_after_data > 0,
        "no WAL file holds frames: the test would not exercise a torn tail"
    );

    s.restart();
    check_after_restart(&s, &before);
    append_after_restart(&s, &before, "after torn tail");
    let after = snapshot(&s, LIVE);
    // And once more: what was recovered from the torn files stays recovered.
    s.restart();
    assert_same(&snapshot(&s, LIVE), &after, "after the second restart");
}

/// `--node-id` puts this node's segment objects under `segments/c<catalog id>/n<id>/` (nodes
/// sharing a catalog and a bucket never write the same key); sealed and recovered segments
/// both land there.
#[test]
fn node_id_names_the_segment_keys() {
    let mut s = Server::start(&["--node-id", "7", "--segment-max-age-ms", "50"]);
    s.put("/n/log", "text/plain").expect(201);
    s.post("/n/log", b"sealed").expect(200);
    let prefix = common::segments_dir(s.dir()).join("n7");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::fs::read_dir(&prefix).map_or(0, |d| d.count()) == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "no segment under {prefix:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // A record only in the WAL at kill -9 is recovered under the same prefix.
    s.post("/n/log", b"from the wal").expect(200);
    s.kill();
    let before = std::fs::read_dir(&prefix).unwrap().count();
    s.restart();
    let (records, next) = read_all(&s, "/n/log", 0);
    assert_eq!(next, 2);
    assert_eq!(records[1].body, b"from the wal");
    assert!(std::fs::read_dir(&prefix).unwrap().count() > before);
    let stray: Vec<_> = [
        s.dir().join("objects/segments"),
        common::segments_dir(s.dir()),
    ]
    .iter()
    .flat_map(|dir| std::fs::read_dir(dir).unwrap())
    .filter_map(|e| e.ok())
    .filter(|e| e.path().extension().is_some_and(|x| x == "seg"))
    .collect();
    assert!(stray.is_empty(), "no segment outside .../n7/: {stray:?}");
}

/// The segment objects in the server's `file://` bucket.
fn bucket_objects(s: &Server) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(common::segments_dir(s.dir()))
        .map(|dir| dir.map(|e| e.unwrap().path()).collect())
        .unwrap_or_default();
    found.sort();
    found
}

/// A catalog that lost its newest commits (its `-wal` file deleted after a `kill -9`) is
/// refused at start, naming what it lost, and the bucket is left as it was: served, it would
/// have brought a deleted stream back, forgotten acknowledged records and deleted their
/// segment objects as never committed. A clean stop leaves the whole catalog in `meta.db`.
#[test]
fn a_catalog_that_went_back_is_refused_and_the_bucket_is_left_alone() {
    let mut s = Server::start(&["--cores", "1", "--segment-max-age-ms", "100"]);
    for name in ["/r1", "/r2", "/r3"] {
        s.put(name, "text/plain").expect(201);
        s.post(name, b"first").expect(200);
    }
    // A clean stop checkpoints the catalog into meta.db: nothing lives only in its -wal file.
    assert!(s.terminate(Duration::from_secs(30)).success());
    assert!(
        !s.dir().join("meta.db-wal").exists(),
        "checkpointed at the stop"
    );
    s.restart();
    s.delete("/r1").expect(204);
    for i in 0..40 {
        s.post("/r3", format!("later {i}").as_bytes()).expect(200);
    }
    common::wait_for("/r3's segment upload", Duration::from_secs(30), || {
        (s.metric_sample("pico_uploads_total{core=\"0\"}")? >= 1).then_some(())
    });
    std::thread::sleep(Duration::from_millis(500));
    s.kill();
    let objects = bucket_objects(&s);
    for lost in ["meta.db-wal", "meta.db-shm"] {
        let _ = std::fs::remove_file(s.dir().join(lost));
    }

    let (status, log) = s.restart_refused(Duration::from_secs(60));
    assert!(
        !status.success(),
        "the node served a catalog that went back: {log}"
    );
    assert!(log.contains("went back"), "{log}");
    assert_eq!(bucket_objects(&s), objects, "no object deleted");
}

/// Makes the `file://` bucket refuse the segment of every WAL file there now: a non-empty
/// directory stands where its object would be renamed to, so its PUT fails while every other
/// object reads and writes as before. Returns the directories, to take away again.
fn refuse_objects_of_wal_files(s: &Server) -> Vec<PathBuf> {
    let mut blocks = Vec::new();
    for path in std::fs::read_dir(s.wal_dir()).unwrap() {
        let path = path.unwrap().path();
        if path.extension().is_some_and(|e| e == "wal") {
            let stem = path.file_stem().unwrap().to_str().unwrap();
            let block = common::segments_dir(s.dir()).join(format!("{stem}.seg"));
            std::fs::create_dir_all(&block).unwrap();
            std::fs::write(block.join("refused"), b"").unwrap();
            blocks.push(block);
        }
    }
    blocks
}

fn wal_files(s: &Server) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(s.wal_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "wal"))
        .collect();
    found.sort();
    found
}

fn bodies(s: &Server, name: &str) -> Vec<String> {
    let (records, next) = read_all(s, name, 0);
    assert_eq!(next, records.len() as u64, "{name}: dense from 0");
    records
        .into_iter()
        .map(|r| String::from_utf8(r.body).unwrap())
        .collect()
}

/// A restart while the bucket refuses writes still serves: the recovered WAL files' records
/// are read from memory, appends are acknowledged at the offsets after them, and once the
/// bucket takes writes again the recovered files are stored before anything newer. A crash
/// in between loses nothing: the WAL files stay until their segments are in the catalog.
#[test]
fn a_restart_while_the_bucket_refuses_writes_serves_and_stores_later() {
    let mut s = Server::start(&["--cores", "2"]);
    let names = ["/held/a", "/held/b", "/held/c"];
    let mut want: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for name in names {
        s.put(name, "text/plain").expect(201);
    }
    // Stored and committed by a clean stop: read back from the bucket afterwards.
    for name in names {
        s.post(name, format!("{name} stored").as_bytes())
            .expect(200);
        want.entry(name).or_default().push(format!("{name} stored"));
    }
    assert!(s.terminate(Duration::from_secs(60)).success());
    // Only in the WAL at the crash: segments are sealed by age only after ten minutes.
    s.restart_with(&["--segment-max-age-ms", "600000"]);
    for name in names {
        for i in 0..20 {
            s.post(name, format!("{name} wal {i}").as_bytes())
                .expect(200);
            want.get_mut(name).unwrap().push(format!("{name} wal {i}"));
        }
    }
    s.kill();
    let blocks = refuse_objects_of_wal_files(&s);
    assert!(!blocks.is_empty());

    // The bucket refuses them: the node serves anyway, from memory.
    s.restart();
    for name in names {
        assert_eq!(bodies(&s, name), want[name], "{name} after the restart");
    }
    let ready = s.admin_get("/ready");
    ready.expect(200);
    assert_eq!(ready.json()["degraded"], true, "{}", ready.text());
    assert!(ready.json()["recoveredUnstored"].as_u64().unwrap() >= 1);
    assert!(
        s.metric_sample("pico_recovered_wal_files_unstored")
            .unwrap()
            >= 1
    );
    // New appends are acknowledged at the offsets after the recovered ones; their own
    // segments (sealed after 2 s) wait behind the recovered files.
    for name in names {
        let r = s.post(name, format!("{name} during").as_bytes());
        r.expect(200);
        assert_eq!(r.h_u64("pico-start-seq"), want[name].len() as u64, "{name}");
        want.get_mut(name).unwrap().push(format!("{name} during"));
    }
    std::thread::sleep(Duration::from_millis(3_000));
    let log = s.log();
    assert!(log.contains("did not take its segment"), "{log}");

    // A crash while they wait loses nothing: their WAL files are still there.
    s.restart();
    for name in names {
        assert_eq!(bodies(&s, name), want[name], "{name} after a second crash");
    }

    // The bucket takes writes again: everything is stored in order, and the files go.
    for block in &blocks {
        std::fs::remove_dir_all(block).unwrap();
    }
    common::wait_for(
        "the recovered files stored",
        Duration::from_secs(60),
        || (s.metric_sample("pico_recovered_wal_files_unstored")? == 0).then_some(()),
    );
    let ready = s.admin_get("/ready");
    assert!(
        ready.json().get("recoveredUnstored").is_none(),
        "{}",
        ready.text()
    );
    // Every WAL file recovered is gone, the ones that held records stored as objects.
    for block in &blocks {
        let stem = block.file_stem().unwrap().to_str().unwrap();
        assert!(!s.wal_dir().join(format!("{stem}.wal")).exists(), "{stem}");
    }
    assert!(blocks.iter().any(|block| block.is_file()), "{blocks:?}");
    for name in names {
        let r = s.post(name, format!("{name} after").as_bytes());
        r.expect(200);
        assert_eq!(r.h_u64("pico-start-seq"), want[name].len() as u64, "{name}");
        want.get_mut(name).unwrap().push(format!("{name} after"));
    }
    // Stored and committed: a clean stop leaves nothing to recover, and it all reads back.
    assert!(s.terminate(Duration::from_secs(60)).success());
    assert!(
        wal_files(&s)
            .iter()
            .all(|p| p.metadata().unwrap().len() == 0
                || std::fs::read(p).unwrap().iter().all(|b| *b == 0)),
        "WAL files left after a clean stop: {:?}",
        wal_files(&s)
    );
    s.restart();
    for name in names {
        assert_eq!(bodies(&s, name), want[name], "{name} at the end");
    }
}

/// Starts a second `pico serve` beside `first`, on `meta_url` and `wal_dir`, and expects it to
/// refuse: its stderr.
fn second_node_refused(first: &Server, meta_url: &str, wal_dir: &std::path::Path) -> String {
    let (refused, stderr) = common::serve_refused_on(first, meta_url, wal_dir, &[]);
    assert!(refused, "a second node started beside the first: {stderr}");
    stderr
}

/// Two nodes on one SQLite catalog, each with a WAL directory of its own, would each hand out
/// a stream's next offsets to records of their own, and one node's would be lost at the next
/// start: the second is refused, as is a second node on one WAL directory, and the first
/// serves on.
#[test]
fn a_second_node_on_the_same_catalog_or_wal_directory_is_refused() {
    let s = Server::start(&["--cores", "1"]);
    s.put("/twin", "text/plain").expect(201);
    s.post("/twin", b"first").expect(200);
    let catalog = format!("sqlite:{}", s.dir().join("meta.db").display());
    let other = tempfile::tempdir().unwrap();

    let stderr = second_node_refused(&s, &catalog, &other.path().join("wal"));
    assert!(stderr.contains("in use by another process"), "{stderr}");
    let own_catalog = format!("sqlite:{}", other.path().join("meta.db").display());
    let stderr = second_node_refused(&s, &own_catalog, &s.wal_dir());
    assert!(stderr.contains("LOCK"), "{stderr}");

    let r = s.post("/twin", b"second");
    r.expect(200);
    assert_eq!(r.h_u64("pico-start-seq"), 1);
}

/// A node started on another catalog than the one it ran with (a wrong `--meta-url`, a new
/// file): with acknowledged records in its WAL it refuses, naming a WAL file and how far the
/// catalog's stream ids reach, and changes nothing (recovered into that catalog, the records
/// would have been dropped as a deleted stream's and their files removed). After a clean stop
/// (nothing in the WAL) it starts on that catalog, and deletes none of the objects its earlier
/// runs stored: they are under the first catalog's id, which the other one's start-up sweep
/// never lists. Back on its own
/// catalog, every record is served.
#[test]
fn a_start_on_another_catalog_refuses_or_deletes_nothing() {
    let mut server = common::killed_after_big_records("/c", |_| {});
    let big = common::big_record;
    let segments_dir = common::segments_dir(server.dir());
    let objects = || -> Vec<std::path::PathBuf> {
        let mut found: Vec<_> = std::fs::read_dir(&segments_dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        found.sort();
        found
    };
    let stored = objects();
    assert!(!stored.is_empty(), "sealed segments were stored");
    let other = format!("sqlite:{}", server.dir().join("other/meta.db").display());
    let wal = server.wal_dir().display().to_string();
    let bucket = format!("-2@file://{}", server.dir().join("objects").display());
    let on_other = [
        "--cores",
        "1",
        "--meta-url",
        &other,
        "--wal-dir",
        &wal,
        "--storage",
        &bucket,
    ];
    let (refused, stderr) = common::serve_refused(&on_other, Duration::from_secs(60));
    assert!(refused, "started on another catalog: {stderr}");
    assert!(
        stderr.contains("never handed out a stream id above 0") && stderr.contains("--meta-url"),
        "{stderr}"
    );
    assert_eq!(objects(), stored, "nothing was changed");

    // On its own catalog this run stores segments of its own, and a clean stop stores the
    // rest: the WAL files it leaves hold no record.
    server.restart();
    let mut conn = server.connect();
    for i in 100..200 {
        conn.request("POST", "/c", &[], &big(i))
            .unwrap()
            .expect(200);
    }
    let (records, next) = read_all(&server, "/c", 0);
    assert_eq!((records.len(), next), (200, 200));
    assert!(server.terminate(Duration::from_secs(60)).success());
    let stored = objects();

    let mut elsewhere = common::Server::start(&on_other);
    elsewhere.head("/c").expect(404);
    elsewhere.kill();
    for object in &stored {
        assert!(
            object.exists(),
            "{object:?} was deleted by a start on another catalog"
        );
    }

    server.restart();
    let (records, next) = read_all(&server, "/c", 0);
    assert_eq!((records.len(), next), (200, 200));
    for (i, record) in records.iter().enumerate() {
        assert_eq!(record.body, big(i as u64), "record {i}");
    }
}

/// A start on another bucket than the one the catalog's segments are in (a typo in
/// `--storage`, another endpoint, a volume not mounted) is refused before recovery stores
/// anything there; on its own bucket every record reads back. `--wal-salvage` starts on the
/// other one, says what it lacks on `/ready`, fails reads of the missing objects rather than
/// serving them as empty, and hands out no offset again.
#[test]
fn a_start_on_another_bucket_is_refused_and_a_salvage_reports_it() {
    let mut server = common::killed_after_big_records("/b", |_| {});
    let big = common::big_record;
    let other = server.dir().join("other-objects");
    let other_bucket = format!("-2@file://{}", other.display());
    let meta = format!("sqlite:{}", server.dir().join("meta.db").display());
    let wal = server.wal_dir().display().to_string();
    let wal_before: Vec<(PathBuf, Vec<u8>)> = wal_files(&server)
        .into_iter()
        .map(|p| {
            let data = std::fs::read(&p).unwrap();
            (p, data)
        })
        .collect();
    assert!(!wal_before.is_empty(), "records wait in the WAL");
    let on_other = [
        "--cores",
        "1",
        "--meta-url",
        &meta,
        "--wal-dir",
        &wal,
        "--storage",
        &other_bucket,
    ];
    let (refused, stderr) = common::serve_refused(&on_other, Duration::from_secs(60));
    assert!(refused, "started on another bucket: {stderr}");
    assert!(
        stderr.contains("holds none of the catalog's newest segment objects")
            && stderr.contains("--storage")
            && stderr.contains("--wal-salvage"),
        "{stderr}"
    );
    for (path, data) in &wal_before {
        assert_eq!(&std::fs::read(path).unwrap(), data, "{path:?} was changed");
    }
    let stored_there = std::fs::read_dir(other.join("segments")).map_or(0, |d| d.count());
    assert_eq!(stored_there, 0, "recovery stored into the other bucket");

    server.restart();
    let (records, next) = read_all(&server, "/b", 0);
    assert_eq!((records.len(), next), (100, 100));
    for (i, record) in records.iter().enumerate() {
        assert_eq!(record.body, big(i as u64), "record {i}");
    }

    server.restart_with(&["--storage", &other_bucket, "--wal-salvage"]);
    let ready = server.admin_get("/ready");
    assert!(
        ready.json()["walSalvaged"]
            .as_array()
            .is_some_and(|lines| lines.iter().any(|l| l
                .as_str()
                .is_some_and(|l| l.contains("lacks the catalog's segments")))),
        "{}",
        ready.text()
    );
    let read = server.get("/b");
    assert!(
        read.status >= 500,
        "a read of missing objects: {}",
        read.status
    );
    assert!(read.text().contains("missing"), "{}", read.text());
    let appended = server.post("/b", b"after");
    appended.expect(200);
    assert_eq!(
        appended.h_u64("pico-start-seq"),
        100,
        "no offset is handed out again"
    );
}
