//! Named consumers and groups in the Pico protocol (`/?consumer=NAME`, docs/api.md) over a
//! real `pico serve`: registration, a group's members and their shares, acks by record number,
//! stale members refused, the lower-case error codes, and token grants on consumer names.

mod common;

use common::{Resp, Server};
use serde_json::{json, Value};

fn call(
    server: &Server,
    method: &str,
    query: &str,
    token: Option<&str>,
    body: Option<Value>,
) -> Resp {
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    common::json_request(
        server.addr,
        method,
        &format!("/?{query}"),
        token,
        body.as_bytes(),
    )
}

/// An ack of consumer query `q` with `token` (none: no token) of `offsets`.
fn ack(server: &Server, q: &str, token: Option<&str>, offsets: Value) -> Resp {
    call(
        server,
        "POST",
        &format!("{q}&action=ack"),
        token,
        Some(json!({ "offsets": offsets })),
    )
}

fn stream_with(server: &Server, name: &str, records: usize) {
    server.put(name, "text/plain").expect(201);
    for i in 0..records {
        server.post(name, format!("r{i}").as_bytes()).expect(200);
    }
}

fn assignment(view: &Value) -> Vec<String> {
    view["assignment"]
        .as_array()
        .expect("an assignment")
        .iter()
        .map(|s| s["stream"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn a_group_shares_its_streams_and_refuses_stale_members() {
    let server = Server::start(&[]);
    let streams = ["/orders/1", "/orders/2", "/orders/3", "/orders/4"];
    for s in streams {
        stream_with(&server, s, 3);
    }
    let q = "consumer=/orders/billing";
    let registered = call(
        &server,
        "PUT",
        q,
        None,
        Some(json!({"streams": streams, "group": true})),
    );
    registered.expect(201);
    assert_eq!(registered.json()["group"], true);
    assert_eq!(registered.json()["streams"][0]["offset"], -1);
    call(
        &server,
        "PUT",
        q,
        None,
        Some(json!({"streams": streams, "group": true})),
    )
    .expect(200);
    call(&server, "PUT", q, None, Some(json!({"streams": streams})))
        .expect_error(409, "consumer_already_exists");

    let a = call(
        &server,
        "POST",
        &format!("{q}&action=acquire&member=a"),
        None,
        None,
    );
    a.expect(200);
    let a = a.json();
    assert_eq!(assignment(&a).len(), 4);
    let a_token = a["token"].as_str().unwrap().to_string();
    let b = call(
        &server,
        "POST",
        &format!("{q}&action=acquire&member=b"),
        None,
        None,
    );
    b.expect(200);
    let b = b.json();
    let b_token = b["token"].as_str().unwrap().to_string();
    let b_streams = assignment(&b);
    assert_eq!(b_streams.len(), 2);

    // a learns of the rebalance at its next ack (a heartbeat).
    let beat = ack(&server, q, Some(&a_token), json!([]));
    beat.expect(200);
    let a_streams = assignment(&beat.json());
    assert_eq!(a_streams.len(), 2);
    assert!(a_streams.iter().all(|s| !b_streams.contains(s)));

    // Acks name the last record processed; a stream b holds is refused to a.
    let acked = ack(
        &server,
        q,
        Some(&a_token),
        json!([{"stream": a_streams[0], "offset": 1}]),
    );
    acked.expect(200);
    let cursor = acked.json()["streams"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["stream"] == a_streams[0].as_str())
        .cloned()
        .unwrap();
    assert_eq!(
        (cursor["offset"].as_i64(), cursor["next_seq"].as_u64()),
        (Some(1), Some(2))
    );
    ack(
        &server,
        q,
        Some(&a_token),
        json!([{"stream": b_streams[0], "offset": 0}]),
    )
    .expect_error(409, "stale_epoch");
    ack(
        &server,
        q,
        Some(&a_token),
        json!([{"stream": a_streams[0], "offset": 0}]),
    )
    .expect_error(409, "offset_regression");
    ack(
        &server,
        q,
        Some(&a_token),
        json!([{"stream": a_streams[0], "offset": 3}]),
    )
    .expect_error(409, "invalid_offset");
    ack(&server, q, None, json!([])).expect_error(401, "unauthorized");

    // b leaves: a holds everything again; b's token is stale.
    call(
        &server,
        "POST",
        &format!("{q}&action=release"),
        Some(&b_token),
        None,
    )
    .expect(200);
    let beat = ack(&server, q, Some(&a_token), json!([]));
    assert_eq!(assignment(&beat.json()).len(), 4);
    ack(&server, q, Some(&b_token), json!([])).expect_error(409, "stale_epoch");

    // Reading resumes where the consumer stands.
    let got = call(&server, "GET", q, None, None);
    got.expect(200);
    let members = got.json()["members"].as_array().unwrap().clone();
    assert_eq!(members.len(), 1);
    assert_eq!(members[0]["member"], "a");
    call(&server, "POST", &format!("{q}&action=jump"), None, None).expect_error(400, "bad_request");
    call(
        &server,
        "PUT",
        "consumer=orders",
        None,
        Some(json!({"streams": streams})),
    )
    .expect_error(400, "bad_request");
    call(&server, "DELETE", q, None, None).expect(204);
    call(&server, "GET", q, None, None).expect_error(404, "consumer_not_found");
    // The listing of `/` is still the listing.
    server.get("/").expect(200);
}

#[test]
fn a_single_reader_consumer_resumes_after_kill_9() {
    let mut server = Server::start(&[]);
    stream_with(&server, "/logs", 5);
    let q = "consumer=/logs/shipper";
    call(
        &server,
        "PUT",
        q,
        None,
        Some(json!({"streams": ["/logs"], "lease_ttl_ms": 600000})),
    )
    .expect(201);
    let acquired = call(&server, "POST", &format!("{q}&action=acquire"), None, None);
    acquired.expect(200);
    let token = acquired.json()["token"].as_str().unwrap().to_string();
    ack(
        &server,
        q,
        Some(&token),
        json!([{"stream": "/logs", "offset": 2}]),
    )
    .expect(200);
    // Operators see where it stands: 5 records, 3 acknowledged.
    let admin = |path: &str| {
        common::Conn::connect(server.admin)
            .unwrap()
            .request("GET", path, &[], b"")
            .unwrap()
    };
    let listed = admin("/admin/consumers");
    listed.expect(200);
    let consumer = listed.json()["consumers"][0].clone();
    assert_eq!(consumer["consumer"], "/logs/shipper");
    assert_eq!(consumer["protocol"], "pico");
    assert_eq!(consumer["streams"][0]["lag"], 2);
    let metrics = admin("/metrics").text();
    assert!(metrics.contains("pico_consumers 1\n"), "{metrics}");
    assert!(
        metrics.contains(
            "pico_consumer_lag_records{scope=\"\",consumer=\"/logs/shipper\",stream=\"/logs\"} 2\n"
        ),
        "{metrics}"
    );
    server.kill();
    server.restart();
    let got = call(&server, "GET", q, None, None);
    got.expect(200);
    let view = got.json();
    assert_eq!(view["state"], "READING");
    assert_eq!(view["streams"][0]["next_seq"], 3);
    ack(
        &server,
        q,
        Some(&token),
        json!([{"stream": "/logs", "offset": 4}]),
    )
    .expect(200);
}

/// What a consumer counted in a stream belongs to that stream: once it is deleted and a stream
/// by its name created again, the consumer has processed nothing of the new one, in its view,
/// its acks, the operators' report and across a restart.
#[test]
fn a_consumer_begins_anew_in_a_stream_deleted_and_created_again() {
    let mut server = Server::start(&[]);
    stream_with(&server, "/feed", 5);
    stream_with(&server, "/other", 5);
    let q = "consumer=/feed/reader";
    call(
        &server,
        "PUT",
        q,
        None,
        Some(json!({"streams": ["/feed", "/other"], "lease_ttl_ms": 600000})),
    )
    .expect(201);
    let acquired = call(&server, "POST", &format!("{q}&action=acquire"), None, None);
    acquired.expect(200);
    let token = acquired.json()["token"].as_str().unwrap().to_string();
    let offsets = json!([{"stream": "/feed", "offset": 3}, {"stream": "/other", "offset": 2}]);
    ack(&server, q, Some(&token), offsets).expect(200);

    server.delete("/feed").expect(204);
    // Deleted: where it stood stays shown, and nothing can be acknowledged past -1.
    let view = call(&server, "GET", q, None, None).json();
    assert_eq!(view["streams"][0]["offset"], 3, "{view}");
    let past = ack(
        &server,
        q,
        Some(&token),
        json!([{"stream": "/feed", "offset": 4}]),
    );
    assert_eq!(past.status, 409, "{}", past.describe());
    let said = past.json()["message"].as_str().unwrap().to_string();
    assert!(said.contains("(after record 4) is past"), "{said}");
    stream_with(&server, "/feed", 2);
    let view = call(&server, "GET", q, None, None).json();
    assert_eq!(view["streams"][0]["offset"], -1, "{view}");
    assert_eq!(view["streams"][0]["next_seq"], 0, "{view}");
    assert_eq!(
        view["streams"][1]["offset"], 2,
        "the other stream kept: {view}"
    );
    let listed = common::Conn::connect(server.admin)
        .unwrap()
        .request("GET", "/admin/consumers", &[], b"")
        .unwrap();
    listed.expect(200);
    assert_eq!(listed.json()["consumers"][0]["streams"][0]["lag"], 2);
    // Its first record is acknowledged in the new stream (before, "behind the committed 4").
    ack(
        &server,
        q,
        Some(&token),
        json!([{"stream": "/feed", "offset": 0}]),
    )
    .expect(200);
    server.kill();
    server.restart();
    let view = call(&server, "GET", q, None, None).json();
    assert_eq!(view["streams"][0]["offset"], 0, "{view}");
    assert_eq!(view["streams"][1]["offset"], 2, "{view}");
    ack(
        &server,
        q,
        Some(&token),
        json!([{"stream": "/feed", "offset": 1}]),
    )
    .expect(200);
}

#[test]
fn a_token_reaches_the_consumers_its_grant_covers() {
    let (server, _tokens) =
        common::start_with_tokens("writer / read,append\nteam /team/ read\n", &[]);
    let writer = [("authorization", "Bearer writer")];
    server.request("PUT", "/team/a", &writer, b"").expect(201);
    server.request("PUT", "/other", &writer, b"").expect(201);
    let body = |streams: Value| Some(json!({ "streams": streams }));
    call(
        &server,
        "PUT",
        "consumer=/team/c",
        Some("team"),
        body(json!(["/team/a"])),
    )
    .expect(201);
    call(&server, "GET", "consumer=/team/c", Some("team"), None).expect(200);
    call(
        &server,
        "PUT",
        "consumer=/c",
        Some("team"),
        body(json!(["/team/a"])),
    )
    .expect_error(403, "forbidden");
    call(
        &server,
        "PUT",
        "consumer=/team/d",
        Some("team"),
        body(json!(["/other"])),
    )
    .expect_error(403, "forbidden");
    call(&server, "GET", "consumer=/team/c", None, None).expect_error(401, "unauthorized");
}

/// Consumers that each follow 256 streams of long names: the admin report and the scrape
/// read the consumers a page at a time and stop at their bounds (10,000 consumer streams),
/// saying the report is cut, instead of loading every document and writing a series per
/// consumer and stream (a scrape of 1,000 such consumers would hold about 1 GB).
#[test]
fn the_consumer_report_and_scrape_stay_bounded_however_many_streams_consumers_follow() {
    let server = Server::start(&[]);
    let long = "n".repeat(200);
    let streams: Vec<String> = (0..256).map(|i| format!("/wide/{long}/{i:03}")).collect();
    for stream in &streams {
        server.put(stream, "text/plain").expect(201);
    }
    let consumers = 41; // 41 × 256 = 10,496 consumer streams
    for c in 0..consumers {
        call(
            &server,
            "PUT",
            &format!("consumer=/wide/c{c:02}"),
            None,
            Some(json!({ "streams": streams })),
        )
        .expect(201);
    }
    let listed = server.admin_get("/admin/consumers");
    listed.expect(200);
    let listed = listed.json();
    assert_eq!(listed["total"], consumers);
    assert_eq!(listed["hasMore"], true, "cut at its bound");
    let reported: usize = listed["consumers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["streams"].as_array().unwrap().len())
        .sum();
    assert_eq!(reported, 10_000);
    let metrics = server.admin_get("/metrics").text();
    let series = metrics
        .lines()
        .filter(|l| l.starts_with("pico_consumer_lag_records{"))
        .count();
    assert_eq!(series, 10_000);
    assert!(metrics.contains(&format!("pico_consumers {consumers}\n")));
}
