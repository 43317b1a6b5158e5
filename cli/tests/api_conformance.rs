//! What scripts/api-check.sh (schemathesis on docs/openapi/) found in the node, pinned with
//! real sockets so it stays fixed without the Python tool.

mod common;

use std::net::SocketAddr;

use common::{Conn, Resp, Server};

fn send(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Resp {
    Conn::connect(addr)
        .expect("connect")
        .request(method, path, headers, body)
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
}

/// RFC 9110 (15.5.6): a 405 carries `Allow`, the methods the resource supports. Every listener
/// answered 405 without it (schemathesis' `unsupported_method` check, TRACE on each path).
#[test]
fn every_405_says_which_methods_are_allowed() {
    let server = Server::start(&["--ds-listen", "127.0.0.1:0"]);
    let ds = server.second.expect("the Durable Streams listener");
    server.put("/e", "text/plain").expect(201);
    let cases: [(SocketAddr, &str, &str, &str); 14] = [
        (
            server.addr,
            "TRACE",
            "/e",
            "GET, PUT, POST, PATCH, DELETE, HEAD, OPTIONS",
        ),
        (
            server.addr,
            "FOO",
            "/e",
            "GET, PUT, POST, PATCH, DELETE, HEAD, OPTIONS",
        ),
        (server.addr, "TRACE", "/", "GET, OPTIONS"),
        (server.addr, "DELETE", "/", "GET, OPTIONS"),
        (server.addr, "PATCH", "/", "GET, OPTIONS"),
        (
            ds,
            "TRACE",
            "/v1/stream/e",
            "GET, POST, PUT, DELETE, HEAD, OPTIONS",
        ),
        (ds, "GET", "/", "OPTIONS"),
        (server.admin, "TRACE", "/admin/cluster", "GET"),
        (server.admin, "PUT", "/admin/transfer", "POST"),
        // A GET of an admin route that takes another method was a 404 (no such asset).
        (server.admin, "GET", "/admin/transfer", "POST"),
        (server.admin, "GET", "/admin/nodes/1", "POST"),
        (server.admin, "HEAD", "/admin/streams/e", "GET"),
        (server.admin, "POST", "/admin/quarantine", "GET, DELETE"),
        (server.admin, "TRACE", "/", "GET, HEAD"),
    ];
    for (addr, method, path, allow) in cases {
        let r = send(addr, method, path, &[], b"");
        assert_eq!(r.status, 405, "{method} {path}: {}", r.describe());
        assert_eq!(
            r.header("allow"),
            Some(allow),
            "{method} {path}: {}",
            r.describe()
        );
        if method != "HEAD" {
            let error = &r.json()["error"];
            assert!(error.is_string() || error.is_object(), "{}", r.describe());
        }
        // Each method it names is served there (a 405 never names itself).
        for listed in allow.split(", ") {
            let r = send(addr, listed, path, &[], b"");
            assert_ne!(
                r.status,
                405,
                "{listed} {path} is in Allow: {}",
                r.describe()
            );
        }
    }
}

/// `{"slots": 2.0}` is an integer to JSON Schema (so to docs/openapi/admin.yaml and a client
/// generated from it), but the admin API answered `400 missing "slots"` (schemathesis'
/// `positive_data_acceptance` check). Integral numbers are taken; a fraction, a negative
/// number or a string is refused, and says so instead of "missing".
#[test]
fn admin_integers_may_be_written_as_integral_numbers() {
    let server = Server::start(&[]);
    server.put("/e", "text/plain").expect(201);
    let post = |path: &str, body: &str| {
        send(
            server.admin,
            "POST",
            path,
            &[("content-type", "application/json")],
            body.as_bytes(),
        )
    };
    let slots = post("/admin/nodes/1", r#"{"slots": 3.0}"#);
    assert_eq!(slots.status, 200, "{}", slots.describe());
    assert_eq!(slots.json()["slots"], 3);
    // A single node refuses the transfer itself, after reading toNode 2.0 as node 2.
    let refused = post("/admin/transfer", r#"{"stream": "/e", "toNode": 2.0}"#);
    assert_eq!(refused.status, 400, "{}", refused.describe());
    assert_eq!(refused.json()["error"], "node 2 is not registered");
    for (path, body, message) in [
        (
            "/admin/nodes/1",
            r#"{"slots": 2.5}"#,
            r#""slots" must be a non-negative integer"#,
        ),
        (
            "/admin/nodes/1",
            r#"{"slots": -1}"#,
            r#""slots" must be a non-negative integer"#,
        ),
        (
            "/admin/nodes/1",
            r#"{"slots": "2"}"#,
            r#""slots" must be a non-negative integer"#,
        ),
        ("/admin/nodes/1", r#"{}"#, r#"missing "slots""#),
        ("/admin/nodes/1", r#"{"slots": null}"#, r#"missing "slots""#),
        (
            "/admin/transfer",
            r#"{"stream": "/e", "toNode": 1e300}"#,
            r#""toNode" must be a non-negative integer"#,
        ),
    ] {
        let r = post(path, body);
        assert_eq!(r.status, 400, "{body}: {}", r.describe());
        assert_eq!(r.json()["error"], message, "{body}");
    }
}

/// A subscription naming a stream that was deleted while a fork still reads it (a `410` for
/// every request to it) was a `503 UNAVAILABLE`, a server error for a client's request, on
/// create, on adding streams and on an ack. Such a stream is gone for clients, as one never
/// created is: it is watched from the start, like a stream yet to be made.
#[test]
fn a_subscription_may_name_a_stream_deleted_under_its_forks() {
    let server = Server::start(&["--ds-listen", "127.0.0.1:0"]);
    let ds = server.second.expect("the Durable Streams listener");
    let root = "/v1/stream/";
    common::ds(
        ds,
        "PUT",
        "/v1/stream/src",
        &[("content-type", "text/plain")],
        b"a",
    )
    .expect(201);
    common::ds(
        ds,
        "PUT",
        "/v1/stream/fork",
        &[("stream-forked-from", "/v1/stream/src")],
        b"",
    )
    .expect(201);
    common::ds(ds, "DELETE", "/v1/stream/src", &[], b"").expect(204);
    common::ds(ds, "HEAD", "/v1/stream/src", &[], b"").expect(410);
    let json = [("content-type", "application/json")];
    let subscriptions = format!("{root}__ds/subscriptions");
    let created = common::ds(
        ds,
        "PUT",
        &format!("{subscriptions}/s1"),
        &json,
        br#"{"type":"pull-wake","streams":["src"],"wake_stream":"wake"}"#,
    );
    assert_eq!(created.status, 201, "{}", created.describe());
    let links = &created.json()["streams"];
    assert_eq!(links[0]["path"], "src", "{}", created.describe());
    assert_eq!(
        links[0]["acked_offset"],
        "0000000000000000_0000000000000000"
    );
    let created = common::ds(
        ds,
        "PUT",
        &format!("{subscriptions}/s2"),
        &json,
        br#"{"type":"pull-wake","streams":["other"],"wake_stream":"wake"}"#,
    );
    assert_eq!(created.status, 201, "{}", created.describe());
    let added = common::ds(
        ds,
        "POST",
        &format!("{subscriptions}/s2/streams"),
        &json,
        br#"{"streams":["src"]}"#,
    );
    assert_eq!(added.status, 204, "{}", added.describe());
    // An ack naming it gets as far as the token check.
    let ack = common::ds(
        ds,
        "POST",
        &format!("{subscriptions}/s2/ack"),
        &[
            ("content-type", "application/json"),
            ("authorization", "Bearer x"),
        ],
        br#"{"acks":[{"stream":"src","offset":"0000000000000000_0000000000000000"}]}"#,
    );
    assert_eq!(ack.status, 401, "{}", ack.describe());
}
