//! `--durability object`: an append is acknowledged only once the segment holding it is in the
//! bucket, so losing the node's disk (its WAL directory) loses nothing acknowledged. Runs on a
//! `file://` bucket always, and on Garage (`s3://`, real SigV4) when `PICOMQ_S3_ENDPOINT` is set
//! (that test is `#[ignore]`d: `--include-ignored` runs it, and under `CI=true` it fails without
//! Garage).

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::Server;

/// Acknowledged appends a round makes before its kill: counted, so that a busy machine's
/// slower appends do not leave a round with nothing to check.
const ACKED_BEFORE_KILL: usize = 10;

/// Appends from a few connections, SIGKILLs the server `kill_after` after they had
/// [`ACKED_BEFORE_KILL`] appends acknowledged (while they are busy), and returns every
/// acknowledged (offset, body).
fn load(server: &Server, stream: &str, kill_after: Duration) -> Vec<(u64, Vec<u8>)> {
    // Bounds a server that stops acknowledging; the kill ends the load long before.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut acked = Vec::new();
    let pid = server.pid().expect("the server runs");
    let count = AtomicUsize::new(0);
    let count = &count;
    std::thread::scope(|scope| {
        scope.spawn(move || {
            while count.load(Ordering::Relaxed) < ACKED_BEFORE_KILL && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            std::thread::sleep(kill_after);
            // SAFETY: kill(2) on the pid of a child process this test started.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        });
        let writers: Vec<_> = (0..4)
            .map(|w| {
                scope.spawn(move || {
                    let mut conn = server.connect();
                    let mut mine = Vec::new();
                    let mut i = 0u64;
                    while Instant::now() < deadline {
                        let body =
                            format!("w{w}-{i}-{}", "y".repeat((i % 50) as usize)).into_bytes();
                        let Ok(response) = conn.request("POST", stream, &[], &body) else {
                            break;
                        };
                        assert_eq!(response.status, 200, "{}", response.describe());
                        mine.push((response.h_u64("pico-start-seq"), body));
                        count.fetch_add(1, Ordering::Relaxed);
                        i += 1;
                    }
                    mine
                })
            })
            .collect();
        for writer in writers {
            acked.extend(writer.join().unwrap());
        }
    });
    acked
}

fn check_all_present(server: &Server, stream: &str, acked: &[(u64, Vec<u8>)]) {
    let (records, _) = common::read_all(server, stream, 0);
    let by_offset: std::collections::HashMap<u64, &Vec<u8>> =
        records.iter().map(|r| (r.seq, &r.body)).collect();
    for (offset, body) in acked {
        assert_eq!(
            by_offset.get(offset),
            Some(&body),
            "acknowledged record {offset} lost or changed"
        );
    }
}

fn crash_and_lose_the_disk(extra: &[&str]) {
    let mut flags = vec!["--durability", "object", "--object-puts-per-second", "100"];
    flags.extend_from_slice(extra);
    let mut server = Server::start(&flags);
    let stream = format!("/object/{}", std::process::id());
    assert_eq!(server.put(&stream, "text/plain").status, 201);
    let mut acked = Vec::new();
    for round in 0..3u64 {
        // The kill lands at a different point of the load each round, mid-append.
        let kill_after = Duration::from_millis(round * 37 + u64::from(std::process::id() % 97));
        let round_acked = load(&server, &stream, kill_after);
        assert!(
            round_acked.len() >= ACKED_BEFORE_KILL,
            "round {round}: {} appends acknowledged before the kill",
            round_acked.len()
        );
        acked.extend(round_acked);
        // No local WAL in object mode: the bucket is the only copy, and that is the point.
        let wal_files: Vec<_> = std::fs::read_dir(server.wal_dir())
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .filter(|e| e.file_name() != "LOCK")
                    .collect()
            })
            .unwrap_or_default();
        assert!(
            wal_files.is_empty(),
            "round {round}: object durability wrote WAL files"
        );
        server.kill();
        server.remove_wal_dir();
        server.restart();
        check_all_present(&server, &stream, &acked);
    }
    assert!(
        acked.len() > 20,
        "the load made too few appends: {}",
        acked.len()
    );
    let head = server.head(&stream);
    assert!(head.h_u64("pico-next-seq") >= acked.len() as u64);
}

#[test]
fn object_durability_on_a_file_bucket_survives_losing_the_wal() {
    crash_and_lose_the_disk(&[]);
}

#[ignore = "needs Garage: PICOMQ_S3_ENDPOINT, AWS_* (scripts/garage-up.sh)"]
#[test]
fn object_durability_on_garage_survives_losing_the_wal() {
    let Some(endpoint) =
        pico_testkit::require("object_durability_on_garage", &pico_testkit::GARAGE)
            .map(|mut values| values.remove(0))
    else {
        return;
    };
    let storage = common::services::storage(&endpoint);
    crash_and_lose_the_disk(&["--storage", &storage]);
}
