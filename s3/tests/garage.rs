//! The `s3://` backend against a real S3 server (Garage in CI: `scripts/garage-up.sh`).
//!
//! Needs `PICOMQ_S3_ENDPOINT` (e.g. `http://127.0.0.1:3900`): every test is `#[ignore]`d (run
//! them with `--include-ignored`) and skips with a note without it, or fails under `CI=true`
//! (`pico_testkit`), so `cargo test` says what it did not run on a machine without Garage. Also read:
//! `PICOMQ_S3_BUCKET` (default `segments`), `PICOMQ_S3_REGION` (default `garage`) and the
//! standard `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY`. Every test works under its own key
//! prefix and removes its objects, so tests run in parallel and repeatedly on one bucket.

use std::time::Duration;
use std::time::Instant;
use std::time::SystemTime;

use bytes::Bytes;
use futures_lite::future::block_on;
use pico_s3::ObjectStore;
use pico_s3::ObjectStoreOptions;
use pico_s3::S3Credentials;
use pico_s3::S3Options;
use pico_s3::StorageUri;
use pico_s3::StoreError;
use pico_testkit::garage::{bucket, OwnGarage};

/// The endpoint, or `None` (and a note) when the tests should skip.
fn endpoint(test: &str) -> Option<String> {
    pico_testkit::require(test, &pico_testkit::GARAGE).map(|mut values| values.remove(0))
}

fn uri_for(endpoint: &str, bucket: &str) -> StorageUri {
    let region = std::env::var("PICOMQ_S3_REGION").unwrap_or_else(|_| "garage".to_string());
    StorageUri::parse(&format!(
        "-3@s3://{bucket}?region={region}&endpoint={endpoint}&pathStyle=true"
    ))
    .unwrap()
}

fn open(endpoint: &str, s3: S3Options) -> ObjectStore {
    let options = ObjectStoreOptions {
        s3,
        ..Default::default()
    };
    ObjectStore::open_with(&uri_for(endpoint, &bucket()), options).expect("open the s3 bucket")
}

/// A prefix no other test (or earlier run) uses.
fn unique_prefix(test: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("tests/{test}-{}-{nanos}/", std::process::id())
}

fn wait<T>(reply: pico_s3::Reply<T>) -> Result<T, StoreError> {
    block_on(reply).expect("the upload thread answers every request")
}

/// Deletes everything under `prefix`.
fn clean(store: &ObjectStore, prefix: &str) {
    let replies: Vec<_> = wait(store.list(prefix))
        .unwrap()
        .into_iter()
        .map(|(key, _)| store.delete(&key))
        .collect();
    replies.into_iter().for_each(|reply| wait(reply).unwrap());
    assert_eq!(wait(store.list(prefix)).unwrap(), vec![]);
}

fn patterned(len: usize, seed: u64) -> Bytes {
    let mut state = seed | 1;
    let mut data = Vec::with_capacity(len);
    while data.len() < len {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        data.extend_from_slice(&state.to_le_bytes());
    }
    data.truncate(len);
    Bytes::from(data)
}

#[ignore = "needs Garage: PICOMQ_S3_ENDPOINT, AWS_* (scripts/garage-up.sh)"]
#[test]
fn put_get_range_delete_list_round_trips() {
    let Some(endpoint) = endpoint("round_trips") else {
        return;
    };
    let store = open(&endpoint, S3Options::default());
    let p = unique_prefix("round-trips");
    let key = |name: &str| format!("{p}{name}");

    wait(store.put(
        &key("segments/0002.seg"),
        Bytes::from_static(b"second segment"),
    ))
    .unwrap();
    wait(store.put(&key("segments/0001.seg"), Bytes::from_static(b"0123456789"))).unwrap();
    wait(store.put(&key("wal/node-1/a"), Bytes::new())).unwrap();
    wait(store.put(&key("top"), Bytes::from_static(b"t"))).unwrap();

    assert_eq!(
        wait(store.get(&key("segments/0001.seg"), usize::MAX)).unwrap(),
        "0123456789"
    );
    assert_eq!(
        wait(store.get(&key("wal/node-1/a"), usize::MAX)).unwrap(),
        ""
    );
    let range = |start, end| wait(store.get_range(&key("segments/0001.seg"), start, end));
    assert_eq!(range(2, 5).unwrap(), "234");
    assert_eq!(range(0, 10).unwrap(), "0123456789");
    assert_eq!(range(9, 10).unwrap(), "9");
    assert_eq!(range(10, 10).unwrap(), "");
    assert_eq!(range(0, 0).unwrap(), "");
    for (start, end) in [(5, 11), (10, 11), (12, 20), (11, 11)] {
        match range(start, end) {
            Err(StoreError::Short { size, .. }) => assert_eq!(size, 10, "{start}..{end}"),
            other => panic!("{start}..{end} gave {other:?}"),
        }
    }
    assert!(matches!(range(5, 4), Err(StoreError::Io(_))));
    // Ranges of the empty object.
    assert_eq!(
        wait(store.get_range(&key("wal/node-1/a"), 0, 0)).unwrap(),
        ""
    );
    assert!(matches!(
        wait(store.get_range(&key("wal/node-1/a"), 0, 1)),
        Err(StoreError::Short { size: 0, .. })
    ));

    let missing = key("segments/none");
    assert!(
        matches!(wait(store.get(&missing, usize::MAX)), Err(StoreError::NotFound(k)) if k == missing)
    );
    assert!(matches!(
        wait(store.get_range(&missing, 0, 1)),
        Err(StoreError::NotFound(_))
    ));
    assert!(matches!(
        wait(store.get_range(&missing, 0, 0)),
        Err(StoreError::NotFound(_))
    ));
    assert!(matches!(
        wait(store.get(&key("segments"), usize::MAX)),
        Err(StoreError::NotFound(_))
    ));

    // Overwrite replaces the whole object.
    wait(store.put(&key("segments/0002.seg"), Bytes::from_static(b"v2"))).unwrap();
    assert_eq!(
        wait(store.get(&key("segments/0002.seg"), usize::MAX)).unwrap(),
        "v2"
    );

    let expected: Vec<(String, u64)> = [
        ("segments/0001.seg", 10),
        ("segments/0002.seg", 2),
        ("top", 1),
        ("wal/node-1/a", 0),
    ]
    .iter()
    .map(|(name, size)| (key(name), *size))
    .collect();
    assert_eq!(wait(store.list(&p)).unwrap(), expected);
    assert_eq!(wait(store.list(&key("segments/"))).unwrap(), expected[..2]);
    assert_eq!(
        wait(store.list(&key("segments/0001"))).unwrap(),
        expected[..1]
    );
    assert_eq!(wait(store.list(&key("seg"))).unwrap(), expected[..2]);
    assert_eq!(wait(store.list(&key("w"))).unwrap(), expected[3..]);
    assert_eq!(wait(store.list(&key("nothing/"))).unwrap(), vec![]);

    wait(store.delete(&key("segments/0001.seg"))).unwrap();
    wait(store.delete(&key("segments/0001.seg"))).unwrap(); // missing is fine
    wait(store.delete(&key("never/existed"))).unwrap();
    assert!(matches!(
        wait(store.get(&key("segments/0001.seg"), usize::MAX)),
        Err(StoreError::NotFound(_))
    ));
    let keys: Vec<_> = wait(store.list(&p))
        .unwrap()
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    assert_eq!(
        keys,
        [key("segments/0002.seg"), key("top"), key("wal/node-1/a")]
    );
    clean(&store, &p);
}

#[ignore = "needs Garage: PICOMQ_S3_ENDPOINT, AWS_* (scripts/garage-up.sh)"]
#[test]
fn multipart_put_of_40_mib_reads_back() {
    let Some(endpoint) = endpoint("multipart") else {
        return;
    };
    let store = open(&endpoint, S3Options::default());
    let p = unique_prefix("multipart");
    let key = format!("{p}big.seg");
    let data = patterned(40 << 20, 7);
    let started = Instant::now();
    wait(store.put(&key, data.clone())).unwrap();
    let put = started.elapsed();
    let started = Instant::now();
    let back = wait(store.get(&key, usize::MAX)).unwrap();
    let get = started.elapsed();
    assert_eq!(back.len(), data.len());
    assert!(back == data, "the 40 MiB object came back different");
    // A range across the 8 MiB part boundary, and the last bytes.
    let boundary = 8u64 << 20;
    assert_eq!(
        wait(store.get_range(&key, boundary - 100, boundary + 100)).unwrap(),
        data.slice((boundary - 100) as usize..(boundary + 100) as usize)
    );
    let len = data.len() as u64;
    assert_eq!(
        wait(store.get_range(&key, len - 5, len)).unwrap(),
        data.slice(data.len() - 5..)
    );
    assert_eq!(wait(store.list(&p)).unwrap(), vec![(key.clone(), len)]);
    eprintln!(
        "multipart: PUT 40 MiB in {:.0} ms ({:.0} MiB/s), GET in {:.0} ms",
        put.as_secs_f64() * 1000.0,
        40.0 / put.as_secs_f64(),
        get.as_secs_f64() * 1000.0
    );
    // Just above the threshold (two parts, the last one small) and just below it (one PUT).
    let threshold = S3Options::default().multipart_threshold;
    for (name, len) in [("above", threshold + 1), ("at", threshold)] {
        let key = format!("{p}{name}");
        let data = patterned(len, len as u64);
        wait(store.put(&key, data.clone())).unwrap();
        assert!(wait(store.get(&key, usize::MAX)).unwrap() == data, "{name}");
    }
    clean(&store, &p);
}

#[ignore = "needs Garage: PICOMQ_S3_ENDPOINT, AWS_* (scripts/garage-up.sh)"]
#[test]
fn keys_with_spaces_unicode_and_punctuation() {
    let Some(endpoint) = endpoint("odd_keys") else {
        return;
    };
    let store = open(&endpoint, S3Options::default());
    let p = unique_prefix("odd keys");
    let names = [
        "a b/c d.seg",
        "ünïcödé/日本語 ключ",
        "plus+equals=amp&q?hash#pct%20",
        "quote'dq\"(paren)!*$,;:@~",
        "tab\there",
        "emoji 🦀",
    ];
    for (index, name) in names.iter().enumerate() {
        let key = format!("{p}{name}");
        wait(store.put(&key, Bytes::from(format!("value {index}")))).unwrap();
        assert_eq!(
            wait(store.get(&key, usize::MAX)).unwrap(),
            format!("value {index}"),
            "{key}"
        );
        assert_eq!(wait(store.get_range(&key, 0, 5)).unwrap(), "value", "{key}");
    }
    let mut expected: Vec<(String, u64)> = names
        .iter()
        .enumerate()
        .map(|(index, name)| (format!("{p}{name}"), format!("value {index}").len() as u64))
        .collect();
    expected.sort();
    assert_eq!(wait(store.list(&p)).unwrap(), expected);
    // A prefix with a space and non-ASCII in it.
    assert_eq!(
        wait(store.list(&format!("{p}ünïcödé/日本"))).unwrap(),
        vec![(format!("{p}ünïcödé/日本語 ключ"), 7)]
    );
    for name in names {
        wait(store.delete(&format!("{p}{name}"))).unwrap();
    }
    assert_eq!(wait(store.list(&p)).unwrap(), vec![]);
}

#[ignore = "needs Garage: PICOMQ_S3_ENDPOINT, AWS_* (scripts/garage-up.sh)"]
#[test]
fn list_pagination_with_small_pages() {
    let Some(endpoint) = endpoint("pagination") else {
        return;
    };
    let store = open(
        &endpoint,
        S3Options {
            list_page_size: 7,
            ..Default::default()
        },
    );
    let p = unique_prefix("pages");
    let replies: Vec<_> = (0..45)
        .map(|i| store.put(&format!("{p}k{i:03}"), Bytes::from(vec![b'x'; i])))
        .collect();
    replies.into_iter().for_each(|reply| wait(reply).unwrap());
    let listed = wait(store.list(&p)).unwrap();
    let expected: Vec<_> = (0..45).map(|i| (format!("{p}k{i:03}"), i as u64)).collect();
    assert_eq!(listed, expected, "45 keys over 7 pages");
    // A prefix that matches exactly one page's worth, and one that ends on a page boundary.
    let tens: Vec<_> = (10..20)
        .map(|i| (format!("{p}k{i:03}"), i as u64))
        .collect();
    assert_eq!(wait(store.list(&format!("{p}k01"))).unwrap(), tens);
    clean(&store, &p);
}

fn wrong_secret() -> S3Credentials {
    S3Credentials {
        access_key_id: std::env::var("AWS_ACCESS_KEY_ID").unwrap_or_default(),
        secret_access_key: "0000000000000000000000000000000000000000000000000000000000000000"
            .to_string(),
        session_token: None,
    }
}

#[ignore = "needs Garage: PICOMQ_S3_ENDPOINT, AWS_* (scripts/garage-up.sh)"]
#[test]
fn a_wrong_secret_fails_fast_with_a_clear_error() {
    let Some(endpoint) = endpoint("wrong_secret") else {
        return;
    };
    // At open: the probe names the cause, and nothing is retried.
    let started = Instant::now();
    let opened = ObjectStore::open_with(
        &uri_for(&endpoint, &bucket()),
        ObjectStoreOptions {
            s3: S3Options {
                credentials: Some(wrong_secret()),
                ..Default::default()
            },
            ..Default::default()
        },
    );
    let elapsed = started.elapsed();
    match opened {
        Err(StoreError::Io(message)) => {
            assert!(
                message.contains("access denied: check AWS_SECRET_ACCESS_KEY"),
                "{message}"
            );
            assert!(message.contains("403"), "{message}");
            assert!(!message.contains("gave up"), "403 was retried: {message}");
            assert!(!message.contains('\n'), "one line: {message}");
            eprintln!("wrong secret at open ({elapsed:?}): {message}");
        }
        Err(other) => panic!("{other:?}"),
        Ok(_) => panic!("opened with a wrong secret"),
    }
    // No retry storm: the message says the 403 was not retried (`gave up` is absent), which
    // no machine's pace changes; the time is only reported above.

    // Without the probe, every operation gives the same answer, once.
    let store = open(
        &endpoint,
        S3Options {
            credentials: Some(wrong_secret()),
            probe_at_open: false,
            ..Default::default()
        },
    );
    let started = Instant::now();
    let p = unique_prefix("wrong-secret");
    let outcomes = [
        wait(store.put(&format!("{p}k"), Bytes::from_static(b"v"))).map(drop),
        wait(store.get(&format!("{p}k"), usize::MAX)).map(drop),
        wait(store.get_range(&format!("{p}k"), 0, 1)).map(drop),
        wait(store.delete(&format!("{p}k"))),
        wait(store.list(&p)).map(drop),
        wait(store.put(&format!("{p}big"), patterned(17 << 20, 1))).map(drop),
    ];
    for outcome in outcomes {
        match outcome {
            Err(StoreError::Io(message)) => {
                assert!(message.contains("access denied"), "{message}");
                assert!(!message.contains("gave up"), "{message}");
            }
            other => panic!("{other:?}"),
        }
    }
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
}

#[ignore = "needs Garage: PICOMQ_S3_ENDPOINT, AWS_* (scripts/garage-up.sh)"]
#[test]
fn a_missing_bucket_or_a_dead_endpoint_fails_at_open() {
    let Some(endpoint) = endpoint("open_errors") else {
        return;
    };
    match ObjectStore::open(&uri_for(&endpoint, "no-such-bucket-picomq")) {
        Err(StoreError::Io(message)) => {
            assert!(message.contains("does not exist"), "{message}");
            assert!(message.contains("no-such-bucket-picomq"), "{message}");
        }
        Err(other) => panic!("{other:?}"),
        Ok(_) => panic!("opened a missing bucket"),
    }
    // Nothing listens on port 1: connection errors are retried, within the deadline.
    let started = Instant::now();
    let dead = ObjectStore::open_with(
        &uri_for("http://127.0.0.1:1", &bucket()),
        ObjectStoreOptions {
            s3: S3Options {
                max_attempts: 4,
                deadline: Duration::from_secs(3),
                ..Default::default()
            },
            ..Default::default()
        },
    );
    match dead {
        Err(StoreError::Io(message)) => {
            assert!(message.contains("cannot connect"), "{message}");
            assert!(message.contains("gave up after"), "{message}");
        }
        Err(other) => panic!("{other:?}"),
        Ok(_) => panic!("opened a dead endpoint"),
    }
    // It ends (the 3 s deadline plus scheduling, far below this bound on a busy machine).
    assert!(started.elapsed() < Duration::from_secs(60));
}

/// Not a test of speed (nothing is asserted): prints PUT and GET latency percentiles of small
/// objects, one at a time, for the record.
#[ignore = "needs Garage: PICOMQ_S3_ENDPOINT, AWS_* (scripts/garage-up.sh)"]
#[test]
fn put_latency_for_the_record() {
    let Some(endpoint) = endpoint("latency") else {
        return;
    };
    let store = open(&endpoint, S3Options::default());
    let p = unique_prefix("latency");
    for (label, size, rounds) in [
        ("4 KiB", 4 << 10, 30),
        ("1 MiB", 1 << 20, 30),
        ("8 MiB", 8 << 20, 10),
    ] {
        let data = patterned(size, 3);
        let mut puts = Vec::new();
        let mut gets = Vec::new();
        for i in 0..rounds {
            let key = format!("{p}{size}-{i}");
            let started = Instant::now();
            wait(store.put(&key, data.clone())).unwrap();
            puts.push(started.elapsed());
            let started = Instant::now();
            assert_eq!(wait(store.get(&key, usize::MAX)).unwrap().len(), size);
            gets.push(started.elapsed());
        }
        puts.sort();
        gets.sort();
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        let at = |samples: &[Duration], q: f64| ms(samples[((rounds - 1) as f64 * q) as usize]);
        eprintln!(
            "latency {label} ({rounds} rounds): PUT p50 {:.1} ms p90 {:.1} ms max {:.1} ms; GET p50 {:.1} ms p90 {:.1} ms",
            at(&puts, 0.5),
            at(&puts, 0.9),
            at(&puts, 1.0),
            at(&gets, 0.5),
            at(&gets, 0.9)
        );
    }
    clean(&store, &p);
}

/// The store goes away mid-run (kill -9) and comes back: a put issued while it is down is
/// retried until it is back, and what was stored before survives.
#[ignore = "needs Garage: PICOMQ_S3_ENDPOINT, AWS_* (scripts/garage-up.sh)"]
#[test]
fn a_put_rides_out_a_garage_restart() {
    if endpoint("garage_restart").is_none() {
        return;
    }
    let Some(garage) = OwnGarage::start("garage_restart") else {
        return;
    };
    let store = open(
        &garage.endpoint(),
        S3Options {
            deadline: Duration::from_secs(60),
            max_attempts: 200,
            max_backoff: Duration::from_millis(300),
            ..Default::default()
        },
    );
    wait(store.put("restart/before", Bytes::from_static(b"before"))).unwrap();
    garage.kill();
    let started = Instant::now();
    let pending = store.put("restart/during", Bytes::from_static(b"during"));
    std::thread::sleep(Duration::from_millis(800));
    garage.up();
    wait(pending).unwrap();
    eprintln!(
        "put across a garage restart answered after {:?}",
        started.elapsed()
    );
    assert_eq!(
        wait(store.get("restart/before", usize::MAX)).unwrap(),
        "before"
    );
    assert_eq!(
        wait(store.get("restart/during", usize::MAX)).unwrap(),
        "during"
    );

    // Down for longer than the deadline: a clear error, in bounded time.
    garage.kill();
    let short = open_unprobed(&garage.endpoint(), Duration::from_secs(2));
    let started = Instant::now();
    match wait(short.put("restart/late", Bytes::from_static(b"x"))) {
        Err(StoreError::Io(message)) => {
            assert!(message.contains("cannot connect"), "{message}");
            assert!(message.contains("gave up after"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    // It ends (the 2 s deadline plus scheduling, far below this bound on a busy machine).
    assert!(started.elapsed() < Duration::from_secs(60));
}

fn open_unprobed(endpoint: &str, deadline: Duration) -> ObjectStore {
    open(
        endpoint,
        S3Options {
            deadline,
            probe_at_open: false,
            ..Default::default()
        },
    )
}

/// A proxy in front of Garage that hangs up on every third connection after reading the
/// request, and cuts the others after 300 ms: the calls hit by either are retried on fresh
/// connections and succeed.
#[ignore = "needs Garage: PICOMQ_S3_ENDPOINT, AWS_* (scripts/garage-up.sh)"]
#[test]
fn dropped_connections_are_retried() {
    let Some(endpoint) = endpoint("dropped_connections") else {
        return;
    };
    let upstream = endpoint
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_string();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let proxy = format!("http://{}", listener.local_addr().unwrap());
    let dropped = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = dropped.clone();
    std::thread::spawn(move || {
        for (index, client) in listener.incoming().enumerate() {
            let Ok(client) = client else { return };
            if index % 3 == 1 {
                // Read the request, then hang up without an answer.
                counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let mut buffer = [0u8; 1024];
                let _ = std::io::Read::read(&mut &client, &mut buffer);
                drop(client);
                continue;
            }
            let server = std::net::TcpStream::connect(&upstream).unwrap();
            // Proxied connections live 300 ms, so the client keeps needing new ones.
            let (c0, s0) = (client.try_clone().unwrap(), server.try_clone().unwrap());
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(300));
                let _ = c0.shutdown(std::net::Shutdown::Both);
                let _ = s0.shutdown(std::net::Shutdown::Both);
            });
            let (mut c1, mut s1) = (client.try_clone().unwrap(), server.try_clone().unwrap());
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut c1, &mut s1);
                let _ = s1.shutdown(std::net::Shutdown::Write);
            });
            std::thread::spawn(move || {
                let (mut server, mut client) = (server, client);
                let _ = std::io::copy(&mut server, &mut client);
                let _ = client.shutdown(std::net::Shutdown::Write);
            });
        }
    });
    let store = open(&proxy, S3Options::default());
    let p = unique_prefix("dropped");
    for i in 0..10 {
        std::thread::sleep(Duration::from_millis(120));
        let key = format!("{p}k{i}");
        wait(store.put(&key, Bytes::from(vec![i as u8; 1000]))).unwrap();
        assert_eq!(wait(store.get(&key, usize::MAX)).unwrap().len(), 1000);
    }
    clean(&store, &p);
    let dropped = dropped.load(std::sync::atomic::Ordering::SeqCst);
    eprintln!("dropped connections: {dropped} hung up, all retried");
    assert!(dropped >= 1);
}
