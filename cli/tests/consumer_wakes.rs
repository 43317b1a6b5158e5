//! Wake webhooks of named consumers over a real `pico serve`: an append past a consumer's
//! committed offset POSTs a new epoch's token to the receiver (signed, with the ack callback),
//! a running lease wakes nobody, a failed delivery gives the lease back and is retried, work
//! pending before the wake was set (or before a `kill -9`) is found, and both protocols serve
//! it.

mod common;

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::time::Duration;

use common::{ds, receiver, Delivery, Resp, Server};
use serde_json::{json, Value};

const ROOT: &str = "/v1/stream/";

fn next_delivery(rx: &mpsc::Receiver<Delivery>, server: &Server) -> Delivery {
    rx.recv_timeout(Duration::from_secs(20))
        .unwrap_or_else(|e| panic!("no wake delivery ({e}); log:\n{}", server.log()))
}

/// No delivery within `window` (the node wakes within a few hundred milliseconds when it does).
fn no_delivery(rx: &mpsc::Receiver<Delivery>, window: Duration) {
    if let Ok(delivery) = rx.recv_timeout(window) {
        panic!("an unexpected wake: {}", delivery.body);
    }
}

fn control(addr: SocketAddr, method: &str, rest: &str, token: Option<&str>, body: Value) -> Resp {
    let body = if body.is_null() {
        String::new()
    } else {
        body.to_string()
    };
    common::json_request(
        addr,
        method,
        &format!("{ROOT}__ds/{rest}"),
        token,
        body.as_bytes(),
    )
}

fn append(addr: SocketAddr, name: &str, text: &str) -> String {
    let appended = ds(
        addr,
        "POST",
        &format!("{ROOT}{name}"),
        &[("content-type", "text/plain")],
        text.as_bytes(),
    );
    appended.expect(204);
    appended.h("stream-next-offset").to_string()
}

fn create(addr: SocketAddr, name: &str) {
    ds(
        addr,
        "PUT",
        &format!("{ROOT}{name}"),
        &[("content-type", "text/plain")],
        b"",
    )
    .expect(201);
}

/// The path of a callback URL (`http://host/path`), to call it on `addr`.
fn path_of(url: &str) -> String {
    let after_scheme = url.split_once("://").expect("an absolute URL").1;
    after_scheme[after_scheme.find('/').expect("a path")..].to_string()
}

fn register(addr: SocketAddr, id: &str, streams: &[&str]) {
    let paths: Vec<String> = streams.iter().map(|s| format!("{ROOT}{s}")).collect();
    control(
        addr,
        "POST",
        "consumers",
        None,
        json!({"consumer_id": id, "streams": paths, "lease_ttl_ms": 5000}),
    )
    .expect(201);
}

#[test]
fn an_append_wakes_the_consumer_with_a_token_and_a_running_lease_wakes_nobody() {
    let server = Server::start(&[]);
    let addr = server.second.expect("a Durable Streams listener");
    create(addr, "a");
    create(addr, "b");
    register(addr, "billing", &["a", "b"]);
    let (url, _status, rx) = receiver();

    let set = control(
        addr,
        "PUT",
        "consumers/billing/wake",
        None,
        json!({"type": "webhook", "url": url}),
    );
    set.expect(200);
    assert_eq!(set.json()["wake"], json!({"type": "webhook", "url": url}));
    let described = control(addr, "GET", "consumers/billing", None, Value::Null);
    assert_eq!(described.json()["wake"]["url"], url.as_str());
    // Nothing to process yet: nobody is woken.
    no_delivery(&rx, Duration::from_millis(800));

    let tail = append(addr, "b", "first");
    let wake = next_delivery(&rx, &server);
    assert!(!wake.signature.is_empty(), "wakes are signed");
    let body = &wake.body;
    assert_eq!(body["consumer_id"], "billing");
    assert_eq!(body["primary_stream"], format!("{ROOT}b"));
    assert_eq!(body["epoch"], 1);
    let token = body["token"].as_str().expect("a token").to_string();
    let callback = body["callback"].as_str().expect("a callback").to_string();
    assert!(
        callback.ends_with(&format!("{ROOT}__ds/consumers/billing/ack")),
        "{callback}"
    );
    // The wake took the lease for the receiver.
    let view = control(addr, "GET", "consumers/billing", None, Value::Null).json();
    assert_eq!(view["state"], "READING");

    // While the receiver holds it, appends wake nobody.
    append(addr, "a", "second");
    no_delivery(&rx, Duration::from_millis(1200));

    // The receiver acks at the callback with the token and releases.
    let acked = common::json_request(
        addr,
        "POST",
        &path_of(&callback),
        Some(&token),
        json!({"offsets": [{"path": format!("{ROOT}b"), "offset": tail}]})
            .to_string()
            .as_bytes(),
    );
    acked.expect(200);
    control(
        addr,
        "POST",
        "consumers/billing/release",
        Some(&token),
        Value::Null,
    )
    .expect(200);
    // `a` has a record it has not processed: released, the consumer is woken again for it,
    // with a new epoch (the old token is stale).
    let again = next_delivery(&rx, &server);
    assert_eq!(again.body["primary_stream"], format!("{ROOT}a"));
    assert_eq!(again.body["epoch"], 2);
    let stale = control(
        addr,
        "POST",
        "consumers/billing/ack",
        Some(&token),
        json!({"offsets": []}),
    );
    stale.expect(409);
    assert_eq!(stale.json()["error"]["code"], "STALE_EPOCH");

    // Without its wake, the consumer is woken no more.
    let token = again.body["token"].as_str().unwrap().to_string();
    control(
        addr,
        "POST",
        "consumers/billing/release",
        Some(&token),
        Value::Null,
    )
    .expect(200);
    control(addr, "DELETE", "consumers/billing/wake", None, Value::Null).expect(200);
    let view = control(addr, "GET", "consumers/billing", None, Value::Null).json();
    assert!(view.get("wake").is_none(), "{view}");
    append(addr, "a", "third");
    no_delivery(&rx, Duration::from_millis(1200));
}

/// A consumer that had processed a stream's records is woken by the first append to a stream
/// created again by that name (its records are new to the consumer), and starts it at `-1`.
#[test]
fn the_first_append_to_a_stream_created_again_wakes_its_consumer() {
    let server = Server::start(&[]);
    let rx = processed_through_a_wake(&server, "again", &[]);
    no_delivery(&rx, Duration::from_millis(800));
    let addr = server.second.expect("a Durable Streams listener");
    ds(addr, "DELETE", &format!("{ROOT}r"), &[], b"").expect(204);
    created_again_wakes(&server, &rx);
    let view = control(addr, "GET", "consumers/again", None, Value::Null).json();
    assert_eq!(view["streams"][0]["offset"], "-1", "{view}");
}

/// A consumer that processed stream `r` through its wake, with the lease given back; `r` is
/// created with `r_headers`.
fn processed_through_a_wake(
    server: &Server,
    id: &str,
    r_headers: &[(&str, &str)],
) -> mpsc::Receiver<Delivery> {
    let addr = server.second.expect("a Durable Streams listener");
    let mut headers = vec![("content-type", "text/plain")];
    headers.extend_from_slice(r_headers);
    ds(addr, "PUT", &format!("{ROOT}r"), &headers, b"").expect(201);
    let (url, _status, rx) = receiver();
    register(addr, id, &["r"]);
    control(
        addr,
        "PUT",
        &format!("consumers/{id}/wake"),
        None,
        json!({"type": "webhook", "url": url}),
    )
    .expect(200);
    let mut tail = String::new();
    for i in 0..5 {
        tail = append(addr, "r", &format!("old-{i}"));
    }
    let wake = next_delivery(&rx, server);
    let token = wake.body["token"].as_str().unwrap().to_string();
    let path = format!("{ROOT}r");
    control(
        addr,
        "POST",
        &format!("consumers/{id}/ack"),
        Some(&token),
        json!({"offsets": [{"path": path, "offset": tail}]}),
    )
    .expect(200);
    control(
        addr,
        "POST",
        &format!("consumers/{id}/release"),
        Some(&token),
        Value::Null,
    )
    .expect(200);
    rx
}

/// `r` created again and its first record appended: the consumer is woken at once, starting
/// at the new stream's beginning.
fn created_again_wakes(server: &Server, rx: &mpsc::Receiver<Delivery>) {
    let addr = server.second.expect("a Durable Streams listener");
    create(addr, "r");
    append(addr, "r", "new-0");
    let wake = next_delivery(rx, server);
    assert_eq!(wake.body["primary_stream"], format!("{ROOT}r"));
    assert_eq!(wake.body["streams"][0]["offset"], "-1", "{}", wake.body);
}

/// A node that did not see the delete (here: the next start of the node, whose waker knows the
/// consumer only from the metadata log, where its cursor still counts in the deleted stream)
/// wakes the consumer at the new stream's first append, not once the new stream passes where
/// the consumer stood in the old one (a cluster node that serves the stream created again is
/// in the same place).
#[test]
fn a_node_that_did_not_see_the_delete_wakes_at_the_first_append_to_the_stream_created_again() {
    let mut server = Server::start(&[]);
    let rx = processed_through_a_wake(&server, "anew", &[]);
    let addr = server.second.expect("a Durable Streams listener");
    ds(addr, "DELETE", &format!("{ROOT}r"), &[], b"").expect(204);
    server.restart();
    // The waker has read the consumer (standing after record 4 of the deleted stream) and its
    // streams' tails before the stream is created again.
    std::thread::sleep(Duration::from_millis(1500));
    created_again_wakes(&server, &rx);
}

/// The same when the stream expired: the node's reaper deletes it and tells the waker nothing.
#[test]
fn a_stream_that_expired_and_was_created_again_wakes_its_consumer_at_its_first_append() {
    let server = Server::start(&[]);
    let rx = processed_through_a_wake(&server, "expired", &[("stream-ttl", "1")]);
    let addr = server.second.expect("a Durable Streams listener");
    common::wait_for("the stream to expire", Duration::from_secs(30), || {
        let head = ds(addr, "HEAD", &format!("{ROOT}r"), &[], b"");
        (head.status == 404).then_some(())
    });
    created_again_wakes(&server, &rx);
}

#[test]
fn a_failed_delivery_gives_the_lease_back_and_is_retried() {
    let server = Server::start(&[]);
    let addr = server.second.expect("a Durable Streams listener");
    create(addr, "a");
    register(addr, "c", &["a"]);
    let (url, status, rx) = receiver();
    status.store(500, Ordering::SeqCst);
    control(
        addr,
        "PUT",
        "consumers/c/wake",
        None,
        json!({"type": "webhook", "url": url}),
    )
    .expect(200);
    append(addr, "a", "x");
    let failed = next_delivery(&rx, &server);
    assert_eq!(failed.body["epoch"], 1);
    // The lease the wake took is given back: nobody reads for a receiver that failed.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let view = control(addr, "GET", "consumers/c", None, Value::Null).json();
        if view["state"] == "REGISTERED" {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "still {view} after a failed wake"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Tried again after the back-off, with a new epoch; the receiver now takes it.
    status.store(200, Ordering::SeqCst);
    let retried = next_delivery(&rx, &server);
    assert!(
        retried.body["epoch"].as_u64().unwrap() >= 2,
        "{}",
        retried.body
    );
    let view = control(addr, "GET", "consumers/c", None, Value::Null).json();
    assert_eq!(view["state"], "READING");
    // Operators see both.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let metrics = common::ds(server.admin, "GET", "/metrics", &[], b"").text();
        let delivered = metrics.contains("pico_consumer_wakes_total{result=\"delivered\"} 1\n");
        if delivered {
            assert!(
                !metrics.contains("pico_consumer_wakes_total{result=\"failed\"} 0\n"),
                "{metrics}"
            );
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{metrics}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn work_pending_before_the_wake_or_a_kill_9_is_found() {
    let mut server = Server::start(&[]);
    let addr = server.second.expect("a Durable Streams listener");
    create(addr, "a");
    register(addr, "late", &["a"]);
    append(addr, "a", "before the wake");
    let (url, _status, rx) = receiver();
    control(
        addr,
        "PUT",
        "consumers/late/wake",
        None,
        json!({"type": "webhook", "url": url}),
    )
    .expect(200);
    // No append after the wake was set: the node finds the record by itself.
    let first = next_delivery(&rx, &server);
    let token = first.body["token"].as_str().unwrap().to_string();
    control(
        addr,
        "POST",
        "consumers/late/release",
        Some(&token),
        Value::Null,
    )
    .expect(200);
    // The wake survives a kill -9; the work pending is found again after the restart.
    server.kill();
    server.restart();
    let addr = server.second.expect("a Durable Streams listener");
    let after = next_delivery(&rx, &server);
    assert_eq!(after.body["consumer_id"], "late");
    assert!(after.body["epoch"].as_u64().unwrap() >= 2);
    let view = control(addr, "GET", "consumers/late", None, Value::Null).json();
    assert_eq!(view["wake"]["url"], url.as_str());
}

#[test]
fn pico_consumers_have_wakes_too_and_groups_refuse_them() {
    let server = Server::start(&[]);
    server.put("/team/s", "text/plain").expect(201);
    let pico = |method: &str, query: &str, body: Value| {
        server.request(
            method,
            &format!("/?{query}"),
            &[("content-type", "application/json")],
            body.to_string().as_bytes(),
        )
    };
    pico(
        "PUT",
        "consumer=/team/billing",
        json!({"streams": ["/team/s"]}),
    )
    .expect(201);
    let (url, _status, rx) = receiver();
    pico(
        "PUT",
        "consumer=/team/billing&action=wake",
        json!({"type": "webhook", "url": url}),
    )
    .expect(200);
    server.post("/team/s", b"hello").expect(200);
    let wake = next_delivery(&rx, &server);
    assert_eq!(wake.body["primary_stream"], "/team/s");
    let callback = wake.body["callback"].as_str().unwrap();
    assert!(
        callback.ends_with("/?consumer=%2Fteam%2Fbilling&action=ack"),
        "{callback}"
    );
    let token = wake.body["token"].as_str().unwrap();
    let acked = server.request(
        "POST",
        &path_of(callback),
        &[
            ("content-type", "application/json"),
            ("pico-consumer-token", token),
        ],
        json!({"offsets": [{"stream": "/team/s", "offset": 0}]})
            .to_string()
            .as_bytes(),
    );
    acked.expect(200);
    assert_eq!(acked.json()["streams"][0]["next_seq"], 1);

    pico(
        "PUT",
        "consumer=/team/workers",
        json!({"streams": ["/team/s"], "group": true}),
    )
    .expect(201);
    pico(
        "PUT",
        "consumer=/team/workers&action=wake",
        json!({"type": "webhook", "url": url}),
    )
    .expect(400);
}
