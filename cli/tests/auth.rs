//! With `--auth required`, bearer tokens from `--auth-tokens` guard every request: 401
//! with `WWW-Authenticate: Bearer` without a known token, 403 for a known token without the
//! grant; SIGHUP reloads the file; a non-loopback listener without auth refuses to start.

mod common;

use std::time::{Duration, Instant};

use common::Server;

const TOKENS: &str = "# token   prefix   permissions\n\
                      reader    /logs/   read\n\
                      writer    /        read,append\n";

fn auth_header(token: &str) -> (&'static str, String) {
    ("authorization", format!("Bearer {token}"))
}

fn request(
    server: &Server,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &[u8],
) -> common::Resp {
    let header = token.map(auth_header);
    let headers: Vec<(&str, &str)> = header.iter().map(|(n, v)| (*n, v.as_str())).collect();
    server.request(method, path, &headers, body)
}

fn error_code(response: &common::Resp) -> String {
    let body: serde_json::Value = serde_json::from_slice(&response.body).unwrap();
    body["error"].as_str().unwrap().to_string()
}

#[test]
fn the_auth_matrix_and_sighup_reload() {
    let (server, token_file) = common::start_with_tokens(TOKENS, &[]);
    let tokens = &token_file.path;

    // No token, or an unknown one: 401 with the challenge and a JSON error.
    for token in [None, Some("nobody")] {
        let response = request(&server, "PUT", "/logs/a", token, b"");
        assert_eq!(response.status, 401, "{token:?}");
        assert_eq!(response.h("www-authenticate"), "Bearer");
        assert_eq!(error_code(&response), "unauthorized");
    }
    // The writer may create and append anywhere.
    assert_eq!(
        request(&server, "PUT", "/logs/a", Some("writer"), b"").status,
        201
    );
    assert_eq!(
        request(&server, "POST", "/logs/a", Some("writer"), b"hello").status,
        200
    );
    assert_eq!(
        request(&server, "PUT", "/other", Some("writer"), b"").status,
        201
    );
    // The reader reads under its prefix only, and never writes.
    let read = request(&server, "GET", "/logs/a?format=raw", Some("reader"), b"");
    assert_eq!((read.status, read.body.as_slice()), (200, &b"hello"[..]));
    assert_eq!(
        request(&server, "HEAD", "/logs/a", Some("reader"), b"").status,
        200
    );
    for (method, path) in [
        ("POST", "/logs/a"),
        ("DELETE", "/logs/a"),
        ("GET", "/other"),
        ("GET", "/?prefix=/"),
    ] {
        let response = request(&server, method, path, Some("reader"), b"x");
        assert_eq!(response.status, 403, "{method} {path}");
        assert_eq!(error_code(&response), "forbidden");
    }
    let listing = request(&server, "GET", "/?prefix=/logs/", Some("reader"), b"");
    assert_eq!(listing.status, 200);
    // Preflights and probes stay open.
    assert_eq!(
        request(&server, "OPTIONS", "/logs/a", None, b"").status,
        204
    );
    let mut admin = common::Conn::connect(server.admin).unwrap();
    assert_eq!(
        admin.request("GET", "/health", &[], b"").unwrap().status,
        200
    );

    // SIGHUP reloads the file: a new token works, a removed one stops working.
    std::fs::write(tokens, "newcomer / read\n").unwrap();
    let pid = server.pid().unwrap();
    // SAFETY: kill(2) on the pid of the server this test started.
    unsafe { libc::kill(pid as i32, libc::SIGHUP) };
    let deadline = Instant::now() + Duration::from_secs(10);
    while request(&server, "GET", "/logs/a", Some("newcomer"), b"").status != 200 {
        assert!(
            Instant::now() < deadline,
            "the reloaded token never worked\n{}",
            server.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        request(&server, "GET", "/logs/a", Some("writer"), b"").status,
        401
    );
    assert!(
        !server.log().contains("newcomer"),
        "tokens must never be logged"
    );

    // The pico client sends --token as a bearer token.
    let endpoint = format!("http://{}", server.addr);
    let args = [
        "--endpoint",
        &endpoint,
        "--token",
        "newcomer",
        "read",
        "/logs/a",
    ];
    let output = common::pico(server.dir(), &args);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&output.stdout), "0\thello\n");
}

#[test]
fn remote_listeners_need_auth_or_an_explicit_opt_in() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&[&str], &str); 3] = [
        (
            &["--listen", "0.0.0.0:0", "--admin-listen", "127.0.0.1:0"],
            "refusing to listen on 0.0.0.0:0",
        ),
        (
            &["--listen", "127.0.0.1:0", "--admin-listen", "0.0.0.0:0"],
            "refusing to listen on 0.0.0.0:0",
        ),
        (
            &["--listen", "127.0.0.1:0", "--ds-listen", "0.0.0.0:0"],
            "refusing to listen on 0.0.0.0:0",
        ),
    ];
    for (flags, expected) in cases {
        let args: Vec<&str> = std::iter::once("serve")
            .chain(flags.iter().copied())
            .collect();
        let output = common::pico(dir.path(), &args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{flags:?}: {stderr}");
        assert!(
            stderr.contains(expected) && stderr.contains("--insecure-allow-remote"),
            "{stderr}"
        );
    }
    let args = [
        "serve",
        "--auth",
        "required",
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
    ];
    let output = common::pico(dir.path(), &args);
    assert_eq!(output.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&output.stderr)
        .contains("--auth required needs --auth-tokens FILE"));
}

/// A token file that grants nothing would make a node that refuses every request: it does not
/// start, and says why. A file saved "UTF-8 with BOM" works (the mark is not part of the first
/// token), and a token no client could send (not visible ASCII) is named by its line.
#[test]
fn token_files_that_would_lock_everyone_out_are_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let serve = |file: &std::path::Path| {
        let file = file.to_str().unwrap().to_string();
        common::pico(
            dir.path(),
            &[
                "serve",
                "--auth",
                "required",
                "--auth-tokens",
                &file,
                "--listen",
                "127.0.0.1:0",
                "--admin-listen",
                "127.0.0.1:0",
            ],
        )
    };
    for (name, text, expected) in [
        ("empty", "# nobody yet\n\n", "no grants"),
        ("nbsp", "tok\u{a0}en / read\n", "line 1"),
        ("cyrillic", "ok / read\nt\u{43e}ken / read\n", "line 2"),
    ] {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        let output = serve(&path);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{name}: {stderr}");
        assert!(stderr.contains(expected), "{name}: {stderr}");
    }

    let (server, _tokens) = common::start_with_tokens("\u{feff}writer / read,append\n", &[]);
    let created = request(&server, "PUT", "/bom", Some("writer"), b"");
    created.expect(201);
}

/// A live SSE response does not outlive a reload that revokes its token: it ends at its next
/// read, so records appended after the reload never reach it, and its client reconnects into
/// a `401`. Before, it streamed on for up to `--sse-max-duration-sec` (55 s).
#[test]
fn a_reload_that_revokes_a_token_ends_its_open_sse_responses() {
    use std::io::{Read, Write};
    let (server, tokens) =
        common::start_with_tokens("reader /logs/ read\nwriter / read,append\n", &[]);
    request(&server, "PUT", "/logs/live", Some("writer"), b"").expect(201);
    request(&server, "POST", "/logs/live", Some("writer"), b"before").expect(200);
    let mut sse = std::net::TcpStream::connect(server.addr).unwrap();
    sse.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    sse.write_all(
        b"GET /logs/live?live=sse HTTP/1.1\r\nhost: x\r\nauthorization: Bearer reader\r\n\r\n",
    )
    .unwrap();
    let mut seen = Vec::new();
    let read_until = |sse: &mut std::net::TcpStream, seen: &mut Vec<u8>, what: &[u8]| {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut buf = [0u8; 4096];
        while Instant::now() < deadline && !seen.windows(what.len()).any(|w| w == what) {
            match sse.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => seen.extend_from_slice(&buf[..n]),
                Err(_) => {}
            }
        }
    };
    read_until(&mut sse, &mut seen, b"before");
    assert!(
        String::from_utf8_lossy(&seen).contains("before"),
        "{}",
        String::from_utf8_lossy(&seen)
    );

    std::fs::write(&tokens.path, "writer / read,append\n").unwrap();
    let pid = server.pid().unwrap();
    // SAFETY: kill(2) on the pid of the server this test started.
    unsafe { libc::kill(pid as i32, libc::SIGHUP) };
    let deadline = Instant::now() + Duration::from_secs(10);
    while request(&server, "GET", "/logs/live", Some("reader"), b"").status != 401 {
        assert!(Instant::now() < deadline, "the reload never took effect");
        std::thread::sleep(Duration::from_millis(50));
    }
    request(&server, "POST", "/logs/live", Some("writer"), b"after").expect(200);
    // The response ends (its last chunk) without the record appended after the reload.
    read_until(&mut sse, &mut seen, b"\r\n0\r\n\r\n");
    let text = String::from_utf8_lossy(&seen);
    assert!(!text.contains("after"), "{text}");
    assert!(
        text.ends_with("\r\n0\r\n\r\n"),
        "the response did not end: {text}"
    );
}
