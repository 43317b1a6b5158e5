//! A hostile client against a real `pico serve` over real sockets: requests built to crash,
//! hang, bloat or open a node (docs/security.md). After each attack the node must still
//! serve every core: [`assert_serves`] opens more connections than there are cores (the
//! kernel spreads them over the cores' listeners) and checks each is answered. The last tests
//! turn it round: a hostile webhook receiver answering the node's own deliveries.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{Conn, Resp, Server};

/// Connections per check: with the 2 cores these tests run, enough that each core is hit.
const PROBE_CONNECTIONS: usize = 16;

/// Every core still answers: fresh connections to `addr` all get `/health` answered (the
/// protocol listener answers `GET /health` with 404 or 200: either is an answer).
fn assert_serves(server: &mut Server, context: &str) {
    assert!(
        server.is_running(),
        "{context}: the node exited\n{}",
        server.log()
    );
    for addr in [server.addr, server.admin] {
        for i in 0..PROBE_CONNECTIONS {
            let mut conn = Conn::connect(addr).unwrap_or_else(|e| panic!("{context}: {e}"));
            let response = conn
                .request("GET", "/health", &[], b"")
                .unwrap_or_else(|e| panic!("{context}: connection {i} to {addr}: {e}"));
            assert!(
                response.status == 200 || response.status == 404,
                "{context}: {}",
                response.describe()
            );
        }
    }
}

/// Sends `wire` on a fresh connection and returns the status line's code (0: closed without
/// an answer).
fn raw_status(addr: SocketAddr, wire: &[u8]) -> u16 {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(common::IO_TIMEOUT)).unwrap();
    stream.write_all(wire).unwrap();
    let mut answer = Vec::new();
    let mut chunk = [0u8; 4096];
    while !answer.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => answer.extend_from_slice(&chunk[..n]),
        }
    }
    let text = String::from_utf8_lossy(&answer);
    text.split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0)
}

fn rss_bytes(server: &Server, field: &str) -> u64 {
    rss_bytes_of(addr_pid(server), field)
}

#[test]
fn chunk_sizes_that_overflow_are_refused_and_no_core_dies() {
    let mut server = Server::start(&[]);
    let chunked = b"POST /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n";
    for addr in [server.addr, server.admin] {
        // Once per connection, so every core's listener gets some.
        for _ in 0..PROBE_CONNECTIONS {
            let mut wire = chunked.to_vec();
            wire.extend_from_slice(b"ffffffffffffffff\r\n");
            assert_eq!(raw_status(addr, &wire), 413);
        }
    }
    assert_serves(&mut server, "after chunk sizes of 2^64-1");
}

#[test]
fn framing_that_a_proxy_could_read_differently_is_refused() {
    let mut server = Server::start(&[]);
    server.put("/f", "text/plain").expect(201);
    let cases: &[(&str, &[u8])] = &[
        (
            "chunk size with a sign",
            b"POST /f HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n+1\r\na\r\n0\r\n\r\n",
        ),
        (
            "chunked on HTTP/1.0",
            b"POST /f HTTP/1.0\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n0\r\n\r\n",
        ),
        (
            "bare LF line endings",
            b"POST /f HTTP/1.1\nHost: a\nContent-Length: 1\n\na",
        ),
        (
            "Transfer-Encoding twice",
            b"POST /f HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        ),
        (
            "chunk size in hex with 0x",
            b"POST /f HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n0x1\r\na\r\n0\r\n\r\n",
        ),
    ];
    for (what, wire) in cases {
        assert_eq!(raw_status(server.addr, wire), 400, "{what}");
    }
    // Nothing of them was appended.
    assert_eq!(server.head("/f").expect(200).h("pico-next-seq"), "0");
    assert_serves(&mut server, "after smuggling attempts");
}

fn fork(addr: SocketAddr, name: &str, source: &str, body: &[u8]) -> Resp {
    common::ds(addr, "PUT", name, &[("stream-forked-from", source)], body)
}

#[test]
fn fork_chains_stop_at_their_depth_limit_and_deep_reads_are_served() {
    let mut server = Server::start(&["--protocol", "ds"]);
    common::ds(
        server.addr,
        "PUT",
        "/fc/0",
        &[("content-type", "text/plain")],
        b"root",
    )
    .expect(201);
    let depth_max = 64;
    let mut want = "root".to_string();
    for level in 1..=depth_max {
        let body = format!("level {level}");
        want.push_str(&body);
        fork(
            server.addr,
            &format!("/fc/{level}"),
            &format!("/fc/{}", level - 1),
            body.as_bytes(),
        )
        .expect(201);
    }
    let deepest = format!("/fc/{depth_max}");
    let too_deep = format!("/fc/{}", depth_max + 1);
    let deeper = fork(server.addr, &too_deep, &deepest, b"");
    assert_eq!(deeper.status, 400, "{}", deeper.describe());
    assert!(
        deeper.text().contains("at most 64 forks deep"),
        "{}",
        deeper.text()
    );
    // The deepest fork reads through every level: the root's record, then each level's own.
    let read = common::ds_read(server.addr, &deepest, "-1");
    assert_eq!(read.expect(200).text(), want);
    assert_serves(&mut server, "after a deep fork chain");
    // And again after a restart, which derives the depths from the catalog.
    server.restart();
    let again = fork(server.addr, &too_deep, &deepest, b"");
    assert_eq!(again.status, 400, "{}", again.describe());
    let read = common::ds_read(server.addr, &deepest, "-1");
    assert_eq!(read.expect(200).text(), want);
}

const GRANTS: &str = "\
admin   /      read,append,admin
app     /a/    read,append
reader  /a/    read
";

fn bearer(token: &str) -> (&'static str, String) {
    ("authorization", format!("Bearer {token}"))
}

#[test]
fn a_fork_needs_read_on_its_source_by_path_or_by_url() {
    let (server, _tokens) = common::start_with_tokens(GRANTS, &["--protocol", "ds"]);
    let admin = bearer("admin");
    let app = bearer("app");
    let ds = |method: &str, path: &str, headers: &[(&str, &str)]| {
        common::ds(server.addr, method, path, headers, b"")
    };
    let admin_h = (admin.0, admin.1.as_str());
    let app_h = (app.0, app.1.as_str());
    common::ds(server.addr, "PUT", "/ab/secret", &[admin_h], b"secret").expect(201);
    common::ds(server.addr, "PUT", "/a/mine", &[app_h], b"mine").expect(201);
    assert_eq!(ds("GET", "/ab/secret?offset=-1", &[app_h]).status, 403);
    let forms = [
        "/ab/secret".to_string(),
        format!("http://{}/ab/secret", server.addr),
        "https://elsewhere.example/ab/secret".to_string(),
    ];
    for source in &forms {
        let stolen = ds(
            "PUT",
            "/a/stolen",
            &[app_h, ("stream-forked-from", source.as_str())],
        );
        assert_eq!(
            stolen.status,
            403,
            "fork of {source}: {}",
            stolen.describe()
        );
        assert_eq!(ds("HEAD", "/a/stolen", &[admin_h]).status, 404);
    }
    // The victim is not pinned: it deletes for real and its name is free again.
    ds("DELETE", "/ab/secret", &[admin_h]).expect(204);
    ds("PUT", "/ab/secret", &[admin_h]).expect(201);
    // A fork of what the token may read works.
    ds(
        "PUT",
        "/a/copy",
        &[app_h, ("stream-forked-from", "/a/mine")],
    )
    .expect(201);
    let read = common::ds(server.addr, "GET", "/a/copy?offset=-1", &[app_h], b"");
    assert_eq!(read.expect(200).text(), "mine");
}

/// Who may call each Durable Streams route with `--auth required`: `None` = public (no
/// token needed), else the token kinds that pass the server's check.
#[test]
fn every_route_and_token_kind_meets_its_grant() {
    let (server, _tokens) = common::start_with_tokens(GRANTS, &["--protocol", "ds"]);
    let admin = bearer("admin");
    let admin_h = (admin.0, admin.1.as_str());
    common::ds(server.addr, "PUT", "/a/s", &[admin_h], b"x").expect(201);
    let sub = br#"{"type":"webhook","pattern":"/a/*","webhook":{"url":"http://127.0.0.1:9/hook"}}"#;
    // (method, path, body, tokens that pass: a subset of [admin, app, reader]; public routes
    // pass without one).
    struct Route {
        method: &'static str,
        path: &'static str,
        body: &'static [u8],
        allowed: &'static [&'static str],
        public: bool,
    }
    let routes = [
        Route {
            method: "GET",
            path: "/a/s?offset=-1",
            body: b"",
            allowed: &["admin", "app", "reader"],
            public: false,
        },
        Route {
            method: "HEAD",
            path: "/a/s",
            body: b"",
            allowed: &["admin", "app", "reader"],
            public: false,
        },
        Route {
            method: "POST",
            path: "/a/s",
            body: b"y",
            allowed: &["admin", "app"],
            public: false,
        },
        Route {
            method: "PUT",
            path: "/a/t",
            body: b"",
            allowed: &["admin", "app"],
            public: false,
        },
        Route {
            method: "GET",
            path: "/b/s?offset=-1",
            body: b"",
            allowed: &["admin"],
            public: false,
        },
        Route {
            method: "PUT",
            path: "/__ds/subscriptions/callback",
            body: sub,
            allowed: &["admin"],
            public: false,
        },
        Route {
            method: "PUT",
            path: "/__ds/subscriptions/release",
            body: sub,
            allowed: &["admin"],
            public: false,
        },
        Route {
            method: "GET",
            path: "/__ds/subscriptions/release",
            body: b"",
            allowed: &["admin"],
            public: false,
        },
        Route {
            method: "DELETE",
            path: "/__ds/subscriptions/release",
            body: b"",
            allowed: &["admin"],
            public: false,
        },
        Route {
            method: "POST",
            path: "/__ds/subscriptions/x/streams",
            body: b"{}",
            allowed: &["admin"],
            public: false,
        },
        Route {
            method: "POST",
            path: "/__ds/subscriptions/x/claim",
            body: b"{}",
            allowed: &["admin"],
            public: false,
        },
        Route {
            method: "DELETE",
            path: "/__ds/subscriptions/x/streams/%2Fa%2Fs",
            body: b"",
            allowed: &["admin"],
            public: false,
        },
        Route {
            method: "GET",
            path: "/__ds/subscriptions/x/callback",
            body: b"",
            allowed: &["admin"],
            public: false,
        },
        Route {
            method: "POST",
            path: "/a/__ds/subscriptions/x/callback",
            body: b"{}",
            allowed: &[],
            public: true,
        },
        Route {
            method: "POST",
            path: "/__ds/subscriptions/x/ack",
            body: b"{}",
            allowed: &[],
            public: true,
        },
        Route {
            method: "POST",
            path: "/__ds/subscriptions/x/release",
            body: b"{}",
            allowed: &[],
            public: true,
        },
        Route {
            method: "GET",
            path: "/__ds/jwks.json",
            body: b"",
            allowed: &[],
            public: true,
        },
    ];
    let refused_by_auth = |r: &Resp| {
        let code = serde_json::from_slice::<serde_json::Value>(&r.body)
            .ok()
            .and_then(|v| {
                v["error"]["code"]
                    .as_str()
                    .or(v["error"].as_str())
                    .map(str::to_string)
            })
            .unwrap_or_default();
        (r.status == 401 && (code == "UNAUTHORIZED" || r.body.is_empty())) || r.status == 403
    };
    for route in &routes {
        for token in [None, Some("admin"), Some("app"), Some("reader")] {
            let header = token.map(bearer);
            let headers: Vec<(&str, &str)> = header.iter().map(|(n, v)| (*n, v.as_str())).collect();
            let r = common::ds(server.addr, route.method, route.path, &headers, route.body);
            let passes = route.public || token.is_some_and(|t| route.allowed.contains(&t));
            assert_eq!(
                !refused_by_auth(&r),
                passes,
                "{} {} with {token:?}: {}",
                route.method,
                route.path,
                r.describe()
            );
        }
    }
}

#[test]
fn json_batches_are_typed_and_stop_at_the_record_limit() {
    let mut server = Server::start(&[]);
    server.put("/j", "text/plain").expect(201);
    let batch = [("content-type", "application/vnd.picomq.batch+json")];
    for (record, message) in [
        (
            "1",
            "record 1: a record must be an object with body or body_b64",
        ),
        (
            "\"x\"",
            "record 1: a record must be an object with body or body_b64",
        ),
        (
            "null",
            "record 1: a record must be an object with body or body_b64",
        ),
        (
            r#"{"body":123}"#,
            "record 1: invalid type: integer `123`, expected body to be a string",
        ),
        (
            r#"{"body":{}}"#,
            "record 1: invalid type: map, expected body to be a string",
        ),
    ] {
        let body = format!(r#"{{"records":[{{"body":"fine"}},{record}]}}"#);
        let r = server.request("POST", "/j", &batch, body.as_bytes());
        let error = r.expect_error(400, "bad_request");
        assert_eq!(error["message"], message, "{body}");
    }
    assert_eq!(server.head("/j").expect(200).h("pico-next-seq"), "0");

    // 8 MiB of `{}` records, six at once: refused as they are decoded, in bounded memory.
    let flood = {
        let mut body = b"{\"records\":[".to_vec();
        while body.len() < 8 * 1024 * 1024 - 16 {
            body.extend_from_slice(b"{},");
        }
        body.extend_from_slice(b"{}]}");
        body
    };
    let peak_before = rss_bytes(&server, "VmHWM:");
    let threads: Vec<_> = (0..6)
        .map(|_| {
            let (addr, flood) = (server.addr, flood.clone());
            std::thread::spawn(move || {
                Conn::connect(addr)
                    .unwrap()
                    .request("POST", "/j", &batch, &flood)
                    .unwrap()
            })
        })
        .collect();
    for thread in threads {
        let r = thread.join().unwrap();
        let error = r.expect_error(400, "bad_request");
        assert_eq!(error["message"], "at most 100000 records per append");
    }
    let grown = rss_bytes(&server, "VmHWM:").saturating_sub(peak_before);
    // Six bodies of 8 MiB are 48 MiB on their own; decoding them whole took ~1 GB.
    assert!(grown < 256 << 20, "peak RSS grew by {} MiB", grown >> 20);
    assert_serves(&mut server, "after JSON floods");
}

#[test]
fn numbers_out_of_range_are_400_and_cursors_never_go_back() {
    let mut server = Server::start(&[
        "--ds-listen",
        "127.0.0.1:0",
        "--long-poll-timeout-sec",
        "0.2",
    ]);
    let ds_addr = server.second.unwrap();
    let huge = "18446744073709551615";
    for ttl in [huge, "100000000000000000", "3153600001"] {
        let r = server.request("PUT", "/n/p", &[("pico-ttl", ttl)], b"");
        assert_eq!(r.status, 400, "Pico-TTL {ttl}: {}", r.describe());
        let r = common::ds(ds_addr, "PUT", "/n/d", &[("stream-ttl", ttl)], b"");
        assert_eq!(r.status, 400, "Stream-TTL {ttl}: {}", r.describe());
    }
    server
        .request("PUT", "/n/p", &[("pico-ttl", "3153600000")], b"")
        .expect(201);
    common::ds(
        ds_addr,
        "PUT",
        "/n/src",
        &[("content-type", "text/plain")],
        b"abc",
    )
    .expect(201);
    let fork = common::ds(
        ds_addr,
        "PUT",
        "/n/fork",
        &[
            ("stream-forked-from", "/n/src"),
            ("stream-fork-offset", "0000000000000000_0000000000000000"),
            ("stream-fork-sub-offset", huge),
        ],
        b"",
    );
    assert_eq!(fork.status, 400, "{}", fork.describe());
    // A client cursor at the top of the range: the answer's cursor is not below it.
    let r = server.get(&format!("/n/p?seq=0&live=long-poll&cursor={huge}"));
    assert_eq!(r.status, 204, "{}", r.describe());
    assert_eq!(r.h("pico-cursor"), huge);
    let head = common::ds_read(ds_addr, "/n/src", "-1");
    let tail = head.expect(200).h("stream-next-offset").to_string();
    let r = common::ds(
        ds_addr,
        "GET",
        &format!("/n/src?offset={tail}&live=long-poll&cursor={huge}"),
        &[],
        b"",
    );
    assert_eq!(r.status, 204, "{}", r.describe());
    assert_eq!(r.h("stream-cursor"), huge);
    assert_serves(&mut server, "after out-of-range numbers");
}

#[test]
fn an_h2_request_for_star_is_refused() {
    let server = Server::start(&[]);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let tcp = tokio::net::TcpStream::connect(server.addr).await.unwrap();
        let (mut client, connection) = h2::client::handshake(tcp).await.unwrap();
        tokio::spawn(async move {
            let _ = connection.await;
        });
        for method in ["PUT", "GET", "OPTIONS"] {
            let request = http::Request::builder()
                .method(method)
                .uri("*")
                .body(())
                .unwrap();
            let (response, _) = client.send_request(request, true).unwrap();
            let response = response.await.unwrap();
            assert_eq!(response.status(), 400, "{method} *");
        }
    });
    assert_eq!(
        server.get("/?prefix=").json()["streams"],
        serde_json::json!([])
    );
}

/// The sum over cores of a per-core series on `/metrics`.
fn metric_sum(server: &Server, series: &str) -> u64 {
    let page = Conn::connect(server.admin)
        .unwrap()
        .request("GET", "/metrics", &[], b"")
        .unwrap();
    page.text()
        .lines()
        .filter(|line| {
            line.starts_with(&format!("{series}{{")) || line.starts_with(&format!("{series} "))
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

async fn h2_connect(addr: SocketAddr) -> h2::client::SendRequest<bytes::Bytes> {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (client, connection) = h2::client::Builder::new()
        .initial_window_size(8 << 20)
        .initial_connection_window_size(64 << 20)
        .handshake(tcp)
        .await
        .unwrap();
    tokio::spawn(async move {
        let _ = connection.await;
    });
    client.ready().await.unwrap()
}

fn h2_request(method: &str, addr: SocketAddr, path: &str) -> http::Request<()> {
    http::Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"))
        .body(())
        .unwrap()
}

#[test]
fn h2_uploads_that_never_end_hold_no_more_than_the_core_budget() {
    // One core, so the attack's connection and the budget it fills are on the same one.
    let mut server = Server::start(&["--cores", "1", "--max-in-flight-bytes", "16MiB"]);
    server.put("/up", "application/octet-stream").expect(201);
    let rss_before = rss_bytes(&server, "VmRSS:");
    let body_bytes: usize = 7_900 * 1024;
    let addr = server.addr;
    let (rss_during, refused) = runtime().block_on(async {
        let mut client = h2_connect(addr).await;
        let mut streams = Vec::new();
        for _ in 0..256 {
            let request = http::Request::builder()
                .method("POST")
                .uri(format!("http://{addr}/up"))
                .header("content-length", body_bytes.to_string())
                .body(())
                .unwrap();
            client = client.ready().await.unwrap();
            let (response, send) = client.send_request(request, false).unwrap();
            streams.push((Some(response), send, 0usize));
        }
        let chunk = bytes::Bytes::from(vec![7u8; 64 * 1024]);
        // Send on every stream as long as the server grants window; stop (never ending a
        // body) once a whole round moved nothing, or after a bounded number of rounds.
        for _round in 0..2_000 {
            let mut moved = 0;
            for (_, send, sent) in streams.iter_mut() {
                if *sent + chunk.len() >= body_bytes {
                    continue;
                }
                send.reserve_capacity(chunk.len());
                let granted = tokio::time::timeout(
                    Duration::from_millis(5),
                    std::future::poll_fn(|cx| send.poll_capacity(cx)),
                )
                .await;
                if let Ok(Some(Ok(n))) = granted {
                    if n > 0 && send.send_data(chunk.slice(..n), false).is_ok() {
                        *sent += n;
                        moved += n;
                    }
                }
            }
            if moved == 0 {
                break;
            }
        }
        let rss = rss_bytes_of(addr_pid(&server), "VmRSS:");
        let mut refused = 0;
        for (response, _, _) in streams.iter_mut() {
            let Some(pending) = response.take() else {
                continue;
            };
            if let Ok(Ok(answer)) = tokio::time::timeout(Duration::from_millis(50), pending).await {
                refused += usize::from(answer.status() == 429);
            }
        }
        (rss, refused)
    });
    let grown = rss_during.saturating_sub(rss_before);
    eprintln!("RSS grew by {} MiB during the attack", grown >> 20);
    // The budget is 16 MiB, plus the connection's 8 MiB window in flight: allow the
    // allocator three times that. Unbounded, this run grew the node by 2.3 GB.
    assert!(
        grown < (3 * (16 + 8)) << 20,
        "RSS grew by {} MiB",
        grown >> 20
    );
    assert!(refused > 0, "no upload was refused with 429");
    assert_serves(&mut server, "after never-ending h2 uploads");
    server.post("/up", b"small").expect(200);
}

fn addr_pid(server: &Server) -> u32 {
    server.pid().expect("the server runs")
}

/// A `/proc/PID/status` memory field (`VmRSS:`, `VmHWM:`) in bytes.
fn rss_bytes_of(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with(field))
        .unwrap_or_else(|| panic!("{field} in /proc/{pid}/status"));
    let kib: u64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap();
    kib * 1024
}

/// Waits (at most a minute) for `done`, letting the runtime drive the client meanwhile.
async fn wait_async(what: &str, mut done: impl FnMut() -> bool) {
    for _ in 0..600 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("timed out waiting for {what}");
}

#[test]
fn cancelled_long_polls_leave_no_waiters_on_either_http_version() {
    // Waiters that stayed would stay for the whole long-poll timeout.
    let mut server = Server::start(&["--long-poll-timeout-sec", "600"]);
    server.put("/lp", "text/plain").expect(201);
    let addr = server.addr;
    runtime().block_on(async {
        let mut client = h2_connect(addr).await;
        // 47 x 255 = 11,985 long-polls, each reset by the client once the server parked it.
        for batch in 0..47 {
            let mut pending = Vec::new();
            for _ in 0..255 {
                client = client.ready().await.unwrap();
                let request = h2_request("GET", addr, "/lp?seq=0&live=long-poll");
                let (response, _send) = client.send_request(request, true).unwrap();
                pending.push(response);
            }
            let parked = || metric_sum(&server, "pico_live_waiters");
            wait_async("h2 long-polls to park", || parked() >= 255).await;
            // Dropping the response futures resets the streams.
            drop(pending);
            wait_async(&format!("batch {batch}'s waiters to go"), || parked() == 0).await;
        }
    });
    // HTTP/1.1: long-polls whose sockets close give back their waiter and connection slot.
    let connections_before = metric_sum(&server, "pico_http_connections");
    let mut sockets = Vec::new();
    for _ in 0..300 {
        let mut socket = TcpStream::connect(addr).unwrap();
        socket
            .write_all(b"GET /lp?seq=0&live=long-poll HTTP/1.1\r\nHost: a\r\n\r\n")
            .unwrap();
        sockets.push(socket);
    }
    common::wait_for(
        "HTTP/1.1 long-polls to park",
        Duration::from_secs(60),
        || (metric_sum(&server, "pico_live_waiters") >= 300).then_some(()),
    );
    drop(sockets);
    common::wait_for("HTTP/1.1 waiters to go", Duration::from_secs(60), || {
        (metric_sum(&server, "pico_live_waiters") == 0).then_some(())
    });
    common::wait_for(
        "their connections to close",
        Duration::from_secs(60),
        || (metric_sum(&server, "pico_http_connections") <= connections_before).then_some(()),
    );
    // A real client is served: a long-poll wakes on an append.
    let waiter = std::thread::spawn(move || {
        Conn::connect(addr)
            .unwrap()
            .request("GET", "/lp?seq=0&live=long-poll", &[], b"")
            .unwrap()
    });
    common::wait_for(
        "the real long-poll to park",
        Duration::from_secs(60),
        || (metric_sum(&server, "pico_live_waiters") == 1).then_some(()),
    );
    server.post("/lp", b"wake").expect(200);
    assert_eq!(waiter.join().unwrap().status, 200);
    assert_serves(&mut server, "after cancelled long-polls");
}

#[test]
fn idle_and_stalled_h2_connections_are_closed_after_the_request_timeout() {
    let server = Server::start(&["--request-timeout-sec", "1"]);
    server.put("/slow", "text/plain").expect(201);
    // Only the preface and an empty SETTINGS frame, then nothing: a GOAWAY, then the close.
    let mut socket = TcpStream::connect(server.addr).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    socket
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        .unwrap();
    let mut received = Vec::new();
    let closed = socket.read_to_end(&mut received);
    assert!(
        closed.is_ok(),
        "the idle connection was not closed: {closed:?}"
    );
    let mut at = 0;
    let mut frame_types = Vec::new();
    while at + 9 <= received.len() {
        let length = usize::from(received[at]) << 16
            | usize::from(received[at + 1]) << 8
            | usize::from(received[at + 2]);
        frame_types.push(received[at + 3]);
        at += 9 + length;
    }
    assert!(
        frame_types.contains(&0x7),
        "no GOAWAY among frames {frame_types:?}"
    );
    // A request whose body never comes is answered 408.
    let addr = server.addr;
    let status = runtime().block_on(async {
        let mut client = h2_connect(addr).await;
        let request = h2_request("POST", addr, "/slow");
        let (response, _send) = client.send_request(request, false).unwrap();
        response.await.unwrap().status()
    });
    assert_eq!(status, 408);
    assert_eq!(server.head("/slow").expect(200).h("pico-next-seq"), "0");
}

/// Reads one answer of a keep-alive exchange (`Content-Length`-framed, as every answer to a
/// HEAD here is), so the connection can be used again.
fn read_answer_head(socket: &mut TcpStream) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(
            socket.read(&mut byte).unwrap(),
            1,
            "closed mid-answer: {head:?}"
        );
        head.push(byte[0]);
    }
    String::from_utf8(head).unwrap()
}

#[test]
fn idle_http1_connections_are_closed_after_the_request_timeout_and_busy_ones_are_not() {
    let server = Server::start(&["--request-timeout-sec", "1"]);
    server.put("/idle", "text/plain").expect(201);
    let request = b"HEAD /idle HTTP/1.1\r\nHost: a\r\n\r\n";

    // A request every 300 ms for three times the timeout: each starts the idle time again.
    let mut busy = TcpStream::connect(server.addr).unwrap();
    busy.set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(3) {
        busy.write_all(request).unwrap();
        let head = read_answer_head(&mut busy);
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        std::thread::sleep(Duration::from_millis(300));
    }

    // Then idle: closed once the timeout passed, not before.
    let idle_from = Instant::now();
    let mut rest = Vec::new();
    busy.read_to_end(&mut rest)
        .expect("the idle connection was not closed");
    let idle_for = idle_from.elapsed();
    assert!(rest.is_empty(), "unexpected bytes: {rest:?}");
    // 300 ms of the timeout passed in the sleep after the last answer.
    assert!(
        idle_for >= Duration::from_millis(600),
        "closed after {idle_for:?} idle"
    );

    // A connection that never sends a byte is closed too.
    let mut silent = TcpStream::connect(server.addr).unwrap();
    silent
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let opened = Instant::now();
    assert_eq!(silent.read(&mut [0u8; 16]).expect("not closed"), 0);
    assert!(opened.elapsed() >= Duration::from_millis(900));
}

#[test]
fn http1_bodies_that_never_end_hold_no_more_than_the_core_budget() {
    let mut server = Server::start(&["--cores", "1", "--max-in-flight-bytes", "16MiB"]);
    server.put("/up1", "application/octet-stream").expect(201);
    let rss_before = rss_bytes(&server, "VmRSS:");
    let addr = server.addr;
    // 100 connections, each declaring 8,000,000 bytes and sending 7,900,000 of them: no body
    // ever completes (a completed one would be appended, and the engine's memory is not the
    // point here).
    let sockets: Vec<TcpStream> = std::thread::scope(|scope| {
        let senders: Vec<_> = (0..100)
            .map(|_| {
                scope.spawn(move || {
                    let mut socket = TcpStream::connect(addr).unwrap();
                    socket
                        .set_write_timeout(Some(Duration::from_secs(20)))
                        .unwrap();
                    let head = b"POST /up1 HTTP/1.1\r\nHost: a\r\nContent-Length: 8000000\r\n\r\n";
                    let part = vec![b'p'; 7_900_000];
                    // A refused body's connection is closed under the writer: fine.
                    let _ = socket
                        .write_all(head)
                        .and_then(|()| socket.write_all(&part));
                    socket
                })
            })
            .collect();
        senders.into_iter().map(|s| s.join().unwrap()).collect()
    });
    let grown = rss_bytes(&server, "VmRSS:").saturating_sub(rss_before);
    eprintln!("RSS grew by {} MiB with 100 partial bodies", grown >> 20);
    // The bound: the 16 MiB budget (which counts the bodies' buffers by their capacity),
    // 256 KiB of read buffers per connection, 32 MiB for the allocator. Unbounded, it was
    // ~1 GB.
    let bound = (16 << 20) + 100 * (256 << 10) + (32 << 20);
    assert!(grown < bound, "RSS grew by {} MiB", grown >> 20);
    drop(sockets);
    assert_serves(&mut server, "after partial HTTP/1.1 bodies");
    server.post("/up1", b"small").expect(200);
}

/// Bytes a client sends while its long-poll is parked (the next requests, pipelined, in pieces)
/// are kept for after the long-poll's answer, byte for byte: the watch for the client leaving
/// reads them into the connection's buffer, and being cancelled when the answer comes leaves
/// nothing else there.
#[test]
fn requests_pipelined_behind_a_parked_long_poll_are_answered_in_order() {
    let server = Server::start(&["--cores", "1", "--long-poll-timeout-sec", "600"]);
    server.put("/pl", "text/plain").expect(201);
    let mut conn = Conn::connect(server.addr).unwrap();
    conn.raw(b"GET /pl?seq=0&live=long-poll&format=raw HTTP/1.1\r\nhost: a\r\n\r\n")
        .unwrap();
    common::wait_for("the long-poll to park", Duration::from_secs(60), || {
        (metric_sum(&server, "pico_live_waiters") >= 1).then_some(())
    });
    let mut next = common::encode_request("POST", "/pl", &[], b"second");
    next.extend(common::encode_request(
        "GET",
        "/pl?seq=0&format=raw",
        &[],
        b"",
    ));
    let (first, rest) = next.split_at(7);
    conn.raw(first).unwrap();
    conn.raw(rest).unwrap();
    // Bounded by the parked answer, not by time: the pipelined bytes are read by the watch
    // (or not yet); either way the answers below must come in order.
    server.post("/pl", b"first").expect(200);
    let woken = conn.read_response(false).unwrap();
    woken.expect(200);
    assert_eq!(woken.body, b"first");
    let appended = conn.read_response(false).unwrap();
    appended.expect(200);
    assert_eq!(appended.header("pico-start-seq"), Some("1"));
    let read = conn.read_response(false).unwrap();
    read.expect(200);
    assert_eq!(read.body, b"firstsecond");
}

/// A webhook receiver on loopback that reads each delivery and answers `head`; with `endless`,
/// then 8 KiB blocks for as long as the node reads them (at most 256 MiB or 60 s). Sends, per
/// delivery, how many bytes it got to write after the head. Lives as long as the test process.
fn hostile_receiver(head: &'static [u8], endless: bool) -> (String, mpsc::Receiver<usize>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind the webhook receiver");
    let url = format!(
        "http://127.0.0.1:{}/hook",
        listener.local_addr().unwrap().port()
    );
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
            let _ = conn.set_write_timeout(Some(Duration::from_secs(10)));
            // The request: its head, then as many bytes as its Content-Length says.
            let _ = common::read_request(&mut conn, 1 << 20);
            let mut sent = 0;
            if conn.write_all(head).is_ok() && endless {
                let block = [b'x'; 8192];
                let until = Instant::now() + Duration::from_secs(60);
                while sent < 256 << 20 && Instant::now() < until {
                    match conn.write(&block) {
                        Ok(n) => sent += n,
                        Err(_) => break,
                    }
                }
            }
            if tx.send(sent).is_err() {
                return;
            }
        }
    });
    (url, rx)
}

/// A webhook subscription `id` on `/v1/stream/events/*` of a `--protocol ds` node, delivering
/// to `url`, and a first write to `events/a` that wakes it.
fn subscribe_and_write(server: &Server, id: &str, url: &str) {
    let text = [("content-type", "text/plain")];
    common::ds(server.addr, "PUT", "/v1/stream/events/a", &text, b"").expect(201);
    let spec = serde_json::json!({"type": "webhook", "pattern": "events/*",
        "webhook": {"url": url}, "lease_ttl_ms": 60_000});
    let json = [("content-type", "application/json")];
    let path = format!("/v1/stream/__ds/subscriptions/{id}");
    common::ds(
        server.addr,
        "PUT",
        &path,
        &json,
        spec.to_string().as_bytes(),
    )
    .expect(201);
    common::ds(server.addr, "POST", "/v1/stream/events/a", &text, b"wake").expect(204);
}

/// Waits (20 s at most) for subscription `id` to say its deliveries fail.
fn wait_failed(server: &Server, id: &str) {
    common::wait_for(
        "the subscription's failed status",
        Duration::from_secs(20),
        || {
            let got = common::ds(
                server.addr,
                "GET",
                &format!("/v1/stream/__ds/subscriptions/{id}"),
                &[],
                b"",
            );
            (got.status == 200 && got.json()["status"] == "failed").then_some(())
        },
    );
}

/// A receiver answering with chunk size 2^64-1 must not overflow the delivery thread's chunk
/// arithmetic: a panic there would end the node (status 101), and since the pending wake
/// survives, every restart would deliver it again and die within a second. The delivery fails
/// (and is retried with back-off) and the node serves on, before and after a restart.
#[test]
fn a_webhook_receiver_answering_chunk_size_2_64_neither_kills_nor_crash_loops_the_node() {
    let mut server = Server::start(&["--protocol", "ds"]);
    let (url, deliveries) = hostile_receiver(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffff\r\n{}",
        false,
    );
    subscribe_and_write(&server, "hostile", &url);
    deliveries
        .recv_timeout(Duration::from_secs(20))
        .unwrap_or_else(|e| panic!("no delivery ({e}); log:\n{}", server.log()));
    wait_failed(&server, "hostile");
    assert_serves(
        &mut server,
        "after a chunk size of 2^64-1 from a webhook receiver",
    );
    assert!(
        server.log().contains("delivery 1 failed"),
        "{}",
        server.log()
    );

    // The wake was pending when the node stopped: the restarted node delivers it again.
    server.restart();
    deliveries
        .recv_timeout(Duration::from_secs(20))
        .unwrap_or_else(|e| {
            panic!(
                "no delivery after the restart ({e}); log:\n{}",
                server.log()
            )
        });
    // A node that died of the answer would be gone within a second of it.
    std::thread::sleep(Duration::from_secs(1));
    assert_serves(&mut server, "after the restart and a second hostile answer");
    wait_failed(&server, "hostile");
}

/// A chunk declared 7fffffffffffffff, then bytes as fast as the node reads them (unbounded,
/// that took a node from 16 MB to 2.6 GB in 10 s): the node reads a bounded answer
/// (WEBHOOK_RESPONSE_BYTES_MAX, 336 KiB), fails the delivery and closes the connection.
#[test]
fn a_webhook_receiver_streaming_without_end_is_read_only_up_to_the_cap() {
    let mut server = Server::start(&["--protocol", "ds"]);
    let before = rss_bytes(&server, "VmRSS:");
    let (url, deliveries) = hostile_receiver(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n7fffffffffffffff\r\n",
        true,
    );
    let started = Instant::now();
    subscribe_and_write(&server, "endless", &url);
    let sent = deliveries
        .recv_timeout(Duration::from_secs(70))
        .unwrap_or_else(|e| panic!("no delivery ({e}); log:\n{}", server.log()));
    let took = started.elapsed();
    wait_failed(&server, "endless");
    let after = rss_bytes(&server, "VmHWM:");
    eprintln!(
        "endless webhook answer: {sent} bytes written before the node closed, in {took:?}; RSS {} MiB before, peak {} MiB",
        before >> 20,
        after >> 20
    );
    // What the receiver wrote is the node's read cap plus what the sockets' kernel buffers
    // hold, far below the 256 MiB it would write to a node that read on.
    assert!(sent < 32 << 20, "{sent} bytes written");
    assert!(took < Duration::from_secs(30), "{took:?}");
    assert!(
        after < before + (64 << 20),
        "RSS {before} before, peak {after}"
    );
    assert_serves(&mut server, "after an endless webhook answer");
}

// Readers that never read: every answer waiting for its reader counts
// against the core's budget of unsent answers (`--max-unsent-bytes`), past it reads get `503`,
// and a connection that makes no write progress for `--send-stall-timeout-sec` is closed.

/// A Durable Streams server whose catch-up reads answer 16 MiB at once (more than the kernel's
/// socket buffers take), with `flags`, and its stream `/big` of 16 MiB.
fn large_answers_server(flags: &[&str]) -> Server {
    // The stream stays in the open segment, whose bytes each read copies out: every answer
    // held is memory of its own.
    let mut args = vec![
        "--protocol",
        "ds",
        "--cores",
        "1",
        "--catch-up-read-size",
        "16MiB",
        "--segment-size",
        "64MiB",
    ];
    args.extend_from_slice(flags);
    let server = Server::start(&args);
    let octets = [("content-type", "application/octet-stream")];
    common::ds(server.addr, "PUT", "/big", &octets, b"").expect(201);
    let record = vec![b'r'; 64 << 10];
    for _ in 0..256 {
        let appended = common::ds(server.addr, "POST", "/big", &octets, &record);
        assert_eq!(appended.status, 204, "append: {}", appended.status);
    }
    server
}

/// A catch-up read of all of `/big`.
const BIG_READ: &str = "/big?offset=-1";

/// The status and the whole length (head and body) of the answer whose head has arrived on
/// `socket`, seen without reading it (so the server's writes stay stalled): waits for it, at
/// most a minute.
fn peeked_answer(socket: &TcpStream) -> (u16, usize) {
    let mut head = vec![0u8; 16 * 1024];
    for _ in 0..600 {
        let n = socket.peek(&mut head).unwrap_or(0);
        if let Some(end) = head[..n].windows(4).position(|w| w == b"\r\n\r\n") {
            let text = String::from_utf8_lossy(&head[..end]).to_ascii_lowercase();
            let status = text[9..12].parse().unwrap();
            let length: usize = text
                .lines()
                .find_map(|l| l.strip_prefix("content-length: "))
                .map_or(0, |l| l.trim().parse().unwrap());
            return (status, end + 4 + length);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("no answer head within a minute");
}

#[test]
fn http1_readers_that_never_read_hold_no_more_than_the_answer_budget_and_are_closed() {
    let mut server = large_answers_server(&[
        "--max-unsent-bytes",
        "32MiB",
        "--send-stall-timeout-sec",
        "2",
    ]);
    let rss_before = rss_bytes(&server, "VmRSS:");
    let request = format!("GET {BIG_READ} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
    // 50 connections ask for 16 MiB each and read nothing: 800 MiB if every answer is held.
    let readers: Vec<TcpStream> = (0..50)
        .map(|_| {
            let socket = TcpStream::connect(server.addr).unwrap();
            common::small_receive_buffer(&socket);
            (&socket).write_all(request.as_bytes()).unwrap();
            socket
        })
        .collect();
    let answers: Vec<(u16, usize)> = readers.iter().map(peeked_answer).collect();
    let peak = rss_bytes(&server, "VmHWM:").saturating_sub(rss_before);
    let answered = answers.iter().filter(|(s, _)| *s == 200).count();
    let refused = answers.iter().filter(|(s, _)| *s == 503).count();
    eprintln!(
        "{answered} answered, {refused} refused, peak RSS growth {} MiB",
        peak >> 20
    );
    assert_eq!(answered + refused, readers.len(), "statuses {answers:?}");
    assert!(refused > 0, "no read was refused with 503");
    // The budget (32 MiB) and an answer being built while it is checked, and room for the
    // allocator. Unbounded, the answers alone were 800 MiB.
    assert!(peak < 96 << 20, "RSS grew by {} MiB", peak >> 20);
    // Each answered reader's connection is closed after the stall timeout with its answer
    // unsent, and the answer let go (the refused ones stay open, idle; the admin request
    // counts itself). Not seen from the client: the kernel goes on sending what it had queued
    // of a closed socket only as the reader's window allows.
    common::wait_for(
        "stalled connections closed",
        Duration::from_secs(60),
        || (metric_sum(&server, "pico_http_connections") <= refused as u64 + 1).then_some(()),
    );
    drop(readers);
    // The refused ones may retry, and the node serves on.
    let retry = common::ds(server.addr, "GET", BIG_READ, &[], b"");
    assert_eq!(retry.status, 200, "retry: {}", retry.status);
    assert!(retry.body.len() > 15 << 20, "{} bytes", retry.body.len());
    assert_serves(&mut server, "after readers that never read");
}

/// A refused read says when to retry, in the protocol's error format.
#[test]
fn a_read_past_the_answer_budget_is_503_with_retry_after() {
    let server = large_answers_server(&[
        "--max-unsent-bytes",
        "1MiB",
        "--send-stall-timeout-sec",
        "600",
    ]);
    // One stalled reader holds an answer past the budget (one always fits)...
    let holder = TcpStream::connect(server.addr).unwrap();
    common::small_receive_buffer(&holder);
    (&holder)
        .write_all(format!("GET {BIG_READ} HTTP/1.1\r\nHost: a\r\n\r\n").as_bytes())
        .unwrap();
    assert_eq!(peeked_answer(&holder).0, 200);
    // ...so the next read is refused, with Retry-After.
    let refused = common::ds(server.addr, "GET", BIG_READ, &[], b"");
    assert_eq!(refused.status, 503, "{}", refused.text());
    assert_eq!(refused.h("retry-after"), "1");
    assert!(
        refused.text().contains("--max-unsent-bytes"),
        "{}",
        refused.text()
    );
    // Writes are never refused for it.
    let octets = [("content-type", "application/octet-stream")];
    let appended = common::ds(server.addr, "POST", "/big", &octets, b"more");
    assert_eq!(appended.status, 204);
    // The holder leaves: its answer is let go, and reads are answered again.
    drop(holder);
    common::wait_for("reads answered again", Duration::from_secs(60), || {
        (common::ds(server.addr, "GET", BIG_READ, &[], b"").status == 200).then_some(())
    });
}

/// A client that holds everything it got (heads, bodies unread, its handle): only the server
/// can end its connection.
struct ZeroWindowReads {
    statuses: Vec<u16>,
    /// Ends when the connection is closed.
    driver: tokio::task::JoinHandle<()>,
    _held: (
        h2::client::SendRequest<bytes::Bytes>,
        Vec<http::Response<h2::RecvStream>>,
    ),
}

/// `reads` GETs of [`BIG_READ`] on one HTTP/2 connection that grants no window.
async fn h2_zero_window_reads(addr: SocketAddr, reads: usize) -> ZeroWindowReads {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (client, connection) = h2::client::Builder::new()
        .initial_window_size(0)
        .handshake::<_, bytes::Bytes>(tcp)
        .await
        .unwrap();
    // The connection task ends when the server closes the connection.
    let driver = tokio::spawn(async move {
        let _ = connection.await;
    });
    let mut client = client;
    let mut pending = Vec::new();
    for _ in 0..reads {
        client = client.ready().await.unwrap();
        let request = h2_request("GET", addr, BIG_READ);
        let (response, _) = client.send_request(request, true).unwrap();
        pending.push(response);
    }
    let mut statuses = Vec::new();
    let mut heads = Vec::new();
    for response in pending {
        // Heads are not flow-controlled: every answer's head arrives.
        let head = tokio::time::timeout(Duration::from_secs(60), response).await;
        statuses.push(match head {
            Ok(Ok(head)) => {
                let status = head.status().as_u16();
                // Kept: a dropped body would reset its stream.
                heads.push(head);
                status
            }
            _ => 0,
        });
    }
    ZeroWindowReads {
        statuses,
        driver,
        _held: (client, heads),
    }
}

#[test]
fn h2_readers_with_a_zero_window_hold_no_more_than_the_answer_budget_and_are_closed() {
    let server = large_answers_server(&[
        "--max-unsent-bytes",
        "32MiB",
        "--send-stall-timeout-sec",
        "5",
    ]);
    let rss_before = rss_bytes(&server, "VmRSS:");
    let addr = server.addr;
    let pid = addr_pid(&server);
    runtime().block_on(async {
        // Two connections, each asking for 256 reads of 16 MiB and granting no window: 8 GiB
        // if every answer is held.
        let (a, b) = tokio::join!(
            h2_zero_window_reads(addr, 256),
            h2_zero_window_reads(addr, 256)
        );
        let peak = rss_bytes_of(pid, "VmHWM:").saturating_sub(rss_before);
        let statuses: Vec<u16> = [&a, &b]
            .iter()
            .flat_map(|reads| reads.statuses.iter().copied())
            .collect();
        let answered = statuses.iter().filter(|&&s| s == 200).count();
        let refused = statuses.iter().filter(|&&s| s == 503).count();
        eprintln!(
            "{answered} answered, {refused} refused, peak RSS growth {} MiB",
            peak >> 20
        );
        // 0: no head before the stall closed the connection (a slow machine).
        assert!(
            statuses.iter().all(|s| [0, 200, 503].contains(s)),
            "{statuses:?}"
        );
        assert!(refused > 0, "no read was refused with 503");
        // 32 MiB of unsent answers on the core: two answers of (nearly) 16 MiB.
        assert!((1..=2).contains(&answered), "{answered} answers held");
        // The budget, an answer being built, room for the allocator.
        assert!(peak < 96 << 20, "RSS grew by {} MiB", peak >> 20);
        // Neither connection makes progress: both are closed after the stall timeout.
        for reads in [a, b] {
            tokio::time::timeout(Duration::from_secs(60), reads.driver)
                .await
                .expect("the stalled connection was closed")
                .unwrap();
        }
    });
    assert_eq!(common::ds(addr, "GET", BIG_READ, &[], b"").status, 200);
}

#[test]
fn a_stalled_sse_reader_is_closed_at_the_sse_max_duration() {
    // The stall timeout is far: only the response's own end may close the connection.
    let mut server = large_answers_server(&[
        "--sse-max-duration-sec",
        "3",
        "--send-stall-timeout-sec",
        "600",
    ]);
    assert_stalled_sse_reader_closed(
        &mut server,
        "/big?offset=-1&live=sse",
        "after a stalled SSE reader",
    );
}

/// Opens an SSE read of `target` on a connection that never reads, and waits until the
/// response has ended and its connection is closed; then checks the node still serves.
fn assert_stalled_sse_reader_closed(server: &mut Server, target: &str, context: &str) {
    let socket = TcpStream::connect(server.addr).unwrap();
    common::small_receive_buffer(&socket);
    (&socket)
        .write_all(format!("GET {target} HTTP/1.1\r\nHost: a\r\n\r\n").as_bytes())
        .unwrap();
    assert_eq!(peeked_answer(&socket).0, 200);
    assert_eq!(metric_sum(server, "pico_sse_streams"), 1);
    // 3 s, and a second for its last events: the response (and its reads) are gone well
    // before the stall timeout, though its reader never read.
    common::wait_for(
        "the stalled SSE response to end",
        Duration::from_secs(60),
        || (metric_sum(server, "pico_sse_streams") == 0).then_some(()),
    );
    // Its connection is closed too (the response could not end cleanly).
    common::wait_for(
        "the stalled SSE connection closed",
        Duration::from_secs(60),
        || (metric_sum(server, "pico_http_connections") <= 1).then_some(()),
    );
    drop(socket);
    assert_serves(server, context);
}

/// The same for the Pico protocol's SSE, with a stream small enough for the node's socket to
/// take all of it: the response sends everything, waits at the tail, and writes its end at
/// `--sse-max-duration-sec` without waiting. Its reader having read almost nothing, the
/// response is not over then, and its connection closes, long before the request timeout.
#[test]
fn a_stalled_pico_sse_reader_is_closed_at_the_sse_max_duration() {
    let mut server = Server::start(&[
        "--cores",
        "1",
        "--sse-max-duration-sec",
        "3",
        "--send-stall-timeout-sec",
        "600",
    ]);
    server.put("/small", "application/octet-stream").expect(201);
    let record = vec![b'r'; 8 << 10];
    for _ in 0..16 {
        server.post("/small", &record).expect(200);
    }
    assert_stalled_sse_reader_closed(
        &mut server,
        "/small?seq=-1&live=sse",
        "after a stalled Pico SSE reader",
    );
}

/// Readers that never read, measured (not asserted): RSS before and while they hold their
/// answers, and whether their connections are closed. Default flags only, so it runs against
/// any build (`--ignored --nocapture`; figures in BENCHMARKS.md, "Readers that never read").
#[test]
#[ignore = "a measurement: run by hand"]
fn slow_reader_reproductions_report_rss() {
    let octets = [("content-type", "application/octet-stream")];
    let start = |flags: &[&str]| {
        let mut args = vec![
            "--protocol",
            "ds",
            "--cores",
            "1",
            "--segment-size",
            "64MiB",
        ];
        args.extend_from_slice(flags);
        let server = Server::start(&args);
        common::ds(server.addr, "PUT", "/big", &octets, b"").expect(201);
        let record = vec![b'r'; 64 << 10];
        for _ in 0..256 {
            common::ds(server.addr, "POST", "/big", &octets, &record).expect(204);
        }
        server
    };
    let mib = |bytes: u64| bytes >> 20;
    // 200 HTTP/1.1 connections never reading a 4 MiB catch-up answer.
    {
        let server = start(&[]);
        let before = rss_bytes(&server, "VmRSS:");
        let readers: Vec<TcpStream> = (0..200)
            .map(|_| {
                let socket = TcpStream::connect(server.addr).unwrap();
                common::small_receive_buffer(&socket);
                (&socket)
                    .write_all(b"GET /big?offset=-1 HTTP/1.1\r\nHost: a\r\n\r\n")
                    .unwrap();
                socket
            })
            .collect();
        let statuses: Vec<u16> = readers.iter().map(|s| peeked_answer(s).0).collect();
        let during = rss_bytes(&server, "VmRSS:");
        let ok = statuses.iter().filter(|&&s| s == 200).count();
        std::thread::sleep(Duration::from_secs(45));
        let open = metric_sum(&server, "pico_http_connections") - 1;
        eprintln!(
            "HTTP/1.1: RSS {} -> {} MiB (peak {} MiB), {ok} answered of 200, {open} connections open after 45 s",
            mib(before),
            mib(during),
            mib(rss_bytes(&server, "VmHWM:")),
        );
        drop(readers);
    }
    // Two HTTP/2 connections with a zero window asking for 256 reads of 4 MiB each.
    {
        let server = start(&["--request-timeout-sec", "5"]);
        let before = rss_bytes(&server, "VmRSS:");
        let (addr, pid) = (server.addr, addr_pid(&server));
        runtime().block_on(async {
            let (a, b) = tokio::join!(h2_zero_window_reads(addr, 256), h2_zero_window_reads(addr, 256));
            let during = rss_bytes_of(pid, "VmRSS:");
            let ok = [&a.statuses, &b.statuses]
                .iter()
                .map(|s| s.iter().filter(|&&s| s == 200).count())
                .sum::<usize>();
            let mut closed = 0;
            for reads in [a, b] {
                closed += usize::from(
                    tokio::time::timeout(Duration::from_secs(45), reads.driver)
                        .await
                        .is_ok(),
                );
            }
            eprintln!(
                "HTTP/2: RSS {} -> {} MiB (peak {} MiB), {ok} answered of 512, {closed} of 2 connections closed within 45 s",
                mib(before),
                mib(during),
                mib(rss_bytes_of(pid, "VmHWM:")),
            );
        });
    }
    // A stalled SSE reader with --sse-max-duration-sec 5.
    {
        let server = start(&["--sse-max-duration-sec", "5"]);
        let socket = TcpStream::connect(server.addr).unwrap();
        common::small_receive_buffer(&socket);
        (&socket)
            .write_all(b"GET /big?offset=-1&live=sse HTTP/1.1\r\nHost: a\r\n\r\n")
            .unwrap();
        peeked_answer(&socket);
        std::thread::sleep(Duration::from_secs(15));
        eprintln!(
            "SSE: {} response(s) in progress 15 s after the start with --sse-max-duration-sec 5",
            metric_sum(&server, "pico_sse_streams")
        );
    }
}
