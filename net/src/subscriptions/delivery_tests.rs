//! Tests of the webhook delivery threads and their HTTP/1.1 client.

use super::*;
use std::net::TcpListener;

/// A one-shot receiver: returns its URL and a handle yielding the raw request it got.
fn receiver(response: &'static [u8]) -> (String, std::thread::JoinHandle<Vec<u8>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!(
        "http://127.0.0.1:{}/webhook",
        listener.local_addr().unwrap().port()
    );
    let handle = std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        let request = crate::subscriptions::tests::read_http_request(&mut conn);
        conn.write_all(response).unwrap();
        request
    });
    (url, handle)
}

#[test]
fn posts_signed_json_and_reads_content_length_replies() {
    let (url, handle) =
        receiver(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 13\r\n\r\n{\"done\":true}");
    let parsed = webhook_url::check(&url, true).unwrap();
    let (status, body) = post(
        &parsed,
        true,
        &[],
        b"{\"a\":1}",
        "t=1,kid=k,ed25519=s",
        None,
    )
    .unwrap();
    assert_eq!((status, body.as_slice()), (200, &b"{\"done\":true}"[..]));
    let request = String::from_utf8(handle.join().unwrap()).unwrap();
    assert!(
        request.starts_with("POST /webhook HTTP/1.1\r\n"),
        "{request}"
    );
    assert!(request.contains("\r\nWebhook-Signature: t=1,kid=k,ed25519=s\r\n"));
    assert!(request.contains("\r\nContent-Type: application/json\r\n"));
    assert!(request.ends_with("\r\n\r\n{\"a\":1}"));
}

#[test]
fn reads_chunked_and_close_delimited_replies_after_interim_ones() {
    let (url, handle) = receiver(
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 202 Accepted\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{\"don\r\n8;x=y\r\ne\":true}\r\n0\r\n\r\n",
    );
    let parsed = webhook_url::check(&url, true).unwrap();
    let (status, body) = post(&parsed, true, &[], b"{}", "sig", None).unwrap();
    assert_eq!((status, body.as_slice()), (202, &b"{\"done\":true}"[..]));
    handle.join().unwrap();
    let (url, handle) = receiver(b"HTTP/1.1 500 Oops\r\n\r\nbroken");
    let parsed = webhook_url::check(&url, true).unwrap();
    assert_eq!(
        post(&parsed, true, &[], b"{}", "sig", None).unwrap(),
        (500, b"broken".to_vec())
    );
    handle.join().unwrap();
}

#[test]
fn refused_connections_and_slow_receivers_fail() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    let url = webhook_url::check(&format!("http://127.0.0.1:{port}/"), true).unwrap();
    assert!(post(&url, true, &[], b"{}", "sig", None).is_err());
    // Past the deadline, the exchange stops before waiting on a silent receiver.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let stream = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let stream = Deadlined {
        tcp: stream,
        deadline: Instant::now(),
    };
    let err = exchange(stream, b"x").unwrap_err();
    assert!(matches!(err, DeliveryError::Deadline), "{err}");
}

/// A receiver that reads the request, writes `head`, then `body_chunk` until the client
/// goes away or `limit` bytes are sent; yields how many body bytes it got to send.
fn hostile(
    head: &'static [u8],
    body_chunk: &'static [u8],
    pause: Duration,
) -> (WebhookUrl, std::thread::JoinHandle<usize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = webhook_url::check(
        &format!(
            "http://127.0.0.1:{}/",
            listener.local_addr().unwrap().port()
        ),
        true,
    )
    .unwrap();
    let handle = std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        crate::subscriptions::tests::read_http_request(&mut conn);
        let _ = conn.set_write_timeout(Some(Duration::from_secs(2)));
        if conn.write_all(head).is_err() || body_chunk.is_empty() {
            return 0;
        }
        let mut sent = 0;
        // Bounded: 64 MiB, or 30 s, whichever first; the client should stop far sooner.
        let until = Instant::now() + Duration::from_secs(30);
        while sent < 64 << 20 && Instant::now() < until {
            match conn.write(body_chunk) {
                Ok(n) => sent += n,
                Err(_) => break,
            }
            if !pause.is_zero() {
                std::thread::sleep(pause);
            }
        }
        sent
    });
    (url, handle)
}

/// Chunk size `ffffffffffffffff` is a failed delivery, at once: it must not overflow the
/// chunk arithmetic, whose panic would end the process.
#[test]
fn a_chunk_size_past_every_limit_fails_the_delivery() {
    for head in [
        &b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffff\r\n{}"[..],
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nfffffffffffffffff\r\n{}",
        b"HTTP/1.1 200 OK\r\nContent-Length: 18446744073709551615\r\n\r\n{}",
    ] {
        let (url, handle) = hostile(head, b"", Duration::ZERO);
        let started = Instant::now();
        let err = post(&url, true, &[], b"{}", "sig", None).unwrap_err();
        assert!(
            matches!(
                err,
                DeliveryError::Answer(AnswerError::BodyTooLarge | AnswerError::BadChunkSize)
            ),
            "{err}"
        );
        assert!(started.elapsed() < Duration::from_secs(2));
        handle.join().unwrap();
    }
}

/// A stream wrapper counting the bytes the client read.
struct Counting(Deadlined, Arc<AtomicU64>);

impl Read for Counting {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.0.read(buf)?;
        self.1.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

impl Write for Counting {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

/// The exchange's result, the bytes it read and how long it took.
type Counted = (Result<(u16, Vec<u8>), DeliveryError>, u64, Duration);

fn counted_exchange(url: &WebhookUrl) -> Counted {
    let read = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let deadline = started + WEBHOOK_DEADLINE;
    let tcp = connect(url, true, &[], deadline).unwrap();
    let result = exchange(
        Counting(Deadlined { tcp, deadline }, read.clone()),
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}",
    );
    (result, read.load(Ordering::Relaxed), started.elapsed())
}

/// A chunk declared `7fffffffffffffff`, then bytes as fast as they are read (unbounded,
/// that took a node to 2.6 GB): the client reads at most WEBHOOK_RESPONSE_BYTES_MAX.
#[test]
fn an_endless_answer_is_read_only_up_to_the_cap() {
    for head in [
        &b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n7fffffffffffffff\r\n"[..],
        b"HTTP/1.1 200 OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
    ] {
        // The last one: endless 1-byte chunks with long extensions.
        let chunk: &'static [u8] = if head.ends_with(b"chunked\r\n\r\n") {
            b"1;extension-extension-extension\r\nx\r\n"
        } else {
            &[b'x'; 8192]
        };
        let (url, handle) = hostile(head, chunk, Duration::ZERO);
        let (result, read, took) = counted_exchange(&url);
        let err = result.unwrap_err();
        assert!(
            matches!(
                err,
                DeliveryError::AnswerTooLong | DeliveryError::Answer(AnswerError::BodyTooLarge)
            ),
            "{err}"
        );
        assert!(read as usize <= WEBHOOK_RESPONSE_BYTES_MAX, "{read}");
        assert!(took < WEBHOOK_DEADLINE, "{took:?}");
        handle.join().unwrap();
    }
}

/// A receiver dribbling a byte every 100 ms never ends a read timeout, but the whole
/// delivery ends at its deadline.
#[test]
fn a_dribbling_receiver_is_cut_off_at_the_deadline() {
    let (url, handle) = hostile(b"HTTP/1.1 200 OK\r\n", b"X", Duration::from_millis(100));
    let (result, read, took) = counted_exchange(&url);
    let err = result.unwrap_err();
    assert!(matches!(err, DeliveryError::Deadline), "{err}");
    assert!(took >= WEBHOOK_DEADLINE && took < WEBHOOK_DEADLINE + Duration::from_secs(2));
    assert!(read < 1000, "{read}");
    handle.join().unwrap();
}

/// A webhook subscription in `subs`' registry whose next write wakes it: returns its key.
fn webhook_subscription(subs: &super::super::Subscriptions, root: &str, url: &str) -> String {
    let config = super::super::registry::parse_config(&serde_json::json!({
        "type": "webhook", "pattern": "events/*", "webhook": {"url": url},
        "lease_ttl_ms": 60_000,
    }))
    .unwrap();
    subs.shared
        .write()
        .create(
            "s",
            root,
            root,
            "http://127.0.0.1:1/",
            config,
            vec![],
            Clock::now(),
        )
        .unwrap();
    super::super::registry::key(root, "s")
}

/// The jobs of a write to `root`events/a.
fn write(subs: &super::super::Subscriptions, root: &str, next: u64) -> Vec<Job> {
    let tail = super::super::StreamTail {
        offset: super::super::offset_string(next),
        stream_id: Some(1),
    };
    subs.shared
        .write()
        .on_write(&format!("{root}events/a"), &tail, Clock::now())
        .into_iter()
        .filter_map(|e| match e {
            Effect::Deliver(job) => Some(job),
            Effect::AppendWake { .. } => None,
        })
        .collect()
}

fn status(subs: &super::super::Subscriptions, key: &str) -> String {
    subs.shared.read().describe(key, "k", "u").unwrap()["status"]
        .as_str()
        .unwrap()
        .to_string()
}

fn panicking(_: &Shared, job: &Job, _: &mut TlsCache) -> Outcome {
    if job.url.contains("panic") {
        panic!("a delivery that panics");
    }
    Outcome::Accepted
}

/// A delivery that panics fails, and the threads go on: the panic must not end the thread
/// (nor, with the panic hook, the process).
#[test]
fn a_panicking_delivery_fails_and_the_threads_go_on() {
    let subs = super::super::Subscriptions::with_delivery(panicking);
    let before = DELIVERY_PANICS.load(Ordering::Relaxed);
    // More panics than threads: had any ended its thread, the last delivery would not run.
    let mut keys = Vec::new();
    for n in 0..2 * WEBHOOK_DELIVERY_THREADS {
        let root = format!("/t{n}/");
        let key = webhook_subscription(&subs, &root, "http://127.0.0.1:9/panic");
        for job in write(&subs, &root, 1) {
            enqueue(&subs.shared, job);
        }
        keys.push(key);
    }
    let fine = webhook_subscription(&subs, "/fine/", "http://127.0.0.1:9/fine");
    for job in write(&subs, "/fine/", 1) {
        enqueue(&subs.shared, job);
    }
    let until = Instant::now() + Duration::from_secs(30);
    while keys.iter().any(|k| status(&subs, k) != "failed") {
        assert!(
            Instant::now() < until,
            "the panicking deliveries were not marked failed"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    while subs.shared.read().wake_delivery(&fine).as_deref() != Some("Delivered") {
        assert!(
            Instant::now() < until,
            "the delivery after the panics did not run"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(DELIVERY_PANICS.load(Ordering::Relaxed) >= before + keys.len() as u64);
}

/// One receiver that never answers holds one delivery thread (10 s per attempt), and only
/// one: its later wakes wait for it instead of taking more threads, and every other
/// subscription is delivered meanwhile.
#[test]
fn a_silent_receiver_holds_one_thread_and_the_others_deliver() {
    let subs = super::super::Subscriptions::new();
    // The silent receiver: accepts and never answers; counts connections.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_url = format!("http://127.0.0.1:{}/", silent.local_addr().unwrap().port());
    let (conns_tx, conns) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for conn in silent.incoming().take(8) {
            let _ = conns_tx.send(());
            held.push(conn);
        }
    });
    webhook_subscription(&subs, "/slow/", &silent_url);
    // Several wakes of one subscription queued at once (as expiring leases with writes in
    // between queue them).
    for job in write(&subs, "/slow/", 1) {
        enqueue(&subs.shared, job.clone());
        enqueue(
            &subs.shared,
            Job {
                generation: job.generation + 1,
                ..job.clone()
            },
        );
        enqueue(
            &subs.shared,
            Job {
                generation: job.generation + 2,
                ..job
            },
        );
    }
    // Then a well-behaved receiver for another tenant.
    let (url, received) = receiver(b"HTTP/1.1 200 OK\r\nContent-Length: 13\r\n\r\n{\"done\":true}");
    let fast = webhook_subscription(&subs, "/fast/", &url);
    let started = Instant::now();
    for job in write(&subs, "/fast/", 1) {
        enqueue(&subs.shared, job);
    }
    while !received.is_finished() {
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "the other subscription waited for the silent receiver"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let until = Instant::now() + Duration::from_secs(10);
    while subs.shared.read().wake_delivery(&fast).is_some() {
        assert!(Instant::now() < until, "the done reply was not applied");
        std::thread::sleep(Duration::from_millis(20));
    }
    // One connection to the silent receiver, not one per queued wake.
    conns.recv_timeout(Duration::from_secs(5)).unwrap();
    assert!(conns.recv_timeout(Duration::from_millis(500)).is_err());
}

/// A private CA and a certificate it signed for 127.0.0.1 (openssl, as the CLI TLS tests).
fn make_certificates(dir: &std::path::Path) {
    let script = r#"set -e
printf 'subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n' > leaf.ext
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=test-ca -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign -keyout ca.key -out ca.pem
openssl req -newkey rsa:2048 -nodes -subj /CN=localhost -keyout key.pem -out leaf.csr
openssl x509 -req -days 2 -CAcreateserial -in leaf.csr -CA ca.pem -CAkey ca.key -out cert.pem -extfile leaf.ext
"#;
    let status = std::process::Command::new("sh")
        .args(["-c", script])
        .current_dir(dir)
        .stderr(std::process::Stdio::null())
        .status()
        .expect("sh and the openssl tool make the test certificates");
    assert!(status.success());
}

#[test]
fn posts_over_https_to_a_trusted_receiver_only() {
    let dir = tempfile::tempdir().unwrap();
    make_certificates(dir.path());
    let server = crate::transport::tls::server_config(
        &dir.path().join("cert.pem"),
        &dir.path().join("key.pem"),
    )
    .unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = webhook_url::check(
        &format!(
            "https://127.0.0.1:{}/hook",
            listener.local_addr().unwrap().port()
        ),
        true,
    )
    .unwrap();
    let handle = std::thread::spawn(move || {
        for _ in 0..2 {
            let (tcp, _) = listener.accept().unwrap();
            let conn = rustls::ServerConnection::new(server.clone()).unwrap();
            let mut tls = rustls::StreamOwned::new(conn, tcp);
            let mut request = Vec::new();
            let mut chunk = [0u8; 4096];
            while !request.ends_with(b"{}") {
                match tls.read(&mut chunk) {
                    Ok(n) if n > 0 => request.extend_from_slice(&chunk[..n]),
                    // The untrusting client gives up during the handshake.
                    _ => break,
                }
            }
            if request.ends_with(b"{}") {
                let _ =
                    tls.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 13\r\n\r\n{\"done\":true}");
                tls.conn.send_close_notify();
                let _ = tls.flush();
            }
        }
    });
    let trusted = client_config_from(&dir.path().join("ca.pem").display().to_string()).unwrap();
    let (status, body) = post(&url, true, &[], b"{}", "sig", Some(trusted)).unwrap();
    assert_eq!((status, body.as_slice()), (200, &b"{\"done\":true}"[..]));
    // A client without the private CA refuses the receiver's certificate.
    let other = client_config_from(&dir.path().join("cert.pem").display().to_string()).unwrap();
    let err = post(&url, true, &[], b"{}", "sig", Some(other)).unwrap_err();
    assert!(
        matches!(err, DeliveryError::Send(_) | DeliveryError::Receive(_)),
        "{err}"
    );
    handle.join().unwrap();
    assert!(client_config_from("/nonexistent.pem").is_err());
}

#[test]
fn localhost_resolves_only_to_loopback() {
    let url = webhook_url::check("http://localhost:9/", true).unwrap();
    assert!(allowed_ips(&url).iter().all(|ip| ip.is_loopback()));
}

/// An https receiver that accepts the connection and never answers the TLS handshake (rustls
/// reads the server's hello inside the request's write), and one that answers it a byte at a
/// time: both fail at the delivery's deadline, not when the peer lets go.
#[test]
fn a_tls_handshake_the_receiver_never_finishes_ends_at_the_deadline() {
    let dir = tempfile::tempdir().unwrap();
    make_certificates(dir.path());
    let trusted = client_config_from(&dir.path().join("ca.pem").display().to_string()).unwrap();
    for dribble in [false, true] {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = webhook_url::check(
            &format!(
                "https://127.0.0.1:{}/hook",
                listener.local_addr().unwrap().port()
            ),
            true,
        )
        .unwrap();
        // Held 3 deadlines at most, then let go: the client must have given up long before.
        let held = WEBHOOK_DEADLINE * 3;
        let handle = std::thread::spawn(move || {
            let (mut tcp, _) = listener.accept().unwrap();
            tcp.set_read_timeout(Some(Duration::from_millis(200)))
                .unwrap();
            let until = Instant::now() + held;
            let mut hello = [0u8; 4096];
            while Instant::now() < until {
                // A byte of a TLS record header every 200 ms: each read of the client gets
                // something before its timeout.
                if dribble && tcp.write_all(&[0x16]).is_err() {
                    break;
                }
                // The client's hello is read and never answered; its close ends the wait.
                if let Ok(0) = tcp.read(&mut hello) {
                    break;
                }
            }
        });
        let started = Instant::now();
        let err = post(&url, true, &[], b"{}", "sig", Some(trusted.clone())).unwrap_err();
        let took = started.elapsed();
        assert!(
            took < WEBHOOK_DEADLINE + Duration::from_secs(2),
            "dribble={dribble}: {took:?} ({err})"
        );
        handle.join().unwrap();
    }
}

/// The node's own listeners are never a delivery's address: the one it bound, and any
/// loopback address of a port it listens on everywhere.
#[test]
fn a_delivery_never_connects_to_the_nodes_own_listeners() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let bound = listener.local_addr().unwrap();
    let url = webhook_url::check(&format!("http://{bound}/v1/stream/loop"), true).unwrap();
    let deadline = Instant::now() + WEBHOOK_DEADLINE;
    let err = connect(&url, true, &[bound], deadline).unwrap_err();
    assert!(
        matches!(err, DeliveryError::OwnListener(addr) if addr == bound),
        "{err}"
    );
    let everywhere: SocketAddr = format!("0.0.0.0:{}", bound.port()).parse().unwrap();
    assert!(connect(&url, true, &[everywhere], deadline).is_err());
    // Another port of the same host is someone else.
    let other: SocketAddr = format!("127.0.0.1:{}", bound.port().wrapping_add(1))
        .parse()
        .unwrap();
    assert!(connect(&url, true, &[other], deadline).is_ok());
}
