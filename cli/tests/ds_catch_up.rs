//! Durable Streams catch-up reads (`GET` without `live`) answer up to the tail in one
//! response, within `--catch-up-read-size` (4 MiB by default): the official TypeScript client
//! with `live: false` reads one response and stops, so a catch-up that answered one 64 KiB
//! chunk looked to its users like lost data. Past the budget the answer is a chunk that ends
//! where it always ends (cacheable); live reads keep `--max-chunk-size`.

mod common;

use std::net::SocketAddr;
use std::path::Path;

use common::{ds, Server};

const STREAM: &str = "/catch-up/s";
/// Messages the stream gets: about 0.7 MB of JSON, far past one 64 KiB chunk.
const MESSAGES: usize = 20_000;
const BATCH: usize = 1000;

fn message(n: usize) -> serde_json::Value {
    serde_json::json!({ "n": n, "msg": "hello world" })
}

/// A `--protocol ds` node with `MESSAGES` JSON messages in [`STREAM`].
fn filled(extra: &[&str]) -> (Server, SocketAddr) {
    let mut args = vec!["--protocol", "ds"];
    args.extend(extra);
    let server = Server::start(&args);
    let addr = server.addr;
    let json = [("content-type", "application/json")];
    ds(addr, "PUT", STREAM, &json, b"").expect(201);
    for start in (0..MESSAGES).step_by(BATCH) {
        let batch: Vec<_> = (start..start + BATCH).map(message).collect();
        let body = serde_json::to_vec(&batch).unwrap();
        ds(addr, "POST", STREAM, &json, &body).expect(204);
    }
    (server, addr)
}

fn next_offset(response: &common::Resp) -> String {
    response.h("stream-next-offset").to_string()
}

fn messages_of(response: &common::Resp) -> Vec<serde_json::Value> {
    serde_json::from_slice(&response.body).expect("a JSON array")
}

#[test]
fn a_catch_up_read_answers_up_to_the_tail_in_one_response() {
    let (_server, addr) = filled(&[]);
    let whole = ds(addr, "GET", &format!("{STREAM}?offset=-1"), &[], b"");
    whole.expect(200);
    assert_eq!(whole.header("stream-up-to-date"), Some("true"));
    assert_eq!(
        next_offset(&whole),
        format!("{MESSAGES:016}_{:016}", 0),
        "the response ends at the tail"
    );
    let got = messages_of(&whole);
    assert_eq!(got.len(), MESSAGES);
    assert!(got.iter().enumerate().all(|(n, m)| *m == message(n)));
    // From the middle, the same: everything after it.
    let half = format!("{:016}_{:016}", MESSAGES / 2, 0);
    let rest = ds(addr, "GET", &format!("{STREAM}?offset={half}"), &[], b"");
    rest.expect(200);
    assert_eq!(messages_of(&rest).len(), MESSAGES / 2);
    assert_eq!(messages_of(&rest)[0], message(MESSAGES / 2));

    // A long-poll (a live read) still answers one chunk: --max-chunk-size, 64 KiB.
    let live = ds(
        addr,
        "GET",
        &format!("{STREAM}?offset=-1&live=long-poll"),
        &[],
        b"",
    );
    live.expect(200);
    assert!(
        live.body.len() <= 64 * 1024 + 64,
        "a live read of {} bytes",
        live.body.len()
    );
    assert!(messages_of(&live).len() < MESSAGES);
    assert_eq!(live.header("stream-up-to-date"), None);
}

#[test]
fn a_catch_up_read_past_its_budget_is_a_chunk_that_always_ends_in_the_same_place() {
    let (_server, addr) = filled(&["--catch-up-read-size", "128KiB"]);
    let mut offset = "-1".to_string();
    let mut got = Vec::new();
    let mut responses = 0;
    loop {
        let path = format!("{STREAM}?offset={offset}");
        let response = ds(addr, "GET", &path, &[], b"");
        response.expect(200);
        responses += 1;
        assert!(responses <= MESSAGES, "no progress at {offset}");
        assert!(
            response.body.len() <= 128 * 1024 + 64,
            "{} bytes past a 128 KiB budget",
            response.body.len()
        );
        let up_to_date = response.header("stream-up-to-date") == Some("true");
        if !up_to_date {
            // Cacheable, and the same again: caches can share it.
            assert!(response.h("cache-control").starts_with("public, max-age="));
            let again = ds(addr, "GET", &path, &[], b"");
            assert_eq!(again.h("etag"), response.h("etag"));
            assert_eq!(next_offset(&again), next_offset(&response));
            assert_eq!(again.body, response.body);
        }
        got.extend(messages_of(&response));
        offset = next_offset(&response);
        if up_to_date {
            break;
        }
    }
    assert!(responses > 2, "a 128 KiB budget split the stream");
    assert_eq!(got.len(), MESSAGES);
    assert!(got.iter().enumerate().all(|(n, m)| *m == message(n)));
}

#[test]
fn the_catch_up_read_size_is_checked_at_start() {
    let dir = tempfile::tempdir().unwrap();
    for bad in ["0", "65MiB"] {
        let out = common::pico(
            dir.path(),
            &[
                "serve",
                "--catch-up-read-size",
                bad,
                "--listen",
                "127.0.0.1:0",
            ],
        );
        assert!(!out.status.success(), "--catch-up-read-size {bad} accepted");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("--catch-up-read-size must be between 1 byte and 64 MiB"),
            "{stderr}"
        );
    }
}

/// As a new user would: the official TypeScript client (`@durable-streams/client`, installed
/// under `conformance/` by `.ci/run`) with `live: false` gets every message.
#[test]
fn the_official_typescript_client_reads_every_message_with_live_false() {
    let test = "the_official_typescript_client_reads_every_message_with_live_false";
    let conformance = Path::new(env!("CARGO_MANIFEST_DIR")).join("../conformance");
    let installed = conformance.join("node_modules/@durable-streams/client/package.json");
    if !pico_testkit::require_program(test, "node", "apt-get install nodejs") {
        return;
    }
    if !installed.exists() {
        pico_testkit::missing_service(test, "needs the official client (cd conformance && npm ci)");
        return;
    }
    let (_server, addr) = filled(&[]);
    let out = std::process::Command::new("node")
        .arg(conformance.join("read-catch-up.mjs"))
        .arg(format!("http://{addr}{STREAM}"))
        .current_dir(&conformance)
        .output()
        .expect("run node");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("the script's JSON line");
    assert_eq!(report["count"], MESSAGES, "{report}");
    assert_eq!(report["first"], message(0));
    assert_eq!(report["last"], message(MESSAGES - 1));
}
