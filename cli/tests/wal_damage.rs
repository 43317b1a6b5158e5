//! A WAL file damaged on disk while the node was down (one flipped byte in the written part
//! of its newest WAL file, after 200 acknowledged appends): the node refuses to start and
//! names the damage; `--wal-salvage` brings it up with the stream closed at its first lost
//! offset, no lost offset handed out again, the file and a report kept, and the loss shown on
//! `/ready` and `/metrics` (docs/durability.md, "Damaged WAL files").

mod common;

use std::time::Duration;

use common::{frames_prefix_len, read_all, Server};

const RECORDS: u64 = 200;

fn body(i: u64) -> Vec<u8> {
    format!("record {i:04} {}", "z".repeat(40)).into_bytes()
}

/// A node whose 200 acknowledged records of `/d` are all in its WAL when it is killed.
fn killed_with_records_in_the_wal() -> Server {
    // Segments never seal by age or size here: every record stays in the WAL.
    let mut server = Server::start(&["--cores", "1", "--segment-max-age-ms", "600000"]);
    server.put("/d", "text/plain").expect(201);
    let mut conn = server.connect();
    for i in 0..RECORDS {
        let answer = conn.request("POST", "/d", &[], &body(i)).unwrap();
        answer.expect(200);
        assert_eq!(answer.h_u64("pico-start-seq"), i);
    }
    server.kill();
    server
}

/// Where a byte is flipped.
#[derive(Clone, Copy, Debug)]
enum Flip {
    /// At this fraction of the written part of the WAL file, whatever is there (a record, or
    /// a group commit's commit record).
    At(f64),
    /// In the body of the first record at or after this fraction.
    RecordBodyAfter(f64),
}

/// Flips one byte of the WAL file holding the records, as `flip` says.
fn flip_a_byte(server: &Server, flip: Flip) -> std::path::PathBuf {
    let mut files: Vec<_> = std::fs::read_dir(server.wal_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "wal"))
        .map(|p| {
            let written = frames_prefix_len(&std::fs::read(&p).unwrap());
            (p, written)
        })
        .collect();
    files.sort_by_key(|(_, written)| std::cmp::Reverse(*written));
    let (path, written) = files.into_iter().next().expect("a WAL file");
    assert!(
        written > RECORDS as usize * 40,
        "the records are in {path:?}"
    );
    let mut data = std::fs::read(&path).unwrap();
    let at = match flip {
        Flip::At(fraction) => (written as f64 * fraction) as usize,
        Flip::RecordBodyAfter(fraction) => common::record_body_byte_after(&data, fraction),
    };
    data[at] ^= 0x04;
    std::fs::write(&path, &data).unwrap();
    path
}

/// `name` is closed (a salvage closed it at its first lost offset): its HEAD says so and an
/// append is refused, so no lost offset is handed out again.
fn assert_closed(server: &Server, name: &str) {
    let head = server.head(name);
    assert_eq!(
        head.header("pico-closed"),
        Some("true"),
        "{}",
        head.describe()
    );
    server
        .post(name, b"after the salvage")
        .expect_error(409, "closed");
}

/// Restarts `server` (killed) and expects it to refuse to start, its error naming each of
/// `needed`.
fn refused_naming(server: &mut Server, needed: &[&str]) {
    let (status, log) = server.restart_refused(Duration::from_secs(60));
    assert!(
        !status.success(),
        "the node started on a damaged WAL: {log}"
    );
    for needed in needed {
        assert!(log.contains(needed), "{needed:?} in the error: {log}");
    }
}

fn damaged_wal_is_refused_then_salvaged(flip: Flip) {
    let mut server = killed_with_records_in_the_wal();
    let wal = flip_a_byte(&server, flip);
    let damaged = std::fs::read(&wal).unwrap();

    // Refused, loudly, with nothing changed on disk; and again on a supervisor's restart.
    for _ in 0..2 {
        refused_naming(&mut server, &["is damaged at byte", "/d", "--wal-salvage"]);
        assert_eq!(
            std::fs::read(&wal).unwrap(),
            damaged,
            "the file is untouched"
        );
    }

    server.restart_with(&["--wal-salvage"]);
    let (records, next) = read_all(&server, "/d", 0);
    for (i, record) in records.iter().enumerate() {
        assert_eq!(record.seq, i as u64);
        assert_eq!(
            record.body,
            body(i as u64),
            "record {i} is what was written"
        );
    }
    let head = server.head("/d");
    let ready = server.admin_get("/ready");
    ready.expect(200);
    let ready = ready.json();
    assert_eq!(ready["degraded"], true, "{ready}");
    let salvaged = ready["walSalvaged"][0]
        .as_str()
        .unwrap_or_default()
        .to_string();
    if next == RECORDS {
        // The flipped byte was in a commit record: no record lost, the stream goes on.
        assert!(matches!(flip, Flip::At(_)), "a damaged record was restored");
        assert!(
            salvaged.contains("every acknowledged record was restored"),
            "{salvaged}"
        );
        assert_eq!(head.header("pico-closed"), None, "{}", head.describe());
        server.post("/d", b"after the salvage").expect(200);
    } else {
        assert_eq!(head.h_u64("pico-next-seq"), next);
        assert_closed(&server, "/d");
        assert!(
            salvaged.contains("/d") && salvaged.contains(&format!("lost offsets {next}..=199")),
            "{salvaged}"
        );
    }
    let metrics = server.admin_get("/metrics").text();
    assert!(
        metrics.lines().any(|l| l == "pico_wal_salvaged_files 1"),
        "{metrics}"
    );
    let kept = server
        .wal_dir()
        .join("damaged")
        .join(wal.file_name().unwrap());
    assert_eq!(std::fs::read(&kept).unwrap(), damaged, "kept as found");
    let mut report = kept.into_os_string();
    report.push(".txt");
    let report = std::fs::read_to_string(report).unwrap();
    assert!(
        report.contains(&salvaged[salvaged.find(": ").unwrap() + 2..]),
        "{report}"
    );
    assert!(!wal.exists());

    // A plain restart afterwards: nothing left to salvage, the stream as the salvage left it.
    let (after, after_next) = read_all(&server, "/d", 0);
    server.restart();
    let (again, again_next) = read_all(&server, "/d", 0);
    assert_eq!((again.len(), again_next), (after.len(), after_next));
    let ready = server.admin_get("/ready").json();
    assert!(ready.get("walSalvaged").is_none(), "{ready}");
}

#[test]
fn a_byte_flipped_at_30_percent_of_the_wal_is_refused_then_salvaged() {
    damaged_wal_is_refused_then_salvaged(Flip::At(0.3));
}

#[test]
fn a_byte_flipped_at_50_percent_of_the_wal_is_refused_then_salvaged() {
    damaged_wal_is_refused_then_salvaged(Flip::At(0.5));
}

#[test]
fn a_record_damaged_at_30_percent_closes_the_stream_at_it_once_salvaged() {
    damaged_wal_is_refused_then_salvaged(Flip::RecordBodyAfter(0.3));
}

/// The WAL file holding the records, found as `flip_a_byte` finds it.
fn the_records_wal_file(server: &Server) -> std::path::PathBuf {
    std::fs::read_dir(server.wal_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "wal"))
        .max_by_key(|p| frames_prefix_len(&std::fs::read(p).unwrap()))
        .expect("a WAL file")
}

/// A WAL file cut short while the node was down (`truncate`, a copy that stopped): a crash
/// never shortens a pre-allocated WAL file, so the node refuses to start and names the cut,
/// instead of reading it as a torn end and handing the lost offsets out again; cut to nothing
/// (its core made a later file, so it was whole once), the same. `--wal-salvage` then closes
/// the stream at its first lost offset.
#[test]
fn a_wal_file_cut_short_is_refused_then_salvaged_with_no_offset_handed_out_twice() {
    for to_nothing in [false, true] {
        let mut server = killed_with_records_in_the_wal();
        let wal = the_records_wal_file(&server);
        let data = std::fs::read(&wal).unwrap();
        let cut = if to_nothing {
            0
        } else {
            common::record_body_byte_after(&data, 0.5)
        };
        std::fs::write(&wal, &data[..cut]).unwrap();

        refused_naming(&mut server, &["is damaged at byte", "cut", "--wal-salvage"]);
        assert_eq!(
            std::fs::read(&wal).unwrap().len(),
            cut,
            "the file is untouched"
        );

        server.restart_with(&["--wal-salvage"]);
        let (records, next) = read_all(&server, "/d", 0);
        assert!(next < RECORDS, "to_nothing={to_nothing}: {next}");
        for (i, record) in records.iter().enumerate() {
            assert_eq!(record.body, body(i as u64), "record {i}");
        }
        if !to_nothing {
            // The records before the cut are kept and the stream is closed after them: no
            // lost offset is handed out again.
            assert!(next > 0);
            assert_closed(&server, "/d");
        }
        let ready = server.admin_get("/ready").json();
        assert_eq!(ready["degraded"], true, "{ready}");
    }
}

/// A WAL file deleted whole while the node was down, with a later WAL file holding the same
/// stream's next records: the records go on past a gap, which only a lost file explains. The
/// node refuses to start instead of serving the stream with a hole; `--wal-salvage` closes it
/// where the records before the gap end, so no lost offset is handed out again.
#[test]
fn a_wal_file_deleted_whole_is_found_by_the_gap_it_leaves() {
    // Small segments, and a bucket that takes no object (its segments directory is a file):
    // every segment's WAL file stays.
    let mut server = common::killed_after_big_records("/g", |server| {
        let segments = server.dir().join("objects/segments");
        let _ = std::fs::remove_dir_all(&segments);
        std::fs::write(&segments, b"").unwrap();
    });
    std::fs::remove_file(server.dir().join("objects/segments")).unwrap();
    let big = common::big_record;
    let mut holding: Vec<std::path::PathBuf> = std::fs::read_dir(server.wal_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "wal"))
        .filter(|p| frames_prefix_len(&std::fs::read(p).unwrap()) > 0)
        .collect();
    holding.sort();
    assert!(
        holding.len() >= 3,
        "records in several WAL files: {holding:?}"
    );
    std::fs::remove_file(&holding[1]).unwrap();
    let missing = holding[1].file_name().unwrap().to_str().unwrap();
    refused_naming(
        &mut server,
        &["WAL files missing", missing, "--wal-salvage"],
    );

    // Without the core's ledger (a WAL directory of an older build, or the ledger deleted
    // too), the gap in the stream's offsets still gives the lost file away.
    remove_ledgers(&server);
    refused_naming(&mut server, &["skip offsets", "/g", "--wal-salvage"]);

    server.restart_with(&["--wal-salvage"]);
    let (records, next) = read_all(&server, "/g", 0);
    assert!(next > 0 && next < 100, "{next}");
    for (i, record) in records.iter().enumerate() {
        assert_eq!(record.body, big(i as u64), "record {i}");
    }
    assert_closed(&server, "/g");
    let ready = server.admin_get("/ready").json();
    assert_eq!(ready["degraded"], true, "{ready}");
}

/// Deletes every WAL ledger of `server`'s WAL directory.
fn remove_ledgers(server: &Server) {
    for entry in std::fs::read_dir(server.wal_dir()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "ledger") {
            std::fs::remove_file(path).unwrap();
        }
    }
}

/// The WAL file holding a stream's newest records deleted whole while the node was down (no
/// later file shows a gap), or every WAL file: the core's ledger lists each file it made until
/// the file's segment is stored, so the node refuses to start and names the files, instead of
/// handing the lost offsets out again. `--wal-salvage` starts it without them, with the loss
/// on `/ready`; the start after that is a plain one.
#[test]
fn a_wal_file_deleted_whole_is_found_by_its_cores_ledger() {
    for every_file in [false, true] {
        let mut server = killed_with_records_in_the_wal();
        let records_file = the_records_wal_file(&server);
        let deleted: Vec<std::path::PathBuf> = match every_file {
            false => vec![records_file],
            true => std::fs::read_dir(server.wal_dir())
                .unwrap()
                .map(|e| e.unwrap().path())
                .filter(|p| p.extension().is_some_and(|e| e == "wal"))
                .collect(),
        };
        for path in &deleted {
            std::fs::remove_file(path).unwrap();
        }
        let names: Vec<&str> = deleted
            .iter()
            .map(|p| p.file_name().unwrap().to_str().unwrap())
            .collect();
        let mut needed = vec!["WAL files missing", "--wal-salvage"];
        needed.extend(&names);
        refused_naming(&mut server, &needed);
        // Refused again: nothing was changed.
        refused_naming(&mut server, &needed);

        server.restart_with(&["--wal-salvage"]);
        let ready = server.admin_get("/ready").json();
        assert_eq!(ready["degraded"], true, "{ready}");
        let salvaged = ready["walSalvaged"].to_string();
        assert!(
            salvaged.contains("missing") && salvaged.contains(names[0]),
            "{ready}"
        );
        server.post("/d", b"after the salvage").expect(200);
        // The salvage is done: the next start after a crash is a plain one.
        server.restart();
        assert!(server
            .admin_get("/ready")
            .json()
            .get("walSalvaged")
            .is_none());
        let (records, next) = read_all(&server, "/d", 0);
        assert_eq!(records.last().unwrap().body, b"after the salvage");
        assert_eq!(next, records.len() as u64);
    }
}

/// A salvage is stored in the bucket before its damaged file is moved aside: while the bucket
/// refuses the salvaged segment, `--wal-salvage` refuses to start, says why, and leaves the
/// file as it was; once the bucket takes it, the salvage goes through.
#[test]
fn a_salvage_waits_for_a_bucket_that_refuses_its_segment() {
    let mut server = killed_with_records_in_the_wal();
    let wal = flip_a_byte(&server, Flip::RecordBodyAfter(0.3));
    let damaged = std::fs::read(&wal).unwrap();
    // A non-empty directory where the salvaged segment's object would be renamed to.
    let stem = wal.file_stem().unwrap().to_str().unwrap().to_string();
    let block = common::segments_dir(server.dir()).join(format!("{stem}.seg"));
    std::fs::create_dir_all(&block).unwrap();
    std::fs::write(block.join("refused"), b"").unwrap();

    let catalog = format!("sqlite:{}", server.dir().join("meta.db").display());
    let (refused, stderr) = common::serve_refused_on(
        &server,
        &catalog,
        &server.wal_dir(),
        &["--cores", "1", "--wal-salvage"],
    );
    assert!(refused, "salvaged without the bucket: {stderr}");
    assert!(stderr.contains("does not take writes"), "{stderr}");
    assert_eq!(
        std::fs::read(&wal).unwrap(),
        damaged,
        "the file is untouched"
    );

    std::fs::remove_dir_all(&block).unwrap();
    server.restart_with(&["--wal-salvage"]);
    assert_closed(&server, "/d");
    assert!(!wal.exists(), "moved aside once salvaged");
}
