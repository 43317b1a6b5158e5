//! End-to-end tests of the Pico protocol against a real `pico serve` over real sockets:
//! exact status codes, headers and bodies (docs/api.md).

mod common;

use std::time::{Duration, Instant};

use common::{
    base64, decode_binary_read, encode_binary_batch, BatchRecord, Conn, ReadRecord, Resp, Server,
};

/// Flags of most tests: one core keeps the shared machine calm.
const ONE_CORE: &[&str] = &["--cores", "1"];

/// Headers every Pico response carries (the opening of docs/api.md).
#[track_caller]
fn common_headers(r: &Resp) {
    assert_eq!(
        r.header("x-content-type-options"),
        Some("nosniff"),
        "{}",
        r.describe()
    );
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("*"),
        "{}",
        r.describe()
    );
    assert_eq!(
        r.header("cross-origin-resource-policy"),
        Some("same-origin"),
        "{}",
        r.describe()
    );
    let expose = r.h("access-control-expose-headers").to_ascii_lowercase();
    for name in ["pico-next-seq", "pico-start-seq", "pico-timestamp", "etag"] {
        assert!(
            expose.contains(name),
            "expose headers lack {name}: {expose}"
        );
    }
}

/// One request on a fresh connection; checks the common headers.
#[track_caller]
fn req(s: &Server, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Resp {
    let r = s.request(method, path, headers, body);
    common_headers(&r);
    r
}

/// One request on `conn`; checks the common headers.
#[track_caller]
fn on(conn: &mut Conn, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Resp {
    let r = conn
        .request(method, path, headers, body)
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
    common_headers(&r);
    r
}

#[track_caller]
fn create(s: &Server, name: &str, content_type: &str) -> Resp {
    let r = req(s, "PUT", name, &[("content-type", content_type)], b"");
    r.expect(201);
    r
}

/// Appends one record; returns (start, next, timestamp).
#[track_caller]
fn append(s: &Server, name: &str, body: &[u8]) -> (u64, u64, i64) {
    let r = req(s, "POST", name, &[], body);
    r.expect(200);
    (
        r.h_u64("pico-start-seq"),
        r.h_u64("pico-next-seq"),
        r.h_i64("pico-timestamp"),
    )
}

#[track_caller]
fn error_message(r: &Resp, status: u16, code: &str, message: &str) -> serde_json::Value {
    let body = r.expect_error(status, code);
    assert_eq!(body["message"], message, "{}", r.describe());
    body
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

#[test]
fn create_is_idempotent_and_validated() {
    let s = Server::start(ONE_CORE);

    let r = create(&s, "/c/one", "text/plain");
    assert_eq!(r.header("location"), Some("/c/one"));
    assert_eq!(r.header("pico-next-seq"), Some("0"));
    assert_eq!(r.header("content-type"), Some("text/plain"));
    assert_eq!(r.header("cache-control"), Some("no-store"));
    assert_eq!(r.header("pico-closed"), None);
    assert!(r.body.is_empty());

    // Same configuration: 200, no Location.
    let r = req(&s, "PUT", "/c/one", &[("content-type", "text/plain")], b"");
    r.expect(200);
    assert_eq!(r.header("location"), None);
    assert_eq!(r.header("pico-next-seq"), Some("0"));
    assert_eq!(r.header("content-type"), Some("text/plain"));
    // Parameters and case of the MIME base are ignored.
    req(
        &s,
        "PUT",
        "/c/one",
        &[("content-type", "TEXT/Plain; charset=utf-8")],
        b"",
    )
    .expect(200);

    // A different content type: 409 conflict with the tail.
    append(&s, "/c/one", b"x");
    let r = req(
        &s,
        "PUT",
        "/c/one",
        &[("content-type", "application/json")],
        b"",
    );
    let body = error_message(
        &r,
        409,
        "conflict",
        "stream exists with content type text/plain",
    );
    assert_eq!(body["next_seq"], 1);
    assert_eq!(r.header("pico-next-seq"), Some("1"));
    assert_eq!(r.header("cache-control"), Some("no-store"));

    // A different TTL is a conflict too.
    let r = req(
        &s,
        "PUT",
        "/c/one",
        &[("content-type", "text/plain"), ("pico-ttl", "60")],
        b"",
    );
    r.expect_error(409, "conflict");

    // No content type: application/octet-stream.
    let r = req(&s, "PUT", "/c/octet", &[], b"");
    r.expect(201);
    assert_eq!(r.header("content-type"), Some("application/octet-stream"));

    // The root cannot be created.
    let r = req(&s, "PUT", "/", &[("content-type", "text/plain")], b"");
    error_message(&r, 400, "bad_request", "cannot create the root stream");

    // A body given with PUT becomes the first record.
    let r = req(
        &s,
        "PUT",
        "/c/with-body",
        &[("content-type", "text/plain")],
        b"first record",
    );
    r.expect(201);
    assert_eq!(r.header("pico-next-seq"), Some("1"));
    assert_eq!(r.header("location"), Some("/c/with-body"));
    let r = req(&s, "GET", "/c/with-body?format=raw", &[], b"");
    r.expect(200);
    assert_eq!(r.body, b"first record");
    assert_eq!(r.header("content-type"), Some("text/plain"));
    let json = req(&s, "GET", "/c/with-body", &[], b"").json();
    assert_eq!(json.as_array().unwrap().len(), 1);
    assert_eq!(json[0]["seq"], 0);
    assert_eq!(json[0]["body"], "first record");

    // Strict integers for Pico-TTL.
    for bad in ["01", "-1", "abc", "1.5", "+3", "99999999999999999999"] {
        let r = req(
            &s,
            "PUT",
            "/c/ttl-bad",
            &[("content-type", "text/plain"), ("pico-ttl", bad)],
            b"",
        );
        error_message(&r, 400, "bad_request", "invalid Pico-TTL");
    }
    // TTL and Expires-At together.
    let r = req(
        &s,
        "PUT",
        "/c/both",
        &[
            ("pico-ttl", "60"),
            ("pico-expires-at", "2100-01-01T00:00:00Z"),
        ],
        b"",
    );
    error_message(
        &r,
        400,
        "bad_request",
        "Pico-TTL and Pico-Expires-At both set",
    );
    let r = req(
        &s,
        "PUT",
        "/c/exp-bad",
        &[("pico-expires-at", "tomorrow")],
        b"",
    );
    error_message(&r, 400, "bad_request", "invalid Pico-Expires-At");
    // None of the refused creates exists.
    for name in ["/c/ttl-bad", "/c/both", "/c/exp-bad"] {
        req(&s, "HEAD", name, &[], b"").expect(404);
    }

    // TTL and expiry are reported by HEAD and the listing; an expiry given with a UTC offset
    // is reported in UTC.
    create_with(&s, "/c/ttl", &[("pico-ttl", "3600")]);
    let r = req(&s, "HEAD", "/c/ttl", &[], b"");
    r.expect(200);
    assert_eq!(r.header("pico-ttl"), Some("3600"));
    assert_eq!(r.header("pico-expires-at"), None);
    create_with(
        &s,
        "/c/expires",
        &[("pico-expires-at", "2100-01-01T00:00:00+02:00")],
    );
    let r = req(&s, "HEAD", "/c/expires", &[], b"");
    r.expect(200);
    assert_eq!(r.header("pico-expires-at"), Some("2099-12-31T22:00:00Z"));
    assert_eq!(r.header("pico-ttl"), None);
    let list = req(&s, "GET", "/?prefix=/c/", &[], b"").json();
    let entry = |name: &str| {
        list["streams"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("{name} not listed: {list}"))
    };
    assert_eq!(entry("/c/ttl")["ttl"], 3600);
    assert_eq!(entry("/c/expires")["expires_at"], "2099-12-31T22:00:00Z");
    assert!(entry("/c/one").get("ttl").is_none());

    // Created closed.
    let r = create_with(&s, "/c/closed", &[("pico-closed", "TRUE")]);
    assert_eq!(r.header("pico-closed"), Some("true"));
    let r = req(&s, "HEAD", "/c/closed", &[], b"");
    assert_eq!(r.header("pico-closed"), Some("true"));
}

#[track_caller]
fn create_with(s: &Server, name: &str, headers: &[(&str, &str)]) -> Resp {
    let mut all = vec![("content-type", "text/plain")];
    all.extend_from_slice(headers);
    let r = req(s, "PUT", name, &all, b"");
    r.expect(201);
    r
}

/// The stream of `appends_and_reads`: 7 records in 4 requests, mixed forms.
struct Fixture {
    /// Timestamps of the four requests.
    ts: [i64; 4],
}

fn fill_fixture(s: &Server, name: &str) -> Fixture {
    create(s, name, "text/plain");
    let (start, next, t0) = append(s, name, b"one");
    assert_eq!((start, next), (0, 1));
    // A Content-Type that is not a batch type: the body is one record.
    let r = req(s, "POST", name, &[("content-type", "text/plain")], b"two");
    r.expect(200);
    assert_eq!(r.header("pico-start-seq"), Some("1"));
    assert_eq!(r.header("pico-next-seq"), Some("2"));
    assert_eq!(r.header("cache-control"), Some("no-store"));
    assert_eq!(r.header("pico-closed"), None);
    let t1 = r.h_i64("pico-timestamp");

    // Binary batch: headers given unsorted come back sorted; a non-UTF-8 body.
    let batch = encode_binary_batch(&[
        BatchRecord {
            headers: &[("b", "2"), ("a", "1")],
            body: b"three",
        },
        BatchRecord {
            headers: &[],
            body: &[0xff, 0x00, 0x80],
        },
    ]);
    let r = req(
        s,
        "POST",
        name,
        &[("content-type", "application/vnd.picomq.batch")],
        &batch,
    );
    r.expect(200);
    assert_eq!(r.header("pico-start-seq"), Some("2"));
    assert_eq!(r.header("pico-next-seq"), Some("4"));
    let t2 = r.h_i64("pico-timestamp");

    // JSON batch: non-string header values as compact JSON, body_b64, an empty record.
    let json = br#"{"records":[{"headers":{"k":"v","n":5},"body":"five"},{"body_b64":"AAECgP8=","body":"ignored"},{}],"extra":1}"#;
    let r = req(
        s,
        "POST",
        name,
        &[(
            "content-type",
            "Application/Vnd.Picomq.Batch+JSON; charset=utf-8",
        )],
        json,
    );
    r.expect(200);
    assert_eq!(r.header("pico-start-seq"), Some("4"));
    assert_eq!(r.header("pico-next-seq"), Some("7"));
    let t3 = r.h_i64("pico-timestamp");

    // Timestamps strictly increase per stream across requests.
    assert!(
        t0 < t1 && t1 < t2 && t2 < t3,
        "timestamps {t0} {t1} {t2} {t3}"
    );
    let now = now_ms();
    assert!(
        (t0 - now).abs() < 60_000,
        "timestamp {t0} far from the clock {now}"
    );
    Fixture {
        ts: [t0, t1, t2, t3],
    }
}

fn expected_json(f: &Fixture, from: usize, to: usize) -> String {
    let [t0, t1, t2, t3] = f.ts;
    let all = [
        format!(r#"{{"seq":0,"timestamp":{t0},"body":"one"}}"#),
        format!(r#"{{"seq":1,"timestamp":{t1},"body":"two"}}"#),
        format!(r#"{{"seq":2,"timestamp":{t2},"headers":{{"a":"1","b":"2"}},"body":"three"}}"#),
        format!(r#"{{"seq":3,"timestamp":{t2},"body_b64":"/wCA"}}"#),
        format!(r#"{{"seq":4,"timestamp":{t3},"headers":{{"k":"v","n":"5"}},"body":"five"}}"#),
        format!(r#"{{"seq":5,"timestamp":{t3},"body_b64":"AAECgP8="}}"#),
        format!(r#"{{"seq":6,"timestamp":{t3},"body":""}}"#),
    ];
    format!("[{}]", all[from..to].join(","))
}

fn expected_records(f: &Fixture) -> Vec<ReadRecord> {
    let [t0, t1, t2, t3] = f.ts;
    let rec = |seq: u64, timestamp: i64, headers: &[(&str, &str)], body: &[u8]| ReadRecord {
        seq,
        timestamp,
        headers: headers
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect(),
        body: body.to_vec(),
    };
    vec![
        rec(0, t0, &[], b"one"),
        rec(1, t1, &[], b"two"),
        rec(2, t2, &[("a", "1"), ("b", "2")], b"three"),
        rec(3, t2, &[], &[0xff, 0x00, 0x80]),
        rec(4, t3, &[("k", "v"), ("n", "5")], b"five"),
        rec(5, t3, &[], &[0, 1, 2, 0x80, 0xff]),
        rec(6, t3, &[], b""),
    ]
}

#[test]
fn appends_and_reads_in_every_format() {
    let s = Server::start(ONE_CORE);
    let name = "/logs/app";
    let f = fill_fixture(&s, name);

    // json (the default)
    let r = req(&s, "GET", name, &[], b"");
    r.expect(200);
    assert_eq!(r.text(), expected_json(&f, 0, 7));
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(r.header("pico-next-seq"), Some("7"));
    assert_eq!(r.header("pico-up-to-date"), Some("true"));
    assert_eq!(r.header("pico-closed"), None);
    assert_eq!(r.header("pico-cursor"), None);
    assert_eq!(
        r.header("cache-control"),
        Some("public, max-age=60, stale-while-revalidate=300")
    );
    let r2 = req(&s, "GET", &format!("{name}?format=json&seq=0"), &[], b"");
    assert_eq!(r2.body, r.body);

    // binary
    let r = req(&s, "GET", &format!("{name}?format=binary"), &[], b"");
    r.expect(200);
    assert_eq!(
        r.header("content-type"),
        Some("application/vnd.picomq.batch")
    );
    common::assert_records_eq(
        "binary read",
        &decode_binary_read(&r.body),
        &expected_records(&f),
    );
    assert_eq!(r.header("pico-next-seq"), Some("7"));

    // raw: bodies concatenated, the stream's content type
    let r = req(&s, "GET", &format!("{name}?format=raw"), &[], b"");
    r.expect(200);
    assert_eq!(r.header("content-type"), Some("text/plain"));
    let mut raw = b"onetwothree\xff\x00\x80five".to_vec();
    raw.extend_from_slice(&[0, 1, 2, 0x80, 0xff]);
    assert_eq!(r.body, raw);

    // count
    let r = req(&s, "GET", &format!("{name}?count=2"), &[], b"");
    assert_eq!(r.text(), expected_json(&f, 0, 2));
    assert_eq!(r.header("pico-next-seq"), Some("2"));
    assert_eq!(r.header("pico-up-to-date"), None);
    let r = req(&s, "GET", &format!("{name}?seq=2&count=3"), &[], b"");
    assert_eq!(r.text(), expected_json(&f, 2, 5));
    assert_eq!(r.header("pico-next-seq"), Some("5"));
    // count=0 means unlimited
    let r = req(&s, "GET", &format!("{name}?seq=5&count=0"), &[], b"");
    assert_eq!(r.text(), expected_json(&f, 5, 7));
    assert_eq!(r.header("pico-up-to-date"), Some("true"));

    // bytes: at least one record always comes back
    let r = req(&s, "GET", &format!("{name}?bytes=1"), &[], b"");
    assert_eq!(r.text(), expected_json(&f, 0, 1));
    assert_eq!(r.header("pico-next-seq"), Some("1"));
    let r = req(
        &s,
        "GET",
        &format!("{name}?seq=3&bytes=1&format=raw"),
        &[],
        b"",
    );
    assert_eq!(r.body, [0xff, 0x00, 0x80]);
    assert_eq!(r.header("pico-next-seq"), Some("4"));

    // seq=now: the tail, empty
    let r = req(&s, "GET", &format!("{name}?seq=now"), &[], b"");
    r.expect(200);
    assert_eq!(r.text(), "[]");
    assert_eq!(r.header("pico-next-seq"), Some("7"));
    assert_eq!(r.header("pico-up-to-date"), Some("true"));
    let r = req(
        &s,
        "GET",
        &format!("{name}?seq=NOW&format=binary"),
        &[],
        b"",
    );
    assert_eq!(r.body, [1, 0, 0, 0, 0]);
    // At the tail: empty, not an error.
    let r = req(&s, "GET", &format!("{name}?seq=7"), &[], b"");
    r.expect(200);
    assert_eq!(r.text(), "[]");
    // Negative positions mean the beginning; leading zeros are accepted.
    let r = req(&s, "GET", &format!("{name}?seq=-1"), &[], b"");
    assert_eq!(r.text(), expected_json(&f, 0, 7));
    let r = req(&s, "GET", &format!("{name}?seq=-1000&count=1"), &[], b"");
    assert_eq!(r.text(), expected_json(&f, 0, 1));
    let r = req(&s, "GET", &format!("{name}?seq=0004&count=1"), &[], b"");
    assert_eq!(r.text(), expected_json(&f, 4, 5));

    // Past the tail: 400.
    let r = req(&s, "GET", &format!("{name}?seq=8"), &[], b"");
    r.expect_error(400, "bad_request");
    assert!(r.json().get("next_seq").is_none(), "{}", r.describe());
    let r = req(&s, "GET", &format!("{name}?seq=1000000"), &[], b"");
    r.expect_error(400, "bad_request");

    // Bad parameters.
    let r = req(&s, "GET", &format!("{name}?format=xml"), &[], b"");
    error_message(&r, 400, "bad_request", "invalid format: xml");
    let r = req(&s, "GET", &format!("{name}?seq=abc"), &[], b"");
    error_message(&r, 400, "bad_request", "invalid offset token: abc");
    let r = req(&s, "GET", &format!("{name}?seq="), &[], b"");
    error_message(&r, 400, "bad_request", "empty offset");
    let r = req(&s, "GET", &format!("{name}?count=01"), &[], b"");
    error_message(&r, 400, "bad_request", "invalid count");
    let r = req(&s, "GET", &format!("{name}?bytes=-5"), &[], b"");
    error_message(&r, 400, "bad_request", "invalid bytes");
    let r = req(&s, "GET", &format!("{name}?live=forever"), &[], b"");
    error_message(&r, 400, "bad_request", "invalid live mode: forever");
    // Query keys: first occurrence wins, percent-decoding applies.
    let r = req(&s, "GET", &format!("{name}?seq=6&seq=0"), &[], b"");
    assert_eq!(r.text(), expected_json(&f, 6, 7));
    let r = req(&s, "GET", &format!("{name}?%73eq=%36"), &[], b"");
    assert_eq!(r.text(), expected_json(&f, 6, 7));

    // Last-Event-ID is the position when there is no seq parameter.
    let r = req(&s, "GET", name, &[("last-event-id", "5")], b"");
    assert_eq!(r.text(), expected_json(&f, 5, 7));
    let r = req(
        &s,
        "GET",
        &format!("{name}?seq=6"),
        &[("last-event-id", "1")],
        b"",
    );
    assert_eq!(r.text(), expected_json(&f, 6, 7));
    let r = req(&s, "GET", name, &[("last-event-id", "x1")], b"");
    error_message(&r, 400, "bad_request", "invalid offset token: x1");

    // ETag and If-None-Match.
    let r = req(&s, "GET", &format!("{name}?seq=2&count=2"), &[], b"");
    let tag = base64(format!("{name}:json").as_bytes());
    let etag = format!("\"{tag}:{:020}:{:020}\"", 2, 4);
    assert_eq!(r.header("etag"), Some(etag.as_str()));
    let r = req(
        &s,
        "GET",
        &format!("{name}?seq=2&count=2"),
        &[("if-none-match", &etag)],
        b"",
    );
    r.expect(304);
    assert!(r.body.is_empty());
    assert_eq!(r.header("etag"), Some(etag.as_str()));
    assert_eq!(r.header("pico-next-seq"), Some("4"));
    // The format is part of the tag; a different tag reads normally.
    let r = req(
        &s,
        "GET",
        &format!("{name}?seq=2&count=2&format=raw"),
        &[("if-none-match", &etag)],
        b"",
    );
    r.expect(200);
    let raw_tag = base64(format!("{name}:raw").as_bytes());
    assert_eq!(
        r.header("etag"),
        Some(format!("\"{raw_tag}:{:020}:{:020}\"", 2, 4).as_str())
    );
    let r = req(
        &s,
        "GET",
        &format!("{name}?seq=2&count=2"),
        &[("if-none-match", "\"something-else\"")],
        b"",
    );
    r.expect(200);
    assert_eq!(r.text(), expected_json(&f, 2, 4));
}

#[test]
fn read_byte_budgets() {
    let s = Server::start(&["--cores", "1", "--max-chunk-size", "4500"]);
    create(&s, "/budget", "application/octet-stream");
    let bodies: Vec<Vec<u8>> = (0..10u8).map(|i| vec![b'a' + i; 1000]).collect();
    for body in &bodies {
        append(&s, "/budget", body);
    }
    // Reads `query` in raw format and checks it returned exactly records [from, to).
    let check = |query: &str, from: usize, to: usize| {
        let r = req(&s, "GET", &format!("/budget?format=raw&{query}"), &[], b"");
        r.expect(200);
        assert_eq!(
            r.h_u64("pico-next-seq"),
            to as u64,
            "{query}: Pico-Next-Seq"
        );
        assert!(
            r.body == bodies[from..to].concat(),
            "{query}: expected the bodies of records {from}..{to}, got {} bytes",
            r.body.len()
        );
        let up_to_date = r.header("pico-up-to-date") == Some("true");
        assert_eq!(up_to_date, to == bodies.len(), "{query}: Pico-Up-To-Date");
    };
    // Whole records only, as many as fit (each costs its body plus a small overhead).
    check("bytes=2500", 0, 2);
    check("seq=8&bytes=2500", 8, 10);
    // A budget below one record still returns one.
    check("seq=3&bytes=10", 3, 4);
    // count and bytes together: whichever stops first.
    check("count=1&bytes=100000", 0, 1);
    check("count=5&bytes=3500", 0, 3);
    check("count=2&bytes=3500", 0, 2);
    // Without bytes (or bytes=0) the budget is --max-chunk-size: 4 of these records fit.
    check("", 0, 4);
    check("bytes=0", 0, 4);
    check("seq=4", 4, 8);
    // An explicit budget may exceed --max-chunk-size (up to 4 MiB).
    check("bytes=100000", 0, 10);
}

#[test]
fn timestamps_strictly_increase_on_one_connection_and_pipelined() {
    let s = Server::start(ONE_CORE);
    create(&s, "/ts", "text/plain");
    let mut conn = s.connect();
    let mut last = 0i64;
    for i in 0..30u64 {
        let r = on(&mut conn, "POST", "/ts", &[], format!("r{i}").as_bytes());
        r.expect(200);
        assert_eq!(r.h_u64("pico-start-seq"), i);
        let t = r.h_i64("pico-timestamp");
        assert!(t > last, "timestamp {t} after {last}");
        last = t;
    }
    // Ten appends written at once: answered in order, offsets and timestamps increase.
    let mut all = Vec::new();
    for i in 0..10 {
        all.extend(common::encode_request(
            "POST",
            "/ts",
            &[],
            format!("p{i}").as_bytes(),
        ));
    }
    conn.raw(&all).unwrap();
    for i in 0..10u64 {
        let r = conn.read_response(false).unwrap();
        common_headers(&r);
        r.expect(200);
        assert_eq!(r.h_u64("pico-start-seq"), 30 + i);
        let t = r.h_i64("pico-timestamp");
        assert!(t > last, "timestamp {t} after {last}");
        last = t;
    }
    let (records, next) = common::read_all(&s, "/ts", 0);
    assert_eq!(next, 40);
    for pair in records.windows(2) {
        assert!(pair[0].timestamp < pair[1].timestamp);
    }
}

#[test]
fn long_poll_times_out() {
    let s = Server::start(&["--cores", "1", "--long-poll-timeout-sec", "1"]);
    create(&s, "/lp", "text/plain");
    append(&s, "/lp", b"a");

    // Behind the tail: answers at once with data.
    let r = req(&s, "GET", "/lp?seq=0&live=long-poll", &[], b"");
    r.expect(200);
    assert_eq!(r.json()[0]["body"], "a");
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(r.header("pico-next-seq"), Some("1"));
    assert_eq!(r.header("pico-up-to-date"), Some("true"));
    assert_eq!(r.header("cache-control"), Some("no-store"));
    assert_eq!(r.header("etag"), None);
    assert!(r.header("pico-cursor").unwrap().parse::<u64>().is_ok());

    // Nothing arrives: 204 after the timeout with the tail and a cursor.
    let started = Instant::now();
    let r = req(&s, "GET", "/lp?seq=1&live=long-poll", &[], b"");
    let waited = started.elapsed();
    r.expect(204);
    assert!(r.body.is_empty());
    assert_eq!(r.header("pico-next-seq"), Some("1"));
    assert_eq!(r.header("pico-up-to-date"), Some("true"));
    assert_eq!(r.header("pico-closed"), None);
    assert_eq!(r.header("cache-control"), Some("no-store"));
    let cursor: u64 = r.h_u64("pico-cursor");
    // Never before the timeout; the client's read timeout bounds how long after.
    assert!(
        waited >= Duration::from_millis(900),
        "timed out after {waited:?}"
    );
    // Echoing the cursor gives a larger one; seq=now waits at the tail too.
    let started = Instant::now();
    let r = req(
        &s,
        "GET",
        &format!("/lp?seq=now&live=long-poll&cursor={cursor}"),
        &[],
        b"",
    );
    r.expect(204);
    assert!(started.elapsed() >= Duration::from_millis(900));
    assert!(r.h_u64("pico-cursor") > cursor, "{}", r.describe());

    // Missing stream: 404.
    let r = req(&s, "GET", "/lp-missing?live=long-poll", &[], b"");
    r.expect_error(404, "not_found");

    // Closed and at the tail: 204 at once with Pico-Closed, no wait for the timeout. On a node
    // whose timeout is far longer than any scheduling delay, an answer before it is "at once"
    // however busy the machine is.
    let s = Server::start(&["--cores", "1", "--long-poll-timeout-sec", "120"]);
    create(&s, "/lp", "text/plain");
    append(&s, "/lp", b"a");
    req(&s, "POST", "/lp", &[("pico-closed", "true")], b"").expect(200);
    let started = Instant::now();
    let r = req(&s, "GET", "/lp?seq=1&live=long-poll", &[], b"");
    r.expect(204);
    assert_eq!(r.header("pico-closed"), Some("true"));
    assert_eq!(r.header("pico-next-seq"), Some("1"));
    assert!(
        started.elapsed() < Duration::from_secs(120),
        "a closed stream must not wait"
    );
}

#[test]
fn long_poll_is_woken_by_appends_and_closes() {
    // A long timeout: an answer well before it can only come from a wake-up.
    let s = Server::start(&["--cores", "1", "--long-poll-timeout-sec", "20"]);
    create(&s, "/lp", "text/plain");
    append(&s, "/lp", b"a");

    // At the tail: waits for an append made on another connection.
    let addr = s.addr;
    let writer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        let mut conn = Conn::connect(addr).unwrap();
        let r = conn.request("POST", "/lp", &[], b"b").unwrap();
        r.expect(200);
        r.h_i64("pico-timestamp")
    });
    let started = Instant::now();
    let r = req(&s, "GET", "/lp?seq=1&live=long-poll&format=raw", &[], b"");
    let waited = started.elapsed();
    let timestamp = writer.join().unwrap();
    r.expect(200);
    assert_eq!(r.body, b"b");
    assert_eq!(r.header("content-type"), Some("text/plain"));
    assert_eq!(r.header("pico-next-seq"), Some("2"));
    assert_eq!(r.header("pico-up-to-date"), Some("true"));
    assert_eq!(r.header("cache-control"), Some("no-store"));
    assert!(r.header("pico-cursor").is_some());
    assert!(
        waited >= Duration::from_millis(250) && waited < Duration::from_secs(15),
        "answered after {waited:?}"
    );
    let json = req(&s, "GET", "/lp?seq=1", &[], b"").json();
    assert_eq!(json[0]["timestamp"], timestamp);

    // A waiter is woken by a close: 204 with Pico-Closed.
    let closer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        let mut conn = Conn::connect(addr).unwrap();
        conn.request("POST", "/lp", &[("pico-closed", "true")], b"")
            .unwrap()
            .expect(200);
    });
    let started = Instant::now();
    let r = req(&s, "GET", "/lp?seq=2&live=long-poll", &[], b"");
    let waited = started.elapsed();
    closer.join().unwrap();
    r.expect(204);
    assert_eq!(r.header("pico-closed"), Some("true"));
    assert_eq!(r.header("pico-next-seq"), Some("2"));
    assert!(
        waited < Duration::from_secs(15),
        "the close must wake the waiter, took {waited:?}"
    );

    // A waiter is woken by a delete: 404.
    create(&s, "/lp-del", "text/plain");
    let deleter = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        let mut conn = Conn::connect(addr).unwrap();
        conn.request("DELETE", "/lp-del", &[], b"")
            .unwrap()
            .expect(204);
    });
    let started = Instant::now();
    let r = req(&s, "GET", "/lp-del?live=long-poll", &[], b"");
    let waited = started.elapsed();
    deleter.join().unwrap();
    r.expect(404);
    assert!(
        waited < Duration::from_secs(15),
        "the delete must wake the waiter, took {waited:?}"
    );
}

#[test]
fn head_and_delete() {
    let s = Server::start(ONE_CORE);
    create(&s, "/h", "application/x-thing; v=2");
    append(&s, "/h", b"1");
    append(&s, "/h", b"2");

    let mut conn = s.connect();
    let r = on(&mut conn, "HEAD", "/h", &[], b"");
    r.expect(200);
    assert_eq!(r.header("pico-next-seq"), Some("2"));
    assert_eq!(r.header("pico-start-seq"), Some("0"));
    assert_eq!(r.header("content-type"), Some("application/x-thing; v=2"));
    assert_eq!(r.header("cache-control"), Some("no-store"));
    assert_eq!(r.header("pico-closed"), None);
    // HEAD of a missing stream: 404 and no body on the wire (the next response on the same
    // connection parses cleanly).
    let r = on(&mut conn, "HEAD", "/missing", &[], b"");
    r.expect(404);
    let r = on(&mut conn, "GET", "/h?format=raw", &[], b"");
    r.expect(200);
    assert_eq!(r.body, b"12");

    let r = on(&mut conn, "DELETE", "/h", &[], b"");
    r.expect(204);
    assert!(r.body.is_empty());
    let r = on(&mut conn, "DELETE", "/h", &[], b"");
    error_message(&r, 404, "not_found", "no such stream");
    let r = on(&mut conn, "GET", "/h", &[], b"");
    error_message(&r, 404, "not_found", "no such stream");
    let r = on(&mut conn, "POST", "/h", &[], b"x");
    error_message(&r, 404, "not_found", "no such stream");
    on(&mut conn, "HEAD", "/h", &[], b"").expect(404);
    let list = on(&mut conn, "GET", "/", &[], b"").json();
    assert_eq!(list["streams"].as_array().unwrap().len(), 0, "{list}");

    // Recreated: a new stream from offset 0 with the new content type.
    let r = on(
        &mut conn,
        "PUT",
        "/h",
        &[("content-type", "text/plain")],
        b"",
    );
    r.expect(201);
    assert_eq!(r.header("pico-next-seq"), Some("0"));
    let r = on(&mut conn, "POST", "/h", &[], b"again");
    r.expect(200);
    assert_eq!(r.header("pico-start-seq"), Some("0"));
    assert_eq!(r.header("pico-next-seq"), Some("1"));
    let r = on(&mut conn, "GET", "/h?format=raw", &[], b"");
    assert_eq!(r.body, b"again");
    assert_eq!(r.header("content-type"), Some("text/plain"));
}

#[test]
fn close_rules() {
    let s = Server::start(ONE_CORE);
    create(&s, "/cl", "text/plain");
    append(&s, "/cl", b"a");

    // Close-only.
    let r = req(&s, "POST", "/cl", &[("pico-closed", "true")], b"");
    r.expect(200);
    assert_eq!(r.header("pico-closed"), Some("true"));
    assert_eq!(r.header("pico-next-seq"), Some("1"));
    assert_eq!(r.header("pico-start-seq"), None);
    assert_eq!(r.header("pico-timestamp"), None);

    // Appending to a closed stream.
    let r = req(&s, "POST", "/cl", &[], b"b");
    let body = error_message(&r, 409, "closed", "stream is closed");
    assert_eq!(body["next_seq"], 1);
    assert_eq!(r.header("pico-closed"), Some("true"));
    assert_eq!(r.header("pico-next-seq"), Some("1"));
    let r = req(&s, "POST", "/cl", &[("pico-closed", "true")], b"c");
    r.expect_error(409, "closed");

    // Reads: Pico-Closed only when the read reaches the tail.
    let r = req(&s, "GET", "/cl?seq=0", &[], b"");
    r.expect(200);
    assert_eq!(r.json()[0]["body"], "a");
    assert_eq!(r.header("pico-closed"), Some("true"));
    assert_eq!(r.header("pico-up-to-date"), Some("true"));
    let r = req(&s, "GET", "/cl?seq=1", &[], b"");
    r.expect(200);
    assert_eq!(r.text(), "[]");
    assert_eq!(r.header("pico-closed"), Some("true"));
    let tag = base64(b"/cl:json");
    assert_eq!(
        r.header("etag"),
        Some(format!("\"{tag}:{:020}:{:020}:c\"", 1, 1).as_str())
    );

    // Closing again is idempotent.
    let r = req(&s, "POST", "/cl", &[("pico-closed", "true")], b"");
    r.expect(200);
    assert_eq!(r.header("pico-closed"), Some("true"));
    assert_eq!(r.header("pico-next-seq"), Some("1"));
    let r = req(&s, "HEAD", "/cl", &[], b"");
    assert_eq!(r.header("pico-closed"), Some("true"));
    assert_eq!(r.header("pico-next-seq"), Some("1"));
    // A create must match the closed flag.
    req(&s, "PUT", "/cl", &[("content-type", "text/plain")], b"").expect_error(409, "conflict");
    let r = req(
        &s,
        "PUT",
        "/cl",
        &[("content-type", "text/plain"), ("pico-closed", "true")],
        b"",
    );
    r.expect(200);
    assert_eq!(r.header("pico-closed"), Some("true"));

    // Append and close in one request.
    create(&s, "/cl2", "text/plain");
    let r = req(&s, "POST", "/cl2", &[("pico-closed", "true")], b"last");
    r.expect(200);
    assert_eq!(r.header("pico-start-seq"), Some("0"));
    assert_eq!(r.header("pico-next-seq"), Some("1"));
    assert_eq!(r.header("pico-closed"), Some("true"));
    assert!(r.header("pico-timestamp").is_some());
    let r = req(&s, "GET", "/cl2?format=raw", &[], b"");
    assert_eq!(r.body, b"last");
    assert_eq!(r.header("pico-closed"), Some("true"));
    // Pico-Closed is only "true" when it says so.
    create(&s, "/cl3", "text/plain");
    let r = req(&s, "POST", "/cl3", &[("pico-closed", "yes")], b"x");
    r.expect(200);
    assert_eq!(r.header("pico-closed"), None);
    let list = req(&s, "GET", "/?prefix=/cl", &[], b"").json();
    let closed: Vec<_> = list["streams"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["name"].as_str().unwrap().to_string(), e["closed"].clone()))
        .collect();
    assert_eq!(
        closed,
        vec![
            ("/cl".to_string(), serde_json::json!(true)),
            ("/cl2".to_string(), serde_json::json!(true)),
            ("/cl3".to_string(), serde_json::json!(false)),
        ]
    );
}

#[test]
fn conditional_append() {
    let s = Server::start(ONE_CORE);
    create(&s, "/m", "text/plain");
    let r = req(&s, "POST", "/m", &[("pico-match-seq", "0")], b"a");
    r.expect(200);
    assert_eq!(r.header("pico-start-seq"), Some("0"));
    let r = req(&s, "POST", "/m", &[("pico-match-seq", "0")], b"b");
    let body = error_message(
        &r,
        412,
        "match_failed",
        "match failed: expected tail 0, actual 1",
    );
    assert_eq!(body["next_seq"], 1);
    assert_eq!(r.header("pico-next-seq"), Some("1"));
    let r = req(&s, "POST", "/m", &[("pico-match-seq", "5")], b"b");
    r.expect_error(412, "match_failed");
    let r = req(&s, "POST", "/m", &[("pico-match-seq", "1")], b"b");
    r.expect(200);
    assert_eq!(r.header("pico-start-seq"), Some("1"));
    let r = req(&s, "POST", "/m", &[("pico-match-seq", "01")], b"c");
    error_message(&r, 400, "bad_request", "invalid Pico-Match-Seq");
    // A failed condition writes nothing.
    let r = req(&s, "GET", "/m?format=raw", &[], b"");
    assert_eq!(r.body, b"ab");
    assert_eq!(r.header("pico-next-seq"), Some("2"));
}

#[test]
fn listing() {
    let s = Server::start(ONE_CORE);
    for name in ["/list/c", "/list/a", "/list/b", "/other", "/list"] {
        create(&s, name, "text/plain");
    }
    create(&s, "/list/j", "application/json");
    for i in 0..3 {
        append(&s, "/list/b", format!("{i}").as_bytes());
    }

    let r = req(&s, "GET", "/", &[], b"");
    r.expect(200);
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(r.header("cache-control"), Some("no-store"));
    let names = |v: &serde_json::Value| -> Vec<String> {
        v["streams"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["name"].as_str().unwrap().to_string())
            .collect()
    };
    let all = r.json();
    assert_eq!(
        names(&all),
        ["/list", "/list/a", "/list/b", "/list/c", "/list/j", "/other"]
    );
    assert_eq!(all["has_more"], false);

    // The listing reports live offsets; exact entries.
    let r = req(&s, "GET", "/?prefix=/list/", &[], b"");
    assert_eq!(
        r.json(),
        serde_json::json!({"streams":[
            {"name":"/list/a","content_type":"text/plain","start_seq":0,"next_seq":0,"closed":false},
            {"name":"/list/b","content_type":"text/plain","start_seq":0,"next_seq":3,"closed":false},
            {"name":"/list/c","content_type":"text/plain","start_seq":0,"next_seq":0,"closed":false},
            {"name":"/list/j","content_type":"application/json","start_seq":0,"next_seq":0,"closed":false}
        ],"has_more":false})
    );
    let r = req(&s, "GET", "/?prefix=%2Flist%2F&limit=2", &[], b"");
    let page = r.json();
    assert_eq!(names(&page), ["/list/a", "/list/b"]);
    assert_eq!(page["has_more"], true);
    let r = req(
        &s,
        "GET",
        "/?prefix=/list/&limit=2&start_after=/list/b",
        &[],
        b"",
    );
    let page = r.json();
    assert_eq!(names(&page), ["/list/c", "/list/j"]);
    assert_eq!(page["has_more"], false);
    let r = req(&s, "GET", "/?prefix=/list/&start_after=/list/j", &[], b"");
    assert_eq!(r.json(), serde_json::json!({"streams":[],"has_more":false}));
    // limit=0 is the default.
    let r = req(&s, "GET", "/?limit=0", &[], b"");
    assert_eq!(names(&r.json()).len(), 6);
    let r = req(&s, "GET", "/?prefix=/nothing", &[], b"");
    assert_eq!(r.json(), serde_json::json!({"streams":[],"has_more":false}));
    let r = req(&s, "GET", "/?limit=x", &[], b"");
    error_message(&r, 400, "bad_request", "invalid limit");

    // The root has no other operations.
    let r = req(&s, "POST", "/", &[], b"x");
    error_message(&r, 400, "bad_request", "no stream in path");
}

#[test]
fn options_and_cors() {
    let s = Server::start(ONE_CORE);
    for path in ["/", "/anything/at/all"] {
        let r = req(
            &s,
            "OPTIONS",
            path,
            &[
                ("origin", "http://example.com"),
                ("access-control-request-method", "POST"),
            ],
            b"",
        );
        r.expect(204);
        assert!(r.body.is_empty());
        assert_eq!(
            r.header("access-control-allow-methods"),
            Some("GET, PUT, POST, PATCH, DELETE, HEAD, OPTIONS")
        );
        let allow = r.h("access-control-allow-headers").to_ascii_lowercase();
        for name in [
            "content-type",
            "authorization",
            "if-none-match",
            "pico-match-seq",
            "pico-ttl",
            "pico-expires-at",
            "pico-closed",
            "pico-retention-age",
            "pico-retention-bytes",
            "pico-delete-on-empty",
        ] {
            assert!(allow.contains(name), "allow-headers lacks {name}: {allow}");
        }
        assert_eq!(r.header("cache-control"), Some("no-store"));
    }
}

#[test]
fn request_errors() {
    let s = Server::start(ONE_CORE);
    create(&s, "/e", "text/plain");

    let r = req(&s, "TRACE", "/e", &[], b"x");
    error_message(&r, 405, "method_not_allowed", "method not allowed");
    for method in ["DELETE", "TRACE", "PATCH"] {
        let r = req(&s, method, "/", &[], b"");
        r.expect_error(405, "method_not_allowed");
    }
    let r = req(&s, "GET", "/nope", &[], b"");
    error_message(&r, 404, "not_found", "no such stream");
    // The CLI's `7d` is not the header's syntax: the refusal says what is.
    let r = req(
        &s,
        "PUT",
        "/week",
        &[("content-type", "text/plain"), ("pico-retention-age", "7d")],
        b"",
    );
    error_message(
        &r,
        400,
        "bad_request",
        "invalid Pico-Retention-Age: expected whole seconds (604800 is 7 days); 0 turns the limit off",
    );
    let r = req(&s, "POST", "/nope", &[], b"x");
    error_message(&r, 404, "not_found", "no such stream");
    let r = req(&s, "POST", "/e", &[], b"");
    error_message(&r, 400, "bad_request", "empty body");

    let json_batch = [("content-type", "application/vnd.picomq.batch+json")];
    let r = req(&s, "POST", "/e", &json_batch, b"{\"records\":[");
    error_message(&r, 400, "bad_request", "invalid JSON");
    let r = req(&s, "POST", "/e", &json_batch, b"{\"records\":[]}");
    error_message(&r, 400, "bad_request", "records must be a non-empty array");
    let r = req(&s, "POST", "/e", &json_batch, b"[1,2]");
    error_message(&r, 400, "bad_request", "records must be a non-empty array");
    let r = req(
        &s,
        "POST",
        "/e",
        &json_batch,
        b"{\"records\":[{\"body_b64\":\"***\"}]}",
    );
    error_message(&r, 400, "bad_request", "record 0: invalid body_b64");

    let binary = [("content-type", "application/vnd.picomq.batch")];
    let good = encode_binary_batch(&[
        BatchRecord {
            headers: &[("h", "v")],
            body: b"hello",
        },
        BatchRecord {
            headers: &[],
            body: b"world",
        },
    ]);
    for cut in [1, 3, 5, 9, 14, 20, good.len() - 1] {
        let r = req(&s, "POST", "/e", &binary, &good[..cut]);
        error_message(&r, 400, "bad_request", "truncated payload");
    }
    let mut bad_version = good.clone();
    bad_version[0] = 2;
    let r = req(&s, "POST", "/e", &binary, &bad_version);
    error_message(&r, 400, "bad_request", "unknown batch version 2");
    let mut bad_utf8 = encode_binary_batch(&[BatchRecord {
        headers: &[("k", "v")],
        body: b"",
    }]);
    // The header name byte "k" sits after version, count, header count and name length.
    bad_utf8[1 + 4 + 4 + 4] = 0xff;
    let r = req(&s, "POST", "/e", &binary, &bad_utf8);
    error_message(&r, 400, "bad_request", "invalid UTF-8 in headers");
    // Trailing bytes after the last record are ignored.
    let mut trailing = good.clone();
    trailing.extend_from_slice(b"junk");
    let r = req(&s, "POST", "/e", &binary, &trailing);
    r.expect(200);
    assert_eq!(r.header("pico-start-seq"), Some("0"));
    assert_eq!(r.header("pico-next-seq"), Some("2"));

    // Nothing of the refused requests was written.
    let r = req(&s, "GET", "/e?format=raw", &[], b"");
    assert_eq!(r.body, b"helloworld");

    // Stream names longer than the limit.
    let long = format!("/{}", "x".repeat(2000));
    let r = req(&s, "PUT", &long, &[], b"");
    r.expect_error(400, "bad_request");
}

#[test]
fn body_size_limit() {
    let s = Server::start(&["--cores", "1", "--max-body-size", "1024"]);
    create(&s, "/big", "application/octet-stream");
    let exact = vec![b'x'; 1024];
    let r = req(&s, "POST", "/big", &[], &exact);
    r.expect(200);

    let mut conn = s.connect();
    let r = on(&mut conn, "POST", "/big", &[], &vec![b'y'; 1025]);
    r.expect_error(413, "too_large");
    // The connection is closed after a 413 (the body cannot be skipped safely).
    assert!(conn.at_eof(), "connection still open after 413");

    // A body that follows its refusal is discarded, as far as its Content-Length goes, and
    // then the connection closes at once, without waiting out the drain's 5 s for more bytes
    // a client keeping the connection open never sends (which would race this check's 5 s).
    let mut conn = s.connect();
    conn.raw(b"POST /big HTTP/1.1\r\nhost: x\r\ncontent-length: 3000\r\n\r\n")
        .unwrap();
    let r = conn.read_response(false).unwrap();
    r.expect_error(413, "too_large");
    conn.raw(&[b'w'; 3000]).unwrap();
    assert!(
        conn.at_eof(),
        "connection still open after its refused body"
    );

    // With Expect: 100-continue the 413 comes before the body is sent.
    let mut conn = s.connect();
    conn.raw(
        b"POST /big HTTP/1.1\r\nhost: x\r\ncontent-length: 5000\r\nexpect: 100-continue\r\n\r\n",
    )
    .unwrap();
    let r = conn.read_response(false).unwrap();
    common_headers(&r);
    r.expect_error(413, "too_large");

    // Chunked bodies are limited too.
    let mut conn = s.connect();
    let mut chunked =
        b"POST /big HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
    for _ in 0..3 {
        chunked.extend_from_slice(b"200\r\n");
        chunked.extend_from_slice(&[b'z'; 0x200]);
        chunked.extend_from_slice(b"\r\n");
    }
    chunked.extend_from_slice(b"0\r\n\r\n");
    conn.raw(&chunked).unwrap();
    let r = conn.read_response(false).unwrap();
    r.expect_error(413, "too_large");

    // Only the 1024-byte record was written; the server still serves.
    let r = req(&s, "HEAD", "/big", &[], b"");
    assert_eq!(r.header("pico-next-seq"), Some("1"));
}

#[test]
fn malformed_requests_do_not_stop_the_server() {
    let s = Server::start(ONE_CORE);
    create(&s, "/mal", "text/plain");
    // A keep-alive connection opened before the garbage keeps working after it.
    let mut bystander = s.connect();
    on(&mut bystander, "POST", "/mal", &[], b"before").expect(200);

    let garbage: &[&[u8]] = &[
        b"GARBAGE\r\n\r\n",
        b"GET / HTTP/9.9\r\n\r\n",
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n",
        b"POST /mal HTTP/1.1\r\ncontent-length: abc\r\n\r\n",
        b"POST /mal HTTP/1.1\r\ncontent-length: 3\r\ncontent-length: 4\r\n\r\nabcd",
        b"POST /mal HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n",
        b"GET relative HTTP/1.1\r\n\r\n",
        b"GET /mal HTTP/1.1\r\nbad header line\r\n\r\n",
    ];
    for bytes in garbage {
        let mut conn = s.connect();
        conn.raw(bytes).unwrap();
        let r = conn
            .read_response(false)
            .unwrap_or_else(|e| panic!("no response to {:?}: {e}", String::from_utf8_lossy(bytes)));
        common_headers(&r);
        r.expect_error(400, "bad_request");
        assert!(
            conn.at_eof(),
            "connection still open after {:?}",
            String::from_utf8_lossy(bytes)
        );
    }
    // Unsupported transfer coding: 501.
    let mut conn = s.connect();
    conn.raw(b"POST /mal HTTP/1.1\r\ntransfer-encoding: gzip\r\n\r\n")
        .unwrap();
    let r = conn.read_response(false).unwrap();
    common_headers(&r);
    r.expect(501);
    // A request cut off mid-body by the client: the server just drops it.
    let mut conn = s.connect();
    conn.raw(b"POST /mal HTTP/1.1\r\ncontent-length: 100\r\n\r\nshort")
        .unwrap();
    conn.stream.shutdown(std::net::Shutdown::Write).unwrap();
    let _ = conn.read_response(false);

    // Still serving, on old and new connections; nothing but the good records was written.
    on(&mut bystander, "POST", "/mal", &[], b"after").expect(200);
    let r = req(&s, "GET", "/mal?format=raw", &[], b"");
    r.expect(200);
    assert_eq!(r.body, b"beforeafter");
}

#[test]
fn pipelining_chunked_and_expect_continue() {
    let s = Server::start(ONE_CORE);
    create(&s, "/p", "text/plain");
    let mut conn = s.connect();

    // Three requests in one write: answered in order.
    let mut both = common::encode_request("POST", "/p", &[], b"first");
    both.extend(common::encode_request("POST", "/p", &[], b"second"));
    both.extend(common::encode_request("GET", "/p?format=raw", &[], b""));
    conn.raw(&both).unwrap();
    let r1 = conn.read_response(false).unwrap();
    let r2 = conn.read_response(false).unwrap();
    let r3 = conn.read_response(false).unwrap();
    for r in [&r1, &r2, &r3] {
        common_headers(r);
        r.expect(200);
    }
    assert_eq!(r1.header("pico-start-seq"), Some("0"));
    assert_eq!(r2.header("pico-start-seq"), Some("1"));
    assert_eq!(r3.body, b"firstsecond");

    // A pipelined HEAD (no body on the wire) followed by a GET.
    let mut pair = common::encode_request("HEAD", "/p", &[], b"");
    pair.extend(common::encode_request(
        "GET",
        "/p?seq=1&format=raw",
        &[],
        b"",
    ));
    conn.raw(&pair).unwrap();
    let head = conn.read_response(true).unwrap();
    head.expect(200);
    assert_eq!(head.header("pico-next-seq"), Some("2"));
    let r = conn.read_response(false).unwrap();
    assert_eq!(r.body, b"second");

    // A chunked request body, with a chunk extension and a trailer.
    conn.raw(
        b"POST /p HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\nx-trailer: t\r\n\r\n",
    )
    .unwrap();
    let r = conn.read_response(false).unwrap();
    common_headers(&r);
    r.expect(200);
    assert_eq!(r.header("pico-start-seq"), Some("2"));

    // Expect: 100-continue: the interim response comes before the body is sent.
    conn.raw(b"POST /p HTTP/1.1\r\nhost: x\r\ncontent-length: 8\r\nexpect: 100-continue\r\n\r\n")
        .unwrap();
    let interim = conn.read_response(false).unwrap();
    assert_eq!(interim.status, 100, "{}", interim.describe());
    conn.raw(b"continue").unwrap();
    let r = conn.read_response(false).unwrap();
    common_headers(&r);
    r.expect(200);
    assert_eq!(r.header("pico-start-seq"), Some("3"));

    // Connection: close is honoured.
    conn.raw(b"GET /p?seq=2&format=raw HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .unwrap();
    let r = conn.read_response(false).unwrap();
    r.expect(200);
    assert_eq!(r.body, b"hello worldcontinue");
    assert_eq!(r.header("connection"), Some("close"));
    assert!(conn.at_eof());

    // HTTP/1.0 without keep-alive: one request per connection.
    let mut conn = s.connect();
    conn.raw(b"GET /p?count=1&format=raw HTTP/1.0\r\n\r\n")
        .unwrap();
    let r = conn.read_response(false).unwrap();
    r.expect(200);
    assert_eq!(r.body, b"first");
    assert!(conn.at_eof());
}

#[test]
fn large_reads_on_one_keep_alive_connection_arrive_intact() {
    // A response of many record buffers goes out in vectored writes that the socket takes in
    // pieces; the bytes, and the next response on the same connection, must come out whole.
    let s = Server::start(&["--cores", "1", "--max-body-size", "2097152"]);
    let mut conn = s.connect();
    assert_eq!(on(&mut conn, "PUT", "/big-h1", &[], b"").status, 201);
    let records: Vec<Vec<u8>> = (0..6u32)
        .map(|r| {
            (0..700_000 + 4099 * r)
                .map(|i| (i.wrapping_mul(11 + 2 * r) % 241) as u8)
                .collect()
        })
        .collect();
    for record in &records {
        let r = on(
            &mut conn,
            "POST",
            "/big-h1",
            &[("content-type", "application/octet-stream")],
            record,
        );
        assert_eq!(r.status, 200, "{}", r.describe());
    }
    for start in [0usize, 2, 0] {
        let r = on(
            &mut conn,
            "GET",
            &format!("/big-h1?format=raw&seq={start}&bytes=8388608"),
            &[],
            b"",
        );
        assert_eq!(r.status, 200, "{}", r.describe());
        let next: usize = r.h("pico-next-seq").parse().unwrap();
        assert!(next > start + 1, "several records in one response: {next}");
        let expected = records[start..next].concat();
        assert_eq!(r.body.len(), expected.len());
        assert!(r.body == expected, "bytes differ from seq {start}");
    }
}

/// A batch's content type is recognised by its base type, whatever its case and parameters:
/// a JSON batch sent so is two records, not one record of JSON text.
#[test]
fn batch_content_types_match_whatever_the_case_and_parameters() {
    let s = Server::start(&[]);
    s.put("/b", "application/octet-stream").expect(201);
    let json_batch = [(
        "content-type",
        " Application/VND.PicoMQ.Batch+JSON ; charset=utf-8",
    )];
    let r = req(
        &s,
        "POST",
        "/b",
        &json_batch,
        b"{\"records\":[{\"body\":\"a\"},{\"body\":\"b\"}]}",
    );
    r.expect(200);
    assert_eq!(r.h_u64("pico-next-seq") - r.h_u64("pico-start-seq"), 2);
}
