//! Storage faults on a real node, over real sockets (docs/durability.md): a WAL disk that
//! fills up (a small tmpfs, so these tests need root to mount it) and a WAL directory deleted
//! under the running node. The node must never acknowledge what a restart would not find,
//! and must go on serving what it has. The in-process versions, with injected `EIO`, are in
//! `engine/tests/wal_faults.rs`.

mod common;

use std::time::Duration;

use common::disk::{Filler, Tmpfs};
use common::{read_all, Server};

/// `/s` holds exactly `acked`, in order, from offset 0.
fn assert_holds_exactly(server: &Server, acked: &[Vec<u8>]) {
    let (records, next) = read_all(server, "/s", 0);
    assert_eq!(next, acked.len() as u64);
    assert!(records.iter().map(|r| &r.body).eq(acked.iter()));
}

fn metric(server: &Server, line_start: &str) -> String {
    let metrics = server.admin_get("/metrics");
    metrics
        .text()
        .lines()
        .find(|l| l.starts_with(line_start))
        .unwrap_or_else(|| panic!("{line_start} in /metrics"))
        .to_string()
}

#[test]
fn a_full_wal_disk_refuses_appends_with_507_serves_the_rest_and_heals_by_itself() {
    let test = "a_full_wal_disk_refuses_appends_with_507_serves_the_rest_and_heals_by_itself";
    let Some(tmpfs) = Tmpfs::mount(test, 12) else {
        return;
    };
    let wal = tmpfs.path.display().to_string();
    let mut server = Server::start(&[
        "--cores",
        "1",
        "--wal-dir",
        &wal,
        "--segment-size",
        "1MiB",
        "--segment-max-age-ms",
        "600000",
    ]);
    server.put("/s", "application/octet-stream").expect(201);
    let filler = Filler::start(&tmpfs.path);
    filler.wait_full();

    // The disk is full, but the active WAL file was made with room for its segment: those
    // appends are acknowledged; the first one past its room is refused, with no offset.
    let mut acked = Vec::new();
    // Appends the next record: a 200 must be at the next offset (and is kept in `acked`); a
    // 507 is the answer of a full disk; anything else fails the test.
    let append_next = |server: &Server, acked: &mut Vec<Vec<u8>>| {
        let body = format!("{:06}", acked.len())
            .repeat(32 * 1024 / 6)
            .into_bytes();
        let response = server.post("/s", &body);
        match response.status {
            200 => {
                assert_eq!(response.h_u64("pico-start-seq"), acked.len() as u64);
                acked.push(body);
            }
            507 => {}
            _ => panic!("an append: {}", response.describe()),
        }
        response
    };
    let refused = loop {
        assert!(acked.len() < 2000, "no append was ever refused");
        let response = append_next(&server, &mut acked);
        if response.status == 507 {
            break response;
        }
    };
    assert!(
        acked.len() > 10,
        "the active file's room was used before refusing ({} appends)",
        acked.len()
    );
    let error = refused.expect_error(507, "insufficient_storage");
    let message = error["message"].as_str().unwrap_or_default().to_string();
    assert!(
        message.contains(&wal),
        "the message names the WAL path: {message}"
    );
    assert!(refused.header("retry-after").is_some());

    // Everything else is served from what is stored.
    assert_holds_exactly(&server, &acked);
    let next = acked.len() as u64;
    assert_eq!(server.head("/s").expect(200).h_u64("pico-next-seq"), next);
    server.put("/t", "text/plain").expect(201);
    server.delete("/t").expect(204);
    let ready = server.admin_get("/ready");
    ready.expect(200);
    let ready = ready.json();
    assert_eq!(ready["degraded"], true, "{ready}");
    assert_eq!(ready["storage"][0]["state"], "degraded", "{ready}");
    assert_eq!(
        metric(&server, "pico_wal_health{core=\"0\"}"),
        "pico_wal_health{core=\"0\"} 1"
    );

    // The node retries making its next WAL file every second, under the same name: the full
    // disk is one fault, logged once, not a line per retry.
    for _ in 0..50 {
        assert_eq!(append_next(&server, &mut acked).status, 507);
        std::thread::sleep(Duration::from_millis(100));
    }
    let logged = server
        .log()
        .matches("appends past the active WAL file are refused")
        .count();
    assert!(
        (1..=2).contains(&logged),
        "the full disk logged {logged} times"
    );

    // Space comes back: appends resume without a restart (the node retries every second;
    // bounded wait, no timing asserted).
    filler.release();
    let mut resumed = false;
    for _ in 0..600 {
        if append_next(&server, &mut acked).status == 200 {
            resumed = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(resumed, "appends resumed on their own");
    assert!(server.admin_get("/ready").json().get("degraded").is_none());
    assert_eq!(
        metric(&server, "pico_wal_health{core=\"0\"}"),
        "pico_wal_health{core=\"0\"} 0"
    );

    // Every acknowledged append, and nothing else, is there after kill -9.
    server.restart();
    assert_holds_exactly(&server, &acked);
    drop(server);
    drop(tmpfs);
}

/// The WAL directory deleted under the running node: the first append after it is not
/// acknowledged, nor any later one, until a restart; reads go on. The restart is refused while
/// the directory is gone (its acknowledged records with it), and `--wal-salvage` goes on
/// without it.
#[test]
fn appends_stop_when_the_wal_directory_is_deleted_and_reads_go_on() {
    let mut server = Server::start(&["--cores", "1", "--segment-max-age-ms", "600000"]);
    server.put("/s", "text/plain").expect(201);
    server.post("/s", b"a").expect(200);
    server.post("/s", b"b").expect(200);
    server.remove_wal_dir();
    // The first append after the deletion is written to a file no restart will read: it
    // must not be acknowledged. Neither is any later one.
    let first = server.post("/s", b"c");
    assert!(
        first.status == 500 || first.status == 503,
        "{}",
        first.describe()
    );
    let later = server.post("/s", b"d");
    let error = later.expect_error(503, "unavailable");
    assert!(
        error["message"]
            .as_str()
            .unwrap_or_default()
            .contains("restart"),
        "{error}"
    );
    let ready = server.admin_get("/ready");
    ready.expect(503);
    let ready = ready.json();
    assert_eq!(ready["storage"][0]["state"], "failed", "{ready}");
    let reason = ready["storage"][0]["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("removed while in use"), "{reason}");
    // What was acknowledged is still served.
    let (records, next) = read_all(&server, "/s", 0);
    assert_eq!(next, 2);
    assert_eq!(
        records.iter().map(|r| r.body.clone()).collect::<Vec<_>>(),
        [b"a", b"b"]
    );
    server.head("/s").expect(200);
    // The acknowledged records went with the directory: a restart on what is there now (a
    // new, empty directory) is refused, since the catalog's witness says the directory it
    // last ran with may hold records it lacks.
    server.kill();
    std::fs::create_dir_all(server.wal_dir()).unwrap();
    let (status, log) = server.restart_refused(Duration::from_secs(60));
    assert!(
        !status.success(),
        "started without its WAL directory: {log}"
    );
    assert!(
        log.contains("may hold acknowledged records not yet stored")
            && log.contains("--wal-salvage"),
        "{log}"
    );
    // Going on without it, on purpose: the loss is reported, and a refused append is never
    // found.
    server.restart_with(&["--wal-salvage"]);
    let ready = server.admin_get("/ready").json();
    assert!(
        ready["walSalvaged"]
            .to_string()
            .contains("lost WAL directory"),
        "{ready}"
    );
    let (records, _) = read_all(&server, "/s", 0);
    assert!(
        records.iter().all(|r| r.body != b"c" && r.body != b"d"),
        "{records:?}"
    );
    // The next start is a plain one.
    server.restart();
    server.head("/s").expect(200);
}

/// The catalog's disk full (its SQLite database on a tmpfs kept full): creates and deletes are
/// refused with the `507` of a full disk (as a full WAL disk refuses appends), appends to existing streams are acknowledged from the
/// WAL as before, every read is served, and the node's log says so once per interval, not
/// once per refused request (a client's retries would otherwise fill the log at their rate).
/// Space back, creates work again without a restart; after `kill -9` every acknowledged
/// append is there.
#[test]
fn a_full_catalog_disk_refuses_creates_keeps_appending_and_logs_once_an_interval() {
    let test = "a_full_catalog_disk_refuses_creates_keeps_appending_and_logs_once_an_interval";
    let Some(tmpfs) = Tmpfs::mount(test, 8) else {
        return;
    };
    let meta_url = format!("sqlite:{}", tmpfs.path.join("meta.db").display());
    let mut server = Server::start(&[
        "--cores",
        "1",
        "--meta-url",
        &meta_url,
        "--segment-max-age-ms",
        "200",
    ]);
    server.put("/s", "application/octet-stream").expect(201);
    let filler = Filler::start(&tmpfs.path);
    filler.wait_full();

    let mut acked = Vec::new();
    let mut refused = 0;
    for i in 0..60 {
        let create = server.put(&format!("/new-{i}"), "text/plain");
        if create.status == 201 {
            // SQLite may still have room in a page it holds.
            continue;
        }
        let error = create.expect_error(507, "insufficient_storage");
        assert_eq!(create.h("retry-after"), "5");
        assert!(
            error["message"]
                .as_str()
                .unwrap_or_default()
                .contains("full"),
            "{error}"
        );
        refused += 1;
        let body = format!("record {i}").into_bytes();
        let append = server.post("/s", &body);
        append.expect(200);
        assert_eq!(append.h_u64("pico-start-seq"), acked.len() as u64);
        acked.push(body);
    }
    assert!(refused >= 50, "only {refused} creates were refused");
    // The Durable Streams protocol answers the same.
    let ds_addr = server.second.expect("a Durable Streams listener");
    let ds_create = common::ds(
        ds_addr,
        "PUT",
        "/v1/stream/ds-new",
        &[("content-type", "text/plain")],
        b"",
    );
    assert_eq!(ds_create.status, 507, "{}", ds_create.text());
    assert!(
        ds_create.text().contains("INSUFFICIENT_STORAGE"),
        "{}",
        ds_create.text()
    );
    assert_holds_exactly(&server, &acked);
    let logged = server.log().matches("metadata batch of").count();
    assert!(
        (1..=2).contains(&logged),
        "{refused} refused creates logged {logged} times"
    );

    filler.release();
    let mut created = false;
    for _ in 0..100 {
        if server.put("/after", "text/plain").status == 201 {
            created = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(created, "creates work again once there is space");
    server.restart();
    assert_holds_exactly(&server, &acked);
    server.head("/after").expect(200);
    drop(server);
    drop(tmpfs);
}
