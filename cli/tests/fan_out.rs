//! `pico bench --fan-out` against a real `pico serve`, both protocols and both live modes:
//! every subscriber gets every record, in order, once (counts only; latency is for the
//! benchmarks, BENCHMARKS.md "Fan-out: 10,000 subscribers on one stream").

mod common;

use common::cli::outcome;
use common::Server;

const SUBSCRIBERS: u64 = 50;

/// `pico bench --fan-out` of `subscribers` on `server`, one 64 B append every 50 ms for 2 s,
/// then `extra` flags.
fn bench(
    server: &Server,
    protocol: &str,
    mode: &str,
    subscribers: u64,
    extra: &[&str],
) -> std::process::Output {
    let endpoint = format!("http://{}", server.addr);
    let subscribers = subscribers.to_string();
    let mut args = vec![
        "--endpoint",
        &endpoint,
        "--protocol",
        protocol,
        "bench",
        "--fan-out",
        &subscribers,
        "--live-mode",
        mode,
        "--append-interval-ms",
        "50",
        "-d",
        "2",
        "-b",
        "64",
    ];
    args.extend_from_slice(extra);
    common::pico(server.dir(), &args)
}

fn fan_out(server: &Server, protocol: &str, mode: &str) {
    let out = bench(server, protocol, mode, SUBSCRIBERS, &["--output", "json"]);
    let (code, stdout, stderr) = outcome(&out);
    assert_eq!(code, Some(0), "{protocol} {mode}: {stderr}");
    let summary: serde_json::Value = serde_json::from_str(&stdout).expect("one JSON object");
    let f = &summary["fan_out"];
    let records = f["records"].as_u64().expect("fan_out.records");
    assert!(records > 0, "{summary}");
    assert_eq!(f["connected"].as_u64(), Some(SUBSCRIBERS), "{summary}");
    assert_eq!(f["complete"].as_u64(), Some(SUBSCRIBERS), "{summary}");
    assert_eq!(f["delivered_min"].as_u64(), Some(records), "{summary}");
    assert_eq!(f["missed"].as_u64(), Some(0), "{summary}");
    assert_eq!(f["duplicates"].as_u64(), Some(0), "{summary}");
    assert_eq!(
        summary["read"]["records"].as_u64(),
        Some(records * SUBSCRIBERS),
        "{summary}"
    );
}

#[test]
fn every_pico_subscriber_gets_every_record() {
    let server = Server::start(&["--cores", "1"]);
    fan_out(&server, "pico", "sse");
    fan_out(&server, "pico", "long-poll");
}

#[test]
fn every_durable_streams_subscriber_gets_every_record() {
    let server = Server::start(&["--protocol", "ds", "--cores", "1"]);
    fan_out(&server, "ds", "sse");
    fan_out(&server, "ds", "long-poll");
}

/// A Durable Streams fan-out against the Pico listener: a Pico answer carries no
/// `Stream-Next-Offset`, so each subscriber would ask again from the start as fast as it could
/// and report only duplicates. The listener refuses `?offset=` with a `400` naming the node's
/// Durable Streams listener, and the bench reports that first error.
#[test]
fn a_durable_streams_fan_out_against_a_pico_node_says_so() {
    let server = Server::start(&["--cores", "1"]);
    let durable = server.second.expect("the Durable Streams listener");
    let out = bench(&server, "ds", "long-poll", 4, &[]);
    let (_, stdout, stderr) = outcome(&out);
    let text = format!("{stdout}{stderr}");
    assert!(
        text.contains("wrong_protocol")
            && text.contains(&format!(
                "this node serves Durable Streams at http://{durable}"
            )),
        "{text}"
    );
}
