//! A whole node on a real S3 server (Garage, real SigV4): the store going away under load and
//! coming back, a wrong secret at startup, cold reads of many segments through a small block
//! cache, and garbage collection of segment objects in the bucket.
//!
//! Need Garage: `PICOMQ_S3_ENDPOINT` (and `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY`), as set
//! by `.ci/run`. They are `#[ignore]`d, run with `--include-ignored`, and skip with a note when
//! the variables are unset, or fail under `CI=true` (`pico_testkit`). Tests that stop the store
//! run a Garage of their own on free ports (`scripts/garage-up.sh`, needs `garage` on PATH), so
//! the tests stay parallel-safe and never disturb the shared instance.

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::services::{access_key, region, secret_key, storage};
use common::{Conn, Server, XorShift};
use pico_testkit::garage::{bucket, OwnGarage};

/// How soon after the store is back a node must acknowledge again: its retries back off for
/// a few seconds at most; the rest is room for a busy machine.
const RECOVERY_BOUND: Duration = Duration::from_secs(60);

/// The shared Garage's endpoint, or `None` (and a note) when the tests should skip.
fn shared_endpoint(test: &str) -> Option<String> {
    pico_testkit::require(test, &pico_testkit::GARAGE).map(|mut values| values.remove(0))
}

/// Does this curl sign requests with SigV4 (`--aws-sigv4`, curl 7.75 and later)?
fn curl_has_sigv4() -> bool {
    let Ok(output) = Command::new("curl").arg("--version").output() else {
        return false;
    };
    let text = String::from_utf8_lossy(&output.stdout);
    let version: Vec<u32> = text
        .split_whitespace()
        .nth(1)
        .unwrap_or_default()
        .split('.')
        .filter_map(|part| part.parse().ok())
        .collect();
    version.len() >= 2 && (version[0], version[1]) >= (7, 75)
}

/// The `segments/` keys in the bucket at `endpoint`, listed through Garage's S3 API with curl.
fn segment_keys(endpoint: &str) -> Vec<String> {
    let url = format!("{endpoint}/{}?list-type=2&prefix=segments%2F", bucket());
    let output = Command::new("curl")
        .args(["-sS", "-m", "10", "--aws-sigv4"])
        .arg(format!("aws:amz:{}:s3", region()))
        .arg("--user")
        .arg(format!("{}:{}", access_key(), secret_key()))
        .args(["-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD"])
        .arg(&url)
        .output()
        .expect("run curl");
    let body = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success() && body.contains("<ListBucketResult"),
        "listing {url} failed: {body}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        body.contains("<IsTruncated>false</IsTruncated>"),
        "listing is truncated (more than 1000 keys): {url}"
    );
    let mut keys: Vec<String> = body
        .split("<Key>")
        .skip(1)
        .filter_map(|rest| rest.split_once("</Key>").map(|(key, _)| key.to_string()))
        .collect();
    keys.sort();
    keys
}

/// Bytes of well-formed frames in the node's WAL files: 0 once everything written is in the
/// bucket (uploaded WAL files are removed; a fresh active one holds no frames yet).
fn wal_frame_bytes(server: &Server) -> usize {
    std::fs::read_dir(server.wal_dir())
        .map(|entries| {
            entries
                .filter_map(|e| e.ok())
                .filter(|e| e.path().extension().is_some_and(|ext| ext == "wal"))
                .map(|e| common::frames_prefix_len(&std::fs::read(e.path()).unwrap_or_default()))
                .sum()
        })
        .unwrap_or(0)
}

/// Acknowledged (offset, body) pairs by stream name.
type Acked = BTreeMap<String, Vec<(u64, Vec<u8>)>>;

/// Every acknowledged (offset, body) of each stream is in the stream, intact, at its offset.
fn check_acked(server: &Server, acked: &Acked, context: &str) {
    for (stream, records) in acked {
        let (read, next) = common::read_all(server, stream, 0);
        let by_offset: HashMap<u64, &Vec<u8>> = read.iter().map(|r| (r.seq, &r.body)).collect();
        let mut seen = HashSet::new();
        for (offset, body) in records {
            assert!(
                seen.insert(*offset),
                "{context}: {stream}: offset {offset} acknowledged twice"
            );
            match by_offset.get(offset) {
                Some(got) if *got == body => {}
                Some(got) => panic!(
                    "{context}: {stream}: record {offset} changed ({} bytes, want {})",
                    got.len(),
                    body.len()
                ),
                None => panic!(
                    "{context}: {stream}: acknowledged record {offset} lost (stream has {} records, next {next})\n{}",
                    read.len(),
                    server.log()
                ),
            }
        }
    }
}

/// A body that names its writer and sequence, padded with bytes from `rng`.
fn body(writer: usize, i: u64, len: usize, rng: &mut XorShift) -> Vec<u8> {
    let mut body = format!("w{writer}-{i}-").into_bytes();
    while body.len() < len {
        body.extend_from_slice(&rng.next_u64().to_le_bytes());
    }
    body.truncate(len.max(8));
    body
}

/// One append as the writers saw it.
struct Event {
    sent: Instant,
    done: Instant,
    /// `None`: the connection failed (error text in `error`).
    status: Option<u16>,
    retry_after: Option<String>,
    error: String,
}

/// The store is killed for ~3 s under load and restarted: appends back-pressure (wait, or
/// 429/503 with Retry-After) and are never acknowledged while the store is down, the node
/// recovers by itself, and every acknowledged record survives, also a cold start with the
/// node's disk lost.
#[ignore = "needs Garage: PICOMQ_S3_ENDPOINT, AWS_* (scripts/garage-up.sh)"]
#[test]
fn a_garage_outage_under_load_back_pressures_and_loses_nothing() {
    if shared_endpoint("garage_outage").is_none() {
        return;
    }
    let Some(garage) = OwnGarage::start("garage_outage") else {
        return;
    };
    let storage = storage(&garage.endpoint());
    let mut server = Server::start(&[
        "--storage",
        &storage,
        "--durability",
        "object",
        "--object-flush-ms",
        "20",
        "--max-unuploaded-bytes",
        "1MiB",
    ]);
    let streams: Vec<String> = (0..4).map(|i| format!("/outage/s{i}")).collect();
    for stream in &streams {
        server.put(stream, "application/octet-stream").expect(201);
    }

    let seed = XorShift::seed_from_time();
    eprintln!("garage_outage: seed {seed}");
    let stop = AtomicBool::new(false);
    let up_started: Mutex<Option<Instant>> = Mutex::new(None);
    let recovered: Mutex<Option<(Instant, Instant)>> = Mutex::new(None);
    let events: Mutex<Vec<Event>> = Mutex::new(Vec::new());
    let acked: Mutex<Acked> = Mutex::new(BTreeMap::new());
    let burst: Mutex<Vec<(Option<u16>, Duration)>> = Mutex::new(Vec::new());
    let addr = server.addr;
    let hard_deadline = Instant::now() + Duration::from_secs(45);

    let (down_at, up_at) = std::thread::scope(|scope| {
        for w in 0..8usize {
            let (stop, up_started, recovered, events, acked) =
                (&stop, &up_started, &recovered, &events, &acked);
            let stream = streams[w % streams.len()].clone();
            scope.spawn(move || {
                let mut rng = XorShift::new(seed ^ (w as u64 + 1).wrapping_mul(0x9E37_79B9));
                // Writers 0..6 send small bodies back to back; 6..8 send ~200 KiB, paced.
                let big = w >= 6;
                let mut conn: Option<Conn> = None;
                let mut mine = Vec::new();
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) && Instant::now() < hard_deadline {
                    let c = match conn.as_mut() {
                        Some(c) => c,
                        None => match Conn::connect(addr) {
                            Ok(mut c) => {
                                // Longer than any outage of this test: an append may wait.
                                c.set_read_timeout(Duration::from_secs(40));
                                conn.insert(c)
                            }
                            Err(e) => {
                                let now = Instant::now();
                                events.lock().unwrap().push(Event {
                                    sent: now,
                                    done: now,
                                    status: None,
                                    retry_after: None,
                                    error: format!("connect: {e}"),
                                });
                                std::thread::sleep(Duration::from_millis(100));
                                continue;
                            }
                        },
                    };
                    let len = if big {
                        rng.range(128 << 10, 256 << 10)
                    } else {
                        rng.range(16, 2048)
                    } as usize;
                    let data = body(w, i, len, &mut rng);
                    i += 1;
                    let sent = Instant::now();
                    let result = c.request("POST", &stream, &[], &data);
                    let done = Instant::now();
                    let mut pause = Duration::ZERO;
                    let event = match result {
                        Ok(response) => {
                            if response.status == 200 {
                                mine.push((response.h_u64("pico-start-seq"), data));
                                let after_up =
                                    up_started.lock().unwrap().is_some_and(|u| sent >= u);
                                if after_up {
                                    recovered.lock().unwrap().get_or_insert((sent, done));
                                }
                                if big {
                                    pause = Duration::from_millis(250);
                                }
                            } else if let Some(secs) = response
                                .header("retry-after")
                                .and_then(|s| s.trim().parse::<u64>().ok())
                            {
                                // Honour Retry-After, bounded so the test stays short.
                                pause = Duration::from_secs(secs).min(Duration::from_secs(1));
                            } else {
                                pause = Duration::from_millis(100);
                            }
                            Event {
                                sent,
                                done,
                                status: Some(response.status),
                                retry_after: response.header("retry-after").map(str::to_string),
                                error: if response.status == 200 {
                                    String::new()
                                } else {
                                    response.describe()
                                },
                            }
                        }
                        Err(e) => {
                            conn = None;
                            pause = Duration::from_millis(100);
                            Event {
                                sent,
                                done,
                                status: None,
                                retry_after: None,
                                error: e.to_string(),
                            }
                        }
                    };
                    events.lock().unwrap().push(event);
                    std::thread::sleep(pause);
                }
                acked
                    .lock()
                    .unwrap()
                    .entry(stream)
                    .or_default()
                    .extend(mine);
            });
        }

        // Load with the store up, then the outage.
        std::thread::sleep(Duration::from_millis(1500));
        garage.kill();
        let down_at = Instant::now();
        // A burst mid-outage: 24 connections append 128 KiB each, 25 ms apart (so the
        // 20 ms seals count them), 3 MiB over two cores; past 1 MiB a core must answer 429.
        std::thread::sleep(Duration::from_millis(500));
        for b in 0..24usize {
            let (events, acked, burst) = (&events, &acked, &burst);
            let stream = streams[b % streams.len()].clone();
            let mut rng = XorShift::new(seed ^ (b as u64 + 100).wrapping_mul(0x9E37_79B9));
            let data = body(100 + b, 0, 128 << 10, &mut rng);
            scope.spawn(move || {
                let sent = Instant::now();
                let result = Conn::connect(addr).and_then(|mut c| {
                    c.set_read_timeout(Duration::from_secs(40));
                    c.request("POST", &stream, &[], &data)
                });
                let done = Instant::now();
                let event = match result {
                    Ok(response) => {
                        if response.status == 200 {
                            let offset = response.h_u64("pico-start-seq");
                            acked
                                .lock()
                                .unwrap()
                                .entry(stream)
                                .or_default()
                                .push((offset, data));
                        }
                        Event {
                            sent,
                            done,
                            status: Some(response.status),
                            retry_after: response.header("retry-after").map(str::to_string),
                            error: response.describe(),
                        }
                    }
                    Err(e) => Event {
                        sent,
                        done,
                        status: None,
                        retry_after: None,
                        error: e.to_string(),
                    },
                };
                burst.lock().unwrap().push((event.status, done - sent));
                events.lock().unwrap().push(event);
            });
            std::thread::sleep(Duration::from_millis(25));
        }
        std::thread::sleep(
            (down_at + Duration::from_secs(3)).saturating_duration_since(Instant::now()),
        );
        let up_at = Instant::now();
        *up_started.lock().unwrap() = Some(up_at);
        garage.up();
        // The node recovers by itself: an append sent after the store is back is acknowledged.
        let deadline = up_at + RECOVERY_BOUND;
        while recovered.lock().unwrap().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(700));
        stop.store(true, Ordering::Relaxed);
        (down_at, up_at)
    });

    let events = events.into_inner().unwrap();
    let acked = acked.into_inner().unwrap();
    let recovered = recovered.into_inner().unwrap();
    let burst = burst.into_inner().unwrap();

    // What the writers saw, for the record.
    let ms = |d: Duration| d.as_millis();
    // Statuses by phase: answered before the outage, overlapping it, after it.
    let mut phases: [BTreeMap<String, usize>; 3] = Default::default();
    let mut longest_wait = Duration::ZERO;
    for event in &events {
        let phase = if event.done < down_at {
            0
        } else if event.sent < up_at {
            1
        } else {
            2
        };
        let key = event
            .status
            .map_or_else(|| "error".to_string(), |s| s.to_string());
        *phases[phase].entry(key).or_default() += 1;
        if phase == 1 && event.status == Some(200) {
            longest_wait = longest_wait.max(event.done - event.sent);
        }
    }
    let retry_afters: HashSet<&str> = events
        .iter()
        .filter_map(|e| e.retry_after.as_deref())
        .collect();
    let total_acked: usize = acked.values().map(Vec::len).sum();
    let total_bytes: usize = acked
        .values()
        .flat_map(|records| records.iter().map(|(_, body)| body.len()))
        .sum();
    eprintln!(
        "garage_outage: {} appends, {total_acked} acknowledged ({} KiB); store down {} ms; \
         statuses before the outage {:?}, overlapping it {:?}, after it {:?}; longest wait \
         of an append acknowledged across it {} ms; Retry-After values seen {retry_afters:?}; \
         first append sent after \
         the restart acknowledged {:?} ms after the restart began (answer after {:?} ms)",
        events.len(),
        total_bytes >> 10,
        ms(up_at - down_at),
        phases[0],
        phases[1],
        phases[2],
        ms(longest_wait),
        recovered.map(|(sent, done)| ms(sent - up_at) + ms(done - sent)),
        recovered.map(|(sent, done)| ms(done - sent)),
    );

    let mut burst_statuses: BTreeMap<String, usize> = BTreeMap::new();
    for (status, _) in &burst {
        let key = status.map_or_else(|| "error".to_string(), |s| s.to_string());
        *burst_statuses.entry(key).or_default() += 1;
    }
    let slowest = |status: u16| {
        burst
            .iter()
            .filter(|(s, _)| *s == Some(status))
            .map(|(_, wait)| ms(*wait))
            .max()
    };
    eprintln!(
        "garage_outage: burst of 24 x 128 KiB mid-outage: {burst_statuses:?}; slowest 429 \
         answered in {:?} ms, slowest 200 in {:?} ms",
        slowest(429),
        slowest(200)
    );

    // Only 200, or 429/503 with Retry-After; never another error, never a dropped connection.
    for event in &events {
        match event.status {
            Some(200) => {}
            Some(429) | Some(503) => assert!(
                event.retry_after.is_some(),
                "an overload answer without Retry-After:\n{}",
                event.error
            ),
            Some(status) => panic!(
                "append answered {status} around the outage:\n{}\nserver log:\n{}",
                event.error,
                server.log()
            ),
            None => panic!(
                "append failed at the transport level ({}) after {} ms\nserver log:\n{}",
                event.error,
                ms(event.done - event.sent),
                server.log()
            ),
        }
    }
    // Object durability: nothing sent while the store was down is acknowledged before it is
    // back (the bucket is the only copy).
    for event in &events {
        if event.status == Some(200) && event.sent >= down_at {
            assert!(
                event.done >= up_at,
                "an append sent {} ms into the outage was acknowledged before the store came back",
                ms(event.sent - down_at)
            );
        }
    }
    assert!(
        events
            .iter()
            .any(|e| e.sent < up_at && e.done > down_at + Duration::from_millis(500)),
        "no append was held up by the outage: the load did not overlap it"
    );
    let Some((sent, done)) = recovered else {
        panic!(
            "no append sent after the store came back was acknowledged within {RECOVERY_BOUND:?}\nserver log:\n{}",
            server.log()
        );
    };
    assert!(done - sent < RECOVERY_BOUND);
    assert_eq!(burst.len(), 24, "every burst append was answered");
    assert!(
        burst.iter().any(|(status, _)| *status == Some(429)),
        "3 MiB of appends on two cores with the store down and --max-unuploaded-bytes 1MiB \
         got no 429: {burst_statuses:?}"
    );
    assert!(
        total_acked > 50,
        "the load made too few appends: {total_acked}"
    );

    check_acked(&server, &acked, "after the outage");
    // Cold: the node's disk is gone, everything comes from the bucket.
    server.kill();
    server.remove_wal_dir();
    server.restart();
    check_acked(
        &server,
        &acked,
        "after kill -9 and losing the WAL directory",
    );
    for (stream, records) in &acked {
        let next = server.head(stream).h_u64("pico-next-seq");
        let highest = records.iter().map(|(offset, _)| *offset).max().unwrap_or(0);
        assert!(
            next > highest,
            "{stream}: next {next} <= acknowledged {highest}"
        );
    }
}

/// A wrong secret stops `pico serve` at once with one clear line, not a retry loop.
#[ignore = "needs Garage: PICOMQ_S3_ENDPOINT, AWS_* (scripts/garage-up.sh)"]
#[test]
fn a_wrong_secret_is_a_clear_startup_error() {
    let Some(endpoint) = shared_endpoint("wrong_secret") else {
        return;
    };
    let dir = tempfile::Builder::new()
        .prefix("pico-wrong-secret-")
        .tempdir()
        .unwrap();
    let stderr_path = dir.path().join("stderr");
    let mut command = Command::new(env!("CARGO_BIN_EXE_pico"));
    command
        .arg("serve")
        .args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
        .arg("--meta-url")
        .arg(format!("sqlite:{}", dir.path().join("meta.db").display()))
        .arg("--wal-dir")
        .arg(dir.path().join("wal"))
        .arg("--storage")
        .arg(storage(&endpoint))
        .current_dir(dir.path())
        .env(
            "AWS_SECRET_ACCESS_KEY",
            "0000000000000000000000000000000000000000000000000000000000000000",
        )
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&stderr_path).unwrap());
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("PICO_") {
            command.env_remove(key);
        }
    }
    let started = Instant::now();
    let mut child = command.spawn().expect("spawn pico serve");
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "pico serve with a wrong secret still runs after 20 s; stderr:\n{}",
                std::fs::read_to_string(&stderr_path).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let elapsed = started.elapsed();
    let stderr = std::fs::read_to_string(&stderr_path).unwrap_or_default();
    eprintln!("wrong_secret: {status} after {elapsed:?}: {stderr}");
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(
        elapsed < Duration::from_secs(10),
        "a 403 was retried: {elapsed:?}"
    );
    let line = stderr
        .lines()
        .find(|line| line.starts_with("pico: "))
        .unwrap_or_else(|| panic!("no 'pico: ' line in stderr:\n{stderr}"));
    let lower = line.to_ascii_lowercase();
    assert!(lower.contains("access denied"), "{line}");
    assert!(line.contains("AWS_SECRET_ACCESS_KEY"), "{line}");
    assert!(!line.contains("gave up"), "the 403 was retried: {line}");
    assert!(
        !stderr.contains("0000000000000000"),
        "the secret leaked into the message"
    );
}

/// ~2 MiB in one stream over many 64 KiB segments, read back cold (the WAL directory deleted)
/// through a block cache smaller than the data: the reads go to the bucket again and again.
#[ignore = "needs Garage: PICOMQ_S3_ENDPOINT, AWS_* (scripts/garage-up.sh)"]
#[test]
fn a_cold_read_of_many_segments_through_a_small_block_cache() {
    let Some(endpoint) = shared_endpoint("cold_read") else {
        return;
    };
    let storage = storage(&endpoint);
    let mut server = Server::start(&[
        "--storage",
        &storage,
        "--durability",
        "local",
        "--segment-size",
        "65536",
        "--segment-max-age-ms",
        "100",
        "--block-cache-size",
        "262144",
    ]);
    let stream = "/cold/multi-segment";
    server.put(stream, "application/octet-stream").expect(201);
    let seed = XorShift::seed_from_time();
    eprintln!("cold_read: seed {seed}");
    let mut rng = XorShift::new(seed);
    let mut conn = server.connect();
    let mut written: Vec<Vec<u8>> = Vec::new();
    let mut total = 0usize;
    while total < 2 << 20 {
        let len = rng.range(1, 16 << 10) as usize;
        let data = body(0, written.len() as u64, len, &mut rng);
        let response = conn.request("POST", stream, &[], &data).unwrap();
        response.expect(200);
        assert_eq!(response.h_u64("pico-start-seq"), written.len() as u64);
        total += data.len();
        written.push(data);
    }
    // Everything sealed (100 ms) and uploaded: no WAL file holds frames any more.
    common::wait_for(
        "the WAL to drain into the bucket",
        Duration::from_secs(30),
        || (wal_frame_bytes(&server) == 0).then_some(()),
    );

    // A clean stop, so the catalog knows the WAL holds nothing it lacks, and the node starts
    // without it.
    assert!(server.terminate(Duration::from_secs(60)).success());
    server.remove_wal_dir();
    server.restart();
    let log = server.log();
    let segments: usize = log
        .lines()
        .filter_map(|line| line.split("streams and ").nth(1))
        .filter_map(|rest| rest.split_whitespace().next()?.parse().ok())
        .next_back()
        .unwrap_or(0);
    assert!(
        segments >= 16,
        "2 MiB in 64 KiB segments should make many segments, the node recovered {segments}"
    );
    let check = |from: u64, pass: &str| {
        let (records, next) = common::read_all(&server, stream, from);
        assert_eq!(next, written.len() as u64, "{pass}: next seq");
        assert_eq!(
            records.len(),
            written.len() - from as usize,
            "{pass}: count"
        );
        for (record, want) in records.iter().zip(&written[from as usize..]) {
            assert!(
                record.body == *want,
                "{pass}: record {} differs ({} bytes, want {})",
                record.seq,
                record.body.len(),
                want.len()
            );
        }
    };
    check(0, "first cold pass");
    // Start in the middle of segments, then read everything again: evicted segments come back
    // from the bucket.
    for _ in 0..4 {
        let from = rng.range(1, written.len() as u64);
        check(from, &format!("cold read from {from}"));
    }
    check(0, "second cold pass");
    eprintln!(
        "cold_read: {} records, {} KiB, {segments} segments",
        written.len(),
        total >> 10
    );
}

/// Deleted and trimmed data leaves the bucket: the collector deletes their segment objects
/// (counted through Garage's own S3 API), and what is kept still reads back cold.
/// A Garage of the test's own and a node on it with object durability and a collector every
/// 200 ms; `None` (with the skip note) without Garage or a curl that lists with SigV4.
fn collecting_node(test: &str) -> Option<(OwnGarage, Server)> {
    shared_endpoint(test)?;
    if !curl_has_sigv4() {
        pico_testkit::missing_service(test, "needs curl 7.75 or later (--aws-sigv4)");
        return None;
    }
    let garage = OwnGarage::start(test)?;
    let storage = storage(&garage.endpoint());
    let server = Server::start(&[
        "--storage",
        &storage,
        "--cores",
        "1",
        "--durability",
        "object",
        "--gc-interval-ms",
        "200",
    ]);
    Some((garage, server))
}

#[ignore = "needs Garage: PICOMQ_S3_ENDPOINT, AWS_* (scripts/garage-up.sh)"]
#[test]
fn garbage_collection_deletes_segment_objects_from_garage() {
    let Some((garage, mut server)) = collecting_node("garage_gc") else {
        return;
    };
    let endpoint = garage.endpoint();
    assert_eq!(
        segment_keys(&endpoint),
        Vec::<String>::new(),
        "a fresh bucket"
    );
    // Object durability: once an append is acknowledged its segment is in the bucket, so the
    // keys that appear while one stream is written are that stream's.
    let mut keys_of: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for name in ["/gc/deleted", "/gc/trimmed", "/gc/kept"] {
        let before: HashSet<String> = segment_keys(&endpoint).into_iter().collect();
        server.put(name, "text/plain").expect(201);
        for i in 0..3 {
            server
                .post(name, format!("{name}-{i}").as_bytes())
                .expect(200);
        }
        let new: Vec<String> = segment_keys(&endpoint)
            .into_iter()
            .filter(|key| !before.contains(key))
            .collect();
        assert!(!new.is_empty(), "{name}: no segment appeared in the bucket");
        for key in &new {
            let stem = key
                .strip_prefix("segments/c")
                .and_then(|k| k.split_once('/'))
                .and_then(|(_, k)| k.strip_suffix(".seg"))
                .unwrap_or_else(|| panic!("unexpected key {key}"));
            assert_eq!(
                stem.split('-').count(),
                3,
                "key {key} is not <epoch>-<core>-<n>"
            );
        }
        keys_of.insert(name, new);
    }
    let all = segment_keys(&endpoint);
    eprintln!("garage_gc: segment keys before collection: {all:?}");

    server.delete("/gc/deleted").expect(204);
    let trimmed = server.request("POST", "/gc/trimmed", &[("pico-trim-seq", "3")], b"");
    assert_eq!(trimmed.h("pico-start-seq"), "3", "{}", trimmed.describe());
    let kept = keys_of["/gc/kept"].clone();
    let deadline = Instant::now() + Duration::from_secs(20);
    let left = loop {
        let keys = segment_keys(&endpoint);
        if keys == kept {
            break keys;
        }
        assert!(
            Instant::now() < deadline,
            "garbage collection did not reduce the bucket to the kept stream's segments {kept:?}: now {keys:?}\n{}",
            server.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    eprintln!(
        "garage_gc: {} segment objects before, {} after: {left:?}",
        all.len(),
        left.len()
    );

    let kept_body = b"/gc/kept-0/gc/kept-1/gc/kept-2";
    assert_eq!(server.get("/gc/kept?format=raw").body, kept_body);
    let head = server.head("/gc/trimmed");
    assert_eq!(
        (head.h("pico-start-seq"), head.h("pico-next-seq")),
        ("3", "3")
    );
    assert_eq!(server.head("/gc/deleted").status, 404);

    // Cold: the kept data comes from the bucket, the collected streams stay as they were.
    server.kill();
    server.remove_wal_dir();
    server.restart();
    assert_eq!(server.get("/gc/kept?format=raw").body, kept_body);
    let head = server.head("/gc/trimmed");
    assert_eq!(
        (head.h("pico-start-seq"), head.h("pico-next-seq")),
        ("3", "3")
    );
    assert_eq!(server.head("/gc/deleted").status, 404);
    server.post("/gc/trimmed", b"after").expect(200);
    assert_eq!(server.get("/gc/trimmed?seq=3&format=raw").body, b"after");
    // The restart collected nothing it should keep.
    let keys = segment_keys(&endpoint);
    for key in &kept {
        assert!(
            keys.contains(key),
            "{key} vanished after the restart: {keys:?}"
        );
    }
}

/// Retention on a real bucket: the segments an age limit left holding nothing readable are
/// deleted from Garage by the collector, the kept stream's stay, and a kill -9 while it
/// reclaims loses neither the policy nor the start.
#[ignore = "needs Garage: PICOMQ_S3_ENDPOINT, AWS_* (scripts/garage-up.sh)"]
#[test]
fn retention_reclaims_segment_objects_from_garage() {
    let Some((garage, mut server)) = collecting_node("garage_retention") else {
        return;
    };
    let endpoint = garage.endpoint();
    // Object durability: the keys that appear while one stream is written are that stream's.
    let mut keys_of: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for (name, age) in [("/ret/aged", "1"), ("/ret/kept", "3600")] {
        let before: HashSet<String> = segment_keys(&endpoint).into_iter().collect();
        server
            .request(
                "PUT",
                name,
                &[("content-type", "text/plain"), ("pico-retention-age", age)],
                b"",
            )
            .expect(201);
        for i in 0..3 {
            server
                .post(name, format!("{name}-{i}").as_bytes())
                .expect(200);
        }
        let new: Vec<String> = segment_keys(&endpoint)
            .into_iter()
            .filter(|key| !before.contains(key))
            .collect();
        assert!(!new.is_empty(), "{name}: no segment appeared in the bucket");
        keys_of.insert(name, new);
    }
    let start = |server: &Server| server.head("/ret/aged").h_u64("pico-start-seq");
    common::wait_for("retention to trim /ret/aged", RECOVERY_BOUND, || {
        (start(&server) == 3).then_some(())
    });
    // Killed while the collector may be deleting: the policy and the start are in the
    // metadata log, and the collector finishes after the restart.
    server.kill();
    server.restart();
    assert_eq!(start(&server), 3);
    assert_eq!(
        server.head("/ret/aged").header("pico-retention-age"),
        Some("1")
    );
    let kept = keys_of["/ret/kept"].clone();
    common::wait_for(
        "the collector to delete /ret/aged's objects from the bucket",
        RECOVERY_BOUND,
        || {
            let keys = segment_keys(&endpoint);
            keys_of["/ret/aged"]
                .iter()
                .all(|key| !keys.contains(key))
                .then_some(())
        },
    );
    let keys = segment_keys(&endpoint);
    for key in &kept {
        assert!(
            keys.contains(key),
            "{key} of the kept stream vanished: {keys:?}"
        );
    }
    assert_eq!(
        server.get("/ret/kept?format=raw").body,
        b"/ret/kept-0/ret/kept-1/ret/kept-2"
    );
}

/// A node restarted while its bucket is down (its Garage killed) still starts: it serves the
/// records only its WAL held, acknowledges appends after them, and once the bucket is back
/// stores the recovered WAL files before anything newer. Nothing acknowledged is lost. A
/// node with no data of its own still refuses to start on a bucket it cannot reach.
#[ignore = "needs Garage: PICOMQ_S3_ENDPOINT, AWS_* (scripts/garage-up.sh)"]
#[test]
fn a_restart_while_the_bucket_is_down_serves_what_the_node_holds() {
    if shared_endpoint("restart_bucket_down").is_none() {
        return;
    }
    let Some(garage) = OwnGarage::start("restart_bucket_down") else {
        return;
    };
    let storage = storage(&garage.endpoint());
    let mut server = Server::start(&[
        "--storage",
        &storage,
        "--durability",
        "local",
        "--cores",
        "1",
        "--segment-max-age-ms",
        "600000",
    ]);
    let name = "/down/a";
    server.put(name, "text/plain").expect(201);
    let mut want: Vec<String> = Vec::new();
    let append = |server: &Server, want: &mut Vec<String>, body: String| {
        let r = server.post(name, body.as_bytes());
        r.expect(200);
        assert_eq!(r.h_u64("pico-start-seq"), want.len() as u64, "{body}");
        want.push(body);
    };
    for i in 0..20 {
        append(&server, &mut want, format!("before {i}"));
    }
    server.kill();
    garage.kill();

    server.restart();
    let bodies = |server: &Server| -> Vec<String> {
        let (records, next) = common::read_all(server, name, 0);
        assert_eq!(next, records.len() as u64);
        records
            .into_iter()
            .map(|r| String::from_utf8(r.body).unwrap())
            .collect()
    };
    assert_eq!(bodies(&server), want, "served while the bucket is down");
    let ready = server.admin_get("/ready");
    ready.expect(200);
    assert!(
        ready.json()["recoveredUnstored"].as_u64().unwrap() >= 1,
        "{}",
        ready.text()
    );
    assert!(
        server.log().contains("cannot be reached"),
        "{}",
        server.log()
    );
    for i in 0..5 {
        append(&server, &mut want, format!("while down {i}"));
    }

    garage.up();
    common::wait_for(
        "the recovered WAL files stored",
        Duration::from_secs(90),
        || (server.metric_sample("pico_recovered_wal_files_unstored")? == 0).then_some(()),
    );
    append(&server, &mut want, "after".to_string());
    server.restart();
    assert_eq!(bodies(&server), want, "after the bucket came back");

    // No data of its own: an unreachable bucket is a setting to fix, not an outage to ride.
    garage.kill();
    let fresh = tempfile::tempdir().unwrap();
    let wal_dir = fresh.path().join("wal").display().to_string();
    let catalog = format!("sqlite:{}", fresh.path().join("meta.db").display());
    let (refused, stderr) = common::serve_refused(
        &[
            "--storage",
            &storage,
            "--wal-dir",
            &wal_dir,
            "--meta-url",
            &catalog,
        ],
        Duration::from_secs(90),
    );
    assert!(
        refused,
        "a fresh node started on an unreachable bucket: {stderr}"
    );
    assert!(stderr.contains("gave up"), "{stderr}");
}

/// A node whose `--storage` names another store's bucket (here a second Garage: the same
/// bucket name at another endpoint) is refused at start, naming the segments it lacks, before
/// recovery stores anything there; on its own bucket every record reads back.
#[ignore = "needs Garage: PICOMQ_S3_ENDPOINT, AWS_* (scripts/garage-up.sh)"]
#[test]
fn a_start_on_another_stores_bucket_is_refused() {
    let Some(endpoint) = shared_endpoint("another_bucket") else {
        return;
    };
    let Some(other) = OwnGarage::start("another_bucket") else {
        return;
    };
    let own = storage(&endpoint);
    let mut server = common::killed_after_big_records_with(&["--storage", &own], "/g", |_| {});
    let meta = format!("sqlite:{}", server.dir().join("meta.db").display());
    let wal = server.wal_dir().display().to_string();
    let elsewhere = storage(&other.endpoint());
    let (refused, stderr) = common::serve_refused(
        &[
            "--meta-url",
            &meta,
            "--wal-dir",
            &wal,
            "--storage",
            &elsewhere,
        ],
        Duration::from_secs(60),
    );
    assert!(refused, "started on another store's bucket: {stderr}");
    assert!(
        stderr.contains("holds none of the catalog's newest segment objects"),
        "{stderr}"
    );
    server.restart();
    let (records, next) = common::read_all(&server, "/g", 0);
    assert_eq!((records.len(), next), (100, 100));
}
