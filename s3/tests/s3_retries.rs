//! The `s3://` backend against a scripted HTTP server on a real socket: which answers are
//! retried and how often, and what goes on the wire (signing headers, `content-length: 0`,
//! ranges, encoded keys). Needs no S3 server; Garage-backed tests are in `garage.rs`.

use std::io::BufRead;
use std::io::BufReader;
use std::io::Read;
use std::io::Write;
use std::net::TcpListener;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;
use std::time::Instant;

use bytes::Bytes;
use futures_lite::future::block_on;
use pico_s3::ObjectStore;
use pico_s3::ObjectStoreOptions;
use pico_s3::S3Credentials;
use pico_s3::S3Options;
use pico_s3::StorageUri;
use pico_s3::StoreError;

/// One request as the server saw it.
#[derive(Clone, Debug)]
struct Seen {
    method: String,
    target: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Seen {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_str())
    }
}

/// (status, extra headers, body) for each request in turn; the last one repeats.
type Script = Vec<(u16, Vec<(&'static str, String)>, String)>;

/// Serves `script` on a fresh port, one connection per request (`Connection: close`).
fn serve(script: Script) -> (String, Arc<Mutex<Vec<Seen>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    std::thread::spawn(move || {
        for (index, stream) in listener.incoming().enumerate() {
            let Ok(mut stream) = stream else { return };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                continue;
            }
            let mut parts = line.split_whitespace();
            let method = parts.next().unwrap_or_default().to_string();
            let target = parts.next().unwrap_or_default().to_string();
            let mut headers = Vec::new();
            loop {
                let mut header = String::new();
                reader.read_line(&mut header).unwrap();
                let header = header.trim_end();
                if header.is_empty() {
                    break;
                }
                let (name, value) = header.split_once(':').unwrap();
                headers.push((name.to_ascii_lowercase(), value.trim().to_string()));
            }
            let length: usize = headers
                .iter()
                .find(|(name, _)| name == "content-length")
                .map(|(_, value)| value.parse().unwrap())
                .unwrap_or(0);
            let mut body = vec![0; length];
            reader.read_exact(&mut body).unwrap();
            log.lock().unwrap().push(Seen {
                method,
                target,
                headers,
                body,
            });
            let (status, extra, body) = &script[index.min(script.len() - 1)];
            let mut answer = format!(
                "HTTP/1.1 {status} X\r\nContent-Length: {}\r\nConnection: close\r\n",
                body.len()
            );
            for (name, value) in extra {
                answer.push_str(&format!("{name}: {value}\r\n"));
            }
            answer.push_str("\r\n");
            answer.push_str(body);
            let _ = stream.write_all(answer.as_bytes());
        }
    });
    (endpoint, seen)
}

fn open(endpoint: &str, s3: S3Options) -> ObjectStore {
    try_open(
        endpoint,
        S3Options {
            probe_at_open: false,
            ..s3
        },
    )
    .unwrap()
}

/// Opens `endpoint` with the test's credentials and short backoffs, as `s3` says otherwise.
fn try_open(endpoint: &str, s3: S3Options) -> Result<ObjectStore, StoreError> {
    let uri = StorageUri::parse(&format!(
        "-3@s3://bkt?region=test-1&endpoint={endpoint}&pathStyle=true"
    ))
    .unwrap();
    ObjectStore::open_with(
        &uri,
        ObjectStoreOptions {
            s3: S3Options {
                credentials: Some(S3Credentials {
                    access_key_id: "AKTEST".into(),
                    secret_access_key: "secret".into(),
                    session_token: Some("session".into()),
                }),
                base_backoff: Duration::from_millis(5),
                // Short backoffs keep these tests quick, unless the test sets its own cap.
                max_backoff: if s3.max_backoff == S3Options::default().max_backoff {
                    Duration::from_millis(20)
                } else {
                    s3.max_backoff
                },
                ..s3
            },
            ..Default::default()
        },
    )
}

fn wait<T>(reply: pico_s3::Reply<T>) -> Result<T, StoreError> {
    block_on(reply).expect("the upload thread answers every request")
}

fn error(code: &str) -> String {
    format!("<?xml version=\"1.0\"?><Error><Code>{code}</Code><Message>m</Message></Error>")
}

#[test]
fn transient_answers_are_retried_until_success() {
    let (endpoint, seen) = serve(vec![
        (503, vec![], error("SlowDown")),
        (500, vec![], error("InternalError")),
        (429, vec![], String::new()),
        (200, vec![], String::new()),
    ]);
    let store = open(&endpoint, S3Options::default());
    wait(store.put("a b/ü", Bytes::from_static(b"data"))).unwrap();
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 4, "three retries then success");
    for request in seen.iter() {
        assert_eq!(request.method, "PUT");
        assert_eq!(request.target, "/bkt/a%20b/%C3%BC");
        assert_eq!(request.body, b"data");
        assert_eq!(
            request.header("x-amz-content-sha256"),
            Some("3a6eb0790f39ac87c94f3856b2dd2c5d110e6811602261a9a923d3bb23adc8b7")
        );
        assert_eq!(request.header("x-amz-security-token"), Some("session"));
        assert_eq!(request.header("host"), Some(&endpoint["http://".len()..]));
        let authorization = request.header("authorization").unwrap();
        assert!(
            authorization.starts_with("AWS4-HMAC-SHA256 Credential=AKTEST/")
                && authorization.contains("/test-1/s3/aws4_request, SignedHeaders=host;x-amz-content-sha256;x-amz-date;x-amz-security-token, Signature="),
            "{authorization}"
        );
    }
}

#[test]
fn retry_after_is_honoured_up_to_the_backoff_cap() {
    let (endpoint, seen) = serve(vec![
        (
            503,
            vec![("Retry-After", "1".to_string())],
            error("SlowDown"),
        ),
        (200, vec![], String::new()),
    ]);
    let store = open(
        &endpoint,
        S3Options {
            max_backoff: Duration::from_millis(400),
            ..Default::default()
        },
    );
    let started = Instant::now();
    wait(store.put("k", Bytes::from_static(b"v"))).unwrap();
    // Jittered backoff alone would be under 5 ms; Retry-After (1 s, capped to 400 ms) wins.
    assert!(
        started.elapsed() >= Duration::from_millis(400),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(seen.lock().unwrap().len(), 2);
}

#[test]
fn forbidden_is_not_retried_and_says_why() {
    let (endpoint, seen) = serve(vec![(403, vec![], error("SignatureDoesNotMatch"))]);
    let store = open(&endpoint, S3Options::default());
    match wait(store.get("k", usize::MAX)) {
        Err(StoreError::Io(message)) => {
            assert!(
                message.contains("access denied: check AWS_SECRET_ACCESS_KEY"),
                "{message}"
            );
            assert!(message.contains("SignatureDoesNotMatch"), "{message}");
            assert!(message.contains("AKTEST"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(seen.lock().unwrap().len(), 1);
}

#[test]
fn retries_are_bounded_by_attempts_and_deadline() {
    let (endpoint, seen) = serve(vec![(500, vec![], error("InternalError"))]);
    let store = open(
        &endpoint,
        S3Options {
            max_attempts: 5,
            ..Default::default()
        },
    );
    match wait(store.delete("k")) {
        Err(StoreError::Io(message)) => {
            assert!(message.contains("gave up after 5 attempts"), "{message}");
            assert!(message.contains("InternalError"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(seen.lock().unwrap().len(), 5);

    // The deadline stops retries before the attempts run out.
    let (endpoint, seen) = serve(vec![(503, vec![], error("SlowDown"))]);
    let store = open(
        &endpoint,
        S3Options {
            max_attempts: 1000,
            deadline: Duration::from_millis(300),
            ..Default::default()
        },
    );
    let started = Instant::now();
    assert!(matches!(wait(store.list("")), Err(StoreError::Io(m)) if m.contains("gave up")));
    // The attempts, not the time, show the deadline stopped it: the time only has to be
    // finite (the 300 ms deadline plus scheduling, far below this bound).
    assert!(started.elapsed() < Duration::from_secs(60));
    let attempts = seen.lock().unwrap().len();
    assert!(attempts > 1 && attempts < 1000, "{attempts}");
}

#[test]
fn empty_bodies_ranges_and_missing_objects() {
    let (endpoint, seen) = serve(vec![
        (200, vec![], String::new()),
        (
            206,
            vec![("Content-Range", "bytes 2-4/10".to_string())],
            "234".to_string(),
        ),
        (404, vec![], error("NoSuchKey")),
        (404, vec![], error("NoSuchKey")),
        (404, vec![], error("NoSuchBucket")),
    ]);
    let store = open(&endpoint, S3Options::default());
    wait(store.put("empty", Bytes::new())).unwrap();
    assert_eq!(wait(store.get_range("k", 2, 5)).unwrap(), "234");
    assert!(
        matches!(wait(store.get("gone", usize::MAX)), Err(StoreError::NotFound(k)) if k == "gone")
    );
    wait(store.delete("gone")).unwrap();
    match wait(store.get("k", usize::MAX)) {
        Err(StoreError::Io(message)) => assert!(message.contains("does not exist"), "{message}"),
        other => panic!("{other:?}"),
    }
    let seen = seen.lock().unwrap();
    assert_eq!(seen[0].header("content-length"), Some("0"));
    assert_eq!(
        seen[0].header("x-amz-content-sha256"),
        Some("e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")
    );
    assert_eq!(seen[1].header("range"), Some("bytes=2-4"));
    assert_eq!(
        seen[1].header("x-amz-content-sha256"),
        Some("UNSIGNED-PAYLOAD")
    );
    assert!(seen[1]
        .header("authorization")
        .unwrap()
        .contains("SignedHeaders=host;range;x-amz-content-sha256;"));
    assert_eq!(seen[3].method, "DELETE");
}

#[test]
fn a_short_range_answer_is_an_error_not_a_short_read() {
    let (endpoint, _) = serve(vec![(
        206,
        vec![("Content-Range", "bytes 5-9/10".to_string())],
        "56789".to_string(),
    )]);
    let store = open(&endpoint, S3Options::default());
    match wait(store.get_range("k", 5, 12)) {
        Err(error @ StoreError::Short { size: 10, .. }) => {
            let message = error.to_string();
            assert!(
                message.contains("past the end of k (10 bytes)"),
                "{message}"
            )
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn list_follows_continuation_tokens() {
    let page = |keys: &[&str], next: Option<&str>| {
        let mut xml = String::from(
            "<?xml version=\"1.0\"?><ListBucketResult><EncodingType>url</EncodingType>",
        );
        for key in keys {
            xml.push_str(&format!(
                "<Contents><Key>{key}</Key><Size>3</Size></Contents>"
            ));
        }
        match next {
            Some(token) => xml.push_str(&format!(
                "<IsTruncated>true</IsTruncated><NextContinuationToken>{token}</NextContinuationToken>"
            )),
            None => xml.push_str("<IsTruncated>false</IsTruncated>"),
        }
        xml.push_str("</ListBucketResult>");
        (200, vec![], xml)
    };
    let (endpoint, seen) = serve(vec![
        page(&["p/a", "p/b%20c"], Some("t/1+=")),
        page(&["p/d"], None),
    ]);
    let store = open(
        &endpoint,
        S3Options {
            list_page_size: 2,
            ..Default::default()
        },
    );
    let listed = wait(store.list("p/")).unwrap();
    let keys: Vec<_> = listed.iter().map(|(key, _)| key.as_str()).collect();
    assert_eq!(keys, ["p/a", "p/b c", "p/d"]);
    let seen = seen.lock().unwrap();
    assert_eq!(
        seen[0].target,
        "/bkt?encoding-type=url&list-type=2&max-keys=2&prefix=p%2F"
    );
    assert_eq!(
        seen[1].target,
        "/bkt?continuation-token=t%2F1%2B%3D&encoding-type=url&list-type=2&max-keys=2&prefix=p%2F"
    );
}

#[test]
fn multipart_uploads_parts_and_aborts_on_failure() {
    let initiate =
        "<InitiateMultipartUploadResult><UploadId>up-1</UploadId></InitiateMultipartUploadResult>"
            .to_string();
    let (endpoint, seen) = serve(vec![
        (200, vec![], initiate.clone()),
        (200, vec![("ETag", "\"e1\"".to_string())], String::new()),
        (200, vec![("ETag", "\"e2\"".to_string())], String::new()),
        (200, vec![], "<CompleteMultipartUploadResult/>".to_string()),
    ]);
    let options = S3Options {
        multipart_threshold: 5 << 20,
        part_size: 5 << 20,
        ..Default::default()
    };
    let store = open(&endpoint, options.clone());
    let data = Bytes::from(vec![7u8; (5 << 20) + 1000]);
    wait(store.put("big", data)).unwrap();
    {
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 4);
        assert_eq!(seen[0].target, "/bkt/big?uploads=");
        let mut parts: Vec<_> = seen[1..3]
            .iter()
            .map(|r| (r.target.clone(), r.body.len()))
            .collect();
        parts.sort();
        assert_eq!(
            parts,
            [
                ("/bkt/big?partNumber=1&uploadId=up-1".to_string(), 5 << 20),
                ("/bkt/big?partNumber=2&uploadId=up-1".to_string(), 1000),
            ]
        );
        assert_eq!(seen[3].target, "/bkt/big?uploadId=up-1");
        let complete = String::from_utf8(seen[3].body.clone()).unwrap();
        assert!(
            complete.contains("<Part><PartNumber>1</PartNumber><ETag>\"e"),
            "{complete}"
        );
        assert!(
            complete.contains("<Part><PartNumber>2</PartNumber>"),
            "{complete}"
        );
    }

    // A part refused for good: the upload is aborted and the put fails.
    let (endpoint, seen) = serve(vec![
        (200, vec![], initiate),
        (400, vec![], error("EntityTooSmall")),
        (400, vec![], error("EntityTooSmall")),
        (204, vec![], String::new()),
    ]);
    let store = open(&endpoint, options);
    match wait(store.put("big", Bytes::from(vec![1u8; (5 << 20) + 1]))) {
        Err(StoreError::Io(message)) => assert!(message.contains("EntityTooSmall"), "{message}"),
        other => panic!("{other:?}"),
    }
    // Give the abort a moment to be logged by the server thread.
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(5) {
        if seen.lock().unwrap().iter().any(|r| r.method == "DELETE") {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let seen = seen.lock().unwrap();
    let abort = seen
        .iter()
        .find(|r| r.method == "DELETE")
        .expect("an abort");
    assert_eq!(abort.target, "/bkt/big?uploadId=up-1");
}

/// Opens `endpoint` with the probe on, a short deadline, and `open_when_unreachable`.
fn open_probed(endpoint: &str, open_when_unreachable: bool) -> Result<ObjectStore, StoreError> {
    try_open(
        endpoint,
        S3Options {
            open_when_unreachable,
            deadline: Duration::from_secs(2),
            ..Default::default()
        },
    )
}

/// A bucket that cannot be reached at open (nothing listens, or only `503`s) opens anyway when
/// the node has data of its own to serve, saying why; without that, or when the store refuses
/// (a wrong secret), the open fails.
#[test]
fn an_unreachable_bucket_opens_only_when_asked_and_a_refusal_never_does() {
    let closed = {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", listener.local_addr().unwrap())
    };
    assert!(open_probed(&closed, false).is_err());
    let store = open_probed(&closed, true).expect("opens while unreachable");
    let why = store
        .unreachable_at_open()
        .expect("says it was unreachable");
    assert!(why.contains("gave up"), "{why}");
    // The requests after the open go out as usual, and fail while nothing answers.
    assert!(wait(store.list("")).is_err());

    let (busy, _) = serve(vec![(503, vec![], error("SlowDown"))]);
    let store = open_probed(&busy, true).expect("opens while only 503s come");
    assert!(store.unreachable_at_open().is_some());

    let (refusing, _) = serve(vec![(403, vec![], error("InvalidAccessKeyId"))]);
    let refused = open_probed(&refusing, true)
        .err()
        .expect("a refusal fails the open");
    assert!(
        refused.to_string().contains("AWS_ACCESS_KEY_ID"),
        "{refused}"
    );

    let (answering, _) = serve(vec![(200, vec![], String::new())]);
    let store = open_probed(&answering, true).unwrap();
    assert_eq!(store.unreachable_at_open(), None);
}

/// What [`serve_endless`] sends after the request.
#[derive(Clone, Copy)]
enum Endless {
    /// `200` with a `Content-Length` of a gigabyte: a store that ignores the range.
    WholeObject,
    /// `206` whose chunked body never ends.
    Partial,
    /// `200` to a listing, a chunked body that never ends.
    Listing,
    /// `500` with a chunked body that never ends.
    Error,
}

const ENDLESS_BYTES_MAX: u64 = 1 << 30;

/// A store that answers every request with a body of up to [`ENDLESS_BYTES_MAX`] bytes (byte
/// `i` is `i % 251`), until the client stops reading; returns the bytes it got out per
/// connection, as the count of what the client could have read.
fn serve_endless(kind: Endless) -> (String, Arc<Mutex<Vec<u64>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let sent = Arc::new(Mutex::new(Vec::new()));
    let log = sent.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().take(16) {
            let Ok(mut stream) = stream else { return };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line.trim_end().is_empty() {
                    break;
                }
            }
            let chunked = "Transfer-Encoding: chunked\r\n";
            let head = match kind {
                Endless::WholeObject => {
                    format!("HTTP/1.1 200 OK\r\nContent-Length: {ENDLESS_BYTES_MAX}\r\n\r\n")
                }
                Endless::Partial => format!(
                    "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes 0-4095/{ENDLESS_BYTES_MAX}\r\n{chunked}\r\n"
                ),
                Endless::Listing => format!("HTTP/1.1 200 OK\r\n{chunked}\r\n"),
                Endless::Error => format!("HTTP/1.1 500 Internal Server Error\r\n{chunked}\r\n"),
            };
            if stream.write_all(head.as_bytes()).is_err() {
                continue;
            }
            let block: Vec<u8> = (0..64 * 1024).map(|i| (i % 251) as u8).collect();
            let mut written = 0u64;
            while written < ENDLESS_BYTES_MAX {
                let ok = if matches!(kind, Endless::WholeObject) {
                    stream.write_all(&block)
                } else {
                    stream
                        .write_all(format!("{:x}\r\n", block.len()).as_bytes())
                        .and_then(|()| stream.write_all(&block))
                        .and_then(|()| stream.write_all(b"\r\n"))
                };
                if ok.is_err() {
                    break;
                }
                written += block.len() as u64;
            }
            log.lock().unwrap().push(written);
        }
    });
    (endpoint, sent)
}

/// Waits (bounded) until the server has finished `connections` answers; what each sent.
fn sent_by(sent: &Arc<Mutex<Vec<u64>>>, connections: usize) -> Vec<u64> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now = sent.lock().unwrap().clone();
        if now.len() >= connections || Instant::now() > deadline {
            return now;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The store is a peer like any other: a body without end (a range it ignores on a large
/// object, a listing or an error that never ends) is read only as far as the call needs, and
/// the connection is dropped. Before, every answer was read whole into memory.
#[test]
fn an_endless_answer_is_read_only_as_far_as_the_call_needs() {
    // Most bytes one call may have drawn from the server: its limit, plus what the sockets'
    // buffers hold on loopback.
    const DRAWN_MAX: u64 = 48 << 20;
    let one_attempt = S3Options {
        max_attempts: 1,
        ..S3Options::default()
    };

    let (endpoint, sent) = serve_endless(Endless::WholeObject);
    let store = open(&endpoint, one_attempt.clone());
    let bytes = wait(store.get_range("k", 100, 4196)).expect("the range, cut from the object");
    let expected: Vec<u8> = (100..4196).map(|i| (i % (64 * 1024) % 251) as u8).collect();
    assert_eq!(&bytes[..], &expected[..]);
    let drawn = sent_by(&sent, 1);
    assert!(drawn.iter().all(|n| *n < DRAWN_MAX), "{drawn:?}");

    // A whole-object read is bounded by the size its caller knows (a verify: the catalog's).
    let (endpoint, sent) = serve_endless(Endless::WholeObject);
    let store = open(&endpoint, one_attempt.clone());
    let bytes = wait(store.get("k", 4096)).expect("the object's first bytes");
    let first: Vec<u8> = (0..4096).map(|i| (i % 251) as u8).collect();
    assert_eq!(&bytes[..], &first[..]);
    let drawn = sent_by(&sent, 1);
    assert!(drawn.iter().all(|n| *n < DRAWN_MAX), "{drawn:?}");

    let (endpoint, sent) = serve_endless(Endless::Partial);
    let store = open(&endpoint, one_attempt.clone());
    let error = wait(store.get_range("k", 0, 4096)).expect_err("a 206 longer than the range");
    assert!(
        error.to_string().contains("longer than the 4096 bytes"),
        "{error}"
    );
    let drawn = sent_by(&sent, 1);
    assert!(drawn.iter().all(|n| *n < DRAWN_MAX), "{drawn:?}");

    let (endpoint, sent) = serve_endless(Endless::Listing);
    let store = open(&endpoint, one_attempt);
    let error = wait(store.list("")).expect_err("a listing without end");
    assert!(error.to_string().contains("longer than"), "{error}");
    let drawn = sent_by(&sent, 1);
    assert!(drawn.iter().all(|n| *n < DRAWN_MAX), "{drawn:?}");

    // An error's body only feeds its message: each attempt reads a little and goes on.
    let (endpoint, sent) = serve_endless(Endless::Error);
    let store = open(
        &endpoint,
        S3Options {
            max_attempts: 3,
            ..S3Options::default()
        },
    );
    let error = wait(store.get("k", usize::MAX)).expect_err("an error answer");
    assert!(
        error.to_string().contains("gave up after 3 attempts"),
        "{error}"
    );
    let drawn = sent_by(&sent, 3);
    assert_eq!(drawn.len(), 3, "{drawn:?}");
    assert!(drawn.iter().all(|n| *n < DRAWN_MAX), "{drawn:?}");
}
