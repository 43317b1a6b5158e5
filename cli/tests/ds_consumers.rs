//! Named consumers over a real `pico serve` (the draft Durable Streams "L1 named consumers"
//! API under `{root}__ds/consumers`): every status and code the API lists, the lease TTL and
//! heartbeats, multi-stream atomic acks, committed offsets across a `kill -9`, tenancy by root
//! and the node's token grants.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::{ds, Resp, Server};
use serde_json::{json, Value};

const ROOT: &str = "/v1/stream/";

fn control(
    addr: SocketAddr,
    method: &str,
    rest: &str,
    token: Option<&str>,
    body: Option<Value>,
) -> Resp {
    common::json_request(
        addr,
        method,
        &format!("{ROOT}__ds/{rest}"),
        token,
        body.map(|b| b.to_string()).unwrap_or_default().as_bytes(),
    )
}

/// Creates `name` under the root with `records` text records; the offset after each.
fn stream_with(addr: SocketAddr, name: &str, records: usize) -> Vec<String> {
    let path = format!("{ROOT}{name}");
    ds(addr, "PUT", &path, &[("content-type", "text/plain")], b"").expect(201);
    (0..records)
        .map(|i| {
            let appended = ds(
                addr,
                "POST",
                &path,
                &[("content-type", "text/plain")],
                format!("r{i}").as_bytes(),
            );
            appended.expect(204);
            appended.h("stream-next-offset").to_string()
        })
        .collect()
}

/// Asserts a Durable Streams error `{"error":{"code","message"}}` with this status.
trait DsError {
    fn expect_ds_error(&self, status: u16, code: &str) -> Value;
}

impl DsError for Resp {
    #[track_caller]
    fn expect_ds_error(&self, status: u16, code: &str) -> Value {
        self.expect(status);
        let body = self.json();
        assert_eq!(body["error"]["code"], code, "{}", self.describe());
        assert!(body["error"]["message"].is_string(), "{}", self.describe());
        body
    }
}

fn offsets_of(view: &Value) -> Vec<(String, String)> {
    view["streams"]
        .as_array()
        .expect("streams")
        .iter()
        .map(|s| {
            (
                s["path"].as_str().unwrap().to_string(),
                s["offset"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn acquire(addr: SocketAddr, id: &str) -> (String, Value) {
    let acquired = control(addr, "POST", &format!("consumers/{id}/acquire"), None, None);
    acquired.expect(200);
    let view = acquired.json();
    assert_eq!(view["state"], "READING");
    (view["token"].as_str().expect("a token").to_string(), view)
}

fn ack(addr: SocketAddr, id: &str, token: Option<&str>, offsets: Value) -> Resp {
    control(
        addr,
        "POST",
        &format!("consumers/{id}/ack"),
        token,
        Some(json!({ "offsets": offsets })),
    )
}

#[test]
fn the_consumer_api_answers_every_status_it_lists() {
    let server = Server::start(&[]);
    let addr = server.second.expect("a Durable Streams listener");
    let a = stream_with(addr, "a", 5);
    let b = stream_with(addr, "b", 3);
    let (pa, pb) = (format!("{ROOT}a"), format!("{ROOT}b"));
    let body = json!({"consumer_id": "billing", "streams": [pa, pb]});

    // Register: a new consumer starts before everything, though the streams hold data.
    let registered = control(addr, "POST", "consumers", None, Some(body.clone()));
    registered.expect(201);
    let view = registered.json();
    assert_eq!(view["state"], "REGISTERED");
    assert_eq!(
        offsets_of(&view),
        [(pa.clone(), "-1".into()), (pb.clone(), "-1".into())]
    );
    control(addr, "POST", "consumers", None, Some(body.clone())).expect(200);
    control(
        addr,
        "POST",
        "consumers",
        None,
        Some(json!({"consumer_id": "billing", "streams": [pa]})),
    )
    .expect_ds_error(409, "CONSUMER_ALREADY_EXISTS");
    for bad in [
        json!({"consumer_id": "__wh__:x", "streams": [pa]}),
        json!({"consumer_id": "x", "streams": "nope"}),
        json!({"consumer_id": "x", "streams": ["/elsewhere/s"]}),
    ] {
        control(addr, "POST", "consumers", None, Some(bad)).expect_ds_error(400, "INVALID_REQUEST");
    }
    common::json_request(
        addr,
        "POST",
        &format!("{ROOT}__ds/consumers"),
        None,
        b"{not json",
    )
    .expect_ds_error(400, "INVALID_REQUEST");
    control(addr, "GET", "consumers/nobody", None, None).expect_ds_error(404, "CONSUMER_NOT_FOUND");
    control(addr, "POST", "consumers/nobody/acquire", None, None)
        .expect_ds_error(404, "CONSUMER_NOT_FOUND");

    // Acquire, then acks: no token, inclusive offsets, atomic batches.
    let (token, _) = acquire(addr, "billing");
    ack(addr, "billing", None, json!([])).expect(401);
    let acked = ack(
        addr,
        "billing",
        Some(&token),
        json!([{"path": pa, "offset": a[2]}, {"path": pb, "offset": b[0]}]),
    );
    acked.expect(200);
    assert_eq!(
        offsets_of(&acked.json()),
        [(pa.clone(), a[2].clone()), (pb.clone(), b[0].clone())]
    );
    let regression = ack(
        addr,
        "billing",
        Some(&token),
        json!([{"path": pb, "offset": b[2]}, {"path": pa, "offset": a[1]}]),
    )
    .expect_ds_error(409, "OFFSET_REGRESSION");
    assert!(regression.to_string().contains(&pa), "{regression}");
    let past_tail = "0000000000000099_0000000000000000";
    ack(
        addr,
        "billing",
        Some(&token),
        json!([{"path": pa, "offset": past_tail}]),
    )
    .expect_ds_error(409, "INVALID_OFFSET");
    ack(
        addr,
        "billing",
        Some(&token),
        json!([{"path": format!("{ROOT}c"), "offset": "-1"}]),
    )
    .expect_ds_error(400, "UNKNOWN_STREAM");
    ack(addr, "billing", Some(&token), json!([{"path": pa}]))
        .expect_ds_error(400, "INVALID_REQUEST");
    // None of the refused acks moved anything (b stayed where the first ack put it).
    let got = control(addr, "GET", "consumers/billing", None, None);
    got.expect(200);
    assert_eq!(
        offsets_of(&got.json()),
        [(pa.clone(), a[2].clone()), (pb.clone(), b[0].clone())]
    );

    // A second acquire supersedes the first holder.
    let (second, view) = acquire(addr, "billing");
    assert_eq!(view["epoch"], 2);
    assert_eq!(offsets_of(&view)[0].1, a[2]);
    ack(addr, "billing", Some(&token), json!([])).expect_ds_error(409, "STALE_EPOCH");
    ack(
        addr,
        "billing",
        Some(&second),
        json!([{"path": pa, "offset": a[4]}]),
    )
    .expect(200);

    // Release keeps the offsets; the released holder is refused.
    let released = control(
        addr,
        "POST",
        "consumers/billing/release",
        Some(&second),
        None,
    );
    released.expect(200);
    assert_eq!(released.json()["state"], "REGISTERED");
    assert_eq!(offsets_of(&released.json())[0].1, a[4]);
    ack(addr, "billing", Some(&second), json!([])).expect_ds_error(409, "CONSUMER_NOT_READING");
    control(addr, "POST", "consumers/billing/release", None, None).expect(401);

    // A wake webhook of a type the API does not list, or to a URL the policy refuses, is a
    // bad request (`consumer_wakes.rs` tests the deliveries).
    for bad in [
        json!({"type": "email", "url": "http://127.0.0.1:9/"}),
        json!({"type": "webhook", "url": "http://10.0.0.1/"}),
        json!({"type": "webhook"}),
    ] {
        control(addr, "PUT", "consumers/billing/wake", None, Some(bad))
            .expect_ds_error(400, "INVALID_REQUEST");
    }
    control(addr, "POST", "consumers/billing/wake", None, None).expect(405);
    control(addr, "GET", "consumers/billing/acquire", None, None).expect(405);

    // Another root has consumers of its own: this one is not found there.
    common::json_request(addr, "GET", "/other/__ds/consumers/billing", None, b"")
        .expect_ds_error(404, "CONSUMER_NOT_FOUND");

    control(addr, "DELETE", "consumers/billing", None, None).expect(204);
    control(addr, "GET", "consumers/billing", None, None)
        .expect_ds_error(404, "CONSUMER_NOT_FOUND");
}

#[test]
fn a_lease_lapses_without_heartbeats_and_heartbeats_keep_it() {
    let server = Server::start(&[]);
    let addr = server.second.expect("a Durable Streams listener");
    let a = stream_with(addr, "a", 2);
    let pa = format!("{ROOT}a");
    let ttl_ms = 1_500;
    control(
        addr,
        "POST",
        "consumers",
        None,
        Some(json!({"consumer_id": "w", "streams": [pa], "lease_ttl_ms": ttl_ms})),
    )
    .expect(201);
    let (token, _) = acquire(addr, "w");
    // Heartbeats (empty acks) every third of the lease keep it for several leases.
    let until = Instant::now() + Duration::from_millis(3 * ttl_ms);
    while Instant::now() < until {
        let beat = ack(addr, "w", Some(&token), json!([]));
        beat.expect(200);
        assert_eq!(beat.json()["state"], "READING");
        assert_eq!(
            offsets_of(&beat.json())[0].1,
            "-1",
            "a heartbeat moves nothing"
        );
        std::thread::sleep(Duration::from_millis(ttl_ms / 3));
    }
    ack(
        addr,
        "w",
        Some(&token),
        json!([{"path": pa, "offset": a[0]}]),
    )
    .expect(200);
    // Silence past the lease: back to REGISTERED by itself, offsets kept.
    std::thread::sleep(Duration::from_millis(ttl_ms + 500));
    let got = control(addr, "GET", "consumers/w", None, None);
    got.expect(200);
    assert_eq!(got.json()["state"], "REGISTERED");
    assert_eq!(offsets_of(&got.json())[0].1, a[0]);
    ack(
        addr,
        "w",
        Some(&token),
        json!([{"path": pa, "offset": a[1]}]),
    )
    .expect_ds_error(409, "CONSUMER_NOT_READING");
}

/// A stream deleted and created again is another stream: the consumer's offset in it starts
/// at `-1`, and an offset of the new stream is acknowledged from there.
#[test]
fn a_consumer_begins_anew_in_a_stream_created_again() {
    let server = Server::start(&[]);
    let addr = server.second.expect("a Durable Streams listener");
    let old = stream_with(addr, "again", 4);
    let path = format!("{ROOT}again");
    control(
        addr,
        "POST",
        "consumers",
        None,
        Some(json!({"consumer_id": "n", "streams": [path]})),
    )
    .expect(201);
    let (token, _) = acquire(addr, "n");
    ack(
        addr,
        "n",
        Some(&token),
        json!([{"path": path, "offset": old[3]}]),
    )
    .expect(200);
    ds(addr, "DELETE", &path, &[], b"").expect(204);
    let new = stream_with(addr, "again", 2);
    let view = control(addr, "GET", "consumers/n", None, None).json();
    assert_eq!(offsets_of(&view)[0].1, "-1", "{view}");
    ack(
        addr,
        "n",
        Some(&token),
        json!([{"path": path, "offset": new[0]}]),
    )
    .expect(200);
    let view = control(addr, "GET", "consumers/n", None, None).json();
    assert_eq!(offsets_of(&view)[0].1, new[0], "{view}");
}

#[test]
fn committed_offsets_and_the_holder_survive_kill_9() {
    let mut server = Server::start(&[]);
    let addr = server.second.expect("a Durable Streams listener");
    let a = stream_with(addr, "a", 4);
    let pa = format!("{ROOT}a");
    control(
        addr,
        "POST",
        "consumers",
        None,
        Some(json!({"consumer_id": "k", "streams": [pa], "lease_ttl_ms": 600_000})),
    )
    .expect(201);
    let (token, _) = acquire(addr, "k");
    ack(
        addr,
        "k",
        Some(&token),
        json!([{"path": pa, "offset": a[2]}]),
    )
    .expect(200);
    server.kill();
    server.restart();
    let addr = server.second.expect("a Durable Streams listener");
    let got = control(addr, "GET", "consumers/k", None, None);
    got.expect(200);
    let view = got.json();
    assert_eq!(
        view["state"], "READING",
        "the lease is in the metadata log too"
    );
    assert_eq!(view["epoch"], 1);
    assert_eq!(offsets_of(&view)[0].1, a[2]);
    // The holder of before the crash goes on; reading from the committed offset resumes.
    ack(
        addr,
        "k",
        Some(&token),
        json!([{"path": pa, "offset": a[3]}]),
    )
    .expect(200);
    let resumed = common::ds_read(addr, &pa, &a[2]);
    resumed.expect(200);
    assert_eq!(resumed.text(), "r3");
}

#[test]
fn a_token_reaches_the_consumers_of_its_grant_only() {
    let (server, _tokens) = common::start_with_tokens(
        "writer / read,append\nteam /v1/stream/team/ read\nstranger /elsewhere/ read\n",
        &[],
    );
    let addr = server.second.expect("a Durable Streams listener");
    let writer = [
        ("authorization", "Bearer writer"),
        ("content-type", "text/plain"),
    ];
    for name in ["team/a", "other"] {
        ds(addr, "PUT", &format!("{ROOT}{name}"), &writer, b"").expect(201);
    }
    let team_root = format!("{ROOT}team/");
    let register = |root: &str, streams: Value| {
        common::json_request(
            addr,
            "POST",
            &format!("{root}__ds/consumers"),
            Some("team"),
            json!({"consumer_id": "c", "streams": streams})
                .to_string()
                .as_bytes(),
        )
    };
    // Under the grant's prefix: allowed.
    register(&team_root, json!([format!("{team_root}a")])).expect(201);
    common::json_request(
        addr,
        "GET",
        &format!("{team_root}__ds/consumers/c"),
        Some("team"),
        b"",
    )
    .expect(200);
    // A consumer at the wider root, or of a stream outside the grant: refused.
    register(ROOT, json!([format!("{ROOT}other")])).expect(403);
    common::json_request(
        addr,
        "GET",
        &format!("{team_root}__ds/consumers/c"),
        None,
        b"",
    )
    .expect(401);
    // Pointing its wake somewhere is the grant's too: refused without it, allowed with it.
    let wake = json!({"type": "webhook", "url": "http://127.0.0.1:9/"}).to_string();
    let wake_path = format!("{team_root}__ds/consumers/c/wake");
    common::json_request(addr, "PUT", &wake_path, None, wake.as_bytes()).expect(401);
    common::json_request(addr, "PUT", &wake_path, Some("stranger"), wake.as_bytes()).expect(403);
    common::json_request(addr, "PUT", &wake_path, Some("team"), wake.as_bytes()).expect(200);
}
