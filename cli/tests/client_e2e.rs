//! The `pico` client commands and the `pico-client` library against a real `pico serve`:
//! exact stdout/stderr split, outputs and exit codes (README.md, "Use it"), `PICO_*` variables
//! and flag values that start with `-`.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use bytes::Bytes;
use common::cli::{check_outcome, pico_without_pico_env, run_with_stdin};
use common::Server;
use pico_client::{Client, ClientConfig, ErrorKind};

/// One core and a short long-poll keep `tail` quick and the shared machine calm.
const FLAGS: &[&str] = &["--cores", "1", "--long-poll-timeout-sec", "1"];

/// `pico` with the server's endpoint in `PICO_ENDPOINT` (so every call reads a flag from the
/// environment)
/// and no other `PICO_*` variable from the test environment.
fn pico(server: &Server, args: &[&str]) -> Command {
    let mut command = pico_without_pico_env();
    command
        .env("PICO_ENDPOINT", format!("http://{}", server.addr))
        // No profile file may leak in from the machine.
        .env("PICO_CONFIG", server.dir().join("no-such-config.toml"))
        .args(args);
    command
}

fn run(server: &Server, args: &[&str], stdin: &[u8]) -> Output {
    run_with_stdin(&mut pico(server, args), stdin)
}

/// Runs and checks exit code, stdout and stderr exactly.
#[track_caller]
fn expect(server: &Server, args: &[&str], stdin: &[u8], code: i32, stdout: &str, stderr: &str) {
    let out = run(server, args, stdin);
    check_outcome(&out, &format!("pico {args:?}"), code, stdout, stderr);
}

#[test]
fn the_readme_sequence() {
    let server = Server::start(FLAGS);
    let s = "/streams/orders";
    expect(
        &server,
        &["create", s, "--content-type", "text/plain"],
        b"",
        0,
        "",
        "created=true\n",
    );
    expect(
        &server,
        &["create", s, "--content-type", "text/plain"],
        b"",
        0,
        "",
        "created=false\n",
    );

    let input: String = (1..=1000).map(|i| format!("{i}\n")).collect();
    let acks: String = (0..10)
        .map(|b| format!("start={} next={}\n", b * 100, b * 100 + 100))
        .collect();
    expect(
        &server,
        &["append", s, "--batch", "100"],
        input.as_bytes(),
        0,
        "",
        &acks,
    );

    let records: String = (0..1000).map(|i| format!("{i}\t{}\n", i + 1)).collect();
    expect(&server, &["read", s], b"", 0, &records, "");
    expect(
        &server,
        &["read", s, "--from", "998"],
        b"",
        0,
        "998\t999\n999\t1000\n",
        "",
    );
    expect(
        &server,
        &["head", s],
        b"",
        0,
        "start=0 next=1000 closed=false type=text/plain\n",
        "",
    );

    // Line ends are stripped (`\r\n` too); bodies that are not UTF-8 print their size.
    expect(
        &server,
        &["append", s, "--batch", "2"],
        b"a\r\n\xff\n",
        0,
        "",
        "start=1000 next=1002\n",
    );
    expect(
        &server,
        &["read", s, "--from", "1000"],
        b"",
        0,
        "1000\ta\n1001\t1 bytes\n",
        "",
    );
    expect(&server, &["close", s], b"", 0, "", "closed next=1002\n");

    // Closed: appends fail with the server's error text.
    expect(
        &server,
        &["append", s],
        b"x\n",
        1,
        "",
        "pico: closed (409): stream is closed [next=1002]\n",
    );
    expect(
        &server,
        &["head", s],
        b"",
        0,
        "start=0 next=1002 closed=true type=text/plain\n",
        "",
    );

    expect(&server, &["delete", s], b"", 0, "", "deleted=true\n");
    expect(&server, &["delete", s], b"", 0, "", "deleted=false\n");
    expect(
        &server,
        &["head", s],
        b"",
        1,
        "",
        "pico: not_found (404): no such stream\n",
    );
    expect(
        &server,
        &["read", s],
        b"",
        1,
        "",
        "pico: not_found (404): no such stream\n",
    );
}

/// `tail -f` prints what is appended after it started and stops once the stream is closed.
#[test]
fn tail_follows_until_the_stream_is_closed() {
    let server = Server::start(FLAGS);
    let s = "/streams/tail";
    expect(&server, &["create", s], b"", 0, "", "created=true\n");
    let mut tail = pico(&server, &["tail", "-f", s])
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
    // tail starts at the tail it sees: append until it shows something, so the test does
    // not depend on how fast the process starts.
    let mut lines = Vec::new();
    for attempt in 0..100 {
        let out = run(&server, &["append", s], format!("r{attempt}\n").as_bytes());
        assert!(out.status.success(), "{out:?}");
        if let Ok(line) = rx.recv_timeout(Duration::from_millis(300)) {
            lines.push(line);
            break;
        }
    }
    assert!(!lines.is_empty(), "tail -f printed nothing");
    let out = run(&server, &["append", s, "--batch", "2"], b"x\ny\n");
    let ack = String::from_utf8_lossy(&out.stderr).into_owned();
    let next: u64 = ack.trim().rsplit("next=").next().unwrap().parse().unwrap();
    expect(
        &server,
        &["close", s],
        b"",
        0,
        "",
        &format!("closed next={next}\n"),
    );
    let status = tail.wait().expect("tail ends after close");
    assert!(status.success(), "{status:?}");
    lines.extend(rx.iter());
    let tail_end = [format!("{}\tx", next - 2), format!("{}\ty", next - 1)];
    assert_eq!(lines[lines.len() - 2..], tail_end, "{lines:?}");
    let seqs: Vec<u64> = lines
        .iter()
        .map(|l| l.split('\t').next().unwrap().parse().unwrap())
        .collect();
    assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "{lines:?}");
    // Closed: tail without -f returns at once.
    expect(&server, &["tail", s], b"", 0, "", "");
}

#[test]
fn flags_environment_and_usage_errors() {
    let server = Server::start(FLAGS);
    // A global flag after the subcommand beats the environment (which points nowhere).
    let endpoint = format!("http://{}", server.addr);
    let out = pico(&server, &["create", "/g", "--endpoint", &endpoint])
        .env("PICO_ENDPOINT", "http://127.0.0.1:1")
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stderr), "created=true\n");

    // Subcommand flags come from the environment too.
    let out = pico(&server, &["append", "/g"])
        .env("PICO_BATCH", "3")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success());
    let mut child = pico(&server, &["append", "/g"])
        .env("PICO_BATCH", "3")
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"1\n2\n3\n4\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "start=0 next=3\nstart=3 next=4\n"
    );

    // Usage errors: exit 2.
    for args in [
        &["append", "/g", "--batch", "0"][..],
        &["head"],
        &["nope"],
        &["read", "/g", "--bogus"],
    ] {
        let out = run(&server, args, b"");
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).starts_with("pico: "),
            "{out:?}"
        );
    }
    // Unreachable server: exit 1 with the cause.
    let out = pico(&server, &["head", "/g"])
        .env("PICO_ENDPOINT", "http://127.0.0.1:1")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.starts_with("pico: cannot reach http://127.0.0.1:1: transport error: ")
            && stderr.contains("refused")
            && stderr.contains("is `pico serve` running at http://127.0.0.1:1?")
            && stderr.ends_with("[endpoint from --endpoint (or PICO_ENDPOINT)]\n"),
        "{stderr}"
    );
}

#[test]
fn library_against_the_server() {
    let server = Server::start(FLAGS);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let client = Client::new(ClientConfig::new(format!("http://{}", server.addr))).unwrap();
        let s = "/lib/a";
        assert!(client
            .create(s, Some("text/plain"), Some(60))
            .await
            .unwrap());
        let info = client.head(s).await.unwrap().expect("exists");
        assert_eq!(
            (info.start.seq(), info.next.seq(), info.closed),
            (Some(0), Some(0), false)
        );
        assert_eq!(info.content_type.as_deref(), Some("text/plain"));
        assert_eq!(info.ttl_secs, Some(60));

        let ack = client
            .append_binary_batch(s, &[Bytes::from("a"), Bytes::from("b")])
            .await
            .unwrap();
        assert_eq!((ack.start.seq(), ack.next.seq()), (Some(0), Some(2)));
        let single = client
            .append_single(s, Bytes::from("c"), None)
            .await
            .unwrap();
        assert_eq!((single.start.seq(), single.next.seq()), (Some(2), Some(3)));
        assert!(
            single.timestamp > ack.timestamp,
            "timestamps strictly increase"
        );
        let headers = vec![("k".to_owned(), "v".to_owned())];
        let record = pico_client::NewRecord {
            headers: headers.clone(),
            body: Bytes::from("d"),
        };
        assert_eq!(client.append_records(s, &[record]).await.unwrap().next, 4);

        let page = client.read(s, 0).await.unwrap();
        let bodies: Vec<&[u8]> = page.records.iter().map(|r| &r.body[..]).collect();
        assert_eq!(bodies, [&b"a"[..], b"b", b"c", b"d"]);
        assert_eq!(page.records[3].headers, headers);
        assert_eq!(
            page.records.iter().map(|r| r.seq).collect::<Vec<_>>(),
            [0, 1, 2, 3]
        );
        assert!(page.up_to_date && !page.closed);
        assert_eq!(page.next, 4);

        // Long-poll at the tail: times out empty (204), then is woken by an append.
        let idle = client.read_long_poll(s, 4, None).await.unwrap();
        assert!(idle.records.is_empty() && idle.up_to_date);
        assert_eq!(idle.next, 4);
        let poll = client.read_long_poll(s, 4, idle.cursor.as_deref());
        let append = async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            client
                .append_binary_batch(s, &[Bytes::from("e")])
                .await
                .unwrap()
        };
        let (mut woken, _) = tokio::join!(poll, append);
        // A busy machine may land the append after the poll's 1 s timeout: the poll then
        // answered empty, and the next one finds the record. Either way the record comes.
        for _ in 0..60 {
            match &woken {
                Ok(page) if page.records.is_empty() => {
                    assert!(page.up_to_date && page.next == 4, "{page:?}");
                    woken = client.read_long_poll(s, 4, page.cursor.as_deref()).await;
                }
                _ => break,
            }
        }
        let woken = woken.unwrap();
        assert_eq!(woken.records.len(), 1);
        assert_eq!(woken.records[0].seq, 4);

        assert_eq!(client.close(s).await.unwrap(), 5);
        let err = client
            .append_binary_batch(s, &[Bytes::from("x")])
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Closed);
        let end = client.read(s, 5).await.unwrap();
        assert!(end.closed && end.up_to_date && end.records.is_empty());

        let err = client.read(s, 99).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::BadRequest);
        assert!(client.delete(s).await.unwrap());
        assert_eq!(client.head(s).await.unwrap(), None);
        let err = client
            .append_binary_batch(s, &[Bytes::from("x")])
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NotFound);
        assert!(!client.delete(s).await.unwrap());
    });
}
