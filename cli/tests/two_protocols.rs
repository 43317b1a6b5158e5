//! One node, both protocols, so that a Durable Streams client pointed at the default port does
//! not silently misbehave: `pico serve` opens a Durable Streams listener beside the Pico one by
//! default, and each listener refuses the other protocol's headers and parameters with a `400`
//! naming where that protocol is served, instead of ignoring them.

mod common;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::{ds, Server};

/// The idempotent producer headers of Durable Streams.
const DS_PRODUCER: &[(&str, &str)] = &[
    ("Producer-Id", "w1"),
    ("Producer-Epoch", "0"),
    ("Producer-Seq", "0"),
    ("Content-Type", "text/plain"),
];

/// A node started with no `--ds-listen` prints a Durable Streams listener next to the Pico
/// one, on the host of `--listen` (port 0 here, as `--listen`'s), and it speaks Durable
/// Streams over the same data. Before: no second listener unless asked.
#[test]
fn a_node_serves_durable_streams_by_default() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = common::cli::pico_without_pico_env()
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
        ])
        .args(["--cores", "1", "--meta-url", "sqlite:meta.db"])
        .args(["--storage", "-2@file://objects", "--wal-dir", "wal"])
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn pico serve");
    let lines = BufReader::new(child.stdout.take().unwrap());
    let deadline = Instant::now() + Duration::from_secs(60);
    let (mut pico, mut durable) = (None, None);
    for line in lines.lines() {
        let line = line.expect("read stdout");
        let addr = |rest: &str| {
            rest.split_whitespace()
                .next()
                .unwrap()
                .parse::<SocketAddr>()
        };
        if let Some(rest) = line.strip_prefix("serving on http://") {
            pico = Some(addr(rest).unwrap());
        } else if let Some(rest) = line.strip_prefix("durable streams on http://") {
            durable = Some(addr(rest).unwrap());
        } else if line.starts_with("admin on ") {
            break;
        }
        assert!(Instant::now() < deadline, "no admin line");
    }
    let result = std::panic::catch_unwind(|| {
        let pico = pico.expect("serving on line");
        let durable = durable.expect("a durable streams line with no --ds-listen given");
        assert!(durable.ip().is_loopback(), "{durable}");
        assert_ne!(durable.port(), pico.port());
        ds(
            durable,
            "PUT",
            "/chat",
            &[("Content-Type", "text/plain")],
            b"",
        )
        .expect(201);
        ds(durable, "POST", "/chat", DS_PRODUCER, b"hi").expect(200);
        let read = common::ds_read(durable, "/chat", "-1");
        assert_eq!(read.expect(200).text(), "hi");
        // The same stream through the Pico listener.
        let mut conn = common::Conn::connect(pico).unwrap();
        let head = conn.request("HEAD", "/chat", &[], b"").unwrap();
        assert_eq!(head.expect(200).h_u64("pico-next-seq"), 1);
    });
    let _ = child.kill();
    let _ = child.wait();
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
}

/// A Durable Streams idempotent append sent to the Pico listener twice (a retry) is refused
/// both times, naming the Durable Streams listener, and writes nothing; before, the Pico
/// handler ignored the `Producer-*` headers and wrote it twice. The same for `?offset=`
/// (before: ignored, every read from 0) and the other `Stream-*` headers.
#[test]
fn a_pico_listener_refuses_durable_streams_requests_and_says_where_they_go() {
    let server = Server::start(&["--cores", "1"]);
    let durable = server.second.expect("the Durable Streams listener");
    server.put("/orders", "text/plain").expect(201);
    for _ in 0..2 {
        let body = server
            .request("POST", "/orders", DS_PRODUCER, b"once")
            .expect_error(400, "wrong_protocol");
        let message = body["message"].as_str().unwrap();
        assert!(message.contains("Producer-Id"), "{message}");
        assert!(message.contains("Pico-Producer-Id"), "{message}");
        assert!(
            message.contains(&format!("Durable Streams at http://{durable}")),
            "{message}"
        );
    }
    assert_eq!(server.head("/orders").expect(200).h_u64("pico-next-seq"), 0);
    let body = server
        .get("/orders?offset=-1")
        .expect_error(400, "wrong_protocol");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("query parameter offset"),
        "{body}"
    );
    for header in ["Stream-Seq", "Stream-Closed", "Stream-TTL"] {
        let resp = server.request("POST", "/orders", &[(header, "1")], b"x");
        let body = resp.expect_error(400, "wrong_protocol");
        assert!(body["message"].as_str().unwrap().contains(header), "{body}");
        resp.expect_every_response_headers();
    }
    assert_eq!(server.head("/orders").expect(200).h_u64("pico-next-seq"), 0);
    // What a PicoMQ 0.1 client sends still works: Pico headers, `seq`, `live`, `cursor`.
    let pico_producer = [
        ("Pico-Producer-Id", "w1"),
        ("Pico-Producer-Epoch", "0"),
        ("Pico-Producer-Seq", "0"),
    ];
    for _ in 0..2 {
        server
            .request("POST", "/orders", &pico_producer, b"once")
            .expect(200);
    }
    assert_eq!(server.head("/orders").expect(200).h_u64("pico-next-seq"), 1);
    server
        .get("/orders?seq=0&live=long-poll&cursor=5&format=json")
        .expect(200);
    // A CORS preflight names headers without sending them: answered as before.
    server
        .request("OPTIONS", "/orders?offset=1", &[("Stream-Seq", "1")], b"")
        .expect(204);
}

/// The Durable Streams listener refuses Pico headers and `?seq=` the same way, naming the
/// Pico listener.
#[test]
fn a_durable_streams_listener_refuses_pico_requests_and_says_where_they_go() {
    let server = Server::start(&["--cores", "1"]);
    let durable = server.second.expect("the Durable Streams listener");
    ds(durable, "PUT", "/s", &[("Content-Type", "text/plain")], b"").expect(201);
    let pico_url = format!("the Pico protocol at http://{}", server.addr);
    let refused = ds(durable, "POST", "/s", &[("Pico-Match-Seq", "0")], b"x");
    refused.expect(400);
    let body = refused.json();
    assert_eq!(body["error"]["code"], "WRONG_PROTOCOL", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("Pico-Match-Seq"), "{message}");
    assert!(message.contains(&pico_url), "{message}");
    let refused = ds(durable, "GET", "/s?seq=0", &[], b"");
    refused.expect(400);
    let message = refused.json()["error"]["message"].to_string();
    assert!(message.contains("query parameter seq"), "{message}");
    assert!(message.contains(&pico_url), "{message}");
    let head = ds(durable, "HEAD", "/s", &[], b"");
    assert_eq!(
        head.expect(200).h("stream-next-offset"),
        format!("{:016}_{:016}", 0, 0)
    );
}

/// `--ds-listen off` opens no second listener, and the Pico listener's refusal says so and how
/// to start one.
#[test]
fn ds_listen_off_opens_no_second_listener() {
    let server = Server::start(&["--cores", "1", "--ds-listen", "off"]);
    assert_eq!(server.second, None);
    let body = server
        .request("POST", "/nope", DS_PRODUCER, b"x")
        .expect_error(400, "wrong_protocol");
    let message = body["message"].as_str().unwrap();
    assert!(
        message.contains("no Durable Streams listener") && message.contains("--ds-listen ADDR"),
        "{message}"
    );
    assert!(!server.log().contains("protocol ds"), "{}", server.log());
}

/// Two listeners of one node on one address would both bind (the port is shared across cores)
/// and split its connections: refused at start, as is a `--listen` on the default Durable
/// Streams port with no `--ds-listen`.
#[test]
fn listeners_that_would_share_an_address_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&[&str], &str); 2] = [
        (
            &["--listen", "127.0.0.1:4999", "--ds-listen", "127.0.0.1:4999"],
            "--listen and --ds-listen are both 127.0.0.1:4999",
        ),
        (
            &["--listen", "127.0.0.1:4438"],
            "--listen 127.0.0.1:4438 takes port 4438, where Durable Streams listens by default: give --ds-listen ADDR, or --ds-listen off",
        ),
    ];
    for (flags, expected) in cases {
        let mut args = vec!["serve", "--admin-listen", "127.0.0.1:0"];
        args.extend_from_slice(flags);
        let output = common::pico(dir.path(), &args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{flags:?}: {stderr}");
        assert!(stderr.contains(expected), "{flags:?}: {stderr}");
    }
}

/// What the client says, and what to do, when it talks to the wrong kind of listener: nothing
/// listening, `http://` to a TLS node, `https://` to a plain one, a
/// Pico client on the Durable Streams listener and the reverse.
#[test]
fn client_errors_say_what_to_do() {
    let plain = Server::start(&["--cores", "1"]);
    let durable = plain.second.expect("the Durable Streams listener");
    let certs = tempfile::tempdir().unwrap();
    assert!(common::pico(certs.path(), &["cert", "--dir", "."])
        .status
        .success());
    let tls = Server::start(&[
        "--cores",
        "1",
        "--ds-listen",
        "off",
        "--tls-cert",
        &certs.path().join("cert.pem").display().to_string(),
        "--tls-key",
        &certs.path().join("key.pem").display().to_string(),
    ]);
    let fails = |args: &[&str], wanted: &[&str]| {
        let out = common::pico(plain.dir(), args);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        for part in wanted {
            assert!(stderr.contains(part), "{args:?}: {part:?} not in {stderr}");
        }
    };
    // A port nothing listens on: one bound and closed at once.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let nowhere = format!("http://{closed}");
    fails(
        &["--endpoint", &nowhere, "head", "/s"],
        &[&format!("is `pico serve` running at {nowhere}?")],
    );
    let tls_addr = tls.addr.to_string();
    fails(
        &["--endpoint", &format!("http://{tls_addr}"), "head", "/s"],
        &[&format!(
            "if the node serves TLS (pico serve --tls-cert), use https://{tls_addr}"
        )],
    );
    let plain_addr = plain.addr.to_string();
    fails(
        &["--endpoint", &format!("https://{plain_addr}"), "head", "/s"],
        &[&format!(
            "answered in plain HTTP, not TLS: use http://{plain_addr}"
        )],
    );
    // A Pico client on the Durable Streams listener: refused, naming the Pico listener; where
    // the request is one both protocols share, the answer's missing headers are explained.
    let on_ds = format!("http://{durable}");
    fails(
        &["--endpoint", &on_ds, "read", "/s"],
        &[
            "WRONG_PROTOCOL (400)",
            &format!("this node serves the Pico protocol at http://{plain_addr}"),
        ],
    );
    assert!(
        common::pico(plain.dir(), &["--endpoint", &on_ds, "create", "/s"])
            .status
            .success()
    );
    fails(
        &["--endpoint", &on_ds, "head", "/s"],
        &["is it a Durable Streams listener? Use --protocol ds there"],
    );
    // And the reverse.
    let on_pico = format!("http://{plain_addr}");
    fails(
        &["--protocol", "ds", "--endpoint", &on_pico, "read", "/s"],
        &[
            "wrong_protocol (400)",
            &format!("this node serves Durable Streams at http://{durable}"),
        ],
    );
    fails(
        &["--protocol", "ds", "--endpoint", &on_pico, "head", "/s"],
        &["is it a Pico listener? Use --protocol pico there"],
    );
}
