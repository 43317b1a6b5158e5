//! Graceful shutdown on SIGTERM: `/ready` fails during the drain window, in-flight appends
//! are acknowledged, live readers get a clean end, everything is uploaded, the exit code is 0,
//! and a restart finds every acknowledged record.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{read_all, Conn, Server};

/// An acknowledged append: stream, offset, body.
type Acked = (String, u64, Vec<u8>);

#[test]
fn sigterm_drains_finishes_requests_and_loses_nothing() {
    // A drain window long enough that the /ready poll below sees it on a busy machine too.
    let mut server = Server::start(&["--shutdown-drain-sec", "5", "--cores", "2"]);
    let streams: Vec<String> = (0..4).map(|i| format!("/drain/{i}")).collect();
    for name in &streams {
        server.put(name, "text/plain").expect(201);
    }
    let addr = server.addr;

    // A long-poll and an SSE reader parked at the tail of an idle stream.
    server.put("/drain/idle", "text/plain").expect(201);
    let long_poll = std::thread::spawn(move || {
        let mut conn = Conn::connect(addr).unwrap();
        conn.set_read_timeout(Duration::from_secs(30));
        conn.request("GET", "/drain/idle?seq=0&live=long-poll", &[], b"")
    });
    let sse = std::thread::spawn(move || {
        use std::io::{Read, Write};
        let mut socket = std::net::TcpStream::connect(addr).unwrap();
        socket
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        socket
            .write_all(b"GET /drain/idle?seq=0&live=sse HTTP/1.1\r\nhost: x\r\n\r\n")
            .unwrap();
        let mut all = Vec::new();
        socket.read_to_end(&mut all).map(|_| all)
    });

    // Writers keep appending until their connection is refused or closed; every 200 is kept.
    let acked: Arc<Mutex<Vec<Acked>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = streams
        .iter()
        .cloned()
        .map(|name| {
            let (acked, stop) = (acked.clone(), stop.clone());
            std::thread::spawn(move || {
                let started = Instant::now();
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) && started.elapsed() < Duration::from_secs(30) {
                    let Ok(mut conn) = Conn::connect(addr) else {
                        return;
                    };
                    loop {
                        let body = format!("{name}-{i}").into_bytes();
                        match conn.request("POST", &name, &[], &body) {
                            Ok(r) if r.status == 200 => {
                                let seq = r.h_u64("pico-start-seq");
                                acked.lock().unwrap().push((name.clone(), seq, body));
                                i += 1;
                            }
                            // 503 while stopping, or the connection closed: try a new one.
                            _ => break,
                        }
                        if stop.load(Ordering::Relaxed) {
                            return;
                        }
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
            })
        })
        .collect();
    let loaded = Instant::now();
    while acked.lock().unwrap().len() < 200 {
        assert!(
            loaded.elapsed() < Duration::from_secs(60),
            "the writers made too few appends: {}",
            acked.lock().unwrap().len()
        );
        std::thread::sleep(Duration::from_millis(5));
    }

    // SIGTERM from another thread; meanwhile /ready must fail during the drain window.
    let pid = server.pid().unwrap() as i32;
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut saw_not_ready = false;
    while Instant::now() < deadline {
        let ready =
            Conn::connect(server.admin).and_then(|mut c| c.request("GET", "/ready", &[], b""));
        match ready {
            Ok(r) if r.status == 503 => {
                saw_not_ready = true;
                break;
            }
            Ok(_) => std::thread::sleep(Duration::from_millis(10)),
            Err(_) => break,
        }
    }
    assert!(saw_not_ready, "/ready answered 503 during the drain window");
    let status = server.wait_exit(Duration::from_secs(40));
    stop.store(true, Ordering::Relaxed);
    assert!(
        status.success(),
        "exit status {status:?}; log:\n{}",
        server.log()
    );
    for writer in writers {
        writer.join().unwrap();
    }

    // The parked readers were answered, not cut off.
    let long_poll = long_poll
        .join()
        .unwrap()
        .expect("the long-poll got an answer");
    assert_eq!(long_poll.status, 204);
    let sse = sse
        .join()
        .unwrap()
        .expect("the SSE connection was closed, not reset");
    let sse = String::from_utf8_lossy(&sse);
    assert!(sse.starts_with("HTTP/1.1 200"), "{sse}");
    assert!(sse.contains("event: control"), "{sse}");
    assert!(
        sse.ends_with("0\r\n\r\n"),
        "the chunked body was terminated: {sse}"
    );
    let log = server.log();
    assert!(
        log.contains("stopped: 2 of 2 cores flushed everything"),
        "log:\n{log}"
    );

    // Nothing acknowledged is missing after a restart.
    server.restart();
    let acked = acked.lock().unwrap().clone();
    assert!(acked.len() >= 200);
    for name in &streams {
        let (records, _) = read_all(&server, name, 0);
        for (_, seq, body) in acked.iter().filter(|(n, _, _)| n == name) {
            let record = records
                .iter()
                .find(|r| r.seq == *seq)
                .unwrap_or_else(|| panic!("{name} lost acknowledged record {seq}"));
            assert_eq!(&record.body, body);
        }
    }
}

/// The stop signals reach the main thread only, which waits for them (`sigwait`): every other
/// thread of a node blocks them. A thread that did not (the memory-return thread, started
/// before the signals were blocked) took a SIGTERM that came while the main thread was busy
/// (reloading tokens on a SIGHUP) and the node died of it at once, without its shutdown: exit
/// by signal 15, in about one run of three of `cli_logging`.
#[test]
fn stop_signals_reach_only_the_main_thread() {
    let mut server = Server::start(&["--cores", "2"]);
    let pid = server.pid().expect("running");
    // The memory thread starts as the node begins serving and names itself once running:
    // wait (at most about 20 s) until it shows under its name.
    let mut threads = Vec::new();
    for _ in 0..200 {
        threads = threads_but_main(pid);
        if threads.iter().any(|(name, _)| name == "pico-memory") {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        threads.iter().any(|(name, _)| name == "pico-memory"),
        "the memory thread runs: {threads:?}"
    );
    // Bits of SIGHUP (1), SIGINT (2) and SIGTERM (15) in /proc's `SigBlk` mask.
    const STOP_SIGNALS_MASK: u64 = (1 << 0) | (1 << 1) | (1 << 14);
    for (name, blocked) in &threads {
        assert_eq!(
            blocked & STOP_SIGNALS_MASK,
            STOP_SIGNALS_MASK,
            "thread {name} does not block the stop signals (SigBlk {blocked:x})"
        );
    }
    assert!(server.terminate(Duration::from_secs(60)).success());
}

/// Every thread of process `pid` but its main one: name and blocked-signal mask.
fn threads_but_main(pid: u32) -> Vec<(String, u64)> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("threads");
    let mut threads = Vec::new();
    for task in tasks {
        let task = task.expect("thread");
        if task.file_name().to_string_lossy() == pid.to_string() {
            continue; // the main thread, waiting for them
        }
        let Ok(status) = std::fs::read_to_string(task.path().join("status")) else {
            continue; // ended meanwhile
        };
        let field = |name: &str| {
            status
                .lines()
                .find_map(|line| line.strip_prefix(name))
                .map(str::trim)
                .unwrap_or_default()
                .to_string()
        };
        let blocked = u64::from_str_radix(&field("SigBlk:"), 16).expect("SigBlk");
        threads.push((field("Name:"), blocked));
    }
    threads
}
