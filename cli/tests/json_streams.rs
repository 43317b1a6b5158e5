//! A stream's content type is one contract for both protocols: every record of an
//! `application/json` stream is one JSON value (at most 64 deep, no lone surrogate), whether
//! a Durable Streams JSON-mode append or a Pico append wrote it. Before, a Pico append wrote
//! anything into a JSON stream, and Durable Streams readers then got invalid JSON, one record
//! read as two messages, or the array closed early. And a create must outlast itself: no TTL of
//! 0, no expiry in the past.

mod common;

use common::{ds, encode_binary_batch, BatchRecord, Server};

fn server() -> (Server, std::net::SocketAddr) {
    let server = Server::start(&["--ds-listen", "127.0.0.1:0"]);
    let ds_addr = server.second.expect("the Durable Streams listener");
    (server, ds_addr)
}

#[test]
fn pico_appends_to_a_json_stream_must_be_json_values() {
    let (server, ds_addr) = server();
    ds(
        ds_addr,
        "PUT",
        "/j",
        &[("content-type", "application/json")],
        b"",
    )
    .expect(201);
    for bad in [
        &b"not json"[..],
        b"1 2",
        b"{\"a\":1}{\"b\":2}",
        b"]",
        b"\"\\ud800\"",
    ] {
        let refused = server.post("/j", bad);
        refused.expect(400);
        assert!(
            refused.text().contains("JSON"),
            "{}: {}",
            String::from_utf8_lossy(bad),
            refused.describe()
        );
    }
    let deep = format!("{}{}", "[".repeat(65), "]".repeat(65));
    server.post("/j", deep.as_bytes()).expect(400);
    // A batch with one bad record writes none of it.
    let batch = encode_binary_batch(&[
        BatchRecord {
            headers: &[],
            body: b"{\"ok\":true}",
        },
        BatchRecord {
            headers: &[],
            body: b"{\"ok\":",
        },
    ]);
    server
        .request(
            "POST",
            "/j",
            &[("content-type", "application/vnd.picomq.batch")],
            &batch,
        )
        .expect(400);

    server.post("/j", b"{\"from\":\"pico\"}").expect(200);
    ds(
        ds_addr,
        "POST",
        "/j",
        &[("content-type", "application/json")],
        b"[{\"from\":\"ds\"}, 2]",
    )
    .expect(204);
    let read = ds(ds_addr, "GET", "/j?offset=-1", &[], b"");
    read.expect(200);
    let messages: serde_json::Value = serde_json::from_slice(&read.body).expect("a JSON array");
    assert_eq!(
        messages,
        serde_json::json!([{"from": "pico"}, {"from": "ds"}, 2]),
        "every record is one message; nothing refused was written"
    );
}

#[test]
fn durable_streams_json_mode_refuses_deep_nesting_and_lone_surrogates() {
    let (_server, ds_addr) = server();
    ds(
        ds_addr,
        "PUT",
        "/k",
        &[("content-type", "application/json")],
        b"",
    )
    .expect(201);
    let json = [("content-type", "application/json")];
    let at_limit = format!("[{}{}]", "[".repeat(64), "]".repeat(64));
    ds(ds_addr, "POST", "/k", &json, at_limit.as_bytes()).expect(204);
    let too_deep = format!("[{}{}]", "[".repeat(65), "]".repeat(65));
    ds(ds_addr, "POST", "/k", &json, too_deep.as_bytes()).expect(400);
    for bad in [&b"[\"\\udc00\"]"[..], b"\"\\ud83d\"", b"{\"\\ud800x\":1}"] {
        let refused = ds(ds_addr, "POST", "/k", &json, bad);
        refused.expect(400);
    }
    ds(ds_addr, "POST", "/k", &json, b"\"\\ud83d\\ude00\"").expect(204);
}

#[test]
fn other_content_types_take_any_bytes_from_either_protocol() {
    let (server, ds_addr) = server();
    server.put("/bytes", "application/octet-stream").expect(201);
    server.post("/bytes", b"1 2 not json [").expect(200);
    ds(
        ds_addr,
        "POST",
        "/bytes",
        &[("content-type", "application/octet-stream")],
        b"]]]",
    )
    .expect(204);
}

/// A stream's lifetime must outlast its create (neighbours of the content-type contract: what
/// a create promises). A TTL of 0 or an expiry already passed answered `201 Created`, then
/// `404` to the next request.
#[test]
fn a_create_that_would_expire_at_once_is_refused_on_both_protocols() {
    let (server, ds_addr) = server();
    let refused = server.request("PUT", "/t0", &[("pico-ttl", "0")], b"");
    refused.expect(400);
    assert!(
        refused.text().contains("Pico-TTL"),
        "{}",
        refused.describe()
    );
    server
        .request(
            "PUT",
            "/past",
            &[("pico-expires-at", "2001-01-01T00:00:00Z")],
            b"",
        )
        .expect(400);
    server
        .request("PUT", "/t1", &[("pico-ttl", "1")], b"")
        .expect(201);

    let plain = ("content-type", "text/plain");
    ds(ds_addr, "PUT", "/d0", &[plain, ("stream-ttl", "0")], b"").expect(400);
    ds(
        ds_addr,
        "PUT",
        "/dpast",
        &[plain, ("stream-expires-at", "2001-01-01T00:00:00Z")],
        b"",
    )
    .expect(400);
    ds(
        ds_addr,
        "PUT",
        "/dfuture",
        &[plain, ("stream-expires-at", "2100-01-01T00:00:00Z")],
        b"",
    )
    .expect(201);
    for name in ["/t0", "/past"] {
        server.head(name).expect(404);
    }
}
