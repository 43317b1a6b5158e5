//! End-to-end tests of SSE (docs/api.md, "Read", the SSE paragraph) against a real
//! `pico serve` over real sockets: the exact framing, `Last-Event-ID` resume, `Accept:
//! text/event-stream`, chunking, the end of the response (closed stream, deleted stream,
//! `--sse-max-duration-sec`) and the errors before the stream starts.
//!
//! The `: keep-alive` comments come every `--long-poll-timeout-sec` (25 s), longer than any
//! test here waits unless it sets a shorter one; the exact framing tests assert that none
//! arrives in between.

mod common;

use std::io::Read;
use std::time::{Duration, Instant};

use common::{Conn, Resp, Server};
use serde_json::{json, Value};

const ONE_CORE: &[&str] = &["--cores", "1"];
/// How long any one event (or the end of a response) may take to arrive: a bound for a
/// broken server, far beyond what a busy machine delays an answer by.
const EVENT_TIMEOUT: Duration = Duration::from_secs(30);

/// An SSE response being read: the head, then events as they arrive.
struct Sse {
    conn: Conn,
    head: Resp,
    /// Bytes after the head not yet decoded from the chunked encoding.
    raw: Vec<u8>,
    /// Decoded body bytes not yet split into events.
    body: Vec<u8>,
    /// The last chunk was read.
    ended: bool,
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Sends a GET and reads the response head. An SSE response (chunked) is returned as `Ok`,
/// anything else (with its `Content-Length` body) as `Err`.
fn open(s: &Server, path: &str, headers: &[(&str, &str)]) -> Result<Sse, Resp> {
    open_with(s, path, headers, true)
}

/// [`open`], checking the Pico protocol's common headers if `pico`.
fn open_with(s: &Server, path: &str, headers: &[(&str, &str)], pico: bool) -> Result<Sse, Resp> {
    let mut conn = s.connect();
    conn.send("GET", path, headers, b"")
        .expect("send the request");
    let mut raw = Vec::new();
    let deadline = Instant::now() + EVENT_TIMEOUT;
    let head_end = loop {
        if let Some(i) = find(&raw, b"\r\n\r\n") {
            break i;
        }
        read_some(&mut conn, &mut raw, deadline, "the response head");
    };
    let text = String::from_utf8_lossy(&raw[..head_end]).into_owned();
    raw.drain(..head_end + 4);
    let mut lines = text.split("\r\n");
    let status: u16 = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("bad response head {text:?}"));
    let headers = lines
        .map(|l| {
            let (n, v) = l.split_once(':').expect("header line");
            (n.trim().to_ascii_lowercase(), v.trim().to_string())
        })
        .collect();
    let mut head = Resp {
        status,
        headers,
        body: Vec::new(),
    };
    if pico {
        check_common(&head);
    }
    if head.header("transfer-encoding") == Some("chunked") {
        return Ok(Sse {
            conn,
            head,
            raw,
            body: Vec::new(),
            ended: false,
        });
    }
    let length: usize = head
        .header("content-length")
        .map_or(0, |l| l.parse().unwrap());
    while raw.len() < length {
        read_some(&mut conn, &mut raw, deadline, "the response body");
    }
    head.body = raw[..length].to_vec();
    Err(head)
}

/// Opens an SSE response of the Durable Streams protocol (whose headers differ).
#[track_caller]
fn open_sse_unchecked(s: &Server, path: &str) -> Sse {
    match open_with(s, path, &[], false) {
        Ok(sse) => sse,
        Err(r) => panic!("GET {path} is not an event stream:\n{}", r.describe()),
    }
}

/// Opens an SSE response that must start with `200 text/event-stream`.
#[track_caller]
fn open_sse(s: &Server, path: &str, headers: &[(&str, &str)]) -> Sse {
    match open(s, path, headers) {
        Ok(sse) => {
            let h = &sse.head;
            assert_eq!(h.status, 200, "{}", h.describe());
            assert_eq!(
                h.header("content-type"),
                Some("text/event-stream"),
                "{}",
                h.describe()
            );
            assert_eq!(
                h.header("cache-control"),
                Some("no-cache"),
                "{}",
                h.describe()
            );
            assert_eq!(h.header("content-length"), None, "{}", h.describe());
            sse
        }
        Err(r) => panic!(
            "GET {path} {headers:?} is not an event stream:\n{}",
            r.describe()
        ),
    }
}

/// One read from the socket into `buf`, bounded by `deadline`; panics on timeout or EOF.
fn read_some(conn: &mut Conn, buf: &mut Vec<u8>, deadline: Instant, what: &str) {
    let left = deadline.saturating_duration_since(Instant::now());
    assert!(
        !left.is_zero(),
        "timed out waiting for {what}; have {:?}",
        String::from_utf8_lossy(buf)
    );
    conn.set_read_timeout(left);
    let mut chunk = [0u8; 16 * 1024];
    match conn.stream.read(&mut chunk) {
        Ok(0) => panic!(
            "connection closed while waiting for {what}; have {:?}",
            String::from_utf8_lossy(buf)
        ),
        Ok(n) => buf.extend_from_slice(&chunk[..n]),
        Err(e) => panic!(
            "waiting for {what}: {e}; have {:?}",
            String::from_utf8_lossy(buf)
        ),
    }
}

impl Sse {
    /// Decodes the complete chunks in `raw`; true if it made progress.
    fn decode(&mut self) -> bool {
        let mut progress = false;
        while !self.ended {
            let Some(line_end) = find(&self.raw, b"\r\n") else {
                break;
            };
            let line = String::from_utf8_lossy(&self.raw[..line_end]).into_owned();
            let size_text = line.split(';').next().unwrap_or_default().trim();
            let size = usize::from_str_radix(size_text, 16)
                .unwrap_or_else(|_| panic!("bad chunk size line {line:?}"));
            if size == 0 {
                // The last chunk: no trailers are expected, just the final CRLF.
                if self.raw.len() < line_end + 4 {
                    break;
                }
                assert_eq!(
                    &self.raw[line_end..line_end + 4],
                    b"\r\n\r\n",
                    "end of the chunked body"
                );
                self.raw.drain(..line_end + 4);
                self.ended = true;
                return true;
            }
            let total = line_end + 2 + size + 2;
            if self.raw.len() < total {
                break;
            }
            assert_eq!(&self.raw[total - 2..total], b"\r\n", "chunk terminator");
            self.body
                .extend_from_slice(&self.raw[line_end + 2..total - 2]);
            self.raw.drain(..total);
            progress = true;
        }
        progress
    }

    /// The next event's text (without its blank line), or `None` when the response ended.
    #[track_caller]
    fn next_raw(&mut self, timeout: Duration) -> Option<String> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(i) = find(&self.body, b"\n\n") {
                let event = String::from_utf8(self.body[..i].to_vec()).expect("UTF-8 event");
                self.body.drain(..i + 2);
                return Some(event);
            }
            if self.ended {
                assert!(
                    self.body.is_empty(),
                    "the response ended inside an event: {:?}",
                    String::from_utf8_lossy(&self.body)
                );
                return None;
            }
            if !self.decode() {
                read_some(
                    &mut self.conn,
                    &mut self.raw,
                    deadline,
                    "the next SSE event",
                );
            }
        }
    }

    /// The next event, which must exist.
    #[track_caller]
    fn next(&mut self) -> String {
        self.next_raw(EVENT_TIMEOUT)
            .expect("the SSE response ended early")
    }

    /// Asserts the response ends (after the last chunk) within `timeout`.
    #[track_caller]
    fn expect_end(&mut self, timeout: Duration) {
        if let Some(event) = self.next_raw(timeout) {
            panic!("expected the end of the response, got the event {event:?}");
        }
    }

    /// The connection after a completed response (keep-alive).
    fn into_conn(self) -> Conn {
        assert!(self.ended && self.raw.is_empty() && self.body.is_empty());
        let mut conn = self.conn;
        conn.set_read_timeout(common::IO_TIMEOUT);
        conn
    }
}

/// Fields of an event: `event`, `id`, `data` (lines joined by `\n`), `retry`.
#[derive(Debug, Default, PartialEq, Eq)]
struct Event {
    event: Option<String>,
    id: Option<String>,
    data: Option<String>,
    retry: Option<String>,
    comment: bool,
}

fn parse(text: &str) -> Event {
    let mut event = Event::default();
    for line in text.split('\n') {
        if line.starts_with(':') {
            event.comment = true;
            continue;
        }
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        let value = value.strip_prefix(' ').unwrap_or(value).to_string();
        match field {
            "event" => event.event = Some(value),
            "id" => event.id = Some(value),
            "retry" => event.retry = Some(value),
            "data" => {
                event.data = Some(match event.data.take() {
                    Some(before) => format!("{before}\n{value}"),
                    None => value,
                })
            }
            other => panic!("unknown SSE field {other:?} in {text:?}"),
        }
    }
    event
}

/// The exact text of a control event.
fn control(next: u64, up_to_date: bool, closed: bool) -> String {
    let closed = if closed { "\"closed\":true," } else { "" };
    format!("event: control\nid: {next}\ndata:{{{closed}\"next_seq\":{next},\"up_to_date\":{up_to_date}}}")
}

/// The exact text of a data event: the JSON read format of the records, `id` = the next offset.
fn data(next: u64, json: &str) -> String {
    format!("event: data\nid: {next}\ndata:{json}")
}

#[track_caller]
fn check_common(r: &Resp) {
    r.expect_every_response_headers();
    let expose = r.h("access-control-expose-headers").to_ascii_lowercase();
    assert!(expose.contains("pico-next-seq"), "{}", r.describe());
}

#[track_caller]
fn req(s: &Server, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Resp {
    let r = s.request(method, path, headers, body);
    check_common(&r);
    r
}

/// The body of a catch-up JSON read (the reference for data events).
#[track_caller]
fn json_read(s: &Server, path: &str) -> String {
    let r = req(s, "GET", path, &[], b"");
    r.expect(200);
    r.text()
}

#[track_caller]
fn append(s: &Server, name: &str, headers: &[(&str, &str)], body: &[u8]) -> Resp {
    let r = req(s, "POST", name, headers, body);
    r.expect(200);
    r
}

/// Request headers as the tables of cases give them.
type Headers<'a> = &'a [(&'a str, &'a str)];

const JSON_BATCH: (&str, &str) = ("content-type", "application/vnd.picomq.batch+json");
const CLOSE: (&str, &str) = ("pico-closed", "true");

#[test]
fn framing_is_exact_live_and_ends_after_the_close() {
    let s = Server::start(ONE_CORE);
    req(&s, "PUT", "/e", &[("content-type", "text/plain")], b"").expect(201);
    let batch = json!({"records": [{"headers": {"k": "v"}, "body": "one"}, {"body_b64": "AAE="}]});
    append(&s, "/e", &[JSON_BATCH], batch.to_string().as_bytes());
    let backlog = json_read(&s, "/e?seq=0");

    let mut sse = open_sse(&s, "/e?live=sse&seq=0", &[]);
    // The retry hint first, then the backlog as a data event and its control event.
    assert_eq!(sse.next(), "retry: 1000");
    assert_eq!(sse.next(), data(2, &backlog));
    assert_eq!(sse.next(), control(2, true, false));
    // Live: each append is a data event followed by a control event.
    append(&s, "/e", &[], b"three");
    assert_eq!(sse.next(), data(3, &json_read(&s, "/e?seq=2")));
    assert_eq!(sse.next(), control(3, true, false));
    let batch = json!({"records": [{"body": "four"}, {"body": "five"}]});
    append(&s, "/e", &[JSON_BATCH], batch.to_string().as_bytes());
    assert_eq!(sse.next(), data(5, &json_read(&s, "/e?seq=3")));
    assert_eq!(sse.next(), control(5, true, false));
    // A close-only request: the final control event, then the response ends.
    append(&s, "/e", &[CLOSE], b"");
    assert_eq!(sse.next(), control(5, true, true));
    sse.expect_end(EVENT_TIMEOUT);
    // The connection stays usable.
    let mut conn = sse.into_conn();
    let r = conn.request("GET", "/e?seq=5", &[], b"").unwrap();
    r.expect(200);
    assert_eq!(r.header("pico-closed"), Some("true"));
}

#[test]
fn close_with_data_ends_after_its_data_and_closed_streams_end_at_once() {
    let s = Server::start(ONE_CORE);
    req(&s, "PUT", "/c", &[("content-type", "text/plain")], b"").expect(201);
    // An empty stream: the retry hint and one up-to-date control event.
    let mut sse = open_sse(&s, "/c?live=sse", &[]);
    assert_eq!(sse.next(), "retry: 1000");
    assert_eq!(sse.next(), control(0, true, false));
    append(&s, "/c", &[CLOSE], b"last");
    assert_eq!(sse.next(), data(1, &json_read(&s, "/c?seq=0")));
    assert_eq!(sse.next(), control(1, true, true));
    sse.expect_end(EVENT_TIMEOUT);

    // Already closed: from the start, the data then the final control; from the tail, only
    // the final control.
    let mut sse = open_sse(&s, "/c?live=sse&seq=0", &[]);
    assert_eq!(sse.next(), "retry: 1000");
    assert_eq!(sse.next(), data(1, &json_read(&s, "/c?seq=0")));
    assert_eq!(sse.next(), control(1, true, true));
    sse.expect_end(EVENT_TIMEOUT);
    for path in ["/c?live=sse&seq=1", "/c?live=sse&seq=now"] {
        let mut sse = open_sse(&s, path, &[]);
        assert_eq!(sse.next(), "retry: 1000");
        assert_eq!(sse.next(), control(1, true, true), "{path}");
        sse.expect_end(EVENT_TIMEOUT);
    }
}

#[test]
fn last_event_id_resumes_and_accept_header_selects_sse() {
    let s = Server::start(ONE_CORE);
    req(&s, "PUT", "/r", &[("content-type", "text/plain")], b"").expect(201);
    for body in ["a", "b", "c", "d"] {
        append(&s, "/r", &[], body.as_bytes());
    }
    // EventSource style: `Accept: text/event-stream`, no `live`, resuming with Last-Event-ID.
    let mut sse = open_sse(
        &s,
        "/r",
        &[("accept", "text/event-stream"), ("last-event-id", "2")],
    );
    assert_eq!(sse.next(), "retry: 1000");
    assert_eq!(sse.next(), data(4, &json_read(&s, "/r?seq=2")));
    assert_eq!(sse.next(), control(4, true, false));
    // A client that drops the connection and reconnects with the last id misses nothing and
    // sees nothing twice.
    drop(sse);
    append(&s, "/r", &[], b"e");
    let mut sse = open_sse(&s, "/r?live=sse", &[("last-event-id", "4")]);
    assert_eq!(sse.next(), "retry: 1000");
    assert_eq!(sse.next(), data(5, &json_read(&s, "/r?seq=4")));
    let event = parse(&sse.next());
    assert_eq!(event.event.as_deref(), Some("control"));
    // Resuming at the tail: only the control event.
    let mut sse = open_sse(
        &s,
        "/r",
        &[("accept", "text/event-stream"), ("last-event-id", "5")],
    );
    assert_eq!(sse.next(), "retry: 1000");
    assert_eq!(sse.next(), control(5, true, false));
    // `seq` wins over Last-Event-ID; `seq=now` starts at the tail.
    let mut sse = open_sse(&s, "/r?live=sse&seq=3", &[("last-event-id", "1")]);
    assert_eq!(sse.next(), "retry: 1000");
    assert_eq!(sse.next(), data(5, &json_read(&s, "/r?seq=3")));
    let mut sse = open_sse(&s, "/r?live=sse&seq=now", &[]);
    assert_eq!(sse.next(), "retry: 1000");
    assert_eq!(sse.next(), control(5, true, false));
    // An Accept list that includes the event stream.
    let mut sse = open_sse(
        &s,
        "/r?seq=4",
        &[("accept", "text/event-stream, */*;q=0.1")],
    );
    assert_eq!(sse.next(), "retry: 1000");
    assert_eq!(sse.next(), data(5, &json_read(&s, "/r?seq=4")));

    // Without SSE, Last-Event-ID is still the default start of a catch-up read.
    let r = req(&s, "GET", "/r", &[("last-event-id", "3")], b"");
    r.expect(200);
    assert_eq!(r.text(), json_read(&s, "/r?seq=3"));

    // With an explicit `live`, the parameter decides; other Accept values are catch-up reads.
    let r = req(
        &s,
        "GET",
        "/r?seq=0&live=long-poll",
        &[("accept", "text/event-stream")],
        b"",
    );
    r.expect(200);
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert!(r.header("pico-cursor").is_some(), "{}", r.describe());
    let r = req(
        &s,
        "GET",
        "/r?seq=0",
        &[("accept", "application/json")],
        b"",
    );
    r.expect(200);
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(r.json().as_array().unwrap().len(), 5);
}

#[test]
fn large_backlogs_come_in_chunks_each_with_a_control_event() {
    let s = Server::start(&["--cores", "1", "--max-chunk-size", "1024"]);
    req(&s, "PUT", "/big", &[("content-type", "text/plain")], b"").expect(201);
    let records: Vec<Value> = (0..6)
        .map(|i| json!({"body": format!("{i}{}", "x".repeat(500))}))
        .collect();
    let batch = json!({ "records": records });
    append(&s, "/big", &[JSON_BATCH], batch.to_string().as_bytes());
    let all: Value = serde_json::from_str(&json_read(&s, "/big?seq=0&bytes=1048576")).unwrap();
    assert_eq!(all.as_array().unwrap().len(), 6);

    let mut sse = open_sse(&s, "/big?live=sse", &[]);
    assert_eq!(sse.next(), "retry: 1000");
    let mut got: Vec<Value> = Vec::new();
    let mut data_events = 0;
    while got.len() < 6 {
        let event = parse(&sse.next());
        assert_eq!(event.event.as_deref(), Some("data"), "{event:?}");
        data_events += 1;
        let chunk: Value = serde_json::from_str(event.data.as_deref().unwrap()).unwrap();
        got.extend(chunk.as_array().unwrap().iter().cloned());
        let next = got.len() as u64;
        assert_eq!(
            event.id,
            Some(next.to_string()),
            "data id = the offset after the chunk"
        );
        // Every data event is followed by its control event; up to date only at the tail.
        assert_eq!(sse.next(), control(next, next == 6, false));
    }
    assert!(
        data_events > 1,
        "a 3 KiB backlog with 1 KiB chunks came in one event"
    );
    assert_eq!(Value::Array(got), all);
}

#[test]
fn the_response_ends_at_the_duration_cap() {
    let s = Server::start(&["--cores", "1", "--sse-max-duration-sec", "1"]);
    req(&s, "PUT", "/cap", &[("content-type", "text/plain")], b"").expect(201);
    append(&s, "/cap", &[], b"a");
    // Idle after the backlog: the response still ends by itself.
    let t = Instant::now();
    let mut sse = open_sse(&s, "/cap?live=sse", &[]);
    assert_eq!(sse.next(), "retry: 1000");
    assert_eq!(sse.next(), data(1, &json_read(&s, "/cap?seq=0")));
    assert_eq!(sse.next(), control(1, true, false));
    // Ends at the cap, never before; "not much after" is bounded by the reads' timeout, far
    // beyond any scheduling delay.
    loop {
        match sse.next_raw(EVENT_TIMEOUT) {
            None => break,
            Some(event) => assert!(parse(&event).comment, "unexpected event {event:?}"),
        }
    }
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(900),
        "the SSE response ended after {took:?}"
    );
    // The client reconnects with the last id and gets what was appended meanwhile.
    append(&s, "/cap", &[], b"b");
    let mut sse = open_sse(&s, "/cap?live=sse", &[("last-event-id", "1")]);
    assert_eq!(sse.next(), "retry: 1000");
    assert_eq!(sse.next(), data(2, &json_read(&s, "/cap?seq=1")));

    // A busy stream is cut at the cap as well: appends keep coming until the response ends
    // (however many fit in the cap on this machine), and it does end.
    let t = Instant::now();
    let mut sse = open_sse(&s, "/cap?live=sse&seq=now", &[]);
    let mut events = 0;
    loop {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "the busy SSE response did not end"
        );
        append(&s, "/cap", &[], b"c");
        match sse.next_raw(EVENT_TIMEOUT) {
            Some(_) => events += 1,
            None => break,
        }
    }
    assert!(events >= 1);
    assert!(
        t.elapsed() >= Duration::from_millis(900),
        "ended after {:?}",
        t.elapsed()
    );
}

#[test]
fn a_deleted_stream_ends_the_response() {
    let s = Server::start(ONE_CORE);
    req(&s, "PUT", "/d", &[], b"").expect(201);
    let mut sse = open_sse(&s, "/d?live=sse", &[]);
    assert_eq!(sse.next(), "retry: 1000");
    assert_eq!(sse.next(), control(0, true, false));
    req(&s, "DELETE", "/d", &[], b"").expect(204);
    sse.expect_end(EVENT_TIMEOUT);
    // A reconnect learns why.
    let r = open(&s, "/d?live=sse", &[])
        .err()
        .expect("not an event stream");
    r.expect_error(404, "not_found");
}

#[test]
fn errors_come_before_the_stream_and_are_json() {
    let s = Server::start(ONE_CORE);
    req(&s, "PUT", "/x", &[("content-type", "text/plain")], b"").expect(201);
    for body in ["a", "b", "c"] {
        append(&s, "/x", &[], body.as_bytes());
    }
    req(&s, "POST", "/x", &[("pico-trim-seq", "2")], b"").expect(200);
    let cases: &[(&str, Headers, u16, &str)] = &[
        ("/missing?live=sse", &[], 404, "not_found"),
        (
            "/missing",
            &[("accept", "text/event-stream")],
            404,
            "not_found",
        ),
        ("/x?live=sse&seq=4", &[], 400, "bad_request"),
        ("/x?live=sse", &[("last-event-id", "9")], 400, "bad_request"),
        (
            "/x?live=sse",
            &[("last-event-id", "abc")],
            400,
            "bad_request",
        ),
        ("/x?live=sse&seq=1", &[], 410, "offset_gone"),
        ("/x?live=sse", &[], 410, "offset_gone"),
        (
            "/x",
            &[("accept", "text/event-stream"), ("last-event-id", "0")],
            410,
            "offset_gone",
        ),
    ];
    for (path, headers, status, code) in cases {
        let r = match open(&s, path, headers) {
            Err(r) => r,
            Ok(sse) => panic!(
                "{path} {headers:?}: an event stream:\n{}",
                sse.head.describe()
            ),
        };
        let body = r.expect_error(*status, code);
        if *status == 410 {
            assert_eq!(body["next_seq"], 2, "{}", r.describe());
            assert_eq!(r.header("pico-next-seq"), Some("2"));
        }
    }
    // From the trimmed start on, it streams; so does a read from the beginning (`seq=-1`).
    for path in ["/x?live=sse&seq=2", "/x?live=sse&seq=-1"] {
        let mut sse = open_sse(&s, path, &[]);
        assert_eq!(sse.next(), "retry: 1000");
        assert_eq!(sse.next(), data(3, &json_read(&s, "/x?seq=2")));
    }
}

/// The events of an idle SSE response read to its end (after the first `retry:` and the
/// caught-up control): how many keep-alive comments and how many other events.
fn idle_events_until_the_end(sse: &mut Sse) -> (usize, Vec<String>) {
    let mut keep_alives = 0;
    let mut others = Vec::new();
    while let Some(event) = sse.next_raw(Duration::from_secs(30)) {
        if event == ": keep-alive" {
            keep_alives += 1;
        } else {
            others.push(event);
        }
    }
    (keep_alives, others)
}

#[test]
fn the_end_of_an_idle_response_sends_no_burst_of_keep_alives() {
    // The keep-alive interval (the long-poll timeout, 25 s) is longer than the response: not
    // one keep-alive, in particular none in the last millisecond before the cap.
    let s = Server::start(&["--cores", "1", "--sse-max-duration-sec", "1"]);
    req(&s, "PUT", "/idle", &[], b"").expect(201);
    let mut sse = open_sse(&s, "/idle?live=sse", &[]);
    assert_eq!(sse.next(), "retry: 1000");
    assert_eq!(sse.next(), control(0, true, false));
    assert_eq!(idle_events_until_the_end(&mut sse), (0, Vec::new()));
}

#[test]
fn keep_alives_follow_the_long_poll_timeout_and_stop_at_the_cap() {
    // Each keep-alive takes a whole interval of idling, and the one that would fall on the
    // cap is not sent: at most 1.5 s / 0.2 s = 7, however slow the machine.
    let s = Server::start(&[
        "--cores",
        "1",
        "--sse-max-duration-sec",
        "1.5",
        "--long-poll-timeout-sec",
        "0.2",
    ]);
    req(&s, "PUT", "/idle", &[], b"").expect(201);
    let mut sse = open_sse(&s, "/idle?live=sse", &[]);
    assert_eq!(sse.next(), "retry: 1000");
    assert_eq!(sse.next(), control(0, true, false));
    let (keep_alives, others) = idle_events_until_the_end(&mut sse);
    assert_eq!(others, Vec::<String>::new());
    assert!(keep_alives <= 7, "{keep_alives} keep-alives in 1.5 s");

    // The Durable Streams listener follows the same rule with its control events.
    let s = Server::start(&[
        "--cores",
        "1",
        "--protocol",
        "ds",
        "--sse-max-duration-sec",
        "1.5",
        "--long-poll-timeout-sec",
        "0.2",
    ]);
    common::ds(
        s.addr,
        "PUT",
        "/idle",
        &[("content-type", "text/plain")],
        b"",
    )
    .expect(201);
    let mut sse = open_sse_unchecked(&s, "/idle?offset=-1&live=sse");
    let (keep_alives, controls) = idle_events_until_the_end(&mut sse);
    assert_eq!(
        keep_alives, 0,
        "the Durable Streams listener sends controls"
    );
    assert!(
        controls.iter().all(|c| c.starts_with("event: control\n")),
        "{controls:?}"
    );
    // The first control answers at once; each later one takes a whole interval.
    assert!(
        (1..=8).contains(&controls.len()),
        "{} control events in 1.5 s",
        controls.len()
    );
}

/// One sample of the server's `/metrics` page (`series` with its labels), or 0 if absent.
fn metric(s: &Server, series: &str) -> u64 {
    s.metric_sample(series).unwrap_or(0)
}

/// Waits (bounded) until `series` reads `want`.
#[track_caller]
fn wait_for_metric(s: &Server, series: &str, want: u64) {
    let deadline = Instant::now() + EVENT_TIMEOUT;
    loop {
        let have = metric(s, series);
        if have == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{series} stayed at {have}, not {want}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A subscriber waiting at the tail of a plain HTTP/1.1 connection is parked: its core holds
/// its socket and its response's state, not a task (docs/architecture.md, "Parked
/// subscribers"). Records still reach every one of them, and a client that hangs up while
/// parked frees its response at once, not at its next keep-alive.
#[test]
fn subscribers_at_the_tail_are_parked_and_a_hang_up_frees_one_at_once() {
    let s = Server::start(ONE_CORE);
    req(&s, "PUT", "/parked", &[("content-type", "text/plain")], b"").expect(201);
    let mut subscribers: Vec<Sse> = (0..8)
        .map(|_| {
            let mut sse = open_sse(&s, "/parked?live=sse", &[]);
            assert_eq!(sse.next(), "retry: 1000");
            assert_eq!(sse.next(), control(0, true, false));
            sse
        })
        .collect();
    wait_for_metric(&s, "pico_sse_parked", 8);
    for (i, body) in [b"one", b"two"].iter().enumerate() {
        append(&s, "/parked", &[], *body);
        let next = i as u64 + 1;
        let want = data(next, &json_read(&s, &format!("/parked?seq={i}")));
        for sse in &mut subscribers {
            assert_eq!(sse.next(), want);
            assert_eq!(sse.next(), control(next, true, false));
        }
        // Delivered by the core that holds them: they stay parked.
        wait_for_metric(&s, "pico_sse_parked", 8);
    }
    // Half of them hang up; the keep-alive is 25 s away, so only the watch on their sockets
    // can notice.
    subscribers.truncate(4);
    wait_for_metric(&s, "pico_sse_parked", 4);
    wait_for_metric(&s, "pico_sse_streams{core=\"0\"}", 4);
    append(&s, "/parked", &[], b"three");
    let want = data(3, &json_read(&s, "/parked?seq=2"));
    for sse in &mut subscribers {
        assert_eq!(sse.next(), want);
        assert_eq!(sse.next(), control(3, true, false));
    }
}

/// A subscriber whose socket cannot take its events at once (it is not reading) is handed
/// back to a task that writes the rest as the socket drains: nothing is lost or reordered,
/// and it is parked again once it is back at the tail.
#[test]
fn a_subscriber_that_reads_nothing_for_a_while_gets_every_event_in_order() {
    let s = Server::start(ONE_CORE);
    req(&s, "PUT", "/slow", &[("content-type", "text/plain")], b"").expect(201);
    let mut sse = open_sse(&s, "/slow?live=sse", &[]);
    assert_eq!(sse.next(), "retry: 1000");
    assert_eq!(sse.next(), control(0, true, false));
    wait_for_metric(&s, "pico_sse_parked", 1);
    // 16 MiB of events while the client reads nothing: more than the socket buffers hold.
    const RECORDS: u64 = 256;
    let body = vec![b'x'; 64 * 1024];
    for _ in 0..RECORDS {
        append(&s, "/slow", &[], &body);
    }
    let mut next_expected = 1;
    while next_expected <= RECORDS {
        let event = parse(&sse.next());
        match event.event.as_deref() {
            Some("data") => {
                let id: u64 = event.id.expect("an id").parse().expect("a number");
                assert!(id >= next_expected, "event {id} after {next_expected}");
                let records: Value =
                    serde_json::from_str(&event.data.expect("data")).expect("JSON records");
                let records = records.as_array().expect("an array");
                assert_eq!(
                    records.len() as u64,
                    id - next_expected + 1,
                    "ids without gaps"
                );
                for (i, record) in records.iter().enumerate() {
                    assert_eq!(record["seq"], json!(next_expected - 1 + i as u64));
                }
                next_expected = id + 1;
            }
            Some("control") => {}
            other => panic!("unexpected event {other:?}"),
        }
    }
    wait_for_metric(&s, "pico_sse_parked", 1);
    assert!(!s.log().contains("panic"), "{}", s.log());
}

/// A request sent behind a parked response wakes it; the response goes on to its end (here
/// the duration cap), and then the request is answered on the same connection.
#[test]
fn a_request_sent_behind_a_parked_response_is_answered_after_it() {
    let s = Server::start(&["--cores", "1", "--sse-max-duration-sec", "2"]);
    req(&s, "PUT", "/behind", &[("content-type", "text/plain")], b"").expect(201);
    append(&s, "/behind", &[], b"a");
    let mut sse = open_sse(&s, "/behind?live=sse", &[]);
    assert_eq!(sse.next(), "retry: 1000");
    assert_eq!(sse.next(), data(1, &json_read(&s, "/behind?seq=0")));
    assert_eq!(sse.next(), control(1, true, false));
    wait_for_metric(&s, "pico_sse_parked", 1);
    let next = common::encode_request("GET", "/behind?seq=0", &[], b"");
    sse.conn.raw(&next).expect("send the next request");
    // Woken by the bytes, the response is no longer parked (it has a request to answer).
    wait_for_metric(&s, "pico_sse_parked", 0);
    loop {
        match sse.next_raw(EVENT_TIMEOUT) {
            None => break,
            Some(event) => assert!(parse(&event).comment, "unexpected event {event:?}"),
        }
    }
    // The answer follows the response's last chunk, maybe in the same read.
    let mut answer = std::mem::take(&mut sse.raw);
    let deadline = Instant::now() + EVENT_TIMEOUT;
    let want = json_read(&s, "/behind?seq=0");
    while !answer.ends_with(want.as_bytes()) {
        read_some(
            &mut sse.conn,
            &mut answer,
            deadline,
            "the request behind the response",
        );
    }
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 200 "), "{answer}");
    assert!(
        answer.contains(&format!("content-length: {}\r\n", want.len())),
        "{answer}"
    );
}
