//! Named limits answer with explicit errors: `429 overloaded` with `Retry-After` when a core
//! holds more unacknowledged append bytes than `--max-in-flight-bytes`, and nothing that was
//! refused is written.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::Server;

#[test]
fn in_flight_bytes_limit_answers_429_with_retry_after() {
    // One core, a limit below two bodies: any append that arrives while another waits for its
    // fdatasync is refused.
    let server = Server::start(&["--cores", "1", "--max-in-flight-bytes", "1500"]);
    assert_eq!(
        server.put("/limits/s", "application/octet-stream").status,
        201
    );
    let accepted = Arc::new(AtomicUsize::new(0));
    let refused: Arc<std::sync::Mutex<Option<common::Resp>>> = Arc::default();
    let deadline = Instant::now() + Duration::from_secs(20);
    std::thread::scope(|scope| {
        for _ in 0..8 {
            let (accepted, refused, server) = (accepted.clone(), refused.clone(), &server);
            scope.spawn(move || {
                let mut conn = server.connect();
                while Instant::now() < deadline && refused.lock().unwrap().is_none() {
                    let response = conn
                        .request("POST", "/limits/s", &[], &[b'x'; 1000])
                        .unwrap();
                    match response.status {
                        200 => {
                            accepted.fetch_add(1, Ordering::Relaxed);
                        }
                        429 => *refused.lock().unwrap() = Some(response),
                        other => panic!("unexpected status {other}"),
                    }
                }
            });
        }
    });
    let refused = refused
        .lock()
        .unwrap()
        .take()
        .expect("no append was refused within 20 s");
    assert_eq!(refused.header("retry-after"), Some("1"));
    assert_eq!(refused.header("content-type"), Some("application/json"));
    let body: serde_json::Value = serde_json::from_slice(&refused.body).unwrap();
    assert_eq!(body["error"], "overloaded");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("in-flight bytes"),
        "{body}"
    );
    // Every accepted append, and only those, is in the stream.
    let head = server.head("/limits/s");
    let next: usize = head.header("pico-next-seq").unwrap().parse().unwrap();
    assert_eq!(next, accepted.load(Ordering::Relaxed));
}

/// io_uring's registered buffers are pinned from the start: resident whether used or not, and
/// charged to the locked-memory limit once per ring (three rings a core). A node keeps them at
/// glommio's minimum, since the WAL's DMA buffers (256 KiB steps and up) never came from them.
#[test]
fn an_idle_node_pins_little_memory() {
    const CORES: u64 = 2;
    /// 3 rings × 64 KiB a core, with room to spare; 1 MiB a core pinned 3 MiB.
    const PINNED_PER_CORE_MAX_BYTES: u64 = 256 << 10;
    let server = Server::start(&["--cores", &CORES.to_string()]);
    assert_eq!(
        server
            .put("/limits/idle", "application/octet-stream")
            .status,
        201
    );
    let appended = server.post("/limits/idle", &[b'x'; 4096]);
    assert_eq!(appended.status, 200);
    let pid = server.pid().expect("the server runs");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let pinned_kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmPin:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .expect("VmPin in /proc/PID/status");
    assert!(
        pinned_kib * 1024 <= CORES * PINNED_PER_CORE_MAX_BYTES,
        "{pinned_kib} KiB pinned by an idle node of {CORES} cores"
    );
}

/// A client's connections never take the descriptors the node needs for its own files: the
/// node raises its soft open-file limit to the hard one and takes only the connections that
/// limit leaves room for, and a connection past them gets `503` at once. Before, a flood past
/// the limit left every later connection waiting unanswered in the backlog, and the node
/// itself out of descriptors for its WAL and segment files.
#[test]
fn connections_past_the_open_file_limit_are_refused_and_the_node_keeps_its_files() {
    use std::io::Read;
    use std::net::TcpStream;
    const OPEN_FILES: u64 = 512;
    // One core: 512 less 256 kept back less the admin listener's 64.
    const TAKEN: usize = 192;
    const FLOOD: usize = 600;
    let server = Server::start_with_env(
        &["--cores", "1", "--segment-size", "64KiB"],
        &[(common::OPEN_FILES_LIMIT, &OPEN_FILES.to_string())],
    );
    assert!(
        server.log().contains(&format!(
            "open files: {OPEN_FILES}; connections: up to {TAKEN} a core"
        )),
        "{}",
        server.log()
    );
    assert_eq!(server.put("/fds/s", "application/octet-stream").status, 201);
    let mut writer = server.connect();
    assert_eq!(
        writer.request("POST", "/fds/s", &[], b"0").unwrap().status,
        200
    );

    // Connections that send nothing: the node takes what its limit leaves and refuses the rest.
    let flood: Vec<TcpStream> = (0..FLOOD)
        .map(|_| TcpStream::connect(server.addr).expect("connect"))
        .collect();
    let mut answered = vec![false; FLOOD];
    let mut refused = 0;
    let deadline = Instant::now() + Duration::from_secs(30);
    while refused < FLOOD - TAKEN && Instant::now() < deadline {
        for (socket, done) in flood.iter().zip(answered.iter_mut()).filter(|(_, d)| !**d) {
            socket.set_nonblocking(true).unwrap();
            let mut buf = [0u8; 512];
            match (&*socket).read(&mut buf) {
                Ok(n) if n > 0 => {
                    let text = String::from_utf8_lossy(&buf[..n]);
                    assert!(text.starts_with("HTTP/1.1 503"), "{text}");
                    assert!(text.contains("too many connections"), "{text}");
                    *done = true;
                    refused += 1;
                }
                _ => {}
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // The writer's connection and the create's (if not closed yet) count too.
    assert!(
        (FLOOD - TAKEN..=FLOOD - TAKEN + 2).contains(&refused),
        "{refused} of {FLOOD} connections refused; the node takes {TAKEN}"
    );

    // Meanwhile the node seals segments (64 KiB each) and stores them as files.
    for i in 1..=400 {
        let body = format!("{i:04096}");
        let status = writer
            .request("POST", "/fds/s", &[], body.as_bytes())
            .unwrap()
            .status;
        assert_eq!(status, 200, "append {i}: {}", server.log());
    }
    drop(flood);
    let next: u64 = server.head("/fds/s").h_u64("pico-next-seq");
    assert_eq!(next, 401);
    let stored_deadline = Instant::now() + Duration::from_secs(30);
    let segments = || {
        std::fs::read_dir(common::segments_dir(server.dir()))
            .map(|dir| dir.count())
            .unwrap_or(0)
    };
    while segments() < 10 && Instant::now() < stored_deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(segments() >= 10, "{} segments stored", segments());
    assert!(
        !server.log().contains("os error 24"),
        "the node ran out of descriptors:\n{}",
        server.log()
    );
}
