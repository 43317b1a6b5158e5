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
