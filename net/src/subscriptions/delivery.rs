//! Webhook delivery: [`WEBHOOK_DELIVERY_THREADS`] plain threads (`pico-webhooks`) POST signed
//! wake notifications with a small blocking HTTP/1.1 client, so no core ever blocks on a
//! receiver. Results go back into the registry, which schedules bounded retries.
//!
//! Fair across subscriptions: the queue holds at most one waiting delivery per subscription (a
//! newer wake's replaces an older one's, whose result the registry would ignore anyway) and at
//! most one in flight, and serves subscriptions in turn. A slow or silent receiver so holds one
//! thread for at most [`WEBHOOK_DEADLINE`] per attempt, and the others serve everyone else.
//!
//! Bounded against a hostile receiver: the whole delivery (resolution aside: connect, TLS,
//! request, answer) has [`WEBHOOK_DEADLINE`]; the answer is parsed by `response` with checked
//! arithmetic and read up to [`WEBHOOK_RESPONSE_BYTES_MAX`] bytes. Anything wrong is a failed
//! delivery, retried with back-off; a panic in one is caught and counts as a failed delivery.

use std::collections::{HashMap, HashSet, VecDeque};
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::registry::{Clock, Effect, Job, Origin, Outcome};
use super::response::{self, Parsed, WEBHOOK_RESPONSE_BYTES_MAX};
use super::shared::Shared;
use super::webhook_url::{self, Host, WebhookUrl};
use super::DeliveryReport;
use crate::limits::{
    QUEUED_DELIVERIES_MAX, WEBHOOK_CONNECT_TIMEOUT, WEBHOOK_DEADLINE, WEBHOOK_DELIVERY_THREADS,
};
use pico_proto::header::PICO_WEBHOOKS;

/// Deliveries that panicked (each caught and counted as a failed delivery), since start.
pub static DELIVERY_PANICS: AtomicU64 = AtomicU64::new(0);

/// The TLS client settings, built by a thread on its first https delivery.
type TlsCache = Option<Result<Arc<rustls::ClientConfig>, String>>;

/// What one delivery does: [`deliver`], or a stand-in in tests.
pub(super) type DeliverFn = fn(&Shared, &Job, &mut TlsCache) -> Outcome;

/// The deliveries waiting for a thread, and the threads once started.
pub(super) struct Queue {
    state: Mutex<QueueState>,
    wakeup: Condvar,
    deliver: DeliverFn,
}

#[derive(Default)]
struct QueueState {
    /// Subscription (registry key) → its one waiting delivery.
    waiting: HashMap<String, Job>,
    /// Subscriptions with a waiting delivery and none in flight, in the order they are served.
    turns: VecDeque<String>,
    in_flight: HashSet<String>,
    threads_started: bool,
    closed: bool,
}

impl Queue {
    pub(super) fn new(deliver: DeliverFn) -> Queue {
        Queue {
            state: Mutex::new(QueueState::default()),
            wakeup: Condvar::new(),
            deliver,
        }
    }

    fn lock(&self) -> MutexGuard<'_, QueueState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues `job`, starting the threads with the first one. `Err` gives the job back when
    /// [`QUEUED_DELIVERIES_MAX`] subscriptions are already waiting or no thread runs.
    pub(super) fn push(shared: &Arc<Shared>, job: Job) -> Result<(), (Job, &'static str)> {
        let queue = &shared.deliveries;
        let mut state = queue.lock();
        if state.closed {
            return Err((job, "the node is shutting down"));
        }
        if !state.threads_started {
            state.threads_started = true;
            let mut started = 0;
            for n in 0..WEBHOOK_DELIVERY_THREADS {
                let shared = shared.clone();
                match std::thread::Builder::new()
                    .name(format!("{PICO_WEBHOOKS}-{n}"))
                    .spawn(move || work(&shared))
                {
                    Ok(_) => started += 1,
                    Err(e) => log::error!("cannot start a webhook delivery thread: {e}"),
                }
            }
            if started == 0 {
                // Deliveries then fail (and are retried, then given up) instead of the node.
                state.threads_started = false;
                return Err((job, "no webhook delivery thread is running"));
            }
        }
        let key = job.subscription.clone();
        if let Some(waiting) = state.waiting.get_mut(&key) {
            *waiting = job;
            return Ok(());
        }
        if state.waiting.len() >= QUEUED_DELIVERIES_MAX {
            return Err((job, "the delivery queue is full"));
        }
        state.waiting.insert(key.clone(), job);
        if !state.in_flight.contains(&key) {
            state.turns.push_back(key);
            queue.wakeup.notify_one();
        }
        Ok(())
    }

    /// The next delivery, in turn; `None` once closed.
    fn take(&self) -> Option<Job> {
        let mut state = self.lock();
        loop {
            if state.closed {
                return None;
            }
            while let Some(key) = state.turns.pop_front() {
                if let Some(job) = state.waiting.remove(&key) {
                    state.in_flight.insert(key);
                    return Some(job);
                }
            }
            state = self.wakeup.wait(state).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// The delivery of subscription `key` is over: a delivery that waited meanwhile gets a turn.
    fn finish(&self, key: &str) {
        let mut state = self.lock();
        state.in_flight.remove(key);
        if state.waiting.contains_key(key) {
            state.turns.push_back(key.to_string());
            self.wakeup.notify_one();
        }
    }

    /// Ends the threads once their current deliveries are over.
    pub(super) fn close(&self) {
        self.lock().closed = true;
        self.wakeup.notify_all();
    }
}

/// A thread's loop: deliveries in turn until the queue closes.
fn work(shared: &Arc<Shared>) {
    let mut tls: TlsCache = None;
    while let Some(job) = shared.deliveries.take() {
        let deliver = shared.deliveries.deliver;
        let outcome = crate::panics::catch_unwind(|| deliver(shared, &job, &mut tls))
            .unwrap_or_else(|| {
                DELIVERY_PANICS.fetch_add(1, Ordering::Relaxed);
                Outcome::Failed(format!("{}: the delivery panicked", job.url))
            });
        if job.origin == Origin::Caller {
            shared.report(DeliveryReport {
                key: job.subscription.clone(),
                generation: job.generation,
                outcome,
            });
            shared.deliveries.finish(&job.subscription);
            continue;
        }
        let acked = outcome == Outcome::Done;
        let effects = shared.write().delivery_result(&job, outcome, Clock::now());
        if acked {
            // A synchronous `done` acks: written now rather than by the next sweep. On failure
            // the sweeper retries it.
            if let Err(e) = shared.persist() {
                log::error!("subscriptions: {e}");
            }
        }
        shared.deliveries.finish(&job.subscription);
        for effect in effects {
            match effect {
                Effect::Deliver(next) => enqueue(shared, next),
                // Only pull-wake subscriptions append, and they never deliver.
                Effect::AppendWake { stream, .. } => {
                    log::error!("webhook thread cannot append a wake event to {stream}")
                }
            }
        }
    }
}

/// Queues a delivery; one that cannot be queued counts as a failed attempt, which the sweeper
/// retries after the back-off.
pub(super) fn enqueue(shared: &Arc<Shared>, job: Job) {
    if let Err((job, reason)) = Queue::push(shared, job) {
        let effects =
            shared
                .write()
                .delivery_result(&job, Outcome::Failed(reason.into()), Clock::now());
        debug_assert!(effects.is_empty());
    }
}

/// One delivery: the signed POST, its answer read into an [`Outcome`].
pub(super) fn deliver(shared: &Shared, job: &Job, tls: &mut TlsCache) -> Outcome {
    let signature = shared
        .signing
        .signature_header(job.body.as_bytes(), unix_secs());
    let allow_loopback = shared.webhook_loopback_allowed();
    let result = webhook_url::parse(&job.url).and_then(|url| {
        let tls = if url.https {
            Some(tls.get_or_insert_with(client_config).clone()?)
        } else {
            None
        };
        post(&url, allow_loopback, job.body.as_bytes(), &signature, tls)
    });
    match result {
        Ok((status, body)) if (200..300).contains(&status) => {
            let done = serde_json::from_slice::<serde_json::Value>(&body)
                .is_ok_and(|v| v["done"] == serde_json::Value::Bool(true));
            if done {
                Outcome::Done
            } else {
                Outcome::Accepted
            }
        }
        Ok((status, _)) => Outcome::Failed(format!("{} answered {status}", job.url)),
        Err(e) => Outcome::Failed(format!("{}: {e}", job.url)),
    }
}

fn unix_secs() -> u64 {
    (pico_engine::now_ms().max(0) / 1000) as u64
}

/// The time left before `deadline`, or the error saying it passed.
fn remaining(deadline: Instant) -> Result<Duration, String> {
    deadline
        .checked_duration_since(Instant::now())
        .filter(|left| !left.is_zero())
        .ok_or_else(|| {
            format!(
                "the receiver took longer than {} ms",
                WEBHOOK_DEADLINE.as_millis()
            )
        })
}

/// Connects to the first address of the URL's host that its policy allows.
fn connect(url: &WebhookUrl, allow_loopback: bool, deadline: Instant) -> Result<TcpStream, String> {
    let candidates: Vec<SocketAddr> = match &url.host {
        Host::Ip(ip) => vec![SocketAddr::new(*ip, url.port)],
        Host::Name(name) => (name.as_str(), url.port)
            .to_socket_addrs()
            .map_err(|e| format!("cannot resolve {name}: {e}"))?
            .collect(),
    };
    let allowed: Vec<SocketAddr> = candidates
        .into_iter()
        .filter(|addr| webhook_url::address_allowed(url, addr.ip(), allow_loopback))
        .collect();
    if allowed.is_empty() {
        return Err("the host has no address deliveries may go to".into());
    }
    let mut last = String::new();
    for addr in allowed {
        let timeout = remaining(deadline)?.min(WEBHOOK_CONNECT_TIMEOUT);
        match TcpStream::connect_timeout(&addr, timeout) {
            Ok(stream) => {
                let _ = stream.set_nodelay(true);
                return Ok(stream);
            }
            Err(e) => last = format!("cannot connect to {addr}: {e}"),
        }
    }
    Err(last)
}

/// POSTs `body` and returns the status and (bounded) response body, all within
/// [`WEBHOOK_DEADLINE`].
pub fn post(
    url: &WebhookUrl,
    allow_loopback: bool,
    body: &[u8],
    signature: &str,
    tls: Option<Arc<rustls::ClientConfig>>,
) -> Result<(u16, Vec<u8>), String> {
    let deadline = Instant::now() + WEBHOOK_DEADLINE;
    let tcp = connect(url, allow_loopback, deadline)?;
    let mut request = format!(
        "POST {} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nWebhook-Signature: {signature}\r\nUser-Agent: picomq-webhooks\r\nConnection: close\r\n\r\n",
        url.target,
        url.host_header(),
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(body);
    match tls {
        None => exchange(tcp, &request, deadline),
        Some(config) => {
            let name = match &url.host {
                Host::Ip(ip) => rustls_pki_types::ServerName::IpAddress((*ip).into()),
                Host::Name(name) => rustls_pki_types::ServerName::try_from(name.clone())
                    .map_err(|e| format!("invalid TLS server name: {e}"))?,
            };
            let conn = rustls::ClientConnection::new(config, name).map_err(|e| e.to_string())?;
            exchange(rustls::StreamOwned::new(conn, tcp), &request, deadline)
        }
    }
}

/// TLS client settings with the system's CA bundle, built on the first https delivery.
fn client_config() -> Result<Arc<rustls::ClientConfig>, String> {
    let paths = std::env::var("SSL_CERT_FILE").ok().into_iter().chain(
        [
            "/etc/ssl/certs/ca-certificates.crt",
            "/etc/pki/tls/certs/ca-bundle.crt",
            "/etc/ssl/cert.pem",
        ]
        .map(String::from),
    );
    for path in paths {
        if let Ok(config) = client_config_from(&path) {
            return Ok(config);
        }
    }
    Err("no CA bundle found for https webhooks (set SSL_CERT_FILE)".into())
}

/// TLS client settings trusting the CA certificates of one PEM file.
fn client_config_from(pem_path: &str) -> Result<Arc<rustls::ClientConfig>, String> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::CertificateDer;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(pem_path)
        .map_err(|e| format!("{pem_path}: {e}"))?
        .flatten()
    {
        // One unparsable certificate in a system bundle should not disable the others.
        let _ = roots.add(cert);
    }
    if roots.is_empty() {
        return Err(format!("{pem_path} holds no usable CA certificate"));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS setup: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// A connection whose socket's timeouts the exchange sets before each read and write, to the
/// time left of the delivery.
pub(super) trait Timed: Read + Write {
    fn tcp(&self) -> &TcpStream;
}

impl Timed for TcpStream {
    fn tcp(&self) -> &TcpStream {
        self
    }
}

impl Timed for rustls::StreamOwned<rustls::ClientConnection, TcpStream> {
    fn tcp(&self) -> &TcpStream {
        &self.sock
    }
}

/// Writes the request and reads one answer, at most [`WEBHOOK_RESPONSE_BYTES_MAX`] bytes of it,
/// by `deadline`.
fn exchange<S: Timed>(
    mut stream: S,
    request: &[u8],
    deadline: Instant,
) -> Result<(u16, Vec<u8>), String> {
    stream
        .tcp()
        .set_write_timeout(Some(remaining(deadline)?))
        .map_err(|e| e.to_string())?;
    stream
        .write_all(request)
        .and_then(|()| stream.flush())
        .map_err(|e| match e.kind() {
            ErrorKind::WouldBlock | ErrorKind::TimedOut => format!(
                "the receiver took longer than {} ms",
                WEBHOOK_DEADLINE.as_millis()
            ),
            _ => format!("sending: {e}"),
        })?;
    let mut buf = Vec::with_capacity(4096);
    let mut eof = false;
    // Each round reads at least one byte, up to the cap, or ends: at most
    // WEBHOOK_RESPONSE_BYTES_MAX + 1 rounds, and the deadline ends it sooner.
    loop {
        match response::parse(&buf, eof)? {
            Parsed::Complete(answer) => return Ok((answer.status, answer.body)),
            Parsed::Partial if buf.len() >= WEBHOOK_RESPONSE_BYTES_MAX => {
                return Err(format!(
                    "the answer is longer than {WEBHOOK_RESPONSE_BYTES_MAX} bytes"
                ))
            }
            Parsed::Partial => eof = fill(&mut stream, &mut buf, deadline)?,
        }
    }
}

/// Reads more into `buf`, never past [`WEBHOOK_RESPONSE_BYTES_MAX`]; `true` at end of stream.
fn fill<S: Timed>(stream: &mut S, buf: &mut Vec<u8>, deadline: Instant) -> Result<bool, String> {
    stream
        .tcp()
        .set_read_timeout(Some(remaining(deadline)?))
        .map_err(|e| e.to_string())?;
    let mut chunk = [0u8; 8192];
    let room = WEBHOOK_RESPONSE_BYTES_MAX
        .saturating_sub(buf.len())
        .min(chunk.len());
    match stream.read(&mut chunk[..room]) {
        Ok(0) => Ok(true),
        Ok(n) => {
            buf.extend_from_slice(&chunk[..n]);
            Ok(false)
        }
        // A TLS peer that closes without close_notify: the body ends there.
        Err(e) if e.kind() == ErrorKind::UnexpectedEof => Ok(true),
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => Err(format!(
            "the receiver took longer than {} ms",
            WEBHOOK_DEADLINE.as_millis()
        )),
        Err(e) => Err(format!("receiving: {e}")),
    }
}

/// The addresses a URL would be delivered to, for tests of the resolution policy.
#[cfg(test)]
fn allowed_ips(url: &WebhookUrl) -> Vec<std::net::IpAddr> {
    match &url.host {
        Host::Ip(ip) => vec![*ip],
        Host::Name(name) => (name.as_str(), url.port)
            .to_socket_addrs()
            .map(|addrs| addrs.map(|a| a.ip()).collect())
            .unwrap_or_default(),
    }
    .into_iter()
    .filter(|ip| webhook_url::address_allowed(url, *ip, true))
    .collect()
}

#[cfg(test)]
mod tests {
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
        let (status, body) =
            post(&parsed, true, b"{\"a\":1}", "t=1,kid=k,ed25519=s", None).unwrap();
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
        let (status, body) = post(&parsed, true, b"{}", "sig", None).unwrap();
        assert_eq!((status, body.as_slice()), (202, &b"{\"done\":true}"[..]));
        handle.join().unwrap();
        let (url, handle) = receiver(b"HTTP/1.1 500 Oops\r\n\r\nbroken");
        let parsed = webhook_url::check(&url, true).unwrap();
        assert_eq!(
            post(&parsed, true, b"{}", "sig", None).unwrap(),
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
        assert!(post(&url, true, b"{}", "sig", None).is_err());
        // Past the deadline, the exchange stops before waiting on a silent receiver.
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let stream = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let err = exchange(stream, b"x", Instant::now()).unwrap_err();
        assert!(err.contains("took longer than"), "{err}");
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
            let err = post(&url, true, b"{}", "sig", None).unwrap_err();
            assert!(
                err.contains("longer than") || err.contains("bad chunk size"),
                "{err}"
            );
            assert!(started.elapsed() < Duration::from_secs(2));
            handle.join().unwrap();
        }
    }

    /// A stream wrapper counting the bytes the client read.
    struct Counting(TcpStream, Arc<AtomicU64>);

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

    impl Timed for Counting {
        fn tcp(&self) -> &TcpStream {
            &self.0
        }
    }

    /// The exchange's result, the bytes it read and how long it took.
    type Counted = (Result<(u16, Vec<u8>), String>, u64, Duration);

    fn counted_exchange(url: &WebhookUrl) -> Counted {
        let read = Arc::new(AtomicU64::new(0));
        let started = Instant::now();
        let tcp = connect(url, true, started + WEBHOOK_DEADLINE).unwrap();
        let result = exchange(
            Counting(tcp, read.clone()),
            b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}",
            started + WEBHOOK_DEADLINE,
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
            assert!(err.contains("longer than"), "{err}");
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
        assert!(err.contains("took longer than"), "{err}");
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
        let tail = super::super::offset_string(next);
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
        let (url, received) =
            receiver(b"HTTP/1.1 200 OK\r\nContent-Length: 13\r\n\r\n{\"done\":true}");
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
                    let _ = tls
                        .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 13\r\n\r\n{\"done\":true}");
                    tls.conn.send_close_notify();
                    let _ = tls.flush();
                }
            }
        });
        let trusted = client_config_from(&dir.path().join("ca.pem").display().to_string()).unwrap();
        let (status, body) = post(&url, true, b"{}", "sig", Some(trusted)).unwrap();
        assert_eq!((status, body.as_slice()), (200, &b"{\"done\":true}"[..]));
        // A client without the private CA refuses the receiver's certificate.
        let other = client_config_from(&dir.path().join("cert.pem").display().to_string()).unwrap();
        let err = post(&url, true, b"{}", "sig", Some(other)).unwrap_err();
        assert!(
            err.contains("sending") || err.contains("receiving"),
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
}
