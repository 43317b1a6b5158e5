//! End-to-end tests of the Pico protocol's rules (docs/api.md): a body with the create, TTL and
//! fixed expiry, long-poll, conditional appends, idempotent producers, trims, timestamps, the
//! listing, CORS, the body limit, and every row of the error table that can be reached, against
//! a real `pico serve` over real sockets. SSE is in `sse.rs`.
//!
//! Covered elsewhere: the Durable Streams protocol (`ds_protocol.rs`), auth (`auth.rs`), HTTP/2
//! (`http2.rs`), the `429` of `--max-in-flight-bytes` (`limits.rs`), `500`, `503` and `507`
//! of a failing WAL disk and the `507` of a full catalog disk (`storage_faults.rs`), the `/ready` `503` of a graceful shutdown
//! (`shutdown.rs`), the `408` of a body that never comes (`hostile.rs`) and the reclaiming of
//! the stored data of deleted, expired and trimmed streams (`gc.rs`). Not covered at all: the
//! `429` of 10 000 waiters on one stream (too many connections for a test).
//!
//! Every wait is bounded; every test has its own server (own ports and directory).

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::{at_a_pace_the_machine_keeps, encode_request, read_all, wait_for, Conn, Resp, Server};
use serde_json::{json, Value};

/// Most tests run one core: the shared machine has two.
const ONE_CORE: &[&str] = &["--cores", "1"];

/// Headers that `Access-Control-Expose-Headers` must name (docs/api.md: the `Pico-*` headers,
/// `ETag`, `Content-Type`, `Location`).
const EXPOSED: &[&str] = &[
    "pico-start-seq",
    "pico-next-seq",
    "pico-timestamp",
    "pico-cursor",
    "pico-up-to-date",
    "pico-closed",
    "pico-producer-epoch",
    "pico-producer-seq",
    "pico-expected-seq",
    "pico-received-seq",
    "pico-ttl",
    "pico-expires-at",
    "etag",
    "content-type",
    "location",
];

/// Headers every response carries, errors included (the opening of docs/api.md).
#[track_caller]
fn check_common(r: &Resp) {
    r.expect_every_response_headers();
    let expose: Vec<String> = r
        .h("access-control-expose-headers")
        .split(',')
        .map(|s| s.trim().to_ascii_lowercase())
        .collect();
    for name in EXPOSED {
        assert!(
            expose.iter().any(|e| e == name),
            "Access-Control-Expose-Headers lacks {name}:\n{}",
            r.describe()
        );
    }
}

/// An error body is `{"error":..,"message":..,"next_seq"?:..}` as JSON, `no-store`, and
/// `next_seq` is repeated in `Pico-Next-Seq`.
#[track_caller]
fn check_error_body(r: &Resp) -> Value {
    assert_eq!(
        r.header("content-type"),
        Some("application/json"),
        "error without a JSON body:\n{}",
        r.describe()
    );
    assert_eq!(
        r.header("cache-control"),
        Some("no-store"),
        "{}",
        r.describe()
    );
    let body = r.json();
    assert!(body["error"].is_string(), "{}", r.describe());
    if let Some(message) = body.get("message") {
        assert!(
            message.as_str().is_some_and(|m| !m.is_empty()),
            "{}",
            r.describe()
        );
    }
    match body.get("next_seq") {
        Some(next) => assert_eq!(
            r.header("pico-next-seq"),
            Some(next.to_string().as_str()),
            "next_seq and Pico-Next-Seq differ:\n{}",
            r.describe()
        ),
        None => assert_eq!(r.header("pico-next-seq"), None, "{}", r.describe()),
    }
    body
}

/// Checks a response: the common headers always, the JSON error body for every error but
/// `HEAD`'s.
#[track_caller]
fn check(method: &str, r: &Resp) {
    check_common(r);
    if r.status >= 400 && method != "HEAD" {
        check_error_body(r);
    }
}

/// One request on a fresh connection.
#[track_caller]
fn req(s: &Server, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Resp {
    let r = s.request(method, path, headers, body);
    check(method, &r);
    r
}

/// One request on `conn`.
#[track_caller]
fn on(conn: &mut Conn, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Resp {
    let r = conn
        .request(method, path, headers, body)
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
    check(method, &r);
    r
}

/// Asserts an error response; returns its JSON body.
#[track_caller]
fn error(r: &Resp, status: u16, code: &str) -> Value {
    r.expect_error(status, code);
    check_error_body(r)
}

/// Asserts an error whose message contains `part`.
#[track_caller]
fn error_with(r: &Resp, status: u16, code: &str, part: &str) -> Value {
    let body = error(r, status, code);
    let message = body["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(part),
        "message {message:?} lacks {part:?}:\n{}",
        r.describe()
    );
    body
}

#[track_caller]
fn create(s: &Server, name: &str, headers: &[(&str, &str)], body: &[u8]) -> Resp {
    let r = req(s, "PUT", name, headers, body);
    r.expect(201);
    r
}

#[track_caller]
fn post(s: &Server, name: &str, headers: &[(&str, &str)], body: &[u8]) -> Resp {
    req(s, "POST", name, headers, body)
}

/// An accepted append: `Pico-Start-Seq`, `Pico-Next-Seq` and a timestamp.
#[track_caller]
fn applied(r: &Resp, start: u64, next: u64) -> i64 {
    r.expect(200);
    assert_eq!(
        r.header("pico-start-seq"),
        Some(start.to_string().as_str()),
        "{}",
        r.describe()
    );
    assert_eq!(
        r.header("pico-next-seq"),
        Some(next.to_string().as_str()),
        "{}",
        r.describe()
    );
    r.h_i64("pico-timestamp")
}

/// A request that wrote nothing: `200` without `Pico-Start-Seq` and `Pico-Timestamp`.
#[track_caller]
fn wrote_nothing(r: &Resp, next: u64) {
    r.expect(200);
    assert_eq!(r.header("pico-start-seq"), None, "{}", r.describe());
    assert_eq!(r.header("pico-timestamp"), None, "{}", r.describe());
    assert_eq!(
        r.header("pico-next-seq"),
        Some(next.to_string().as_str()),
        "{}",
        r.describe()
    );
}

/// A JSON batch of text bodies.
fn json_batch(bodies: &[&str]) -> Vec<u8> {
    let records: Vec<Value> = bodies.iter().map(|b| json!({ "body": b })).collect();
    serde_json::to_vec(&json!({ "records": records })).unwrap()
}

/// Request headers as the tables of cases give them.
type Headers<'a> = &'a [(&'a str, &'a str)];

const JSON_BATCH: (&str, &str) = ("content-type", "application/vnd.picomq.batch+json");
const CLOSE: (&str, &str) = ("pico-closed", "true");

/// A producer request: `(id, epoch, seq)` plus `extra` headers.
#[track_caller]
fn produce(
    s: &Server,
    name: &str,
    (id, epoch, seq): (&str, u64, u64),
    extra: &[(&str, &str)],
    body: &[u8],
) -> Resp {
    let (epoch, seq) = (epoch.to_string(), seq.to_string());
    let mut headers = vec![
        ("pico-producer-id", id),
        ("pico-producer-epoch", epoch.as_str()),
        ("pico-producer-seq", seq.as_str()),
    ];
    headers.extend_from_slice(extra);
    post(s, name, &headers, body)
}

/// The producer headers echoed by an answer.
#[track_caller]
fn echoed(r: &Resp, epoch: u64, seq: u64) {
    assert_eq!(
        r.header("pico-producer-epoch"),
        Some(epoch.to_string().as_str()),
        "{}",
        r.describe()
    );
    assert_eq!(
        r.header("pico-producer-seq"),
        Some(seq.to_string().as_str()),
        "{}",
        r.describe()
    );
}

/// `GET /?query` as JSON.
#[track_caller]
fn list(s: &Server, query: &str) -> Value {
    let r = req(s, "GET", &format!("/?{query}"), &[], b"");
    r.expect(200);
    assert_eq!(r.header("content-type"), Some("application/json"));
    r.json()
}

/// Listing entries under `prefix` by name.
#[track_caller]
fn listed(s: &Server, prefix: &str) -> BTreeMap<String, Value> {
    let body = list(s, &format!("prefix={prefix}&limit=10000"));
    assert_eq!(body["has_more"], false);
    body["streams"]
        .as_array()
        .expect("streams array")
        .iter()
        .map(|e| (e["name"].as_str().unwrap().to_string(), e.clone()))
        .collect()
}

#[track_caller]
fn head(s: &Server, name: &str) -> Resp {
    req(s, "HEAD", name, &[], b"")
}

/// Bodies of a catch-up JSON read from `seq` (which must succeed).
#[track_caller]
fn bodies(s: &Server, name: &str, seq: u64) -> Vec<String> {
    let r = req(s, "GET", &format!("{name}?seq={seq}"), &[], b"");
    r.expect(200);
    r.json()
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["body"].as_str().unwrap().to_string())
        .collect()
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

fn sleep_until(t: Instant) {
    let now = Instant::now();
    if t > now {
        std::thread::sleep(t - now);
    }
}

/// `ms` as RFC 3339 at a UTC offset of `offset_min` minutes (`Z` for 0).
fn rfc3339(ms: i64, offset_min: i64) -> String {
    let offset = time::UtcOffset::from_whole_seconds((offset_min * 60) as i32).expect("offset");
    time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .expect("an instant RFC 3339 can write")
        .to_offset(offset)
        .format(&time::format_description::well_known::Rfc3339)
        .expect("formats")
}

// ----------------------------------------------------------------- a body with the create

#[test]
fn put_body_becomes_the_first_record() {
    let s = Server::start(ONE_CORE);
    let r = create(&s, "/d1/text", &[("content-type", "text/plain")], b"hello");
    assert_eq!(r.header("pico-next-seq"), Some("1"), "{}", r.describe());
    assert_eq!(r.header("location"), Some("/d1/text"));
    assert_eq!(r.header("content-type"), Some("text/plain"));
    let r = req(&s, "GET", "/d1/text", &[], b"");
    r.expect(200);
    let records = r.json();
    assert_eq!(records.as_array().unwrap().len(), 1, "{}", r.describe());
    assert_eq!(records[0]["seq"], 0);
    assert_eq!(records[0]["body"], "hello");
    assert!(records[0].get("headers").is_none(), "{}", r.describe());
    assert_eq!(r.header("pico-up-to-date"), Some("true"));
    // The record has the stream's content type in the raw format.
    let r = req(&s, "GET", "/d1/text?format=raw", &[], b"");
    assert_eq!(r.body, b"hello");
    assert_eq!(r.header("content-type"), Some("text/plain"));

    // A retried create (same settings, same body) is 200 and appends nothing.
    let r = req(
        &s,
        "PUT",
        "/d1/text",
        &[("content-type", "text/plain")],
        b"hello",
    );
    r.expect(200);
    assert_eq!(r.header("pico-next-seq"), Some("1"), "{}", r.describe());
    assert_eq!(head(&s, "/d1/text").header("pico-next-seq"), Some("1"));
    // Appends continue after it.
    applied(&post(&s, "/d1/text", &[], b"world"), 1, 2);
    assert_eq!(bodies(&s, "/d1/text", 0), ["hello", "world"]);

    // A binary body is one record too.
    create(&s, "/d1/bin", &[], &[0, 1, 0xff]);
    let r = req(&s, "GET", "/d1/bin", &[], b"");
    assert_eq!(
        r.json(),
        json!([{"seq": 0, "timestamp": r.json()[0]["timestamp"], "body_b64": "AAH/"}])
    );
    assert_eq!(
        head(&s, "/d1/bin").header("content-type"),
        Some("application/octet-stream")
    );

    // With `Pico-Closed: true`: the record, then the close.
    let r = create(
        &s,
        "/d1/closed",
        &[("content-type", "text/plain"), CLOSE],
        b"last",
    );
    assert_eq!(r.header("pico-closed"), Some("true"), "{}", r.describe());
    assert_eq!(r.header("pico-next-seq"), Some("1"), "{}", r.describe());
    let r = req(&s, "GET", "/d1/closed", &[], b"");
    assert_eq!(r.json()[0]["body"], "last");
    assert_eq!(r.header("pico-closed"), Some("true"), "{}", r.describe());
    error(&post(&s, "/d1/closed", &[], b"more"), 409, "closed");

    // The body is one record whatever the content type, even a batch type.
    let batch = json_batch(&["not", "split"]);
    create(&s, "/d1/batch-type", &[JSON_BATCH], &batch);
    let r = req(&s, "GET", "/d1/batch-type?format=raw", &[], b"");
    assert_eq!(r.body, batch);
    assert_eq!(
        head(&s, "/d1/batch-type").header("pico-next-seq"),
        Some("1")
    );

    // Without a body the stream starts empty.
    let r = create(&s, "/d1/empty", &[], b"");
    assert_eq!(r.header("pico-next-seq"), Some("0"));
}

// ------------------------------------------------------------------------------------ TTL

#[test]
fn ttl_slides_with_reads_and_appends_not_head_and_the_reaper_deletes() {
    let mut s = Server::start(ONE_CORE);
    // In units u (1 s, or more on a slow machine): TTL 3u; touches at 2u; checks at 4u. A
    // stream whose only access was a HEAD expired at 3u, a read or an append at 2u moved the
    // deadline to 5u. Each timed step is checked against the instants measured around it, so
    // a late step makes the round inconclusive instead of failing it.
    let unit = at_a_pace_the_machine_keeps("d2_ttl", |unit| {
        let u = Duration::from_secs(unit);
        let p = format!("/ttl{unit}");
        let ttl = (3 * unit).to_string();
        let t0 = Instant::now();
        for name in ["read", "append", "head"] {
            create(
                &s,
                &format!("{p}/{name}"),
                &[("pico-ttl", &ttl), ("content-type", "text/plain")],
                b"x",
            );
        }
        // Untouched from its create on: expired after u, and reaped.
        create(
            &s,
            &format!("{p}/idle"),
            &[("pico-ttl", &unit.to_string())],
            b"x",
        );
        // Every create was answered by now: the server's deadlines are at most this + TTL.
        let created = Instant::now();
        let r = head(&s, &format!("{p}/read"));
        let entries = listed(&s, &format!("{p}/read"));
        if t0.elapsed() >= 3 * u {
            return Err(format!("the first HEAD came {:?} after t0", t0.elapsed()));
        }
        assert_eq!(r.header("pico-ttl"), Some(ttl.as_str()), "{}", r.describe());
        assert_eq!(r.header("pico-expires-at"), None);
        assert_eq!(entries[&format!("{p}/read")]["ttl"], 3 * unit);
        assert!(entries[&format!("{p}/read")].get("expires_at").is_none());

        sleep_until(t0 + 2 * u);
        // The touches' deadlines are at least this + TTL.
        let touching = Instant::now();
        let read = req(&s, "GET", &format!("{p}/read"), &[], b"");
        let append = post(&s, &format!("{p}/append"), &[], b"y");
        let head_only = head(&s, &format!("{p}/head"));
        if t0.elapsed() >= 3 * u {
            return Err(format!("the touches ended {:?} after t0", t0.elapsed()));
        }
        read.expect(200);
        applied(&append, 1, 2);
        head_only.expect(200);

        // Past the HEAD-only stream's deadline (a little slack for the server's wall clock
        // against this monotonic one).
        sleep_until((t0 + 4 * u).max(created + 3 * u + Duration::from_millis(50)));
        // The HEAD at 2u did not extend the TTL.
        let head_gone = head(&s, &format!("{p}/head"));
        let get_gone = req(&s, "GET", &format!("{p}/head"), &[], b"");
        // The read and the append did. (HEAD does not touch, so checking is free.)
        let read_kept = head(&s, &format!("{p}/read"));
        let append_kept = head(&s, &format!("{p}/append"));
        let entries = listed(&s, &format!("{p}/"));
        if touching.elapsed() >= 3 * u {
            return Err(format!(
                "the checks ended {:?} after the touches",
                touching.elapsed()
            ));
        }
        head_gone.expect(404);
        error(&get_gone, 404, "not_found");
        read_kept.expect(200);
        append_kept.expect(200);
        assert_eq!(
            entries.keys().cloned().collect::<Vec<_>>(),
            [format!("{p}/append"), format!("{p}/read")],
            "expired streams are not listed"
        );
        Ok(())
    });

    // `idle` was never touched after its create. The reaper deleted it (metadata included):
    // a restart, which would load any stream still in the metadata with a fresh TTL, does not
    // bring it back, and the name starts again from offset 0.
    let p = format!("/ttl{unit}");
    s.restart();
    head(&s, &format!("{p}/idle")).expect(404);
    assert!(!listed(&s, &format!("{p}/")).contains_key(&format!("{p}/idle")));
    create(&s, &format!("{p}/idle"), &[], b"");
    applied(&post(&s, &format!("{p}/idle"), &[], b"new"), 0, 1);
    // A name that expired and is recreated starts from 0 as well.
    create(&s, &format!("{p}/head"), &[], b"");
    assert_eq!(
        head(&s, &format!("{p}/head")).header("pico-next-seq"),
        Some("0")
    );
}

/// `pico create --ttl` documents the sliding idle expiry.
#[test]
fn create_ttl_help_describes_idle_expiry() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_pico"))
        .args(["create", "--help"])
        .output()
        .expect("run pico create --help");
    let help =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    let line = help
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("--ttl"))
        .take(3)
        .collect::<Vec<_>>()
        .join(" ");
    for part in ["idle", "reads or appends", "HEAD does not count"] {
        assert!(line.contains(part), "--ttl help lacks {part:?}: {line}");
    }
}

/// A stream idle past its TTL when the server crashes is gone after the restart too: the
/// restart is not an access that revives it.
#[test]
fn a_stream_expired_before_a_crash_stays_gone() {
    let mut s = Server::start(ONE_CORE);
    create(&s, "/ttl/crash", &[("pico-ttl", "1")], b"x");
    let created = Instant::now();
    // Expired at 1 s; killed right after, usually before the reaper's next round (when the
    // reaper is faster the test passes whatever the recovery does).
    sleep_until(created + Duration::from_millis(1100));
    s.kill();
    s.restart();
    let r = head(&s, "/ttl/crash");
    assert_eq!(
        r.status,
        404,
        "a stream idle for more than its TTL came back after a restart:\n{}",
        r.describe()
    );
}

// --------------------------------------------------------------------------- fixed expiry

#[test]
fn expires_at_takes_offsets_and_is_rendered_in_utc() {
    let s = Server::start(ONE_CORE);
    let cases = [
        ("/d3/z", "2100-01-01T00:00:00Z", "2100-01-01T00:00:00Z"),
        (
            "/d3/plus",
            "2100-01-01T02:00:00+02:00",
            "2100-01-01T00:00:00Z",
        ),
        (
            "/d3/minus",
            "2099-12-31T18:30:00-05:30",
            "2100-01-01T00:00:00Z",
        ),
        (
            "/d3/frac",
            "2100-01-01T00:00:00.250Z",
            "2100-01-01T00:00:00.250Z",
        ),
        (
            "/d3/frac-off",
            "2100-01-01T01:00:00.5+01:00",
            "2100-01-01T00:00:00.500Z",
        ),
    ];
    for (name, sent, want) in cases {
        create(&s, name, &[("pico-expires-at", sent)], b"");
        let r = head(&s, name);
        assert_eq!(
            r.header("pico-expires-at"),
            Some(want),
            "{sent}: {}",
            r.describe()
        );
        assert_eq!(r.header("pico-ttl"), None);
    }
    let entries = listed(&s, "/d3/");
    for (name, sent, want) in cases {
        assert_eq!(entries[name]["expires_at"], want, "{sent}");
        assert!(entries[name].get("ttl").is_none());
    }
    // The same instant spelled differently is the same setting; another instant is not.
    req(
        &s,
        "PUT",
        "/d3/z",
        &[("pico-expires-at", "2100-01-01T01:00:00+01:00")],
        b"",
    )
    .expect(200);
    error(
        &req(
            &s,
            "PUT",
            "/d3/z",
            &[("pico-expires-at", "2100-01-01T00:00:01Z")],
            b"",
        ),
        409,
        "conflict",
    );
    error(&req(&s, "PUT", "/d3/z", &[], b""), 409, "conflict");

    for bad in [
        "2100-01-01T00:00:00",
        "4102444800000",
        "2100-01-01",
        "2100-01-01T00:00:00+0200",
        "2100-13-01T00:00:00Z",
        "2100-02-30T00:00:00Z",
        "2100-01-01T25:00:00Z",
        "tomorrow",
    ] {
        let r = req(&s, "PUT", "/d3/bad", &[("pico-expires-at", bad)], b"");
        error_with(&r, 400, "bad_request", "Pico-Expires-At");
    }
    head(&s, "/d3/bad").expect(404);
    let r = req(
        &s,
        "PUT",
        "/d3/both",
        &[
            ("pico-ttl", "10"),
            ("pico-expires-at", "2100-01-01T00:00:00Z"),
        ],
        b"",
    );
    error(&r, 400, "bad_request");

    // A fixed expiry does not slide: a read and an append before it do not extend it. Whole
    // seconds, 2u–3u ahead (u = 1 s, or more on a slow machine), sent at +02:00.
    at_a_pace_the_machine_keeps("d3_expires_at", |unit| {
        let name = format!("/d3/soon{unit}");
        let at = now_ms() / 1000 * 1000 + 3000 * unit as i64;
        let created = req(
            &s,
            "PUT",
            &name,
            &[("pico-expires-at", &rfc3339(at, 120))],
            b"x",
        );
        let r = head(&s, &name);
        if now_ms() >= at {
            return Err("the create and HEAD ended past the expiry instant".into());
        }
        created.expect(201);
        assert_eq!(r.header("pico-expires-at"), Some(rfc3339(at, 0).as_str()));
        std::thread::sleep(Duration::from_secs(unit));
        let read = req(&s, "GET", &name, &[], b"");
        let append = post(&s, &name, &[], b"y");
        if now_ms() >= at {
            return Err("the read and the append ended past the expiry instant".into());
        }
        read.expect(200);
        applied(&append, 1, 2);
        // Both clocks are the wall clock: past `at` (and some slack) it is gone, whatever the
        // machine's pace.
        wait_for("the expiry instant", Duration::from_secs(30 * unit), || {
            (now_ms() > at + 300).then_some(())
        });
        assert!(!listed(&s, "/d3/").contains_key(&name));
        error(&req(&s, "GET", &name, &[], b""), 404, "not_found");
        head(&s, &name).expect(404);
        Ok(())
    });
}

// ------------------------------------------------------------------------------ long-poll

#[test]
fn long_poll() {
    // Two nodes: a 2 s long-poll timeout to see a timeout happen, and one far longer than any
    // scheduling delay, so that an answer before it proves the poll was answered on its own
    // (records there, an append, a close, a delete) without timing how fast that was.
    let short = Server::start(&["--cores", "1", "--long-poll-timeout-sec", "2"]);
    let s = Server::start(&["--cores", "1", "--long-poll-timeout-sec", "120"]);
    let long_poll_timeout = Duration::from_secs(120);
    create(&s, "/lp", &[("content-type", "text/plain")], b"a");

    // Records available: answered at once.
    let t = Instant::now();
    let r = req(&s, "GET", "/lp?live=long-poll&seq=0", &[], b"");
    r.expect(200);
    assert!(t.elapsed() < long_poll_timeout);
    assert_eq!(r.json()[0]["body"], "a");
    assert_eq!(r.header("pico-next-seq"), Some("1"));
    assert_eq!(r.header("pico-up-to-date"), Some("true"));
    assert_eq!(r.header("cache-control"), Some("no-store"));
    assert_eq!(r.header("etag"), None, "{}", r.describe());
    let cursor: u64 = r.h_u64("pico-cursor");

    // At the tail: waits for the timeout (never less; the client's read timeout bounds
    // "more"), then 204 with the position and a cursor.
    create(&short, "/lp", &[("content-type", "text/plain")], b"a");
    let t = Instant::now();
    let r = req(&short, "GET", "/lp?live=long-poll&seq=1", &[], b"");
    let waited = t.elapsed();
    r.expect(204);
    assert!(
        waited >= Duration::from_millis(1800),
        "long-poll answered after {waited:?}"
    );
    assert!(r.body.is_empty());
    assert_eq!(r.header("pico-next-seq"), Some("1"));
    assert_eq!(r.header("pico-up-to-date"), Some("true"));
    assert_eq!(r.header("cache-control"), Some("no-store"));
    r.h_u64("pico-cursor");

    // Echoing a cursor gives a newer one.
    let r = req(
        &s,
        "GET",
        &format!("/lp?live=long-poll&seq=0&cursor={cursor}"),
        &[],
        b"",
    );
    assert!(r.h_u64("pico-cursor") > cursor, "{}", r.describe());

    // Woken by an append, a close and a delete. The pause lets the poll arrive first on most
    // runs; when the action wins the race the poll is answered at once, just as correctly.
    let poll = |path: &str, after: &dyn Fn()| -> (Resp, Duration) {
        std::thread::scope(|scope| {
            let addr = s.addr;
            let path = path.to_string();
            let poller = scope.spawn(move || {
                let mut conn = Conn::connect(addr).unwrap();
                conn.set_read_timeout(long_poll_timeout * 2);
                let t = Instant::now();
                let r = on(&mut conn, "GET", &path, &[], b"");
                (r, t.elapsed())
            });
            std::thread::sleep(Duration::from_millis(300));
            after();
            poller.join().unwrap()
        })
    };
    let (r, took) = poll("/lp?live=long-poll&seq=1", &|| {
        applied(&post(&s, "/lp", &[], b"b"), 1, 2);
    });
    r.expect(200);
    assert!(took < long_poll_timeout, "not woken: {took:?}");
    assert_eq!(r.json()[0]["seq"], 1);
    assert_eq!(r.json()[0]["body"], "b");
    assert_eq!(r.header("pico-next-seq"), Some("2"));

    let (r, took) = poll("/lp?live=long-poll&seq=2", &|| {
        wrote_nothing(&post(&s, "/lp", &[CLOSE], b""), 2);
    });
    r.expect(204);
    assert!(took < long_poll_timeout, "not woken: {took:?}");
    assert_eq!(r.header("pico-closed"), Some("true"), "{}", r.describe());
    assert_eq!(r.header("pico-next-seq"), Some("2"));
    // A closed stream at its tail answers at once.
    let t = Instant::now();
    let r = req(&s, "GET", "/lp?live=long-poll&seq=2", &[], b"");
    r.expect(204);
    assert!(t.elapsed() < long_poll_timeout);
    assert_eq!(r.header("pico-closed"), Some("true"));

    create(&s, "/lp2", &[], b"");
    let (r, took) = poll("/lp2?live=long-poll&seq=0", &|| {
        req(&s, "DELETE", "/lp2", &[], b"").expect(204);
    });
    error(&r, 404, "not_found");
    assert!(took < long_poll_timeout, "not woken: {took:?}");

    error(
        &req(&s, "GET", "/lp?live=long-poll&seq=3", &[], b""),
        400,
        "bad_request",
    );
    error(
        &req(&s, "GET", "/lp?live=forever", &[], b""),
        400,
        "bad_request",
    );
    error(
        &req(&s, "GET", "/nope?live=long-poll", &[], b""),
        404,
        "not_found",
    );
}

// -------------------------------------------------------------------- conditional appends

#[test]
fn failed_match_is_412() {
    let s = Server::start(ONE_CORE);
    create(&s, "/m", &[], b"");
    applied(&post(&s, "/m", &[("pico-match-seq", "0")], b"a"), 0, 1);
    let body = error(
        &post(&s, "/m", &[("pico-match-seq", "0")], b"b"),
        412,
        "match_failed",
    );
    assert_eq!(body["next_seq"], 1);
    let body = error(
        &post(&s, "/m", &[("pico-match-seq", "7")], b"b"),
        412,
        "match_failed",
    );
    assert_eq!(body["next_seq"], 1);
    applied(&post(&s, "/m", &[("pico-match-seq", "1")], b"b"), 1, 2);
    let r = post(
        &s,
        "/m",
        &[("pico-match-seq", "2"), JSON_BATCH],
        &json_batch(&["c", "d"]),
    );
    applied(&r, 2, 4);
    // A failed match with a batch writes none of it.
    let r = post(
        &s,
        "/m",
        &[("pico-match-seq", "2"), JSON_BATCH],
        &json_batch(&["x", "y"]),
    );
    error(&r, 412, "match_failed");
    for bad in ["01", "-1", "x"] {
        error(
            &post(&s, "/m", &[("pico-match-seq", bad)], b"x"),
            400,
            "bad_request",
        );
    }
    // A matching close-only closes; afterwards the closed check comes first.
    let r = post(&s, "/m", &[("pico-match-seq", "4"), CLOSE], b"");
    wrote_nothing(&r, 4);
    assert_eq!(r.header("pico-closed"), Some("true"));
    error(
        &post(&s, "/m", &[("pico-match-seq", "4")], b"z"),
        409,
        "closed",
    );
    assert_eq!(bodies(&s, "/m", 0), ["a", "b", "c", "d"]);
    error(
        &post(&s, "/nope", &[("pico-match-seq", "0")], b"z"),
        404,
        "not_found",
    );
}

// ------------------------------------------------------------------- idempotent producers

#[test]
fn producer_decision_table() {
    let s = Server::start(ONE_CORE);
    create(&s, "/p", &[("content-type", "text/plain")], b"");

    // New producer: seq ≠ 0 is 400, seq 0 is applied.
    let r = produce(&s, "/p", ("a", 0, 1), &[], b"x");
    error_with(&r, 400, "bad_request", "sequence 0");
    let r = produce(&s, "/p", ("a", 0, 0), &[], b"r0");
    applied(&r, 0, 1);
    echoed(&r, 0, 0);
    // The sequence counts requests: a batch of three is one.
    let r = produce(
        &s,
        "/p",
        ("a", 0, 1),
        &[JSON_BATCH],
        &json_batch(&["r1", "r2", "r3"]),
    );
    applied(&r, 1, 4);
    echoed(&r, 0, 1);
    applied(&produce(&s, "/p", ("a", 0, 2), &[], b"r4"), 4, 5);

    // Same epoch, seq ≤ last: a duplicate, nothing written, the highest accepted seq echoed.
    for seq in [2, 1, 0] {
        let r = produce(&s, "/p", ("a", 0, seq), &[], b"dup");
        wrote_nothing(&r, 5);
        echoed(&r, 0, 2);
        assert_eq!(r.header("pico-closed"), None);
    }
    // Same epoch, seq > last + 1: a gap.
    let r = produce(&s, "/p", ("a", 0, 5), &[], b"gap");
    error(&r, 409, "sequence_gap");
    assert_eq!(r.header("pico-expected-seq"), Some("3"), "{}", r.describe());
    assert_eq!(r.header("pico-received-seq"), Some("5"), "{}", r.describe());
    // Same epoch, seq = last + 1: applied (the gap changed nothing).
    applied(&produce(&s, "/p", ("a", 0, 3), &[], b"r5"), 5, 6);

    // Newer epoch, seq ≠ 0: 400, and the old epoch stays current.
    error_with(
        &produce(&s, "/p", ("a", 1, 1), &[], b"x"),
        400,
        "bad_request",
        "sequence 0",
    );
    applied(&produce(&s, "/p", ("a", 0, 4), &[], b"r6"), 6, 7);
    // Newer epoch, seq 0: applied.
    let r = produce(&s, "/p", ("a", 1, 0), &[], b"r7");
    applied(&r, 7, 8);
    echoed(&r, 1, 0);
    // Older epoch: fenced, with the current epoch; duplicates of the old epoch too.
    for seq in [5, 4, 0] {
        let r = produce(&s, "/p", ("a", 0, seq), &[], b"x");
        error(&r, 403, "fenced");
        assert_eq!(
            r.header("pico-producer-epoch"),
            Some("1"),
            "{}",
            r.describe()
        );
    }
    // Epochs may jump.
    applied(&produce(&s, "/p", ("a", 7, 0), &[], b"r8"), 8, 9);
    let r = produce(&s, "/p", ("a", 1, 1), &[], b"x");
    error(&r, 403, "fenced");
    assert_eq!(r.header("pico-producer-epoch"), Some("7"));
    let r = produce(&s, "/p", ("a", 7, 0), &[], b"x");
    wrote_nothing(&r, 9);
    echoed(&r, 7, 0);

    // A request refused for another reason (a failed match) consumes no sequence.
    let r = produce(&s, "/p", ("a", 7, 1), &[("pico-match-seq", "0")], b"x");
    error(&r, 412, "match_failed");
    applied(
        &produce(&s, "/p", ("a", 7, 1), &[("pico-match-seq", "9")], b"r9"),
        9,
        10,
    );

    // Producers are independent per id and per stream.
    applied(&produce(&s, "/p", ("b", 0, 0), &[], b"r10"), 10, 11);
    create(&s, "/p2", &[], b"");
    applied(&produce(&s, "/p2", ("a", 0, 0), &[], b"q"), 0, 1);
    error(
        &produce(&s, "/nope", ("a", 0, 0), &[], b"q"),
        404,
        "not_found",
    );

    // All three headers or none; an empty id counts as absent.
    let partial: &[&[(&str, &str)]] = &[
        &[("pico-producer-id", "a"), ("pico-producer-epoch", "0")],
        &[("pico-producer-id", "a"), ("pico-producer-seq", "0")],
        &[("pico-producer-epoch", "0"), ("pico-producer-seq", "0")],
        &[("pico-producer-id", "a")],
        &[("pico-producer-epoch", "0")],
        &[("pico-producer-seq", "0")],
        &[
            ("pico-producer-id", ""),
            ("pico-producer-epoch", "0"),
            ("pico-producer-seq", "0"),
        ],
    ];
    for headers in partial {
        let r = post(&s, "/p", headers, b"x");
        error_with(&r, 400, "bad_request", "Pico-Producer-Id");
    }
    for (epoch, seq) in [("-1", "0"), ("01", "0"), ("0", "x"), ("0", "1.0")] {
        let headers = [
            ("pico-producer-id", "a"),
            ("pico-producer-epoch", epoch),
            ("pico-producer-seq", seq),
        ];
        error(&post(&s, "/p", &headers, b"x"), 400, "bad_request");
    }
    // A producer request without a body (and not closing) is 400 and consumes nothing.
    error(
        &produce(&s, "/p", ("b", 0, 1), &[], b""),
        400,
        "bad_request",
    );
    applied(&produce(&s, "/p", ("b", 0, 1), &[], b"r11"), 11, 12);

    let want: Vec<String> = (0..=11).map(|i| format!("r{i}")).collect();
    assert_eq!(bodies(&s, "/p", 0), want);
}

#[test]
fn closing_rules_with_the_closing_producer() {
    let s = Server::start(ONE_CORE);
    create(&s, "/c", &[("content-type", "text/plain")], b"");
    applied(&produce(&s, "/c", ("c", 0, 0), &[], b"a"), 0, 1);
    // Close with data by (c, 0, 1).
    let r = produce(&s, "/c", ("c", 0, 1), &[CLOSE], b"last");
    applied(&r, 1, 2);
    assert_eq!(r.header("pico-closed"), Some("true"), "{}", r.describe());
    // Retried by the same tuple: 200, nothing applied, closed.
    let r = produce(&s, "/c", ("c", 0, 1), &[CLOSE], b"last");
    wrote_nothing(&r, 2);
    echoed(&r, 0, 1);
    assert_eq!(r.header("pico-closed"), Some("true"), "{}", r.describe());
    // An older request of the closing producer is a duplicate as well.
    let r = produce(&s, "/c", ("c", 0, 0), &[], b"a");
    wrote_nothing(&r, 2);
    assert_eq!(r.header("pico-closed"), Some("true"), "{}", r.describe());
    // Anybody else: 409 closed, with or without data.
    for (tuple, body) in [
        (("d", 0, 0), &b"x"[..]),
        (("d", 0, 0), b""),
        (("c", 0, 2), b"x"),
        (("c", 0, 2), b""),
        (("c", 1, 0), b""),
    ] {
        let r = produce(&s, "/c", tuple, &[CLOSE], body);
        let json = error(&r, 409, "closed");
        assert_eq!(json["next_seq"], 2);
        assert_eq!(r.header("pico-closed"), Some("true"), "{}", r.describe());
    }
    let r = produce(&s, "/c", ("d", 0, 0), &[], b"x");
    error(&r, 409, "closed");
    // Without producer headers: close-only is idempotent, data is refused.
    let r = post(&s, "/c", &[CLOSE], b"");
    wrote_nothing(&r, 2);
    assert_eq!(r.header("pico-closed"), Some("true"));
    let body = error(&post(&s, "/c", &[], b"x"), 409, "closed");
    assert_eq!(body["next_seq"], 2);
    let r = req(&s, "GET", "/c", &[], b"");
    assert_eq!(r.header("pico-closed"), Some("true"));
    assert_eq!(head(&s, "/c").header("pico-closed"), Some("true"));
    assert_eq!(bodies(&s, "/c", 0), ["a", "last"]);

    // Closed without producer headers: there is no closing tuple, any close-only is 200.
    create(&s, "/c2", &[], b"");
    applied(&post(&s, "/c2", &[CLOSE], b"x"), 0, 1);
    let r = produce(&s, "/c2", ("e", 0, 0), &[CLOSE], b"");
    wrote_nothing(&r, 1);
    assert_eq!(r.header("pico-closed"), Some("true"));
    error(&produce(&s, "/c2", ("e", 0, 0), &[], b"y"), 409, "closed");

    // A producer's close-only is remembered the same way.
    create(&s, "/c3", &[], b"");
    let r = produce(&s, "/c3", ("f", 0, 0), &[CLOSE], b"");
    wrote_nothing(&r, 0);
    assert_eq!(r.header("pico-closed"), Some("true"));
    let r = produce(&s, "/c3", ("f", 0, 0), &[CLOSE], b"");
    wrote_nothing(&r, 0);
    assert_eq!(r.header("pico-closed"), Some("true"));
    error(
        &produce(&s, "/c3", ("g", 0, 0), &[CLOSE], b""),
        409,
        "closed",
    );
    head(&s, "/c3").expect(200);
}

#[test]
fn producer_state_survives_kill_9() {
    // Segments seal after 300 ms, so one stream's producer state is recovered from a sealed
    // segment and the others' from the WAL.
    let mut s = Server::start(&["--cores", "1", "--segment-max-age-ms", "300"]);
    create(&s, "/pk-sealed", &[("content-type", "text/plain")], b"");
    applied(&produce(&s, "/pk-sealed", ("k", 2, 0), &[], b"a"), 0, 1);
    applied(&produce(&s, "/pk-sealed", ("k", 2, 1), &[], b"b"), 1, 2);
    let sealed_dir = common::segments_dir(s.dir());
    wait_for("a sealed segment", Duration::from_secs(20), || {
        std::fs::read_dir(&sealed_dir)
            .ok()
            .and_then(|mut d| d.next())
            .map(|_| ())
    });

    create(&s, "/pk", &[("content-type", "text/plain")], b"");
    applied(&produce(&s, "/pk", ("k", 0, 0), &[], b"a"), 0, 1);
    let batch = json_batch(&["b", "c"]);
    applied(
        &produce(&s, "/pk", ("k", 0, 1), &[JSON_BATCH], &batch),
        1,
        3,
    );
    create(&s, "/pk-epoch", &[], b"");
    applied(&produce(&s, "/pk-epoch", ("k", 3, 0), &[], b"x"), 0, 1);
    create(&s, "/pk-closed", &[], b"");
    applied(&produce(&s, "/pk-closed", ("z", 0, 0), &[], b"a"), 0, 1);
    applied(
        &produce(&s, "/pk-closed", ("z", 0, 1), &[CLOSE], b"end"),
        1,
        2,
    );

    // Closed by a producer's close-only request (the close frame carries the tuple).
    create(&s, "/pk-close-only", &[], b"x");
    wrote_nothing(
        &produce(&s, "/pk-close-only", ("w", 0, 0), &[CLOSE], b""),
        1,
    );

    s.restart();
    let r = produce(&s, "/pk-close-only", ("w", 0, 0), &[CLOSE], b"");
    wrote_nothing(&r, 1);
    assert_eq!(r.header("pico-closed"), Some("true"), "{}", r.describe());
    error(
        &produce(&s, "/pk-close-only", ("v", 0, 0), &[CLOSE], b""),
        409,
        "closed",
    );
    // A retry of the last acknowledged request is a duplicate; the next seq is accepted.
    let r = produce(&s, "/pk", ("k", 0, 1), &[JSON_BATCH], &batch);
    wrote_nothing(&r, 3);
    echoed(&r, 0, 1);
    wrote_nothing(&produce(&s, "/pk", ("k", 0, 0), &[], b"a"), 3);
    let r = produce(&s, "/pk", ("k", 0, 3), &[], b"d");
    error(&r, 409, "sequence_gap");
    assert_eq!(r.header("pico-expected-seq"), Some("2"), "{}", r.describe());
    applied(&produce(&s, "/pk", ("k", 0, 2), &[], b"d"), 3, 4);

    let r = produce(&s, "/pk-sealed", ("k", 2, 1), &[], b"b");
    wrote_nothing(&r, 2);
    echoed(&r, 2, 1);
    let r = produce(&s, "/pk-sealed", ("k", 1, 0), &[], b"old");
    error(&r, 403, "fenced");
    assert_eq!(r.header("pico-producer-epoch"), Some("2"));
    applied(&produce(&s, "/pk-sealed", ("k", 2, 2), &[], b"c"), 2, 3);

    let r = produce(&s, "/pk-epoch", ("k", 2, 0), &[], b"x");
    error(&r, 403, "fenced");
    assert_eq!(
        r.header("pico-producer-epoch"),
        Some("3"),
        "{}",
        r.describe()
    );
    wrote_nothing(&produce(&s, "/pk-epoch", ("k", 3, 0), &[], b"x"), 1);
    applied(&produce(&s, "/pk-epoch", ("k", 3, 1), &[], b"y"), 1, 2);

    // The closing tuple survives too.
    let r = produce(&s, "/pk-closed", ("z", 0, 1), &[CLOSE], b"end");
    wrote_nothing(&r, 2);
    assert_eq!(r.header("pico-closed"), Some("true"), "{}", r.describe());
    error(
        &produce(&s, "/pk-closed", ("y", 0, 0), &[], b"x"),
        409,
        "closed",
    );
    error(
        &produce(&s, "/pk-closed", ("y", 0, 0), &[CLOSE], b""),
        409,
        "closed",
    );
    wrote_nothing(&post(&s, "/pk-closed", &[CLOSE], b""), 2);

    // And a second crash, after more appends.
    s.restart();
    wrote_nothing(&produce(&s, "/pk", ("k", 0, 2), &[], b"d"), 4);
    applied(&produce(&s, "/pk", ("k", 0, 3), &[], b"e"), 4, 5);
    assert_eq!(bodies(&s, "/pk", 0), ["a", "b", "c", "d", "e"]);
    assert_eq!(bodies(&s, "/pk-sealed", 0), ["a", "b", "c"]);
    assert_eq!(bodies(&s, "/pk-closed", 0), ["a", "end"]);
}

// ------------------------------------------------------------------ trims and offset_gone

#[test]
fn trim_and_offset_gone() {
    let mut s = Server::start(ONE_CORE);
    create(&s, "/t", &[("content-type", "text/plain")], b"");
    let r = post(
        &s,
        "/t",
        &[JSON_BATCH],
        &json_batch(&["r0", "r1", "r2", "r3", "r4"]),
    );
    applied(&r, 0, 5);

    // Immediate.
    let r = post(&s, "/t", &[("pico-trim-seq", "2")], b"");
    r.expect(200);
    assert_eq!(r.header("pico-start-seq"), Some("2"), "{}", r.describe());
    assert_eq!(r.header("cache-control"), Some("no-store"));
    let h = head(&s, "/t");
    assert_eq!(h.header("pico-start-seq"), Some("2"));
    assert_eq!(h.header("pico-next-seq"), Some("5"));
    assert_eq!(bodies(&s, "/t", 2), ["r2", "r3", "r4"]);
    // Below the start: 410 with the start, in every read mode.
    for path in [
        "/t?seq=0",
        "/t",
        "/t?seq=1&format=binary",
        "/t?seq=1&format=raw",
        "/t?seq=1&live=long-poll",
        "/t?seq=1&live=sse",
    ] {
        let body = error(&req(&s, "GET", path, &[], b""), 410, "offset_gone");
        assert_eq!(body["next_seq"], 2, "{path}");
    }
    // Past the tail stays 400; the tail itself is an empty, up-to-date read.
    error(&req(&s, "GET", "/t?seq=6", &[], b""), 400, "bad_request");
    error(
        &req(&s, "GET", "/t?seq=6&live=long-poll", &[], b""),
        400,
        "bad_request",
    );
    let r = req(&s, "GET", "/t?seq=5", &[], b"");
    assert_eq!(r.json(), json!([]));
    assert_eq!(r.header("pico-up-to-date"), Some("true"));

    // Never lowered.
    for lower in ["0", "1", "2"] {
        let r = post(&s, "/t", &[("pico-trim-seq", lower)], b"");
        assert_eq!(r.header("pico-start-seq"), Some("2"), "{}", r.describe());
    }
    // Clamped to the tail.
    let r = post(&s, "/t", &[("pico-trim-seq", "100")], b"");
    assert_eq!(r.header("pico-start-seq"), Some("5"), "{}", r.describe());
    let h = head(&s, "/t");
    assert_eq!(h.header("pico-start-seq"), Some("5"));
    assert_eq!(h.header("pico-next-seq"), Some("5"));
    assert_eq!(
        error(&req(&s, "GET", "/t?seq=4", &[], b""), 410, "offset_gone")["next_seq"],
        5
    );
    assert_eq!(req(&s, "GET", "/t?seq=5", &[], b"").json(), json!([]));
    applied(&post(&s, "/t", &[], b"r5"), 5, 6);
    assert_eq!(bodies(&s, "/t", 5), ["r5"]);
    let entry = &listed(&s, "/t")["/t"];
    assert_eq!(
        (entry["start_seq"].clone(), entry["next_seq"].clone()),
        (json!(5), json!(6))
    );

    // Errors.
    let r = post(&s, "/t", &[("pico-trim-seq", "1")], b"x");
    error_with(&r, 400, "bad_request", "trim takes no body");
    for bad in ["-1", "01", "abc", "1.5"] {
        error(
            &post(&s, "/t", &[("pico-trim-seq", bad)], b""),
            400,
            "bad_request",
        );
    }
    error(
        &post(&s, "/nope", &[("pico-trim-seq", "1")], b""),
        404,
        "not_found",
    );
    // A closed stream can still be trimmed.
    create(&s, "/t2", &[], b"");
    post(
        &s,
        "/t2",
        &[JSON_BATCH, CLOSE],
        &json_batch(&["a", "b", "c"]),
    )
    .expect(200);
    let r = post(&s, "/t2", &[("pico-trim-seq", "1")], b"");
    assert_eq!(r.header("pico-start-seq"), Some("1"), "{}", r.describe());

    // Survives kill -9.
    s.restart();
    let h = head(&s, "/t");
    assert_eq!(h.header("pico-start-seq"), Some("5"), "{}", h.describe());
    assert_eq!(h.header("pico-next-seq"), Some("6"));
    assert_eq!(
        error(&req(&s, "GET", "/t?seq=4", &[], b""), 410, "offset_gone")["next_seq"],
        5
    );
    assert_eq!(bodies(&s, "/t", 5), ["r5"]);
    let h = head(&s, "/t2");
    assert_eq!(h.header("pico-start-seq"), Some("1"), "{}", h.describe());
    assert_eq!(bodies(&s, "/t2", 1), ["b", "c"]);
    error(&req(&s, "GET", "/t2?seq=0", &[], b""), 410, "offset_gone");
    let entry = &listed(&s, "/t")["/t"];
    assert_eq!(
        (entry["start_seq"].clone(), entry["next_seq"].clone()),
        (json!(5), json!(6)),
        "the listing after a restart"
    );
    let r = post(&s, "/t", &[("pico-trim-seq", "0")], b"");
    assert_eq!(
        r.header("pico-start-seq"),
        Some("5"),
        "never lowered after a restart"
    );
}

// ----------------------------------------------------------------------------- timestamps

#[test]
fn timestamps_strictly_increase_pipelined_and_across_restarts() {
    // Two cores: some connections land on the core that does not own the stream.
    let mut s = Server::start(&["--cores", "2"]);
    create(&s, "/ts", &[("content-type", "text/plain")], b"");
    const CONNS: usize = 4;
    const PER_CONN: usize = 50;
    let pipelined = |s: &Server, tag: &str| -> Vec<(u64, i64)> {
        std::thread::scope(|scope| {
            let handles: Vec<_> = (0..CONNS)
                .map(|c| {
                    let addr = s.addr;
                    let tag = tag.to_string();
                    scope.spawn(move || {
                        let mut conn = Conn::connect(addr).unwrap();
                        let mut all = Vec::new();
                        for i in 0..PER_CONN {
                            let body = format!("{tag}-{c}-{i}");
                            all.extend(encode_request("POST", "/ts", &[], body.as_bytes()));
                        }
                        conn.raw(&all).unwrap();
                        (0..PER_CONN)
                            .map(|_| {
                                let r = conn.read_response(false).unwrap();
                                check("POST", &r);
                                r.expect(200);
                                (r.h_u64("pico-start-seq"), r.h_i64("pico-timestamp"))
                            })
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            let mut acks: Vec<(u64, i64)> = handles
                .into_iter()
                .flat_map(|h| h.join().unwrap())
                .collect();
            acks.sort();
            acks
        })
    };
    let check_increasing = |acks: &[(u64, i64)], from: u64| {
        for (i, (seq, _)) in acks.iter().enumerate() {
            assert_eq!(*seq, from + i as u64, "offsets are dense");
        }
        for pair in acks.windows(2) {
            assert!(
                pair[1].1 > pair[0].1,
                "timestamps not strictly increasing: {pair:?}"
            );
        }
    };
    let mut acks = pipelined(&s, "a");
    check_increasing(&acks, 0);
    let n = acks.len() as u64;
    // A batch shares one timestamp, later than everything before.
    let r = post(&s, "/ts", &[JSON_BATCH], &json_batch(&["b0", "b1", "b2"]));
    let batch_ts = applied(&r, n, n + 3);
    assert!(batch_ts > acks.last().unwrap().1);
    acks.extend((0..3).map(|i| (n + i, batch_ts)));
    // The records carry the acknowledged timestamps.
    let (records, next) = read_all(&s, "/ts", 0);
    assert_eq!(next, n + 3);
    for (record, (seq, ts)) in records.iter().zip(&acks) {
        assert_eq!((record.seq, record.timestamp), (*seq, *ts));
    }

    // Across a kill -9: later than every timestamp before it, and the old records keep theirs.
    s.restart();
    let r = post(&s, "/ts", &[], b"after");
    let after = applied(&r, n + 3, n + 4);
    assert!(
        after > batch_ts,
        "{after} after a restart, {batch_ts} before"
    );
    let more = pipelined(&s, "c");
    check_increasing(&more, n + 4);
    assert!(more[0].1 > after);
    let (again, _) = read_all(&s, "/ts", 0);
    for (record, (seq, ts)) in again.iter().zip(&acks) {
        assert_eq!(
            (record.seq, record.timestamp),
            (*seq, *ts),
            "after the restart"
        );
    }
    for pair in again.windows(2) {
        assert!(
            pair[1].timestamp > pair[0].timestamp
                || (pair[1].timestamp == pair[0].timestamp
                    && pair[0].seq >= n
                    && pair[1].seq <= n + 2),
            "stored timestamps: {} then {}",
            pair[0].timestamp,
            pair[1].timestamp
        );
    }
}

// ---------------------------------------------------------------------------- the listing

#[test]
fn listing_reports_live_offsets() {
    let s = Server::start(&["--cores", "2"]);
    let names = ["/l/a", "/l/b", "/l/c", "/l/d", "/l/e"];
    let mut conn = s.connect();
    for (i, name) in names.iter().enumerate() {
        create(&s, name, &[("content-type", "text/plain")], b"");
        for j in 0..=i {
            on(&mut conn, "POST", name, &[], format!("{j}").as_bytes()).expect(200);
        }
    }
    // Right after the appends, no waiting: the same values as HEAD.
    let entries = listed(&s, "/l/");
    assert_eq!(entries.len(), names.len());
    for (i, name) in names.iter().enumerate() {
        let h = head(&s, name);
        let e = &entries[*name];
        assert_eq!(e["next_seq"], (i + 1) as u64, "{e}");
        assert_eq!(e["next_seq"].to_string(), h.h("pico-next-seq"));
        assert_eq!(e["start_seq"].to_string(), h.h("pico-start-seq"));
        assert_eq!(e["content_type"], "text/plain");
        assert_eq!(e["closed"], false);
    }
    // Every append shows at once.
    for k in 0..10u64 {
        on(&mut conn, "POST", "/l/a", &[], b"more").expect(200);
        assert_eq!(listed(&s, "/l/a")["/l/a"]["next_seq"], 2 + k);
    }
    // Trims and closes too.
    post(&s, "/l/c", &[("pico-trim-seq", "2")], b"").expect(200);
    post(&s, "/l/d", &[CLOSE], b"").expect(200);
    let entries = listed(&s, "/l/");
    assert_eq!(entries["/l/c"]["start_seq"], 2);
    assert_eq!(entries["/l/c"]["next_seq"], 3);
    assert_eq!(entries["/l/d"]["closed"], true);
    assert_eq!(
        entries["/l/c"]["start_seq"].to_string(),
        head(&s, "/l/c").h("pico-start-seq")
    );
    // Paging.
    let page = list(&s, "prefix=/l/&limit=2");
    let names_of = |v: &Value| -> Vec<String> {
        v["streams"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["name"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(names_of(&page), ["/l/a", "/l/b"]);
    assert_eq!(page["has_more"], true);
    let page = list(&s, "prefix=/l/&start_after=/l/b&limit=2");
    assert_eq!(names_of(&page), ["/l/c", "/l/d"]);
    assert_eq!(page["has_more"], true);
    let page = list(&s, "prefix=/l/&start_after=/l/d");
    assert_eq!(names_of(&page), ["/l/e"]);
    assert_eq!(page["has_more"], false);
    error(&req(&s, "GET", "/?limit=x", &[], b""), 400, "bad_request");
}

// ---------------------------------------------------------------- CORS and common headers

#[test]
fn cors_on_every_response_and_preflight() {
    let s = Server::start(&["--cores", "1", "--max-body-size", "1024"]);
    for path in ["/", "/any/path", "/nope"] {
        let r = req(
            &s,
            "OPTIONS",
            path,
            &[
                ("origin", "https://example.com"),
                ("access-control-request-method", "POST"),
                (
                    "access-control-request-headers",
                    "if-none-match, authorization",
                ),
            ],
            b"",
        );
        r.expect(204);
        let methods: Vec<String> = r
            .h("access-control-allow-methods")
            .split(',')
            .map(|m| m.trim().to_string())
            .collect();
        for m in ["GET", "PUT", "POST", "DELETE", "HEAD", "OPTIONS"] {
            assert!(methods.iter().any(|x| x == m), "{m}: {}", r.describe());
        }
        let allowed: Vec<String> = r
            .h("access-control-allow-headers")
            .split(',')
            .map(|h| h.trim().to_ascii_lowercase())
            .collect();
        for h in [
            "if-none-match",
            "authorization",
            "content-type",
            "last-event-id",
            "pico-match-seq",
            "pico-trim-seq",
            "pico-ttl",
            "pico-expires-at",
            "pico-closed",
            "pico-producer-id",
            "pico-producer-epoch",
            "pico-producer-seq",
        ] {
            assert!(
                allowed.iter().any(|x| x == h),
                "allow-headers lacks {h}: {}",
                r.describe()
            );
        }
        assert!(r.h_u64("access-control-max-age") > 0);
    }

    // Every kind of response (`req` checks the CORS headers of each).
    create(&s, "/cors", &[("content-type", "text/plain")], b"x");
    req(&s, "PUT", "/cors", &[("content-type", "text/plain")], b"").expect(200);
    post(&s, "/cors", &[], b"y").expect(200);
    let r = req(&s, "GET", "/cors", &[], b"");
    r.expect(200);
    let etag = r.h("etag").to_string();
    req(&s, "GET", "/cors", &[("if-none-match", &etag)], b"").expect(304);
    head(&s, "/cors").expect(200);
    head(&s, "/nope").expect(404);
    req(&s, "GET", "/", &[], b"").expect(200);
    req(&s, "GET", "/cors?seq=1&live=long-poll", &[], b"").expect(200);
    error(&req(&s, "GET", "/nope", &[], b""), 404, "not_found");
    error(
        &req(&s, "TRACE", "/cors", &[], b""),
        405,
        "method_not_allowed",
    );
    error(
        &post(&s, "/cors", &[("pico-match-seq", "0")], b"z"),
        412,
        "match_failed",
    );
    error(
        &req(
            &s,
            "PUT",
            "/cors",
            &[("content-type", "application/json")],
            b"",
        ),
        409,
        "conflict",
    );
    produce(&s, "/cors", ("p", 1, 0), &[], b"z").expect(200);
    error(&produce(&s, "/cors", ("p", 0, 0), &[], b"z"), 403, "fenced");
    error(
        &produce(&s, "/cors", ("p", 1, 2), &[], b"z"),
        409,
        "sequence_gap",
    );
    post(&s, "/cors", &[("pico-trim-seq", "1")], b"").expect(200);
    error(&req(&s, "GET", "/cors?seq=0", &[], b""), 410, "offset_gone");
    post(&s, "/cors", &[CLOSE], b"").expect(200);
    error(&post(&s, "/cors", &[], b"z"), 409, "closed");
    error(&post(&s, "/cors", &[], &[b'z'; 2000]), 413, "too_large");
    req(&s, "DELETE", "/cors", &[], b"").expect(204);
    error(&req(&s, "DELETE", "/cors", &[], b""), 404, "not_found");
    // Errors found by the HTTP layer.
    for raw in [
        &b"GARBAGE\r\n\r\n"[..],
        b"POST /x HTTP/1.1\r\ntransfer-encoding: gzip\r\n\r\n",
    ] {
        let mut conn = s.connect();
        conn.raw(raw).unwrap();
        let r = conn.read_response(false).unwrap();
        check("GET", &r);
        assert!(r.status == 400 || r.status == 501, "{}", r.describe());
    }
}

// ------------------------------------------------------------------------- the body limit

#[test]
fn body_over_the_limit_is_413() {
    let s = Server::start(&["--cores", "1", "--max-body-size", "1024"]);
    create(&s, "/big", &[], b"");
    applied(&post(&s, "/big", &[], &[b'x'; 1024]), 0, 1);
    let mut conn = s.connect();
    let r = on(&mut conn, "POST", "/big", &[], &[b'y'; 1025]);
    let body = error(&r, 413, "too_large");
    assert!(body["message"].is_string());
    assert!(conn.at_eof(), "connection still open after a 413");
    // A create with a body and a JSON batch count the same way.
    error(
        &req(&s, "PUT", "/big2", &[], &[b'y'; 1025]),
        413,
        "too_large",
    );
    head(&s, "/big2").expect(404);
    let batch = json_batch(&[&"z".repeat(600), &"z".repeat(600)]);
    error(&post(&s, "/big", &[JSON_BATCH], &batch), 413, "too_large");
    assert_eq!(head(&s, "/big").header("pico-next-seq"), Some("1"));
}

// -------------------------------------------------------- JSON errors and the error table

/// Every row of docs/api.md's error table that can be reached, each with its JSON body.
#[test]
fn every_error_is_json_and_every_reachable_row_of_the_error_table() {
    let s = Server::start(ONE_CORE);
    create(&s, "/e", &[("content-type", "text/plain")], b"a");

    // 400 bad_request: malformed headers, query, body and request; past the tail; new epoch
    // not at 0.
    let bad: &[(&str, &str, Headers, &[u8])] = &[
        ("PUT", "/", &[], b""),
        ("POST", "/", &[], b"x"),
        ("PUT", "/e2", &[("pico-ttl", "01")], b""),
        ("PUT", "/e2", &[("pico-ttl", "-5")], b""),
        (
            "PUT",
            "/e2",
            &[
                ("pico-ttl", "1"),
                ("pico-expires-at", "2100-01-01T00:00:00Z"),
            ],
            b"",
        ),
        ("POST", "/e", &[], b""),
        ("POST", "/e", &[JSON_BATCH], b"{not json"),
        ("POST", "/e", &[JSON_BATCH], b"{\"records\":[]}"),
        (
            "POST",
            "/e",
            &[JSON_BATCH],
            b"{\"records\":[{\"body_b64\":\"!!\"}]}",
        ),
        (
            "POST",
            "/e",
            &[("content-type", "application/vnd.picomq.batch")],
            b"\x02\0\0\0\x01",
        ),
        (
            "POST",
            "/e",
            &[("content-type", "application/vnd.picomq.batch")],
            b"\x01\0\0\0\x01\0",
        ),
        ("GET", "/e?seq=2", &[], b""),
        ("GET", "/e?seq=abc", &[], b""),
        ("GET", "/e?seq=", &[], b""),
        ("GET", "/e?count=-1", &[], b""),
        ("GET", "/e?bytes=01", &[], b""),
        ("GET", "/e?format=xml", &[], b""),
        ("GET", "/e?live=poll", &[], b""),
        ("GET", "/e", &[("last-event-id", "abc")], b""),
        ("GET", "/?limit=-1", &[], b""),
    ];
    for (method, path, headers, body) in bad {
        let r = req(&s, method, path, headers, body);
        assert_eq!(
            r.status,
            400,
            "{method} {path} {headers:?}:\n{}",
            r.describe()
        );
        error(&r, 400, "bad_request");
    }
    let long = format!("/{}", "n".repeat(1100));
    error(&req(&s, "PUT", &long, &[], b""), 400, "bad_request");
    applied(&produce(&s, "/e", ("p", 0, 0), &[], b"b"), 1, 2);
    error(
        &produce(&s, "/e", ("p", 1, 3), &[], b"x"),
        400,
        "bad_request",
    );

    // 403 fenced.
    applied(&produce(&s, "/e", ("p", 2, 0), &[], b"c"), 2, 3);
    let r = produce(&s, "/e", ("p", 1, 0), &[], b"x");
    error(&r, 403, "fenced");
    assert_eq!(r.header("pico-producer-epoch"), Some("2"));

    // 404 not_found for every operation on a missing stream (HEAD without a body).
    for (method, path, headers) in [
        ("GET", "/missing", &[][..]),
        ("GET", "/missing?live=long-poll", &[]),
        ("GET", "/missing?live=sse", &[]),
        ("GET", "/missing?seq=now", &[]),
        ("GET", "/missing", &[("accept", "text/event-stream")]),
        ("POST", "/missing", &[]),
        ("POST", "/missing", &[("pico-trim-seq", "0")]),
        ("DELETE", "/missing", &[]),
    ] {
        let body: &[u8] = if method == "POST" && headers.is_empty() {
            b"x"
        } else {
            b""
        };
        let r = req(&s, method, path, headers, body);
        assert_eq!(r.status, 404, "{method} {path}:\n{}", r.describe());
        error(&r, 404, "not_found");
    }
    head(&s, "/missing").expect(404);

    // 405 method_not_allowed, JSON too.
    for (method, path) in [
        ("PATCH", "/"),
        ("TRACE", "/e"),
        ("FOO", "/e"),
        ("DELETE", "/"),
        ("CONNECT", "/e"),
    ] {
        let r = req(&s, method, path, &[], b"");
        assert_eq!(r.status, 405, "{method} {path}:\n{}", r.describe());
        error(&r, 405, "method_not_allowed");
    }
    head(&s, "/").expect(405);

    // 409 conflict (with next_seq), closed, sequence_gap.
    let body = error(
        &req(&s, "PUT", "/e", &[("content-type", "image/png")], b""),
        409,
        "conflict",
    );
    assert_eq!(body["next_seq"], 3);
    error(
        &req(
            &s,
            "PUT",
            "/e",
            &[("content-type", "text/plain"), ("pico-ttl", "5")],
            b"",
        ),
        409,
        "conflict",
    );
    let r = produce(&s, "/e", ("p", 2, 5), &[], b"x");
    error(&r, 409, "sequence_gap");
    assert_eq!(r.header("pico-expected-seq"), Some("1"));
    assert_eq!(r.header("pico-received-seq"), Some("5"));

    // 410 offset_gone.
    post(&s, "/e", &[("pico-trim-seq", "1")], b"").expect(200);
    assert_eq!(
        error(&req(&s, "GET", "/e?seq=0", &[], b""), 410, "offset_gone")["next_seq"],
        1
    );

    // 412 match_failed.
    assert_eq!(
        error(
            &post(&s, "/e", &[("pico-match-seq", "0")], b"x"),
            412,
            "match_failed"
        )["next_seq"],
        3
    );

    // 409 closed (with Pico-Closed and next_seq).
    post(&s, "/e", &[CLOSE], b"").expect(200);
    let r = post(&s, "/e", &[], b"x");
    assert_eq!(error(&r, 409, "closed")["next_seq"], 3);
    assert_eq!(r.header("pico-closed"), Some("true"));
    // A create of the name now differs in the closed flag: 409 conflict.
    let r = req(&s, "PUT", "/e", &[("content-type", "text/plain")], b"");
    error(&r, 409, "conflict");
    let r = req(
        &s,
        "PUT",
        "/e",
        &[("content-type", "text/plain"), CLOSE],
        b"",
    );
    r.expect(200);
    assert_eq!(r.header("pico-closed"), Some("true"));

    // 413: see d14. 431 bad_request: too many headers, or a head over 64 KiB.
    let mut conn = s.connect();
    let many: Vec<(String, String)> = (0..101).map(|i| (format!("x-h{i}"), "v".into())).collect();
    let many: Vec<(&str, &str)> = many.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
    let r = on(&mut conn, "GET", "/e", &many, b"");
    error(&r, 431, "bad_request");

    // Malformed requests from the HTTP layer: JSON 400s.
    for raw in [
        &b"GARBAGE\r\n\r\n"[..],
        b"GET /e HTTP/9.9\r\n\r\n",
        b"GET /e HTTP/1.1\r\nbad header line\r\n\r\n",
        b"POST /e HTTP/1.1\r\ncontent-length: abc\r\n\r\n",
        b"POST /e HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
    ] {
        let mut conn = s.connect();
        conn.raw(raw).unwrap();
        let r = conn
            .read_response(false)
            .unwrap_or_else(|e| panic!("{:?}: {e}", String::from_utf8_lossy(raw)));
        check("GET", &r);
        assert_eq!(
            r.status,
            400,
            "{:?}:\n{}",
            String::from_utf8_lossy(raw),
            r.describe()
        );
        error(&r, 400, "bad_request");
    }
    // An unsupported transfer coding: 501, JSON as well.
    let mut conn = s.connect();
    conn.raw(b"POST /e HTTP/1.1\r\ntransfer-encoding: gzip\r\n\r\n")
        .unwrap();
    let r = conn.read_response(false).unwrap();
    check("POST", &r);
    r.expect(501);

    // Still serving.
    assert_eq!(bodies(&s, "/e", 1), ["b", "c"]);
}

/// A request head over 64 KiB is `431`, whether it arrives in pieces or at once.
#[test]
fn request_head_over_64_kib_is_431() {
    let s = Server::start(ONE_CORE);
    create(&s, "/h", &[], b"x");
    let huge = "v".repeat(70 * 1024);
    // In pieces: 70 KiB of head without its end, then a pause.
    let mut conn = s.connect();
    let head = format!("GET /h HTTP/1.1\r\nhost: x\r\nx-huge: {huge}\r\n");
    conn.raw(head.as_bytes()).unwrap();
    let r = conn
        .read_response(false)
        .expect("a response to a 70 KiB partial head");
    check("GET", &r);
    error(&r, 431, "bad_request");
    // At once: the same head, complete.
    let mut conn = s.connect();
    let r = conn.request("GET", "/h", &[("x-huge", &huge)], b"");
    match r {
        Ok(r) => {
            check("GET", &r);
            assert_eq!(
                r.status,
                431,
                "a complete 70 KiB request head was served:\n{}",
                r.describe()
            );
            error(&r, 431, "bad_request");
        }
        // The server may close before reading all of it (a reset): refused all the same.
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}"),
    }
}
