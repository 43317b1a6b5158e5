//! `pico consume` and `pico read --follow` against a real node: a consumer resumes where it
//! stopped (after a clean stop and after a kill -9 of the client), acknowledges only what it
//! printed, follows live appends, and two members of a group share the streams so that every
//! record is printed by exactly one of them.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::cli::pico_without_pico_env;
use common::Server;

fn pico(server: &Server, args: &[&str]) -> Output {
    pico_without_pico_env()
        .arg("--endpoint")
        .arg(format!("http://{}", server.addr))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run pico")
}

fn spawn(server: &Server, args: &[&str]) -> Child {
    pico_without_pico_env()
        .arg("--endpoint")
        .arg(format!("http://{}", server.addr))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn pico")
}

fn append(server: &Server, stream: &str, records: std::ops::Range<u32>) {
    for i in records {
        server.post(stream, format!("r{i}").as_bytes()).expect(200);
    }
}

fn lines(out: &Output) -> Vec<String> {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

/// The lines a running `pico` prints, as they come.
fn stdout_lines(child: &mut Child) -> mpsc::Receiver<String> {
    let stdout = child.stdout.take().expect("piped stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    rx
}

fn next_line(rx: &mpsc::Receiver<String>, server: &Server) -> String {
    rx.recv_timeout(Duration::from_secs(20))
        .unwrap_or_else(|e| panic!("no line from pico ({e}); server log:\n{}", server.log()))
}

#[test]
fn a_consumer_resumes_where_it_stopped() {
    let server = Server::start(&[]);
    server.put("/jobs", "text/plain").expect(201);
    append(&server, "/jobs", 0..5);
    let first = pico(
        &server,
        &[
            "consume",
            "--consumer",
            "/workers/w",
            "--count",
            "3",
            "/jobs",
        ],
    );
    assert_eq!(lines(&first), ["0\tr0", "1\tr1", "2\tr2"]);
    assert!(String::from_utf8_lossy(&first.stderr).contains("consumed 3 records"));
    let second = pico(
        &server,
        &[
            "consume",
            "--consumer",
            "/workers/w",
            "--count",
            "2",
            "/jobs",
        ],
    );
    assert_eq!(lines(&second), ["3\tr3", "4\tr4"]);

    // Following live: a record appended later arrives, then the close ends the consumer.
    let mut live = spawn(&server, &["consume", "--consumer", "/workers/w", "/jobs"]);
    let rx = stdout_lines(&mut live);
    std::thread::sleep(Duration::from_millis(300));
    append(&server, "/jobs", 5..6);
    assert_eq!(next_line(&rx, &server), "5\tr5");
    server
        .request("POST", "/jobs", &[("pico-closed", "true")], b"")
        .expect(200);
    let status =
        common::exit_within(&mut live, Duration::from_secs(20)).expect("consume ends at the close");
    assert!(status.success());
    let view = server.get("/?consumer=/workers/w");
    view.expect(200);
    assert_eq!(view.json()["streams"][0]["next_seq"], 6);
}

/// The same over HTTP/2 (h2c prior knowledge): the consumer calls and the reads share the
/// client's connection.
#[test]
fn a_consumer_resumes_over_http2_too() {
    let server = Server::start(&[]);
    server.put("/h2", "text/plain").expect(201);
    append(&server, "/h2", 0..4);
    let args = [
        "--http2",
        "consume",
        "--consumer",
        "/workers/h2",
        "--count",
        "2",
        "/h2",
    ];
    assert_eq!(lines(&pico(&server, &args)), ["0\tr0", "1\tr1"]);
    assert_eq!(lines(&pico(&server, &args)), ["2\tr2", "3\tr3"]);
    let view = server.get("/?consumer=/workers/h2");
    assert_eq!(view.json()["streams"][0]["next_seq"], 4);
}

#[test]
fn a_killed_consumer_repeats_at_most_what_it_had_not_acknowledged() {
    let server = Server::start(&[]);
    server.put("/events", "text/plain").expect(201);
    append(&server, "/events", 0..20);
    let mut consumer = spawn(
        &server,
        &[
            "consume",
            "--consumer",
            "/c",
            "--lease-ttl-ms",
            "1000",
            "/events",
        ],
    );
    let rx = stdout_lines(&mut consumer);
    let mut seen = Vec::new();
    while seen.len() < 20 {
        seen.push(next_line(&rx, &server));
    }
    // Acknowledged right after printing: wait until the server has the page, then kill.
    let deadline = Instant::now() + Duration::from_secs(20);
    while server.get("/?consumer=/c").json()["streams"][0]["next_seq"] != 20 {
        assert!(Instant::now() < deadline, "the page was never acknowledged");
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = consumer.kill();
    let _ = consumer.wait();
    append(&server, "/events", 20..22);
    // The lease of the killed client lapses; a new run takes over from the acknowledgement.
    std::thread::sleep(Duration::from_millis(1200));
    let again = pico(
        &server,
        &["consume", "--consumer", "/c", "--count", "2", "/events"],
    );
    assert_eq!(lines(&again), ["20\tr20", "21\tr21"]);
}

#[test]
fn members_of_a_group_share_the_streams_and_every_record_is_printed_once() {
    let server = Server::start(&[]);
    let streams: Vec<String> = (0..4).map(|i| format!("/orders/{i}")).collect();
    for stream in &streams {
        server.put(stream, "text/plain").expect(201);
    }
    let mut args = vec![
        "consume",
        "--consumer",
        "/billing",
        "--group",
        "--lease-ttl-ms",
        "3000",
    ];
    let stream_args: Vec<&str> = streams.iter().map(String::as_str).collect();
    let mut a_args = args.clone();
    a_args.extend(["--member", "a"]);
    a_args.extend(&stream_args);
    args.extend(["--member", "b"]);
    args.extend(&stream_args);
    let mut a = spawn(&server, &a_args);
    let a_lines = stdout_lines(&mut a);
    // Wait until a holds all four, then let b join and take half.
    let deadline = Instant::now() + Duration::from_secs(20);
    while server.get("/?consumer=/billing").status != 200 {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut b = spawn(&server, &args);
    let b_lines = stdout_lines(&mut b);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let view = server.get("/?consumer=/billing").json();
        let members = view["members"].as_array().cloned().unwrap_or_default();
        let shares: Vec<usize> = members
            .iter()
            .map(|m| m["streams"].as_array().map_or(0, Vec::len))
            .collect();
        if shares == [2, 2] {
            break;
        }
        assert!(Instant::now() < deadline, "no even split: {view}");
        std::thread::sleep(Duration::from_millis(100));
    }
    // Let both members see the split (a's next heartbeat), then write.
    std::thread::sleep(Duration::from_millis(1500));
    for (i, stream) in streams.iter().enumerate() {
        server.post(stream, format!("s{i}").as_bytes()).expect(200);
    }
    let mut printed = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while printed.len() < 4 {
        assert!(Instant::now() < deadline, "printed so far: {printed:?}");
        for (who, rx) in [("a", &a_lines), ("b", &b_lines)] {
            while let Ok(line) = rx.try_recv() {
                printed.push((who, line));
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(500));
    for (who, rx) in [("a", &a_lines), ("b", &b_lines)] {
        while let Ok(line) = rx.try_recv() {
            printed.push((who, line));
        }
    }
    let mut records: Vec<&str> = printed.iter().map(|(_, line)| line.as_str()).collect();
    records.sort();
    assert_eq!(
        records,
        [
            "/orders/0\t0\ts0",
            "/orders/1\t0\ts1",
            "/orders/2\t0\ts2",
            "/orders/3\t0\ts3"
        ],
        "{printed:?}"
    );
    assert!(printed.iter().any(|(who, _)| *who == "a"), "{printed:?}");
    assert!(printed.iter().any(|(who, _)| *who == "b"), "{printed:?}");
    let _ = a.kill();
    let _ = b.kill();
    let _ = a.wait();
    let _ = b.wait();
}

#[test]
fn read_follow_catches_up_then_follows_until_the_close() {
    let server = Server::start(&[]);
    server.put("/log", "text/plain").expect(201);
    append(&server, "/log", 0..3);
    let mut reader = spawn(&server, &["read", "/log", "--from", "1", "--follow"]);
    let rx = stdout_lines(&mut reader);
    assert_eq!(next_line(&rx, &server), "1\tr1");
    assert_eq!(next_line(&rx, &server), "2\tr2");
    append(&server, "/log", 3..4);
    assert_eq!(next_line(&rx, &server), "3\tr3");
    server
        .request("POST", "/log", &[("pico-closed", "true")], b"")
        .expect(200);
    let status =
        common::exit_within(&mut reader, Duration::from_secs(20)).expect("read ends at the close");
    assert!(status.success());
}

/// A trim (or retention) that moved a stream's start past a consumer's position before it
/// read there: the consumer goes on from the first readable record and says what it missed,
/// instead of failing with `410` on every run (README's "Use it" trims, then consumes).
#[test]
fn a_consumer_goes_on_from_the_first_readable_record_after_a_trim() {
    let server = Server::start(&[]);
    server.put("/orders", "text/plain").expect(201);
    append(&server, "/orders", 0..8);
    let trimmed = pico(&server, &["trim", "/orders", "--seq", "5"]);
    assert!(
        trimmed.status.success(),
        "{}",
        String::from_utf8_lossy(&trimmed.stderr)
    );
    let args = [
        "consume",
        "--consumer",
        "/shipping/labels",
        "--count",
        "3",
        "/orders",
    ];
    let first = pico(&server, &args);
    assert_eq!(lines(&first), ["5\tr5", "6\tr6", "7\tr7"]);
    let said = String::from_utf8_lossy(&first.stderr);
    assert!(said.contains("records 0..5 were trimmed"), "{said}");
    // Acknowledged: the next run starts after them, with nothing trimmed to report.
    append(&server, "/orders", 8..9);
    let second = pico(
        &server,
        &[
            "consume",
            "--consumer",
            "/shipping/labels",
            "--count",
            "1",
            "/orders",
        ],
    );
    assert_eq!(lines(&second), ["8\tr8"]);
    assert!(!String::from_utf8_lossy(&second.stderr).contains("trimmed"));
}

/// A stream deleted and created again is another stream: its consumer starts it from its
/// first record, not where it stood in the old one (which left it waiting for records past the
/// new stream's tail, and skipping the new stream's first ones once it got there).
#[test]
fn a_consumer_reads_a_stream_created_again_from_its_beginning() {
    let server = Server::start(&[]);
    server.put("/inbox", "text/plain").expect(201);
    append(&server, "/inbox", 0..6);
    let args = ["consume", "--consumer", "/mail", "--count", "6", "/inbox"];
    assert_eq!(lines(&pico(&server, &args)).len(), 6);
    server.delete("/inbox").expect(204);
    server.put("/inbox", "text/plain").expect(201);
    append(&server, "/inbox", 100..102);
    let args = ["consume", "--consumer", "/mail", "--count", "2", "/inbox"];
    assert_eq!(lines(&pico(&server, &args)), ["0\tr100", "1\tr101"]);
    append(&server, "/inbox", 102..103);
    let args = ["consume", "--consumer", "/mail", "--count", "1", "/inbox"];
    assert_eq!(lines(&pico(&server, &args)), ["2\tr102"]);
}

/// A consumer stopped by a signal (Ctrl-C, `kill`, a service manager's stop) releases before
/// it exits with the shell's status for the signal: its streams are free at once, not after
/// the lease.
#[test]
fn a_consumer_stopped_by_a_signal_releases_its_lease() {
    let server = Server::start(&[]);
    server.put("/signal/a", "text/plain").expect(201);
    append(&server, "/signal/a", 0..2);
    for (signal, status) in [(libc::SIGINT, 130), (libc::SIGTERM, 143)] {
        let consumer = format!("/signal/c{status}");
        let mut child = spawn(
            &server,
            &[
                "consume",
                "--consumer",
                &consumer,
                "--lease-ttl-ms",
                "600000",
                "/signal/a",
            ],
        );
        let rx = stdout_lines(&mut child);
        assert_eq!(next_line(&rx, &server), "0\tr0");
        assert_eq!(next_line(&rx, &server), "1\tr1");
        let query = format!("/?consumer={consumer}");
        assert_eq!(server.get(&query).json()["state"], "READING");
        // SAFETY: kill(2) on our own child's pid; no memory is involved.
        unsafe { libc::kill(child.id() as i32, signal) };
        let exited = common::exit_within(&mut child, Duration::from_secs(20)).expect("it exits");
        assert_eq!(exited.code(), Some(status));
        let view = server.get(&query).json();
        assert_ne!(view["state"], "READING", "released: {view}");
    }
}
