//! Streams are owned by one core each (by hash of the name) while connections land on any
//! core: with `--cores 2` and many connections, most requests cross cores. Every operation
//! must behave as on a single core.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::{encode_binary_batch, read_all, BatchRecord, Conn, Server};

const STREAMS: usize = 40;
const WRITERS: usize = 4;
const ROUNDS: usize = 3;

fn stream_name(i: usize) -> String {
    format!("/cc/s{i:02}")
}

#[test]
fn many_streams_over_many_connections_on_two_cores() {
    let s = Server::start(&["--cores", "2", "--long-poll-timeout-sec", "20"]);

    // Creates, each on its own connection (the kernel spreads them over both cores).
    for i in 0..STREAMS {
        let r = s.request(
            "PUT",
            &stream_name(i),
            &[("content-type", "text/plain")],
            b"",
        );
        r.expect(201);
        assert_eq!(r.header("location"), Some(stream_name(i).as_str()));
    }
    // Idempotent repeats from other connections.
    for i in 0..STREAMS {
        s.request(
            "PUT",
            &stream_name(i),
            &[("content-type", "text/plain")],
            b"",
        )
        .expect(200);
    }

    // Writers: each has its own connection and appends to every stream, alternating single
    // records and two-record binary batches. Every acknowledgement is recorded.
    let addr = s.addr;
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            std::thread::spawn(move || {
                let mut conn = Conn::connect(addr).unwrap();
                // (stream, offset, body, first record of its request)
                let mut acked: Vec<(usize, u64, Vec<u8>, bool)> = Vec::new();
                for round in 0..ROUNDS {
                    for i in 0..STREAMS {
                        let name = stream_name(i);
                        let one = format!("{name} w{w} r{round} a").into_bytes();
                        if (i + round + w) % 2 == 0 {
                            let r = conn.request("POST", &name, &[], &one).unwrap();
                            r.expect(200);
                            let start = r.h_u64("pico-start-seq");
                            assert_eq!(r.h_u64("pico-next-seq"), start + 1);
                            acked.push((i, start, one, true));
                        } else {
                            let two = format!("{name} w{w} r{round} b").into_bytes();
                            let batch = encode_binary_batch(&[
                                BatchRecord {
                                    headers: &[],
                                    body: &one,
                                },
                                BatchRecord {
                                    headers: &[],
                                    body: &two,
                                },
                            ]);
                            let r = conn
                                .request(
                                    "POST",
                                    &name,
                                    &[("content-type", "application/vnd.picomq.batch")],
                                    &batch,
                                )
                                .unwrap();
                            r.expect(200);
                            let start = r.h_u64("pico-start-seq");
                            assert_eq!(r.h_u64("pico-next-seq"), start + 2);
                            acked.push((i, start, one, true));
                            acked.push((i, start + 1, two, false));
                        }
                    }
                }
                acked
            })
        })
        .collect();
    let mut expected: Vec<BTreeMap<u64, (Vec<u8>, bool)>> = vec![BTreeMap::new(); STREAMS];
    for writer in writers {
        for (i, offset, body, first) in writer.join().expect("writer thread") {
            let previous = expected[i].insert(offset, (body, first));
            assert!(
                previous.is_none(),
                "offset {offset} of {} acknowledged twice",
                stream_name(i)
            );
        }
    }

    // Read back every stream: dense offsets, each acknowledged body at its offset.
    for (i, want) in expected.iter().enumerate() {
        let name = stream_name(i);
        let (records, next) = read_all(&s, &name, 0);
        assert_eq!(next, want.len() as u64, "{name} tail");
        assert_eq!(records.len(), want.len(), "{name} record count");
        let mut last_timestamp = 0;
        for record in &records {
            let (body, first_of_request) = &want[&record.seq];
            assert_eq!(&record.body, body, "{name} at {}", record.seq);
            // Timestamps strictly increase from request to request, shared within a batch.
            if *first_of_request {
                assert!(
                    record.timestamp > last_timestamp,
                    "{name}: timestamp does not increase at {}",
                    record.seq
                );
            } else {
                assert_eq!(record.timestamp, last_timestamp, "{name} at {}", record.seq);
            }
            last_timestamp = record.timestamp;
        }
        let head = s.request("HEAD", &name, &[], b"");
        head.expect(200);
        assert_eq!(head.h_u64("pico-next-seq"), want.len() as u64);
    }

    // Both cores own streams: each core's log holds frames.
    let per_core = common::frame_bytes_per_core(s.dir());
    assert!(
        per_core.len() == 2 && per_core.values().all(|&bytes| bytes > 0),
        "streams are not spread over both cores: {per_core:?}"
    );

    // The listing sees every stream with its live tail, across both cores, paged.
    let list = s.get("/?prefix=/cc/");
    list.expect(200);
    let list = list.json();
    let entries = list["streams"].as_array().unwrap();
    assert_eq!(entries.len(), STREAMS);
    assert_eq!(list["has_more"], false);
    for (i, entry) in entries.iter().enumerate() {
        assert_eq!(entry["name"], stream_name(i));
        assert_eq!(entry["next_seq"], expected[i].len() as u64);
        assert_eq!(entry["content_type"], "text/plain");
    }
    let mut paged = Vec::new();
    let mut start_after = String::new();
    loop {
        let r = s.get(&format!("/?prefix=/cc/&limit=7&start_after={start_after}"));
        r.expect(200);
        let page = r.json();
        let names: Vec<String> = page["streams"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["name"].as_str().unwrap().to_string())
            .collect();
        assert!(names.len() <= 7);
        paged.extend(names.iter().cloned());
        if page["has_more"] == false {
            break;
        }
        start_after = names
            .last()
            .expect("a page with has_more is not empty")
            .clone();
        assert!(paged.len() <= STREAMS, "paging does not end");
    }
    let all: Vec<String> = (0..STREAMS).map(stream_name).collect();
    assert_eq!(paged, all);

    // Long-polls on many streams at once from separate connections, woken by appends made on
    // other connections.
    let pollers: Vec<_> = (0..8)
        .map(|i| {
            let tail = expected[i].len() as u64;
            std::thread::spawn(move || {
                let mut conn = Conn::connect(addr).unwrap();
                let started = Instant::now();
                let r = conn
                    .request(
                        "GET",
                        &format!("{}?seq={tail}&live=long-poll&format=raw", stream_name(i)),
                        &[],
                        b"",
                    )
                    .unwrap();
                (r, started.elapsed())
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    for i in 0..8 {
        s.post(&stream_name(i), format!("wake {i}").as_bytes())
            .expect(200);
    }
    for (i, poller) in pollers.into_iter().enumerate() {
        let (r, waited) = poller.join().unwrap();
        r.expect(200);
        assert_eq!(r.body, format!("wake {i}").into_bytes());
        assert!(
            waited < Duration::from_secs(15),
            "poller {i} waited {waited:?}"
        );
    }

    // Delete half from fresh connections; the listing and HEADs agree.
    for i in (0..STREAMS).step_by(2) {
        s.delete(&stream_name(i)).expect(204);
    }
    for i in 0..STREAMS {
        let status = s.head(&stream_name(i)).status;
        assert_eq!(
            status,
            if i % 2 == 0 { 404 } else { 200 },
            "{}",
            stream_name(i)
        );
    }
    let list = s.get("/?prefix=/cc/").json();
    let names: Vec<&str> = list["streams"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    let odd: Vec<String> = (1..STREAMS).step_by(2).map(stream_name).collect();
    assert_eq!(names, odd);
}
