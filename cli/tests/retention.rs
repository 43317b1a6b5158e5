//! Retention (docs/api.md, Retention): streams keep what their policy asks for and no more,
//! over real sockets: by age, by size, delete-on-empty, the node default in both protocols,
//! changes by `PATCH` and `pico retention`, forks, restarts (kill -9), and the garbage
//! collector deleting the segments retention emptied.
//!
//! No test depends on timing: each waits (bounded) for the retention pass to act, and checks
//! what it must never do against a control stream the same pass has visibly acted on.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{ds, read_all, wait_for, Server};

/// The retention pass runs every second: each wait below is bounded well past that.
const ACTED_WITHIN: Duration = Duration::from_secs(60);

fn start(server: &Server, path: &str) -> u64 {
    let head = server.head(path);
    head.expect(200);
    head.h_u64("pico-start-seq")
}

/// What the stream keeps now, from its start to the tail in one page (the streams here hold
/// far less than a page), with the tail; `None` when retention trimmed past the start between
/// the `HEAD` and the read (the caller looks again).
fn read_kept(server: &Server, path: &str) -> Option<(Vec<common::ReadRecord>, u64)> {
    let from = start(server, path);
    let page = server.get(&format!("{path}?seq={from}&format=binary&bytes=4194304"));
    if page.status == 410 {
        return None;
    }
    page.expect(200);
    assert_eq!(page.header("pico-up-to-date"), Some("true"), "one page");
    let records = common::decode_binary_read(&page.body);
    Some((records, page.h_u64("pico-next-seq")))
}

fn create(server: &Server, path: &str, headers: &[(&str, &str)]) {
    let mut all = vec![("content-type", "text/plain")];
    all.extend_from_slice(headers);
    server.request("PUT", path, &all, b"").expect(201);
}

fn append(server: &Server, path: &str, body: &[u8]) {
    server.post(path, body).expect(200);
}

fn metric(server: &Server, series: &str) -> u64 {
    let page = common::Conn::connect(server.admin)
        .unwrap()
        .request("GET", "/metrics", &[], b"")
        .unwrap();
    page.text()
        .lines()
        .filter(|line| line.starts_with(&format!("{series}{{")))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

fn segment_files(dir: &Path) -> usize {
    std::fs::read_dir(common::segments_dir(dir))
        .map(|entries| {
            entries
                .filter_map(|e| e.ok())
                .filter(|e| e.file_name().to_string_lossy().ends_with(".seg"))
                .count()
        })
        .unwrap_or(0)
}

#[test]
fn records_older_than_the_age_limit_go_and_the_policy_survives_a_kill() {
    let mut server = Server::start(&["--cores", "1", "--segment-max-age-ms", "50"]);
    create(&server, "/age/short", &[("pico-retention-age", "1")]);
    create(&server, "/age/long", &[("pico-retention-age", "3600")]);
    for i in 0..3 {
        append(&server, "/age/short", format!("s{i}").as_bytes());
        append(&server, "/age/long", format!("l{i}").as_bytes());
    }
    let head = server.head("/age/short");
    assert_eq!(head.header("pico-retention-age"), Some("1"));
    wait_for("the age limit to trim /age/short", ACTED_WITHIN, || {
        (start(&server, "/age/short") == 3).then_some(())
    });
    // Below the new start: the trim answer of the Pico protocol.
    server.get("/age/short?seq=0").expect(410);
    // Counted once the trim is in the metadata log (readers see it a moment before).
    wait_for("the trim to be counted", ACTED_WITHIN, || {
        (metric(&server, "pico_retention_trimmed_records_total") >= 3).then_some(())
    });
    // The same passes left the stream whose records are younger than its limit alone.
    assert_eq!(start(&server, "/age/long"), 0);
    let (kept, _) = read_all(&server, "/age/long", 0);
    assert_eq!(kept.len(), 3);

    // A new record is younger than the limit until it is not; the policy and the start
    // survive a kill -9 (both are in the metadata log).
    append(&server, "/age/short", b"later");
    server.kill();
    server.restart();
    let head = server.head("/age/short");
    head.expect(200);
    assert_eq!(head.header("pico-retention-age"), Some("1"));
    assert!(head.h_u64("pico-start-seq") >= 3);
    assert_eq!(head.h_u64("pico-next-seq"), 4);
    wait_for(
        "the record written before the kill to age out",
        ACTED_WITHIN,
        || (start(&server, "/age/short") == 4).then_some(()),
    );
    assert_eq!(start(&server, "/age/long"), 0);
}

#[test]
fn the_oldest_records_go_beyond_the_byte_limit() {
    // 64 KiB segments: every few records seal, so the stream is stored as many chunks.
    let server = Server::start(&[
        "--cores",
        "1",
        "--segment-size",
        "64KiB",
        "--segment-max-age-ms",
        "50",
    ]);
    const LIMIT: usize = 100 * 1024;
    let limit = LIMIT.to_string();
    create(&server, "/size/s", &[("pico-retention-bytes", &limit)]);
    let record = |i: usize| vec![b'a' + (i % 26) as u8; 8 * 1024];
    for i in 0..40 {
        append(&server, "/size/s", &record(i));
    }
    let kept = wait_for("the byte limit to trim /size/s", ACTED_WITHIN, || {
        let (records, next) = read_kept(&server, "/size/s")?;
        let bytes: usize = records.iter().map(|r| r.body.len()).sum();
        (bytes <= LIMIT && next == 40).then_some(records)
    });
    assert!(!kept.is_empty(), "the newest records stay");
    // What stays is the newest records, contiguous up to the tail, unchanged.
    let first = kept[0].seq as usize;
    for (i, r) in kept.iter().enumerate() {
        assert_eq!(r.seq as usize, first + i);
        assert_eq!(r.body, record(first + i));
    }
    assert_eq!(first + kept.len(), 40);
    // Whole chunks go, not every byte over the limit: at most one segment's worth below it.
    let bytes: usize = kept.iter().map(|r| r.body.len()).sum();
    assert!(
        bytes + 64 * 1024 >= LIMIT,
        "kept {bytes} of a {LIMIT} byte limit"
    );
}

#[test]
fn an_empty_stream_is_deleted_once_idle_for_its_delete_on_empty_time() {
    let server = Server::start(&["--cores", "1"]);
    create(
        &server,
        "/empty/never-written",
        &[("pico-delete-on-empty", "1")],
    );
    create(&server, "/empty/trimmed", &[("pico-delete-on-empty", "1")]);
    create(
        &server,
        "/empty/holds-a-record",
        &[("pico-delete-on-empty", "1")],
    );
    create(&server, "/empty/off", &[]);
    append(&server, "/empty/trimmed", b"x");
    append(&server, "/empty/holds-a-record", b"x");
    // Trimmed to its tail: no records left.
    server
        .request(
            "POST",
            "/empty/trimmed",
            &[("pico-trim-seq", "1"), ("content-length", "0")],
            b"",
        )
        .expect(200);
    for path in ["/empty/never-written", "/empty/trimmed"] {
        wait_for(&format!("{path} to be deleted"), ACTED_WITHIN, || {
            (server.head(path).status == 404).then_some(())
        });
    }
    wait_for("the deletes to be counted", ACTED_WITHIN, || {
        (metric(&server, "pico_retention_deleted_streams_total") >= 2).then_some(())
    });
    // A stream that holds a record, and one without the policy, stay.
    server.head("/empty/holds-a-record").expect(200);
    server.head("/empty/off").expect(200);
    // The name is free again.
    create(&server, "/empty/trimmed", &[]);
}

#[test]
fn the_node_default_applies_to_streams_created_without_a_policy_in_both_protocols() {
    let server = Server::start(&[
        "--cores",
        "1",
        "--default-retention-age",
        "1s",
        "--ds-listen",
        "127.0.0.1:0",
    ]);
    let ds_addr = server.second.expect("a Durable Streams listener");
    create(&server, "/default/pico", &[]);
    create(&server, "/default/off", &[("pico-retention-age", "0")]);
    ds(
        ds_addr,
        "PUT",
        "/default/ds",
        &[("content-type", "text/plain")],
        b"",
    )
    .expect(201);
    assert_eq!(
        server.head("/default/pico").header("pico-retention-age"),
        Some("1")
    );
    assert_eq!(
        server.head("/default/ds").header("pico-retention-age"),
        Some("1")
    );
    assert_eq!(
        server.head("/default/off").header("pico-retention-age"),
        None
    );
    for path in ["/default/pico", "/default/off"] {
        append(&server, path, b"x");
    }
    ds(
        ds_addr,
        "POST",
        "/default/ds",
        &[("content-type", "text/plain")],
        b"x",
    )
    .expect(204);
    for path in ["/default/pico", "/default/ds"] {
        wait_for(&format!("the default to trim {path}"), ACTED_WITHIN, || {
            (start(&server, path) == 1).then_some(())
        });
    }
    // A Durable Streams read from the beginning starts after what retention removed.
    let read = common::ds_read(ds_addr, "/default/ds", "-1");
    read.expect(200);
    assert_eq!(read.text(), "");
    // Turned off at create, the default does not apply.
    assert_eq!(start(&server, "/default/off"), 0);
}

#[test]
fn a_patch_and_pico_retention_change_the_policy_and_bad_values_are_refused() {
    let mut server = Server::start(&["--cores", "1"]);
    create(&server, "/conf/s", &[]);
    assert_eq!(server.head("/conf/s").header("pico-retention-bytes"), None);
    let patched = server.request(
        "PATCH",
        "/conf/s",
        &[("pico-retention-bytes", "1000"), ("content-length", "0")],
        b"",
    );
    patched.expect(200);
    assert_eq!(patched.header("pico-retention-bytes"), Some("1000"));
    let named = patched
        .headers
        .iter()
        .filter(|(name, _)| name == "pico-retention-bytes")
        .count();
    assert_eq!(named, 1, "each limit once: {}", patched.describe());
    // The CLI: only the limit it names changes.
    let endpoint = format!("http://{}", server.addr);
    let out = common::pico(
        server.dir(),
        &[
            "--endpoint",
            &endpoint,
            "retention",
            "/conf/s",
            "--age",
            "7d",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "age=604800 bytes=1000 delete_on_empty=-\n"
    );
    server.kill();
    server.restart();
    let endpoint = format!("http://{}", server.addr);
    let head = server.head("/conf/s");
    assert_eq!(head.header("pico-retention-age"), Some("604800"));
    assert_eq!(head.header("pico-retention-bytes"), Some("1000"));
    // 0 turns a limit off.
    let off = server.request(
        "PATCH",
        "/conf/s",
        &[("pico-retention-bytes", "0"), ("content-length", "0")],
        b"",
    );
    off.expect(200);
    assert_eq!(off.header("pico-retention-bytes"), None);
    assert_eq!(off.header("pico-retention-age"), Some("604800"));
    // `pico create` sets a policy; a create of an existing stream keeps its own.
    let out = common::pico(
        server.dir(),
        &[
            "--endpoint",
            &endpoint,
            "create",
            "/conf/cli",
            "--content-type",
            "text/plain",
            "--retention-age",
            "12h",
            "--retention-bytes",
            "10GiB",
            "--delete-on-empty",
            "1d",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let head = server.head("/conf/cli");
    assert_eq!(head.header("pico-retention-age"), Some("43200"));
    assert_eq!(head.header("pico-retention-bytes"), Some("10737418240"));
    assert_eq!(head.header("pico-delete-on-empty"), Some("86400"));
    server
        .request(
            "PUT",
            "/conf/cli",
            &[("content-type", "text/plain"), ("pico-retention-age", "5")],
            b"",
        )
        .expect(200);
    assert_eq!(
        server.head("/conf/cli").header("pico-retention-age"),
        Some("43200")
    );
    // Refused with 400, nothing changed: not a number, too large, negative.
    let too_long = (pico_engine::limits::RETENTION_AGE_SEC_MAX + 1).to_string();
    for (name, value) in [
        ("pico-retention-age", "soon"),
        ("pico-retention-age", too_long.as_str()),
        ("pico-retention-bytes", "-1"),
        ("pico-retention-bytes", "99999999999999999999"),
        ("pico-delete-on-empty", "1.5"),
    ] {
        let refused = server.request(
            "PATCH",
            "/conf/s",
            &[(name, value), ("content-length", "0")],
            b"",
        );
        refused.expect_error(400, "bad_request");
        let refused = server.request(
            "PUT",
            "/conf/new",
            &[("content-type", "text/plain"), (name, value)],
            b"",
        );
        refused.expect_error(400, "bad_request");
    }
    server.head("/conf/new").expect(404);
    assert_eq!(
        server.head("/conf/s").header("pico-retention-age"),
        Some("604800")
    );
    // A missing stream.
    server
        .request(
            "PATCH",
            "/conf/missing",
            &[("pico-retention-age", "1"), ("content-length", "0")],
            b"",
        )
        .expect(404);
}

#[test]
fn a_stream_that_forks_read_keeps_its_records_until_the_fork_is_gone() {
    let server = Server::start(&["--cores", "1", "--ds-listen", "127.0.0.1:0"]);
    let ds_addr = server.second.expect("a Durable Streams listener");
    for path in ["/fork/src", "/fork/control"] {
        create(&server, path, &[]);
        append(&server, path, b"a");
        append(&server, path, b"b");
    }
    ds(
        ds_addr,
        "PUT",
        "/fork/child",
        &[("stream-forked-from", "/fork/src")],
        b"",
    )
    .expect(201);
    for path in ["/fork/src", "/fork/control"] {
        server
            .request(
                "PATCH",
                path,
                &[("pico-retention-age", "1"), ("content-length", "0")],
                b"",
            )
            .expect(200);
    }
    wait_for("retention to trim the control stream", ACTED_WITHIN, || {
        (start(&server, "/fork/control") == 2).then_some(())
    });
    // The same passes kept the source: its fork reads through it.
    assert_eq!(start(&server, "/fork/src"), 0);
    let fork = common::ds_read(ds_addr, "/fork/child", "-1");
    fork.expect(200);
    assert_eq!(fork.text(), "ab");
    ds(ds_addr, "DELETE", "/fork/child", &[], b"").expect(204);
    wait_for(
        "retention to trim the source once its fork is gone",
        ACTED_WITHIN,
        || (start(&server, "/fork/src") == 2).then_some(()),
    );
}

#[test]
fn segments_retention_emptied_are_deleted_from_the_bucket() {
    let server = Server::start(&[
        "--cores",
        "1",
        "--segment-size",
        "64KiB",
        "--segment-max-age-ms",
        "50",
        "--gc-interval-ms",
        "200",
    ]);
    create(&server, "/gc/s", &[("pico-retention-bytes", "65536")]);
    let record = vec![b'r'; 16 * 1024];
    for _ in 0..64 {
        append(&server, "/gc/s", &record);
    }
    // 1 MiB of records in 64 KiB segments: retention keeps the newest 64 KiB or so, and the
    // collector deletes the segments left holding nothing readable.
    wait_for(
        "the collector to delete what retention emptied",
        ACTED_WITHIN,
        || (segment_files(server.dir()) <= 4 && start(&server, "/gc/s") > 0).then_some(()),
    );
    wait_for("the collected segments to be counted", ACTED_WITHIN, || {
        (metric(&server, "pico_gc_segments_deleted_total") >= 10).then_some(())
    });
    let (kept, next) = wait_for("a read of what is kept", ACTED_WITHIN, || {
        read_kept(&server, "/gc/s")
    });
    assert_eq!(next, 64);
    assert!(!kept.is_empty());
}
