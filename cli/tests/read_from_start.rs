//! "From the beginning" on a stream whose start moved: Pico `seq=-1` (and any negative, also
//! as `Last-Event-ID`), Durable Streams `offset=-1` (and no offset) start at the first
//! readable record after a trim, in catch-up, long-poll and SSE reads, on forks whose source
//! or own start moved, and through `pico read`. An explicit position below the start stays
//! `410`, and so does a Pico read without `seq`, which is `seq=0` (docs/api.md, "Read").

mod common;

use std::io::Read;
use std::net::SocketAddr;
use std::time::Duration;

use common::{decode_binary_read, ds, Conn, Resp, Server};
use serde_json::Value;

/// Both protocols on one node (trims are Pico, forks Durable Streams); SSE responses end
/// after a second so a test can read them whole.
fn dual_server() -> (Server, SocketAddr) {
    let server = Server::start(&["--ds-listen", "127.0.0.1:0", "--sse-max-duration-sec", "1"]);
    let ds_addr = server.second.expect("the --ds-listen address is printed");
    (server, ds_addr)
}

/// A text stream with records `r0`..`r{n-1}`, one per append.
fn stream_of(server: &Server, name: &str, n: u64) {
    server.put(name, "text/plain").expect(201);
    for i in 0..n {
        server.post(name, format!("r{i}").as_bytes()).expect(200);
    }
}

#[track_caller]
fn trim(server: &Server, name: &str, seq: u64) {
    let r = server.request("POST", name, &[("pico-trim-seq", &seq.to_string())], b"");
    r.expect(200);
    assert_eq!(r.h_u64("pico-start-seq"), seq, "{}", r.describe());
}

/// The seqs of a Pico JSON read.
#[track_caller]
fn seqs(r: &Resp) -> Vec<u64> {
    let Value::Array(records) = r.json() else {
        panic!("not a JSON array: {}", r.describe())
    };
    records.iter().map(|r| r["seq"].as_u64().unwrap()).collect()
}

/// An SSE response read to its end (the servers here end them after a second), dechunked.
fn sse_body(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> (u16, String) {
    let mut conn = Conn::connect(addr).expect("connect");
    let mut all = headers.to_vec();
    all.push(("connection", "close"));
    conn.send("GET", path, &all, b"").expect("send");
    let mut raw = Vec::new();
    conn.stream
        .read_to_end(&mut raw)
        .unwrap_or_else(|e| panic!("GET {path}: {e}"));
    let text = String::from_utf8(raw).expect("UTF-8 response");
    let (head, mut rest) = text.split_once("\r\n\r\n").expect("a response head");
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    if !head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        return (status, rest.to_string());
    }
    let mut body = String::new();
    loop {
        let (size, after) = rest.split_once("\r\n").expect("a chunk size line");
        let size = usize::from_str_radix(size, 16).expect("a hex chunk size");
        if size == 0 {
            return (status, body);
        }
        body.push_str(&after[..size]);
        rest = &after[size + 2..];
    }
}

/// The `data` of an SSE body's data events, in order.
fn sse_data(body: &str) -> Vec<String> {
    body.split("\n\n")
        .filter(|event| event.lines().next() == Some("event: data"))
        .map(|event| {
            event
                .lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .collect::<Vec<_>>()
                .join("\n")
        })
        .collect()
}

/// The seqs of the records in a Pico SSE body's data events.
fn sse_seqs(body: &str) -> Vec<u64> {
    sse_data(body)
        .iter()
        .flat_map(|data| {
            let records: Vec<Value> = serde_json::from_str(data).expect("a JSON array");
            records.into_iter().map(|r| r["seq"].as_u64().unwrap())
        })
        .collect()
}

/// Every Pico form of "the beginning", in every read mode, reads `expected`.
#[track_caller]
fn pico_reads_from_start(server: &Server, name: &str, expected: &[u64]) {
    for query in ["?seq=-1", "?seq=-42", "?seq=-9223372036854775808"] {
        let r = server.get(&format!("{name}{query}"));
        r.expect(200);
        assert_eq!(seqs(&r), expected, "GET {name}{query}");
    }
    let r = server.get(&format!("{name}?seq=-1&format=binary"));
    r.expect(200);
    let binary: Vec<u64> = decode_binary_read(&r.body).iter().map(|r| r.seq).collect();
    assert_eq!(binary, expected, "binary read");
    let mut conn = server.connect();
    conn.set_read_timeout(Duration::from_secs(60));
    let r = conn
        .request("GET", &format!("{name}?seq=-1&live=long-poll"), &[], b"")
        .expect("long-poll");
    r.expect(200);
    assert_eq!(seqs(&r), expected, "long-poll");
    for (query, headers) in [
        ("?seq=-1&live=sse", &[][..]),
        ("?live=sse", &[("last-event-id", "-1")][..]),
        (
            "",
            &[("accept", "text/event-stream"), ("last-event-id", "-3")][..],
        ),
    ] {
        let (status, body) = sse_body(server.addr, &format!("{name}{query}"), headers);
        assert_eq!(status, 200, "SSE {query} {headers:?}: {body}");
        assert_eq!(sse_seqs(&body), expected, "SSE {query} {headers:?}: {body}");
    }
}

/// Every Durable Streams form of "the beginning" reads `expected`.
#[track_caller]
fn ds_reads_from_start(ds_addr: SocketAddr, name: &str, expected: &str) {
    for query in ["", "?offset=-1"] {
        let r = ds(ds_addr, "GET", &format!("{name}{query}"), &[], b"");
        r.expect(200);
        assert_eq!(r.text(), expected, "GET {name}{query}");
    }
    let mut conn = Conn::connect(ds_addr).expect("connect");
    conn.set_read_timeout(Duration::from_secs(60));
    let r = conn
        .request("GET", &format!("{name}?offset=-1&live=long-poll"), &[], b"")
        .expect("long-poll");
    r.expect(200);
    assert_eq!(r.text(), expected, "long-poll");
    let (status, body) = sse_body(ds_addr, &format!("{name}?offset=-1&live=sse"), &[]);
    assert_eq!(status, 200, "SSE: {body}");
    assert_eq!(sse_data(&body).concat(), expected, "SSE: {body}");
}

#[test]
fn the_beginning_of_a_trimmed_stream_is_its_first_readable_record() {
    let (server, ds_addr) = dual_server();
    stream_of(&server, "/t", 10);
    trim(&server, "/t", 5);
    pico_reads_from_start(&server, "/t", &[5, 6, 7, 8, 9]);
    ds_reads_from_start(ds_addr, "/t", "r5r6r7r8r9");

    // A position below the start that the client named is gone, in every mode.
    for path in ["/t?seq=0", "/t"] {
        let gone = server.get(path);
        assert_eq!(
            gone.expect_error(410, "offset_gone")["next_seq"],
            5,
            "{path}"
        );
    }
    let (status, _) = sse_body(server.addr, "/t?seq=4&live=sse", &[]);
    assert_eq!(status, 410);
    let offset_zero = "0000000000000000_0000000000000000";
    let r = ds(
        ds_addr,
        "GET",
        &format!("/t?offset={offset_zero}"),
        &[],
        b"",
    );
    assert_eq!(r.status, 410, "{}", r.describe());

    // Trimmed to its tail: from the beginning is an empty, up-to-date read.
    trim(&server, "/t", 10);
    let r = server.get("/t?seq=-1");
    r.expect(200);
    assert_eq!(seqs(&r), Vec::<u64>::new());
    assert_eq!(r.h("pico-up-to-date"), "true");
    assert_eq!(r.h_u64("pico-next-seq"), 10);
    // The next record is the beginning then.
    server.post("/t", b"r10").expect(200);
    pico_reads_from_start(&server, "/t", &[10]);
}

/// A fork read from the beginning starts at its own first readable record. Its source keeps
/// every record the fork reads while the fork exists: a trim of the source is refused
/// (`409`) and changes nothing the fork reads; the fork's own trims apply.
#[test]
fn a_fork_reads_from_its_own_start_and_its_source_keeps_what_it_reads() {
    let (server, ds_addr) = dual_server();
    stream_of(&server, "/src", 10);
    ds(
        ds_addr,
        "PUT",
        "/f",
        &[
            ("content-type", "text/plain"),
            ("stream-forked-from", "/src"),
        ],
        b"",
    )
    .expect(201);
    server.post("/f", b"f0").expect(200);
    server.post("/f", b"f1").expect(200);
    let all: Vec<u64> = (0..12).collect();
    pico_reads_from_start(&server, "/f", &all);

    // (stream trimmed, to, the fork's first record after it, what the fork reads)
    let steps: [(&str, u64, u64, &str); 5] = [
        ("/f", 2, 2, "r2r3r4r5r6r7r8r9f0f1"),
        ("/src", 4, 2, "r2r3r4r5r6r7r8r9f0f1"),
        ("/f", 6, 6, "r6r7r8r9f0f1"),
        ("/src", 10, 6, "r6r7r8r9f0f1"),
        ("/f", 11, 11, "f1"),
    ];
    for (trimmed, to, first, text) in steps {
        if trimmed == "/src" {
            let refused =
                server.request("POST", "/src", &[("pico-trim-seq", &to.to_string())], b"");
            refused.expect_error(409, "conflict");
            pico_reads_from_start(&server, "/src", &(0..10).collect::<Vec<u64>>());
        } else {
            trim(&server, trimmed, to);
        }
        let expected: Vec<u64> = (first..12).collect();
        pico_reads_from_start(&server, "/f", &expected);
        ds_reads_from_start(ds_addr, "/f", text);
    }
    // Once the fork is gone, the source can be trimmed.
    server.delete("/f").expect(204);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let r = server.request("POST", "/src", &[("pico-trim-seq", "4")], b"");
        if r.status == 200 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{}", r.describe());
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    pico_reads_from_start(&server, "/src", &(4..10).collect::<Vec<u64>>());
}

#[test]
fn pico_read_starts_at_the_first_readable_record() {
    let (server, _) = dual_server();
    stream_of(&server, "/s", 8);
    let endpoint = format!("http://{}", server.addr);
    let run = |args: &[&str]| {
        let mut all = vec!["--endpoint", endpoint.as_str()];
        all.extend_from_slice(args);
        common::pico(server.dir(), &all)
    };
    let out = run(&["trim", "/s", "--seq", "5"]);
    assert!(out.status.success(), "{out:?}");
    let expected = "5\tr5\n6\tr6\n7\tr7\n";
    for args in [&["read", "/s"][..], &["read", "/s", "--from", "-1"]] {
        let out = run(args);
        assert_eq!(
            (
                out.status.code(),
                String::from_utf8_lossy(&out.stdout).as_ref()
            ),
            (Some(0), expected),
            "pico {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let out = run(&["read", "/s", "--from", "0"]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("offset_gone (410)"), "{stderr}");
}
