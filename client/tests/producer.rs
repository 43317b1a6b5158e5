//! The producer session against an in-process mock of the Pico producer rules
//! (docs/api.md, "Append") that can lose answers, fail, delay and reorder requests.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use pico_client::codec::decode_binary_batch;
use pico_client::{Client, ClientConfig, ErrorKind, Producer, ProducerConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

/// What the mock does to requests; probabilities in percent.
#[derive(Clone, Default)]
struct Faults {
    /// Apply the request, then drop the connection without an answer.
    lose_answer: u64,
    /// Answer 503 without applying.
    unavailable: u64,
    /// Random delay up to this many ms before handling (reorders concurrent requests).
    max_delay_ms: u64,
    /// Answer every request 400 (a request the server will never take).
    reject: bool,
    /// Answer this many requests `429` with `Retry-After: 1` first.
    overloaded: u64,
}

#[derive(Default)]
struct State {
    records: Vec<Bytes>,
    /// Producer id → (epoch, last accepted seq).
    producers: HashMap<String, (u64, u64)>,
    /// Producer requests seen (any outcome).
    requests: u64,
    gaps: u64,
    duplicates: u64,
    /// Batch sizes of applied requests.
    batches: Vec<usize>,
}

struct Mock {
    state: Mutex<State>,
    faults: Mutex<Faults>,
    rng: AtomicU64,
    /// While set, requests wait for `release` before being handled.
    hold: AtomicBool,
    release: Notify,
    /// Answer every producer request 403 fenced.
    fenced: AtomicBool,
}

impl Mock {
    fn random(&self, below: u64) -> u64 {
        let mut x = self.rng.load(Ordering::Relaxed);
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.rng.store(x, Ordering::Relaxed);
        x % below.max(1)
    }

    fn records(&self) -> Vec<Bytes> {
        self.state.lock().unwrap().records.clone()
    }
}

async fn start(faults: Faults) -> (String, Arc<Mock>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let mock = Arc::new(Mock {
        state: Mutex::new(State::default()),
        faults: Mutex::new(faults),
        rng: AtomicU64::new(0x2545_F491_4F6C_DD1D),
        hold: AtomicBool::new(false),
        release: Notify::new(),
        fenced: AtomicBool::new(false),
    });
    let served = mock.clone();
    tokio::spawn(async move {
        loop {
            let Ok((socket, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(serve(socket, served.clone()));
        }
    });
    (endpoint, mock)
}

/// Keep-alive HTTP/1.1 with `Content-Length` bodies, which is all the client sends.
async fn serve(mut socket: TcpStream, mock: Arc<Mock>) {
    let mut buf = Vec::new();
    loop {
        let head_end = loop {
            if let Some(pos) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break pos + 4;
            }
            let mut chunk = [0u8; 16384];
            match socket.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
        let header = |name: &str| {
            head.lines().skip(1).find_map(|line| {
                let (n, v) = line.split_once(':')?;
                n.eq_ignore_ascii_case(name).then(|| v.trim().to_owned())
            })
        };
        let length: usize = header("content-length").map_or(0, |v| v.parse().unwrap());
        while buf.len() < head_end + length {
            let mut chunk = [0u8; 16384];
            match socket.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        let body = Bytes::copy_from_slice(&buf[head_end..head_end + length]);
        buf.drain(..head_end + length);

        if mock.hold.load(Ordering::SeqCst) {
            mock.release.notified().await;
        }
        let faults = mock.faults.lock().unwrap().clone();
        if faults.max_delay_ms > 0 {
            let ms = mock.random(faults.max_delay_ms + 1);
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
        let id = header("pico-producer-id").expect("producer id");
        let epoch: u64 = header("pico-producer-epoch").unwrap().parse().unwrap();
        let seq: u64 = header("pico-producer-seq").unwrap().parse().unwrap();
        let (answer, lose) = {
            let mut state = mock.state.lock().unwrap();
            state.requests += 1;
            if mock.fenced.load(Ordering::SeqCst) {
                (
                    response(
                        "403 Forbidden",
                        &[("pico-producer-epoch", "99")],
                        br#"{"error":"fenced","message":"Stale producer epoch"}"#,
                    ),
                    false,
                )
            } else if state.requests <= faults.overloaded {
                (
                    response(
                        "429 Too Many Requests",
                        &[("retry-after", "1")],
                        br#"{"error":"overloaded","message":"too many bytes in flight"}"#,
                    ),
                    false,
                )
            } else if faults.reject {
                (
                    response(
                        "400 Bad Request",
                        &[],
                        br#"{"error":"bad_request","message":"no"}"#,
                    ),
                    false,
                )
            } else if mock.random(100) < faults.unavailable {
                (response("503 Service Unavailable", &[], b""), false)
            } else {
                let known = state.producers.get(&id).copied();
                let gap = |expected: u64| {
                    response(
                        "409 Conflict",
                        &[
                            ("pico-expected-seq", &expected.to_string()),
                            ("pico-received-seq", &seq.to_string()),
                        ],
                        br#"{"error":"sequence_gap","message":"Producer sequence gap"}"#,
                    )
                };
                match known {
                    Some((e, last)) if e == epoch && seq <= last => {
                        state.duplicates += 1;
                        let next = state.records.len().to_string();
                        let last = last.to_string();
                        (
                            response(
                                "200 OK",
                                &[("pico-next-seq", &next), ("pico-producer-seq", &last)],
                                b"",
                            ),
                            false,
                        )
                    }
                    Some((e, last)) if e == epoch && seq > last + 1 => {
                        state.gaps += 1;
                        (gap(last + 1), false)
                    }
                    // What the server answers a first request that is not sequence 0.
                    None if seq != 0 => {
                        state.gaps += 1;
                        (
                            response(
                                "400 Bad Request",
                                &[],
                                br#"{"error":"bad_request","message":"New epoch must start with sequence 0"}"#,
                            ),
                            false,
                        )
                    }
                    _ => {
                        let records = decode_binary_batch(&body).expect("a binary batch");
                        let start = state.records.len();
                        state.batches.push(records.len());
                        state.records.extend(records.into_iter().map(|r| r.body));
                        state.producers.insert(id, (epoch, seq));
                        let lose = mock.random(100) < faults.lose_answer;
                        (
                            response(
                                "200 OK",
                                &[
                                    ("pico-start-seq", &start.to_string()),
                                    ("pico-next-seq", &state.records.len().to_string()),
                                    ("pico-timestamp", "1000"),
                                    ("pico-producer-seq", &seq.to_string()),
                                ],
                                b"",
                            ),
                            lose,
                        )
                    }
                }
            }
        };
        if lose {
            return; // connection dropped: the client cannot know the outcome
        }
        if socket.write_all(&answer).await.is_err() {
            return;
        }
    }
}

fn response(status: &str, headers: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
    let mut out = format!("HTTP/1.1 {status}\r\ncontent-length: {}\r\n", body.len());
    for (name, value) in headers {
        out.push_str(&format!("{name}: {value}\r\n"));
    }
    out.push_str("\r\n");
    let mut out = out.into_bytes();
    out.extend_from_slice(body);
    out
}

fn client(endpoint: &str) -> Client {
    let mut config = ClientConfig::new(endpoint);
    config.request_timeout = Duration::from_secs(10);
    Client::new(config).unwrap()
}

/// Sends `n` numbered records, awaits every handle and checks the offsets and the stream.
async fn send_numbered(endpoint: &str, mock: &Mock, n: usize, config: ProducerConfig) {
    let producer = Producer::new(client(endpoint), "/p", config).unwrap();
    let mut handles = Vec::with_capacity(n);
    for i in 0..n {
        handles.push(producer.send(format!("r{i}")).await.unwrap());
    }
    producer.close().await.unwrap();
    for (i, handle) in handles.into_iter().enumerate() {
        assert_eq!(handle.await.unwrap(), i as u64, "offset of record {i}");
    }
    let records = mock.records();
    assert_eq!(records.len(), n, "every record exactly once");
    for (i, body) in records.iter().enumerate() {
        assert_eq!(body, &format!("r{i}"), "record {i} in order");
    }
}

fn patient(in_flight: usize) -> ProducerConfig {
    ProducerConfig {
        max_in_flight: in_flight,
        max_batch_records: 37,
        max_attempts: 200,
        delivery_timeout: Duration::from_secs(60),
        ..ProducerConfig::default()
    }
}

#[tokio::test(flavor = "current_thread")]
async fn exactly_once_in_order_through_lost_answers_and_errors() {
    let (endpoint, mock) = start(Faults {
        lose_answer: 15,
        unavailable: 15,
        ..Faults::default()
    })
    .await;
    send_numbered(&endpoint, &mock, 3000, patient(1)).await;
    let state = mock.state.lock().unwrap();
    assert!(
        state.duplicates > 0,
        "lost answers were retried as duplicates"
    );
    assert!(
        state.batches.iter().all(|&b| b <= 37),
        "{:?}",
        state.batches
    );
}

#[tokio::test(flavor = "current_thread")]
async fn several_batches_in_flight_keep_the_order() {
    let (endpoint, mock) = start(Faults {
        lose_answer: 10,
        unavailable: 10,
        max_delay_ms: 3,
        ..Faults::default()
    })
    .await;
    send_numbered(&endpoint, &mock, 3000, patient(4)).await;
    let state = mock.state.lock().unwrap();
    assert!(state.gaps > 0, "reordered requests met sequence gaps");
    assert!(state.duplicates > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_in_flight_on_a_multi_thread_runtime() {
    let (endpoint, mock) = start(Faults {
        lose_answer: 5,
        unavailable: 5,
        max_delay_ms: 2,
        ..Faults::default()
    })
    .await;
    send_numbered(&endpoint, &mock, 2000, patient(8)).await;
}

#[tokio::test(flavor = "current_thread")]
async fn linger_groups_records_into_one_batch() {
    // Records handed over within the linger go out as one batch. Whether they were handed over
    // within it is measured: a machine too slow for a 200 ms linger gets a longer one.
    for unit in [1, 2, 4, 8] {
        let linger = Duration::from_millis(200 * unit);
        let (endpoint, mock) = start(Faults::default()).await;
        let producer = Producer::new(
            client(&endpoint),
            "/p",
            ProducerConfig {
                linger,
                ..ProducerConfig::default()
            },
        )
        .unwrap();
        let started = std::time::Instant::now();
        let mut handles = Vec::new();
        for i in 0..10 {
            handles.push(producer.send(format!("{i}")).await.unwrap());
        }
        let handed_over = started.elapsed();
        let first = handles.remove(0);
        assert_eq!(first.await.unwrap(), 0);
        if handed_over >= linger {
            eprintln!("handing 10 records over took {handed_over:?}, the linger is {linger:?}");
            producer.close().await.unwrap();
            continue;
        }
        assert_eq!(mock.state.lock().unwrap().batches, vec![10]);
        for handle in handles {
            handle.await.unwrap();
        }
        producer.close().await.unwrap();
        return;
    }
    panic!("handing 10 records over took longer than every linger tried");
}

#[tokio::test(flavor = "current_thread")]
async fn flush_sends_a_partly_filled_batch_without_waiting_for_the_linger() {
    let (endpoint, mock) = start(Faults::default()).await;
    // A linger far longer than any scheduling delay: a flush that returns before it did not
    // wait for it, however busy the machine is.
    let linger = Duration::from_secs(120);
    let producer = Producer::new(
        client(&endpoint),
        "/p",
        ProducerConfig {
            linger,
            ..ProducerConfig::default()
        },
    )
    .unwrap();
    let handle = producer.send("x").await.unwrap();
    let started = std::time::Instant::now();
    producer.flush().await.unwrap();
    assert!(started.elapsed() < linger);
    assert_eq!(handle.await.unwrap(), 0);
    assert_eq!(mock.state.lock().unwrap().batches, vec![1]);
    producer.close().await.unwrap();
}

#[tokio::test(flavor = "current_thread")]
async fn batches_respect_the_byte_limit() {
    let (endpoint, mock) = start(Faults::default()).await;
    let producer = Producer::new(
        client(&endpoint),
        "/p",
        ProducerConfig {
            max_batch_bytes: 1000,
            ..ProducerConfig::default()
        },
    )
    .unwrap();
    for _ in 0..10 {
        producer.send(vec![7u8; 292]).await.unwrap(); // 300 bytes each with framing
    }
    producer.send(vec![1u8; 5000]).await.unwrap(); // alone: larger than a batch
    producer.close().await.unwrap();
    assert_eq!(
        mock.state.lock().unwrap().batches,
        vec![3, 3, 3, 1, 1],
        "3 records fill 900 of 1000 bytes"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn fencing_poisons_the_session() {
    let (endpoint, mock) = start(Faults::default()).await;
    let producer = Producer::new(client(&endpoint), "/p", ProducerConfig::default()).unwrap();
    assert_eq!(producer.send("a").await.unwrap().await.unwrap(), 0);
    mock.fenced.store(true, Ordering::SeqCst);
    let err = producer.send("b").await.unwrap().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::StaleEpoch, "{err}");
    assert!(err.to_string().contains("current epoch 99"), "{err}");
    // Later calls fail with the same cause, without a request.
    let requests = mock.state.lock().unwrap().requests;
    assert_eq!(
        producer.send("c").await.unwrap_err().kind(),
        ErrorKind::StaleEpoch
    );
    assert_eq!(
        producer.flush().await.unwrap_err().kind(),
        ErrorKind::StaleEpoch
    );
    assert_eq!(producer.error().unwrap().kind(), ErrorKind::StaleEpoch);
    assert_eq!(
        producer.close().await.unwrap_err().kind(),
        ErrorKind::StaleEpoch
    );
    assert_eq!(mock.state.lock().unwrap().requests, requests);
    assert_eq!(mock.records(), vec![Bytes::from("a")]);
}

#[tokio::test(flavor = "current_thread")]
async fn attempts_are_bounded_then_the_session_is_poisoned() {
    let (endpoint, mock) = start(Faults {
        unavailable: 100,
        ..Faults::default()
    })
    .await;
    let producer = Producer::new(
        client(&endpoint),
        "/p",
        ProducerConfig {
            max_attempts: 5,
            ..ProducerConfig::default()
        },
    )
    .unwrap();
    let first = producer.send("a").await.unwrap();
    let second = producer.send("b").await.unwrap();
    let err = first.await.unwrap_err();
    assert_eq!(err.status(), Some(503), "{err}");
    assert_eq!(second.await.unwrap_err().status(), Some(503));
    assert_eq!(mock.state.lock().unwrap().requests, 5);
    assert_eq!(producer.send("c").await.unwrap_err().status(), Some(503));
}

#[tokio::test(flavor = "current_thread")]
async fn the_delivery_timeout_bounds_a_batch() {
    // Nothing listens: every attempt is a refused connection.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    let producer = Producer::new(
        client(&endpoint),
        "/p",
        ProducerConfig {
            max_attempts: u32::MAX,
            max_backoff: Duration::from_millis(20),
            delivery_timeout: Duration::from_millis(300),
            ..ProducerConfig::default()
        },
    )
    .unwrap();
    let started = std::time::Instant::now();
    let err = producer.send("a").await.unwrap().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Transport, "{err}");
    assert!(err.to_string().contains("delivery timeout"), "{err}");
    // Without the timeout it would retry forever: any bound shows it, this one is far beyond
    // what a busy machine adds to 300 ms.
    assert!(started.elapsed() < Duration::from_secs(60));
}

#[tokio::test(flavor = "current_thread")]
async fn a_full_buffer_makes_send_wait() {
    let (endpoint, mock) = start(Faults::default()).await;
    mock.hold.store(true, Ordering::SeqCst);
    let producer = Producer::new(
        client(&endpoint),
        "/p",
        ProducerConfig {
            max_buffered_bytes: 1000,
            linger: Duration::ZERO,
            ..ProducerConfig::default()
        },
    )
    .unwrap();
    // 400 + 8 bytes each: two fit, the third must wait for the first acknowledgements.
    let a = producer.send(vec![0u8; 400]).await.unwrap();
    let b = producer.send(vec![1u8; 400]).await.unwrap();
    let blocked = tokio::time::timeout(Duration::from_millis(200), producer.send(vec![2u8; 400]));
    assert!(blocked.await.is_err(), "the third send waits for room");
    mock.hold.store(false, Ordering::SeqCst);
    mock.release.notify_waiters();
    let c = tokio::time::timeout(Duration::from_secs(10), producer.send(vec![2u8; 400]))
        .await
        .expect("room after the acknowledgements")
        .unwrap();
    assert_eq!(a.await.unwrap(), 0);
    assert_eq!(b.await.unwrap(), 1);
    assert_eq!(c.await.unwrap(), 2);
    producer.close().await.unwrap();
}

#[tokio::test(flavor = "current_thread")]
async fn duplicate_offsets_account_for_later_batches() {
    // The first answer of every batch is lost while 2 batches are in flight: retries come
    // back as duplicates, possibly after a later batch was applied.
    let (endpoint, mock) = start(Faults {
        lose_answer: 50,
        unavailable: 0,
        max_delay_ms: 2,
        ..Faults::default()
    })
    .await;
    send_numbered(
        &endpoint,
        &mock,
        500,
        ProducerConfig {
            max_batch_records: 7,
            ..patient(2)
        },
    )
    .await;
}

#[tokio::test(flavor = "current_thread")]
async fn retry_after_is_honoured() {
    let (endpoint, mock) = start(Faults {
        overloaded: 1,
        ..Faults::default()
    })
    .await;
    let producer = Producer::new(client(&endpoint), "/p", ProducerConfig::default()).unwrap();
    let started = std::time::Instant::now();
    assert_eq!(producer.send("a").await.unwrap().await.unwrap(), 0);
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "waited {:?}",
        started.elapsed()
    );
    assert_eq!(mock.state.lock().unwrap().requests, 2);
    producer.close().await.unwrap();
}

#[tokio::test(flavor = "current_thread")]
async fn a_bad_request_fails_for_good() {
    let (endpoint, mock) = start(Faults {
        reject: true,
        ..Faults::default()
    })
    .await;
    let producer = Producer::new(
        client(&endpoint),
        "/p",
        ProducerConfig {
            max_in_flight: 4,
            max_batch_records: 1,
            ..ProducerConfig::default()
        },
    )
    .unwrap();
    let mut handles = Vec::new();
    for i in 0..8 {
        match producer.send(format!("{i}")).await {
            Ok(handle) => handles.push(handle),
            Err(err) => assert_eq!(err.status(), Some(400)),
        }
    }
    for handle in handles {
        assert_eq!(handle.await.unwrap_err().status(), Some(400));
    }
    assert_eq!(producer.close().await.unwrap_err().status(), Some(400));
    // Batch 0 is refused once; later batches at most once more each after waiting for it.
    assert!(mock.state.lock().unwrap().requests <= 8, "no retry storm");
}

#[tokio::test(flavor = "current_thread")]
async fn ds_clients_and_bad_configs_are_refused() {
    let mut config = ClientConfig::new("http://127.0.0.1:1");
    config.protocol = pico_client::Protocol::DurableStreams;
    let err = Producer::new(
        Client::new(config).unwrap(),
        "/p",
        ProducerConfig::default(),
    )
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported);
    let err = Producer::new(
        client("http://127.0.0.1:1"),
        "/p",
        ProducerConfig {
            max_in_flight: 0,
            ..ProducerConfig::default()
        },
    )
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
}

#[test]
fn new_outside_a_runtime_is_an_error() {
    let err = Producer::new(
        client("http://127.0.0.1:1"),
        "/p",
        ProducerConfig::default(),
    )
    .unwrap_err();
    assert!(err.to_string().contains("tokio runtime"), "{err}");
}
