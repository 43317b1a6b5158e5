//! The Durable Streams protocol end to end: one node serving both protocols on the same data
//! (`--ds-listen`), and forks that survive a restart. The official conformance suite
//! (`scripts/conformance.sh`) covers the protocol's details; these tests cover what it cannot
//! see: the second protocol on the same records, and state rebuilt from disk.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::{ds, ds_read, read_all, Server};

/// Both protocols on one node: `--listen` speaks Pico, `--ds-listen` Durable Streams.
fn dual_server() -> (Server, SocketAddr) {
    let server = Server::start(&["--ds-listen", "127.0.0.1:0"]);
    let ds_addr = server.second.expect("the --ds-listen address is printed");
    (server, ds_addr)
}

#[test]
fn pico_records_are_read_and_extended_through_durable_streams() {
    let (server, ds_addr) = dual_server();
    server.put("/x/log", "text/plain").expect(201);
    server.post("/x/log", b"alpha ").expect(200);
    server.post("/x/log", b"beta ").expect(200);

    // A Durable Streams read returns the records' bodies back to back.
    let read = ds_read(ds_addr, "/x/log", "-1");
    read.expect(200);
    assert_eq!(read.text(), "alpha beta ");
    assert_eq!(read.h("content-type"), "text/plain");
    assert_eq!(
        read.h("stream-next-offset"),
        "0000000000000002_0000000000000000"
    );
    assert_eq!(read.h("stream-up-to-date"), "true");

    // A Durable Streams append lands after them; Pico sees it as record 2.
    let appended = ds(
        ds_addr,
        "POST",
        "/x/log",
        &[("content-type", "text/plain"), ("stream-seq", "0001")],
        b"gamma",
    );
    appended.expect(204);
    assert_eq!(
        appended.h("stream-next-offset"),
        "0000000000000003_0000000000000000"
    );
    let (records, next) = read_all(&server, "/x/log", 0);
    assert_eq!(next, 3);
    let bodies: Vec<&[u8]> = records.iter().map(|r| r.body.as_slice()).collect();
    assert_eq!(bodies, [&b"alpha "[..], b"beta ", b"gamma"]);

    // The Stream-Seq accepted through Durable Streams binds later writers.
    ds(
        ds_addr,
        "POST",
        "/x/log",
        &[("content-type", "text/plain"), ("stream-seq", "0001")],
        b"again",
    )
    .expect(409);

    // Reading from the offset of the first record's end gives the rest.
    let rest = ds_read(ds_addr, "/x/log", "0000000000000001_0000000000000000");
    assert_eq!(rest.text(), "beta gamma");

    // A close through Pico is visible to Durable Streams readers (and the reverse).
    server
        .request("POST", "/x/log", &[("pico-closed", "true")], b"")
        .expect(200);
    let head = ds(ds_addr, "HEAD", "/x/log", &[], b"");
    head.expect(200);
    assert_eq!(head.h("stream-closed"), "true");
}

#[test]
fn durable_streams_json_messages_are_pico_records() {
    let (server, ds_addr) = dual_server();
    ds(
        ds_addr,
        "PUT",
        "/j/events",
        &[("content-type", "application/json")],
        b"[{\"n\":1},{\"n\":2}]",
    )
    .expect(201);
    ds(
        ds_addr,
        "POST",
        "/j/events",
        &[("content-type", "application/json")],
        b"[[3],{\"n\":4}]",
    )
    .expect(204);

    // Each flattened message is one Pico record, in order.
    let (records, next) = read_all(&server, "/j/events", 0);
    assert_eq!(next, 4);
    let bodies: Vec<String> = records
        .iter()
        .map(|r| String::from_utf8(r.body.clone()).unwrap())
        .collect();
    assert_eq!(bodies, ["{\"n\":1}", "{\"n\":2}", "[3]", "{\"n\":4}"]);

    // A Pico append of a JSON value is one more message for Durable Streams readers.
    server
        .request(
            "POST",
            "/j/events",
            &[("content-type", "application/json")],
            b"{\"n\":5}",
        )
        .expect(200);
    let read = ds_read(ds_addr, "/j/events", "-1");
    assert_eq!(
        read.json(),
        serde_json::json!([{"n":1},{"n":2},[3],{"n":4},{"n":5}])
    );

    // Deleting through one protocol deletes for both.
    ds(ds_addr, "DELETE", "/j/events", &[], b"").expect(204);
    server.head("/j/events").expect(404);
}

#[test]
fn forks_survive_a_restart_and_release_their_source() {
    let mut server = Server::start(&["--protocol", "ds", "--gc-interval-ms", "200"]);
    let put = |s: &Server, path: &str, headers: &[(&str, &str)], body: &[u8]| {
        ds(s.addr, "PUT", path, headers, body)
    };
    put(&server, "/src", &[("content-type", "text/plain")], b"hello").expect(201);
    ds(
        server.addr,
        "POST",
        "/src",
        &[("content-type", "text/plain")],
        b" world",
    )
    .expect(204);
    // Fork inside the first record: "hel", then its own data.
    let fork = put(
        &server,
        "/fork",
        &[
            ("stream-forked-from", "/src"),
            ("stream-fork-offset", "0000000000000000_0000000000000000"),
            ("stream-fork-sub-offset", "3"),
        ],
        b"",
    );
    fork.expect(201);
    assert_eq!(fork.h("content-type"), "text/plain", "inherited");
    ds(
        server.addr,
        "POST",
        "/fork",
        &[("content-type", "text/plain")],
        b"p!",
    )
    .expect(204);
    // A fork of the fork, at its tail.
    put(&server, "/fork2", &[("stream-forked-from", "/fork")], b"").expect(201);
    // The source goes for clients but stays for its fork.
    ds(server.addr, "DELETE", "/src", &[], b"").expect(204);
    ds_read(server.addr, "/src", "-1").expect(410);
    assert_eq!(ds_read(server.addr, "/fork", "-1").text(), "help!");

    server.restart();

    assert_eq!(ds_read(server.addr, "/fork", "-1").text(), "help!");
    assert_eq!(ds_read(server.addr, "/fork2", "-1").text(), "help!");
    ds_read(server.addr, "/src", "-1").expect(410);
    put(&server, "/src", &[("content-type", "text/plain")], b"").expect(409);
    let head = ds(server.addr, "HEAD", "/fork", &[], b"");
    assert_eq!(
        head.h("stream-next-offset"),
        "0000000000000002_0000000000000000"
    );

    // Deleting the forks releases the source: its name is free again (bounded wait, the
    // release travels between cores).
    ds(server.addr, "DELETE", "/fork2", &[], b"").expect(204);
    assert_eq!(ds_read(server.addr, "/fork", "-1").text(), "help!");
    ds(server.addr, "DELETE", "/fork", &[], b"").expect(204);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let status = ds(server.addr, "HEAD", "/src", &[], b"").status;
        if status == 404 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "source still {status} after its last fork was deleted"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    put(&server, "/src", &[("content-type", "text/plain")], b"new").expect(201);
    assert_eq!(ds_read(server.addr, "/src", "-1").text(), "new");
}

#[test]
fn writer_sequences_survive_a_restart() {
    // Segments seal quickly: the first restart recovers the sequence from the catalog (the
    // sealed segment's index), the second from the WAL.
    let mut server = Server::start(&["--protocol", "ds", "--segment-max-age-ms", "50"]);
    let post = |s: &Server, seq: &str, body: &[u8]| {
        ds(
            s.addr,
            "POST",
            "/seq",
            &[("content-type", "text/plain"), ("stream-seq", seq)],
            body,
        )
        .status
    };
    ds(
        server.addr,
        "PUT",
        "/seq",
        &[("content-type", "text/plain")],
        b"",
    )
    .expect(201);
    assert_eq!(post(&server, "b", b"1"), 204);
    assert_eq!(post(&server, "a", b"2"), 409, "bytewise regression");
    server.restart();
    assert_eq!(
        post(&server, "b", b"3"),
        409,
        "the last Stream-Seq is durable"
    );
    assert_eq!(post(&server, "c", b"4"), 204);
    assert_eq!(ds_read(server.addr, "/seq", "-1").text(), "14");
}

#[test]
fn durable_streams_requests_need_tokens_when_auth_is_required() {
    let (server, _tokens) = common::start_with_tokens(
        "reader /v1/stream/ read\nwriter /v1/stream/ read,append\n",
        &["--protocol", "ds"],
    );
    let path = "/v1/stream/guarded";
    let bearer = |token: &str| format!("Bearer {token}");
    let writer = bearer("writer");
    let reader = bearer("reader");
    let plain = [("content-type", "text/plain")];

    let anonymous = ds(server.addr, "PUT", path, &plain, b"");
    anonymous.expect(401);
    assert_eq!(anonymous.h("www-authenticate"), "Bearer");
    assert_eq!(anonymous.json()["error"]["code"], "UNAUTHORIZED");

    fn with(token: &str) -> [(&str, &str); 2] {
        [("content-type", "text/plain"), ("authorization", token)]
    }
    ds(server.addr, "PUT", path, &with(&writer), b"x").expect(201);
    ds(server.addr, "POST", path, &with(&reader), b"y").expect(403);
    let read = ds(
        server.addr,
        "GET",
        &format!("{path}?offset=-1"),
        &with(&reader),
        b"",
    );
    read.expect(200);
    assert_eq!(read.text(), "x");
    // Subscriptions watch many streams: they need an admin grant.
    ds(
        server.addr,
        "GET",
        "/v1/stream/__ds/subscriptions/s1",
        &with(&writer),
        b"",
    )
    .expect(403);
}

#[test]
fn an_unknown_producer_must_start_at_zero() {
    let server = Server::start(&["--protocol", "ds"]);
    ds(
        server.addr,
        "PUT",
        "/p",
        &[("content-type", "text/plain")],
        b"",
    )
    .expect(201);
    let producer = |seq: &str| {
        ds(
            server.addr,
            "POST",
            "/p",
            &[
                ("content-type", "text/plain"),
                ("producer-id", "w1"),
                ("producer-epoch", "0"),
                ("producer-seq", seq),
            ],
            b"x",
        )
    };
    let refused = producer("3");
    refused.expect(409);
    assert_eq!(refused.h("producer-expected-seq"), "0");
    assert_eq!(refused.h("producer-received-seq"), "3");
    producer("0").expect(200);
}
