//! The stream commands and `pico bench` in Durable Streams mode (`--protocol ds`) against a
//! real `pico serve --protocol ds`: stdout, stderr and exit codes as in Pico mode (README.md,
//! "Use it"). Offsets are the server's `<seq>_<bytes>` form; the CLI only echoes them.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::cli::{outcome, run_with_stdin};
use common::Server;

/// One core and a short long-poll keep `tail` quick and the shared machine calm.
const FLAGS: &[&str] = &[
    "--protocol",
    "ds",
    "--cores",
    "1",
    "--long-poll-timeout-sec",
    "1",
];

/// The offset after `records` records, as the server writes it.
fn off(records: u64) -> String {
    format!("{records:016}_{:016}", 0)
}

/// Client commands against one DS server, with a clean environment.
struct Ds<'s> {
    server: &'s Server,
}

impl Ds<'_> {
    /// The connection flags, then `args`.
    fn args<'a>(&self, endpoint: &'a str, args: &[&'a str]) -> Vec<&'a str> {
        let mut all = vec!["--endpoint", endpoint, "--protocol", "ds"];
        all.extend_from_slice(args);
        all
    }

    fn endpoint(&self) -> String {
        format!("http://{}", self.server.addr)
    }

    /// `pico ARGS` with stdin closed.
    fn run(&self, args: &[&str]) -> Output {
        let endpoint = self.endpoint();
        common::pico(self.server.dir(), &self.args(&endpoint, args))
    }

    /// `pico ARGS` with a clean environment as [`common::pico`] runs it, for callers that
    /// pipe stdin or read stdout as it comes.
    fn command(&self, args: &[&str]) -> Command {
        let endpoint = self.endpoint();
        let mut command = Command::new(env!("CARGO_BIN_EXE_pico"));
        command
            .args(self.args(&endpoint, args))
            .current_dir(self.server.dir())
            .env_clear();
        command
    }

    fn run_with(&self, args: &[&str], stdin: &[u8]) -> Output {
        run_with_stdin(&mut self.command(args), stdin)
    }

    /// Checks exit code, stdout and stderr exactly.
    #[track_caller]
    fn expect(&self, args: &[&str], stdin: &[u8], code: i32, stdout: &str, stderr: &str) {
        let out = self.run_with(args, stdin);
        assert_eq!(
            outcome(&out),
            (Some(code), stdout.to_owned(), stderr.to_owned()),
            "pico {args:?}"
        );
    }

    /// Checks a failure: exit 1, nothing on stdout, stderr starting with `stderr_prefix`.
    #[track_caller]
    fn expect_failure(&self, args: &[&str], stdin: &[u8], stderr_prefix: &str) -> String {
        let out = self.run_with(args, stdin);
        let (code, stdout, stderr) = outcome(&out);
        assert_eq!(
            (code, stdout.as_str()),
            (Some(1), ""),
            "pico {args:?}: {stderr}"
        );
        assert!(
            stderr.starts_with(stderr_prefix) && stderr.ends_with('\n'),
            "pico {args:?}: stderr {stderr:?} does not start with {stderr_prefix:?}"
        );
        stderr
    }
}

#[test]
fn create_head_append_and_read_speak_durable_streams() {
    let server = Server::start(FLAGS);
    let ds = Ds { server: &server };
    let s = "/ds/text";
    let text = ["--content-type", "text/plain"];
    ds.expect(
        &["create", s, text[0], text[1], "--ttl", "60"],
        b"",
        0,
        "",
        "created=true\n",
    );
    ds.expect(
        &["create", s, text[0], text[1], "--ttl", "60"],
        b"",
        0,
        "",
        "created=false\n",
    );
    // The same name with another TTL is a different configuration: 409.
    ds.expect_failure(
        &["create", s, text[0], text[1], "--ttl", "61"],
        b"",
        "pico: CONFLICT (409)",
    );
    // Stream-TTL reached the server (`head` does not print it: ask over raw HTTP).
    let head = server.head(s);
    head.expect(200);
    assert_eq!(head.h("stream-ttl"), "60");
    ds.expect(
        &["head", s],
        b"",
        0,
        &format!("start=-1 next={} closed=false type=text/plain\n", off(0)),
        "",
    );

    // One message per line, each acknowledged with the new tail (the only offset DS gives):
    // with --batch 1, PicoMQ 0.1's line per request; by default, one summary line.
    ds.expect(
        &["append", s, text[0], text[1], "--batch", "1"],
        b"one\n",
        0,
        "",
        &format!("start={0} next={0}\n", off(1)),
    );
    let out = ds.run_with(&["append", s, text[0], text[1]], b"two\n");
    let (code, _, stderr) = outcome(&out);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stderr.starts_with("appended 1 record, 3 B in 1 request, ")
            && stderr.ends_with(&format!(": next={}\n", off(2))),
        "{stderr}"
    );
    // Without --content-type, the stream's own; another is refused. --batch > 1 is refused
    // before anything is sent.
    ds.expect_failure(
        &["append", s, "--content-type", "application/json"],
        b"{}\n",
        "pico: CONFLICT (409)",
    );
    let out = ds.run_with(&["append", s], b"three\n");
    let (code, _, stderr) = outcome(&out);
    assert_eq!(code, Some(0), "{stderr}");
    ds.expect(
        &["append", s, text[0], text[1], "--batch", "2"],
        b"a\nb\n",
        1,
        "",
        "pico: the Durable Streams protocol appends one message per request\n",
    );
    ds.expect(
        &["head", s],
        b"",
        0,
        &format!("start=-1 next={} closed=false type=text/plain\n", off(3)),
        "",
    );

    // A read is one chunk per request, printed at the offset that follows it.
    let all = format!("{}\tonetwothree\n", off(3));
    ds.expect(&["read", s], b"", 0, &all, "");
    ds.expect(&["read", s, "--from", "-1"], b"", 0, &all, "");
    ds.expect(
        &["read", s, "--from", &off(1)],
        b"",
        0,
        &format!("{}\ttwothree\n", off(3)),
        "",
    );
    ds.expect(&["read", s, "--from", "now"], b"", 0, "", "");
    ds.expect(&["read", s, "--from", &off(3)], b"", 0, "", "");
    ds.expect_failure(
        &["read", s, "--from", "bogus"],
        b"",
        "pico: BAD_REQUEST (400)",
    );

    // Missing streams.
    ds.expect(
        &["head", "/ds/missing"],
        b"",
        1,
        "",
        "pico: NOT_FOUND (404): no such stream\n",
    );
    ds.expect_failure(&["read", "/ds/missing"], b"", "pico: NOT_FOUND (404)");

    // Bodies that are not UTF-8 print their size (default type: octet-stream both ways).
    let bin = "/ds/bin";
    ds.expect(&["create", bin], b"", 0, "", "created=true\n");
    ds.expect(
        &["append", bin, "--batch", "1"],
        b"\xff\xfe\n",
        0,
        "",
        &format!("start={0} next={0}\n", off(1)),
    );
    ds.expect(
        &["read", bin],
        b"",
        0,
        &format!("{}\t2 bytes\n", off(1)),
        "",
    );
}

/// A stream longer than the server's catch-up budget takes several requests: `read` prints
/// one line per chunk, each at the offset after it, and together they hold every byte once.
#[test]
fn read_follows_chunks_to_the_tail() {
    let mut flags = FLAGS.to_vec();
    flags.extend(["--max-chunk-size", "8", "--catch-up-read-size", "8"]);
    let server = Server::start(&flags);
    let ds = Ds { server: &server };
    let s = "/ds/chunks";
    ds.expect(&["create", s], b"", 0, "", "created=true\n");
    let out = ds.run_with(&["append", s], b"aaaa\nbbbb\ncccc\ndddd\neeee\n");
    assert!(out.status.success(), "{out:?}");
    let out = ds.run(&["read", s]);
    let (code, stdout, stderr) = outcome(&out);
    assert_eq!((code, stderr.as_str()), (Some(0), ""), "{stdout}");
    let lines: Vec<(&str, &str)> = stdout
        .lines()
        .map(|l| l.split_once('\t').expect("position\tbody"))
        .collect();
    assert!(
        lines.len() >= 2,
        "one chunk for 20 bytes at 8 per chunk: {stdout}"
    );
    let bodies: String = lines.iter().map(|(_, body)| *body).collect();
    assert_eq!(bodies, "aaaabbbbccccddddeeee");
    let offsets: Vec<&str> = lines.iter().map(|(offset, _)| *offset).collect();
    assert!(offsets.windows(2).all(|w| w[0] < w[1]), "{offsets:?}");
    assert_eq!(offsets.last().copied(), Some(off(5).as_str()));
}

#[test]
fn json_streams_read_as_arrays() {
    let server = Server::start(FLAGS);
    let ds = Ds { server: &server };
    let s = "/ds/json";
    let json = ["--content-type", "application/json"];
    ds.expect(
        &["create", s, json[0], json[1]],
        b"",
        0,
        "",
        "created=true\n",
    );
    // A top-level array is flattened one level: `[2,3]` is two messages.
    ds.expect(
        &["append", s, json[0], json[1], "--batch", "1"],
        b"{\"a\":1}\n[2,3]\n",
        0,
        "",
        &format!("start={0} next={0}\nstart={1} next={1}\n", off(1), off(3)),
    );
    ds.expect_failure(
        &["append", s, json[0], json[1]],
        b"[]\n",
        "pico: BAD_REQUEST (400)",
    );
    ds.expect(
        &["read", s],
        b"",
        0,
        &format!("{}\t[{{\"a\":1}},2,3]\n", off(3)),
        "",
    );
    // At the tail the server answers `[]`: no message, nothing printed.
    ds.expect(&["read", s, "--from", &off(3)], b"", 0, "", "");
}

#[test]
fn ls_and_trim_are_pico_only() {
    let server = Server::start(FLAGS);
    let ds = Ds { server: &server };
    ds.expect(&["create", "/ds/a"], b"", 0, "", "created=true\n");
    ds.expect(
        &["ls"],
        b"",
        1,
        "",
        "pico: the Durable Streams protocol has no stream listing; use --protocol pico\n",
    );
    ds.expect(
        &["ls", "--prefix", "/ds/"],
        b"",
        1,
        "",
        "pico: the Durable Streams protocol has no stream listing; use --protocol pico\n",
    );
    ds.expect(
        &["trim", "/ds/a", "--seq", "1"],
        b"",
        1,
        "",
        "pico: trim is a Pico protocol operation; use --protocol pico\n",
    );
}

#[test]
fn close_and_delete() {
    let server = Server::start(FLAGS);
    let ds = Ds { server: &server };
    let s = "/ds/closing";
    ds.expect(&["create", s], b"", 0, "", "created=true\n");
    let out = ds.run_with(&["append", s], b"x\n");
    assert!(out.status.success(), "{out:?}");
    let closed = format!("closed next={}\n", off(1));
    ds.expect(&["close", s], b"", 0, "", &closed);
    // Idempotent.
    ds.expect(&["close", s], b"", 0, "", &closed);
    // Appending to a closed stream: 409 with Stream-Closed, shown with the final offset.
    let err = ds.expect_failure(&["append", s], b"y\n", "pico: STREAM_CLOSED (409)");
    assert!(err.ends_with(&format!(" [next={}]\n", off(1))), "{err}");
    ds.expect(
        &["head", s],
        b"",
        0,
        &format!(
            "start=-1 next={} closed=true type=application/octet-stream\n",
            off(1)
        ),
        "",
    );
    // Closed and at the tail: tail returns at once, with or without -f.
    ds.expect(&["tail", s], b"", 0, "", "");
    ds.expect(&["tail", "-f", s], b"", 0, "", "");
    // The data stays readable.
    ds.expect(&["read", s], b"", 0, &format!("{}\tx\n", off(1)), "");

    ds.expect(&["delete", s], b"", 0, "", "deleted=true\n");
    ds.expect(&["delete", s], b"", 0, "", "deleted=false\n");
    ds.expect(
        &["head", s],
        b"",
        1,
        "",
        "pico: NOT_FOUND (404): no such stream\n",
    );
    ds.expect_failure(&["close", s], b"", "pico: NOT_FOUND (404)");
}

/// `tail` starts at `now`: what was there before is not shown; `-f` prints each chunk as it
/// arrives and stops once the stream is closed.
#[test]
fn tail_starts_at_now_and_follows_until_closed() {
    let server = Server::start(FLAGS);
    let ds = Ds { server: &server };
    let s = "/ds/tail";
    ds.expect(
        &["create", s, "--content-type", "text/plain"],
        b"",
        0,
        "",
        "created=true\n",
    );
    let append = |line: &str| {
        let out = ds.run_with(
            &["append", s, "--content-type", "text/plain"],
            line.as_bytes(),
        );
        assert!(out.status.success(), "{out:?}");
    };
    append("old\n");
    // Without -f and nothing new: one long-poll that times out (1 s), nothing printed.
    ds.expect(&["tail", s], b"", 0, "", "");
    ds.expect_failure(&["tail", "/ds/missing"], b"", "pico: NOT_FOUND (404)");

    let mut tail = ds
        .command(&["tail", "-f", s])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn tail");
    let stdout = tail.stdout.take().expect("piped stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    // Append until tail shows something, so the test does not depend on how fast the process
    // starts; one message at a time, each waited for, so every chunk is one message.
    let mut lines = Vec::new();
    for attempt in 0..100 {
        append(&format!("r{attempt}\n"));
        if let Ok(line) = rx.recv_timeout(Duration::from_millis(300)) {
            lines.push(line);
            break;
        }
    }
    assert!(!lines.is_empty(), "tail -f printed nothing");
    append("last\n");
    let line = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("tail -f shows the next append");
    lines.push(line);
    let out = ds.run(&["close", s]);
    assert!(out.status.success(), "{out:?}");
    let next = String::from_utf8_lossy(&out.stderr)
        .trim()
        .strip_prefix("closed next=")
        .expect("closed next=")
        .to_owned();
    let status = tail.wait().expect("tail ends after close");
    assert!(status.success(), "{status:?}");
    lines.extend(rx.iter());
    assert!(lines.iter().all(|l| !l.contains("old")), "{lines:?}");
    let first = lines[0].split_once('\t').map(|(_, body)| body);
    assert!(first.is_some_and(|b| b.starts_with('r')), "{lines:?}");
    assert_eq!(lines.last(), Some(&format!("{next}\tlast")), "{lines:?}");
}

#[test]
fn bench_runs_over_durable_streams() {
    let server = Server::start(&["--protocol", "ds", "--cores", "1"]);
    let ds = Ds { server: &server };
    let base = ["bench", "-d", "1", "-w", "2", "-b", "64", "--interval", "0"];
    let out = ds.run(&base);
    let (code, stdout, stderr) = outcome(&out);
    assert_eq!((code, stdout.as_str()), (Some(0), ""), "{stderr}");
    assert!(
        stderr.starts_with("created 1 stream for ds bench\n"),
        "{stderr}"
    );
    let write = stderr
        .lines()
        .find_map(|l| l.strip_prefix("Write: "))
        .unwrap_or_else(|| panic!("no Write line: {stderr}"));
    let rate: f64 = write
        .split_once(" MiB/s")
        .and_then(|(mib, _)| mib.parse().ok())
        .unwrap_or_else(|| panic!("bad Write line: {write}"));
    assert!(rate > 0.0, "{write}");
    assert!(stderr.contains("\nRead: "), "{stderr}");

    // JSON arrays with --batch > 1: every request writes `batch` records of the given size.
    let mut json = base.to_vec();
    json.extend(["-n", "3", "--output", "json"]);
    let out = ds.run(&json);
    let (code, stdout, stderr) = outcome(&out);
    assert_eq!(code, Some(0), "{stderr}");
    let summary: serde_json::Value = serde_json::from_str(&stdout).expect("one JSON object");
    assert_eq!(summary["protocol"], "ds");
    assert_eq!(summary["batch"], 3);
    let records = summary["write"]["records"].as_u64().expect("write.records");
    assert!(records > 0, "{summary}");
    assert_eq!(records % 3, 0, "{summary}");
    assert_eq!(summary["write"]["bytes"].as_u64(), Some(records * 64));
    // The reader counts whole messages of the JSON chunks: never more than was written plus
    // what the two writers had in flight when the window closed.
    let read = summary["read"]["records"].as_u64().expect("read.records");
    assert!(read > 0 && read <= records + 3 * 2, "{summary}");

    let mut producer = base.to_vec();
    producer.push("--producer");
    let out = ds.run(&producer);
    assert_eq!(
        outcome(&out),
        (
            Some(1),
            String::new(),
            "pico: --producer is a Pico protocol feature; use --protocol pico\n".to_owned()
        )
    );
}
