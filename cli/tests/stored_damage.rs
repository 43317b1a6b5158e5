//! Damaged bytes in a stored segment object (a `file://` bucket on the node's own disk), or an
//! object gone from it, on a real node over real sockets (docs/durability.md, "Every fault
//! class"): a read answers every record before the damage, then a `500` naming it in both
//! protocols, never a clean end and never the damaged bytes; the node logs it, counts it in
//! `pico_damaged_reads_total`, and drops the damaged blocks from its read cache (at most once
//! per 5 s per object), so a restored object reads again without a restart.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::{
    decode_binary_read, ds_read, encode_binary_batch, read_all, wait_for, BatchRecord, Resp, Server,
};

const RECORDS: u64 = 300;

fn body(i: u64) -> Vec<u8> {
    format!("record {i:04} {}", "z".repeat(40)).into_bytes()
}

/// The value of counter `name` for core 0 in `/metrics`.
fn core_0_counter(server: &Server, name: &str) -> u64 {
    let series = format!("{name}{{core=\"0\"}}");
    server
        .metric_sample(&series)
        .unwrap_or_else(|| panic!("{series} in /metrics"))
}

fn damaged_reads(server: &Server) -> u64 {
    core_0_counter(server, "pico_damaged_reads_total")
}

/// The block fetches core 0's reads started.
fn cache_misses(server: &Server) -> u64 {
    core_0_counter(server, "pico_cache_misses_total")
}

/// A node on one core whose stream `/d` holds `RECORDS` records in one uploaded segment
/// object, restarted so that its reads fetch that object from the bucket (nothing of it left
/// in memory); returns the node (stopped) and the object's path.
fn a_stopped_node_with_one_stored_segment() -> (Server, PathBuf) {
    let mut server = Server::start(&["--cores", "1", "--segment-max-age-ms", "200"]);
    server.put("/d", "text/plain").expect(201);
    // One batch: one commit round, so one segment whatever the machine's pace.
    post_batch(&server, "/d", RECORDS);
    let segments = common::segments_dir(server.dir());
    let object = wait_for("the segment's upload", Duration::from_secs(30), || {
        (core_0_counter(&server, "pico_uploads_total") >= 1).then_some(())?;
        std::fs::read_dir(&segments)
            .ok()?
            .map(|e| e.unwrap().path())
            .find(|p| std::fs::read(p).is_ok_and(|d| d.len() > RECORDS as usize * 50))
    });
    server.terminate(Duration::from_secs(30));
    (server, object)
}

/// Appends `body(0)..body(records)` to `path` in one batch (one commit round).
fn post_batch(server: &Server, path: &str, records: u64) {
    let bodies: Vec<Vec<u8>> = (0..records).map(body).collect();
    let batch: Vec<BatchRecord> = bodies
        .iter()
        .map(|body| BatchRecord { headers: &[], body })
        .collect();
    server
        .request(
            "POST",
            path,
            &[("content-type", "application/vnd.picomq.batch")],
            &encode_binary_batch(&batch),
        )
        .expect(200);
}

fn flip(path: &PathBuf, at: usize) {
    let mut data = std::fs::read(path).unwrap();
    data[at] ^= 0x10;
    std::fs::write(path, &data).unwrap();
}

fn pico_read(server: &Server, from: u64) -> Resp {
    let path = format!("/d?seq={from}&format=binary&bytes=1048576");
    server.connect().request("GET", &path, &[], b"").unwrap()
}

#[test]
fn a_damaged_record_is_refused_with_500_after_every_record_before_it_and_heals_with_the_object() {
    let (mut server, object) = a_stopped_node_with_one_stored_segment();
    let at = common::record_body_byte_after(&std::fs::read(&object).unwrap(), 0.5);
    flip(&object, at);
    server.restart();

    // Pico: the first page holds the records before the damage, exactly, and is not up to
    // date; the next read, from the damaged record, is a 500 that names it.
    let page = pico_read(&server, 0);
    page.expect(200);
    let records = decode_binary_read(&page.body);
    let damaged = page.h_u64("pico-next-seq");
    assert!(
        damaged > 0 && damaged < RECORDS,
        "the page stops at the damage: {}",
        page.describe()
    );
    assert_eq!(records.len() as u64, damaged);
    for (i, record) in records.iter().enumerate() {
        assert_eq!(record.body, body(i as u64), "record {i}");
    }
    assert_ne!(page.header("pico-up-to-date"), Some("true"));
    let refused = pico_read(&server, damaged);
    let error = refused.expect_error(500, "damaged");
    let message = error["message"].as_str().unwrap();
    let name = object.file_name().unwrap().to_str().unwrap();
    assert!(message.contains("corrupt frame"), "{error}");
    assert!(
        message.contains(name),
        "the message names the object: {error}"
    );
    assert!(refused.header("retry-after").is_none());

    // Durable Streams: the same records, then the same refusal at the offset it was given.
    let ds_addr = server.second.expect("a Durable Streams listener");
    let first = ds_read(ds_addr, "/d", "-1");
    first.expect(200);
    assert!(first.body.starts_with(&body(0)));
    assert!(first
        .text()
        .contains(&String::from_utf8(body(damaged - 1)).unwrap()));
    assert!(!first
        .text()
        .contains(&String::from_utf8(body(damaged + 1)).unwrap()));
    assert_ne!(first.header("stream-up-to-date"), Some("true"));
    let next = first.h("stream-next-offset").to_string();
    let ds_refused = ds_read(ds_addr, "/d", &next);
    assert_eq!(ds_refused.status, 500, "{}", ds_refused.describe());
    assert_eq!(
        ds_refused.json()["error"]["code"],
        "DAMAGED",
        "{}",
        ds_refused.text()
    );

    // Counted, and logged with the stream, the offset and the object.
    assert!(damaged_reads(&server) >= 2);
    let log = server.log();
    let line = log
        .lines()
        .find(|l| l.contains("stored data is damaged"))
        .unwrap_or_else(|| panic!("a log line of the damage:\n{log}"));
    assert!(line.contains("ERROR"), "{line}");
    assert!(line.contains("stream /d"), "{line}");
    assert!(line.contains(&format!("offset {damaged}")), "{line}");
    assert!(line.contains(name), "{line}");

    // A reader retrying the damaged range costs the bucket at most one GET per interval
    // (`DAMAGE_REFETCH_INTERVAL_MS`, 5 s), not one per request.
    let misses_before = cache_misses(&server);
    for _ in 0..20 {
        assert_eq!(pico_read(&server, damaged).status, 500);
    }
    let refetches = cache_misses(&server) - misses_before;
    assert!(
        refetches <= 2,
        "{refetches} fetches for 20 reads of a damaged range"
    );

    // The object restored in place: a read within the interval fetches it again, and every
    // record reads back, without a restart.
    flip(&object, at);
    wait_for(
        "the restored object to read",
        Duration::from_secs(60),
        || (pico_read(&server, damaged).status == 200).then_some(()),
    );
    let (all, next) = read_all(&server, "/d", 0);
    assert_eq!(next, RECORDS);
    for (i, record) in all.iter().enumerate() {
        assert_eq!(record.body, body(i as u64), "record {i}");
    }
}

/// A Pico read of `/d` from its start is `500 damaged` without `Retry-After`, its message
/// saying `says`.
fn refused_as_damaged(server: &Server, says: &str) {
    let refused = pico_read(server, 0);
    let error = refused.expect_error(500, "damaged");
    let message = error["message"].as_str().unwrap();
    assert!(message.contains(says), "{error}");
    assert!(refused.header("retry-after").is_none());
}

#[test]
fn a_segment_object_cut_short_is_refused_with_500_not_read_as_an_end() {
    let (mut server, object) = a_stopped_node_with_one_stored_segment();
    let data = std::fs::read(&object).unwrap();
    let cut = common::record_body_byte_after(&data, 0.5);
    std::fs::write(&object, &data[..cut]).unwrap();
    server.restart();

    refused_as_damaged(&server, "past the end");
    let ds_refused = ds_read(server.second.unwrap(), "/d", "-1");
    assert_eq!(ds_refused.status, 500, "{}", ds_refused.describe());
    assert!(damaged_reads(&server) >= 2);
    // The stream's metadata is intact: its tail is where the appends left it.
    let head = server.head("/d");
    head.expect(200);
    assert_eq!(head.h_u64("pico-next-seq"), RECORDS);
}

#[test]
fn a_segment_object_gone_from_the_bucket_is_refused_with_500_and_counted() {
    let (mut server, object) = a_stopped_node_with_one_stored_segment();
    std::fs::remove_file(&object).unwrap();
    server.restart();

    refused_as_damaged(&server, "is missing");
    assert_eq!(damaged_reads(&server), 1);
    let log = server.log();
    assert!(
        log.lines()
            .any(|l| l.contains("stored data is damaged") && l.contains("stream /d")),
        "{log}"
    );
}

/// `POST /admin/verify` with `body` on `server`'s admin listener.
fn post_verify(server: &Server, body: &[u8]) -> Resp {
    common::Conn::connect(server.admin)
        .unwrap()
        .request(
            "POST",
            "/admin/verify",
            &[("content-type", "application/json")],
            body,
        )
        .unwrap()
}

/// `pico admin verify --json` against `server`: its exit success and its report.
fn verify(server: &Server) -> (bool, serde_json::Value) {
    let endpoint = format!("http://{}", server.admin);
    let out = common::pico(
        server.dir(),
        &["admin", "--admin-endpoint", &endpoint, "--json", "verify"],
    );
    let report = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "a JSON report ({e}): {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.success(), report)
}

#[test]
fn a_verify_finds_a_flipped_bit_and_a_missing_object_before_any_reader_does() {
    let (mut server, damaged) = a_stopped_node_with_one_stored_segment();
    server.restart();
    // A second stream with an object of its own, and nothing read yet.
    server.put("/e", "text/plain").expect(201);
    server.post("/e", b"kept").expect(200);
    let segments = common::segments_dir(server.dir());
    let other = wait_for("/e's upload", Duration::from_secs(30), || {
        std::fs::read_dir(&segments)
            .ok()?
            .map(|e| e.unwrap().path())
            .find(|p| *p != damaged)
    });

    // Bad bounds are refused, naming the field.
    for body in [
        &br#"{"timeoutSec": 0}"#[..],
        br#"{"timeoutSec": 604801}"#,
        br#"{"maxBytesPerSecond": -1}"#,
        b"[1]",
        b"{",
    ] {
        let refused = post_verify(&server, body);
        assert_eq!(refused.status, 400, "{}", refused.describe());
    }
    assert_eq!(server.admin_get("/admin/verify").json()["state"], "none");

    let (ok, report) = verify(&server);
    assert!(ok, "{report}");
    assert_eq!(report["state"], "complete");
    assert_eq!(report["objectsChecked"], 2, "{report}");
    assert_eq!(report["intactObjects"], 2, "{report}");
    assert_eq!(report["damagedObjects"], 0, "{report}");
    assert_eq!(server.metric_sample("pico_verify_damaged_objects"), Some(0));

    let at = common::record_body_byte_after(&std::fs::read(&damaged).unwrap(), 0.5);
    flip(&damaged, at);
    std::fs::remove_file(&other).unwrap();
    let (ok, report) = verify(&server);
    assert!(!ok, "a verify that found damage exits 1: {report}");
    assert_eq!(report["damagedObjects"], 2, "{report}");
    let listed = report["damaged"].as_array().unwrap();
    let objects = server.dir().join("objects");
    let name = |path: &PathBuf| path.strip_prefix(&objects).unwrap().display().to_string();
    let flipped = listed.iter().find(|d| d["key"] == name(&damaged)).unwrap();
    assert!(
        flipped["cause"]
            .as_str()
            .unwrap()
            .contains("fails its checks"),
        "{flipped}"
    );
    assert!(flipped["atByte"].as_u64().unwrap() <= at as u64);
    // What it costs: the records of /d from the damaged one to the end of its run.
    let lost = flipped["lost"].as_array().unwrap();
    assert_eq!(lost.len(), 1, "{flipped}");
    assert_eq!(lost[0]["stream"], "/d");
    assert_eq!(lost[0]["nextOffset"], RECORDS);
    let lost_from = lost[0]["fromOffset"].as_u64().unwrap();
    assert!(lost_from > 0 && lost_from < RECORDS, "{flipped}");
    let missing = listed.iter().find(|d| d["key"] == name(&other)).unwrap();
    assert!(
        missing["cause"].as_str().unwrap().contains("missing"),
        "{missing}"
    );
    assert_eq!(missing["lost"][0]["stream"], "/e");
    assert_eq!(missing["lost"][0]["fromOffset"], 0);
    assert_eq!(server.metric_sample("pico_verify_damaged_objects"), Some(2));
    let log = server.log();
    for key in [name(&damaged), name(&other)] {
        assert!(
            log.lines()
                .any(|l| l.contains("ERROR") && l.contains("verify") && l.contains(&key)),
            "a log line names {key}:\n{log}"
        );
    }
    // One at a time: a verify paced at a byte a second is still running when another is asked.
    let post = |body: &[u8]| post_verify(&server, body);
    let slow = post(br#"{"maxBytesPerSecond": 1, "timeoutSec": 604800}"#);
    assert_eq!(slow.status, 202, "{}", slow.describe());
    assert_eq!(post(b"").status, 409);
    assert_eq!(server.admin_get("/admin/verify").json()["state"], "running");
    // The finished verify's findings stay in /metrics while another runs.
    assert_eq!(server.metric_sample("pico_verify_damaged_objects"), Some(2));

    // Found by the verify, not by a reader: no read met it. A reader then stops where the
    // verify said the loss begins.
    assert_eq!(damaged_reads(&server), 0);
    let page = pico_read(&server, 0);
    page.expect(200);
    assert_eq!(page.h_u64("pico-next-seq"), lost_from);
}

/// A catalog row that names the wrong segment (one flipped bit of its segment number, as a
/// damaged catalog page gives) places a stream's records in bytes that hold another stream's,
/// and a lost row leaves records no entry places: a read answers `500 damaged` naming the
/// record, never an empty page or a jump past the records as if they had never been written.
/// Before, a read of either stream skipped them.
#[test]
fn records_a_damaged_catalog_misplaces_are_refused_with_500_not_skipped() {
    let mut server = Server::start(&["--cores", "1", "--segment-max-age-ms", "200"]);
    server.put("/d", "text/plain").expect(201);
    server.put("/e", "text/plain").expect(201);
    let uploads = |server: &Server, at_least: u64| {
        wait_for("the segment's upload", Duration::from_secs(30), || {
            (core_0_counter(server, "pico_uploads_total") >= at_least).then_some(())
        })
    };
    // Segment 1: /d's 100 records; segment 2: /e's 50 records, its bytes within segment 1's;
    // segments 3 to 5: /f's records 0..50, 50..100 and 100..150.
    post_batch(&server, "/d", 100);
    uploads(&server, 1);
    post_batch(&server, "/e", 50);
    uploads(&server, 2);
    server.put("/f", "text/plain").expect(201);
    for n in 3..=5 {
        post_batch(&server, "/f", 50);
        uploads(&server, n);
    }
    server.terminate(Duration::from_secs(30));
    {
        // Edited through the catalog's page checksums, as a damaged row reads to the node.
        pico_meta::use_page_checksums().unwrap();
        let db = rusqlite::Connection::open(server.dir().join("meta.db")).unwrap();
        let id = |name: &str| -> i64 {
            db.query_row("SELECT id FROM streams WHERE name = ?1", [name], |r| {
                r.get(0)
            })
            .unwrap()
        };
        let segment_of = |stream: i64| -> i64 {
            db.query_row(
                "SELECT segment_seq FROM segment_streams WHERE stream_id = ?1",
                [stream],
                |r| r.get(0),
            )
            .unwrap()
        };
        let (d, e) = (id("/d"), id("/e"));
        let (first, second) = (segment_of(d), segment_of(e));
        assert_ne!(first, second, "two segments");
        let moved = db
            .execute(
                "UPDATE segment_streams SET segment_seq = ?1, ord = 1000 \
                 WHERE segment_seq = ?2 AND stream_id = ?3",
                [first, second, e],
            )
            .unwrap();
        assert_eq!(moved, 1);
        // /f's middle row lost: records 50..100 have no place in the catalog.
        let lost = db
            .execute(
                "DELETE FROM segment_streams WHERE stream_id = ?1 AND segment_seq = \
                 (SELECT segment_seq FROM segment_streams WHERE stream_id = ?1 \
                  ORDER BY segment_seq LIMIT 1 OFFSET 1)",
                [id("/f")],
            )
            .unwrap();
        assert_eq!(lost, 1);
    }
    server.restart();

    // /e's records are not where its catalog says: refused, from its start and from within.
    for from in [0, 10] {
        let path = format!("/e?seq={from}&format=binary&bytes=1048576");
        let refused = server.connect().request("GET", &path, &[], b"").unwrap();
        let error = refused.expect_error(500, "damaged");
        let message = error["message"].as_str().unwrap();
        assert!(
            message.contains(&format!("does not hold record {from} of stream")),
            "{error}"
        );
    }
    let ds_refused = ds_read(server.second.unwrap(), "/e", "-1");
    assert_eq!(ds_refused.status, 500, "{}", ds_refused.describe());
    // /f reads its first 50 records, then refuses the record no entry places, never jumping
    // to record 100 as if 50..100 had never been written.
    let page = server
        .connect()
        .request("GET", "/f?seq=0&format=binary&bytes=1048576", &[], b"")
        .unwrap();
    page.expect(200);
    assert_eq!(page.h_u64("pico-next-seq"), 50, "{}", page.describe());
    assert_eq!(decode_binary_read(&page.body).len(), 50);
    for from in [50, 60] {
        let path = format!("/f?seq={from}&format=binary&bytes=1048576");
        let refused = server.connect().request("GET", &path, &[], b"").unwrap();
        let error = refused.expect_error(500, "damaged");
        let message = error["message"].as_str().unwrap();
        assert!(
            message.contains("no catalog entry places record"),
            "{error}"
        );
    }
    // /d is untouched: every record reads back.
    let (all, next) = read_all(&server, "/d", 0);
    assert_eq!(next, 100);
    for (i, record) in all.iter().enumerate() {
        assert_eq!(record.body, body(i as u64), "record {i}");
    }
}

/// One flipped bit in a catalog row the node reads at start (a run of `segment_streams`, which
/// says where a stream's records are and how far they go): the start is refused, naming the
/// damage, instead of serving a catalog that says something else. Before, the node started
/// and its reads (or its next offsets) followed the changed row.
#[test]
fn a_flipped_bit_in_the_catalog_file_refuses_the_start() {
    let (mut server, _object) = a_stopped_node_with_one_stored_segment();
    let path = server.dir().join("meta.db");
    let runs: Vec<u8> = {
        let flags = rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY;
        let db = rusqlite::Connection::open_with_flags(&path, flags).unwrap();
        db.query_row("SELECT runs FROM segment_streams", [], |r| r.get(0))
            .unwrap()
    };
    let mut file = std::fs::read(&path).unwrap();
    let found: Vec<usize> = file
        .windows(runs.len())
        .enumerate()
        .filter(|(_, w)| *w == runs.as_slice())
        .map(|(at, _)| at)
        .collect();
    assert_eq!(found.len(), 1, "the run's bytes once in {}", path.display());
    // The run's last byte: its byte length (the compact layout's last varint).
    file[found[0] + runs.len() - 1] ^= 0x01;
    std::fs::write(&path, &file).unwrap();

    let (status, log) = server.restart_refused(Duration::from_secs(30));
    assert!(!status.success(), "{log}");
    assert!(log.contains("fails its checksum"), "{log}");
    assert!(log.contains("restore it from a backup"), "{log}");
}

/// After a `kill -9`, an operator looks into the catalog with another SQLite program (one that
/// knows nothing of the node's page checksums, as the `sqlite3` shell does), which recovers the
/// WAL and checkpoints it into the file as it closes: the node starts again on it and serves
/// every stream, instead of calling the file damaged.
#[test]
fn a_catalog_read_by_another_sqlite_program_after_a_kill_still_starts_the_node() {
    let mut server = Server::start(&["--cores", "1"]);
    for i in 0..40 {
        let name = format!("/looked-at/{i}");
        server.put(&name, "text/plain").expect(201);
        server.post(&name, format!("r{i}").as_bytes()).expect(200);
    }
    server.kill();
    let path = server.dir().join("meta.db");
    let wal = std::fs::metadata(path.with_file_name("meta.db-wal")).map_or(0, |m| m.len());
    assert!(wal > 0, "the creates are in the catalog's WAL");
    {
        let flags = rusqlite::OpenFlags::default();
        let db = rusqlite::Connection::open_with_flags_and_vfs(&path, flags, c"unix").unwrap();
        let streams: i64 = db
            .query_row(
                "SELECT count(*) FROM streams WHERE name LIKE '/looked-at/%'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(streams, 40);
        db.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
            .unwrap();
    }
    server.restart();
    for i in 0..40 {
        let read = server.get(&format!("/looked-at/{i}?seq=0"));
        read.expect(200);
    }
}
