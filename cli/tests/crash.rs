//! The crash test: writers append continuously (single records, binary and JSON batches,
//! several streams) while the server is `kill -9`ed at random points, round after round.
//! After every restart each acknowledged record must be back at its offset with its body
//! and timestamp, offsets must be dense, nothing may appear that was never sent, and
//! timestamps must increase from request to request, across restarts too.
//!
//! The seed is printed; set `CRASH_SEED=<n>` to replay the same schedule of kill points
//! and request shapes (thread timing still varies).

mod common;

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{base64, encode_binary_batch, BatchRecord, Conn, Server, XorShift};

const STREAMS: usize = 4;
const WRITERS: usize = 2;
const ROUNDS: usize = 8;

fn stream_name(i: usize) -> String {
    format!("/crash/s{i}")
}

/// A request's identity inside each of its record bodies: `s<stream>-w<writer>-q<request>-i<index>|`.
fn body_of(rng: &mut XorShift, stream: usize, request: &str, index: usize) -> Vec<u8> {
    let mut body = format!("s{stream}-{request}-i{index}|").into_bytes();
    let pad = rng.range(0, 300) as usize;
    body.extend((0..pad).map(|_| rng.next_u64() as u8));
    body
}

/// The request id (`w<writer>-q<request>` of round-unique writer numbers) of a body.
fn request_of(body: &[u8]) -> &[u8] {
    let end = body.iter().position(|&b| b == b'|').expect("a body id");
    let id = &body[..end];
    let start = id.iter().position(|&b| b == b'-').unwrap() + 1;
    let stop = id.iter().rposition(|&b| b == b'-').unwrap();
    &id[start..stop]
}

#[derive(Default)]
struct WriterLog {
    /// (stream, offset, body, timestamp) of every acknowledged record.
    acked: Vec<(usize, u64, Vec<u8>, i64)>,
    /// Bodies of requests whose outcome is unknown (the server died before answering).
    maybe: Vec<(usize, Vec<u8>)>,
    /// Responses that no crash explains.
    unexpected: Vec<String>,
    requests: usize,
}

/// Appends until `stop`, counting acknowledged requests in `progress`.
fn writer(
    addr: SocketAddr,
    id: String,
    seed: u64,
    stop: Arc<AtomicBool>,
    progress: Arc<AtomicUsize>,
) -> WriterLog {
    let mut rng = XorShift::new(seed);
    let mut log = WriterLog::default();
    let mut conn: Option<Conn> = None;
    let mut request_no = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let Some(c) = conn.as_mut() else {
            match Conn::connect(addr) {
                Ok(c) => conn = Some(c),
                Err(_) => std::thread::sleep(Duration::from_millis(5)),
            }
            continue;
        };
        let stream = rng.range(0, STREAMS as u64) as usize;
        let request = format!("{id}-q{request_no}");
        request_no += 1;
        let shape = rng.range(0, 10);
        let records = if shape < 5 {
            1
        } else {
            rng.range(2, 6) as usize
        };
        let bodies: Vec<Vec<u8>> = (0..records)
            .map(|i| body_of(&mut rng, stream, &request, i))
            .collect();
        let (content_type, payload) = if shape < 5 {
            ("application/octet-stream", bodies[0].clone())
        } else if shape < 8 {
            let batch: Vec<BatchRecord> = bodies
                .iter()
                .map(|b| BatchRecord {
                    headers: &[],
                    body: b,
                })
                .collect();
            ("application/vnd.picomq.batch", encode_binary_batch(&batch))
        } else {
            let items: Vec<String> = bodies
                .iter()
                .map(|b| format!("{{\"body_b64\":\"{}\"}}", base64(b)))
                .collect();
            (
                "application/vnd.picomq.batch+json",
                format!("{{\"records\":[{}]}}", items.join(",")).into_bytes(),
            )
        };
        log.requests += 1;
        let name = stream_name(stream);
        match c.request("POST", &name, &[("content-type", content_type)], &payload) {
            Ok(r) if r.status == 200 => {
                let start = r.h_u64("pico-start-seq");
                let next = r.h_u64("pico-next-seq");
                let timestamp = r.h_i64("pico-timestamp");
                if next != start + records as u64 {
                    log.unexpected.push(format!(
                        "{name}: {records} records acked as [{start}, {next})"
                    ));
                }
                for (i, body) in bodies.into_iter().enumerate() {
                    log.acked.push((stream, start + i as u64, body, timestamp));
                }
                progress.fetch_add(1, Ordering::Relaxed);
            }
            Ok(r) if r.status == 429 || r.status == 503 => {
                // Refused under load or while stopping: not written, but count it as unknown.
                log.maybe.extend(bodies.into_iter().map(|b| (stream, b)));
                std::thread::sleep(Duration::from_millis(5));
            }
            Ok(r) => {
                log.unexpected
                    .push(format!("POST {name}: {}", r.describe()));
                log.maybe.extend(bodies.into_iter().map(|b| (stream, b)));
            }
            Err(_) => {
                // The server died mid-request: the append may or may not have happened.
                log.maybe.extend(bodies.into_iter().map(|b| (stream, b)));
                conn = None;
            }
        }
    }
    log
}

/// What the test knows of one stream.
#[derive(Default)]
struct Expected {
    /// offset → (body, timestamp) of acknowledged records.
    acked: BTreeMap<u64, (Vec<u8>, i64)>,
    /// Bodies that may or may not have been written.
    maybe: HashMap<Vec<u8>, ()>,
}

fn verify(s: &Server, expected: &[Expected], round: usize) -> u64 {
    let mut total = 0;
    for (i, want) in expected.iter().enumerate() {
        let name = stream_name(i);
        let (records, next) = common::read_all(s, &name, 0);
        let acked_tail = want.acked.keys().next_back().map(|o| o + 1).unwrap_or(0);
        assert!(
            next >= acked_tail,
            "round {round}: {name} tail {next} below the acknowledged tail {acked_tail}"
        );
        assert_eq!(
            records.len() as u64,
            next,
            "round {round}: {name} record count"
        );
        let mut seen: HashMap<&[u8], u64> = HashMap::new();
        let mut previous: Option<(&[u8], i64)> = None;
        for (position, record) in records.iter().enumerate() {
            assert_eq!(
                record.seq, position as u64,
                "round {round}: {name} has a hole before {}",
                record.seq
            );
            assert!(record.headers.is_empty());
            match want.acked.get(&record.seq) {
                Some((body, timestamp)) => {
                    assert!(
                        record.body == *body,
                        "round {round}: {name} at {}: acknowledged body differs (got {:?})",
                        record.seq,
                        String::from_utf8_lossy(&record.body[..record.body.len().min(40)])
                    );
                    assert_eq!(
                        record.timestamp, *timestamp,
                        "round {round}: {name} at {}: acknowledged timestamp differs",
                        record.seq
                    );
                }
                None => assert!(
                    want.maybe.contains_key(&record.body),
                    "round {round}: {name} at {}: a record that was never sent: {:?}",
                    record.seq,
                    String::from_utf8_lossy(&record.body[..record.body.len().min(40)])
                ),
            }
            if let Some(first) = seen.insert(&record.body, record.seq) {
                panic!(
                    "round {round}: {name}: the same record at {first} and {}",
                    record.seq
                );
            }
            let request = request_of(&record.body);
            if let Some((previous_request, previous_timestamp)) = previous {
                if previous_request == request {
                    assert_eq!(
                        record.timestamp, previous_timestamp,
                        "round {round}: {name} at {}: one request, two timestamps",
                        record.seq
                    );
                } else {
                    assert!(
                        record.timestamp > previous_timestamp,
                        "round {round}: {name} at {}: timestamp {} not above {previous_timestamp}",
                        record.seq,
                        record.timestamp
                    );
                }
            }
            previous = Some((request, record.timestamp));
        }
        total += next;
    }
    total
}

#[test]
fn acknowledged_appends_survive_kill_9_at_random_points() {
    let seed = std::env::var("CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(XorShift::seed_from_time);
    eprintln!("crash test seed: {seed} (replay with CRASH_SEED={seed})");
    let mut rng = XorShift::new(seed);
    let test_started = Instant::now();

    let mut s = Server::start(&["--cores", "2"]);
    for i in 0..STREAMS {
        s.put(&stream_name(i), "application/octet-stream")
            .expect(201);
    }
    let mut expected: Vec<Expected> = (0..STREAMS).map(|_| Expected::default()).collect();
    let mut unexpected = Vec::new();
    for round in 0..ROUNDS {
        let stop = Arc::new(AtomicBool::new(false));
        let progress = Arc::new(AtomicUsize::new(0));
        let writers: Vec<_> = (0..WRITERS)
            .map(|w| {
                let (addr, stop, progress) = (s.addr, stop.clone(), progress.clone());
                let id = format!("w{}", round * WRITERS + w);
                let writer_seed = rng.next_u64();
                std::thread::spawn(move || writer(addr, id, writer_seed, stop, progress))
            })
            .collect();
        // The kill comes a random while after the load is under way: after the first
        // acknowledgement, which a busy machine only delays, not at a fixed instant that it
        // might reach before the writers have connected.
        let under_way = Instant::now();
        while progress.load(Ordering::Relaxed) == 0 {
            assert!(
                under_way.elapsed() < Duration::from_secs(60),
                "round {round}: no append acknowledged\n{}",
                s.log()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        let load = Duration::from_millis(rng.range(300, 1500));
        std::thread::sleep(load);
        s.kill();
        stop.store(true, Ordering::Relaxed);
        let mut requests = 0;
        let mut acked_now = 0;
        for handle in writers {
            let log = handle.join().expect("writer thread");
            requests += log.requests;
            acked_now += log.acked.len();
            for (stream, offset, body, timestamp) in log.acked {
                let previous = expected[stream].acked.insert(offset, (body, timestamp));
                assert!(
                    previous.is_none(),
                    "round {round}: {} offset {offset} acknowledged twice",
                    stream_name(stream)
                );
            }
            for (stream, body) in log.maybe {
                expected[stream].maybe.insert(body, ());
            }
            unexpected.extend(log.unexpected);
        }
        assert!(
            unexpected.is_empty(),
            "round {round}: unexpected responses:\n{}",
            unexpected.join("\n")
        );
        s.restart();
        let total = verify(&s, &expected, round);
        eprintln!(
            "round {round}: killed after {load:?}, {requests} requests, {acked_now} records acknowledged, {total} records stored"
        );
        assert!(
            acked_now > 0,
            "no append was acknowledged in {load:?}: the test exercised nothing"
        );
    }
    // After the last crash the server keeps accepting appends at the tails.
    for (i, want) in expected.iter_mut().enumerate() {
        let name = stream_name(i);
        let tail = s.head(&name).h_u64("pico-next-seq");
        let body = format!("s{i}-final-q0-i0|").into_bytes();
        let r = s.post(&name, &body);
        r.expect(200);
        assert_eq!(r.h_u64("pico-start-seq"), tail);
        want.acked.insert(tail, (body, r.h_i64("pico-timestamp")));
    }
    verify(&s, &expected, ROUNDS);
    eprintln!("crash test done in {:?}", test_started.elapsed());
}
